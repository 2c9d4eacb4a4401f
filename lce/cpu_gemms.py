"""Whether this CPU runs bf16 and fp16 GEMMs natively or emulates them: measured once per process and dtype.

Why it matters. torch's bf16/fp16 matmuls on an x86 CPU are fast only where its oneDNN
backend has kernels for the CPU's instruction set (AVX512-BF16 or AMX for bf16); elsewhere they
fall back to a slow generic loop. Measured at 512x512x8192 on the CPU kinds this project runs on:
bf16 about 1.5x fp32's rate on an AMD EPYC with AVX512-BF16, about 2.5-3.4x on an Intel Xeon with
AMX, and about 80x *slower* than fp32 on an AMD EPYC with AVX2 only (0.5 vs 39 GFLOP/s); the same
Xeon with oneDNN, MKL and ATen limited to AVX2 (``ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2
ATEN_CPU_CAPABILITY=avx2``) emulates too, about 90x slower than its fp32. A plan that runs bf16
GEMMs to save time would, on such a CPU, run many times slower than the all-fp32 one.

Method: a timed probe, not the ISA flags. The flags say what the CPU has, not what this build of
torch does with them (an ISA cap in the environment, a build without oneDNN, another
architecture), so lce times what torch really runs: a (64, 256) @ (256, 256) product in fp32 and in
the dtype, the best of three after a warm-up, and calls the dtype *emulated* when it takes more
than :data:`EMULATED_SLOWDOWN` times fp32's time. The two kinds lie two orders of magnitude apart
(native: 0.3-1.1x fp32's time; emulated: 80-230x), so a busy machine does not blur them.
Cost: well under a millisecond per dtype on a native CPU, about 60 ms on an emulating one, once
per process and dtype, and only when lce plans a bf16 or fp16 call on a CPU (the result is cached).

Overrides, for tests and for a user who knows better: the environment variable
``LCE_CPU_GEMMS`` (``native``, ``emulated``, or per dtype ``bfloat16=native,float16=emulated``),
read once at the first query, and :func:`lce.testing.cpu_gemms` (a context manager, which wins over
the environment). Neither runs the probe.
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import os
import time
from typing import Literal

import torch

__all__ = ["Support", "GemmSupport", "ENV_VAR", "EMULATED_SLOWDOWN", "LOW_PRECISION", "gemm_support",
           "probe", "describe", "parse_setting", "CPU_GEMMS_OVERRIDE"]

Support = Literal["native", "emulated"]
SUPPORTS: tuple[Support, ...] = ("native", "emulated")

LOW_PRECISION: tuple[torch.dtype, ...] = (torch.bfloat16, torch.float16)
"""The dtypes whose CPU GEMMs can be emulated (fp32 and fp64 GEMMs are always native)."""

ENV_VAR = "LCE_CPU_GEMMS"

EMULATED_SLOWDOWN = 8.0
"""A dtype whose probe takes more than this many times fp32's time is emulated (see the module docstring)."""

_PROBE_SHAPE = (64, 256, 256)  # (m, k, n): 8.4 MFLOP, ~14 ms where emulated at 0.6 GFLOP/s

CPU_GEMMS_OVERRIDE: contextvars.ContextVar[dict[torch.dtype, Support] | None] = contextvars.ContextVar(
    "lce_cpu_gemms_override", default=None)


@dataclasses.dataclass(frozen=True)
class GemmSupport:
    """How a CPU runs GEMMs of one dtype, and how lce knows.

    ``source`` is "measured" (the probe), "LCE_CPU_GEMMS" (the environment) or "lce.testing.cpu_gemms"
    (the override). ``slowdown`` is the probe's time over fp32's (None
    when not measured).
    """

    dtype: torch.dtype
    support: Support
    source: str
    slowdown: float | None = None

    @property
    def emulated(self) -> bool:
        return self.support == "emulated"

    @property
    def dtype_name(self) -> str:
        return str(self.dtype).removeprefix("torch.")

    def __str__(self) -> str:
        if self.slowdown is not None:
            return f"{self.dtype_name} {self.support} ({self.source}: {self.slowdown:.2g}x fp32's time)"
        return f"{self.dtype_name} {self.support} ({self.source})"


def parse_setting(text: str) -> dict[torch.dtype, Support]:
    """Parse an ``LCE_CPU_GEMMS`` value: ``native``, ``emulated``, or ``bfloat16=native,float16=emulated``
    (dtypes not named keep being measured)."""
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
    """How this CPU runs GEMMs in ``dtype``: the override if one is set, else the environment, else the probe."""
    if dtype not in LOW_PRECISION:
        return GemmSupport(dtype, "native", "always")
    override = CPU_GEMMS_OVERRIDE.get()
    if override is not None and dtype in override:
        return GemmSupport(dtype, override[dtype], "lce.testing.cpu_gemms")
    setting = _environment_setting()
    if dtype in setting:
        return GemmSupport(dtype, setting[dtype], ENV_VAR)
    return probe(dtype)


def describe() -> str:
    """Each low-precision dtype's support as lce plans with it, for a results row's provenance:
    ``"bfloat16 native, float16 emulated"``, naming the source where it is not the probe."""
    parts = []
    for dtype in LOW_PRECISION:
        support = gemm_support(dtype)
        source = "" if support.source == "measured" else f" ({support.source})"
        parts.append(f"{support.dtype_name} {support.support}{source}")
    return ", ".join(parts)


@functools.cache
def probe(dtype: torch.dtype) -> GemmSupport:
    """Time this CPU's ``dtype`` GEMM against fp32's (once per process; see the module docstring)."""
    m, k, n = _PROBE_SHAPE
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(m, k, generator=generator)
    b = torch.randn(k, n, generator=generator)
    fp32 = _best_seconds(a, b)
    slowdown = _best_seconds(a.to(dtype), b.to(dtype)) / fp32
    return GemmSupport(dtype, "emulated" if slowdown > EMULATED_SLOWDOWN else "native", "measured", slowdown)


def _best_seconds(a: torch.Tensor, b: torch.Tensor, repeats: int = 3) -> float:
    with torch.no_grad():
        a @ b  # warm-up: a backend's first call may build its kernel
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            a @ b
            best = min(best, time.perf_counter() - start)
    return max(best, 1e-9)
