"""The chunk loop: loss and gradients of cross_entropy(x @ W.T + b, y), a row chunk at a time.

For one chunk of rows with logits ``z`` (rows, C), per-row target ``y``,
class weights ``w`` (ones if none), smoothing ``eps`` and ``w_y`` the weight
of the target (0 for an ignored row), the loss of a row is

    l = (1 - eps) * w_y * (lse - z_y)  +  eps / C * sum_c w_c * (lse - z_c)

(the second term only for rows that are not ignored), and with ``p`` the
softmax and ``s`` the row's scale (1/sum(w_y) for "mean", 1 for "sum", the
incoming gradient for "none", 0 for ignored rows) its gradient is

    dz = s * ((1 - eps) * w_y + eps / C * sum(w)) * p  -  s * (1 - eps) * w_y * onehot(y)
         -  s * eps / C * w

from which grad_input = dz @ W, grad_weight = sum over chunks of dz.T @ x and
grad_bias = sum over chunks of dz.sum(0).

lce's features beyond torch's op change three things. A z-loss adds
``z_loss * lse**2`` to each row that is not ignored, with its own row scale
``s_z`` (1/count of such rows for "mean"), so ``p`` gains the coefficient
``2 * z_loss * s_z * lse`` in dz. Soft-capping replaces ``z`` by
``cap * tanh(z / cap)`` before anything else: the logits buffer keeps
``t = tanh(z / cap)``, the statistics and dz are formed from ``cap * t`` a
block of columns at a time in a small workspace, and each block's dz is
multiplied by the derivative ``1 - t**2`` in the buffer itself, which then
holds the gradient with respect to the raw logits (no second chunk-sized buffer).

The file reads top-down. First the three passes -- :func:`scalar_loss_and_grads`
("mean"/"sum": loss and gradients in one pass), :func:`per_row_loss` and
:func:`per_row_grads` ("none": forward, then backward recomputing the logits) --
and the body of one chunk of each, whole-vocabulary and class-tiled (a
statistics sweep over blocks of classes, then a gradient sweep). Then what a
pass is given and hands each chunk (:class:`HeadTensors`, :class:`Targets`,
:class:`ChunkLoop`, :class:`Chunk`), then the pieces in loop order:
:func:`chunk_logits` (``z``), :class:`RowStatistics` and
:func:`chunk_loss_and_softmax_` (``l``, ``lse``, ``p``), :func:`chunk_grad_logits_`
(``dz``, scaled as :class:`DzScale` says, from the rows' weights in
:class:`RowScales`), the soft-capped forms of the statistics and of dz, and last
:meth:`GradientSums.add_chunk` (the three products, summed over chunks and
rounded once by :meth:`GradientSums.finish`). Every dtype comes from the
:class:`~lce.planning.plan.Plan`; the GEMMs run through :mod:`lce.passes.gemm`. Each pass runs a
chunk inside a function of its own, so a chunk's buffers are freed before the
next chunk allocates its own.

A pass whose classes are split across processes (:mod:`lce.distributed`) is the
same pass given a :class:`GroupReduction`: it completes each chunk's row
statistics and input-gradient sum across the group, and such a pass always
sweeps statistics before gradients, as class tiling does.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Iterator
from typing import Protocol

import torch

from .. import kernels
from ..planning.blocks import TARGET_ROWS_PER_GEMM
from ..planning.plan import LOSS_SUM_DTYPE, Plan
from .gemm import add_mm_, mm, mm_upcast_weight, mm_upcast_weight_t
from .headroom import STORE_LIMIT, RunningSum, largest_entry, power_of_two_under, scale_to_fit

__all__ = [
    "scalar_loss_and_grads", "per_row_loss", "per_row_grads", "HeadTensors", "Targets", "GroupReduction",
    "RowStatistics", "ChunkLoop", "DzScale", "chunk_logits", "chunk_loss_and_softmax_",
    "chunk_grad_logits_", "grad_logits_rescale", "grad_logits_rescale_for", "GradientSums", "GradientScales",
    "block_logits", "block_target_index", "cap_logits_", "column_blocks", "Gradients",
]


# ---- the passes ---------------------------------------------------------------------------------

def _torch_ops_if_kernels_fail(run_pass):
    """A pass that, where a kernel fails to compile or launch (:class:`lce.kernels.KernelsFailed`, raised before any
    tensor was changed; :mod:`lce.kernels` has warned), runs again from its start with the PyTorch ops: the pass
    owns every buffer it writes, so nothing of the failed attempt remains. Under a group every rank fails alike (the
    same kernels at the same shapes), so the retry issues the same collectives on each."""

    @functools.wraps(run_pass)
    def run(plan: Plan, *args, **kwargs):
        if not plan.fused_passes:
            return run_pass(plan, *args, **kwargs)
        try:
            return run_pass(plan, *args, **kwargs)
        except kernels.KernelsFailed as failure:
            torch_ops = dataclasses.replace(plan, fused_passes=False, passes_reason=f"PyTorch ops ({failure})")
            return run_pass(torch_ops, *args, **kwargs)

    return run


@_torch_ops_if_kernels_fail
def scalar_loss_and_grads(plan: Plan, head: HeadTensors, targets: Targets, group: GroupReduction | None = None,
                          ) -> tuple[torch.Tensor, Gradients, torch.Tensor | None]:
    """Loss for "mean"/"sum" and, as the plan requests, its gradients (already scaled for the reduction; in fp16
    also by the powers of two in their :class:`GradientScales`, :mod:`lce.passes.headroom`), and the per-row log-sum-exp
    in fp32 when the plan returns it (else None)."""
    n, device = head.input.shape[0], head.input.device
    sums = (GradientSums(plan, head, wide_input_partials=group is not None, scaled_output=True)
            if any(plan.needs_grad) else None)
    reduction = ScalarReduction.of(plan, targets, sums is not None)
    loop = ChunkLoop.of(plan, head, targets, sums=sums, scales=reduction.scales, group=group)
    lse_out = torch.empty(n, dtype=torch.float32, device=device) if plan.return_lse else None
    loss_sum = torch.zeros((), dtype=LOSS_SUM_DTYPE, device=device)
    z_sum = torch.zeros((), dtype=LOSS_SUM_DTYPE, device=device)
    run_chunk = _scalar_chunk_tiled if loop.sweeps_statistics_first else _scalar_chunk
    for rows in plan.row_chunks():
        result = run_chunk(loop, rows)
        loss_sum += result.loss_sum
        if targets.z_loss:
            z_sum += _squared_lse(result.lse, targets, rows).sum(dtype=LOSS_SUM_DTYPE)
        if lse_out is not None:
            lse_out[rows] = result.lse
    loss = reduction.loss(plan, targets, loss_sum, z_sum)
    return loss, (sums.finish() if sums is not None else Gradients()), lse_out


@_torch_ops_if_kernels_fail
def per_row_loss(plan: Plan, head: HeadTensors, targets: Targets, group: GroupReduction | None = None,
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Per-row losses for reduction="none" (input dtype, z-loss included) and what backward reuses: the
    log-sum-exp rows and ``1 - p_y`` where backward never sees every class of a row at once (None otherwise):
    where the plan :attr:`~lce.planning.plan.Plan.saves_other_prob`, and under a group."""
    n, device = head.input.shape[0], head.input.device
    losses = torch.empty(n, dtype=plan.output_loss_dtype, device=device)
    lse = torch.empty(n, dtype=plan.stats_dtype, device=device)
    saves_other_prob = plan.saves_other_prob or group is not None
    other_prob = torch.empty(n, dtype=plan.stats_dtype, device=device) if saves_other_prob else None
    loop = ChunkLoop.of(plan, head, targets, group=group)
    run_chunk = _per_row_loss_chunk_tiled if loop.sweeps_statistics_first else _per_row_loss_chunk
    for rows in plan.row_chunks():
        stats = run_chunk(loop, rows)
        row_losses = stats.losses(targets, rows)
        if targets.z_loss:
            row_losses = row_losses + targets.z_loss * _squared_lse(stats.lse, targets, rows)
        losses[rows], lse[rows] = row_losses, stats.lse
        if other_prob is not None:
            other_prob[rows] = stats.other_prob
    return losses, lse, other_prob


@_torch_ops_if_kernels_fail
def per_row_grads(plan: Plan, head: HeadTensors, targets: Targets, lse: torch.Tensor, grad_losses: torch.Tensor,
                  other_prob: torch.Tensor | None = None, group: GroupReduction | None = None) -> Gradients:
    """Gradients of sum(grad_losses * losses) for reduction="none", recomputing logits chunk by chunk.

    ``lse`` and ``other_prob`` are what :func:`per_row_loss` returned."""
    sums = GradientSums(plan, head, wide_input_partials=group is not None)
    row_scale = grad_losses.to(plan.stats_dtype)
    # under a group the same bound on every rank: the incoming gradients agree (every rank computes the same loss)
    max_scale = row_scale.abs().max() if row_scale.numel() else 0.0
    scales = RowScales(row_scale, row_scale if targets.z_loss else None, max_scale,
                       grad_logits_rescale(plan, targets, max_scale))
    loop = ChunkLoop.of(plan, head, targets, sums=sums, scales=scales, group=group)
    run_chunk = _per_row_grad_chunk_tiled if loop.sweeps_statistics_first else _per_row_grad_chunk
    for rows in plan.row_chunks():
        run_chunk(loop, rows, lse[rows], None if other_prob is None else other_prob[rows])
    return sums.finish()


# ---- one chunk against every class at once -------------------------------------------------------

def _scalar_chunk(loop: ChunkLoop, rows: slice) -> ChunkResult:
    """One chunk of the scalar reductions: its loss sum and log-sum-exp; its gradients go into ``loop.sums``."""
    chunk = loop.chunk(rows)
    z = chunk_logits(chunk)
    if chunk.plan.softcap is not None:
        return _capped_chunk(loop, chunk, z)
    if loop.uses_kernels:  # two passes over z: statistics, then dz in place (lce.kernels)
        stats = kernel_statistics(z, chunk)
        if loop.sums is not None:
            scale = loop.scales.dz_scale(chunk, stats.lse)
            dz = kernel_grad_logits_(z, chunk, scale, stats.row_max, stats.other_prob, divisor=stats.sum_exp)
            loop.sums.add_chunk(chunk, dz, scale.rescale)
        return ChunkResult(stats.losses(chunk.targets, rows).sum(dtype=LOSS_SUM_DTYPE), stats.lse)
    losses, lse, other_prob = chunk_loss_and_softmax_(z, chunk)
    if loop.sums is not None:
        scale = loop.scales.dz_scale(chunk, lse)
        loop.sums.add_chunk(chunk, chunk_grad_logits_(z, chunk, other_prob, scale), scale.rescale)
    return ChunkResult(losses.sum(dtype=LOSS_SUM_DTYPE), lse)


def _capped_chunk(loop: ChunkLoop, chunk: Chunk, z: torch.Tensor) -> ChunkResult:
    """:func:`_scalar_chunk` with soft-capped logits: statistics from ``t``, then ``t`` turned into the gradient."""
    stats, t = _capped_chunk_statistics(z, chunk)
    lse = stats.lse
    if loop.sums is not None:
        scale = loop.scales.dz_scale(chunk, lse)
        dz = capped_grad_logits_(t, chunk, chunk.all_classes, lse, stats.other_prob, scale)
        loop.sums.add_chunk(chunk, dz, scale.rescale)
    return ChunkResult(stats.losses(chunk.targets, chunk.rows).sum(dtype=LOSS_SUM_DTYPE), lse)


def _per_row_loss_chunk(loop: ChunkLoop, rows: slice) -> RowStatistics:
    """One chunk of forward for reduction="none": its rows' statistics, from which the pass takes the rest."""
    chunk = loop.chunk(rows)
    z = chunk_logits(chunk)
    chunk = chunk.without_input_in_acc()  # not needed past the logits GEMM: freed before the statistics
    if chunk.plan.softcap is not None:
        return _capped_chunk_statistics(z, chunk)[0]
    return kernel_statistics(z, chunk) if loop.uses_kernels else chunk_statistics_(z, chunk)


def _per_row_grad_chunk(loop: ChunkLoop, rows: slice, lse: torch.Tensor, other_prob: torch.Tensor | None) -> None:
    """One chunk of backward for reduction="none": ``lse`` and ``other_prob`` are the chunk's rows of what
    :func:`per_row_loss` saved (``other_prob`` only with soft-capping here)."""
    chunk = loop.chunk(rows)
    z = chunk_logits(chunk)
    scale = loop.scales.dz_scale(chunk, lse)
    if chunk.plan.softcap is not None:
        dz = capped_grad_logits_(cap_logits_(z, chunk.plan.softcap), chunk, chunk.all_classes, lse,
                                 other_prob, scale)
    elif loop.uses_kernels:
        chunk_other_prob = kernels.sum_apart_from_target(z, chunk.targets.safe_target[rows], lse)
        dz = kernel_grad_logits_(z, chunk, scale, lse, chunk_other_prob)
    else:
        probs, chunk_other_prob = chunk_softmax_from_lse_(z, chunk, lse)
        dz = chunk_grad_logits_(probs, chunk, chunk_other_prob, scale)
    loop.sums.add_chunk(chunk, dz, scale.rescale)


# ---- one chunk a block of classes at a time: a statistics sweep, then a gradient sweep -----------

def _scalar_chunk_tiled(loop: ChunkLoop, rows: slice) -> ChunkResult:
    """:func:`_scalar_chunk` for a class-tiled plan (or a group): the row statistics of the whole vocabulary
    first, then the gradients, each block's logits computed again."""
    chunk = loop.chunk(rows)
    stats = _tiled_statistics(loop, chunk)
    if loop.sums is not None:
        _tiled_gradients(loop, chunk, stats.lse, stats.other_prob)
    return ChunkResult(stats.losses(chunk.targets, rows).sum(dtype=LOSS_SUM_DTYPE), stats.lse)


def _per_row_loss_chunk_tiled(loop: ChunkLoop, rows: slice) -> RowStatistics:
    return _tiled_statistics(loop, loop.chunk(rows))


def _per_row_grad_chunk_tiled(loop: ChunkLoop, rows: slice, lse: torch.Tensor, other_prob: torch.Tensor) -> None:
    _tiled_gradients(loop, loop.chunk(rows), lse, other_prob)


def _tiled_statistics(loop: ChunkLoop, chunk: Chunk) -> RowStatistics:
    """The statistics of the chunk's rows over every class, one block of logits alive at a time, completed
    across the group if there is one."""
    plan, stats = chunk.plan, None
    for cols in plan.class_chunks():
        z = block_logits(chunk, cols)
        if plan.softcap is None and loop.uses_kernels:
            stats = kernel_statistics(z, chunk, cols, stats)
        elif plan.softcap is None:
            stats = block_statistics_(z, chunk, cols, stats)
        else:
            stats = capped_statistics(cap_logits_(z, plan.softcap), chunk, cols, stats)
        del z  # one block alive at a time: the next one is made before a reassignment would free this
    return stats if loop.group is None else loop.group.reduce_statistics(stats)


def _tiled_gradients(loop: ChunkLoop, chunk: Chunk, lse: torch.Tensor, other_prob: torch.Tensor) -> None:
    """The chunk's gradients, block by block: each block's logits are computed again, turned into dz
    with the row statistics of the whole vocabulary, and multiplied out. The input gradient's blocks are
    summed in the stats dtype and rounded once, after the group (if any) has added the other processes'
    blocks to the sum."""
    plan, sums = chunk.plan, loop.sums
    input_sum = None
    if sums.input is not None:
        input_sum = torch.zeros(chunk.num_rows, plan.in_features, dtype=plan.stats_dtype,
                                device=chunk.head.input.device)
    scale = loop.scales.dz_scale(chunk, lse)
    for cols in plan.class_chunks():
        z = block_logits(chunk, cols)
        if plan.softcap is None and loop.uses_kernels:
            dz = kernel_grad_logits_(z, chunk, scale, lse, other_prob, cols)
        elif plan.softcap is None:
            dz = chunk_grad_logits_(z.sub_(lse[:, None]).exp_(), chunk, other_prob, scale, cols)
        else:
            dz = capped_grad_logits_(cap_logits_(z, plan.softcap), chunk, cols, lse, other_prob, scale)
        sums.add_chunk(chunk, dz, scale.rescale, cols, input_sum)
        del z, dz  # one block alive at a time (dz is z, turned into the gradient in place)
    if input_sum is not None:
        if loop.group is not None:
            loop.group.complete_input_sum(input_sum)
        sums.round_input_rows(chunk.rows, input_sum)


# ---- what a pass is given, and what it hands each chunk ------------------------------------------

@dataclasses.dataclass(frozen=True)
class HeadTensors:
    """The linear head of one call, as validated: ``input`` (N, D), ``weight`` (C, D), ``bias`` (C,) or
    None, all in the input dtype."""

    input: torch.Tensor
    weight: torch.Tensor
    bias: torch.Tensor | None


@dataclasses.dataclass(frozen=True)
class Targets:
    """What the loss needs to know about one call's targets, computed once by :meth:`build`.

    ``valid`` (N,) bool is False for ignored rows; ``safe_target`` (N,) int64
    is the target with ignored rows pointing at class 0, so gathers stay in
    range; ``row_weight`` (N,) is ``w_y`` (0 for ignored rows) and
    ``class_weight`` (C,) is ``w`` or None for all ones, both in the plan's
    stats dtype; ``class_weight_sum`` is ``sum(w)`` (a 0-dim tensor, or the
    float C without class weights); ``z_loss`` is the z-loss's factor (0: none).
    ``max_class_weight`` is the largest ``|w|`` of the whole vocabulary where
    ``class_weight`` holds only a shard of it (:mod:`lce.distributed`); None:
    read it from ``class_weight``.
    """

    valid: torch.Tensor
    safe_target: torch.Tensor
    row_weight: torch.Tensor
    class_weight: torch.Tensor | None
    class_weight_sum: torch.Tensor | float
    label_smoothing: float
    num_classes: int
    z_loss: float = 0.0
    max_class_weight: float | None = None

    @classmethod
    def build(cls, target: torch.Tensor, *, class_weight: torch.Tensor | None, ignore_index: int,
              label_smoothing: float, num_classes: int, stats_dtype: torch.dtype, z_loss: float = 0.0) -> Targets:
        """From the call's int64 ``target`` (N,) and optional per-class ``class_weight`` (C,)."""
        valid = target != ignore_index
        safe_target = torch.where(valid, target, 0)
        weight = class_weight.to(stats_dtype) if class_weight is not None else None
        if weight is None:
            row_weight = valid.to(stats_dtype)
        else:
            row_weight = torch.where(valid, weight[safe_target], 0)
        weight_sum = float(num_classes) if weight is None else weight.sum()
        return cls(valid, safe_target, row_weight, weight, weight_sum, label_smoothing, num_classes, z_loss)


class GroupReduction(Protocol):
    """The cross-process half of a pass whose classes are split across the processes of a group, each holding
    a shard of the vocabulary (:mod:`lce.distributed`); a pass on one device has none (None).

    Every process walks the same row chunks and calls both hooks once per chunk, in the same order, so the
    collectives inside them pair up.
    """

    def reduce_statistics(self, stats: RowStatistics) -> RowStatistics:
        """The statistics of the chunk's rows over the whole vocabulary, from this process's over its shard."""

    def reduce_token_statistics(self, stats):
        """The same for the per-token log-probabilities' :class:`lce.passes.logprob_passes.TokenStatistics`."""

    def complete_input_sum(self, input_sum: torch.Tensor) -> None:
        """Add the other processes' input-gradient products of the chunk (rows, D) to ``input_sum``, in place."""


@dataclasses.dataclass(frozen=True)
class ChunkLoop:
    """What every chunk of one pass shares: the plan, the head, ``bias`` (the head's bias in the logits GEMM's
    result dtype, converted once per call by :meth:`of`), the targets, the gradient sums the chunks add to
    and the :class:`RowScales` they weigh rows by (None where the pass has no gradients), and the
    :class:`GroupReduction` (None on one device)."""

    plan: Plan
    head: HeadTensors
    bias: torch.Tensor | None
    targets: Targets
    sums: GradientSums | None = None
    scales: RowScales | None = None
    group: GroupReduction | None = None
    uses_kernels: bool = False
    """Whether the chunk passes run as lce.kernels' Triton kernels (:attr:`~lce.planning.plan.Plan.fused_passes`)."""

    @classmethod
    def of(cls, plan: Plan, head: HeadTensors, targets: Targets, *, sums: GradientSums | None = None,
           scales: RowScales | None = None, group: GroupReduction | None = None) -> ChunkLoop:
        """The loop of one pass, with the head's bias converted for the logits GEMM (once, not per chunk)."""
        bias = head.bias.to(plan.gemm_dtypes("logits").result) if head.bias is not None else None
        return cls(plan, head, bias, targets, sums, scales, group, plan.fused_passes and plan.op == "cross_entropy")

    @property
    def sweeps_statistics_first(self) -> bool:
        """Whether a chunk builds its row statistics over every class before any gradient (its logits computed
        twice): with class tiling, and under a group, whose statistics are complete only once reduced."""
        return self.plan.tiles_classes or self.group is not None

    def chunk(self, rows: slice) -> Chunk:
        """The chunk of ``rows``; its input is upcast to acc_dtype here where the plan keeps one."""
        x_in_acc = self.head.input[rows].to(self.plan.acc_dtype) if self.plan.input_chunk_in_acc else None
        return Chunk(self.plan, self.head, self.bias, self.targets, rows, x_in_acc)


@dataclasses.dataclass(frozen=True)
class Chunk:
    """One chunk of rows and what its pieces read: the pass's plan, head, bias for the logits and targets
    (see :class:`ChunkLoop`), the chunk's ``rows`` and ``x_in_acc``, its input upcast to acc_dtype (for the
    logits GEMM or the weight-gradient one; None unless :attr:`~lce.planning.plan.Plan.input_chunk_in_acc`)."""

    plan: Plan
    head: HeadTensors
    bias: torch.Tensor | None
    targets: Targets
    rows: slice
    x_in_acc: torch.Tensor | None = None

    @property
    def num_rows(self) -> int:
        return self.rows.stop - self.rows.start

    @property
    def all_classes(self) -> slice:
        """Every class as one block with its bounds spelled out (the soft-capped workspace walks them)."""
        return slice(0, self.plan.num_classes)

    def without_input_in_acc(self) -> Chunk:
        """This chunk without its upcast input, so that the upcast is freed once nothing else needs it."""
        return dataclasses.replace(self, x_in_acc=None)


@dataclasses.dataclass
class Gradients:
    """The gradients a pass hands out, in the input dtype (None where not requested), and the powers of two they
    are stored scaled by (``scales``; None: none)."""

    input: torch.Tensor | None = None
    weight: torch.Tensor | None = None
    bias: torch.Tensor | None = None
    scales: GradientScales | None = None


@dataclasses.dataclass(frozen=True)
class GradientScales:
    """The powers of two a scalar reduction's fp16 gradients are stored scaled by (:mod:`lce.passes.headroom`):
    ``input`` as runs of rows ``(rows, scale)``, ``weight`` and ``bias`` one each. Backward divides them out."""

    input: tuple[tuple[slice, float], ...] = ()
    weight: float = 1.0
    bias: float = 1.0

    def unscale_(self, grads: tuple[torch.Tensor | None, ...], incoming: torch.Tensor | float, *, in_place: bool
                 ) -> tuple[torch.Tensor | None, ...]:
        """``(input, weight, bias)`` times ``incoming`` over their scales, each computed in fp32 and rounded once
        (in place, or into new tensors)."""
        incoming = float(incoming)  # one host synchronisation per backward; a Python float keeps the multiply fp32
        out = []
        for grad, scale in zip(grads, (None, self.weight, self.bias), strict=True):
            if grad is None:
                out.append(None)
                continue
            target = grad if in_place else torch.empty_like(grad)
            runs = self.input if scale is None and self.input else ((slice(None), scale or 1.0),)
            for rows, run_scale in runs:
                torch.mul(grad[rows], incoming / run_scale, out=target[rows])
            out.append(target)
        return tuple(out)


# ---- the logits, and the softmax statistics of a chunk's rows ------------------------------------

def chunk_logits(chunk: Chunk) -> torch.Tensor:
    """``z = x @ W.T + b`` for the chunk's rows and every class, in the stats dtype."""
    return block_logits(chunk, slice(None))


def block_logits(chunk: Chunk, cols: slice) -> torch.Tensor:
    """``z = x @ W.T + b`` for the chunk's rows and the block's classes ``cols``, in the stats dtype."""
    plan, weight = chunk.plan, chunk.head.weight[cols]
    if plan.upcasts_weight_for("logits"):
        z = mm_upcast_weight_t(chunk.x_in_acc, weight, plan.device_kind)
    else:
        z = mm(chunk.head.input[chunk.rows], weight.T, plan.gemm_dtypes("logits").result,
               in_fp32=plan.gemm_in_fp32("logits"))
    if chunk.bias is not None:
        z.add_(chunk.bias[cols])
    if z.dtype != plan.stats_dtype:
        z = z.to(plan.stats_dtype)
    return z


@dataclasses.dataclass(frozen=True)
class RowStatistics:
    """The softmax statistics of a chunk's rows, from which their losses follow.

    ``other`` is the sum of ``exp(z - row_max)`` over every class but the
    row's target (see :func:`_exp_apart_from_target_`), ``target_logit`` the
    target's logit, ``weighted_logit_sum`` the class-weighted sum of the
    logits (None without label smoothing). A class-tiled chunk builds them a
    block of classes at a time (:func:`block_statistics_`).
    """

    row_max: torch.Tensor
    other: torch.Tensor
    target_logit: torch.Tensor
    weighted_logit_sum: torch.Tensor | None

    @property
    def sum_exp(self) -> torch.Tensor:
        return self.other + (self.target_logit - self.row_max).exp()

    @property
    def lse(self) -> torch.Tensor:
        return self.row_max + self.sum_exp.log()

    @property
    def other_prob(self) -> torch.Tensor:
        """``1 - p_y``, from the sum without the target (no cancellation)."""
        return self.other / self.sum_exp

    def losses(self, targets: Targets, rows: slice) -> torch.Tensor:
        """Per-row losses, 0 for ignored rows. ``lse - z_y`` is evaluated as ``log1p(other / target)`` (the
        mass of the other classes relative to the target's) when the target holds at least half the mass,
        where the difference would cancel."""
        eps = targets.label_smoothing
        target = (self.target_logit - self.row_max).exp()
        lse = self.lse
        target_nll = torch.where(target >= self.other, torch.log1p(self.other / target), lse - self.target_logit)
        loss = (1.0 - eps) * targets.row_weight[rows] * target_nll
        if self.weighted_logit_sum is not None:
            loss = loss + eps / targets.num_classes * (targets.class_weight_sum * lse - self.weighted_logit_sum)
        # where(), not a product: an ignored row with non-finite logits must not leak NaN.
        return torch.where(targets.valid[rows], loss, 0)


def _squared_lse(lse: torch.Tensor, targets: Targets, rows: slice) -> torch.Tensor:
    """``lse**2`` per row, 0 for ignored rows: the z-loss term before its factor and reduction."""
    return torch.where(targets.valid[rows], lse.square(), 0)


def chunk_loss_and_softmax_(z: torch.Tensor, chunk: Chunk) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The chunk's per-row losses ``l`` (0 for ignored rows), ``lse`` and ``1 - p_y``; leaves ``p`` in ``z``.

    See :class:`RowStatistics` and :func:`_exp_apart_from_target_`.
    """
    stats = chunk_statistics_(z, chunk)
    z.div_(stats.sum_exp[:, None])
    return stats.losses(chunk.targets, chunk.rows), stats.lse, stats.other_prob


def chunk_statistics_(z: torch.Tensor, chunk: Chunk) -> RowStatistics:
    """The statistics of a chunk's logits ``z`` over every class (``z`` is consumed: it holds exponentials after)."""
    targets, rows = chunk.targets, chunk.rows
    target_logit = z.gather(1, targets.safe_target[rows, None]).squeeze(1)
    weighted_logit_sum = _weighted_logit_sum(z, targets, slice(None))
    row_max = z.amax(1)
    other, _ = _exp_apart_from_target_(z, chunk, row_max, target_logit)
    return RowStatistics(row_max, other, target_logit, weighted_logit_sum)


def chunk_softmax_from_lse_(z: torch.Tensor, chunk: Chunk, lse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``p = exp(z - lse)`` in place (backward of reduction="none") and ``1 - p_y``, summed without the target."""
    other, _ = _exp_apart_from_target_(z, chunk, lse)
    return z, other


def _exp_apart_from_target_(z: torch.Tensor, chunk: Chunk, shift: torch.Tensor,
                            target_logit: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``z <- exp(z - shift)`` in place; return ``(other, target)``: the sum over the classes other than
    each row's target and the target's own term.

    ``other`` is summed with the target's entry left out (set to -inf before the
    exp, put back after), so ``1 - p_y`` is never formed as a difference: when
    the target's logit leads by tens of nats, ``p_y`` rounds to 1 in fp32 and
    ``p_y - 1`` or ``lse - z_y`` would lose every digit, while ``other`` keeps
    fp32's relative precision. ``target_logit`` is ``z``'s target entry, if the caller has it already.
    """
    index = chunk.targets.safe_target[chunk.rows, None]
    if target_logit is None:
        target_logit = z.gather(1, index).squeeze(1)
    target = (target_logit - shift).exp()
    z.sub_(shift[:, None]).scatter_(1, index, -math.inf).exp_()
    other = z.sum(1)
    z.scatter_(1, index, target[:, None])
    return other, target


def _weighted_logit_sum(z: torch.Tensor, targets: Targets, cols: slice) -> torch.Tensor | None:
    """The smoothing term's ``sum_c w_c z_c`` over the block's classes (None without smoothing)."""
    if not targets.label_smoothing:
        return None
    return z.sum(1) if targets.class_weight is None else z @ targets.class_weight[cols]


def block_statistics_(z: torch.Tensor, chunk: Chunk, cols: slice, previous: RowStatistics | None) -> RowStatistics:
    """Fold one block's logits ``z`` (rows, block; consumed) into the running statistics of the chunk's rows.

    The running maximum rises to the block's where it is larger and the sum of
    exponentials gathered so far is rescaled to it (``exp(old_max - new_max)``),
    the online form of the log-sum-exp. The target's term stays out of the
    sum, as in :func:`_exp_apart_from_target_`, for every row whose target
    lies in this block.
    """
    index, in_block = block_target_index(chunk, cols)
    block_target = z.gather(1, index).squeeze(1)
    weighted = _weighted_logit_sum(z, chunk.targets, cols)
    row_max = z.amax(1) if previous is None else torch.maximum(previous.row_max, z.amax(1))
    z.sub_(row_max[:, None])
    z.scatter_(1, index, torch.where(in_block, -math.inf, block_target - row_max)[:, None])
    other = z.exp_().sum(1)
    if previous is None:
        return RowStatistics(row_max, other, torch.where(in_block, block_target, -math.inf), weighted)
    carried = (previous.row_max - row_max).exp().nan_to_num_(0.0)  # -inf - -inf: nothing gathered yet
    return RowStatistics(
        row_max,
        torch.addcmul(other, previous.other, carried),
        torch.where(in_block, block_target, previous.target_logit),
        None if weighted is None else previous.weighted_logit_sum + weighted,
    )


def block_target_index(chunk: Chunk, cols: slice) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's target as a column of the block ``cols`` (clamped into it), and whether it lies there."""
    target = chunk.targets.safe_target[chunk.rows]
    start = cols.start or 0
    stop = chunk.targets.num_classes if cols.stop is None else cols.stop
    return (target - start).clamp(0, stop - start - 1)[:, None], (target >= start) & (target < stop)


# ---- dz: the gradient with respect to the logits --------------------------------------------------

def chunk_grad_logits_(probs: torch.Tensor, chunk: Chunk, other_prob: torch.Tensor, scale: DzScale,
                       cols: slice = slice(None)) -> torch.Tensor:
    """Turn the chunk's softmax ``probs`` into ``dz / scale.rescale``, in place (the formula in the module
    docstring).

    ``other_prob`` (rows,) is ``1 - p_y`` as :func:`chunk_loss_and_softmax_`
    computed it. The target's entry, ``prob_coef * p_y - target_coef``, is
    written as ``(prob_coef - target_coef) * p_y - target_coef * (1 - p_y)``,
    so it keeps its precision when ``p_y`` is within rounding of 1. ``probs``
    may hold a block of classes ``cols`` only; rows whose target lies outside
    it get no target entry.
    """
    coef = dz_coefficients(chunk, scale)
    index, in_block = block_target_index(chunk, cols)
    target_prob = probs.gather(1, index).squeeze(1)
    dz = probs.mul_(coef.prob[:, None])
    target_entry = (coef.prob - coef.target) * target_prob - coef.target * other_prob
    dz.scatter_(1, index, torch.where(in_block, target_entry, coef.prob * target_prob)[:, None])
    if coef.smoothing is not None:
        if chunk.targets.class_weight is None:
            dz.add_(coef.smoothing[:, None])
        else:
            dz.addr_(coef.smoothing, chunk.targets.class_weight[cols])
    return dz


@dataclasses.dataclass(frozen=True)
class DzCoefficients:
    """A chunk's dz, row by row (rows,): ``prob`` times ``p``, the target's entry
    ``(prob - target) * p_y - target * (1 - p_y)``, plus ``smoothing * w_c`` (None without label smoothing);
    each already divided by the rescale, 0 for ignored rows."""

    prob: torch.Tensor
    target: torch.Tensor
    smoothing: torch.Tensor | None


def dz_coefficients(chunk: Chunk, scale: DzScale) -> DzCoefficients:
    """The per-row coefficients of dz (the formula in the module docstring), for the PyTorch ops and the kernels."""
    targets, rows, rescale = chunk.targets, chunk.rows, scale.rescale
    eps, c = targets.label_smoothing, targets.num_classes
    row_scale = torch.where(targets.valid[rows], scale.row_scale / rescale, 0)
    target_coef = row_scale * (1.0 - eps) * targets.row_weight[rows]
    prob_coef = target_coef
    if eps:
        prob_coef = prob_coef + row_scale * (eps / c) * targets.class_weight_sum
    if scale.lse_coef is not None:
        prob_coef = prob_coef + scale.lse_coef / rescale
    return DzCoefficients(prob_coef, target_coef, (-eps / c) * row_scale if eps else None)


def kernel_statistics(z: torch.Tensor, chunk: Chunk, cols: slice = slice(None),
                      previous: RowStatistics | None = None) -> RowStatistics:
    """:func:`chunk_statistics_` (or, for a block of classes, :func:`block_statistics_`) by lce.kernels: one read
    of ``z``, which is left as it is."""
    targets = chunk.targets
    index, in_block = block_target_index(chunk, cols)
    block = RowStatistics(*kernels.row_statistics(
        z, torch.where(in_block, index.squeeze(1), -1),
        class_weight=None if targets.class_weight is None else targets.class_weight[cols],
        weighted_logit_sum=bool(targets.label_smoothing),
        running_max=None if previous is None else previous.row_max))
    if previous is None:
        return block
    carried = (previous.row_max - block.row_max).exp().nan_to_num_(0.0)  # as block_statistics_ folds its blocks
    return RowStatistics(block.row_max, torch.addcmul(block.other, previous.other, carried),
                         torch.where(in_block, block.target_logit, previous.target_logit),
                         None if block.weighted_logit_sum is None
                         else previous.weighted_logit_sum + block.weighted_logit_sum)


def kernel_grad_logits_(z: torch.Tensor, chunk: Chunk, scale: DzScale, shift: torch.Tensor, other_prob: torch.Tensor,
                        cols: slice = slice(None), divisor: torch.Tensor | None = None) -> torch.Tensor:
    """Logits ``z`` (the classes ``cols``) turned into ``dz / scale.rescale`` in place by lce.kernels, with
    ``p = exp(z - shift)`` (``/ divisor`` where given): :func:`chunk_softmax_from_lse_` or the division of
    :func:`chunk_loss_and_softmax_`, then :func:`chunk_grad_logits_`, in one pass."""
    coef = dz_coefficients(chunk, scale)
    index, in_block = block_target_index(chunk, cols)
    class_weight = chunk.targets.class_weight
    return kernels.grad_logits_(z, torch.where(in_block, index.squeeze(1), -1), shift, prob_coef=coef.prob,
                                target_coef=coef.target, other_prob=other_prob, divisor=divisor,
                                smoothing_coef=coef.smoothing,
                                class_weight=None if class_weight is None else class_weight[cols])


@dataclasses.dataclass(frozen=True)
class DzScale:
    """How dz is scaled for one chunk's rows: ``row_scale`` (rows,) is ``s`` before ignored rows are zeroed,
    ``lse_coef`` (rows,) the z-loss's coefficient of ``p`` (None without z-loss), and ``rescale`` the power of
    two dz is divided by before it is rounded for a backward GEMM (:func:`grad_logits_rescale`)."""

    row_scale: torch.Tensor
    rescale: float
    lse_coef: torch.Tensor | None = None


@dataclasses.dataclass(frozen=True)
class RowScales:
    """How the rows of a pass weigh in the gradient.

    ``main`` is the cross-entropy term's ``s``: a 0-dim tensor for the scalar
    reductions (1/sum(w_y) or 1), (N,) incoming gradients for "none". ``z``
    is the z-loss term's ``s_z`` in the same form (1/count of rows that are
    not ignored for "mean"), None without z-loss. ``rescale`` is the pass's
    :func:`grad_logits_rescale` without z-loss, and ``max_main`` the bound it
    was computed from; a z-loss recomputes it per chunk (:meth:`dz_scale`).
    """

    main: torch.Tensor
    z: torch.Tensor | None
    max_main: torch.Tensor | float
    rescale: float

    def dz_scale(self, chunk: Chunk, lse: torch.Tensor) -> DzScale:
        """The chunk's :class:`DzScale`, from its rows' log-sum-exp ``lse`` (which the z-loss term scales)."""
        lse_coef = None
        if self.z is not None:  # the z-loss term's coefficient of p: 2 * z_loss * s_z * lse, 0 for ignored rows
            z_scale = _rows_of(self.z, chunk.rows)
            lse_coef = torch.where(chunk.targets.valid[chunk.rows], (2.0 * chunk.targets.z_loss) * z_scale * lse, 0)
        rescale = self.rescale
        if lse_coef is not None:
            rescale = grad_logits_rescale(chunk.plan, chunk.targets, self.max_main, lse_coef)
        return DzScale(_rows_of(self.main, chunk.rows), rescale, lse_coef)


def _rows_of(scale: torch.Tensor, rows: slice) -> torch.Tensor:
    """A per-row ``scale`` (N,) or 0-dim one for the chunk's rows, as a (rows,) tensor."""
    return scale[rows] if scale.dim() else scale.expand(rows.stop - rows.start)


def grad_logits_rescale(plan: Plan, targets: Targets, max_row_scale: torch.Tensor | float,
                        lse_coef: torch.Tensor | None = None) -> float:
    """The power of two dz is divided by before it is rounded for a backward GEMM; 1.0 if none is needed.

    fp16's smallest normal number is 6.1e-5, while softmax entries are about
    1/C (4e-6 for C = 256k) and "mean" shrinks them by another 1/N, so
    rounding dz to fp16 would flush most of it to subnormals. Every entry of
    dz is bounded by 2 * max_row_scale * max(class weight); scaling that bound
    to just under 2**14 keeps every product finite and leaves 28 binades of
    normal numbers below it. Only plans whose narrow operands are fp16 need
    this (bf16 has fp32's exponent range). The backward GEMMs multiply their
    results by the same power of two, which undoes it exactly. A z-loss adds
    its coefficient of ``p``, ``lse_coef`` (rows,), to the bound.
    """
    if not plan.rescales_grad_logits:
        return 1.0
    max_weight = targets.max_class_weight
    if max_weight is None:
        max_weight = 1.0 if targets.class_weight is None else float(targets.class_weight.abs().max())
    bound = 2.0 * float(max_row_scale) * max_weight
    if lse_coef is not None and lse_coef.numel():
        bound += float(lse_coef.abs().max())
    return grad_logits_rescale_for(bound)


def grad_logits_rescale_for(bound: float) -> float:
    """The power of two that puts a bound on every entry of dz just under 2**14 (1.0 for a bound that is 0 or not
    finite): see :func:`grad_logits_rescale`."""
    if bound > 0 and math.isfinite(bound):
        return 2.0 ** (math.ceil(math.log2(bound)) - 14)
    return 1.0


@dataclasses.dataclass(frozen=True)
class ScalarReduction:
    """How "mean"/"sum" weigh the rows: the gradients' :class:`RowScales`, and the loss's normalisers in fp64:
    ``total_weight`` (sum of ``w_y``) and the z-term's ``z_scale`` (1/count of rows not ignored for "mean", 1
    for "sum"; None without z-loss)."""

    scales: RowScales
    total_weight: torch.Tensor
    z_scale: torch.Tensor | None

    @classmethod
    def of(cls, plan: Plan, targets: Targets, with_grads: bool) -> ScalarReduction:
        device = targets.valid.device
        total_weight = targets.row_weight.sum(dtype=torch.float64)
        mean = plan.reduction == "mean"
        # An all-ignored batch has a 0/0 = NaN loss but must get zero gradients.
        ones = torch.ones((), dtype=torch.float64, device=device)
        main_scale = torch.where(total_weight > 0, 1.0 / total_weight, 0.0) if mean else ones
        z_scale = None
        if targets.z_loss:
            count = targets.valid.sum(dtype=torch.float64)
            z_scale = torch.where(count > 0, 1.0 / count, 0.0) if mean else ones
        main = main_scale.to(plan.stats_dtype)
        rescale = grad_logits_rescale(plan, targets, main) if with_grads else 1.0
        z = None if z_scale is None else z_scale.to(plan.stats_dtype)
        return cls(RowScales(main, z, main, rescale), total_weight, z_scale)

    def loss(self, plan: Plan, targets: Targets, loss_sum: torch.Tensor, z_sum: torch.Tensor) -> torch.Tensor:
        """The reduced loss in the plan's loss dtype, from the fp64 sums of the row losses and of ``lse**2``."""
        loss = loss_sum / self.total_weight if plan.reduction == "mean" else loss_sum
        if self.z_scale is not None:
            loss = loss + targets.z_loss * z_sum * self.z_scale
        return loss.to(plan.output_loss_dtype)


@dataclasses.dataclass
class ChunkResult:
    """What a chunk of a scalar reduction returns: its loss sum (fp64) and its rows' log-sum-exp."""

    loss_sum: torch.Tensor
    lse: torch.Tensor


# ---- soft-capping: statistics and dz from cap * t, a workspace of columns at a time ---------------

def cap_logits_(z: torch.Tensor, softcap: float) -> torch.Tensor:
    """``z <- tanh(z / softcap)`` in place: the buffer then holds ``t``, with the capped logits ``softcap * t``."""
    return z.div_(softcap).tanh_()


def _capped_chunk_statistics(z: torch.Tensor, chunk: Chunk) -> tuple[RowStatistics, torch.Tensor]:
    """The statistics of a chunk's soft-capped logits over every class, from its raw logits ``z``, and ``z``
    turned into ``t`` for :func:`capped_grad_logits_`."""
    t = cap_logits_(z, chunk.plan.softcap)
    return capped_statistics(t, chunk, chunk.all_classes, None), t


def capped_statistics(t: torch.Tensor, chunk: Chunk, cols: slice, previous: RowStatistics | None) -> RowStatistics:
    """Fold the soft-capped logits ``softcap * t`` of the classes ``cols`` into the statistics of the chunk's rows,
    a workspace of columns at a time; ``t`` is left as it is."""
    stats, softcap = previous, chunk.plan.softcap
    for classes, columns in column_blocks(chunk.plan, cols):
        stats = block_statistics_(t[:, columns] * softcap, chunk, classes, stats)
    return stats


def capped_grad_logits_(t: torch.Tensor, chunk: Chunk, cols: slice, lse: torch.Tensor, other_prob: torch.Tensor,
                        scale: DzScale) -> torch.Tensor:
    """Turn ``t`` (the classes ``cols``) into the gradient with respect to the raw logits, ``/ scale.rescale``,
    in place.

    Per workspace of columns: ``p = exp(softcap * t - lse)``, dz from it as in
    :func:`chunk_grad_logits_`, then ``t <- (1 - t**2) * dz``, the chain rule
    through the cap.
    """
    softcap = chunk.plan.softcap
    for classes, columns in column_blocks(chunk.plan, cols):
        probs = (t[:, columns] * softcap).sub_(lse[:, None]).exp_()
        dz = chunk_grad_logits_(probs, chunk, other_prob, scale, classes)
        t[:, columns].square_().sub_(1.0).mul_(dz).neg_()
        del probs, dz  # one workspace at a time: the next one is made before a reassignment would free this
    return t


def column_blocks(plan: Plan, cols: slice) -> Iterator[tuple[slice, slice]]:
    """The sub-blocks of the classes ``cols`` the soft-capped workspace covers, each as (classes, buffer columns)."""
    width = plan.workspace_columns
    for start in range(cols.start, cols.stop, width):
        stop = min(start + width, cols.stop)
        yield slice(start, stop), slice(start - cols.start, stop - cols.start)


# ---- gradients summed over chunks ---------------------------------------------------------------

class GradientSums:
    """The requested gradients of one call while the chunks add to them, and their rounding at the end.

    ``input`` (N, D) in the input dtype receives each chunk's rows; ``weight``
    (C, D) and ``bias`` (C,) are sums over chunks in the plan's
    ``weight_grad_sum_dtype`` and stats dtype. Each is None when not requested.
    ``wide_input_partials``: a block's input-gradient product is formed in the
    dtype of the sum it is added to (the stats dtype), not rounded to the
    plan's GEMM result first, for sums that another process completes
    (a :class:`GroupReduction`).
    """

    def __init__(self, plan: Plan, head: HeadTensors, *, wide_input_partials: bool = False,
                 scaled_output: bool = False):
        self.plan = plan
        self.wide_input_partials = wide_input_partials
        n, d = head.input.shape
        c, device = plan.num_classes, head.input.device
        wanted = plan.needs_grad
        self.input = torch.empty(n, d, dtype=plan.input_dtype, device=device) if wanted.input else None
        self.weight = torch.zeros(c, d, dtype=plan.weight_grad_sum_dtype, device=device) if wanted.weight else None
        self.bias = torch.zeros(c, dtype=plan.stats_dtype, device=device) if wanted.bias else None
        # fp16 headroom (lce.passes.headroom): running fp16 sums always; scaled outputs where backward unscales them
        self.headroom = plan.gradient_headroom
        self.scaled_output = scaled_output and self.headroom
        narrow_sum = self.weight is not None and self.weight.dtype == torch.float16 and self.headroom
        self._weight_sum = RunningSum(self.weight) if narrow_sum else None
        self._input_scales: list[tuple[slice, float]] = []
        self._weight_max: float | None = None

    def add_chunk(self, chunk: Chunk, dz: torch.Tensor, rescale: float, cols: slice = slice(None),
                  input_sum: torch.Tensor | None = None) -> None:
        """Add the chunk's products: ``grad_input[rows] = dz @ W``, ``grad_weight += dz.T @ x``,
        ``grad_bias += dz.sum(0)``, each GEMM in the plan's precision.

        ``dz`` is the chunk's ``dz / rescale`` (stats dtype); every product is
        multiplied by ``rescale`` before it is rounded or added. For a block
        of classes ``cols`` (class tiling), ``dz`` holds those columns, the
        weight and bias gradients get their rows ``cols``, and the input
        gradient's product is added to ``input_sum`` (rows, D) in the stats
        dtype, which the caller rounds into ``grad_input[rows]`` after the last block.
        """
        plan, head, rows, weight = self.plan, chunk.head, chunk.rows, chunk.head.weight[cols]
        rounded: dict[torch.dtype, torch.Tensor] = {dz.dtype: dz}

        def dz_as(dtype: torch.dtype) -> torch.Tensor:
            """dz rounded to a GEMM's operand dtype, at most once per dtype and chunk."""
            if dtype not in rounded:
                rounded[dtype] = dz.to(dtype)
            return rounded[dtype]

        if self.input is not None:
            operands, result = plan.gemm_dtypes("grad_input")
            correction = TargetResidual.of(chunk, dz, dz_as(operands), cols).input_correction(weight)
            if input_sum is not None and plan.sums_input_blocks_in_place:  # one GEMM into the fp32 sum
                torch.addmm(input_sum, dz_as(operands), weight, out_dtype=input_sum.dtype, alpha=rescale,
                            out=input_sum)
                if correction is not None:
                    input_sum.add_(correction, alpha=rescale)
            elif input_sum is not None and self.wide_input_partials:
                input_sum.add_(self._grad_input_product(dz_as(operands), weight, rescale, input_sum.dtype,
                                                        addend=correction))
            elif input_sum is not None:
                input_sum.add_(self._grad_input_product(dz_as(operands), weight, rescale,
                                                        addend=correction).to(input_sum.dtype))
            else:
                scale = self._input_rows_scale(dz, weight, rescale)
                self._input_scales.append((rows, scale))
                if plan.upcasts_weight_for("grad_input") or result != plan.input_dtype:
                    self.input[rows].copy_(self._grad_input_product(dz_as(operands), weight, rescale * scale,
                                                                    addend=correction))
                else:
                    mm(dz_as(operands), weight, result, out=self.input[rows], alpha=rescale * scale,
                       in_fp32=plan.gemm_in_fp32("grad_input"), addend=correction)
            del correction  # freed before the weight gradient's step, as lce.planning.memory_model says
        if self.weight is not None:
            operands, product = plan.gemm_dtypes("grad_weight")
            x = head.input[rows] if operands == plan.input_dtype else chunk.x_in_acc
            alpha, product_scale = rescale, 1.0
            if self.headroom and (self._weight_sum is not None or product == torch.float16):
                # a bound on the product's entries: max over classes of sum_i |dz_ic|, times max |x|
                bound = rescale * largest_entry(torch.linalg.vector_norm(dz, ord=1, dim=0)) * largest_entry(x)
                if self._weight_sum is not None:
                    alpha = rescale * self._weight_sum.scale_for(bound)
                else:  # a narrow product added to a wide sum: scaled for its rounding, unscaled in the add
                    product_scale = power_of_two_under(STORE_LIMIT, bound)
                    alpha = rescale * product_scale
            corrected = False
            if plan.target_residual_to_weight:  # added before the product, which then rounds the sum once
                target = TargetResidual.of(chunk, dz, dz_as(operands), cols)
                corrected = target.add_to_weight_rows_(self.weight[cols], head.input[rows], rescale)
            add_mm_(self.weight[cols], dz_as(operands).T, x, product, alpha=alpha,
                    in_fp32=plan.gemm_in_fp32("grad_weight"), product_scale=product_scale,
                    device_kind=plan.device_kind, mixed_addmm=plan.mixed_addmm,
                    fresh=plan.num_chunks == 1 and not corrected)
        if self.bias is not None:
            self.bias[cols].add_(dz.sum(0), alpha=rescale)

    def _grad_input_product(self, dz: torch.Tensor, weight: torch.Tensor, rescale: float,
                            result: torch.dtype | None = None, addend: torch.Tensor | None = None) -> torch.Tensor:
        """``rescale * (dz @ weight + addend)`` in the plan's grad_input precision (or with the wider ``result``),
        as a new (rows, D) tensor."""
        if self.plan.upcasts_weight_for("grad_input"):
            product = mm_upcast_weight(dz, weight, alpha=rescale, device_kind=self.plan.device_kind)
            product = product if addend is None else product.add_(addend, alpha=rescale)
            return product if result is None or product.dtype == result else product.to(result)
        return mm(dz, weight, result or self.plan.gemm_dtypes("grad_input").result, alpha=rescale,
                  in_fp32=self.plan.gemm_in_fp32("grad_input"), addend=addend)

    def _input_rows_scale(self, dz: torch.Tensor, weight: torch.Tensor, rescale: float) -> float:
        """The power of two a chunk's input-gradient rows are stored scaled by (1.0 unless scaled output): from
        the bound ``max_i sum_c |dz_ic| * max |W|``."""
        if not self.scaled_output:
            return 1.0
        if self._weight_max is None:
            self._weight_max = largest_entry(weight)
        row_sums = torch.linalg.vector_norm(dz, ord=1, dim=1)
        return power_of_two_under(STORE_LIMIT, rescale * largest_entry(row_sums) * self._weight_max)

    def round_input_rows(self, rows: slice, input_sum: torch.Tensor) -> None:
        """Round a chunk's input-gradient rows, summed over class blocks in ``input_sum`` (stats dtype), into the
        input gradient (scaled by its largest entry under scaled output; ``input_sum`` is consumed)."""
        scale = 1.0
        if self.scaled_output:
            scale = power_of_two_under(STORE_LIMIT, largest_entry(input_sum))
            input_sum.mul_(scale)
        self._input_scales.append((rows, scale))
        self.input[rows].copy_(input_sum)

    def finish(self) -> Gradients:
        """Round the sums to the input dtype, once, and hand out the gradients (the sum itself where it already
        has that dtype): under scaled output with the powers of two they are stored scaled by
        (:class:`GradientScales`); otherwise at their size."""
        dtype = self.plan.input_dtype
        grads = Gradients(input=self.input)
        weight_scale = bias_scale = 1.0
        if self.weight is not None:
            if self._weight_sum is not None:
                grads.weight, weight_scale = self.weight, self._weight_sum.scale or 1.0
            elif self.scaled_output:
                grads.weight, weight_scale = scale_to_fit(self.weight, dtype)
            else:
                grads.weight = self.weight.to(dtype)
            self.weight = None  # a separate accumulator is freed now, not when the sums object goes
            if not self.scaled_output and weight_scale != 1.0:  # the running sum's scale, divided out here
                grads.weight.mul_(1.0 / weight_scale)
                weight_scale = 1.0
        if self.bias is not None:
            if self.scaled_output:
                grads.bias, bias_scale = scale_to_fit(self.bias, dtype)
            else:
                grads.bias = self.bias.to(dtype)
        if self.scaled_output:
            grads.scales = GradientScales(_runs(self._input_scales), weight_scale, bias_scale)
        return grads


@dataclasses.dataclass(frozen=True)
class TargetResidual:
    """What rounding dz for a backward GEMM lost at each row's target entry, carried past the rounding.

    A row's target entry is its largest in magnitude (``s (p_y - 1)`` against ``s p_c`` elsewhere), so rounding it
    to a GEMM's bf16/fp16 operand costs the most: where the row's products cancel (few classes, or logits that
    nearly agree) that one rounding can dominate the gradient's error. The residual ``dz_y - round(dz_y)`` is exact
    in the stats dtype and at most half an ulp of the entry, so its product with the target's weight row (the
    input gradient's correction) costs only a rounding of that small term in the input dtype, and is added in the
    GEMM's own sum before its one rounding; its product with the row's input (the target's weight-gradient row)
    goes into the accumulator where that is wider than the operands. The target entry then counts at about twice
    the operand dtype's precision, the other entries as rounded. ``index`` (rows,) is each row's target within the
    block ``cols``, ``residual`` (rows,) 0 where the target lies outside it; both None where dz was not rounded."""

    index: torch.Tensor | None
    residual: torch.Tensor | None

    @classmethod
    def of(cls, chunk: Chunk, dz: torch.Tensor, rounded: torch.Tensor, cols: slice) -> TargetResidual:
        if rounded.dtype == dz.dtype:
            return cls(None, None)
        index, in_block = block_target_index(chunk, cols)
        lost = dz.gather(1, index).squeeze(1) - rounded.gather(1, index).squeeze(1).to(dz.dtype)
        return cls(index.squeeze(1), torch.where(in_block, lost, 0))

    def input_correction(self, weight: torch.Tensor) -> torch.Tensor | None:
        """``residual * weight[target]`` (rows, D) in the weight's dtype, in dz's units; None where nothing was
        lost."""
        if self.residual is None:
            return None
        return weight[self.index].mul_(self.residual[:, None].to(weight.dtype))

    def add_to_weight_rows_(self, weight_sum: torch.Tensor, x: torch.Tensor, alpha: float) -> bool:
        """Add ``alpha * residual_i * x_i`` to the weight-gradient row of each row's target, in ``weight_sum``
        (the block's (classes, D) rows of the sum), with no atomic accumulation; False where nothing was lost.

        Rows are taken :data:`TARGET_ROWS_PER_GEMM` at a time. Within such a block, the rows that share a target
        are summed by one fp32 GEMM against their indicator matrix (``members[i, j] = 1`` where rows ``i`` and
        ``j`` share a target), and every row of a class writes that class's sum taken from its first row in the
        block: a class row is written with the same bits by each of its rows, so the order of the writes cannot
        matter (``index_copy_`` with repeated indices, repeated values). Each product ``residual_i * x_i`` and
        each sum is fp32, added to the sum's row and rounded once to its dtype. Cost: ``2 b^2 D`` flops per block
        of ``b`` rows (``b / 1.5 C`` of the chunk's three GEMMs at C classes), and an fp32 ``(b, b)`` matrix and
        two ``(b, D)`` ones besides (:mod:`lce.planning.memory_model`'s ``grad_weight_target`` step)."""
        if self.residual is None:
            return False
        for start in range(0, x.shape[0], TARGET_ROWS_PER_GEMM):
            rows = slice(start, start + TARGET_ROWS_PER_GEMM)
            index, products = self.index[rows], torch.mul(x[rows], self.residual[rows, None].to(torch.float32))
            members = torch.empty(index.shape[0], index.shape[0], dtype=torch.float32, device=x.device)
            torch.eq(index[:, None], index[None, :], out=members)
            first = members.argmax(dim=1)  # each row's first row with the same target (argmax: the first maximum)
            class_sums = members @ products
            del members, products
            written = class_sums[first].mul_(alpha)  # the same bits for every row of a class
            del class_sums
            written.add_(weight_sum.index_select(0, index))
            weight_sum.index_copy_(0, index, written if written.dtype == weight_sum.dtype
                                   else written.to(weight_sum.dtype))
        return True



def _runs(scales: list[tuple[slice, float]]) -> tuple[tuple[slice, float], ...]:
    """Consecutive row ranges with the same scale, merged."""
    runs: list[tuple[slice, float]] = []
    for rows, scale in sorted(scales, key=lambda item: item[0].start):
        if runs and runs[-1][1] == scale and runs[-1][0].stop == rows.start:
            runs[-1] = (slice(runs[-1][0].start, rows.stop), scale)
        else:
            runs.append((rows, scale))
    return tuple(runs)
