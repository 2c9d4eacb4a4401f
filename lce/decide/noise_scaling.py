"""A candidate's gradient error against the sampling noise of a batch of N rows, at the head's own N.

The bias condition (:data:`lce.decide.BIAS_LIMIT`) compares the weight gradient's systematic error with one batch's
sampling noise along the exact gradient; the error/noise conditions (:data:`lce.decide.NOISE_ERROR_LIMIT`) compare
whole errors with the noise. The noise shrinks as ``1/sqrt(N)`` while a systematic error need not, so each ratio
depends on N. ``noise_scaling.json`` beside this module holds, per candidate, input dtype and ratio:

* the ratio measured at each N of the data (D = 128, C = 16384): the worst input family's median over seeds,
  over the families whose expected gradient is nonzero;
* the fitted power law ``log2(ratio) = level + exponent * log2(N)`` of the worst family, with a 95% band, at every
  power of two from the data's first N to the largest N it was asked to predict (``2**20``).

:func:`ratio_at` reads it: the measurement where N is among the data's (interpolated in log-log between two
measured N), the fitted line and its band elsewhere (``predicted=True``; beyond the last tabulated N the band's
ends are extended along their last slope). It knows the candidates by name (:func:`candidates`); which plan a name
stands for is in the names themselves (``"lce compact chunks=16"``: compact at 16 chunks; ``"lce auto cuda"``:
the CUDA "auto" pick at that N).

:func:`bias_at` reads a *plan*'s weight-gradient bias/noise at its own N: the measured candidates whose arithmetic
stands for the plan's (:func:`scaling_candidates`). A weight gradient summed in fp32 (balanced, accurate) rounds once,
into the input dtype; the study measured such candidates at the rounding floor of that dtype at every N (their
Frobenius error within 15% of the floor), so their ratio is the floor's, the least any op returning that dtype can
have (the larger of two such measurements is read).
A compact plan sums in the input dtype once per chunk: it reads the compact candidate whose chunk count at that N is
nearest its own. The data are at D = 128, C = 16384; a head of another shape reads them at its N (the study's
D = 512 and 2048 rows check that D does not change the growth).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from importlib import resources

import torch

__all__ = ["RATIOS", "RatioAtBatch", "ratio_at", "candidates", "scaling_data", "COMPACT_CANDIDATES",
           "FLOOR_CANDIDATES", "scaling_candidates", "bias_at", "at_rounding_floor"]

RATIOS: tuple[str, ...] = ("weight_bias_over_noise", "weight_error_over_noise", "input_error_over_noise")
"""The ratios tabulated: the weight gradient's bias along the exact gradient over the noise along it, and the
weight and input gradients' whole errors over their noise."""

_DATA_FILE = "noise_scaling.json"


@dataclasses.dataclass(frozen=True)
class RatioAtBatch:
    """A ratio of ``candidate`` at ``num_rows``: ``value`` with its interval ``[low, high]`` (the seeds' spread
    where measured, the fit's 95% band where predicted), and whether it is a ``predicted`` value (N outside the
    measured range) rather than a measurement."""

    candidate: str
    dtype: str
    ratio: str
    num_rows: int
    value: float
    low: float
    high: float
    predicted: bool

    def __str__(self) -> str:
        how = "predicted" if self.predicted else "measured"
        return (f"{self.candidate} {self.dtype} at N={self.num_rows}: {self.ratio} {self.value:.3g} "
                f"[{self.low:.3g}, {self.high:.3g}] ({how})")

    def phrase(self) -> str:
        """The weight-gradient bias in words, as the decision procedure's reasons and ``explain()`` print it."""
        how = "predicted beyond the measured batch sizes" if self.predicted else "measured"
        return (f"weight-gradient bias {self.value:.2g} [{self.low:.2g}, {self.high:.2g}] of the sampling noise at "
                f"N={self.num_rows} ({how})")


@functools.cache
def scaling_data() -> dict:
    """The contents of ``noise_scaling.json`` (read once)."""
    text = resources.files(__package__).joinpath(_DATA_FILE).read_text(encoding="utf-8")
    return json.loads(text)


def candidates() -> tuple[str, ...]:
    """The candidate names the data hold, in their order."""
    return tuple(dict.fromkeys(entry["candidate"] for entry in scaling_data()["entries"]))


def _entry(candidate: str, dtype: str, ratio: str) -> dict:
    for entry in scaling_data()["entries"]:
        if (entry["candidate"], entry["dtype"], entry["ratio"]) == (candidate, dtype, ratio):
            return entry
    known = sorted({(entry["candidate"], entry["dtype"]) for entry in scaling_data()["entries"]})
    raise ValueError(f"no {ratio} data for candidate {candidate!r} in {dtype}; the data hold {known}")


def _interpolate(points: list[dict], log2_n: float, keys: tuple[str, ...]) -> tuple[float, ...]:
    """``keys`` of ``points`` (ascending ``N``) at ``log2_n``, linear in log2 of both; past either end, along the
    end segment's slope."""
    xs = [math.log2(point["N"]) for point in points]
    exact = [point for point, x in zip(points, xs, strict=True) if x == log2_n]
    if exact or len(points) == 1:  # a tabulated N: its own values, unrounded
        return tuple((exact or points)[0][key] for key in keys)
    right = next((i for i, x in enumerate(xs) if x >= log2_n), len(xs) - 1)
    right = min(max(right, 1), len(xs) - 1)
    left = right - 1
    weight = (log2_n - xs[left]) / (xs[right] - xs[left])
    return tuple(2 ** ((1 - weight) * math.log2(points[left][key]) + weight * math.log2(points[right][key]))
                 for key in keys)


def ratio_at(candidate: str, dtype: torch.dtype | str, num_rows: int,
             ratio: str = "weight_bias_over_noise") -> RatioAtBatch:
    """``ratio`` of ``candidate`` (:func:`candidates`) in ``dtype`` at a batch of ``num_rows`` rows: measured within
    the data's range of N, predicted by the fitted power law outside it (see the module docstring).

    ``ValueError`` naming what the data hold for an unknown candidate, dtype or ratio, or ``num_rows < 1``."""
    if ratio not in RATIOS:
        raise ValueError(f"ratio must be one of {RATIOS}, got {ratio!r}")
    if not isinstance(num_rows, int) or num_rows < 1:
        raise ValueError(f"num_rows must be a positive int, got {num_rows!r}")
    dtype_text = str(dtype).removeprefix("torch.") if isinstance(dtype, torch.dtype) else dtype
    entry = _entry(candidate, dtype_text, ratio)
    measured = sorted(entry["measured"], key=lambda point: point["N"])
    log2_n = math.log2(num_rows)
    if measured and measured[0]["N"] <= num_rows <= measured[-1]["N"]:
        value, low, high = _interpolate(measured, log2_n, ("ratio", "low", "high"))
        return RatioAtBatch(candidate, dtype_text, ratio, num_rows, value, low, high, predicted=False)
    value, low, high = _interpolate(entry["fit"]["band"], log2_n, ("ratio", "low", "high"))
    return RatioAtBatch(candidate, dtype_text, ratio, num_rows, value, low, high, predicted=True)


def _compact_chunks(candidate: str, num_rows: int) -> int:
    """The chunk count of a measured compact candidate at ``num_rows`` rows (of the data's D and C)."""
    from ..planning.plan import aspect_ratio_chunk_size

    if candidate == "torch 2.13 auto":
        rows = aspect_ratio_chunk_size(num_rows, scaling_data()["D"], scaling_data()["C"], 2)
    elif " rows=" in candidate:
        rows = int(candidate.partition(" rows=")[2])
    else:
        return min(int(candidate.partition(" chunks=")[2]), num_rows)
    return -(-num_rows // min(rows, num_rows))


COMPACT_CANDIDATES: tuple[str, ...] = ("lce compact rows=2048", "lce compact chunks=16", "torch 2.13 auto")
"""The measured candidates that sum the weight gradient in the input dtype once per chunk (compact), among which a
compact plan reads the one with the nearest chunk count."""


def at_rounding_floor(plan) -> bool:
    """Whether ``plan``'s weight gradient is rounded once, into the input dtype (summed in fp32 or not at all over
    chunks): its bias/noise is then the dtype's rounding floor's (the module docstring)."""
    return plan.weight_grad_sum_dtype != plan.input_dtype or plan.num_chunks == 1


FLOOR_CANDIDATES: dict[str, tuple[str, ...]] = {
    "balanced": ("lce auto cuda", "lce balanced chunks=256"),
    "accurate": ("lce auto cpu", "lce accurate chunks=256"),
}
"""The measured candidates whose weight gradient is rounded once into the input dtype, by the policy whose layout
they run: two measurements of the same arithmetic at different chunk counts, whose spread is the statistic's own
scatter. A plan at the floor reads the larger of its policy's two (balanced's for compact at one chunk)."""


def scaling_candidates(plan) -> tuple[str, ...]:
    """The measured candidates whose weight-gradient arithmetic stands for ``plan``'s (empty where the data hold
    none: fp32 or fp64 input, or no weight gradient): :data:`FLOOR_CANDIDATES` of its policy for a plan at the
    rounding floor (:func:`at_rounding_floor`), else the compact candidate with the nearest chunk count at its N
    (ties to the larger count)."""
    if plan.input_dtype not in (torch.bfloat16, torch.float16) or not plan.needs_grad.weight:
        return ()
    if at_rounding_floor(plan):
        return FLOOR_CANDIDATES.get(plan.acc_policy, FLOOR_CANDIDATES["balanced"])
    chunks = plan.num_chunks
    return (min(COMPACT_CANDIDATES, key=lambda name: (abs(math.log2(_compact_chunks(name, plan.num_rows) / chunks)),
                                                       -_compact_chunks(name, plan.num_rows))),)


def bias_at(plan, num_rows: int | None = None) -> RatioAtBatch | None:
    """``plan``'s weight-gradient bias over one batch's noise along the gradient, at its own N (or at ``num_rows``:
    the same options over a batch of that many rows): the largest :func:`ratio_at` of :func:`scaling_candidates`;
    None where the data hold no candidate for it."""
    if num_rows is not None:
        plan = dataclasses.replace(plan, num_rows=num_rows)
    ratios = [ratio_at(name, plan.input_dtype, plan.num_rows) for name in scaling_candidates(plan)]
    return max(ratios, key=lambda ratio: ratio.value) if ratios else None
