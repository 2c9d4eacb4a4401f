"""Predicted time of one forward + backward under a plan: a roofline estimate whose job is to rank candidates.

GEMM FLOPs at each GEMM's compute dtype's rate, the weight streamed once per GEMM and row chunk, the logits'
elementwise passes, and a fixed cost per (row chunk x class block) step. On a CPU the rates are this CPU's
(:func:`lce.cpu_gemms.rate_vs_fp32`: measured where a kernel is slower than fp32's, by the CPU's flags where it is
fast); on CUDA they are an H200's datasheet rates, so every CUDA time lce predicts is *predicted*: an H200's runs
(``python -m analysis gpu-check``, notebook 04) took several times these predictions at LLM heads, and over ten times
with an fp32 weight-gradient accumulator, which the model does not tell apart. :data:`TIME_SOURCE` says which, per
device kind.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import torch

from .cpu_gemms import rate_vs_fp32
from .planning import Plan

__all__ = ["DeviceSpeed", "DEVICE_SPEEDS", "TIME_SOURCE", "estimated_seconds", "gemm_flops", "gemm_compute_dtype"]

TIME_SOURCE: dict[str, str] = {
    "cpu": "predicted from this CPU's GEMM rates (lce.cpu_gemms)",
    "cuda": "predicted from an H200's datasheet rates (an H200 measured several times longer, over 10x with an fp32 "
            "accumulator: notebook 04)",
}
"""Where each device kind's time predictions come from, as tables say beside a time-dependent choice."""


@dataclasses.dataclass(frozen=True)
class DeviceSpeed:
    """Order-of-magnitude speeds for :func:`estimated_seconds` (ranking only, never a promise).

    ``flops`` maps an operand dtype to sustained GEMM FLOP/s, ``bandwidth`` is bytes/s of memory
    traffic, ``step_overhead`` the fixed seconds each (row chunk x class block) step costs (kernel
    launches, Python).
    """

    flops: Mapping[torch.dtype, float]
    bandwidth: float
    step_overhead: float


DEVICE_SPEEDS: dict[str, DeviceSpeed] = {
    # 2-core x86 CPUs; a plan made on this CPU takes its bf16 rate from lce.cpu_gemms.rate_vs_fp32 (gemm_flops):
    # the bf16 entry is for plans without a CPU verdict (meta tensors). fp16 runs in fp32 on every CPU, and slow or
    # emulated bf16 too (the plan sends those GEMMs through fp32 copies)
    "cpu": DeviceSpeed({torch.float64: 3e10, torch.float32: 6e10, torch.bfloat16: 1.2e11, torch.float16: 6e10},
                       bandwidth=1e10, step_overhead=2e-4),
    # H200 class: tensor-core bf16/fp16 ~15x fp32 without TF32
    "cuda": DeviceSpeed({torch.float64: 3e13, torch.float32: 5e13, torch.bfloat16: 7e14, torch.float16: 7e14},
                        bandwidth=4e12, step_overhead=3e-5),
}


def estimated_seconds(plan: Plan, cpu_rate: float | None = None) -> float:
    """A roofline estimate of one forward + backward under ``plan``: GEMM FLOPs at the operand dtype's
    speed, the weight read once per GEMM per row chunk, the logits' elementwise passes, and a fixed
    cost per step. Class tiling computes the logits twice."""
    speed = DEVICE_SPEEDS[plan.device_kind]
    n, d, c = plan.num_rows, plan.in_features, plan.num_classes
    gemms = ["logits"] * (2 if plan.tiles_classes else 1)
    gemms += [name for name, wanted in (("grad_input", plan.needs_grad.input),
                                        ("grad_weight", plan.needs_grad.weight)) if wanted]
    flop_seconds = sum(2.0 * n * c * d / gemm_flops(plan, name, cpu_rate) for name in gemms)
    weight_bytes = c * d * plan.input_dtype.itemsize
    traffic = len(gemms) * plan.num_chunks * weight_bytes  # W streamed once per GEMM and row chunk
    # a GEMM on fp32 copies also writes and reads the copies of the weight's blocks: 4 + 4 bytes per element
    traffic += sum(plan.num_chunks * c * d * 8 for name in gemms if plan.gemm_in_fp32(name))
    traffic += 6 * n * c * plan.stats_dtype.itemsize  # max, exp, sum, scale, dz, rounding: a few passes
    steps = plan.num_chunks * plan.num_class_chunks
    return flop_seconds + traffic / speed.bandwidth + steps * speed.step_overhead


def gemm_flops(plan: Plan, name: str, cpu_rate: float | None = None) -> float:
    """Sustained FLOP/s of the named GEMM of ``plan``: its compute dtype's speed (:data:`DEVICE_SPEEDS`); on a CPU,
    a low-precision GEMM runs at fp32's speed times this CPU's measured rate for the dtype
    (:func:`lce.cpu_gemms.rate_vs_fp32`), not a fixed ratio; ``cpu_rate`` stands in for that rate (another CPU
    kind's)."""
    speed = DEVICE_SPEEDS[plan.device_kind]
    dtype = gemm_compute_dtype(plan, name)
    if plan.device_kind == "cpu" and plan.cpu_gemms is not None and dtype == plan.cpu_gemms.dtype:
        rate = rate_vs_fp32(plan.cpu_gemms) if cpu_rate is None else cpu_rate
        return speed.flops[torch.float32] * rate
    return speed.flops[dtype]


def gemm_compute_dtype(plan: Plan, name: str) -> torch.dtype:
    """The dtype a GEMM of ``plan`` really computes in: its operands' dtype, or fp32 where the plan runs it on fp32
    copies because the CPU's own kernel for that dtype is slow (:attr:`~lce.planning.Plan.narrow_gemms_in_fp32`)."""
    return torch.float32 if plan.gemm_in_fp32(name) else plan.gemm_dtypes(name).operands
