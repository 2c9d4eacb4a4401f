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

This module holds the three passes -- :func:`scalar_loss_and_grads` ("mean"/"sum": loss and gradients in one
pass), :func:`per_row_loss` and :func:`per_row_grads` ("none": forward, then backward recomputing the logits) --
and the body of one chunk of each, whole-vocabulary and class-tiled (a statistics sweep over blocks of classes,
then a gradient sweep). Each body reads like the math: the logits (:func:`lce.passes.chunk.chunk_logits`), the row
statistics and the loss (:mod:`lce.passes.statistics`), dz (:mod:`lce.passes.grad_logits`) -- both through the
call's backend (:mod:`lce.passes.backend`: the PyTorch ops or the Triton kernels, chosen once) --, then the three
products summed over chunks and rounded once (:mod:`lce.passes.gradients`). Every dtype comes from the
:class:`~lce.planning.plan.Plan`; the GEMMs run through :mod:`lce.passes.gemm`. Each pass runs a chunk inside a
function of its own, so a chunk's buffers are freed before the next chunk allocates its own.

A pass whose classes are split across processes (:mod:`lce.distributed`) is the
same pass given a :class:`GroupReduction`: it completes each chunk's row
statistics and input-gradient sum across the group, and such a pass always
sweeps statistics before gradients, as class tiling does.
"""

from __future__ import annotations

import dataclasses
import functools

import torch

from .. import kernels
from ..planning.plan import LOSS_SUM_DTYPE, Plan
from .chunk import Chunk, HeadTensors, Targets, block_logits, chunk_logits
from .grad_logits import RowScales, grad_logits_rescale
from .gradients import Gradients, GradientSums
from .loop import ChunkLoop, GroupReduction
from .statistics import RowStatistics, squared_lse

__all__ = ["scalar_loss_and_grads", "per_row_loss", "per_row_grads", "ScalarReduction", "ChunkResult"]


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
    n, device = plan.loop_rows, head.input.device  # per-row outputs: a batch-invariant plan's padded rows included
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
            z_sum += squared_lse(result.lse, targets, rows).sum(dtype=LOSS_SUM_DTYPE)
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
    n, device = plan.loop_rows, head.input.device  # a batch-invariant plan's padded rows included
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
            row_losses = row_losses + targets.z_loss * squared_lse(stats.lse, targets, rows)
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
    chunk, backend = loop.chunk(rows), loop.backend
    z = chunk_logits(chunk)
    stats = backend.statistics_(z, chunk)
    if loop.sums is not None:
        scale = loop.scales.dz_scale(chunk, stats.lse)
        loop.sums.add_chunk(chunk, backend.grad_logits_after_statistics_(z, chunk, stats, scale), scale.rescale)
    return ChunkResult(stats.losses(chunk.targets, rows).sum(dtype=LOSS_SUM_DTYPE), stats.lse)


def _per_row_loss_chunk(loop: ChunkLoop, rows: slice) -> RowStatistics:
    """One chunk of forward for reduction="none": its rows' statistics, from which the pass takes the rest."""
    chunk = loop.chunk(rows)
    z = chunk_logits(chunk)
    chunk = chunk.without_input_in_acc()  # not needed past the logits GEMM: freed before the statistics
    return loop.backend.statistics_(z, chunk)


def _per_row_grad_chunk(loop: ChunkLoop, rows: slice, lse: torch.Tensor, other_prob: torch.Tensor | None) -> None:
    """One chunk of backward for reduction="none": ``lse`` and ``other_prob`` are the chunk's rows of what
    :func:`per_row_loss` saved (``other_prob`` only where the plan saves it)."""
    chunk = loop.chunk(rows)
    z = chunk_logits(chunk)
    scale = loop.scales.dz_scale(chunk, lse)
    loop.sums.add_chunk(chunk, loop.backend.grad_logits_(z, chunk, scale, lse, other_prob), scale.rescale)


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
    stats = None
    for cols in chunk.plan.class_chunks():
        z = block_logits(chunk, cols)
        stats = loop.backend.statistics_(z, chunk, cols, stats)
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
        dz = loop.backend.grad_logits_(z, chunk, scale, lse, other_prob, cols)
        sums.add_chunk(chunk, dz, scale.rescale, cols, input_sum)
        del z, dz  # one block alive at a time (dz is z, turned into the gradient in place)
    if input_sum is not None:
        if loop.group is not None:
            loop.group.complete_input_sum(input_sum)
        sums.round_input_rows(chunk.rows, input_sum)


# ---- how the scalar reductions weigh rows and sum losses -----------------------------------------

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
