"""Relative errors against fp64, and the rounding floor each error is judged by.

For an output ``v`` (loss, grad_input, grad_weight or grad_bias) in dtype ``t``
and its fp64 reference ``r``:

* ``rel_fro(v, r) = ||v - r||_F / ||r||_F`` (0 when both are 0);
* ``max_rel(v, r) = max_i |v_i - r_i| / max(|r_i|, tiny_t)``, where ``tiny_t``
  is the smallest normal number of ``t``: entries whose exact value is below
  ``t``'s normal range are judged on the absolute scale the dtype can resolve
  there, instead of dividing by (nearly) zero;
* the **rounding floor** of each metric is that metric of ``round_t(r)``: the
  error of the exact answer merely rounded to the output dtype. No
  implementation returning dtype ``t`` can beat it, so ``error / floor`` says
  how many "roundings' worth" of error the computation added (1 = perfect).

For the scalar loss the floor is a single rounding error, anywhere between 0
and the unit roundoff, so the loss's multiple-of-floor is noisy; the gradient
tensors' floors are averages over many entries and stable.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from .inputs import OUTPUT_NAMES, Outputs

__all__ = ["rel_fro", "max_rel", "rounding_floor", "in_floors", "ErrorReport", "report", "compare"]


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


def max_rel(value: torch.Tensor, reference: torch.Tensor, dtype: torch.dtype | None = None) -> float:
    """Largest elementwise relative error, denominators clamped at ``dtype``'s smallest normal.

    ``dtype`` defaults to ``value``'s dtype (fp64 values get fp64's tiny).
    """
    _check(value, reference)
    if value.numel() == 0:
        return 0.0
    tiny = torch.finfo(dtype or value.dtype).tiny
    v, r = value.detach().double(), reference.detach().double()
    return ((v - r).abs() / r.abs().clamp_min(tiny)).max().item()


def rounding_floor(reference: torch.Tensor, dtype: torch.dtype) -> tuple[float, float]:
    """``(rel_fro, max_rel)`` of ``reference`` rounded to ``dtype`` and back: the best achievable."""
    rounded = reference.detach().to(dtype)
    return rel_fro(rounded, reference), max_rel(rounded, reference, dtype)


def in_floors(error: float, floor: float) -> float:
    """``error / floor``; 1.0 when both are 0 (exact and exactly representable), inf when only floor is."""
    if floor == 0.0:
        return 1.0 if error == 0.0 else math.inf
    return error / floor


@dataclasses.dataclass(frozen=True)
class ErrorReport:
    """Errors of one output: measured, floor, and measured in units of floor."""

    rel_fro: float
    max_rel: float
    floor_fro: float
    floor_max: float

    @property
    def fro_in_floors(self) -> float:
        return in_floors(self.rel_fro, self.floor_fro)

    @property
    def max_in_floors(self) -> float:
        return in_floors(self.max_rel, self.floor_max)

    def columns(self, prefix: str) -> dict[str, float]:
        """Flat CSV columns ``{prefix}_rel_fro``, ... ``{prefix}_max_in_floors``."""
        return {
            f"{prefix}_rel_fro": self.rel_fro,
            f"{prefix}_max_rel": self.max_rel,
            f"{prefix}_floor_fro": self.floor_fro,
            f"{prefix}_floor_max": self.floor_max,
            f"{prefix}_fro_in_floors": self.fro_in_floors,
            f"{prefix}_max_in_floors": self.max_in_floors,
        }


def report(value: torch.Tensor, reference: torch.Tensor, dtype: torch.dtype | None = None) -> ErrorReport:
    """Every metric of one output; the floor is taken in ``dtype`` (default: ``value``'s dtype)."""
    dtype = dtype or value.dtype
    floor_fro, floor_max = rounding_floor(reference, dtype)
    return ErrorReport(rel_fro(value, reference), max_rel(value, reference, dtype), floor_fro, floor_max)


def compare(outputs: Outputs, reference: Outputs) -> dict[str, ErrorReport]:
    """One :class:`ErrorReport` per output present in both (grad_bias is skipped without a bias)."""
    reports: dict[str, ErrorReport] = {}
    for name in OUTPUT_NAMES:
        value, exact = outputs.get(name), reference.get(name)
        if value is None or exact is None:
            continue
        reports[name] = report(value, exact)
    return reports
