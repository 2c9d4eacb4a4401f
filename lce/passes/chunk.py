"""One chunk of a pass and what its pieces read: the head's tensors, the targets, the chunk's rows, and its logits.

:class:`HeadTensors` and :class:`Targets` are what a call hands every pass; :class:`Chunk` is one chunk of rows of
it; :func:`chunk_logits` and :func:`block_logits` form a chunk's logits ``z = x @ W.T + b`` (every class, or a
block of classes) in the plan's precision; :func:`block_target_index` says where each row's target falls in a
block, and :func:`column_blocks` cuts a block into the workspace's columns (soft-capping, the per-token
log-probabilities).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import torch

from ..planning.plan import Plan
from .gemm import mm, mm_upcast_weight_t

__all__ = ["HeadTensors", "Targets", "Chunk", "pad_rows", "input_rows", "chunk_logits", "block_logits",
           "block_target_index", "column_blocks"]


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


@dataclasses.dataclass(frozen=True)
class Chunk:
    """One chunk of rows and what its pieces read: the pass's plan, head, bias for the logits and targets
    (see :class:`ChunkLoop`), the chunk's ``rows``, its input rows ``x`` (a view of the head's input, or, for the
    padded last chunk of a batch-invariant plan, a copy with rows of zeros after the real ones) and ``x_in_acc``,
    ``x`` upcast to acc_dtype (for the logits GEMM or the weight-gradient one; None unless
    :attr:`~lce.planning.plan.Plan.input_chunk_in_acc`)."""

    plan: Plan
    head: HeadTensors
    bias: torch.Tensor | None
    targets: Targets
    rows: slice
    x: torch.Tensor
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


def pad_rows(plan: Plan, rows: torch.Tensor, fill: float | int) -> torch.Tensor:
    """``rows`` (N, ...) with ``plan.loop_rows - N`` rows of ``fill`` after them: the rows a batch-invariant plan's
    last chunk is padded with (:attr:`~lce.planning.plan.Plan.padded_rows`), so that every chunk runs the same
    number of rows; ``rows`` itself where the plan pads none. The passes take the call's per-row vectors padded so
    (targets with the ignore index, incoming gradients with 0, temperatures with 1) and return per-row outputs of
    ``loop_rows`` rows, which their callers slice; the input stays as it is (each chunk reads its own rows,
    :attr:`Chunk.x`) and the input gradient has its N rows."""
    extra = plan.loop_rows - rows.shape[0]
    if extra <= 0:
        return rows
    return torch.cat([rows, rows.new_full((extra, *rows.shape[1:]), fill)])


def input_rows(head: HeadTensors, rows: slice) -> torch.Tensor:
    """The head's input rows ``rows``: a view, or, where ``rows`` runs past N (a padded last chunk), a copy with
    rows of zeros after the real ones, so that the chunk's GEMMs run at its full size."""
    x = head.input[rows]
    size = rows.stop - rows.start
    if x.shape[0] == size:
        return x
    padded = x.new_zeros(size, x.shape[1])
    padded[:x.shape[0]].copy_(x)
    return padded


# ---- the logits --------------------------------------------------------------------------------

def chunk_logits(chunk: Chunk) -> torch.Tensor:
    """``z = x @ W.T + b`` for the chunk's rows and every class, in the stats dtype."""
    return block_logits(chunk, slice(None))


def block_logits(chunk: Chunk, cols: slice) -> torch.Tensor:
    """``z = x @ W.T + b`` for the chunk's rows and the block's classes ``cols``, in the stats dtype."""
    plan, weight = chunk.plan, chunk.head.weight[cols]
    if plan.upcasts_weight_for("logits"):
        z = mm_upcast_weight_t(chunk.x_in_acc, weight, plan.device_kind)
    else:
        z = mm(chunk.x, weight.T, plan.gemm_dtypes("logits").result,
               in_fp32=plan.gemm_in_fp32("logits"))
    if chunk.bias is not None:
        z.add_(chunk.bias[cols])
    if z.dtype != plan.stats_dtype:
        z = z.to(plan.stats_dtype)
    return z


def block_target_index(chunk: Chunk, cols: slice) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's target as a column of the block ``cols`` (clamped into it), and whether it lies there."""
    target = chunk.targets.safe_target[chunk.rows]
    start = cols.start or 0
    stop = chunk.targets.num_classes if cols.stop is None else cols.stop
    return (target - start).clamp(0, stop - start - 1)[:, None], (target >= start) & (target < stop)


def column_blocks(plan: Plan, cols: slice) -> Iterator[tuple[slice, slice]]:
    """The sub-blocks of the classes ``cols`` the soft-capped workspace covers, each as (classes, buffer columns)."""
    width = plan.workspace_columns
    for start in range(cols.start, cols.stop, width):
        stop = min(start + width, cols.stop)
        yield slice(start, stop), slice(start - cols.start, stop - cols.start)
