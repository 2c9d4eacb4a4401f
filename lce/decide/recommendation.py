"""``lce.recommend``: options for a shape, a dtype, a device and a memory budget, by lce's decision procedure.

Nothing is run by default. Every candidate -- a policy, a number of rows per chunk and, where memory needs it, a
number of classes per block (:func:`candidates`) -- is planned and judged by :mod:`lce.decide`, the procedure
"auto" and every decision table come from: predicted memory (:mod:`lce.planning.memory_model`), predicted errors
(:mod:`lce.decide.error_model`), predicted time (:mod:`lce.decide.time_model`: this CPU's GEMM rates, or a GPU's
datasheet
rates), the rule's conditions (error limit, training evidence) and one objective (:data:`lce.decide.OBJECTIVE`).
``measure=True`` times the finalists on the device instead of trusting the time model.

With ``memory_budget=None`` no budget applies: the objective itself trades memory against time. A recommendation
can use less memory than "auto" at the same shape, because it tunes rows and class blocks to that shape while auto
is one rule for every shape (derived by the same procedure at :data:`lce.decide.REFERENCE_HEADS`);
:meth:`Recommendation.explain` names auto's plan beside the pick.
"""

from __future__ import annotations

import dataclasses
import math
import time
import warnings
from collections.abc import Mapping

import torch

from ..functional import linear_cross_entropy
from ..planning.options import EXPLICIT_POLICIES, LinearCrossEntropyOptions, dtype_name
from ..planning.plan import Plan
from .error_model import ACCURACY
from .procedure import (
    BIAS_LIMIT,
    DEFAULT_MAX_ERROR,
    MEMORY_TIE,
    OBJECTIVE,
    TIME_FACTOR,
    Candidate,
    choose,
    evaluate,
    faults,
    objective,
)
from .time_model import CONSTANTS, TIME_SOURCE, TimeConstants, estimated_seconds, gemm_compute_dtype, gemm_flops

__all__ = ["Recommendation", "RecommendationWarning", "Candidate", "recommend", "candidates", "estimated_seconds",
           "gemm_compute_dtype", "gemm_flops", "DEFAULT_MAX_ERROR", "TimeConstants", "CONSTANTS"]


class RecommendationWarning(UserWarning):
    """Issued by :func:`recommend` when nothing within the memory budget meets the default error limit and the
    least predicted error that fits is returned instead (``Recommendation.limit_met`` is False)."""


@dataclasses.dataclass(frozen=True, repr=False)
class Recommendation:
    """What :func:`recommend` chose, the limits it chose under, and what it weighed.

    ``options`` go straight to :func:`lce.linear_cross_entropy`; ``peak_bytes`` is the predicted
    peak extra memory of one forward + backward; ``error`` the predicted worst gradient error in
    floors and ``errors`` the per-gradient predictions; ``measured_seconds`` is set when
    ``recommend(measure=True)`` timed the finalists. ``limit_met`` is False when no candidate within the
    budget met the default error limit and the least error that fits was chosen instead. ``memory_budget`` is
    None when none was given; ``auto`` is what lce's "auto" options plan for the same call.
    """

    chosen: Candidate
    memory_budget: int | None
    budget_source: str
    max_error: float
    considered: tuple[Candidate, ...]
    measured_seconds: Mapping[str, float] | None = None
    limit_met: bool = True
    auto: Candidate | None = None
    bias_met: bool = True
    """False when every candidate within the budget and the error limit failed the bias condition
    (:func:`lce.decide.bias_fault`) and the least bias among them was chosen."""

    @property
    def options(self) -> LinearCrossEntropyOptions:
        return self.chosen.options

    @property
    def plan(self) -> Plan:
        return self.chosen.plan

    @property
    def peak_bytes(self) -> int:
        return self.chosen.peak_bytes

    @property
    def error(self) -> float:
        return self.chosen.error

    @property
    def errors(self) -> Mapping[str, float]:
        return self.chosen.errors

    def __repr__(self) -> str:
        """One line: the pick, its predicted peak and error, and whether the error limit was met
        (:meth:`explain` has the rest; ``considered`` holds every candidate)."""
        limit = "" if self.limit_met else f", error limit {self.max_error:g} NOT met"
        limit += "" if self.bias_met else ", bias condition NOT met"
        return (f"Recommendation({self.chosen.label()}: peak {_mib(self.peak_bytes)}, error {self.error:.3g} floors"
                f"{limit}; {len(self.considered)} candidates considered)")

    def explain(self) -> str:
        """What was chosen and why; for each policy, its best alternative and why it lost."""
        p, chosen = self.plan, self.chosen
        lines = [
            f"lce.recommend for N={p.num_rows} D={p.in_features} C={p.num_classes} {dtype_name(p.input_dtype)} "
            f"on {p.device_kind}:",
            f"  chosen     {chosen.label()}: peak {_mib(chosen.peak_bytes)} ({self._budget_text()}), error "
            f"{_errors_text(chosen)} ({_limit_text(self.max_error)}), ~{chosen.seconds * 1e3:.3g} ms "
            f"{TIME_SOURCE[p.device_kind].split(' from ')[0]}",
            f"  objective  {OBJECTIVE}",
        ]
        if chosen.details and math.isfinite(chosen.details["worst_row"]):
            details = chosen.details
            lines.append(f"  details    weight gradient: bias at most {details['weight_bias']:.2g} floors, worst "
                         f"class row ~{details['worst_row']:.3g} of its floors (predicted, no condition of "
                         "their own: lce.decide)")
        if chosen.bias is not None:
            lines.append(f"  at N       {_bias_text(chosen.bias)}")
        if self.auto is not None:
            lines.append(f"  auto       {self.auto.label()}: peak {_mib(self.auto.peak_bytes)}, error "
                         f"{_errors_text(self.auto)}, ~{self.auto.seconds * 1e3:.3g} ms (one rule for every shape: "
                         "lce.decide.derive_auto)")
        if not self.limit_met:
            lines.append(f"  warning    nothing within the budget meets the default limit of {self.max_error:g} "
                         "floors; this is the least predicted error that fits (a larger budget buys accuracy)")
        if not self.bias_met:
            lines.append(f"  warning    the pick fails the bias condition at N={p.num_rows} (nothing within the budget "
                         "and the error limit meets it); a larger budget buys fewer chunks")
        if self.measured_seconds:
            timed = ", ".join(f"{label} {seconds * 1e3:.3g} ms" for label, seconds in self.measured_seconds.items())
            lines.append(f"  measured   {timed}")
        feasible = [c for c in self.considered if self._fault(c) is None]
        fastest = min((c.seconds for c in feasible), default=chosen.seconds)
        for policy in EXPLICIT_POLICIES:
            rivals = [c for c in self.considered if c.plan.acc_policy == policy and c is not chosen]
            if rivals:
                fine = [c for c in rivals if self._fault(c) is None]
                best = objective(fine) if fine else min(rivals, key=lambda c: (len(faults(c, self.max_error,
                                                                                            self.memory_budget)),
                                                                               c.error, c.seconds))
                lines.append(f"  vs {policy:<8} {best.label()}: {self._why_not(best, fastest)} "
                             f"(peak {_mib(best.peak_bytes)}, error {best.error:.3g}, ~{best.seconds * 1e3:.3g} ms)")
        time_model = f"time: lce.decide.time_model, {TIME_SOURCE[p.device_kind]}"
        if p.cpu_gemms is not None:
            time_model += f" ({p.cpu_gemms.dtype_name} GEMMs {p.cpu_gemms.support} on this CPU)"
        lines.append(f"  models     memory: lce.planning.memory_model; error: lce.decide.error_model ({ACCURACY}); "
                     f"{time_model}")
        lines.extend(f"  note: {note}" for note in p.notes)
        return "\n".join(lines)

    def _fault(self, candidate: Candidate) -> str | None:
        reasons = faults(candidate, self.max_error, self.memory_budget)
        return "; ".join(reasons) if reasons else None

    def _why_not(self, candidate: Candidate, fastest: float) -> str:
        """Why the objective passed ``candidate`` over the pick: a failed condition, too slow, or more memory."""
        fault = self._fault(candidate)
        if fault is not None:
            return fault
        if candidate.seconds > TIME_FACTOR * fastest:
            return f"predicted {candidate.seconds / fastest:.2f}x the fastest (over {TIME_FACTOR:g}x)"
        if candidate.peak_bytes > self.chosen.peak_bytes * (1 + MEMORY_TIE):
            return "more memory"
        return "as much memory, slower" if candidate.seconds > self.chosen.seconds else "a tie, listed later"

    def _budget_text(self) -> str:
        if self.memory_budget is None:
            return "no budget"
        return f"budget {_mib(self.memory_budget)}, {self.budget_source}"

    def __str__(self) -> str:
        return self.explain()


def _mib(nbytes: float) -> str:
    return f"{nbytes / 2**20:,.1f} MiB"


def _limit_text(limit: float) -> str:
    return f"limit {limit:g} floors" if math.isfinite(limit) else "no limit: fp32 sums throughout"


def _errors_text(candidate: Candidate) -> str:
    return ", ".join(f"{name} {value:.3g}" for name, value in candidate.errors.items()) + " floors"


def _powers_of_two_up_to(limit: int, start: int = 1) -> list[int]:
    return [1 << k for k in range(start.bit_length() - 1, limit.bit_length()) if start <= 1 << k <= limit]


def candidates(num_rows: int, in_features: int, num_classes: int, dtype: torch.dtype,
               device: torch.device) -> list[Candidate]:
    """Every option set ``recommend`` weighs: each explicit policy (with fp32 acc_dtype for fp16/bf16
    input), rows per chunk a power of two up to N (and N), classes per block none or a power of two
    from 64 up to C.

    On CPU, compact takes acc_dtype equal to the input dtype: with a wider one the options contract
    makes it run balanced's layout there, and the accumulator-free layout is what tight budgets need.
    """
    low_precision = dtype in (torch.float16, torch.bfloat16)
    row_sizes = sorted({*_powers_of_two_up_to(num_rows), num_rows})
    class_sizes = [None, *(size for size in _powers_of_two_up_to(num_classes, 64) if size < num_classes)]
    out = []
    for policy in EXPLICIT_POLICIES:
        acc_dtype = None
        if low_precision:
            acc_dtype = dtype if policy == "compact" and device.type != "cuda" else torch.float32
        for rows in row_sizes:
            for classes in class_sizes:
                options = LinearCrossEntropyOptions(acc_policy=policy, acc_dtype=acc_dtype, chunking_method=None,
                                                    batch_chunk_size=rows, class_chunk_size=classes)
                out.append(evaluate(options, num_rows, in_features, num_classes, dtype, device))
    return out


def _check_arguments(num_rows, in_features, num_classes, dtype, device, memory_budget, max_error) -> torch.device:
    for name, value in (("num_rows", num_rows), ("in_features", in_features), ("num_classes", num_classes)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point or dtype.itemsize < 2:
        raise TypeError(f"dtype must be a floating-point torch.dtype (float16, bfloat16, float32, float64), "
                        f"got {dtype!r}")
    try:
        device = torch.device(device)
    except (TypeError, RuntimeError) as error:
        raise TypeError(f"device must be a torch.device or a device string, got {device!r}") from error
    if memory_budget is not None and (isinstance(memory_budget, bool) or not isinstance(memory_budget, (int, float))
                                      or not math.isfinite(memory_budget) or memory_budget <= 0):
        raise ValueError(f"memory_budget must be a positive number of bytes or None, got {memory_budget!r}")
    if max_error is not None and (isinstance(max_error, bool) or not isinstance(max_error, (int, float))
                                  or not max_error >= 1.0):
        raise ValueError(f"max_error must be a number of floors >= 1 (1 = the dtype's own rounding) or None, "
                         f"got {max_error!r}")
    return device


def recommend(num_rows: int, in_features: int, num_classes: int, dtype: torch.dtype,
              device: torch.device | str, *, memory_budget: int | None = None, max_error: float | None = None,
              measure: bool = False) -> Recommendation:
    """The options to pass to :func:`lce.linear_cross_entropy` for a ``(num_rows, in_features)`` input
    against ``num_classes`` classes in ``dtype`` on ``device`` (forward + backward of the input and
    weight gradients, reduction "mean").

    Args:
        memory_budget: bytes the op may allocate beyond its inputs (predicted peak). ``None``: no budget (the
            objective, :data:`lce.decide.OBJECTIVE`, trades memory against time).
        max_error: the largest predicted gradient error in floors of ``dtype``. ``None``:
            :data:`DEFAULT_MAX_ERROR` (no limit for fp32/fp64).
        measure: time the pick and the fastest-estimated candidates that meet every condition (three in all) on
            ``device`` (random inputs of this shape) and choose the fastest measured; by default nothing runs.

    Where no candidate within the budget meets the *default* error limit, the one with the least predicted
    error is returned, with ``limit_met`` False, a :class:`RecommendationWarning` and a warning line in
    :meth:`Recommendation.explain`.

    Raises:
        ValueError: a budget no candidate meets (naming the smallest feasible one), an explicit ``max_error``
            no candidate within the budget meets (naming the least error there), a budget within which every
            candidate fails the training condition, or bad arguments.
        TypeError: ``dtype`` or ``device`` of the wrong kind.
    """
    device = _check_arguments(num_rows, in_features, num_classes, dtype, device, memory_budget, max_error)
    considered = candidates(num_rows, in_features, num_classes, dtype, device)
    limit = max_error if max_error is not None else DEFAULT_MAX_ERROR.get(dtype, math.inf)
    choice = choose(considered, limit, memory_budget, limit_is_default=max_error is None)
    chosen = choice.chosen
    measured = None
    if measure and choice.feasible:
        finalists = sorted(choice.feasible, key=lambda c: (c.seconds, c.peak_bytes))[:3]
        if chosen not in finalists:
            finalists = [chosen, *finalists[:2]]
        measured = {c.label(): _time_on_device(c.options, num_rows, in_features, num_classes, dtype, device)
                    for c in finalists}
        chosen = min(finalists, key=lambda c: measured[c.label()])
    auto = evaluate(LinearCrossEntropyOptions(), num_rows, in_features, num_classes, dtype, device)
    if not choice.limit_met:
        warnings.warn(f"lce.recommend: nothing within the memory budget of {_mib(int(memory_budget))} meets the "
                      f"default error limit of {limit:g} floors for N={num_rows} D={in_features} C={num_classes} "
                      f"{dtype_name(dtype)}; returning the least predicted error that fits ({chosen.label()}, "
                      f"{chosen.error:.3g} floors): a larger budget buys accuracy", RecommendationWarning, stacklevel=2)
    if not choice.bias_met:
        which = (f"every candidate within the memory budget of {_mib(int(memory_budget))} and the error limit fails"
                 if choice.limit_met else "the least-error candidate that fits fails")
        returned = "the least bias among them" if choice.limit_met else "it"
        warnings.warn(f"lce.recommend: {which} the bias condition for N={num_rows} D={in_features} C={num_classes} "
                      f"{dtype_name(dtype)}; returning {returned} ({chosen.label()}: {_bias_text(chosen.bias)})",
                      RecommendationWarning, stacklevel=2)
    return Recommendation(chosen, None if memory_budget is None else int(memory_budget),
                          "none" if memory_budget is None else "given", limit, tuple(considered), measured,
                          choice.limit_met, auto, choice.bias_met)


def _bias_text(bias) -> str:
    """A weight gradient's bias/noise at its N, as :meth:`Recommendation.explain` prints it."""
    return f"{bias.phrase()} (limit {BIAS_LIMIT:g}; lce.decide.noise_scaling)"


def _time_on_device(options: LinearCrossEntropyOptions, num_rows: int, in_features: int, num_classes: int,
                    dtype: torch.dtype, device: torch.device, repeats: int = 3) -> float:
    """Median seconds of one forward + backward on random inputs of the shape (after one warm-up)."""
    g = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(num_rows, in_features, generator=g, device=device, dtype=dtype, requires_grad=True)
    w = (torch.randn(num_classes, in_features, generator=g, device=device) / in_features**0.5).to(dtype)
    w.requires_grad_(True)
    target = torch.randint(0, num_classes, (num_rows,), generator=g, device=device)
    times = []
    for _ in range(repeats + 1):
        _synchronize(device)
        start = time.perf_counter()
        linear_cross_entropy(x, w, target, options=options).backward()
        _synchronize(device)
        times.append(time.perf_counter() - start)
        x.grad = w.grad = None
    return sorted(times[1:])[len(times[1:]) // 2]


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
