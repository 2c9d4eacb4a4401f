"""The chunk passes of the per-token log-probabilities and entropy under a temperature (:mod:`lce.logprobs`).

For a row with logits ``z`` (soft-capped first, if asked), temperature ``T`` and target ``y``:

    u = z / T,   p = softmax(u),   lse = log sum_c exp(u_c)
    log p_y = u_y - lse,           H = -sum_c p_c log p_c

and with ``g`` and ``h`` the incoming gradients of ``log p_y`` and ``H``:

    dL/du_c = g (1[c = y] - p_c)  -  h p_c (log p_c + H),     dL/dz = dL/du / T

(times ``1 - tanh(z / cap)**2`` through a soft cap). Forward gathers four statistics per row, a block of classes
at a time with the row maximum ``m`` kept current (:class:`TokenStatistics`):

    other  = sum over c != y of exp(u_c - m)      (the target left out, as in :mod:`lce.passes.statistics`)
    spread = sum over c of exp(u_c - m) (m - u_c)  (every term >= 0; only with the entropy)

and the target's ``u_y``. With ``S = other + exp(u_y - m)`` every output is a sum of terms of one sign:

    log S     = log1p(other + expm1(u_y - m))     (S - 1 without cancellation: exactly ``other`` when y leads)
    -log p_y  = (m - u_y) + log S
    H         = log S + spread / S
    1 - p_y   = other / S

so a confident row (its top class holding all but e^-40 of the mass) keeps fp32's relative precision in its
log-probability, its ``1 - p_y`` and its entropy, where ``lse - u_y`` or ``lse - sum p u`` would cancel to 0.
Backward recomputes the logits chunk by chunk, as reduction "none" does, and forms ``dL/dz`` in place, a
workspace of columns at a time, from the saved ``lse``, ``H``, ``-log p_y``, ``1 - p_y`` and ``H - (-log p_y)``
(the target's entry uses those, not a difference of rounded probabilities). The products with the weight and
the input are :class:`lce.passes.gradients.GradientSums`'s, in the plan's precision; a group of processes holding
shards of the vocabulary completes the statistics and the input gradient through its
:class:`lce.passes.loop.GroupReduction` (``reduce_token_statistics``, ``complete_input_sum``).
"""

from __future__ import annotations

import dataclasses
import math

import torch

from ..planning.plan import Plan
from .chunk import Chunk, HeadTensors, Targets, block_logits, block_target_index, column_blocks
from .grad_logits import grad_logits_rescale_for
from .gradients import Gradients, GradientSums
from .loop import ChunkLoop, GroupReduction
from .statistics import cap_logits_, carry_factor

__all__ = ["TokenStatistics", "TokenRows", "token_statistics", "token_gradients", "tempered_block_logits_",
           "SUMMARIES", "token_summaries"]

# A temperature is a float, or an (N,) tensor of one per row in the plan's stats dtype.


def _per_row(value: float | torch.Tensor, rows: slice) -> float | torch.Tensor:
    """A float as it is, or the chunk's rows of an (N,) tensor as a column (rows, 1) to broadcast over classes."""
    return value if isinstance(value, float) else value[rows, None]


# ---- the statistics of a chunk's rows ---------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class TokenStatistics:
    """The row statistics of a chunk's tempered logits ``u`` over the classes seen so far (the module docstring):
    ``row_max`` (``m``), ``other``, ``target_logit`` (``u_y``; -inf while the target's block has not been seen)
    and ``spread`` (None when the entropy is not asked for)."""

    row_max: torch.Tensor
    other: torch.Tensor
    target_logit: torch.Tensor
    spread: torch.Tensor | None

    def rescaled_sums(self, new_max: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``other`` and ``spread`` taken to the larger maximum ``new_max``: every term ``exp(u - m)`` times
        ``exp(m - new_max)``, and each term's ``m - u`` grown by ``new_max - m``."""
        carried = carry_factor(self.row_max, new_max)
        other = self.other * carried
        if self.spread is None:
            return other, None
        total = self.other + (self.target_logit - self.row_max).exp()
        return other, carried * (self.spread + total * (new_max - self.row_max))

    @property
    def log_sum(self) -> torch.Tensor:
        """``log S``, with ``S = sum_c exp(u_c - m)``, as ``log1p(S - 1)``."""
        return torch.log1p(self.other + torch.expm1(self.target_logit - self.row_max))

    @property
    def lse(self) -> torch.Tensor:
        return self.row_max + self.log_sum

    @property
    def nll(self) -> torch.Tensor:
        """``-log p_y``."""
        return (self.row_max - self.target_logit) + self.log_sum

    @property
    def other_prob(self) -> torch.Tensor:
        """``1 - p_y``."""
        return self.other / (self.other + (self.target_logit - self.row_max).exp())

    @property
    def entropy(self) -> torch.Tensor:
        total = self.other + (self.target_logit - self.row_max).exp()
        return self.log_sum + self.spread / total

    @property
    def entropy_gap(self) -> torch.Tensor:
        """``H + log p_y`` (the target's factor in the entropy's gradient), as ``spread / S - (m - u_y)``: exactly
        the first term when the target leads."""
        total = self.other + (self.target_logit - self.row_max).exp()
        return self.spread / total - (self.row_max - self.target_logit)


@dataclasses.dataclass
class TokenRows:
    """Forward's per-row results (N,) in the stats dtype: ``nll`` (``-log p_y``), ``entropy`` (None unless asked),
    and what backward reuses: ``lse`` of the tempered logits, ``other_prob`` (``1 - p_y``) and ``entropy_gap``
    (``H + log p_y``; None without the entropy). Ignored rows hold the statistics of their row, which the
    caller zeroes in the outputs."""

    nll: torch.Tensor
    entropy: torch.Tensor | None
    lse: torch.Tensor
    other_prob: torch.Tensor
    entropy_gap: torch.Tensor | None

    @classmethod
    def empty(cls, n: int, dtype: torch.dtype, device: torch.device, with_entropy: bool) -> TokenRows:
        def make():
            return torch.empty(n, dtype=dtype, device=device)
        return cls(make(), make() if with_entropy else None, make(), make(), make() if with_entropy else None)

    def first(self, num_rows: int) -> TokenRows:
        """The first ``num_rows`` rows (a padded call's real ones), as views."""
        values = (getattr(self, field.name) for field in dataclasses.fields(self))
        return TokenRows(*(None if value is None else value[:num_rows] for value in values))

    def write(self, rows: slice, stats: TokenStatistics) -> None:
        self.nll[rows], self.lse[rows], self.other_prob[rows] = stats.nll, stats.lse, stats.other_prob
        if self.entropy is not None:
            self.entropy[rows], self.entropy_gap[rows] = stats.entropy, stats.entropy_gap


def token_statistics(plan: Plan, head: HeadTensors, targets: Targets, temperature: float | torch.Tensor,
                     group: GroupReduction | None = None) -> TokenRows:
    """Forward: every row's :class:`TokenRows`, the logits formed a chunk of rows and a block of classes at a
    time (one block of every class without class tiling), completed across ``group`` if there is one."""
    n, device = plan.loop_rows, head.input.device  # a batch-invariant plan's padded rows included
    out = TokenRows.empty(n, plan.stats_dtype, device, plan.returns_entropy)
    loop = ChunkLoop.of(plan, head, targets, group=group)
    for rows in plan.row_chunks():
        out.write(rows, _chunk_statistics(loop, rows, temperature))
    return out


def _chunk_statistics(loop: ChunkLoop, rows: slice, temperature: float | torch.Tensor) -> TokenStatistics:
    """One chunk of forward: its rows' statistics over every class (and every process of the group)."""
    chunk, plan, stats = loop.chunk(rows), loop.plan, None
    keeps_input = plan.tiles_classes  # every block's logits GEMM reads the upcast input; else it goes after one
    for cols in plan.class_chunks():
        u = tempered_block_logits_(block_logits(chunk, cols), chunk, _per_row(temperature, rows))
        if not keeps_input:
            chunk = chunk.without_input_in_acc()
        stats = _fold_block_(u, chunk, cols, stats)
        del u  # one block alive at a time
    return stats if loop.group is None else loop.group.reduce_token_statistics(stats)


def tempered_block_logits_(z: torch.Tensor, chunk: Chunk, temperature: float | torch.Tensor) -> torch.Tensor:
    """``u = cap * tanh(z / cap) / T`` (or ``z / T`` without a cap), in place."""
    if chunk.plan.softcap is not None:
        cap_logits_(z, chunk.plan.softcap).mul_(chunk.plan.softcap)
    return z if isinstance(temperature, float) and temperature == 1.0 else z.div_(temperature)


def _fold_block_(u: torch.Tensor, chunk: Chunk, cols: slice, previous: TokenStatistics | None) -> TokenStatistics:
    """Fold one block's tempered logits ``u`` (rows, classes ``cols``; consumed) into the running statistics:
    the maximum rises to the block's, the sums gathered so far are rescaled to it
    (:meth:`TokenStatistics.rescaled_sums`), and the block's terms are formed a workspace of columns at a time."""
    index, in_block = block_target_index(chunk, cols)
    block_target = u.gather(1, index).squeeze(1)
    row_max = u.amax(1) if previous is None else torch.maximum(previous.row_max, u.amax(1))
    with_entropy = chunk.plan.returns_entropy
    other = torch.zeros_like(row_max)
    spread = torch.zeros_like(row_max) if with_entropy else None
    for classes, columns in column_blocks(chunk.plan, cols):
        shifted = u[:, columns].sub_(row_max[:, None])  # u - m <= 0
        terms = shifted.exp()
        if with_entropy:
            spread.sub_(shifted.mul_(terms).sum(1))  # sum exp(u - m) (m - u): every term >= 0
        target_index, in_columns = block_target_index(chunk, classes)
        terms.scatter_(1, target_index, torch.where(in_columns, 0.0, terms.gather(1, target_index).squeeze(1))[:, None])
        other.add_(terms.sum(1))
        del terms
    target_logit = torch.where(in_block, block_target, -math.inf if previous is None else previous.target_logit)
    if previous is None:
        return TokenStatistics(row_max, other, target_logit, spread)
    carried_other, carried_spread = previous.rescaled_sums(row_max)
    return TokenStatistics(row_max, other.add_(carried_other), target_logit,
                           None if spread is None else spread.add_(carried_spread))


# ---- backward: dL/dz, a block of classes and a workspace of columns at a time ---------------------------------

@dataclasses.dataclass(frozen=True)
class _Coefficients:
    """What turns a block's log-probabilities into ``dL/dz / rescale``: ``logp`` and ``entropy`` are the incoming
    gradients ``g`` and ``h`` divided by ``T * rescale`` (0 for ignored rows; ``entropy`` None when no gradient
    reaches the entropy), ``rescale`` the power of two that keeps fp16's dz normal
    (:func:`lce.passes.grad_logits.grad_logits_rescale`)."""

    logp: torch.Tensor
    entropy: torch.Tensor | None
    rescale: float

    @classmethod
    def of(cls, plan: Plan, targets: Targets, temperature: float | torch.Tensor, grad_logp: torch.Tensor | None,
           grad_entropy: torch.Tensor | None) -> _Coefficients:
        dtype, valid = plan.stats_dtype, targets.valid
        g = torch.zeros(valid.shape, dtype=dtype, device=valid.device) if grad_logp is None else grad_logp.to(dtype)
        g = torch.where(valid, g / temperature, 0)
        h = None if grad_entropy is None else torch.where(valid, grad_entropy.to(dtype) / temperature, 0)
        rescale = 1.0
        if plan.rescales_grad_logits and g.numel():
            # |dL/du_c| <= |g| (p_c + 1[c = y]) + |h| p_c |log p_c + H| <= 2 |g| + |h| (1/e + log C)
            bound = 2.0 * g.abs()
            if h is not None:
                bound = bound + h.abs() * (1.0 / math.e + math.log(targets.num_classes))
            rescale = grad_logits_rescale_for(float(bound.max()))
        if rescale != 1.0:
            g = g / rescale
            h = None if h is None else h / rescale
        return cls(g, h, rescale)


def token_gradients(plan: Plan, head: HeadTensors, targets: Targets, temperature: float | torch.Tensor,
                    saved: TokenRows, grad_logp: torch.Tensor | None, grad_entropy: torch.Tensor | None,
                    group: GroupReduction | None = None) -> Gradients:
    """Backward: the gradients of ``sum(grad_logp * log p_y + grad_entropy * H)`` (either incoming gradient may be
    None: it did not reach that output), recomputing the logits chunk by chunk from ``saved``."""
    sums = GradientSums(plan, head, wide_input_partials=group is not None)
    coefficients = _Coefficients.of(plan, targets, temperature, grad_logp, grad_entropy)
    loop = ChunkLoop.of(plan, head, targets, sums=sums, group=group)
    for rows in plan.row_chunks():
        _chunk_gradients(loop, rows, _per_row(temperature, rows), saved, coefficients)
    return sums.finish()


def _chunk_gradients(loop: ChunkLoop, rows: slice, temperature: float | torch.Tensor, saved: TokenRows,
                     coefficients: _Coefficients) -> None:
    """One chunk of backward: each block's logits computed again, turned into dz and multiplied out. Where the
    chunk sweeps blocks (class tiling, or a group), its input-gradient rows are summed in the stats dtype and
    rounded once, after the group (if any) has added the other processes' products."""
    chunk, plan, sums = loop.chunk(rows), loop.plan, loop.sums
    sweeps_blocks = loop.sweeps_statistics_first
    input_sum = None
    if sums.input is not None and sweeps_blocks:
        input_sum = torch.zeros(chunk.num_rows, plan.in_features, dtype=plan.stats_dtype,
                                device=chunk.head.input.device)
    for cols in plan.class_chunks():
        dz = _grad_block_(block_logits(chunk, cols), chunk, cols, temperature, saved, coefficients)
        if sweeps_blocks:
            sums.add_chunk(chunk, dz, coefficients.rescale, cols, input_sum)
        else:
            sums.add_chunk(chunk, dz, coefficients.rescale)
        del dz  # one block alive at a time
    if input_sum is not None:
        if loop.group is not None:
            loop.group.complete_input_sum(input_sum)
        sums.round_input_rows(rows, input_sum)


def _grad_block_(z: torch.Tensor, chunk: Chunk, cols: slice, temperature: float | torch.Tensor, saved: TokenRows,
                 coefficients: _Coefficients) -> torch.Tensor:
    """Turn a block's raw logits ``z`` into ``dL/dz / rescale``, in place, a workspace of columns at a time."""
    plan, rows = chunk.plan, chunk.rows
    lse = saved.lse[rows, None]
    if plan.softcap is None:
        u = tempered_block_logits_(z, chunk, temperature)
        for classes, columns in column_blocks(plan, cols):
            _grad_tempered_(u[:, columns].sub_(lse), chunk, classes, saved, coefficients)
        return u
    t = cap_logits_(z, plan.softcap)  # the buffer keeps t = tanh(z / cap) until each workspace's dz replaces it
    for classes, columns in column_blocks(plan, cols):
        log_probs = (t[:, columns] * plan.softcap).div_(temperature).sub_(lse)
        grad = _grad_tempered_(log_probs, chunk, classes, saved, coefficients)
        t[:, columns].square_().sub_(1.0).mul_(grad).neg_()  # (1 - t^2) dL/du: the chain rule through the cap
        del log_probs, grad
    return t


def _grad_tempered_(log_probs: torch.Tensor, chunk: Chunk, classes: slice, saved: TokenRows,
                    coefficients: _Coefficients) -> torch.Tensor:
    """Turn ``log p`` of the classes ``classes`` into ``dL/du / (T * rescale)``, in place (the module docstring's
    formula, with the incoming gradients already divided by ``T * rescale``). The target's entry,
    ``g (1 - p_y) - h p_y (H + log p_y)``, is formed from the saved ``1 - p_y`` and ``H + log p_y``."""
    rows = chunk.rows
    g = coefficients.logp[rows]
    h = None if coefficients.entropy is None else coefficients.entropy[rows]
    if h is None:
        grad = log_probs.exp_().mul_(-g[:, None])
    else:
        probs = log_probs.exp()
        grad = log_probs.add_(saved.entropy[rows, None]).mul_(h[:, None]).add_(g[:, None]).mul_(probs).neg_()
        del probs
    index, in_columns = block_target_index(chunk, classes)
    target_entry = g * saved.other_prob[rows]
    if h is not None:
        target_entry = target_entry - h * torch.exp(-saved.nll[rows]) * saved.entropy_gap[rows]
    grad.scatter_(1, index, torch.where(in_columns, target_entry, grad.gather(1, index).squeeze(1))[:, None])
    return grad


# ---- summaries that RL trainers log: one forward sweep, no gradient ---------------------------------------------

SUMMARIES: tuple[str, ...] = ("log_sum_sq_probs", "mean_logits", "is_top1")
"""What :func:`token_summaries` computes: ``log sum_c p_c^2`` (the log of the probability that two draws agree),
the mean of the tempered logits over the classes, and whether the target is the row's first largest logit."""


@dataclasses.dataclass
class _Summaries:
    """One chunk's running sums over the blocks of classes seen so far."""

    row_max: torch.Tensor
    sum_exp: torch.Tensor  # sum exp(u - row_max)
    sum_exp2: torch.Tensor  # sum exp(2 (u - row_max))
    sum_u: torch.Tensor
    target: torch.Tensor  # u_y (-inf until the target's block)
    max_before_target: torch.Tensor  # max of u_c over c < y


@torch.no_grad()
def token_summaries(plan: Plan, head: HeadTensors, targets: Targets, temperature: float,
                    wanted: tuple[str, ...] = SUMMARIES) -> dict[str, torch.Tensor]:
    """Per row, the :data:`SUMMARIES` named in ``wanted`` of the distribution ``softmax(u)`` of the tempered logits
    ``u`` (soft-capped as ``plan`` says): fp32 (fp64 for fp64 input) and ``is_top1`` bool, no gradient. The logits
    are formed as :func:`token_statistics` forms them (the plan's operands, chunks and logits GEMM), a block of
    classes and a workspace of columns at a time, so no ``(N, C)`` buffer exists; each row's sums fold across
    blocks with the one rescale every fold uses (:func:`~lce.passes.statistics.carry_factor`)."""
    unknown = [name for name in wanted if name not in SUMMARIES]
    if unknown:
        raise ValueError(f"wanted must name some of {SUMMARIES}, got {unknown}")
    loop, per_chunk = ChunkLoop.of(plan, head, targets), []
    for rows in plan.row_chunks():
        chunk, running = loop.chunk(rows), None
        for cols in plan.class_chunks():
            u = tempered_block_logits_(block_logits(chunk, cols), chunk, float(temperature))
            running = _fold_summaries(u, chunk, cols, running)
            del u
        per_chunk.append(running)
    stats = _Summaries(*(torch.cat([getattr(r, f.name) for r in per_chunk]) for f in dataclasses.fields(_Summaries)))
    out = {}
    if "log_sum_sq_probs" in wanted:  # log sum p^2 = log sum exp(2 (u - m)) - 2 log sum exp(u - m)
        out["log_sum_sq_probs"] = stats.sum_exp2.log() - 2 * stats.sum_exp.log()
    if "mean_logits" in wanted:
        out["mean_logits"] = stats.sum_u / plan.num_classes
    if "is_top1" in wanted:  # the first maximum: no class before the target ties it, none after exceeds it
        out["is_top1"] = (stats.target >= stats.row_max) & (stats.target > stats.max_before_target)
    return out


def _fold_summaries(u: torch.Tensor, chunk: Chunk, cols: slice, previous: _Summaries | None) -> _Summaries:
    """Fold one block of tempered logits ``u`` (rows, the classes ``cols``) into the running sums."""
    target = chunk.targets.safe_target[chunk.rows]
    index, in_block = block_target_index(chunk, cols)
    block_target = u.gather(1, index).squeeze(1)
    row_max = u.amax(1) if previous is None else torch.maximum(previous.row_max, u.amax(1))
    sum_exp, sum_exp2 = torch.zeros_like(row_max), torch.zeros_like(row_max)
    before = torch.full_like(row_max, -math.inf)
    for classes, columns in column_blocks(chunk.plan, cols):
        terms = (u[:, columns] - row_max[:, None]).exp_()
        sum_exp.add_(terms.sum(1))
        sum_exp2.add_(terms.square_().sum(1))
        del terms
        index_of = torch.arange(classes.start, classes.stop, device=u.device)
        earlier = u[:, columns].masked_fill(index_of[None, :] >= target[:, None], -math.inf)
        before = torch.maximum(before, earlier.amax(1))
        del earlier
    sum_u = u.sum(1)
    if previous is None:
        return _Summaries(row_max, sum_exp, sum_exp2, sum_u, torch.where(in_block, block_target, -math.inf), before)
    carry = carry_factor(previous.row_max, row_max)
    return _Summaries(row_max, sum_exp.add_(previous.sum_exp * carry),
                      sum_exp2.add_(previous.sum_exp2 * carry.square()), sum_u.add_(previous.sum_u),
                      torch.where(in_block, block_target, previous.target),
                      torch.maximum(before, previous.max_before_target))
