"""Predicted time of one forward + backward under a plan: a cost model fitted to measured runs, whose job is to rank
candidates and to say roughly how long each takes.

The cost of a plan is a sum of terms it can count exactly (:func:`time_terms`), each weighed by a constant of its
device kind (:class:`TimeConstants`):

* **GEMMs**: each GEMM's FLOPs at its compute dtype's rate, stretched by ``1 + half_rows / M + half_features / D``
  for a chunk of ``M`` rows and ``D`` features (a GEMM with a short side runs below the peak: its operands are read
  for little work);
* **memory traffic**, at ``bandwidth``: the weight read once per GEMM and row chunk; a weight-gradient accumulator
  read and written once per row chunk, and the product blocks added into it where no single kernel does both
  (:func:`lce.passes.gemm.add_mm_`); the fp32 copies of GEMMs run on fp32 copies (:mod:`lce.planning.cpu_gemms`); and
  ``elementwise_passes`` passes over the logits (max, exponentials, sums, the softmax and dz, their rounding);
* **launches**: every GEMM call a step makes (a blocked sum or upcast makes many), at ``launch_overhead`` each;
* **steps**: every (row chunk x class block) step at ``step_overhead`` (the Python and small ops around them).

The constants are data (``time_model.json`` beside this module), fitted by ``python -m analysis time-model`` to the
committed measurements of each device kind, which also reports how well the fit predicts times it was not fitted to
(:data:`FIT`). GEMM rates come from the CPU a plan is made on (:func:`lce.planning.cpu_gemms.rate_vs_fp32` for
low-precision
GEMMs) or, on CUDA, from the fitted device's; :data:`TIME_SOURCE` says, per device kind, what the predictions rest
on.

Not counted yet: the fused Triton passes (:mod:`lce.kernels`, ``plan.fused_passes``). ``elementwise_passes`` is fitted
to runs of the PyTorch ops, so on a GPU that runs the kernels the model predicts the slower path until the GPU
check's runs of them are fitted.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path
from typing import NamedTuple

import torch

from ..planning.blocks import rows_per_block
from ..planning.cpu_gemms import rate_vs_fp32
from ..planning.plan import Plan

__all__ = ["TimeConstants", "TimeTerms", "CONSTANTS", "FIT", "TIME_SOURCE", "CONSTANTS_FILE", "load_constants",
           "time_terms", "estimated_seconds", "gemm_flops", "gemm_compute_dtype", "gemm_names"]

CONSTANTS_FILE = Path(__file__).with_name("time_model.json")


@dataclasses.dataclass(frozen=True)
class TimeConstants:
    """The constants of one device kind: ``flops`` maps a GEMM's compute dtype to the FLOP/s a large GEMM sustains;
    ``half_rows`` and ``half_features`` the rows and features at which a GEMM's time doubles (with the other side
    large); ``bandwidth`` bytes/s of memory traffic;
    ``elementwise_passes`` passes over the fp32 logits per step; ``launch_overhead`` seconds per GEMM call;
    ``step_overhead`` seconds per (row chunk x class block) step; ``source`` what they were fitted to."""

    flops: dict[torch.dtype, float]
    half_rows: float
    half_features: float
    bandwidth: float
    elementwise_passes: float
    launch_overhead: float
    step_overhead: float
    source: str

    @classmethod
    def from_json(cls, entry: dict) -> TimeConstants:
        flops = {getattr(torch, name): float(rate) for name, rate in entry["flops"].items()}
        return cls(flops, float(entry["half_rows"]), float(entry["half_features"]), float(entry["bandwidth"]),
                   float(entry["elementwise_passes"]), float(entry["launch_overhead"]), float(entry["step_overhead"]),
                   str(entry["source"]))

    def to_json(self) -> dict:
        return {"flops": {str(dtype).removeprefix("torch."): rate for dtype, rate in self.flops.items()},
                "half_rows": self.half_rows, "half_features": self.half_features, "bandwidth": self.bandwidth,
                "elementwise_passes": self.elementwise_passes, "launch_overhead": self.launch_overhead,
                "step_overhead": self.step_overhead, "source": self.source}


@functools.cache
def load_constants(path: Path = CONSTANTS_FILE) -> tuple[dict[str, TimeConstants], dict[str, dict]]:
    """The fitted constants per device kind and the report of their fit (``python -m analysis time-model``)."""
    data = json.loads(Path(path).read_text())
    return ({kind: TimeConstants.from_json(entry) for kind, entry in data["constants"].items()},
            {kind: dict(report) for kind, report in data["fit"].items()})


CONSTANTS, FIT = load_constants()
"""The constants in use, and how well they predicted the measurements they were not fitted to."""

TIME_SOURCE: dict[str, str] = {kind: constants.source for kind, constants in CONSTANTS.items()}
"""Where each device kind's time predictions come from, as tables say beside a time-dependent choice."""


class TimeTerms(NamedTuple):
    """What a plan's time is made of, counted exactly: ``gemm_seconds`` (FLOPs over each GEMM's rate and its row
    efficiency), ``bytes`` of weight and accumulator traffic, ``logit_bytes`` of one
    pass over the fp32 logits, ``launches`` (GEMM calls) and ``steps``."""

    gemm_seconds: float
    bytes: float
    logit_bytes: float
    launches: float
    steps: float

    def seconds(self, constants: TimeConstants) -> float:
        return (self.gemm_seconds + (self.bytes + constants.elementwise_passes * self.logit_bytes)
                / constants.bandwidth + self.launches * constants.launch_overhead
                + self.steps * constants.step_overhead)


def gemm_names(plan: Plan) -> list[str]:
    """The GEMMs one forward + backward runs, once each per step (the logits twice where classes are tiled)."""
    gemms = ["logits"] * (2 if plan.tiles_classes else 1)
    return gemms + [name for name, wanted in (("grad_input", plan.needs_grad.input),
                                              ("grad_weight", plan.needs_grad.weight)) if wanted]


def time_terms(plan: Plan, constants: TimeConstants | None = None, *, cpu_rate: float | None = None,
               fp32_flops: float | None = None) -> TimeTerms:
    """The terms of :class:`TimeTerms` for ``plan`` (``constants``: the device kind's, for its rates and GEMM
    efficiency; ``cpu_rate`` and ``fp32_flops``: another CPU's low-precision rate over fp32 and fp32 rate)."""
    constants = constants or CONSTANTS[plan.device_kind]
    n, d, c = plan.loop_rows, plan.in_features, plan.num_classes  # a batch-invariant plan's padded rows included
    rows, block = min(plan.batch_chunk_size, n), plan.class_chunk_size
    chunks, blocks = plan.num_chunks, plan.num_class_chunks
    stretch = 1.0 + constants.half_rows / rows + constants.half_features / d
    names = gemm_names(plan)
    gemm_seconds = sum(2.0 * n * c * d / gemm_flops(plan, name, cpu_rate, constants, fp32_flops) * stretch
                       for name in names)
    weight_bytes = c * d * plan.input_dtype.itemsize
    traffic = len(names) * chunks * weight_bytes
    launches = float(len(names) * chunks * blocks)
    cuts = -(-min(block, c) // rows_per_block(d, plan.device_kind))  # blocks of weight rows per GEMM cut in blocks
    for name in names:
        if plan.gemm_in_fp32(name):  # fp32 copies of the weight's blocks, written and read, a GEMM per block
            traffic += chunks * c * d * 8
            launches += chunks * blocks * (cuts - 1)
    if plan.needs_grad.weight:
        operands, product = plan.gemm_dtypes("grad_weight")
        summed = plan.weight_grad_sum_dtype
        if summed != plan.input_dtype:  # an accumulator, read and written once per chunk
            traffic += 2 * chunks * c * d * summed.itemsize
        in_place = operands == product == summed or (plan.mixed_addmm and product == summed)
        if not in_place:  # the product formed in blocks, then read again to be added
            traffic += 2 * chunks * c * d * product.itemsize
            launches += chunks * blocks * (cuts - 1)
    for name in ("logits", "grad_input"):
        if name in names and plan.upcasts_weight_for(name):  # the weight upcast a block of rows at a time
            launches += chunks * blocks * (cuts - 1)
    logit_bytes = n * c * plan.stats_dtype.itemsize * (2 if plan.tiles_classes else 1)
    return TimeTerms(gemm_seconds, float(traffic), float(logit_bytes), launches, float(chunks * blocks))


def estimated_seconds(plan: Plan, cpu_rate: float | None = None) -> float:
    """The predicted seconds of one forward + backward under ``plan`` (see the module docstring); ``cpu_rate``:
    another CPU kind's low-precision GEMM rate over fp32, for tables that rank for a kind other than this CPU."""
    constants = CONSTANTS[plan.device_kind]
    return time_terms(plan, constants, cpu_rate=cpu_rate).seconds(constants)


def gemm_flops(plan: Plan, name: str, cpu_rate: float | None = None, constants: TimeConstants | None = None,
               fp32_flops: float | None = None) -> float:
    """Sustained FLOP/s of the named GEMM of ``plan``: its compute dtype's rate (``constants.flops``); on a CPU a
    low-precision GEMM runs at fp32's rate times this CPU's measured rate for the dtype
    (:func:`lce.planning.cpu_gemms.rate_vs_fp32`), not a fixed ratio; ``cpu_rate`` stands in for that rate (another CPU
    kind's) and ``fp32_flops`` for fp32's."""
    constants = constants or CONSTANTS[plan.device_kind]
    dtype = gemm_compute_dtype(plan, name)
    fp32 = constants.flops[torch.float32] if fp32_flops is None else fp32_flops
    if plan.device_kind == "cpu" and plan.cpu_gemms is not None and dtype == plan.cpu_gemms.dtype:
        rate = rate_vs_fp32(plan.cpu_gemms) if cpu_rate is None else cpu_rate
        return fp32 * rate
    if plan.device_kind == "cpu" and fp32_flops is not None:
        return fp32 * constants.flops[dtype] / constants.flops[torch.float32]
    return constants.flops[dtype]


def gemm_compute_dtype(plan: Plan, name: str) -> torch.dtype:
    """The dtype a GEMM of ``plan`` really computes in: its operands' dtype, or fp32 where the plan runs it on fp32
    copies because the CPU's own kernel for that dtype is slow
    (:attr:`~lce.planning.plan.Plan.narrow_gemms_in_fp32`)."""
    return torch.float32 if plan.gemm_in_fp32(name) else plan.gemm_dtypes(name).operands

