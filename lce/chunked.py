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

The pieces, in loop order: :class:`Targets` (``y``, ``w``, ``w_y`` and ``eps``,
computed once per call), :func:`chunk_logits` (``z``),
:func:`chunk_loss_and_softmax_` (``l``, ``lse``, ``p``), :func:`chunk_grad_logits_`
(``dz``) and :meth:`GradientSums.add_chunk` (the three products, summed over
chunks and rounded once by :meth:`GradientSums.finish`). Every dtype comes from
the :class:`~lce.plan.Plan`; the GEMMs run through :mod:`lce.gemm`. Each pass
runs a chunk inside a function of its own, so a chunk's buffers are freed
before the next chunk allocates its own.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator

import torch

from .gemm import add_mm_, mm, mm_upcast_weight, mm_upcast_weight_t
from .plan import LOSS_SUM_DTYPE, Plan

__all__ = [
    "HeadTensors", "Targets", "Gradients", "GradientSums", "bias_for_logits", "chunk_logits",
    "chunk_loss_and_softmax_", "chunk_softmax_from_lse_", "grad_logits_rescale", "chunk_grad_logits_",
    "scalar_loss_and_grads", "RowStatistics", "block_logits", "block_statistics_", "input_chunk_in_acc",
    "block_target_index", "RowScales", "z_loss_coefficient", "cap_logits_", "capped_statistics",
    "capped_grad_logits_", "chunk_statistics_", "ChunkResult", "ScalarReduction", "per_row_loss", "per_row_grads",
]


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
    """

    valid: torch.Tensor
    safe_target: torch.Tensor
    row_weight: torch.Tensor
    class_weight: torch.Tensor | None
    class_weight_sum: torch.Tensor | float
    label_smoothing: float
    num_classes: int
    z_loss: float = 0.0

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


@dataclasses.dataclass
class Gradients:
    input: torch.Tensor | None = None
    weight: torch.Tensor | None = None
    bias: torch.Tensor | None = None


# ---- one chunk ------------------------------------------------------------------------------------

def bias_for_logits(plan: Plan, bias: torch.Tensor | None) -> torch.Tensor | None:
    """The bias in the logits GEMM's result dtype, converted once per call."""
    return bias.to(plan.gemm_dtypes("logits").result) if bias is not None else None


def input_chunk_in_acc(plan: Plan, head: HeadTensors, rows: slice) -> torch.Tensor | None:
    """The chunk's input upcast to acc_dtype, or None unless the plan keeps one (for the logits GEMM or the
    weight-gradient one)."""
    return head.input[rows].to(plan.acc_dtype) if plan.input_chunk_in_acc else None


def block_logits(plan: Plan, head: HeadTensors, bias: torch.Tensor | None, rows: slice, cols: slice,
                 x_in_acc: torch.Tensor | None) -> torch.Tensor:
    """``z = x @ W.T + b`` for the chunk's rows and the block's classes ``cols``, in the stats dtype.

    ``bias`` is ``head.bias`` as :func:`bias_for_logits` converted it; ``x_in_acc`` comes from
    :func:`input_chunk_in_acc`.
    """
    weight = head.weight[cols]
    if plan.upcasts_weight_for("logits"):
        z = mm_upcast_weight_t(x_in_acc, weight)
    else:
        z = mm(head.input[rows], weight.T, plan.gemm_dtypes("logits").result)
    if bias is not None:
        z.add_(bias[cols])
    if z.dtype != plan.stats_dtype:
        z = z.to(plan.stats_dtype)
    return z


def chunk_logits(plan: Plan, head: HeadTensors, bias: torch.Tensor | None,
                 rows: slice) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``z = x @ W.T + b`` for the chunk's rows and every class, in the stats dtype, and the chunk's input
    upcast to acc_dtype (see :func:`input_chunk_in_acc`).

    ``bias`` is ``head.bias`` as :func:`bias_for_logits` converted it.
    """
    x_in_acc = input_chunk_in_acc(plan, head, rows)
    return block_logits(plan, head, bias, rows, slice(None), x_in_acc), x_in_acc


def _exp_apart_from_target_(z: torch.Tensor, targets: Targets, rows: slice, shift: torch.Tensor,
                            target_logit: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``z <- exp(z - shift)`` in place; return ``(other, target)``: the sum over the classes other than
    each row's target and the target's own term.

    ``other`` is summed with the target's entry left out (set to -inf before the
    exp, put back after), so ``1 - p_y`` is never formed as a difference: when
    the target's logit leads by tens of nats, ``p_y`` rounds to 1 in fp32 and
    ``p_y - 1`` or ``lse - z_y`` would lose every digit, while ``other`` keeps
    fp32's relative precision. ``target_logit`` is ``z``'s target entry, if the caller has it already.
    """
    index = targets.safe_target[rows, None]
    if target_logit is None:
        target_logit = z.gather(1, index).squeeze(1)
    target = (target_logit - shift).exp()
    z.sub_(shift[:, None]).scatter_(1, index, -math.inf).exp_()
    other = z.sum(1)
    z.scatter_(1, index, target[:, None])
    return other, target


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

    def squared_lse(self, targets: Targets, rows: slice) -> torch.Tensor:
        """``lse**2`` per row, 0 for ignored rows: the z-loss term before its factor and reduction."""
        return torch.where(targets.valid[rows], self.lse.square(), 0)


def _weighted_logit_sum(z: torch.Tensor, targets: Targets, cols: slice) -> torch.Tensor | None:
    """The smoothing term's ``sum_c w_c z_c`` over the block's classes (None without smoothing)."""
    if not targets.label_smoothing:
        return None
    return z.sum(1) if targets.class_weight is None else z @ targets.class_weight[cols]


def chunk_loss_and_softmax_(z: torch.Tensor, targets: Targets,
                            rows: slice) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The chunk's per-row losses ``l`` (0 for ignored rows), ``lse`` and ``1 - p_y``; leaves ``p`` in ``z``.

    See :class:`RowStatistics` and :func:`_exp_apart_from_target_`.
    """
    stats = chunk_statistics_(z, targets, rows)
    z.div_(stats.sum_exp[:, None])
    return stats.losses(targets, rows), stats.lse, stats.other_prob


def chunk_statistics_(z: torch.Tensor, targets: Targets, rows: slice) -> RowStatistics:
    """The statistics of a chunk's logits ``z`` over every class (``z`` is consumed: it holds exponentials after)."""
    target_logit = z.gather(1, targets.safe_target[rows, None]).squeeze(1)
    weighted_logit_sum = _weighted_logit_sum(z, targets, slice(None))
    row_max = z.amax(1)
    other, _ = _exp_apart_from_target_(z, targets, rows, row_max, target_logit)
    return RowStatistics(row_max, other, target_logit, weighted_logit_sum)


def chunk_softmax_from_lse_(z: torch.Tensor, targets: Targets, rows: slice,
                            lse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``p = exp(z - lse)`` in place (backward of reduction="none") and ``1 - p_y``, summed without the target."""
    other, _ = _exp_apart_from_target_(z, targets, rows, lse)
    return z, other


def grad_logits_rescale(plan: Plan, targets: Targets, max_row_scale: torch.Tensor | float,
                        lse_coef: torch.Tensor | None = None, max_class_weight: float | None = None) -> float:
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
    ``max_class_weight`` overrides the largest class weight ``targets`` hold
    (a shard of the vocabulary holds only its own).
    """
    if not plan.rescales_grad_logits:
        return 1.0
    max_weight = 1.0 if targets.class_weight is None else float(targets.class_weight.abs().max())
    if max_class_weight is not None:
        max_weight = max_class_weight
    bound = 2.0 * float(max_row_scale) * max_weight
    if lse_coef is not None and lse_coef.numel():
        bound += float(lse_coef.abs().max())
    if bound > 0 and math.isfinite(bound):
        return 2.0 ** (math.ceil(math.log2(bound)) - 14)
    return 1.0


def block_target_index(targets: Targets, rows: slice, cols: slice) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's target as a column of the block ``cols`` (clamped into it), and whether it lies there."""
    target = targets.safe_target[rows]
    start = cols.start or 0
    stop = targets.num_classes if cols.stop is None else cols.stop
    return (target - start).clamp(0, stop - start - 1)[:, None], (target >= start) & (target < stop)


def chunk_grad_logits_(probs: torch.Tensor, row_scale: torch.Tensor, targets: Targets, rows: slice,
                       rescale: float, other_prob: torch.Tensor, cols: slice = slice(None),
                       lse_coef: torch.Tensor | None = None) -> torch.Tensor:
    """Turn the chunk's softmax ``probs`` into ``dz / rescale``, in place (the formula in the module docstring).

    ``row_scale`` (rows,) is ``s`` before ignored rows are zeroed; ``rescale``
    comes from :func:`grad_logits_rescale`; ``other_prob`` (rows,) is ``1 - p_y``
    as :func:`chunk_loss_and_softmax_` computed it. The target's entry,
    ``prob_coef * p_y - target_coef``, is written as
    ``(prob_coef - target_coef) * p_y - target_coef * (1 - p_y)``, so it keeps
    its precision when ``p_y`` is within rounding of 1. ``probs`` may hold a
    block of classes ``cols`` only; rows whose target lies outside it get no
    target entry. ``lse_coef`` (rows,) is the z-loss's coefficient of ``p``
    from :func:`z_loss_coefficient` (None without z-loss).
    """
    eps, c = targets.label_smoothing, targets.num_classes
    index, in_block = block_target_index(targets, rows, cols)
    scale = torch.where(targets.valid[rows], row_scale / rescale, 0)
    target_coef = scale * (1.0 - eps) * targets.row_weight[rows]
    prob_coef = target_coef
    if eps:
        prob_coef = prob_coef + scale * (eps / c) * targets.class_weight_sum
    if lse_coef is not None:
        prob_coef = prob_coef + lse_coef / rescale
    target_prob = probs.gather(1, index).squeeze(1)
    dz = probs.mul_(prob_coef[:, None])
    target_entry = (prob_coef - target_coef) * target_prob - target_coef * other_prob
    dz.scatter_(1, index, torch.where(in_block, target_entry, prob_coef * target_prob)[:, None])
    if eps:
        if targets.class_weight is None:
            dz.sub_((eps / c) * scale[:, None])
        else:
            dz.addr_(scale, targets.class_weight[cols], alpha=-eps / c)
    return dz


# ---- gradients summed over chunks ---------------------------------------------------------------

class GradientSums:
    """The requested gradients of one call while the chunks add to them, and their rounding at the end.

    ``input`` (N, D) in the input dtype receives each chunk's rows; ``weight``
    (C, D) and ``bias`` (C,) are sums over chunks in the plan's
    ``weight_grad_sum_dtype`` and stats dtype. Each is None when not requested.
    ``wide_input_partials``: a block's input-gradient product is formed in the
    dtype of the sum it is added to (the stats dtype), not rounded to the
    plan's GEMM result first, for sums that another process completes
    (:mod:`lce.distributed`).
    """

    def __init__(self, plan: Plan, head: HeadTensors, *, wide_input_partials: bool = False):
        self.plan = plan
        self.wide_input_partials = wide_input_partials
        n, d = head.input.shape
        c, device = plan.num_classes, head.input.device
        wanted = plan.needs_grad
        self.input = torch.empty(n, d, dtype=plan.input_dtype, device=device) if wanted.input else None
        self.weight = torch.zeros(c, d, dtype=plan.weight_grad_sum_dtype, device=device) if wanted.weight else None
        self.bias = torch.zeros(c, dtype=plan.stats_dtype, device=device) if wanted.bias else None

    def add_chunk(self, head: HeadTensors, rows: slice, dz: torch.Tensor, x_in_acc: torch.Tensor | None,
                  rescale: float, cols: slice = slice(None), input_sum: torch.Tensor | None = None) -> None:
        """Add the chunk's products: ``grad_input[rows] = dz @ W``, ``grad_weight += dz.T @ x``,
        ``grad_bias += dz.sum(0)``, each GEMM in the plan's precision.

        ``dz`` is the chunk's ``dz / rescale`` (stats dtype); every product is
        multiplied by ``rescale`` before it is rounded or added. ``x_in_acc``
        is the chunk's input in acc_dtype from :func:`input_chunk_in_acc`. For
        a block of classes ``cols`` (class tiling), ``dz`` holds those columns,
        the weight and bias gradients get their rows ``cols``, and the input
        gradient's product is added to ``input_sum`` (rows, D) in the stats
        dtype, which the caller rounds into ``grad_input[rows]`` after the last block.
        """
        plan, weight = self.plan, head.weight[cols]
        rounded: dict[torch.dtype, torch.Tensor] = {dz.dtype: dz}

        def dz_as(dtype: torch.dtype) -> torch.Tensor:
            """dz rounded to a GEMM's operand dtype, at most once per dtype and chunk."""
            if dtype not in rounded:
                rounded[dtype] = dz.to(dtype)
            return rounded[dtype]

        if self.input is not None:
            operands, result = plan.gemm_dtypes("grad_input")
            if input_sum is not None and self.wide_input_partials:
                input_sum.add_(self._grad_input_product(dz_as(operands), weight, rescale, input_sum.dtype))
            elif input_sum is not None:
                input_sum.add_(self._grad_input_product(dz_as(operands), weight, rescale).to(input_sum.dtype))
            elif plan.upcasts_weight_for("grad_input") or result != plan.input_dtype:
                self.input[rows].copy_(self._grad_input_product(dz_as(operands), weight, rescale))
            else:
                mm(dz_as(operands), weight, result, out=self.input[rows], alpha=rescale)
        if self.weight is not None:
            operands, product = plan.gemm_dtypes("grad_weight")
            x = head.input[rows] if operands == plan.input_dtype else x_in_acc
            add_mm_(self.weight[cols], dz_as(operands).T, x, product, alpha=rescale)
        if self.bias is not None:
            self.bias[cols].add_(dz.sum(0), alpha=rescale)

    def _grad_input_product(self, dz: torch.Tensor, weight: torch.Tensor, rescale: float,
                            result: torch.dtype | None = None) -> torch.Tensor:
        """``rescale * dz @ weight`` in the plan's grad_input precision (or with the wider ``result``), as a new
        (rows, D) tensor."""
        if self.plan.upcasts_weight_for("grad_input"):
            product = mm_upcast_weight(dz, weight, alpha=rescale)
            return product if result is None or product.dtype == result else product.to(result)
        return mm(dz, weight, result or self.plan.gemm_dtypes("grad_input").result, alpha=rescale)

    def finish(self) -> Gradients:
        """Round the sums to the input dtype, once, and hand out the gradients (the sum itself where
        it already has that dtype)."""
        dtype = self.plan.input_dtype
        grads = Gradients(input=self.input)
        if self.weight is not None:
            grads.weight = self.weight.to(dtype)
            self.weight = None  # a separate accumulator is freed now, not when the sums object goes
        if self.bias is not None:
            grads.bias = self.bias.to(dtype)
        return grads


# ---- the features beyond torch's op: z-loss and soft-capping ----------------------------------------

@dataclasses.dataclass(frozen=True)
class RowScales:
    """How the rows of a pass weigh in the gradient.

    ``main`` is the cross-entropy term's ``s``: a 0-dim tensor for the scalar
    reductions (1/sum(w_y) or 1), (N,) incoming gradients for "none". ``z``
    is the z-loss term's ``s_z`` in the same form (1/count of rows that are
    not ignored for "mean"), None without z-loss. ``rescale`` is the pass's
    :func:`grad_logits_rescale` without z-loss, and ``max_main`` the bound it
    was computed from; a z-loss recomputes it per chunk (:meth:`chunk_rescale`).
    """

    main: torch.Tensor
    z: torch.Tensor | None
    max_main: torch.Tensor | float
    rescale: float
    max_class_weight: float | None = None

    def at(self, scale: torch.Tensor, rows: slice) -> torch.Tensor:
        """``scale`` for the chunk's rows, as a (rows,) tensor."""
        return scale[rows] if scale.dim() else scale.expand(rows.stop - rows.start)

    def chunk_rescale(self, plan: Plan, targets: Targets, lse_coef: torch.Tensor | None) -> float:
        if lse_coef is None:
            return self.rescale
        return grad_logits_rescale(plan, targets, self.max_main, lse_coef, self.max_class_weight)


def z_loss_coefficient(targets: Targets, scales: RowScales, rows: slice, lse: torch.Tensor) -> torch.Tensor | None:
    """The z-loss term's coefficient of ``p`` in dz, ``2 * z_loss * s_z * lse`` per row (0 for ignored rows), or
    None without z-loss."""
    if scales.z is None:
        return None
    return torch.where(targets.valid[rows], (2.0 * targets.z_loss) * scales.at(scales.z, rows) * lse, 0)


def cap_logits_(z: torch.Tensor, softcap: float) -> torch.Tensor:
    """``z <- tanh(z / softcap)`` in place: the buffer then holds ``t``, with the capped logits ``softcap * t``."""
    return z.div_(softcap).tanh_()


def _column_blocks(plan: Plan, cols: slice) -> Iterator[tuple[slice, slice]]:
    """The sub-blocks of the classes ``cols`` the soft-capped workspace covers, each as (classes, buffer columns)."""
    width = plan.softcap_block_columns
    for start in range(cols.start, cols.stop, width):
        stop = min(start + width, cols.stop)
        yield slice(start, stop), slice(start - cols.start, stop - cols.start)


def capped_statistics(plan: Plan, t: torch.Tensor, targets: Targets, rows: slice, cols: slice,
                      previous: RowStatistics | None) -> RowStatistics:
    """Fold the soft-capped logits ``softcap * t`` of the classes ``cols`` into the statistics of the chunk's rows,
    a workspace of columns at a time; ``t`` is left as it is."""
    stats = previous
    for classes, columns in _column_blocks(plan, cols):
        stats = block_statistics_(t[:, columns] * plan.softcap, targets, rows, classes, stats)
    return stats


def capped_grad_logits_(plan: Plan, t: torch.Tensor, targets: Targets, rows: slice, cols: slice, lse: torch.Tensor,
                        other_prob: torch.Tensor, row_scale: torch.Tensor, rescale: float,
                        lse_coef: torch.Tensor | None) -> torch.Tensor:
    """Turn ``t`` (the classes ``cols``) into the gradient with respect to the raw logits, ``/ rescale``, in place.

    Per workspace of columns: ``p = exp(softcap * t - lse)``, dz from it as in
    :func:`chunk_grad_logits_`, then ``t <- (1 - t**2) * dz``, the chain rule
    through the cap.
    """
    for classes, columns in _column_blocks(plan, cols):
        probs = (t[:, columns] * plan.softcap).sub_(lse[:, None]).exp_()
        dz = chunk_grad_logits_(probs, row_scale, targets, rows, rescale, other_prob, classes, lse_coef)
        t[:, columns].square_().sub_(1.0).mul_(dz).neg_()
        del probs, dz  # one workspace at a time: the next one is made before a reassignment would free this
    return t


def _capped_chunk_statistics(plan: Plan, z: torch.Tensor, targets: Targets,
                             rows: slice) -> tuple[RowStatistics, torch.Tensor]:
    """The statistics of a chunk's soft-capped logits over every class, from its raw logits ``z``, and ``z``
    turned into ``t`` for :func:`capped_grad_logits_`."""
    t = cap_logits_(z, plan.softcap)
    return capped_statistics(plan, t, targets, rows, slice(0, plan.num_classes), None), t


# ---- the passes ---------------------------------------------------------------------------------

@dataclasses.dataclass
class ChunkResult:
    """What a chunk of a scalar reduction returns: its loss sum (fp64) and its rows' log-sum-exp."""

    loss_sum: torch.Tensor
    lse: torch.Tensor


@dataclasses.dataclass(frozen=True)
class ScalarReduction:
    """How "mean"/"sum" weigh the rows: the gradients' :class:`RowScales`, and the loss's normalisers in fp64:
    ``total_weight`` (sum of ``w_y``) and the z-term's ``z_scale`` (1/count of rows not ignored for "mean", 1
    for "sum"; None without z-loss)."""

    scales: RowScales
    total_weight: torch.Tensor
    z_scale: torch.Tensor | None

    @classmethod
    def of(cls, plan: Plan, targets: Targets, with_grads: bool,
           max_class_weight: float | None = None) -> ScalarReduction:
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
        rescale = grad_logits_rescale(plan, targets, main, max_class_weight=max_class_weight) if with_grads else 1.0
        z = None if z_scale is None else z_scale.to(plan.stats_dtype)
        return cls(RowScales(main, z, main, rescale, max_class_weight), total_weight, z_scale)

    def loss(self, plan: Plan, targets: Targets, loss_sum: torch.Tensor, z_sum: torch.Tensor) -> torch.Tensor:
        """The reduced loss in the input dtype, from the fp64 sums of the row losses and of ``lse**2``."""
        loss = loss_sum / self.total_weight if plan.reduction == "mean" else loss_sum
        if self.z_scale is not None:
            loss = loss + targets.z_loss * z_sum * self.z_scale
        return loss.to(plan.input_dtype)


def scalar_loss_and_grads(plan: Plan, head: HeadTensors,
                          targets: Targets) -> tuple[torch.Tensor, Gradients, torch.Tensor | None]:
    """Loss for "mean"/"sum" and, as the plan requests, its gradients (already scaled for the reduction), and
    the per-row log-sum-exp in fp32 when the plan returns it (else None)."""
    n, device = head.input.shape[0], head.input.device
    sums = GradientSums(plan, head) if any(plan.needs_grad) else None
    reduction = ScalarReduction.of(plan, targets, sums is not None)
    bias = bias_for_logits(plan, head.bias)
    lse_out = torch.empty(n, dtype=torch.float32, device=device) if plan.return_lse else None
    loss_sum = torch.zeros((), dtype=LOSS_SUM_DTYPE, device=device)
    z_sum = torch.zeros((), dtype=LOSS_SUM_DTYPE, device=device)
    chunk = _scalar_chunk_tiled if plan.tiles_classes else _scalar_chunk
    for rows in plan.row_chunks():
        result = chunk(plan, head, bias, targets, sums, rows, reduction.scales)
        loss_sum += result.loss_sum
        if targets.z_loss:
            z_sum += torch.where(targets.valid[rows], result.lse.square(), 0).sum(dtype=LOSS_SUM_DTYPE)
        if lse_out is not None:
            lse_out[rows] = result.lse
    loss = reduction.loss(plan, targets, loss_sum, z_sum)
    return loss, (sums.finish() if sums is not None else Gradients()), lse_out


def _scalar_chunk(plan: Plan, head: HeadTensors, bias: torch.Tensor | None, targets: Targets,
                  sums: GradientSums | None, rows: slice, scales: RowScales) -> ChunkResult:
    """One chunk of the scalar reductions: its loss sum and log-sum-exp; its gradients go into ``sums``."""
    z, x_in_acc = chunk_logits(plan, head, bias, rows)
    if plan.softcap is not None:
        return _capped_chunk(plan, head, targets, sums, rows, scales, z, x_in_acc)
    losses, lse, other_prob = chunk_loss_and_softmax_(z, targets, rows)
    if sums is not None:
        lse_coef = z_loss_coefficient(targets, scales, rows, lse)
        rescale = scales.chunk_rescale(plan, targets, lse_coef)
        dz = chunk_grad_logits_(z, scales.at(scales.main, rows), targets, rows, rescale, other_prob,
                                lse_coef=lse_coef)
        sums.add_chunk(head, rows, dz, x_in_acc, rescale)
    return ChunkResult(losses.sum(dtype=LOSS_SUM_DTYPE), lse)


def _capped_chunk(plan: Plan, head: HeadTensors, targets: Targets, sums: GradientSums | None, rows: slice,
                  scales: RowScales, z: torch.Tensor, x_in_acc: torch.Tensor | None) -> ChunkResult:
    """:func:`_scalar_chunk` with soft-capped logits: statistics from ``t``, then ``t`` turned into the gradient."""
    stats, t = _capped_chunk_statistics(plan, z, targets, rows)
    lse = stats.lse
    if sums is not None:
        lse_coef = z_loss_coefficient(targets, scales, rows, lse)
        rescale = scales.chunk_rescale(plan, targets, lse_coef)
        dz = capped_grad_logits_(plan, t, targets, rows, slice(0, plan.num_classes), lse, stats.other_prob,
                                 scales.at(scales.main, rows), rescale, lse_coef)
        sums.add_chunk(head, rows, dz, x_in_acc, rescale)
    return ChunkResult(stats.losses(targets, rows).sum(dtype=LOSS_SUM_DTYPE), lse)


def per_row_loss(plan: Plan, head: HeadTensors,
                 targets: Targets) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Per-row losses for reduction="none" (input dtype, z-loss included) and what backward reuses: the
    log-sum-exp rows and, where :attr:`~lce.plan.Plan.saves_other_prob`, ``1 - p_y`` (None otherwise: backward
    sees every class of a row at once)."""
    n, device = head.input.shape[0], head.input.device
    losses = torch.empty(n, dtype=plan.input_dtype, device=device)
    lse = torch.empty(n, dtype=plan.stats_dtype, device=device)
    other_prob = torch.empty(n, dtype=plan.stats_dtype, device=device) if plan.saves_other_prob else None
    bias = bias_for_logits(plan, head.bias)
    chunk = _per_row_loss_chunk_tiled if plan.tiles_classes else _per_row_loss_chunk
    for rows in plan.row_chunks():
        stats = chunk(plan, head, bias, targets, rows)
        row_losses = stats.losses(targets, rows)
        if targets.z_loss:
            row_losses = row_losses + targets.z_loss * stats.squared_lse(targets, rows)
        losses[rows], lse[rows] = row_losses, stats.lse
        if other_prob is not None:
            other_prob[rows] = stats.other_prob
    return losses, lse, other_prob


def _per_row_loss_chunk(plan: Plan, head: HeadTensors, bias: torch.Tensor | None, targets: Targets,
                        rows: slice) -> RowStatistics:
    z = chunk_logits(plan, head, bias, rows)[0]  # the input chunk in acc_dtype is not needed past the GEMM
    if plan.softcap is not None:
        return _capped_chunk_statistics(plan, z, targets, rows)[0]
    return chunk_statistics_(z, targets, rows)


def per_row_grads(plan: Plan, head: HeadTensors, targets: Targets, lse: torch.Tensor,
                  grad_losses: torch.Tensor, other_prob: torch.Tensor | None = None) -> Gradients:
    """Gradients of sum(grad_losses * losses) for reduction="none", recomputing logits chunk by chunk.

    ``lse`` and ``other_prob`` are what :func:`per_row_loss` returned."""
    sums = GradientSums(plan, head)
    row_scale = grad_losses.to(plan.stats_dtype)
    max_scale = row_scale.abs().max() if row_scale.numel() else 0.0
    scales = RowScales(row_scale, row_scale if targets.z_loss else None, max_scale,
                       grad_logits_rescale(plan, targets, max_scale))
    bias = bias_for_logits(plan, head.bias)
    for rows in plan.row_chunks():
        if plan.tiles_classes:
            _per_row_grad_chunk_tiled(plan, head, bias, targets, sums, rows, lse, other_prob, scales)
        else:
            _per_row_grad_chunk(plan, head, bias, targets, sums, rows, lse, other_prob, scales)
    return sums.finish()


def _per_row_grad_chunk(plan: Plan, head: HeadTensors, bias: torch.Tensor | None, targets: Targets,
                        sums: GradientSums, rows: slice, lse: torch.Tensor, other_prob: torch.Tensor | None,
                        scales: RowScales) -> None:
    z, x_in_acc = chunk_logits(plan, head, bias, rows)
    lse_coef = z_loss_coefficient(targets, scales, rows, lse[rows])
    rescale = scales.chunk_rescale(plan, targets, lse_coef)
    if plan.softcap is not None:
        t = cap_logits_(z, plan.softcap)
        dz = capped_grad_logits_(plan, t, targets, rows, slice(0, plan.num_classes), lse[rows], other_prob[rows],
                                 scales.at(scales.main, rows), rescale, lse_coef)
    else:
        probs, chunk_other_prob = chunk_softmax_from_lse_(z, targets, rows, lse[rows])
        dz = chunk_grad_logits_(probs, scales.at(scales.main, rows), targets, rows, rescale, chunk_other_prob,
                                lse_coef=lse_coef)
    sums.add_chunk(head, rows, dz, x_in_acc, rescale)


# ---- class tiling: a chunk of rows against the vocabulary, a block of classes at a time ------------

def block_statistics_(z: torch.Tensor, targets: Targets, rows: slice, cols: slice,
                      previous: RowStatistics | None) -> RowStatistics:
    """Fold one block's logits ``z`` (rows, block; consumed) into the running statistics of the chunk's rows.

    The running maximum rises to the block's where it is larger and the sum of
    exponentials gathered so far is rescaled to it (``exp(old_max - new_max)``),
    the online form of the log-sum-exp. The target's term stays out of the
    sum, as in :func:`_exp_apart_from_target_`, for every row whose target
    lies in this block.
    """
    index, in_block = block_target_index(targets, rows, cols)
    block_target = z.gather(1, index).squeeze(1)
    weighted = _weighted_logit_sum(z, targets, cols)
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


def _tiled_statistics(plan: Plan, head: HeadTensors, bias: torch.Tensor | None, targets: Targets, rows: slice,
                      x_in_acc: torch.Tensor | None) -> RowStatistics:
    """The statistics of the chunk's rows over every class, one block of logits alive at a time."""
    stats = None
    for cols in plan.class_chunks():
        z = block_logits(plan, head, bias, rows, cols, x_in_acc)
        if plan.softcap is None:
            stats = block_statistics_(z, targets, rows, cols, stats)
        else:
            stats = capped_statistics(plan, cap_logits_(z, plan.softcap), targets, rows, cols, stats)
        del z  # one block alive at a time: the next one is made before a reassignment would free this
    return stats


def _tiled_gradients(plan: Plan, head: HeadTensors, bias: torch.Tensor | None, targets: Targets,
                     sums: GradientSums, rows: slice, x_in_acc: torch.Tensor | None, lse: torch.Tensor,
                     other_prob: torch.Tensor, scales: RowScales,
                     complete_input_sum: Callable[[torch.Tensor], None] | None = None) -> None:
    """The chunk's gradients, block by block: each block's logits are computed again, turned into dz
    with the row statistics of the whole vocabulary, and multiplied out; the input gradient's blocks are
    summed in the stats dtype and rounded once, after ``complete_input_sum`` (if any) has added the other
    processes' blocks to the sum in place."""
    input_sum = None
    if sums.input is not None:
        input_sum = torch.zeros(rows.stop - rows.start, plan.in_features, dtype=plan.stats_dtype,
                                device=head.input.device)
    lse_coef = z_loss_coefficient(targets, scales, rows, lse)
    rescale = scales.chunk_rescale(plan, targets, lse_coef)
    for cols in plan.class_chunks():
        _block_gradients(plan, head, bias, targets, sums, rows, cols, x_in_acc, lse, other_prob,
                         scales.at(scales.main, rows), rescale, lse_coef, input_sum)
    if input_sum is not None:
        if complete_input_sum is not None:
            complete_input_sum(input_sum)
        sums.input[rows].copy_(input_sum)


def _block_gradients(plan: Plan, head: HeadTensors, bias: torch.Tensor | None, targets: Targets,
                     sums: GradientSums, rows: slice, cols: slice, x_in_acc: torch.Tensor | None, lse: torch.Tensor,
                     other_prob: torch.Tensor, row_scale: torch.Tensor, rescale: float,
                     lse_coef: torch.Tensor | None, input_sum: torch.Tensor | None) -> None:
    z = block_logits(plan, head, bias, rows, cols, x_in_acc)
    if plan.softcap is None:
        dz = chunk_grad_logits_(z.sub_(lse[:, None]).exp_(), row_scale, targets, rows, rescale, other_prob, cols,
                                lse_coef)
    else:
        dz = capped_grad_logits_(plan, cap_logits_(z, plan.softcap), targets, rows, cols, lse, other_prob, row_scale,
                                 rescale, lse_coef)
    sums.add_chunk(head, rows, dz, x_in_acc, rescale, cols, input_sum)


def _scalar_chunk_tiled(plan: Plan, head: HeadTensors, bias: torch.Tensor | None, targets: Targets,
                        sums: GradientSums | None, rows: slice, scales: RowScales) -> ChunkResult:
    """:func:`_scalar_chunk` for a class-tiled plan: a statistics sweep over the blocks, then a gradient sweep."""
    x_in_acc = input_chunk_in_acc(plan, head, rows)
    stats = _tiled_statistics(plan, head, bias, targets, rows, x_in_acc)
    if sums is not None:
        _tiled_gradients(plan, head, bias, targets, sums, rows, x_in_acc, stats.lse, stats.other_prob, scales)
    return ChunkResult(stats.losses(targets, rows).sum(dtype=LOSS_SUM_DTYPE), stats.lse)


def _per_row_loss_chunk_tiled(plan: Plan, head: HeadTensors, bias: torch.Tensor | None, targets: Targets,
                              rows: slice) -> RowStatistics:
    return _tiled_statistics(plan, head, bias, targets, rows, input_chunk_in_acc(plan, head, rows))


def _per_row_grad_chunk_tiled(plan: Plan, head: HeadTensors, bias: torch.Tensor | None, targets: Targets,
                              sums: GradientSums, rows: slice, lse: torch.Tensor, other_prob: torch.Tensor,
                              scales: RowScales) -> None:
    _tiled_gradients(plan, head, bias, targets, sums, rows, input_chunk_in_acc(plan, head, rows), lse[rows],
                     other_prob[rows], scales)
