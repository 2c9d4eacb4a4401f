"""Whether this CPU runs bf16 and fp16 GEMMs natively, natively but slower than fp32, or emulates them: decided
once per process and dtype.

Why it matters. torch's bf16/fp16 matmuls on an x86 CPU are fast only where its oneDNN backend has
kernels for the CPU's instruction set; elsewhere they fall back to a slow generic loop. Measured at
512x512x8192 on the CPU kinds this project runs on: bf16 about 1.5x fp32's rate on an AMD EPYC with
AVX512-BF16, about 2.5-3.4x on an Intel Xeon with AMX, 0.2x on an Intel Xeon with AVX512F but neither,
and about 80x *slower* than fp32 on an AMD EPYC with AVX2 only (0.5 vs 39 GFLOP/s); the same Xeon with
oneDNN, MKL and ATen limited to AVX2 (``ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2
ATEN_CPU_CAPABILITY=avx2``, the *AVX2 stand-in*) emulates too, about 90x slower than its fp32. A plan
that runs bf16 GEMMs to save time would, on such a CPU, run many times slower than the all-fp32 one; on the
AVX512F Xeon it would still run about 4-5x slower. Three verdicts, then: *native* (a kernel at or above about
fp32's rate), *slow* (a kernel, but more than :data:`SLOW_SLOWDOWN` times fp32's time: it converts to fp32
inside; ``ONEDNN_MAX_CPU_ISA=AVX512_CORE`` on an AMX Xeon, the *AVX512F stand-in*, measures 4.5-4.8x; on an
AVX512-BF16 EPYC the same cap gives 2.3-2.7x, either side of the threshold) and
*emulated*. lce's plans run the GEMMs of a slow or emulated dtype on fp32 copies (:mod:`lce.passes.gemm`): the same
arithmetic at fp32's speed.

Method, in two steps; neither depends on what else the machine runs or on torch's thread count.

1. **The CPU's flags** (x86 Linux, ``/proc/cpuinfo``). oneDNN has bf16 GEMM kernels only from
   AVX512 (BW/VL/DQ) or AVX-NE-CONVERT up, and fp16 ones only with AVX512-FP16, AMX-FP16 or
   AVX-NE-CONVERT (:data:`KERNEL_FLAGS`). A CPU with none of a dtype's flags emulates it whatever
   torch does: the verdict is "emulated", source "cpu flags", with nothing timed. A CPU whose only bf16
   flag is AVX512BW (no AVX512-BF16, AMX-BF16 or AVX-NE-CONVERT: the AVX512F Xeon) has only the converting
   kernel: "slow", source "cpu flags" (:data:`CONVERTING_ONLY_FLAGS`).
2. **A timed check** where the flags allow a kernel (or are unknown: another OS or architecture),
   since they say what the CPU has, not what this build of torch does with it (an ISA cap in the
   environment, as the stand-in sets, or a build without oneDNN). lce times a (64, 256) @ (256, 256)
   product in fp32 and in the dtype on **one thread**, the two interleaved, and compares the best of
   each (:data:`PROBE_ROUNDS` rounds after a warm-up). One thread, because a many-thread product
   this small waits on its slowest thread: with one core busy elsewhere, a 2-thread fp32 product
   took 30x its idle time, and the emulated bf16 one looked 2x *faster* than fp32 (an AVX2 EPYC
   under ``pytest -n auto``, issue 29). One thread runs fp32 at its efficient rate already at this
   shape (130 GFLOP/s on an AMX Xeon core), and the best of the rounds is a run that was not
   preempted, so load can only make an emulated dtype look slower, never faster. The dtype is
   *emulated* when its best takes more than :data:`EMULATED_SLOWDOWN` times fp32's and *slow* when
   more than :data:`SLOW_SLOWDOWN` times: the kinds lie apart on one thread: native 0.6-1.7x fp32's
   time on an AMX Xeon (bf16 0.6-1.0x, fp16 with AVX512-FP16 1.4-1.7x, idle or every core busy);
   slow 4.5-4.8x (bf16 under the AVX512F stand-in); emulated 23-37x under the AVX2 stand-in, idle or
   with every core busy, and 26-32x on the AVX2-only EPYC.

Cost: nothing where the flags decide; a few milliseconds per dtype on a native CPU; about 50 ms per
dtype on an emulating one (the check stops once the gap is unmistakable). Once per process and dtype,
only when lce plans a bf16 or fp16 call on a CPU.

One verdict per run: a process that starts workers hands them its verdicts (:func:`verdicts`, and
:func:`adopt` in the worker), so that a worker never plans differently from its parent.

Overrides, for tests and for a user who knows better: the environment variable ``LCE_CPU_GEMMS``
(``native``, ``slow``, ``emulated``, or per dtype ``bfloat16=native,float16=emulated``), read once at the first
query, and :func:`lce.testing.cpu_gemms` (a context manager, which wins over everything). Neither
runs the check.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import os
import platform
import time
from collections.abc import Iterator, Mapping
from typing import Literal

import torch

__all__ = ["Support", "GemmSupport", "ENV_VAR", "EMULATED_SLOWDOWN", "SLOW_SLOWDOWN", "LOW_PRECISION", "KERNEL_FLAGS",
           "CONVERTING_ONLY_FLAGS", "NATIVE_RATES", "FLAGGED_EMULATION_RATE", "FLAGGED_SLOW_RATE",
           "REFERENCE_NATIVE_RATE", "PROBE_ROUNDS",
           "rate_vs_fp32",
           "gemm_support", "probe", "measure", "cpu_flags", "flags_verdict", "describe", "parse_setting", "verdicts",
           "adopt", "CPU_GEMMS_OVERRIDE", "assumed_support"]

Support = Literal["native", "slow", "emulated"]
SUPPORTS: tuple[Support, ...] = ("native", "slow", "emulated")

LOW_PRECISION: tuple[torch.dtype, ...] = (torch.bfloat16, torch.float16)
"""The dtypes whose CPU GEMMs can be emulated (fp32 and fp64 GEMMs are always native)."""

ENV_VAR = "LCE_CPU_GEMMS"

EMULATED_SLOWDOWN = 12.0
"""A dtype whose one-thread check takes more than this many times fp32's time is emulated: about the geometric
mean of the slowest native kernel (bf16 on an AVX512F Xeon without AVX512-BF16, about 5x) and the fastest
emulation (23x, the AVX2 stand-in; see the module docstring)."""

SLOW_SLOWDOWN = 2.5
"""A dtype whose one-thread check takes more than this many times fp32's time (and at most
:data:`EMULATED_SLOWDOWN`) is slow: between the slowest fast kernel measured (fp16 with AVX512-FP16, 1.7x) and the
converting bf16 kernel (4.5x under the AVX512F stand-in), near their geometric mean (2.8x)."""

KERNEL_FLAGS: dict[torch.dtype, tuple[str, ...]] = {
    torch.bfloat16: ("avx512bw", "avx512_bf16", "amx_bf16", "avx_ne_convert"),
    torch.float16: ("avx512_fp16", "amx_fp16", "avx_ne_convert"),
}
"""Per dtype, the x86 CPU flags (as Linux names them) of which a CPU needs at least one for oneDNN to have a GEMM
kernel in that dtype; a CPU with none of them emulates it."""

CONVERTING_ONLY_FLAGS: dict[torch.dtype, tuple[str, ...]] = {torch.bfloat16: ("avx512bw",), torch.float16: ()}
"""Per dtype, the flags of :data:`KERNEL_FLAGS` that give only a kernel converting to fp32 inside: a CPU whose
kernel flags for the dtype are all among these runs it slow (bf16 at 0.2x fp32's rate on the AVX512F Xeon)."""

NATIVE_RATES: tuple[tuple[str, dict[torch.dtype, float]], ...] = (
    ("amx_bf16", {torch.bfloat16: 2.5}),
    ("avx512_bf16", {torch.bfloat16: 1.5}),
)
"""Large-GEMM rate over fp32's of a native kernel, by the first flag this CPU has (the kinds measured at 512x512x8192:
AMX Xeon 2.5-3.6x, AVX512-BF16 EPYC 1.5x; ``analysis/results/cpu_gemm_rates.csv``); 1.0 where none is listed
(fp16 with AVX512-FP16 measured 0.9-1.1x). The one-thread check's small product cannot tell these apart (the AMX
Xeon's bf16 is 0.6-1.0x fp32's time there), so the flags do."""

FLAGGED_EMULATION_RATE = 1 / 80
"""The rate over fp32's of a dtype the flags call emulated (nothing timed): the AVX2 EPYC's measured bf16."""

REFERENCE_NATIVE_RATE = 2.0
"""The rate over fp32's of a native dtype whose verdict was set, not measured (``LCE_CPU_GEMMS``,
:func:`lce.testing.cpu_gemms`): between the AVX512-BF16 EPYC's 1.5x and the AMX Xeon's 2.5x, so that plans and
tables made under a pinned verdict are the same on every CPU kind."""

FLAGGED_SLOW_RATE = 0.2
"""The rate over fp32's of a dtype the flags call slow (nothing timed): the AVX512F Xeon's measured bf16."""

PROBE_ROUNDS = 5
"""Interleaved fp32/dtype timings the check takes the best of (after one warm-up of each)."""

_PROBE_SHAPE = (64, 256, 256)  # (m, k, n): 8.4 MFLOP, ~0.07 ms in fp32 on one core, ~15 ms where emulated

CPU_GEMMS_OVERRIDE: contextvars.ContextVar[dict[torch.dtype, Support] | None] = contextvars.ContextVar(
    "lce_cpu_gemms_override", default=None)

_ADOPTED: dict[torch.dtype, GemmSupport] = {}  # a parent process's verdicts (adopt)


@dataclasses.dataclass(frozen=True)
class GemmSupport:
    """How a CPU runs GEMMs of one dtype, and how lce knows.

    ``source`` is "measured" (the timed check), "cpu flags" (the CPU lacks every flag of :data:`KERNEL_FLAGS`),
    "LCE_CPU_GEMMS" (the environment) or "lce.testing.cpu_gemms" (the override). ``slowdown`` is the timed
    check's best time over fp32's on one thread (None when not timed).
    """

    dtype: torch.dtype
    support: Support
    source: str
    slowdown: float | None = None

    @property
    def emulated(self) -> bool:
        return self.support == "emulated"

    @property
    def slower_than_fp32(self) -> bool:
        """Slow or emulated: lce runs this dtype's GEMMs on fp32 copies instead (the same arithmetic)."""
        return self.support != "native"

    @property
    def dtype_name(self) -> str:
        return str(self.dtype).removeprefix("torch.")

    def __str__(self) -> str:
        if self.slowdown is not None:
            return f"{self.dtype_name} {self.support} ({self.source}: {self.slowdown:.2g}x fp32's time)"
        return f"{self.dtype_name} {self.support} ({self.source})"


@contextlib.contextmanager
def assumed_support(support: Support | Mapping[torch.dtype, Support]) -> Iterator[None]:
    """Inside it, plans are made (and run) as on a CPU whose bf16 and fp16 GEMMs are ``support`` ("native", "slow" or
    "emulated"), or per dtype (``{torch.bfloat16: "emulated"}``), whatever this CPU measures; it wins over
    :data:`ENV_VAR`. The decision procedure plans for other CPU kinds with it; :func:`lce.testing.cpu_gemms` is the
    same for tests."""
    setting = dict.fromkeys(LOW_PRECISION, support) if isinstance(support, str) else dict(support)
    for dtype, value in setting.items():
        if dtype not in LOW_PRECISION or value not in SUPPORTS:
            raise ValueError(f"support must be one of {SUPPORTS}, or a dict from {LOW_PRECISION} to one of them; "
                             f"got {support!r}")
    token = CPU_GEMMS_OVERRIDE.set(setting)
    try:
        yield
    finally:
        CPU_GEMMS_OVERRIDE.reset(token)


def parse_setting(text: str) -> dict[torch.dtype, Support]:
    """Parse an ``LCE_CPU_GEMMS`` value: ``native``, ``emulated``, or ``bfloat16=native,float16=emulated``
    (dtypes not named keep being decided by lce)."""
    text = text.strip()
    if text in SUPPORTS:
        return dict.fromkeys(LOW_PRECISION, text)
    names = {str(dtype).removeprefix("torch."): dtype for dtype in LOW_PRECISION}
    setting: dict[torch.dtype, Support] = {}
    for part in filter(None, (piece.strip() for piece in text.split(","))):
        name, _, support = (piece.strip() for piece in part.partition("="))
        if name not in names or support not in SUPPORTS:
            raise ValueError(f"{ENV_VAR}={text!r} is not understood: expected 'native', 'emulated', or "
                             f"comma-separated DTYPE=SUPPORT with DTYPE in {sorted(names)} and SUPPORT in "
                             f"{list(SUPPORTS)}")
        setting[names[name]] = support
    return setting


@functools.cache
def _environment_setting() -> dict[torch.dtype, Support]:
    return parse_setting(os.environ.get(ENV_VAR, ""))


def gemm_support(dtype: torch.dtype) -> GemmSupport:
    """How this CPU runs GEMMs in ``dtype``: the override if one is set, else a parent process's verdict
    (:func:`adopt`), else the environment, else lce's own decision (:func:`probe`)."""
    if dtype not in LOW_PRECISION:
        return GemmSupport(dtype, "native", "always")
    override = CPU_GEMMS_OVERRIDE.get()
    if override is not None and dtype in override:
        return GemmSupport(dtype, override[dtype], "lce.testing.cpu_gemms")
    if dtype in _ADOPTED:
        return _ADOPTED[dtype]
    setting = _environment_setting()
    if dtype in setting:
        return GemmSupport(dtype, setting[dtype], ENV_VAR)
    return probe(dtype)


def verdicts() -> dict[torch.dtype, GemmSupport]:
    """What this process plans with for each low-precision dtype now, to hand to the worker processes it starts
    (each calls :func:`adopt` with it)."""
    return {dtype: gemm_support(dtype) for dtype in LOW_PRECISION}


def adopt(parent_verdicts: Mapping[torch.dtype, GemmSupport]) -> None:
    """Plan with a parent process's :func:`verdicts` in this process (below the override, above the environment
    and the check): a worker then computes what its parent would, and its results rows record the same verdict."""
    for dtype, support in parent_verdicts.items():
        if dtype not in LOW_PRECISION or not isinstance(support, GemmSupport) or support.dtype != dtype:
            raise ValueError(f"parent_verdicts must map each of {LOW_PRECISION} to its GemmSupport, as "
                             f"lce.planning.cpu_gemms.verdicts() returns; got {dtype!r}: {support!r}")
    _ADOPTED.update(parent_verdicts)


def describe() -> str:
    """Each low-precision dtype's support as lce plans with it, for a results row's provenance:
    ``"bfloat16 native, float16 emulated"``, naming the source where it is not the timed check."""
    parts = []
    for dtype in LOW_PRECISION:
        support = gemm_support(dtype)
        source = "" if support.source == "measured" else f" ({support.source})"
        parts.append(f"{support.dtype_name} {support.support}{source}")
    return ", ".join(parts)


@functools.cache
def cpu_flags() -> frozenset[str] | None:
    """This CPU's flags as Linux reports them (``/proc/cpuinfo``) on x86; None where unknown (another OS or
    architecture, or nothing readable)."""
    if platform.machine().lower() not in ("x86_64", "amd64", "i386", "i686"):
        return None
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as info:
            for line in info:
                name, _, value = line.partition(":")
                if name.strip() == "flags":
                    return frozenset(value.split())
    except OSError:
        pass
    return None


def flags_verdict(dtype: torch.dtype, flags: frozenset[str] | None) -> Support | None:
    """"emulated" when ``flags`` are known and hold none of :data:`KERNEL_FLAGS` for ``dtype``, "slow" when the ones
    they hold are all :data:`CONVERTING_ONLY_FLAGS`; None when only a timed check can tell (a fast kernel's flag,
    or unknown flags)."""
    if flags is None:
        return None
    held = [flag for flag in KERNEL_FLAGS[dtype] if flag in flags]
    if not held:
        return "emulated"
    if all(flag in CONVERTING_ONLY_FLAGS[dtype] for flag in held):
        return "slow"
    return None


def rate_vs_fp32(support: GemmSupport, flags: frozenset[str] | None | Literal["this cpu"] = "this cpu") -> float:
    """Large-GEMM FLOP rate of ``support``'s dtype over fp32's on this CPU (or one with ``flags``): the timed check's
    ``1 / slowdown`` for a slow or emulated dtype where it was timed, :data:`FLAGGED_EMULATION_RATE` where the flags
    said emulated, and for a native one :data:`NATIVE_RATES` by the CPU's flags (:data:`REFERENCE_NATIVE_RATE` where the
    verdict was set rather than measured). An estimate for ranking plans."""
    if support.dtype not in LOW_PRECISION:
        return 1.0
    if support.slower_than_fp32:
        if support.slowdown is not None:
            return 1.0 / max(support.slowdown, 1.0)
        return FLAGGED_EMULATION_RATE if support.emulated else FLAGGED_SLOW_RATE
    if support.slowdown is None:  # a verdict set (LCE_CPU_GEMMS, lce.testing.cpu_gemms), not measured here
        return REFERENCE_NATIVE_RATE
    flags = cpu_flags() if flags == "this cpu" else flags
    for flag, rates in NATIVE_RATES:
        if flags is not None and flag in flags and support.dtype in rates:
            return rates[support.dtype]
    return 1.0


@functools.cache
def probe(dtype: torch.dtype) -> GemmSupport:
    """lce's own decision for ``dtype`` on this CPU, once per process: :func:`measure`."""
    return measure(dtype)


def measure(dtype: torch.dtype, flags: frozenset[str] | None | Literal["this cpu"] = "this cpu") -> GemmSupport:
    """Decide ``dtype``'s support now, uncached: by ``flags`` (this CPU's by default) where they rule a kernel
    out, else by the one-thread timed check (see the module docstring)."""
    if dtype not in LOW_PRECISION:
        raise ValueError(f"dtype must be one of {LOW_PRECISION}; got {dtype!r}")
    by_flags = flags_verdict(dtype, cpu_flags() if flags == "this cpu" else flags)
    if by_flags is not None:
        return GemmSupport(dtype, by_flags, "cpu flags")
    slowdown = _one_thread_slowdown(dtype)
    support = "emulated" if slowdown > EMULATED_SLOWDOWN else "slow" if slowdown > SLOW_SLOWDOWN else "native"
    return GemmSupport(dtype, support, "measured", slowdown)


def _one_thread_slowdown(dtype: torch.dtype) -> float:
    """The best ``dtype`` product's time over the best fp32 one's, interleaved, on one thread."""
    m, k, n = _PROBE_SHAPE
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(m, k, generator=generator)
    b = torch.randn(k, n, generator=generator)
    a_low, b_low = a.to(dtype), b.to(dtype)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            a @ b, a_low @ b_low  # warm-up: a backend's first call may build its kernel
            best_fp32 = best_low = float("inf")
            for round_ in range(PROBE_ROUNDS):
                best_fp32 = min(best_fp32, _seconds(a, b))
                best_low = min(best_low, _seconds(a_low, b_low))
                if round_ >= 2 and best_low > 4 * EMULATED_SLOWDOWN * best_fp32:
                    break  # three rounds each 4x past the threshold: emulated, and each more round costs ~15 ms
    finally:
        torch.set_num_threads(threads)
    return best_low / max(best_fp32, 1e-9)


def _seconds(a: torch.Tensor, b: torch.Tensor) -> float:
    start = time.perf_counter()
    a @ b
    return time.perf_counter() - start
