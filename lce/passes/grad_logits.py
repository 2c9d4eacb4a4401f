"""dz, the gradient with respect to a chunk's logits, with the PyTorch ops: its per-row coefficients and scales.

The formula is :mod:`lce.passes.loss`'s. :class:`RowScales` says how the rows of a pass weigh in the gradient and
:class:`DzScale` how one chunk's dz is scaled (its rows' ``s``, the z-loss's coefficient of ``p``, and the power of
two that keeps an fp16 dz in range, :func:`grad_logits_rescale`); :func:`dz_coefficients` turns them into the
per-row coefficients both backends use, :func:`chunk_grad_logits_` forms dz from the softmax in place, and
:func:`capped_grad_logits_` through a soft cap.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from ..planning.plan import Plan
from .chunk import Chunk, Targets, block_target_index, column_blocks

__all__ = ["DzScale", "RowScales", "DzCoefficients", "dz_coefficients", "chunk_grad_logits_", "capped_grad_logits_",
           "grad_logits_rescale", "grad_logits_rescale_for"]


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
