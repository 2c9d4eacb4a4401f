"""Predicted rounding error of lce's gradients, in rounding floors, from a plan and a few input statistics.

The unit is the floor of :mod:`analysis.core.metrics`: ``||v - r||_F / ||round_t(r) - r||_F`` against the
fp64 answer ``r``, ``t`` the input dtype. Rounding a value to ``t`` adds an error of relative size
about ``u_t`` (the unit roundoff) in a direction unrelated to the others, so independent sources add
in *squared* floors::

    floors**2 = 1 + sum over sources s of  c_s * f_s(plan, stats)

The 1 is the unavoidable final rounding of each gradient. Each ``f_s`` comes from one rounding the
plan's layout performs, propagated to the gradient to first order, and ``c_s`` is a constant fitted
on committed measurements (``lce/decide/error_model.json``; ``python -m analysis error-model`` refits it).

Notation: ``g_i = dz_i x_i^T`` is row i's contribution to the weight gradient ``G = sum_i g_i``;
with ``rho = ||E g||^2 / E||g||^2`` (the signal fraction, :class:`InputStats`), a sum of ``m`` rows
has ``E||sum||^2 = (m**2 rho + m (1 - rho)) E||g||^2``. All weight-gradient terms use this to go
from per-row statistics to sums over the N rows, the chunks and the partial sums.

Weight gradient (summed over N rows, in k chunks of n = N/k rows):

(a) *Per-chunk rounding of the running sum* (``weight_grad_sum`` in the input dtype: CUDA compact,
    or any layout whose acc_dtype is the input dtype). After chunk j the partial sum ``S_j`` is
    rounded: an error of one floor *of S_j*. While the increments are comparable to the sum these
    errors are a random walk, ``sum_j ||S_j||^2 / ||G||^2`` squared floors (term ``chunk_walk``,
    growing ~k/2 when noise dominates, ~k/3 when signal does). Once an increment falls below half
    an ulp of the partial sum it is lost whole, with the same sign chunk after chunk: the error then
    grows linearly in k, ``(k - 1)**2`` squared floors scaled by the signal share of the gradient
    (term ``chunk_stagnation``; a consistent gradient keeps adding same-signed small increments).
    Measured: 10-30 floors at 256 chunks on calibrated and trained inputs.
(b) *Chunk product rounded to the input dtype before an fp32 sum* (CPU balanced with fp32 acc, and
    (a)'s layouts too): one rounding of each product ``P_j``: ``sum_j ||P_j||^2 / ||G||^2``
    (term ``chunk_product``) -- between 1/k and 1, so flat in k.
(c) *dz rounded to the input dtype* before a backward GEMM (CUDA balanced and compact, CPU
    balanced): one rounding of each dz entry, weighted by the rows it multiplies (term ``dz``). It
    does not depend on k: measured 1.0-1.3 floors.
(d) *Logits rounded to the input dtype* (acc_dtype equal to the input dtype): an error ``u |z|`` on
    each logit moves p by ``p u |z|`` (term ``logits``).
(e) *fp32 GEMM summation*: a length-L fp32 sum errs by about ``u_32 L**gamma`` times its terms'
    size; against a bf16/fp16 floor that is ``(u_32 / u_t)**2 ~ 1e-10`` and vanishes, but fp32
    inputs measure it (18-68 floors): terms ``gemm`` (length N for the weight gradient, C for the
    input gradient) and ``logits_gemm`` (length D, through the softmax).

Input gradient (one row per token, no sum over rows, so no chunk dependence): (c), (d) and (e) with
row statistics measured directly; with class tiling (``class_chunk_size``) and a grad_input GEMM whose
result is the input dtype (CPU balanced and compact), (b) over the class blocks: each block's product is
rounded, and the target's block holds nearly all of dz, so ``sum_b ||P_b||^2 / ||g||^2 ~ 1``
(``tests/lce/test_class_tiling.py`` measures 1.31 -> 1.65 floors at 8 blocks; the model says 1.19 -> 1.63).

Accuracy: :data:`ACCURACY` (held-out families and shapes; ``analysis.studies.error_model``).
Predictions outside the fitted range (LLM shapes) are extrapolations.

Two details of the weight gradient, from the same terms with constants of their own
(:func:`predict_weight_details`, fitted and validated on the same split; :data:`DETAIL_ACCURACY`):

* ``weight_bias``: an *upper bound* on the error's component along the exact gradient, in Frobenius floors
  (``|<V - R, R>| / ||R|| / ||round_t(R) - R||``) -- the part of the error that a step of SGD does not
  average away. How much of an error points along the gradient depends on the inputs more than on the
  layout (the terms above fit it within ±25% for almost no points), so the model bounds it instead:
  ``bias <= b_rounding + b_excess * sqrt(floors**2 - 1)``, ``floors`` the predicted Frobenius error of the
  weight gradient, both constants the fit split's 95th percentiles (of the bias where the excess is small,
  and of bias over excess where it is not).
* ``worst_row``: the worst class row's error, in that row's own floors (the rarely targeted classes,
  whose small gradients a rounding of the whole sum swamps): ``worst_row**2 = 1 + sum_s w_s f_s``.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from importlib import resources

import torch

from ..planning.plan import Plan

__all__ = ["InputStats", "WORST_COMMITTED_STATS", "ACCURACY", "Constants", "load_constants", "constants_from_json",
           "source_terms",
           "predict_errors", "predict_weight_details", "measure_input_stats", "OUTPUTS", "TERMS", "DETAILS",
           "DETAIL_TERMS", "DETAIL_ACCURACY"]

OUTPUTS: tuple[str, ...] = ("grad_input", "grad_weight")
"""The gradients the model predicts (the loss is not modeled: its floor is a single rounding)."""

TERMS: tuple[str, ...] = ("dz", "logits", "chunk_product", "chunk_walk", "chunk_stagnation", "gemm", "logits_gemm")
"""The error sources, each with one fitted constant (the module docstring says what each is)."""

DETAILS: tuple[str, ...] = ("weight_bias", "worst_row")
"""The weight gradient's details :func:`predict_weight_details` predicts (the module docstring says what each is)."""

DETAIL_TERMS: dict[str, tuple[str, ...]] = {"weight_bias": ("rounding", "excess"), "worst_row": TERMS}
"""Each detail's constants: the bias bound's two (the module docstring), the worst row's one per term of
:data:`TERMS` (``worst_row**2 = 1 + sum_s w_s f_s``)."""

_FP32_UNIT_ROUNDOFF = 2.0 ** -24
_CONSTANTS_FILE = "error_model.json"


@dataclasses.dataclass(frozen=True)
class InputStats:
    """The statistics of ``(x, W, y)`` that the error model needs; all dimensionless, independent of N.

    Weight gradient (per-row contributions ``g_i = dz_i x_i^T``, means over rows):

    * ``weight_signal_fraction`` ``||E g||^2 / E||g||^2``: 0 for pure noise (the rows' contributions
      cancel), 1 when every row pushes the same way.
    * ``weight_dz_share`` ``E[sum_c e_c^2 ||x||^2] / E||g||^2`` where ``e_c`` is dz's entry when its
      rounding is not exact (a target entry ``p - 1`` with ``p < 2**-8`` rounds to -1 almost
      exactly, so it counts ``(p / 2**-8)**2`` of its size).
    * ``weight_logit_share`` ``E[sum_c (p_c z_c)^2 ||x||^2] / E||g||^2``: what a relative error on
      each logit does to the gradient.

    Input gradient (rows ``gx_i = dz_i W``; ratios of sums over rows):

    * ``input_dz_share`` ``sum_i sum_c e_ic^2 ||W_c||^2 / sum_i ||gx_i||^2``;
    * ``input_logit_share`` ``sum_i sum_c (p_ic z_ic)^2 ||W_c||^2 / sum_i ||gx_i||^2``;
    * ``input_cancellation`` ``sum_i sum_c dz_ic^2 ||W_c||^2 / sum_i ||gx_i||^2``: the size of a
      GEMM's terms against its result.
    """

    weight_signal_fraction: float
    weight_dz_share: float
    weight_logit_share: float
    input_dz_share: float
    input_logit_share: float
    input_cancellation: float

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
                raise ValueError(f"InputStats.{field.name} must be a finite number >= 0, got {value!r}")
        if self.weight_signal_fraction > 1:
            raise ValueError(f"InputStats.weight_signal_fraction is a fraction in [0, 1], got "
                             f"{self.weight_signal_fraction!r}")


@dataclasses.dataclass(frozen=True)
class Constants:
    """The fitted constants: one per term of :data:`TERMS`, the GEMM length exponent, and the accuracy."""

    terms: dict[str, float]
    gemm_length_exponent: float
    worst_stats: InputStats
    accuracy: str
    provenance: dict[str, str]
    details: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)
    detail_accuracy: dict[str, str] = dataclasses.field(default_factory=dict)


@functools.cache
def load_constants() -> Constants:
    """The constants in ``lce/decide/error_model.json`` (read once)."""
    text = resources.files(__package__).joinpath(_CONSTANTS_FILE).read_text(encoding="utf-8")
    return constants_from_json(json.loads(text))


def constants_from_json(data: dict) -> Constants:
    """:class:`Constants` from the JSON object ``analysis.studies.error_model`` writes."""
    missing = set(TERMS) - set(data["terms"])
    if missing:
        raise ValueError(f"error model constants lack the terms {sorted(missing)}")
    details = data.get("details", {})
    for detail, entry in details.items():
        if detail not in DETAIL_TERMS or set(entry.get("terms", {})) != set(DETAIL_TERMS[detail]):
            raise ValueError(f"error model detail {detail!r} must have the terms {DETAIL_TERMS.get(detail)}, got "
                             f"{sorted(entry.get('terms', {}))}")
    return Constants(terms={name: float(data["terms"][name]) for name in TERMS},
                     gemm_length_exponent=float(data["gemm_length_exponent"]),
                     worst_stats=InputStats(**data["worst_stats"]), accuracy=str(data["accuracy"]),
                     provenance=dict(data.get("provenance", {})),
                     details={detail: {name: float(value) for name, value in entry["terms"].items()}
                              for detail, entry in details.items()},
                     detail_accuracy={detail: str(entry["accuracy"]) for detail, entry in details.items()})


ACCURACY: str = load_constants().accuracy
"""How close the model came on held-out data (as the last fit measured it; ``lce/decide/error_model.json``)."""

DETAIL_ACCURACY: dict[str, str] = load_constants().detail_accuracy
"""How close :func:`predict_weight_details` came on held-out data, per detail (``lce/decide/error_model.json``)."""

WORST_COMMITTED_STATS: InputStats = load_constants().worst_stats
"""The conservative default of :func:`predict_errors`: the committed input family (and shape) whose statistics
predict the largest errors -- Zipfian ``calibrated`` heads (see ``analysis.studies.error_model``)."""


def _unit_roundoff(dtype: torch.dtype) -> float:
    if not dtype.is_floating_point:
        raise ValueError(f"the error model needs a floating-point input dtype, got {dtype}")
    return torch.finfo(dtype).eps / 2


def _sum_energy(rows: float, rho: float) -> float:
    """``E||sum of `rows` row contributions||^2`` in units of ``E||g||^2``."""
    return rows * rows * rho + rows * (1.0 - rho)


def _chunk_sums(plan: Plan, rho: float) -> tuple[float, float]:
    """``(sum_j ||P_j||^2, sum_{j<k} ||S_j||^2)`` over ``||G||^2``: chunk products and the partial sums
    that get rounded before the last chunk (the last one is the final rounding)."""
    total = _sum_energy(plan.num_rows, rho)
    size, rows, k = plan.batch_chunk_size, plan.num_rows, plan.num_chunks
    full, last = divmod(rows, size)
    products = full * _sum_energy(size, rho) + (_sum_energy(last, rho) if last else 0.0)
    m = k - 1  # the partial sums j * size for j = 1 .. k - 1, in closed form (plans reach 10^5 chunks)
    partials = rho * size * size * m * (m + 1) * (2 * m + 1) / 6 + (1.0 - rho) * size * m * (m + 1) / 2
    return products / total, partials / total


def source_terms(plan: Plan, stats: InputStats,
                 gemm_length_exponent: float | None = None) -> dict[str, dict[str, float]]:
    """Each output's ``f_s`` per term of :data:`TERMS` (squared floors per unit constant; 0 where the
    plan does not round there). ``predict_errors`` combines them with the fitted constants; the GEMM
    length exponent is the fitted one unless given (the fit tries several)."""
    t = plan.input_dtype
    narrow = t.itemsize < 4 or _unit_roundoff(t) > _FP32_UNIT_ROUNDOFF  # the input dtype is below fp32
    fp32_ratio = (_FP32_UNIT_ROUNDOFF / _unit_roundoff(t)) ** 2
    gamma = load_constants().gemm_length_exponent if gemm_length_exponent is None else gemm_length_exponent
    rho = stats.weight_signal_fraction
    per_row_to_total = plan.num_rows / _sum_energy(plan.num_rows, rho)  # N E||g||^2 / ||G||^2

    def rounds_to_input(gemm: str, part: str) -> bool:
        return narrow and getattr(plan.gemm_dtypes(gemm), part) == t

    logits_rounded = rounds_to_input("logits", "result")
    products, partials = _chunk_sums(plan, rho)
    sum_in_input = narrow and plan.weight_grad_sum_dtype == t and plan.num_chunks > 1
    signal_share = min(1.0, rho * plan.num_rows * plan.num_rows / _sum_energy(plan.num_rows, rho))
    weight = {
        "dz": stats.weight_dz_share * per_row_to_total if rounds_to_input("grad_weight", "operands") else 0.0,
        "logits": stats.weight_logit_share * per_row_to_total if logits_rounded else 0.0,
        "chunk_product": products if rounds_to_input("grad_weight", "result") and plan.num_chunks > 1 else 0.0,
        "chunk_walk": partials * stats.weight_dz_share if sum_in_input else 0.0,
        "chunk_stagnation": signal_share * (plan.num_chunks - 1) ** 2 if sum_in_input else 0.0,
        "gemm": fp32_ratio * plan.num_rows ** gamma * per_row_to_total,
        "logits_gemm": fp32_ratio * plan.in_features ** gamma * stats.weight_logit_share * per_row_to_total,
    }
    grad_input = {
        "dz": stats.input_dz_share if rounds_to_input("grad_input", "operands") else 0.0,
        "logits": stats.input_logit_share if logits_rounded else 0.0,
        # class tiling with a narrow grad_input GEMM rounds each class block's product; the target's block
        # carries nearly all of a row's dz, so the blocks' energies sum to about the row's own
        "chunk_product": 1.0 if plan.tiles_classes and rounds_to_input("grad_input", "result") else 0.0,
        "chunk_walk": 0.0,
        "chunk_stagnation": 0.0,
        "gemm": fp32_ratio * plan.num_classes ** gamma * stats.input_cancellation,
        "logits_gemm": fp32_ratio * plan.in_features ** gamma * stats.input_logit_share,
    }
    return {"grad_input": grad_input, "grad_weight": weight}


def predict_errors(plan: Plan, stats: InputStats | None = None) -> dict[str, float]:
    """Predicted ``fro_in_floors`` of ``"grad_input"`` and ``"grad_weight"`` for ``plan``'s numerics.

    ``stats`` describes the inputs (:func:`measure_input_stats`); ``None`` uses
    :data:`WORST_COMMITTED_STATS`, the committed input family with the largest predicted errors.
    """
    if not isinstance(plan, Plan):
        raise TypeError(f"plan must be an lce.Plan (lce.planning.resolve.make_plan), got {type(plan).__name__}")
    if stats is not None and not isinstance(stats, InputStats):
        raise TypeError(f"stats must be an InputStats or None, got {type(stats).__name__}")
    constants = load_constants()
    terms = source_terms(plan, constants.worst_stats if stats is None else stats)
    return {output: math.sqrt(1.0 + sum(constants.terms[name] * value for name, value in terms[output].items()))
            for output in OUTPUTS}


def predict_weight_details(plan: Plan, stats: InputStats | None = None) -> dict[str, float]:
    """Predicted :data:`DETAILS` of the weight gradient for ``plan``'s numerics: ``"weight_bias"`` (the error along
    the exact gradient, in Frobenius floors) and ``"worst_row"`` (the worst class row's error, in its own floors).
    ``stats`` as for :func:`predict_errors`. Both are ``nan`` where the plan computes no weight gradient."""
    if not isinstance(plan, Plan):
        raise TypeError(f"plan must be an lce.Plan (lce.planning.resolve.make_plan), got {type(plan).__name__}")
    if stats is not None and not isinstance(stats, InputStats):
        raise TypeError(f"stats must be an InputStats or None, got {type(stats).__name__}")
    constants = load_constants()
    if not plan.needs_grad.weight:
        return dict.fromkeys(DETAILS, math.nan)
    terms = source_terms(plan, constants.worst_stats if stats is None else stats)["grad_weight"]
    excess = sum(constants.terms[name] * value for name, value in terms.items())  # floors**2 - 1
    bias, worst = constants.details["weight_bias"], constants.details["worst_row"]
    return {"weight_bias": bias["rounding"] + bias["excess"] * math.sqrt(excess),
            "worst_row": math.sqrt(1.0 + sum(worst[name] * value for name, value in terms.items()))}


def measure_input_stats(input: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, *,
                        bias: torch.Tensor | None = None, sample_rows: int = 256, block_rows: int = 64,
                        seed: int = 0) -> InputStats:
    """Estimate :class:`InputStats` from ``sample_rows`` rows drawn at random (fp64, on ``input``'s device).

    ``input`` (N, D), ``weight`` (C, D), ``target`` (N,) class indices (no ignore_index rows), ``bias``
    (C,) or None. Costs about ``sample_rows * C * (D + sample_rows)`` multiply-adds: the signal fraction
    uses the rows' Gram matrices (``||sum_i dz_i x_i^T||^2 = sum_ij (dz_i . dz_j)(x_i . x_j)``), never a
    (C, D) gradient. Its estimate ``(||sum g||^2 - sum ||g||^2) / (n (n - 1))`` of ``||E g||^2`` is unbiased.
    """
    if input.dim() != 2 or weight.dim() != 2 or input.shape[1] != weight.shape[1]:
        raise ValueError(f"input must be (N, D) and weight (C, D); got {tuple(input.shape)} and {tuple(weight.shape)}")
    if target.shape != (input.shape[0],):
        raise ValueError(f"target must have shape ({input.shape[0]},), got {tuple(target.shape)}")
    if sample_rows < 2:
        raise ValueError(f"sample_rows must be at least 2, got {sample_rows}")
    num_rows = input.shape[0]
    generator = torch.Generator().manual_seed(seed)
    rows = torch.randperm(num_rows, generator=generator)[:sample_rows].to(input.device)
    w = weight.detach().double()
    w_norms = w.square().sum(1)
    x = input.detach()[rows].double()
    y = target[rows]
    dz_blocks, sums = [], dict.fromkeys(("g", "dz_w", "logit_w", "dz_x", "logit_x", "terms_x", "gx"), 0.0)
    for start in range(0, len(rows), block_rows):
        xb, yb = x[start:start + block_rows], y[start:start + block_rows]
        z = xb @ w.T
        if bias is not None:
            z = z + bias.detach().double()
        p = torch.softmax(z, dim=1)
        dz = p.clone()
        dz[torch.arange(len(yb)), yb] -= 1.0
        inexact = dz.square()
        p_target = p[torch.arange(len(yb)), yb]
        inexact[torch.arange(len(yb)), yb] *= (p_target / 2.0 ** -8).clamp(max=1.0).square()
        logit_error = (p * z).square()
        x_norms = xb.square().sum(1)
        sums["g"] += (dz.square().sum(1) * x_norms).sum().item()
        sums["dz_w"] += (inexact.sum(1) * x_norms).sum().item()
        sums["logit_w"] += (logit_error.sum(1) * x_norms).sum().item()
        sums["dz_x"] += (inexact @ w_norms).sum().item()
        sums["logit_x"] += (logit_error @ w_norms).sum().item()
        sums["terms_x"] += (dz.square() @ w_norms).sum().item()
        sums["gx"] += (dz @ w).square().sum().item()
        dz_blocks.append(dz)
    dz_all = torch.cat(dz_blocks)
    n = len(rows)
    gram = ((dz_all @ dz_all.T) * (x @ x.T)).sum().item()  # ||sum_i g_i||^2
    mean_square = (gram - sums["g"]) / (n * (n - 1))
    rho = min(1.0, max(0.0, mean_square / (sums["g"] / n)))
    return InputStats(weight_signal_fraction=rho, weight_dz_share=sums["dz_w"] / sums["g"],
                      weight_logit_share=sums["logit_w"] / sums["g"], input_dz_share=sums["dz_x"] / sums["gx"],
                      input_logit_share=sums["logit_x"] / sums["gx"], input_cancellation=sums["terms_x"] / sums["gx"])
