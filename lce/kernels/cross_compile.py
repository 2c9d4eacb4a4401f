"""Compile :mod:`lce.kernels`' Triton kernels for an NVIDIA GPU without one: Triton's front end, its LLVM and the
``ptxas`` its wheel ships, for a target named by its compute capability (80: A100, 90: H100/H200).

This is the check the interpreter cannot make: Triton's CPU interpreter runs a kernel's Python body with numpy and
compiles nothing, so it never type-checks the kernel, never generates code for a constexpr branch, and ignores the
launch options (:data:`lce.kernels.interpreter.LAUNCH_OPTIONS`). :func:`compile_variant` compiles one variant of
:mod:`lce.kernels.variants` with the options every launch passes, as a launch on that GPU would.

The kernels must have been decorated for compiling: ``TRITON_INTERPRET`` unset when triton was first imported. A
test session sets it (``tests/conftest.py``), so tests run this module in a fresh process::

    python -m lce.kernels.cross_compile --arch 80 --arch 90 [--shard 0/2]

which compiles every variant (or one shard of them) for each ``--arch`` and prints one JSON object a line per
compilation (:meth:`Compiled.summary`), and one ``{"failed": ...}`` line per failure, then exits 1 if any failed.
Triton's cache applies (``TRITON_CACHE_DIR``: point it at a fresh folder for a true compile and its time).
Works with Triton 3.6 to 3.9 (the same ``ASTSource``/``compile`` API); triton is imported only when called.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import re
import sys
import time
import traceback
from collections.abc import Mapping, Sequence

from .interpreter import LAUNCH_OPTIONS
from .variants import Variant, variants

__all__ = ["Compiled", "compile_variant", "main"]

_PASSES = "lce.kernels.softmax_passes"


@dataclasses.dataclass(frozen=True)
class Compiled:
    """What one compilation produced: ``asm`` maps each stage (``"ttir"``, ``"ttgir"``, ``"llir"``, ``"ptx"``: str;
    ``"cubin"``: bytes) to its output; ``options`` are the resolved options Triton compiled with."""

    variant: Variant
    arch: int
    triton_version: str
    seconds: float
    asm: Mapping[str, str | bytes]
    options: Mapping[str, object]

    def summary(self) -> dict[str, object]:
        """A JSON-ready line: the variant's name, the target, Triton's version, the time, the PTX's ``.target``
        (``sm_90a`` for 90), the PTX and cubin sizes (bytes) and whether fused multiply-adds were allowed
        (``enable_fp_fusion``, False as every launch asks)."""
        ptx_target = re.search(r"^\.target\s+(\w+)", self.asm["ptx"], re.MULTILINE)
        return {"variant": self.variant.name, "arch": self.arch, "triton": self.triton_version,
                "seconds": round(self.seconds, 3), "ptx_target": ptx_target and ptx_target.group(1),
                "ptx_bytes": len(self.asm["ptx"]),
                "cubin_bytes": len(self.asm["cubin"]), "enable_fp_fusion": self.options.get("enable_fp_fusion")}


def compile_variant(variant: Variant, arch: int) -> Compiled:
    """Compile ``variant`` for NVIDIA compute capability ``arch`` (80, 90, ...; warp size 32) to PTX and cubin,
    with ``variant.num_warps`` and the launches' options; no GPU or driver used.

    Raises ``RuntimeError`` where the kernels were decorated for the interpreter (``TRITON_INTERPRET`` set when
    triton was imported), ``ValueError`` where ``variant`` does not name the kernel's parameters exactly (the
    kernel changed under :mod:`lce.kernels.variants`), and Triton's own error where compiling fails.
    """
    if not isinstance(arch, int) or arch < 1:
        raise ValueError(f"arch must be a compute capability as a positive int (80, 90), got {arch!r}")
    import triton
    from triton.backends.compiler import GPUTarget

    passes = importlib.import_module(_PASSES)
    if passes.INTERPRETED:
        raise RuntimeError(f"{_PASSES} was decorated for Triton's interpreter (TRITON_INTERPRET was set when triton "
                           "was imported): compile in a process without it (python -m lce.kernels.cross_compile)")
    kernel = getattr(passes, variant.kernel)
    constexprs = variant.constexpr_values
    signature = dict(variant.signature) | dict.fromkeys(constexprs, "constexpr")
    if sorted(signature) != sorted(kernel.arg_names):
        raise ValueError(f"variant {variant.name} names the arguments {sorted(signature)}, but {variant.kernel} "
                         f"takes {sorted(kernel.arg_names)}")
    # in the kernel's parameter order, as Triton's own launches build it
    signature = {name: signature[name] for name in kernel.arg_names}
    source = triton.compiler.ASTSource(fn=kernel, signature=signature, constexprs=constexprs)
    start = time.perf_counter()
    compiled = triton.compile(source, target=GPUTarget("cuda", arch, 32),
                              options={"num_warps": variant.num_warps, **LAUNCH_OPTIONS})
    seconds = time.perf_counter() - start
    return Compiled(variant, arch, triton.__version__, seconds, dict(compiled.asm), compiled.metadata._asdict())


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (module docstring); returns the exit status: 0, or 1 if any compilation failed."""
    parser = argparse.ArgumentParser(prog="python -m lce.kernels.cross_compile",
                                     description="Compile every lce.kernels variant for NVIDIA targets, no GPU needed.")
    parser.add_argument("--arch", type=int, action="append", required=True,
                        help="a compute capability to compile for (80, 90); repeat for several")
    parser.add_argument("--shard", default="0/1", help="INDEX/COUNT: compile every COUNT-th variant from INDEX")
    args = parser.parse_args(argv)
    index, count = _parse_shard(parser, args.shard)
    failed = 0
    for variant in variants()[index::count]:
        for arch in args.arch:
            try:
                line = compile_variant(variant, arch).summary()
            except Exception as error:  # every failure is reported, and the other variants still compiled
                failed += 1
                line = {"failed": variant.name, "arch": arch, "error": f"{type(error).__name__}: {error}",
                        "traceback": traceback.format_exc(limit=-8)}
            print(json.dumps(line), flush=True)
    return 1 if failed else 0


def _parse_shard(parser: argparse.ArgumentParser, shard: str) -> tuple[int, int]:
    try:
        index, count = (int(part) for part in shard.split("/"))
    except ValueError:
        parser.error(f"--shard must be INDEX/COUNT (two ints, as 0/2), got {shard!r}")
    if not 0 <= index < count:
        parser.error(f"--shard INDEX/COUNT needs 0 <= INDEX < COUNT, got {shard!r}")
    return index, count


if __name__ == "__main__":
    sys.exit(main())
