"""The decision procedure: the one place lce's answers about options come from.

``"auto"`` (:data:`lce.planning.policies.AUTO_TABLE`), :func:`lce.recommend` and every decision table are its
output, so they cannot disagree. For a set of candidates (a policy, rows per chunk or a chunking rule, classes per
block) it predicts each one's peak memory (:mod:`lce.planning.memory_model`), each gradient's error in floors of
the input dtype (:mod:`lce.decide.error_model`) and its time (:mod:`lce.decide.time_model`), drops those that fail
a condition (:data:`CONDITIONS`: *error*, at most :data:`DEFAULT_MAX_ERROR` floors; *training*, a weight gradient
summed in the input dtype only at chunk counts :data:`TRAINED_CHUNK_COUNTS` passed; *bias*, such a sum's weight
gradient bias at most :data:`BIAS_LIMIT` of the sampling noise at the head's own N, measured or predicted by
:mod:`lce.decide.noise_scaling`) or the budget, and takes the
:data:`OBJECTIVE`: the least memory within :data:`TIME_FACTOR` of the fastest, ties to the faster, then the
smaller error, then the policy listed first.

"auto" is one rule per (device kind, dtype) for every shape: :func:`derive_auto` applies the procedure to chunking
rules (:data:`AUTO_CHUNKINGS`, with a floor on rows per chunk, :data:`CUDA_ROW_FLOORS` on CUDA) at the
:data:`REFERENCE_HEADS`, on CPU on every kind of :data:`REFERENCE_CPU_KINDS`, and the auto table must equal its
output. A default meets two conditions more: *drop-in*, each gradient predicted no less accurate than under torch
2.13's own default (:data:`TORCH_DEFAULTS`) at every reference head, and *accurate default*, every gradient within
:data:`DEFAULT_MAX_ERROR_FOR_AUTO` floors; where the procedure is indifferent, auto keeps torch's pick.
:func:`lce.recommend` applies the same procedure to one shape's candidates (it can tune rows and class blocks to
that shape). Beside each pick it reports the weight gradient's predicted bias bound and worst class row
(:attr:`Candidate.details`), which are no conditions of their own. docs/policies.md says where each condition's
limit comes from and what it leaves out.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple

import torch

from ..planning.cpu_gemms import assumed_support
from ..planning.device import planned_as
from ..planning.options import EXPLICIT_POLICIES, LinearCrossEntropyOptions, dtype_name
from ..planning.plan import Plan, aspect_ratio_chunk_size
from ..planning.policies import CPU_MIN_ROWS, auto_pick
from ..planning.resolve import make_plan
from .error_model import predict_errors, predict_weight_details
from .noise_scaling import RatioAtBatch, at_rounding_floor, bias_at
from .time_model import estimated_seconds

__all__ = ["Candidate", "Head", "REFERENCE_HEADS", "DEFAULT_MAX_ERROR", "BIAS_LIMIT", "NOISE_ERROR_LIMIT",
           "TRAINED_CHUNK_COUNTS", "TIME_FACTOR", "MEMORY_TIE", "OBJECTIVE", "CONDITIONS", "AUTO_CHUNKINGS",
           "CUDA_ROW_FLOORS", "auto_floors",
           "REFERENCE_CPU_KINDS", "TORCH_DEFAULTS", "TORCH_FALLBACK", "DROP_IN_TOLERANCE", "Choice", "AutoDerivation",
           "evaluate", "error_fault", "training_fault", "bias_fault", "drop_in_fault", "default_accuracy_fault",
           "faults",
           "objective", "choose", "DEFAULT_MAX_ERROR_FOR_AUTO", "rule_candidate", "default_candidate",
           "derive_auto"]

DEFAULT_MAX_ERROR: dict[torch.dtype, float] = {torch.bfloat16: 2.0, torch.float16: 10.0}
"""The error condition: the largest predicted gradient error, in floors of each dtype (none for fp32/fp64, whose
sums are fp32 in every policy): the error/noise rule (:data:`BIAS_LIMIT`, :data:`NOISE_ERROR_LIMIT`) translated into
floors where the noise study measured it."""

BIAS_LIMIT = 0.01
"""The error/noise rule's bias limit: the weight gradient's error along the exact gradient, over one batch's
sampling noise along it (the training study brackets it)."""

NOISE_ERROR_LIMIT = 0.1
"""The error/noise rule's error limit: a gradient's error norm over one batch's sampling noise."""

TRAINED_CHUNK_COUNTS: dict[torch.dtype, tuple[tuple[int, bool], ...]] = {
    torch.bfloat16: ((4, True), (8, True), (16, True), (32, True), (64, True), (256, False)),
    torch.float16: ((4, True), (8, True), (64, False)),
}
"""The training condition's evidence: per dtype, the chunk counts at which a weight gradient summed in that dtype
(compact on the CUDA layouts) was trained for 10^4 head-only AdamW steps at 3 seeds, and whether it passed (no
target-frequency bucket's held-out loss moved beyond the fp32 head's seed spread with an interval excluding zero)."""

TIME_FACTOR = 1.25
"""How much slower than the fastest candidate that meets every condition a pick may be predicted to run, to save
memory."""

MEMORY_TIE = 0.01
"""Predicted peaks within this fraction of the least count as the same memory (the faster candidate wins)."""

OBJECTIVE = (f"least predicted peak memory among the candidates that meet every condition (and the budget), within "
             f"{TIME_FACTOR:g}x of the fastest of them; ties within {MEMORY_TIE:.0%} go to the faster, then to the "
             "smaller error")
"""The objective, in words, as tables print it."""


class Head(NamedTuple):
    """A reference head: a name and its ``(N, D, C)``."""

    name: str
    N: int
    D: int
    C: int

    def __str__(self) -> str:
        return f"{self.N}x{self.D}x{self.C}"


REFERENCE_HEADS: tuple[Head, ...] = (
    Head("Llama 3 (16k tokens)", 16384, 4096, 128256),
    Head("Gemma 2 (Cut Cross-Entropy's)", 8192, 2304, 256000),
    Head("small", 4096, 512, 32768),
)
"""The heads at which "auto" is derived and the decision table is printed: two LLM vocabulary heads and a small one
that runs on a laptop CPU. Heads beyond them (a Qwen-size head at 64k tokens) may need less memory with another
chunking than auto's; :func:`lce.recommend` tunes such a shape."""

AUTO_CHUNKINGS: tuple[str, ...] = ("aspect_ratio", "aspect_ratio:2", "aspect_ratio:4", "aspect_ratio:8")
"""The chunking rules "auto" may resolve to (torch's options accept these for every shape)."""

CUDA_ROW_FLOORS: tuple[int, ...] = (1, 256, 512, 1024, 2048)
"""The floors on rows per chunk a CUDA "auto" rule may keep (with one of :data:`AUTO_CHUNKINGS`): every step of the
chunk loop costs the GPU a fixed time (launches, the Python around them: :mod:`lce.decide.time_model`), which the aspect
ratio's chunks of a few dozen rows at a small head pay hundreds of times. The largest floor offered, 2048 rows, keeps
a chunk's fp32 logits at most 2 GiB at a 256000-class head: above it chunking would stop saving memory. On a CPU
the floor is fixed per dtype (:data:`lce.planning.policies.CPU_MIN_ROWS`, from its chunk sweep)."""

TORCH_DEFAULTS: dict[tuple[str, torch.dtype], tuple[str, str]] = {
    ("cuda", torch.bfloat16): ("compact", "aspect_ratio:2"),
    ("cuda", torch.float16): ("compact", "aspect_ratio:2"),
    ("cpu", torch.bfloat16): ("accurate", "aspect_ratio"),
    ("cpu", torch.float16): ("accurate", "aspect_ratio"),
}
"""torch 2.13's documented "auto" table (its options module): ``(policy, chunking)`` per (device kind, dtype);
unlisted pairs take :data:`TORCH_FALLBACK`."""

TORCH_FALLBACK: tuple[str, str] = ("compact", "aspect_ratio:2")

DROP_IN_TOLERANCE = 0.02
"""How much larger than under torch's default a default's predicted error may be and still count as no less
accurate (the error model's own resolution is coarser)."""

DEFAULT_MAX_ERROR_FOR_AUTO: dict[torch.dtype, float] = {torch.bfloat16: 1.25, torch.float16: 1.25}
"""The *accurate default* condition: a default's predicted error, every gradient at every reference head, at most
this many floors. lce's default keeps the weight gradient's sum over chunks in fp32, rounded once (the error model
predicts balanced's and accurate's within 1.2 floors at every chunk count, while a sum in the input dtype -- compact
-- grows past 1.4 at a few chunks and 6 at torch's chunk counts): the accuracy the repository exists to deliver is
what a user gets without choosing it. :func:`lce.recommend` keeps the looser :data:`DEFAULT_MAX_ERROR` for choices a
user asks for."""

REFERENCE_CPU_KINDS: dict[str, tuple[str, float]] = {
    "AMX Xeon": ("native", 2.5),
    "AVX512-BF16 EPYC": ("native", 1.5),
    "AVX512F Xeon": ("slow", 0.2),
    "AVX2 EPYC": ("emulated", 1 / 80),
}
"""The CPU kinds a CPU "auto" entry must suit: each kind's bf16 GEMM support and rate over fp32's, as measured
(:data:`lce.planning.cpu_gemms.NATIVE_RATES`)."""


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One set of options with its plan and what the models predict for it."""

    options: LinearCrossEntropyOptions
    plan: Plan
    peak_bytes: int
    errors: Mapping[str, float]
    seconds: float
    details: Mapping[str, float] = dataclasses.field(default_factory=dict)
    """The weight gradient's predicted ``"weight_bias"`` bound and ``"worst_row"`` error, in floors
    (:func:`lce.decide.error_model.predict_weight_details`); reported beside each pick, no condition of their own."""
    bias: RatioAtBatch | None = None
    """The weight gradient's bias over one batch's sampling noise along the gradient, at the head's own N
    (:func:`lce.decide.noise_scaling.bias_at`: measured, or predicted by the fitted scaling beyond the data); None
    for fp32/fp64 input. The *bias* condition reads it."""

    @property
    def error(self) -> float:
        return max(self.errors.values())

    def label(self) -> str:
        p = self.plan
        classes = f"{p.class_chunk_size} classes per block" if p.tiles_classes else "all classes"
        return f"{p.acc_policy}, {p.batch_chunk_size} rows x {classes}"


def evaluate(options: LinearCrossEntropyOptions, num_rows: int, in_features: int, num_classes: int,
             dtype: torch.dtype, device: torch.device, cpu_rate: float | None = None) -> Candidate:
    """Plan ``options`` for the shape and predict its memory, errors and time (``cpu_rate``: a CPU's low-precision
    GEMM rate over fp32's instead of this CPU's)."""
    plan = make_plan(options, num_rows=num_rows, in_features=in_features, num_classes=num_classes, dtype=dtype,
                     device=device)
    return Candidate(options, plan, plan.peak_extra_bytes, predict_errors(plan), estimated_seconds(plan, cpu_rate),
                     predict_weight_details(plan), bias_at(plan))


def error_fault(candidate: Candidate, limit: float) -> str | None:
    """Why ``candidate`` fails the error condition at ``limit`` floors (None: it meets it)."""
    if candidate.error <= limit:
        return None
    return f"predicted {candidate.error:.3g} floors, over the limit of {limit:g}"


def _sums_in_input_dtype(plan: Plan) -> bool:
    narrow = plan.input_dtype in TRAINED_CHUNK_COUNTS
    return narrow and plan.weight_grad_sum_dtype == plan.input_dtype and plan.num_chunks > 1


def training_fault(plan: Plan) -> str | None:
    """Why ``plan`` fails the training condition (None: it meets it; see the module docstring)."""
    if not plan.needs_grad.weight or not _sums_in_input_dtype(plan):
        return None
    trained = TRAINED_CHUNK_COUNTS[plan.input_dtype]
    k = plan.num_chunks
    failed = [count for count, passed in trained if not passed and count <= k]
    if failed:
        return (f"its {dtype_name(plan.input_dtype)} weight-gradient sum rounded at {k} chunks: training moved the "
                f"loss beyond the seed spread at {min(failed)} chunks (lce's head-only training study)")
    if not any(passed and count >= k for count, passed in trained):
        largest = max(count for count, passed in trained if passed)
        return (f"its {dtype_name(plan.input_dtype)} weight-gradient sum rounded at {k} chunks: trained only up to "
                f"{largest} chunks (lce's head-only training study)")
    return None


def bias_fault(candidate: Candidate) -> str | None:
    """Why ``candidate`` fails the bias condition (None: it meets it): its weight gradient's bias over the sampling
    noise at the head's N above :data:`BIAS_LIMIT`, where the excess is its own -- a gradient summed in the input
    dtype over chunks. One rounded once into the input dtype (:func:`lce.decide.noise_scaling.at_rounding_floor`)
    sits at that dtype's rounding floor, which every op returning the dtype shares: its ratio is reported, no
    fault (at 2^20 rows it may itself reach the limit: then the output dtype, not a policy, is what matters)."""
    bias = candidate.bias
    if bias is None or bias.value <= BIAS_LIMIT or at_rounding_floor(candidate.plan):
        return None
    return f"{bias.phrase()}, over the limit of {BIAS_LIMIT:g}"


CONDITIONS: tuple[str, ...] = ("error", "training", "bias")
"""The rule's conditions, in the order :func:`faults` checks them (the module docstring states each)."""


def faults(candidate: Candidate, limit: float, budget: float | None = None) -> list[str]:
    """Every condition (and the budget) ``candidate`` fails, as short reasons; empty when it meets them all."""
    out = []
    if budget is not None and candidate.peak_bytes > budget:
        out.append(f"over the memory budget ({candidate.peak_bytes:,} > {int(budget):,} bytes)")
    for reason in (error_fault(candidate, limit), training_fault(candidate.plan), bias_fault(candidate)):
        if reason is not None:
            out.append(reason)
    return out


@dataclasses.dataclass(frozen=True)
class Choice:
    """What :func:`choose` picked: the candidate, whether it meets the error limit (``limit_met``) and the bias
    condition (``bias_met``), and the candidates that met every condition and the budget (``feasible``)."""

    chosen: Candidate
    limit_met: bool
    feasible: tuple[Candidate, ...]
    bias_met: bool = True


def _policy_rank(candidate: Candidate) -> int:
    return EXPLICIT_POLICIES.index(candidate.plan.acc_policy)


def objective(pool: Sequence[Candidate]) -> Candidate:
    """:data:`OBJECTIVE` over ``pool`` (candidates that already meet every condition and the budget)."""
    fastest = min(c.seconds for c in pool)
    quick = [c for c in pool if c.seconds <= TIME_FACTOR * fastest]
    least = min(c.peak_bytes for c in quick)
    tied = [c for c in quick if c.peak_bytes <= least * (1 + MEMORY_TIE)]
    return min(tied, key=lambda c: (c.seconds, c.error, _policy_rank(c)))


def choose(candidates: Iterable[Candidate], limit: float, budget: float | None = None, *,
           limit_is_default: bool = True) -> Choice:
    """The objective over the candidates that meet every condition and ``budget``.

    Where every candidate within the budget and the error limit fails the bias condition, it yields: the least
    bias among them (``bias_met`` False). Where none within the budget meets the error limit and
    ``limit_is_default``, the limit yields: the least predicted error among those that meet the training condition
    (``limit_met`` False). Raises ``ValueError``
    where no candidate that meets the training condition fits the budget (naming the smallest feasible budget)
    or where an explicit limit is unmet (naming the least error there).
    """
    pool = list(candidates)
    offerable = [c for c in pool if training_fault(c.plan) is None]
    if not offerable:
        raise ValueError(f"every candidate fails the training condition, for example {pool[0].label()}: "
                         f"{training_fault(pool[0].plan)}")
    trained = [c for c in offerable if budget is None or c.peak_bytes <= budget]
    if not trained:
        smallest = min(offerable, key=lambda c: c.peak_bytes)
        raise ValueError(f"memory_budget={int(budget):,} bytes is below the predicted peak of every candidate that "
                         f"meets the training condition; the smallest feasible budget is {smallest.peak_bytes:,} "
                         f"bytes ({smallest.label()})")
    within = [c for c in trained if error_fault(c, limit) is None]
    feasible = [c for c in within if bias_fault(c) is None]
    if feasible:
        return Choice(objective(feasible), True, tuple(feasible))
    if within:  # every one within the error limit fails the bias condition: it yields to the least bias
        return Choice(min(within, key=lambda c: (c.bias.value, c.seconds)), True, (), bias_met=False)
    best = min(trained, key=lambda c: (c.error, c.seconds))
    if not limit_is_default:
        raise ValueError(f"no candidate within the budget is predicted below max_error={limit:g} floors; the least "
                         f"error there is {best.error:.3g} floors ({best.label()})")
    return Choice(best, False, (), bias_met=bias_fault(best) is None)


# ---- "auto": the procedure over chunking rules at the reference heads ---------------------------------------

def default_accuracy_fault(candidate: Candidate) -> str | None:
    """Why ``candidate`` fails the accurate-default condition (None: it meets it, or its dtype has none)."""
    limit = DEFAULT_MAX_ERROR_FOR_AUTO.get(candidate.plan.input_dtype)
    if limit is None or candidate.error <= limit:
        return None
    return f"predicted {candidate.error:.3g} floors, over a default's limit of {limit:g}"


def drop_in_fault(candidate: Candidate, torch_default: Candidate) -> str | None:
    """Why ``candidate`` fails the drop-in condition against torch's default at the same head (None: it meets it)."""
    worse = [f"{name} {candidate.errors[name]:.3g} > {torch_default.errors[name]:.3g} floors"
             for name in candidate.errors
             if candidate.errors[name] > torch_default.errors[name] * (1 + DROP_IN_TOLERANCE)]
    return f"less accurate than torch 2.13's default ({', '.join(worse)})" if worse else None


def rule_candidate(policy: str, chunking: str, head: Head, dtype: torch.dtype, device_kind: str,
                   cpu_rate: float | None = None, min_rows: bool | int = True) -> Candidate:
    """The candidate that the "auto" rule ``(policy, chunking)`` resolves to at ``head``: fp32 ``acc_dtype`` for
    bf16/fp16 input, and at least ``min_rows`` rows per chunk (``True``: the floor the auto table keeps for
    ``device_kind`` and ``dtype``, :attr:`lce.planning.policies.AutoPick.min_rows`; ``False``: torch's chunking,
    without a
    floor). For what the default options run, use :func:`default_candidate`."""
    rows = aspect_ratio_chunk_size(head.N, head.D, head.C, int(chunking.partition(":")[2] or 1))
    floor = min_rows if not isinstance(min_rows, bool) else (auto_pick(device_kind, dtype).min_rows if min_rows
                                                              else 1)
    rows = max(rows, min(floor, head.N))
    acc_dtype = torch.float32 if dtype in (torch.bfloat16, torch.float16) else None
    options = LinearCrossEntropyOptions(acc_policy=policy, acc_dtype=acc_dtype, chunking_method=None,
                                        batch_chunk_size=rows, batch_invariant=False)  # rows that follow N
    return evaluate_options(device_kind, options, head, dtype, cpu_rate)


def default_candidate(head: Head, dtype: torch.dtype, device_kind: str, cpu_rate: float | None = None) -> Candidate:
    """lce's default options (``LinearCrossEntropyOptions()``: the "auto" policy, chunking and ``acc_dtype``) at
    ``head`` on ``device_kind``: the plan :func:`lce.plan` prints for that call (gradients of input and weight),
    with its predicted peak, errors and time. Every table that says what "auto" does reads this."""
    return evaluate_options(device_kind, LinearCrossEntropyOptions(), head, dtype, cpu_rate)


def evaluate_options(device_kind: str, options: LinearCrossEntropyOptions, head: Head, dtype: torch.dtype,
                     cpu_rate: float | None) -> Candidate:
    """:func:`evaluate` as planned on ``device_kind`` (CPU tensors, or meta tensors planned as CUDA ones)."""
    device = torch.device("cpu" if device_kind == "cpu" else "meta")
    with planned_as(device_kind):
        return evaluate(options, head.N, head.D, head.C, dtype, device, cpu_rate)


@dataclasses.dataclass(frozen=True)
class AutoDerivation:
    """:func:`derive_auto`'s answer: the pick ``(policy, chunking)`` and its floor on rows per chunk (``min_rows``),
    and per rule ``(policy, chunking, floor)`` and context (head, CPU kind) the candidate and its faults."""

    device_kind: str
    dtype: torch.dtype
    pick: tuple[str, str]
    min_rows: int
    contexts: tuple[str, ...]
    table: Mapping[tuple[str, str, int], Mapping[str, Candidate]]
    rule_faults: Mapping[tuple[str, str, int], tuple[str, ...]]

    @property
    def rule(self) -> tuple[str, str, int]:
        """The picked rule as the table keys it."""
        return (*self.pick, self.min_rows)


def auto_floors(device_kind: str, dtype: torch.dtype) -> tuple[int, ...]:
    """The floors on rows per chunk an "auto" rule of ``device_kind`` may keep (see :data:`CUDA_ROW_FLOORS`)."""
    return CUDA_ROW_FLOORS if device_kind == "cuda" else (CPU_MIN_ROWS.get(dtype, 1),)


def reference_contexts(device_kind: str, dtype: torch.dtype, heads: Sequence[Head]):
    """Where a pick is judged: each head, and on a CPU with bf16/fp16 input each reference CPU kind's GEMM support
    and rate (``(name, head, support or None, rate or None)``)."""
    if device_kind != "cpu" or dtype not in (torch.bfloat16, torch.float16):
        return [(str(head), head, None, None) for head in heads]
    return [(f"{head} on an {kind}", head, support, rate)
            for head in heads for kind, (support, rate) in REFERENCE_CPU_KINDS.items()]


def derive_auto(device_kind: str, dtype: torch.dtype, heads: Sequence[Head] = REFERENCE_HEADS) -> AutoDerivation:
    """The procedure applied to the "auto" rules (each policy x :data:`AUTO_CHUNKINGS`) at ``heads``: a rule must
    meet every condition, drop-in included, at every head (and CPU kind); among those, the objective, summed over
    the contexts (memory and time each relative to the best rule there); a tie keeps torch's policy."""
    import contextlib

    limit = DEFAULT_MAX_ERROR.get(dtype, math.inf)
    rules = [(policy, chunking, floor) for policy in EXPLICIT_POLICIES for chunking in AUTO_CHUNKINGS
             for floor in auto_floors(device_kind, dtype)]
    contexts = reference_contexts(device_kind, dtype, heads)
    torch_rule = TORCH_DEFAULTS.get((device_kind, dtype), TORCH_FALLBACK)
    table: dict[tuple[str, str, int], dict[str, Candidate]] = {rule: {} for rule in rules}
    torch_default: dict[str, Candidate] = {}
    for name, head, support, rate in contexts:
        with contextlib.nullcontext() if support is None else assumed_support(support):
            for policy, chunking, floor in rules:
                table[(policy, chunking, floor)][name] = rule_candidate(policy, chunking, head, dtype, device_kind,
                                                                        rate, min_rows=floor)
            torch_default[name] = rule_candidate(*torch_rule, head, dtype, device_kind, rate, min_rows=False)

    def reasons(candidate: Candidate, name: str) -> list[str]:
        extra = (drop_in_fault(candidate, torch_default[name]), default_accuracy_fault(candidate))
        return [*faults(candidate, limit), *(reason for reason in extra if reason)]

    rule_faults = {rule: tuple(sorted({f"{name}: {reason}" for name, c in table[rule].items()
                                       for reason in reasons(c, name)})) for rule in rules}
    passing = [rule for rule in rules if not rule_faults[rule]]
    if not passing:
        raise ValueError(f"no auto rule meets every condition for {device_kind} {dtype_name(dtype)}")
    names = [name for name, *_ in contexts]
    fastest = {name: min(table[rule][name].seconds for rule in passing) for name in names}
    quick = [rule for rule in passing if all(table[rule][name].seconds <= TIME_FACTOR * fastest[name]
                                             for name in names)]
    least = {name: min(table[rule][name].peak_bytes for rule in quick) for name in names}

    def memory(rule):
        return sum(table[rule][name].peak_bytes / least[name] for name in names) / len(names)

    lowest = min(memory(rule) for rule in quick)
    tied = [rule for rule in quick if memory(rule) <= lowest * (1 + MEMORY_TIE)]
    pick = min(tied, key=lambda rule: (round(sum(table[rule][name].seconds / fastest[name] for name in names), 6),
                                       round(max(table[rule][name].error for name in names), 6),
                                       rule[0] != torch_rule[0], rules.index(rule)))
    return AutoDerivation(device_kind, dtype, pick[:2], pick[2], tuple(names), table, rule_faults)
