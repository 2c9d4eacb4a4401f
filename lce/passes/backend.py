"""The backend of a chunk's elementwise passes, chosen once per call from its plan: the same three methods done with
the PyTorch ops (the reference, every CPU), the PyTorch ops through a soft cap, or :mod:`lce.kernels`' Triton
kernels (CUDA).

A chunk's logits ``z`` become its row statistics and then dz in place. Every backend answers:

* :meth:`statistics_` -- the rows' :class:`~lce.passes.statistics.RowStatistics` over a block of classes, folded
  into the previous blocks' (every class at once without class tiling). ``z`` is spent: what it holds after is the
  backend's own, good only for :meth:`grad_logits_after_statistics_` of the same chunk;
* :meth:`grad_logits_after_statistics_` -- dz over every class, from ``z`` as :meth:`statistics_` left it and the
  statistics it returned (the scalar reductions' one pass: the PyTorch ops reuse the exponentials, the kernels
  read the logits again);
* :meth:`grad_logits_` -- dz of a block of classes from its fresh logits and the rows' ``lse`` (the class-tiled
  gradient sweep, and reduction "none"'s backward), with ``1 - p_y`` given (saved, or whole rows' statistics
  reduced across a group) or, over every class, formed here.

:func:`backend_for` picks one from the plan (:attr:`~lce.planning.plan.Plan.fused_passes`, soft-capping); the chunk
loop calls only these methods, never a test of which backend it has. The arithmetic is the same in each: the
kernels replace sequences of the PyTorch ops (their module says how exactly).
"""

from __future__ import annotations

import torch

from .. import kernels
from ..planning.plan import Plan
from .chunk import Chunk, block_target_index
from .grad_logits import DzScale, capped_grad_logits_, chunk_grad_logits_, dz_coefficients
from .statistics import (
    RowStatistics,
    block_statistics_,
    cap_logits_,
    capped_statistics,
    carry_factor,
    chunk_softmax_from_lse_,
    chunk_statistics_,
)

__all__ = ["TorchOps", "CappedTorchOps", "TritonKernels", "backend_for"]

EVERY_CLASS = slice(None)


def _bounds(chunk: Chunk, cols: slice) -> slice:
    """``cols`` with its bounds spelled out (the workspace of columns walks them)."""
    return chunk.all_classes if cols == EVERY_CLASS else cols


class TorchOps:
    """The elementwise passes as PyTorch ops: the reference, and what runs on every CPU."""

    name = "PyTorch ops"

    def statistics_(self, z: torch.Tensor, chunk: Chunk, cols: slice = EVERY_CLASS,
                    previous: RowStatistics | None = None) -> RowStatistics:
        """See the module docstring; ``z`` is left holding ``exp(z - row_max)`` (every class) or spent."""
        if cols == EVERY_CLASS and previous is None:
            return chunk_statistics_(z, chunk)
        return block_statistics_(z, chunk, cols, previous)

    def grad_logits_after_statistics_(self, z: torch.Tensor, chunk: Chunk, stats: RowStatistics,
                                      scale: DzScale) -> torch.Tensor:
        z.div_(stats.sum_exp[:, None])  # the exponentials statistics_ left become p
        return chunk_grad_logits_(z, chunk, stats.other_prob, scale)

    def grad_logits_(self, z: torch.Tensor, chunk: Chunk, scale: DzScale, lse: torch.Tensor,
                     other_prob: torch.Tensor | None, cols: slice = EVERY_CLASS) -> torch.Tensor:
        if other_prob is None:  # every class: 1 - p_y summed without the target, beside p
            probs, other_prob = chunk_softmax_from_lse_(z, chunk, lse)
        else:
            probs = z.sub_(lse[:, None]).exp_()
        return chunk_grad_logits_(probs, chunk, other_prob, scale, cols)


class CappedTorchOps:
    """The elementwise passes of soft-capped logits ``cap * tanh(z / cap)`` as PyTorch ops: the buffer keeps
    ``t = tanh(z / cap)``, statistics and dz are formed a workspace of columns at a time, and dz is taken through
    the cap in the buffer itself (:func:`~lce.passes.statistics.capped_statistics`,
    :func:`~lce.passes.grad_logits.capped_grad_logits_`). The kernels do not cover it."""

    name = "PyTorch ops, soft-capped"

    def __init__(self, softcap: float):
        self.softcap = softcap

    def statistics_(self, z: torch.Tensor, chunk: Chunk, cols: slice = EVERY_CLASS,
                    previous: RowStatistics | None = None) -> RowStatistics:
        return capped_statistics(cap_logits_(z, self.softcap), chunk, _bounds(chunk, cols), previous)

    def grad_logits_after_statistics_(self, z: torch.Tensor, chunk: Chunk, stats: RowStatistics,
                                      scale: DzScale) -> torch.Tensor:
        return capped_grad_logits_(z, chunk, chunk.all_classes, stats.lse, stats.other_prob, scale)

    def grad_logits_(self, z: torch.Tensor, chunk: Chunk, scale: DzScale, lse: torch.Tensor,
                     other_prob: torch.Tensor | None, cols: slice = EVERY_CLASS) -> torch.Tensor:
        if other_prob is None:
            raise ValueError("soft-capped dz needs 1 - p_y from the forward statistics (a capped plan saves it)")
        return capped_grad_logits_(cap_logits_(z, self.softcap), chunk, _bounds(chunk, cols), lse, other_prob,
                                   scale)


class TritonKernels:
    """The elementwise passes as :mod:`lce.kernels`' two Triton kernels: statistics in one read of ``z``, which
    it leaves as it is, and dz in one read and one write; the per-row coefficients from
    :func:`~lce.passes.grad_logits.dz_coefficients`, as the PyTorch ops use them."""

    name = "Triton kernels"

    def statistics_(self, z: torch.Tensor, chunk: Chunk, cols: slice = EVERY_CLASS,
                    previous: RowStatistics | None = None) -> RowStatistics:
        return kernel_statistics(z, chunk, cols, previous)

    def grad_logits_after_statistics_(self, z: torch.Tensor, chunk: Chunk, stats: RowStatistics,
                                      scale: DzScale) -> torch.Tensor:
        return kernel_grad_logits_(z, chunk, scale, stats.row_max, stats.other_prob, divisor=stats.sum_exp)

    def grad_logits_(self, z: torch.Tensor, chunk: Chunk, scale: DzScale, lse: torch.Tensor,
                     other_prob: torch.Tensor | None, cols: slice = EVERY_CLASS) -> torch.Tensor:
        if other_prob is None:
            other_prob = kernels.sum_apart_from_target(z, chunk.targets.safe_target[chunk.rows], lse)
        return kernel_grad_logits_(z, chunk, scale, lse, other_prob, cols)


Backend = TorchOps | CappedTorchOps | TritonKernels


def backend_for(plan: Plan) -> Backend:
    """The backend a call runs, as its plan says: the kernels where :attr:`~lce.planning.plan.Plan.fused_passes`,
    the capped PyTorch ops with a soft cap (which the kernels do not cover), the PyTorch ops otherwise."""
    if plan.softcap is not None:
        return CappedTorchOps(plan.softcap)
    return TritonKernels() if plan.fused_passes else TorchOps()


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
    carried = carry_factor(previous.row_max, block.row_max)  # as block_statistics_ folds its blocks
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
