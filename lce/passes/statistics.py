"""A chunk's softmax statistics, with the PyTorch ops: the row maximum, the sum of exponentials without the target,
the target's logit, and the losses that follow from them.

:class:`RowStatistics` holds them and gives ``lse``, ``1 - p_y`` and the per-row losses; :func:`chunk_statistics_`
forms them over every class, :func:`block_statistics_` folds a block of classes into a running set (the online
log-sum-exp: :func:`carry_factor`, the one rescale every fold in lce uses), and :func:`capped_statistics` does the
same for soft-capped logits a workspace of columns at a time. The target's term stays out of every sum, so
``1 - p_y`` is never a difference (a confident row keeps fp32's relative precision).
"""

from __future__ import annotations

import dataclasses
import math

import torch

from .chunk import Chunk, Targets, block_target_index, column_blocks

__all__ = ["RowStatistics", "carry_factor", "squared_lse", "chunk_loss_and_softmax_", "chunk_statistics_",
           "chunk_softmax_from_lse_", "block_statistics_", "cap_logits_", "capped_statistics"]


def carry_factor(old_max: torch.Tensor, new_max: torch.Tensor) -> torch.Tensor:
    """``exp(old_max - new_max)``: what a sum of ``exp(z - old_max)`` is multiplied by to become a sum of
    ``exp(z - new_max)`` (``new_max >= old_max``), the online log-sum-exp's one rescale. 0 where nothing had been
    gathered (``old_max`` -inf, including -inf - -inf, a row whose blocks so far were all -inf). Every fold of
    running statistics in lce -- blocks of classes, processes of a group, the per-token log-probabilities, an
    integration's own summaries -- rescales through it."""
    return (old_max - new_max).exp().nan_to_num_(0.0)


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


def squared_lse(lse: torch.Tensor, targets: Targets, rows: slice) -> torch.Tensor:
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
    carried = carry_factor(previous.row_max, row_max)
    return RowStatistics(
        row_max,
        torch.addcmul(other, previous.other, carried),
        torch.where(in_block, block_target, previous.target_logit),
        None if weighted is None else previous.weighted_logit_sum + weighted,
    )


def cap_logits_(z: torch.Tensor, softcap: float) -> torch.Tensor:
    """``z <- tanh(z / softcap)`` in place: the buffer then holds ``t``, with the capped logits ``softcap * t``."""
    return z.div_(softcap).tanh_()


def capped_statistics(t: torch.Tensor, chunk: Chunk, cols: slice, previous: RowStatistics | None) -> RowStatistics:
    """Fold the soft-capped logits ``softcap * t`` of the classes ``cols`` into the statistics of the chunk's rows,
    a workspace of columns at a time; ``t`` is left as it is."""
    stats, softcap = previous, chunk.plan.softcap
    for classes, columns in column_blocks(chunk.plan, cols):
        stats = block_statistics_(t[:, columns] * softcap, chunk, classes, stats)
    return stats
