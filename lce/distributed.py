"""Vocab-parallel linear cross-entropy over ``torch.distributed``: each rank holds a slice of the classes.

Every rank of a process group passes the same ``input`` (N, D) and ``target``
(global class indices) and its own contiguous shard of the classifier rows, in
rank order; shards may differ in size. Each rank runs the one-device passes of
:mod:`lce.passes.loss` on its shard (any policy, row and class chunking,
soft-capping, z-loss) with :class:`ShardLayout` as their group reduction, the
one hook through which, per chunk of rows, the ranks exchange per-row softmax
statistics and sum the input gradient. The row chunks are
the group's, not the rank's: automatic chunking is sized for the largest shard
(the same rows per chunk on every rank, so the per-chunk collectives pair up),
while each rank cuts its own classes into blocks (no collective inside them).
The statistics exchanged per chunk of rows:

* the row maximum and the target's logit (an all-reduce MAX of two values per
  row; only the rank holding the target has a finite one),
* the sum of exponentials apart from the target, rescaled to the global
  maximum, and the smoothing term's logit sum (an all-reduce SUM),

always in the plan's stats dtype (at least fp32), so the log-sum-exp, the
losses and ``1 - p_y`` are those of the whole vocabulary on every rank: every
rank returns the full loss. Each rank's input-gradient products are formed in
the stats dtype, summed across ranks and rounded once, so every rank holds the
full input gradient; each rank gets the gradient of its own weight (and bias)
shard. Communication is O(N) per chunk for the statistics, plus the input
gradient itself (O(N x D)), never O(N x C).

Before any of that, the ranks agree: an ``all_gather_object`` of every rank's
description of its call (shapes, dtypes, options, a checksum of the targets,
the device kind, which tensors require grad, and the rank's own argument
errors), after which every rank raises the same
error if any rank's call is bad or the ranks disagree -- so bad input fails on
every rank and never leaves a rank waiting in a collective.

Costs against one process (measured in ``python -m analysis vocab-parallel``):
each rank computes its shard's logits twice (once for the statistics, once for
the gradients, as with class tiling) and its input-gradient partials in the
stats dtype.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist
from torch import nn

from .autocasting import autocast_dtype, autocast_off, loss_dtype_under, outside_autocast, take_head
from .autograd import hand_out_gradients, keep_gradients
from .functional import check_arguments, check_features, check_settings, first_out_of_range, grads_needed
from .logprobs import (
    TokenCall,
    TokenLogProbs,
    check_log_probs_arguments,
    log_probs_plan,
    pad_temperature,
    temperature_per_row,
)
from .passes.chunk import HeadTensors, Targets, pad_rows
from .passes.logprob_passes import TokenStatistics
from .passes.loop import GroupReduction
from .passes.loss import per_row_grads, per_row_loss, scalar_loss_and_grads
from .passes.statistics import RowStatistics, carry_factor
from .planning.device import device_kind_of, has_mixed_precision_mm
from .planning.options import LinearCrossEntropyOptions, dtype_name
from .planning.resolve import make_plan
from .unfused import DEFAULT_IGNORE_INDEX

__all__ = ["vocab_parallel_linear_cross_entropy", "VocabParallelLinearCrossEntropyLoss", "ShardLayout",
           "vocab_parallel_linear_log_probs",
           "shard_bounds", "even_shard_sizes"]

def even_shard_sizes(num_classes: int, world: int) -> list[int]:
    """Shard sizes that split ``num_classes`` as evenly as possible over ``world`` ranks (the first ranks get one
    class more when it does not divide)."""
    return [num_classes // world + (1 if rank < num_classes % world else 0) for rank in range(world)]


def shard_bounds(sizes: list[int]) -> list[tuple[int, int]]:
    """The global classes ``[start, stop)`` of each rank's shard, from the shard sizes in rank order."""
    bounds, start = [], 0
    for size in sizes:
        bounds.append((start, start + size))
        start += size
    return bounds


@dataclasses.dataclass(frozen=True)
class ShardLayout(GroupReduction):
    """Where this rank's classes lie among the group's: ``start`` (its first global class), ``size`` and
    ``num_classes`` (the sum of every rank's shard), and the group the statistics are reduced over.

    It is the chunk passes' :class:`~lce.passes.loop.GroupReduction`: the one-device passes of
    :mod:`lce.passes.loss` run on this rank's shard and call it once per chunk of rows.
    """

    start: int
    size: int
    num_classes: int
    group: dist.ProcessGroup | None
    rank_ordered: bool = False
    """Sum across ranks in rank order (a batch-invariant plan): each rank gathers every rank's values and adds them
    rank 0 first, so that an element's sum does not depend on where it lies in the buffer, as a ring all-reduce's
    order does with three or more ranks. It holds the group's copies of the buffer: world x (rows, D) in the stats
    dtype for a chunk's input-gradient products."""

    def all_reduce_(self, tensor: torch.Tensor, op=dist.ReduceOp.SUM) -> torch.Tensor:
        if not (self.rank_ordered and op == dist.ReduceOp.SUM):  # a maximum is the same in any order
            dist.all_reduce(tensor, op=op, group=self.group)
            return tensor
        parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size(self.group))]
        dist.all_gather(parts, tensor.contiguous(), group=self.group)
        total = parts[0]
        for part in parts[1:]:
            total.add_(part)
        return tensor.copy_(total)

    def reduce_statistics(self, stats: RowStatistics) -> RowStatistics:
        """The statistics of the whole vocabulary from each rank's: O(rows) values per rank, in the stats dtype."""
        maxima = self.all_reduce_(torch.stack([stats.row_max, stats.target_logit], 1), dist.ReduceOp.MAX)
        row_max, target_logit = maxima[:, 0], maxima[:, 1]
        carried = carry_factor(stats.row_max, row_max)
        columns = [stats.other * carried] + ([stats.weighted_logit_sum] if stats.weighted_logit_sum is not None else [])
        sums = self.all_reduce_(torch.stack(columns, 1))
        return RowStatistics(row_max.contiguous(), sums[:, 0].contiguous(), target_logit.contiguous(),
                             sums[:, 1].contiguous() if sums.shape[1] > 1 else None)

    def reduce_token_statistics(self, stats: TokenStatistics) -> TokenStatistics:
        """The per-token log-probabilities' statistics of the whole vocabulary from each rank's, in the same way:
        the maxima and target logits (MAX), then ``other`` and ``spread`` rescaled to the global maximum (SUM)."""
        maxima = self.all_reduce_(torch.stack([stats.row_max, stats.target_logit], 1), dist.ReduceOp.MAX)
        row_max = maxima[:, 0].contiguous()
        other, spread = stats.rescaled_sums(row_max)
        sums = self.all_reduce_(torch.stack([other] + ([] if spread is None else [spread]), 1))
        return TokenStatistics(row_max, sums[:, 0].contiguous(), maxima[:, 1].contiguous(),
                               None if spread is None else sums[:, 1].contiguous())

    def complete_input_sum(self, input_sum: torch.Tensor) -> None:
        """Every rank's input-gradient products of the chunk, summed in place (O(rows x D))."""
        self.all_reduce_(input_sum)


# ---- agreement before any collective of the loop ---------------------------------------------------------------

def _local_problem(input, weight_shard, target, linear_bias, weight, reduction, ignore_index, label_smoothing,
                   softcap, z_loss, options, loss_dtype) -> str | None:
    """This rank's own argument errors (as text), or None: the single-device checks on its shard."""
    try:
        if options is not None:
            LinearCrossEntropyOptions.coerce(options)
        check_features(softcap, z_loss, False, loss_dtype)
        if not isinstance(weight_shard, torch.Tensor) or weight_shard.dim() != 2:
            shape = tuple(weight_shard.shape) if isinstance(weight_shard, torch.Tensor) else type(weight_shard)
            raise ValueError(f"weight_shard must be a (C_shard, in_features) tensor, got {shape}")
        if weight_shard.shape[0] < 1:
            raise ValueError("weight_shard must hold at least one class")
        if isinstance(target, torch.Tensor) and target.is_floating_point():
            raise TypeError("target must hold int64 global class indices (class probabilities are not supported "
                            "vocab-parallel)")
        # the single-device checks, against the shard (targets are checked against the global range later)
        check_arguments(input, weight_shard, torch.zeros_like(target) if isinstance(target, torch.Tensor) else target,
                        linear_bias, weight, reduction, ignore_index, label_smoothing)
    except (TypeError, ValueError) as error:
        return _problem_text(error)
    return None


def _problem_text(error: TypeError | ValueError) -> str:
    """An argument error as the text the ranks agree on: "TypeError: ..." or "ValueError: ..." (lce's classes,
    lce.errors, are named by the built-in class they are)."""
    return f"{'TypeError' if isinstance(error, TypeError) else 'ValueError'}: {error}"


def _taken_under_autocast(who: str, input, weight_shard, linear_bias) -> tuple:
    """``(input, weight_shard, linear_bias, problem)``: the head's tensors as lce takes them under autocast
    (:func:`lce.autocasting.take_head`), and the error that taking them raised as text (else None), to be agreed on
    by every rank before it is raised."""
    try:
        return (*take_head(who, input, weight_shard, linear_bias), None)
    except TypeError as error:
        return input, weight_shard, linear_bias, _problem_text(error)


def _target_checksum(target: torch.Tensor) -> int:
    """A number that differs, almost surely, between two different target tensors (positions weigh in)."""
    flat = target.reshape(-1).to(torch.int64)
    weights = torch.arange(1, flat.numel() + 1, dtype=torch.int64, device=flat.device) % 1_000_003
    return int(((flat % 1_000_033) * weights).sum())


def _description(input, weight_shard, target, linear_bias, weight, call: tuple, options, problem) -> dict:
    """What every rank must agree on (``call``: the call's arguments that are not tensors), and this rank's shard
    size and errors."""
    tensors_ok = problem is None
    return {
        "problem": problem,
        "shard": int(weight_shard.shape[0]) if tensors_ok else None,
        "input": (tuple(input.shape), dtype_name(input.dtype)) if tensors_ok else None,
        "target": (tuple(target.shape), _target_checksum(target)) if tensors_ok else None,
        "bias": linear_bias is not None, "weight": weight is not None,
        "call": call,
        "options": None if options is None or not tensors_ok else repr(LinearCrossEntropyOptions.coerce(options)),
        "plan": _plan_inputs(input, weight_shard, linear_bias) if tensors_ok else None,
    }


def _plan_inputs(input: torch.Tensor, weight_shard: torch.Tensor, linear_bias: torch.Tensor | None) -> dict:
    """What :func:`~lce.planning.resolve.make_plan` reads from this rank's tensors and device beyond the agreed shapes
    and
    options: the layout table, the "auto" ``acc_dtype`` rule's answer, which gradients are needed. With these
    agreed, every rank resolves the same row chunks, dtypes and gradient passes, so the same collectives."""
    kind = device_kind_of(input.device)
    return {"device kind": kind,
            "mixed-precision GEMMs": has_mixed_precision_mm(input.device, kind, input.dtype),
            "needs grad (input, weight_shard, linear_bias)": grads_needed(input, weight_shard, linear_bias)}


_AGREED = {"input": "input shape or dtype", "target": "target (shape or values)",
           "bias": "whether linear_bias is given", "weight": "whether a class weight is given",
           "call": "the arguments that are not tensors (reduction, ignore_index, label_smoothing, softcap, z_loss, "
                   "loss_dtype; for log-probabilities ignore_index, return_entropy, softcap, temperature)",
           "options": "options",
           "plan": "the device kind or which tensors require grad"}


def _agree(descriptions: list[dict], num_classes: int | None) -> list[int]:
    """Every rank's shard size, or ``ValueError`` naming the ranks and what is wrong (raised on every rank)."""
    problems = [f"rank {rank}: {d['problem']}" for rank, d in enumerate(descriptions) if d["problem"]]
    if problems:
        raise ValueError("vocab_parallel_linear_cross_entropy: bad arguments on " + "; ".join(problems))
    for key, words in _AGREED.items():
        values = [d[key] for d in descriptions]
        if any(value != values[0] for value in values):
            seen = ", ".join(f"rank {rank}: {value}" for rank, value in enumerate(values))
            raise ValueError(f"vocab_parallel_linear_cross_entropy: the ranks disagree on {words} ({seen}); every "
                             "rank must pass the same input, target and arguments, and its own weight shard")
    sizes = [d["shard"] for d in descriptions]
    if num_classes is not None and sum(sizes) != num_classes:
        raise ValueError(f"vocab_parallel_linear_cross_entropy: the shards hold {sum(sizes)} classes "
                         f"({' + '.join(map(str, sizes))}), not num_classes={num_classes}")
    return sizes


# ---- the passes on one rank: lce.passes.loss's, with ShardLayout as their group reduction -----------------------

def _shard_targets(target: torch.Tensor, class_weight: torch.Tensor | None, ignore_index: int, label_smoothing: float,
                   z_loss: float, layout: ShardLayout, stats_dtype: torch.dtype) -> Targets:
    """The :class:`~lce.passes.chunk.Targets` of this rank's classes in local indices, with the global row weights,
    class count, weight sum and largest class weight."""
    valid = target != ignore_index
    local_target = torch.where(valid, target, 0) - layout.start  # outside [0, size): another rank's class
    weight = None if class_weight is None else class_weight.to(stats_dtype)
    if weight is None:
        row_weight, weight_sum, max_weight = valid.to(stats_dtype), float(layout.num_classes), None
    else:
        mine = valid & (local_target >= 0) & (local_target < layout.size)
        row_weight = layout.all_reduce_(torch.where(mine, weight[local_target.clamp(0, layout.size - 1)], 0))
        totals = layout.all_reduce_(weight.sum().reshape(1))
        weight_sum = totals[0]
        max_weight = float(layout.all_reduce_(weight.abs().max().reshape(1), dist.ReduceOp.MAX))
    return Targets(valid, local_target, row_weight, weight, weight_sum, label_smoothing, layout.num_classes, z_loss,
                   max_class_weight=max_weight)


class _ScalarVocabParallel(torch.autograd.Function):
    @staticmethod
    @outside_autocast
    def forward(ctx, input, weight, bias, targets, layout, plan):
        loss, grads, _ = scalar_loss_and_grads(plan, HeadTensors(input, weight, bias), targets, layout)
        keep_gradients(ctx, grads, plan)
        return loss

    @staticmethod
    @outside_autocast
    def backward(ctx, grad_loss):
        return (*hand_out_gradients(ctx, grad_loss), None, None, None)


class _PerRowVocabParallel(torch.autograd.Function):
    @staticmethod
    @outside_autocast
    def forward(ctx, input, weight, bias, targets, layout, plan):
        n = input.shape[0]  # targets come padded to the plan's loop rows (batch-invariant); the losses are sliced
        losses, lse, other_prob = per_row_loss(plan, HeadTensors(input, weight, bias), targets, layout)
        ctx.save_for_backward(input, weight, bias, lse, other_prob)
        ctx.targets, ctx.layout, ctx.plan = targets, layout, plan
        return losses[:n]

    @staticmethod
    @outside_autocast
    def backward(ctx, grad_losses):
        input, weight, bias, lse, other_prob = ctx.saved_tensors
        plan = ctx.plan
        grads = per_row_grads(plan, HeadTensors(input, weight, bias), ctx.targets, lse,
                              pad_rows(plan, grad_losses, 0), other_prob, ctx.layout)
        return grads.input, grads.weight, grads.bias, None, None, None


def vocab_parallel_linear_cross_entropy(
    input: torch.Tensor,
    weight_shard: torch.Tensor,
    target: torch.Tensor,
    *,
    group: dist.ProcessGroup | None = None,
    linear_bias: torch.Tensor | None = None,
    weight: torch.Tensor | None = None,
    reduction: str = "mean",
    ignore_index: int | None = None,
    label_smoothing: float = 0.0,
    options: LinearCrossEntropyOptions | None = None,
    softcap: float | None = None,
    z_loss: float = 0.0,
    loss_dtype: torch.dtype | None = None,
    num_classes: int | None = None,
) -> torch.Tensor:
    """Cross-entropy of ``input @ W.T + b`` against ``target``, with ``W``'s rows (the classes) sharded across the
    ranks of ``group`` (default: the world).

    Call it on every rank of ``group`` with the same ``input``, ``target`` and
    arguments; ``weight_shard`` (C_r, D) is this rank's contiguous slice of the
    classifier rows, slices in rank order, sizes free. ``linear_bias`` and the
    per-class ``weight`` are sliced the same way. Every rank returns the full
    loss (as :func:`lce.linear_cross_entropy` on the unsharded weight would);
    backward gives every rank the full gradient of ``input`` and its own
    shard's weight (and bias) gradient. Every rank must run backward (it holds
    collectives for reduction "none").

    ``options`` are lce's (or torch's), the same on every rank (``None``: the
    default options; the unfused formula has no sharded form). Rows per chunk
    are resolved for the largest shard, so every rank walks the same row chunks;
    ``class_chunk_size`` tiles each rank's own shard.
    ``softcap``, ``z_loss`` and ``loss_dtype`` are as in
    :func:`lce.linear_cross_entropy` (``loss_dtype=torch.float32`` lets a fp16
    loss scale of 2^16 reach backward). ``num_classes``, if given, is checked against the sum of the shards.
    Bad arguments, or ranks that disagree, raise ``ValueError``/``TypeError``
    on every rank before any collective of the loop.
    """
    world = dist.get_world_size(group)
    input, weight_shard, linear_bias, problem = _taken_under_autocast("vocab_parallel_linear_cross_entropy", input,
                                                                      weight_shard, linear_bias)
    problem = problem or _local_problem(input, weight_shard, target, linear_bias, weight, reduction, ignore_index,
                                        label_smoothing, softcap, z_loss, options, loss_dtype)
    descriptions: list[dict | None] = [None] * world
    call = (reduction, ignore_index, float(label_smoothing), softcap, float(z_loss), str(loss_dtype))
    dist.all_gather_object(descriptions, _description(input, weight_shard, target, linear_bias, weight, call, options,
                                                      problem), group=group)
    sizes = _agree(descriptions, num_classes)
    rank = dist.get_rank(group)
    start, stop = shard_bounds(sizes)[rank]
    layout = ShardLayout(start, stop - start, sum(sizes), group)
    ignored = DEFAULT_IGNORE_INDEX if ignore_index is None else ignore_index
    bad = first_out_of_range(target, layout.num_classes, ignored)  # the same on every rank: the targets agree
    if bad is not None:
        raise ValueError(f"vocab_parallel_linear_cross_entropy: target values must lie in [0, {layout.num_classes}) "
                         f"(the classes of every shard) or equal ignore_index={ignored}, found {bad}")

    unbatched = input.dim() == 1
    if unbatched:
        input, target = input.unsqueeze(0), target.reshape(1)
    loss_dtype = loss_dtype_under(loss_dtype, input)
    # One row chunking for the group, sized for the largest shard: the per-chunk all-reduces must pair up
    # across ranks. Each rank still tiles its own classes (no collective inside the class blocks).
    resolved = make_plan(LinearCrossEntropyOptions.coerce(options) if options is not None
                         else LinearCrossEntropyOptions(),
                         num_rows=input.shape[0], in_features=input.shape[1], num_classes=layout.size,
                         dtype=input.dtype, device=input.device, reduction=reduction,
                         needs_grad=grads_needed(input, weight_shard, linear_bias), softcap=softcap, z_loss=z_loss,
                         loss_dtype=None if loss_dtype == input.dtype else loss_dtype, chunking_classes=max(sizes),
                         autocast=autocast_dtype(input.device))
    layout = dataclasses.replace(layout, rank_ordered=resolved.batch_invariant)
    function = _PerRowVocabParallel if reduction == "none" else _ScalarVocabParallel
    with autocast_off(input.device):  # the plan decides every precision from here on (lce.autocasting)
        targets = _shard_targets(pad_rows(resolved, target, ignored), weight, ignored, float(label_smoothing),
                                 float(z_loss), layout, resolved.stats_dtype)
        loss = function.apply(input, weight_shard, linear_bias, targets, layout, resolved)
    return loss.squeeze(0) if unbatched and reduction == "none" else loss


def _log_probs_problem(input, weight_shard, target, linear_bias, temperature, return_entropy, softcap, ignore_index,
                       options) -> str | None:
    """This rank's own argument errors for :func:`vocab_parallel_linear_log_probs` (as text), or None."""
    try:
        if options is not None:
            LinearCrossEntropyOptions.coerce(options)
        check_log_probs_arguments(input, weight_shard, target, linear_bias, temperature, return_entropy, softcap,
                                  ignore_index, who="vocab_parallel_linear_log_probs")
    except (TypeError, ValueError) as error:
        return _problem_text(error)
    return None


def _temperature_description(temperature) -> object:
    """A float as it is; a tensor as its shape and a checksum of its values (ranks must pass the same)."""
    if not isinstance(temperature, torch.Tensor):
        return temperature
    flat = temperature.detach().reshape(-1).double()
    weights = torch.arange(1, flat.numel() + 1, dtype=torch.float64, device=flat.device)
    return tuple(temperature.shape), float((flat * weights).sum())


def vocab_parallel_linear_log_probs(
    input: torch.Tensor,
    weight_shard: torch.Tensor,
    target: torch.Tensor,
    *,
    group: dist.ProcessGroup | None = None,
    linear_bias: torch.Tensor | None = None,
    temperature: float | torch.Tensor = 1.0,
    return_entropy: bool = False,
    softcap: float | None = None,
    ignore_index: int = DEFAULT_IGNORE_INDEX,
    options: LinearCrossEntropyOptions | None = None,
    num_classes: int | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """:func:`lce.linear_log_probs` with ``W``'s rows (the classes) sharded across the ranks of ``group``, as
    :func:`vocab_parallel_linear_cross_entropy` shards them.

    Call it on every rank with the same ``input``, ``target``, ``temperature`` and arguments and this rank's
    contiguous ``weight_shard`` (and ``linear_bias`` shard); every rank returns the log-probabilities (and entropy)
    of the whole vocabulary, and backward gives every rank the full input gradient and its own shard's weight and
    bias gradients. Every rank must run backward (it holds collectives). Bad arguments, or ranks that disagree,
    raise on every rank before any collective of the loop.
    """
    world = dist.get_world_size(group)
    who = "vocab_parallel_linear_log_probs"
    input, weight_shard, linear_bias, problem = _taken_under_autocast(who, input, weight_shard, linear_bias)
    problem = problem or _log_probs_problem(input, weight_shard, target, linear_bias, temperature, return_entropy,
                                            softcap, ignore_index, options)
    call = ("log_probs", ignore_index, return_entropy, softcap,
            _temperature_description(temperature) if problem is None else None)
    descriptions: list[dict | None] = [None] * world
    dist.all_gather_object(descriptions, _description(input, weight_shard, target, linear_bias, None, call, options,
                                                      problem), group=group)
    sizes = _agree(descriptions, num_classes)
    rank = dist.get_rank(group)
    start, stop = shard_bounds(sizes)[rank]
    layout = ShardLayout(start, stop - start, sum(sizes), group)
    flat_input, flat_target = input.reshape(-1, input.shape[-1]), target.reshape(-1)
    plan = log_probs_plan(flat_input, weight_shard, linear_bias=linear_bias, return_entropy=return_entropy,
                          softcap=None if softcap is None else float(softcap), options=options,
                          chunking_classes=max(sizes))
    layout = dataclasses.replace(layout, rank_ordered=plan.batch_invariant)
    with autocast_off(input.device):  # the plan decides every precision from here on (lce.autocasting)
        targets = _shard_targets(pad_rows(plan, flat_target, ignore_index), None, ignore_index, 0.0, 0.0, layout,
                                 plan.stats_dtype)
        per_row = pad_temperature(plan, temperature_per_row(temperature, flat_target.shape[0], plan.stats_dtype))
        out = TokenLogProbs.apply(flat_input, weight_shard, linear_bias, flat_target,
                                  TokenCall(targets, per_row, plan, ignore_index, layout, who))
    if not return_entropy:
        return out.reshape(target.shape)
    return out[0].reshape(target.shape), out[1].reshape(target.shape)


class VocabParallelLinearCrossEntropyLoss(nn.Module):
    """A linear head whose classes are sharded across ``group``: this rank's ``nn.Linear(in_features, shard_size)``
    and the loss of :func:`vocab_parallel_linear_cross_entropy`.

    ``shard_sizes`` lists every rank's number of classes in rank order (this
    rank holds ``shard_sizes[rank]``); ``weight`` is this rank's slice of the
    per-class weights, if any. Initialise the shards as one would the whole
    head (the module draws its own slice only).
    """

    def __init__(self, in_features: int, shard_sizes: list[int], *, group: dist.ProcessGroup | None = None,
                 bias: bool = False, device=None, dtype=None, reduction: str = "mean",
                 weight: torch.Tensor | None = None, ignore_index: int | None = None, label_smoothing: float = 0.0,
                 options: LinearCrossEntropyOptions | None = None, softcap: float | None = None,
                 z_loss: float = 0.0, loss_dtype: torch.dtype | None = None) -> None:
        super().__init__()
        if not shard_sizes or any(not isinstance(s, int) or s < 1 for s in shard_sizes):
            raise ValueError(f"shard_sizes must list one positive int per rank, got {shard_sizes!r}")
        check_settings(reduction, ignore_index, label_smoothing)
        check_features(softcap, z_loss, False, loss_dtype)
        self.group, self.shard_sizes = group, list(shard_sizes)
        rank = dist.get_rank(group) if dist.is_initialized() else 0
        if len(self.shard_sizes) != (dist.get_world_size(group) if dist.is_initialized() else 1):
            raise ValueError(f"shard_sizes has {len(self.shard_sizes)} entries for a group of "
                             f"{dist.get_world_size(group) if dist.is_initialized() else 1} ranks")
        self.reduction, self.ignore_index, self.label_smoothing = reduction, ignore_index, label_smoothing
        self.options, self.softcap, self.z_loss, self.loss_dtype = options, softcap, float(z_loss), loss_dtype
        self.register_buffer("weight", weight)
        self.linear = nn.Linear(in_features, self.shard_sizes[rank], bias=bias, device=device, dtype=dtype)

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return vocab_parallel_linear_cross_entropy(
            input, self.linear.weight, target, group=self.group, linear_bias=self.linear.bias, weight=self.weight,
            reduction=self.reduction, ignore_index=self.ignore_index, label_smoothing=self.label_smoothing,
            options=self.options, softcap=self.softcap, z_loss=self.z_loss, loss_dtype=self.loss_dtype,
            num_classes=sum(self.shard_sizes))

    def extra_repr(self) -> str:
        return f"shard_sizes={self.shard_sizes}, reduction={self.reduction!r}, options={self.options}"
