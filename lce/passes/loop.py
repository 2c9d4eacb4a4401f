"""What every chunk of one pass shares (:class:`ChunkLoop`), and the hook by which a pass over a vocabulary split
across processes completes each chunk (:class:`GroupReduction`)."""

from __future__ import annotations

import dataclasses
from typing import Protocol

import torch

from ..planning.plan import Plan
from .backend import Backend, TorchOps, backend_for
from .chunk import Chunk, HeadTensors, Targets, input_rows
from .grad_logits import RowScales
from .gradients import GradientSums
from .statistics import RowStatistics

__all__ = ["ChunkLoop", "GroupReduction"]


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
    backend: Backend = dataclasses.field(default_factory=TorchOps)
    """How the chunk's elementwise passes run (:func:`~lce.passes.backend.backend_for`: chosen once per call)."""

    @classmethod
    def of(cls, plan: Plan, head: HeadTensors, targets: Targets, *, sums: GradientSums | None = None,
           scales: RowScales | None = None, group: GroupReduction | None = None) -> ChunkLoop:
        """The loop of one pass, with the head's bias converted for the logits GEMM (once, not per chunk).

        ``head`` holds the call's N rows; ``targets`` (and every per-row vector of the pass) the plan's
        :attr:`~lce.planning.plan.Plan.loop_rows`: a batch-invariant plan's padded by
        :func:`~lce.passes.chunk.pad_rows`. ``ValueError`` otherwise."""
        rows = (head.input.shape[0], targets.valid.shape[0])
        if rows != (plan.num_rows, plan.loop_rows):
            raise ValueError(f"the pass runs {plan.num_rows} input rows and {plan.loop_rows} target rows (the plan's "
                             f"num_rows and loop_rows) but got {rows[0]} and {rows[1]}; pad a batch-invariant call's "
                             "per-row vectors with lce.passes.chunk.pad_rows")
        bias = head.bias.to(plan.gemm_dtypes("logits").result) if head.bias is not None else None
        return cls(plan, head, bias, targets, sums, scales, group, backend_for(plan))

    @property
    def sweeps_statistics_first(self) -> bool:
        """Whether a chunk builds its row statistics over every class before any gradient (its logits computed
        twice): with class tiling, and under a group, whose statistics are complete only once reduced."""
        return self.plan.tiles_classes or self.group is not None

    def chunk(self, rows: slice) -> Chunk:
        """The chunk of ``rows`` (padded past N where the plan pads); its input is upcast to acc_dtype here where
        the plan keeps one."""
        x = input_rows(self.head, rows)
        x_in_acc = x.to(self.plan.acc_dtype) if self.plan.input_chunk_in_acc else None
        return Chunk(self.plan, self.head, self.bias, self.targets, rows, x, x_in_acc)
