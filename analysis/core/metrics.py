"""Errors against fp64, each judged by the rounding floor of its output's dtype.

For an output ``v`` (loss, grad_input, grad_weight or grad_bias) in dtype ``t``
and its fp64 reference ``r``, with ``round_t(r)`` the exact answer merely
rounded to ``t`` (no implementation returning ``t`` can beat it):

* ``rel_fro = ||v - r||_F / ||r||_F`` and its floor ``||round_t(r) - r|| / ||r||``;
  ``fro_in_floors`` is their ratio: how many "roundings' worth" of error the
  computation added (1 = perfect). It is an average over the whole tensor.
* **rows** (2-D gradients: one row per token of grad_input, one per class of
  grad_weight): each row's own relative error over its own floor. The median,
  99th percentile and maximum show what the Frobenius average hides, e.g. the
  weight-gradient rows of rarely targeted classes, whose entries are tiny next
  to the frequent classes' rows. Rows whose exact value is zero are left out.
* **bias** (signed): the error's component along the exact tensor,
  ``<v - r, r> / (||r|| * ||round_t(r) - r||)``, in the same floors. Rounding
  errors point every which way, so their component along ``r`` is about
  ``fro_in_floors / sqrt(numel)``; a systematic shrink or growth of the whole
  gradient (which does not average out over training steps) shows up at full
  size: a gradient 1% too small reads ``-0.01 / floor``.
* **ulps** (the loss): ``max |v - r| / ulp_t(r)``, the distance in units in the
  last place of ``t`` at the exact value (0.5 = correctly rounded). A scalar's
  Frobenius floor is a single rounding error, anywhere between 0 and half an ulp,
  so ``fro_in_floors`` of the loss is noisy; ulps are not.

An elementwise "max relative error" is deliberately not reported: entries whose
exact value is far below the tensor's scale make it arbitrarily large for an
op that is as accurate as its dtype allows (and clamping the denominator at
``finfo.tiny`` only moves the problem); the row distributions answer the
question it was meant to answer.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from analysis.core.inputs import OUTPUT_NAMES, Outputs

__all__ = ["rel_fro", "rounding_floor", "in_floors", "row_floors", "row_summary", "bias_in_floors", "ulp", "ulps",
           "ErrorReport", "report", "compare", "ERROR_SUFFIXES", "ROW_QUANTILES"]

ROW_QUANTILES: dict[str, float] = {"row_median": 0.5, "row_p99": 0.99, "row_max": 1.0}
"""The summaries of the per-row errors each 2-D gradient reports (column suffix -> quantile)."""

ERROR_SUFFIXES: tuple[str, ...] = ("rel_fro", "floor_fro", "fro_in_floors", "bias_in_floors", *ROW_QUANTILES,
                                   "ulps")
"""The error columns of one output, ``{output}_{suffix}``, in file order (empty where they do not apply)."""


def _check(value: torch.Tensor, reference: torch.Tensor) -> None:
    if value.shape != reference.shape:
        raise ValueError(f"value has shape {tuple(value.shape)} but reference has {tuple(reference.shape)}")


def rel_fro(value: torch.Tensor, reference: torch.Tensor) -> float:
    """Relative Frobenius error ``||value - reference|| / ||reference||``, computed in fp64."""
    _check(value, reference)
    v, r = value.detach().double(), reference.detach().double()
    diff = torch.linalg.vector_norm(v - r).item()
    scale = torch.linalg.vector_norm(r).item()
    if scale == 0.0:
        return 0.0 if diff == 0.0 else math.inf
    return diff / scale


def rounding_floor(reference: torch.Tensor, dtype: torch.dtype) -> float:
    """``rel_fro`` of ``reference`` rounded to ``dtype`` and back: the best any ``dtype`` result can do."""
    return rel_fro(reference.detach().to(dtype), reference)


def in_floors(error: float, floor: float) -> float:
    """``error / floor``; 1.0 when both are 0 (exact and exactly representable), inf when only floor is."""
    if floor == 0.0:
        return 1.0 if error == 0.0 else math.inf
    return error / floor


def row_floors(value: torch.Tensor, reference: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Each row's relative error over its own rounding floor in ``dtype`` (default ``value``'s), fp64, (rows,).

    Rows whose exact value is zero are dropped; a row whose exact value is
    representable (floor 0) reads 1 if it is exact and inf if not.
    """
    _check(value, reference)
    if value.dim() != 2:
        raise ValueError(f"row_floors needs 2-D tensors, got {value.dim()}-D")
    r = reference.detach().double()
    error = torch.linalg.vector_norm(value.detach().double() - r, dim=1)
    floor = torch.linalg.vector_norm(r.to(dtype or value.dtype).double() - r, dim=1)
    keep = torch.linalg.vector_norm(r, dim=1) > 0
    error, floor = error[keep], floor[keep]
    exact_rows = torch.where(error == 0, torch.ones_like(error), torch.full_like(error, math.inf))
    return torch.where(floor == 0, exact_rows, error / floor)


def row_summary(per_row: torch.Tensor) -> dict[str, float]:
    """:data:`ROW_QUANTILES` of per-row errors (e.g. :func:`row_floors`); ``{}`` without rows; an inf row stays
    inf in ``row_max``."""
    if not per_row.numel():
        return {}
    quantiles = torch.quantile(per_row.clamp_max(torch.finfo(torch.float64).max),
                               torch.tensor(list(ROW_QUANTILES.values()), dtype=torch.float64,
                                            device=per_row.device))
    summary = dict(zip(ROW_QUANTILES, quantiles.tolist(), strict=True))
    summary["row_max"] = per_row.max().item()
    return summary


def bias_in_floors(value: torch.Tensor, reference: torch.Tensor, dtype: torch.dtype | None = None) -> float:
    """The error's signed component along ``reference``, in Frobenius rounding floors of ``dtype``.

    Negative: the result is systematically smaller than the exact gradient
    (as if the learning rate were lower); positive: larger. 0 when the
    reference is exactly representable and matched.
    """
    _check(value, reference)
    r = reference.detach().double()
    along = torch.dot((value.detach().double() - r).flatten(), r.flatten()).item()
    floor_norm = torch.linalg.vector_norm(r.to(dtype or value.dtype).double() - r).item()
    scale = torch.linalg.vector_norm(r).item() * floor_norm
    if scale == 0.0:
        return 0.0 if along == 0.0 else math.copysign(math.inf, along)
    return along / scale


def ulp(exact: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The spacing of ``dtype``'s numbers at each (fp64) ``exact`` value (subnormal spacing below the normals)."""
    info = torch.finfo(dtype)
    magnitude = exact.detach().double().abs().clamp_min(info.tiny)
    return torch.exp2(torch.floor(torch.log2(magnitude))) * info.eps


def ulps(value: torch.Tensor, reference: torch.Tensor, dtype: torch.dtype | None = None) -> float:
    """``max |value - reference| / ulp(reference)`` in ``dtype`` (default ``value``'s); 0.5 = correctly rounded."""
    _check(value, reference)
    if value.numel() == 0:
        return 0.0
    r = reference.detach().double()
    return ((value.detach().double() - r).abs() / ulp(r, dtype or value.dtype)).max().item()


@dataclasses.dataclass(frozen=True)
class ErrorReport:
    """Errors of one output. ``rows`` (median, p99, max of :func:`row_floors`) only for 2-D outputs; ``ulps``
    only for the loss; NaN where they do not apply."""

    rel_fro: float
    floor_fro: float
    bias_in_floors: float
    row_median: float = math.nan
    row_p99: float = math.nan
    row_max: float = math.nan
    ulps: float = math.nan

    @property
    def fro_in_floors(self) -> float:
        return in_floors(self.rel_fro, self.floor_fro)

    def columns(self, prefix: str) -> dict[str, float]:
        """Flat CSV columns ``{prefix}_{suffix}`` for every suffix of :data:`ERROR_SUFFIXES`."""
        return {f"{prefix}_{suffix}": float(getattr(self, suffix)) for suffix in ERROR_SUFFIXES}


def report(value: torch.Tensor, reference: torch.Tensor, dtype: torch.dtype | None = None, *,
           with_ulps: bool = False) -> ErrorReport:
    """Every metric of one output, floors taken in ``dtype`` (default: ``value``'s dtype).

    2-D outputs get the row summaries; ``with_ulps`` adds the distance in ulps.
    """
    dtype = dtype or value.dtype
    rows = row_summary(row_floors(value, reference, dtype)) if value.dim() == 2 else {}
    return ErrorReport(rel_fro(value, reference), rounding_floor(reference, dtype),
                       bias_in_floors(value, reference, dtype), **rows,
                       ulps=ulps(value, reference, dtype) if with_ulps else math.nan)


def compare(outputs: Outputs, reference: Outputs) -> dict[str, ErrorReport]:
    """One :class:`ErrorReport` per output present in both (grad_bias is skipped without a bias); the loss
    also in ulps."""
    reports: dict[str, ErrorReport] = {}
    for name in OUTPUT_NAMES:
        value, exact = outputs.get(name), reference.get(name)
        if value is None or exact is None:
            continue
        reports[name] = report(value, exact, with_ulps=name == "loss")
    return reports
