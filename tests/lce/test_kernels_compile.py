"""lce.kernels' Triton kernels compiled for real NVIDIA targets (sm_80, sm_90) on this CPU, no GPU needed.

The kernel tests (tests/lce/test_kernels.py) run the kernels through Triton's CPU interpreter, which executes their
Python bodies with numpy: it compiles nothing, so it never type-checks a kernel, never generates code for the
compiled-only branch (``LIBDEVICE_EXP``, libdevice's ``exp``), and ignores the launch options (no fused
multiply-adds). Here every variant lce can launch (:mod:`lce.kernels.variants`) is compiled to PTX and cubin with
Triton's own LLVM and the ``ptxas`` its wheel ships (:mod:`lce.kernels.cross_compile`), with the installed Triton
(the test extra's 3.9) and with 3.6, the GPU machine's, installed on first use from the package index into a
folder of the venv that runs the tests (git-ignored), and reused after.

Each compilation runs in a fresh process: this session imported triton under ``TRITON_INTERPRET=1``
(tests/conftest.py), and its jit functions stay interpreted. Measured on a loaded 2-core CPU: 72 variants per target
in 12-21 s of compiling with either Triton (0.1 to 1.2 s each), PTX 14-51 kB and cubin 12-45 kB each. Checked by
hand: a loop-carried sum started as the int ``0`` and a wrong call in the libdevice branch each fail here while
every interpreter test still passes.

The variants themselves are checked against the launch code: every combination of the public functions' optional
arguments is launched with a recording stand-in for each kernel, and what the launches pass must be exactly the
variants, constexprs, argument types and warps alike.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

import pytest
import torch

from lce.kernels.interpreter import LAUNCH_OPTIONS, interpreting, libdevice_exp
from lce.kernels.variants import KERNELS, Variant, variants

REPO = Path(__file__).resolve().parents[2]

TRITON_3_6 = "3.6.0"
"""The GPU machine's Triton (its CUDA torch pins it), compiled with as well as the installed one."""

ARCHS = (80, 90)
"""A100 and H100/H200, the GPUs lce is meant for."""

PTX_TARGETS = {80: "sm_80", 90: "sm_90a"}
"""The ``.target`` of the PTX Triton writes for each arch (9.0's architecture-specific features: ``a``)."""

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")


# ---- the variants are what the launches pass ----------------------------------------------------------------

class RecordingKernel:
    """Stands in for a ``@triton.jit`` kernel of lce.kernels.softmax_passes: each launch ``kernel[grid](...)`` adds
    the :class:`Variant` it would compile (as Triton types the arguments) to ``launches``; nothing runs."""

    def __init__(self, name: str, arg_names: list[str], launches: set[Variant]):
        self.name, self.arg_names, self.launches = name, arg_names, launches

    def __getitem__(self, grid):
        def launch(*args, num_warps, **keywords):
            for option, value in LAUNCH_OPTIONS.items():
                assert keywords.pop(option) == value, f"{self.name} launched without {option}={value}"
            runtime_names = [name for name in self.arg_names if name not in keywords]
            assert len(args) == len(runtime_names), f"{self.name} launched with {len(args)} of {runtime_names}"
            constexprs = {name: keywords[name] for name in self.arg_names if name in keywords}
            # the test session interprets: its launches pass the interpreter's exp; a GPU's, libdevice's
            assert constexprs["LIBDEVICE_EXP"] == libdevice_exp(interpreted=True)
            constexprs["LIBDEVICE_EXP"] = libdevice_exp(interpreted=False)
            signature = tuple((name, triton_type(arg)) for name, arg in zip(runtime_names, args, strict=True))
            self.launches.add(Variant(self.name, tuple(constexprs.items()), signature, num_warps))

        return launch


def triton_type(arg) -> str:
    """The type Triton gives a launch argument: a tensor a pointer to its dtype, a Python int i32 below 2**31."""
    if isinstance(arg, torch.Tensor):
        return "*" + {torch.float32: "fp32", torch.int64: "i64"}[arg.dtype]
    if isinstance(arg, int):
        return "i32" if -2**31 <= arg < 2**31 else "i64"
    raise TypeError(f"a launch argument of type {type(arg).__name__}: {arg!r}")


@pytest.fixture
def recorded_launches(monkeypatch) -> set[Variant]:
    """Every launch of the public lce.kernels functions for each combination of their optional arguments, and
    column counts around each power of two to 2**17, recorded (the kernels replaced by :class:`RecordingKernel`)."""
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed")
    if not interpreting():
        pytest.skip("triton was not asked for its interpreter before it was imported (a session with CUDA)")
    import lce.kernels
    from lce.testing import interpreted_kernels

    with interpreted_kernels():
        if not lce.kernels.available(torch.zeros(1)):
            pytest.skip("lce.kernels' interpreted kernels do not import here")
        passes = sys.modules["lce.kernels.softmax_passes"]
        launches: set[Variant] = set()
        for name in KERNELS:
            monkeypatch.setattr(passes, name, RecordingKernel(name, getattr(passes, name).arg_names, launches))
        rows = 2
        row_vector = torch.zeros(rows)
        target = torch.zeros(rows, dtype=torch.int64)
        column_counts = sorted({max(1, 2**k + step) for k in range(18) for step in (-1, 0, 1)})
        for num_cols in column_counts:
            z = torch.zeros(rows, num_cols)
            class_weight = torch.ones(num_cols)
            for running_max, weighted_sum, weights in itertools.product((None, row_vector), (False, True),
                                                                        (None, class_weight)):
                lce.kernels.row_statistics(z, target, class_weight=weights, weighted_logit_sum=weighted_sum,
                                           running_max=running_max)
            lce.kernels.sum_apart_from_target(z, target, row_vector)
            for divisor, smoothing, weights in itertools.product((None, row_vector), (None, row_vector),
                                                                 (None, class_weight)):
                lce.kernels.grad_logits_(z, target, row_vector, prob_coef=row_vector, target_coef=row_vector,
                                         other_prob=row_vector, divisor=divisor, smoothing_coef=smoothing,
                                         class_weight=weights)
    return launches


def test_the_variants_are_exactly_what_the_public_functions_launch(recorded_launches):
    enumerated = variants()
    assert len(set(enumerated)) == len(enumerated), "a variant is listed twice"
    # the argument types first: a variant's name leaves them out
    assert {(variant.kernel, variant.signature) for variant in recorded_launches} == {
        (variant.kernel, variant.signature) for variant in enumerated}
    missing = sorted(variant.name for variant in recorded_launches - set(enumerated))
    unreachable = sorted(variant.name for variant in set(enumerated) - recorded_launches)
    assert not missing, f"launched but not enumerated by lce.kernels.variants: {missing}"
    assert not unreachable, f"enumerated but never launched: {unreachable}"


@pytest.mark.slow
def test_enumerating_and_importing_the_cross_compiler_import_no_triton():
    """The variants are plain Python, for any step that compiles them, and the cross-compiler imports triton only
    when it compiles."""
    code = ("import sys, lce.kernels.variants, lce.kernels.cross_compile\n"
            "assert len(lce.kernels.variants.variants()) > 0\n"
            "assert 'triton' not in sys.modules, 'triton was imported'\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=REPO, timeout=120)


@needs_triton
def test_compiling_refuses_interpreted_kernels():
    if not interpreting():
        pytest.skip("this session's kernels are compiled (a session with CUDA)")
    from lce.kernels.cross_compile import compile_variant

    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
        compile_variant(variants()[0], 90)


# ---- every variant compiles --------------------------------------------------------------------------------

def triton_3_6_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding Triton 3.6.0 alone (``pip install --no-deps --target``) to put first on PYTHONPATH.

    Kept inside the venv that runs the tests (git-ignored ``.venv/``), so it is installed once per venv; outside a
    venv, once per session. Installed into a temporary sibling and renamed into place, so pytest-xdist's workers
    can race: the first rename wins, the folder is whole whenever it exists. Skips, saying why, where pip cannot
    install it (no such wheel for this Python, no package index in reach).
    """
    in_venv = sys.prefix != sys.base_prefix
    root = Path(sys.prefix) if in_venv else tmp_path_factory.getbasetemp()
    folder = root / f"triton-{TRITON_3_6}"
    if (folder / "triton" / "__init__.py").is_file():
        return folder
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=root))
    try:
        install = subprocess.run(
            [sys.executable, "-m", "pip", "install", "--no-deps", "--only-binary", "triton", "--no-input",
             "--disable-pip-version-check", "--quiet", "--target", str(staging), f"triton=={TRITON_3_6}"],
            capture_output=True, text=True, timeout=600)
        if install.returncode:
            pytest.skip(f"pip could not install triton=={TRITON_3_6} (the GPU machine's) from this machine's package "
                        f"index, so the kernels were not compiled with it: {install.stderr.strip()[-600:]}")
        try:
            staging.rename(folder)
        except OSError:  # another worker's install got there first: use that one
            if not (folder / "triton" / "__init__.py").is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return folder


@pytest.fixture(params=["installed", TRITON_3_6])
def triton_under_test(request, tmp_path_factory) -> tuple[str, Path | None]:
    """(the Triton version compiled with, the folder to put first on PYTHONPATH for it, or None)."""
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed (the test extra's)")
    if request.param == "installed":
        return metadata.version("triton"), None  # the venv's own
    return TRITON_3_6, triton_3_6_folder(tmp_path_factory)


@needs_triton
@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
def test_every_variant_compiles(triton_under_test, arch, tmp_path):
    version, triton_folder = triton_under_test
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton-cache")  # a true compile every time, and ~/.triton untouched
    if triton_folder is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(triton_folder), str(REPO), env.get("PYTHONPATH", "")]).rstrip(
            os.pathsep)
    run = subprocess.run([sys.executable, "-m", "lce.kernels.cross_compile", "--arch", str(arch)],
                         capture_output=True, text=True, env=env, cwd=REPO, timeout=600)
    lines = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    failures = [line for line in lines if "failed" in line]
    if failures:
        listed = "\n".join(f"  {line['failed']}: {line['error'].splitlines()[-1]}" for line in failures)
        pytest.fail(f"{len(failures)} of {len(variants())} variants failed to compile for sm_{arch} with Triton "
                    f"{version}:\n{listed}\nThe first's traceback:\n{failures[0]['traceback']}", pytrace=False)
    assert run.returncode == 0, run.stderr[-3000:]
    compiled = {line["variant"]: line for line in lines}
    assert sorted(compiled) == sorted(variant.name for variant in variants())
    for name, line in compiled.items():
        assert line["triton"] == version, f"{name} compiled by Triton {line['triton']}, not {version}"
        assert line["ptx_target"] == PTX_TARGETS[arch], f"{name}: PTX for {line['ptx_target']}"
        assert line["ptx_bytes"] > 0 and line["cubin_bytes"] > 0, f"{name} produced no code: {line}"
        assert line["enable_fp_fusion"] is False, f"{name} compiled with fused multiply-adds allowed"
