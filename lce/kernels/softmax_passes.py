"""The Triton kernels of :mod:`lce.kernels` and their launches (imports triton: only :mod:`lce.kernels` imports this
module, and only for a tensor the kernels can run on).

Two kernels, each one pass over a chunk's (rows, C) fp32 logits ``z`` (a row stride of its own, unit column
stride):

* :func:`row_statistics_kernel` reads ``z`` once: per row the running maximum and the sum of ``exp(z - max)``
  over every class but the target, rescaled to the new maximum whenever a block raises it (the online
  log-sum-exp), or, given a fixed shift, the plain sum of ``exp(z - shift)`` without the target; the target's
  logit; and, for label smoothing, the class-weighted sum of the logits. A row's columns may be split between
  programs, each writing its partial results to a slot of its own, which :func:`row_statistics` merges in a fixed
  order (no atomics: the result depends on the launch, never on scheduling).
* :func:`grad_logits_kernel` reads ``z`` and writes dz over it, one program per row and block of columns.

Every per-row number that depends on the loss's options (the coefficients of ``p`` and of the one-hot term, the
smoothing term, ``1 - p_y``) is computed by the caller with the PyTorch ops lce's chunk loop uses and handed to
the kernel: the kernels hold the elementwise arithmetic, never the policies.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from .interpreter import LAUNCH_OPTIONS, libdevice_exp
from .launch import Launch

__all__ = ["INTERPRETED", "TRITON_VERSION", "row_statistics", "grad_logits_", "row_statistics_kernel",
           "grad_logits_kernel"]


@triton.jit
def _exp(x, LIBDEVICE_EXP: tl.constexpr):
    """``exp(x)`` of fp32 ``x``: libdevice's when compiled; in the interpreter numpy's, in fp64 and rounded once
    (numpy's own fp32 ``exp`` strays 2 ulps; see :mod:`lce.kernels.interpreter`)."""
    if LIBDEVICE_EXP:
        return libdevice.exp(x)
    else:
        return tl.exp(x.to(tl.float64)).to(tl.float32)


@triton.jit
def _exp_of_difference(a, b, LIBDEVICE_EXP: tl.constexpr):
    """``exp(a - b)`` for ``a <= b`` (-inf allowed for ``a``) with the difference's rounding error put back.

    ``a - b`` rounds by up to half an ulp of the difference, 2**-19 at 40 nats: as the factor every term gathered
    so far is rescaled by, that one error would shift them all alike (about 16 ulps), where the reference's
    per-term roundings average out. Knuth's two-sum recovers the error ``lost`` exactly (no fused multiply-adds:
    :mod:`lce.kernels.interpreter`) and ``exp(d + lost) = exp(d) * (1 + lost)`` to within ``lost**2``.
    """
    gathered = a > -float("inf")
    a = tl.where(gathered, a, b)  # nothing gathered yet: any finite difference will do, the factor is 0
    d = a - b
    back = d - a
    lost = (a - (d - back)) + (-b - back)
    e = _exp(d, LIBDEVICE_EXP)
    return tl.where(gathered, e + e * lost, 0.0)


@triton.jit
def row_statistics_kernel(
    z_ptr, z_row_stride, num_cols,
    target_ptr,
    start_ptr,
    class_weight_ptr,
    max_ptr, other_ptr, weighted_ptr,
    target_logit_ptr,
    blocks_per_split,
    BLOCK: tl.constexpr,
    FIXED_SHIFT: tl.constexpr,
    HAS_START: tl.constexpr,
    WEIGHTED_SUM: tl.constexpr,
    CLASS_WEIGHT: tl.constexpr,
    LIBDEVICE_EXP: tl.constexpr,
):
    """One row's statistics over one split's run of blocks of columns.

    ``target_ptr`` (rows,) int64: the target's column, or any value outside ``[0, num_cols)`` for a row whose
    target lies outside these columns (then every class is summed). ``start_ptr`` (rows,) fp32: the fixed shift
    (``FIXED_SHIFT``) or the running maximum to start from (``HAS_START``, a previous block's). Writes to slot
    ``row * splits + split`` of ``max_ptr``, ``other_ptr`` and ``weighted_ptr`` (``WEIGHTED_SUM``), and, from the
    first split, the target's logit (-inf outside these columns) to ``target_logit_ptr``.
    """
    row = tl.program_id(0)
    split = tl.program_id(1)
    splits = tl.num_programs(1)
    row_z = z_ptr + row.to(tl.int64) * z_row_stride
    target = tl.load(target_ptr + row)
    if FIXED_SHIFT or HAS_START:
        row_max = tl.load(start_ptr + row)
    else:
        row_max = -float("inf")
    other = 0.0
    weighted = 0.0
    columns = tl.arange(0, BLOCK)
    first = split * blocks_per_split
    last = tl.minimum(first + blocks_per_split, tl.cdiv(num_cols, BLOCK))
    for block in range(first, last):
        cols = block * BLOCK + columns
        inside = cols < num_cols
        z = tl.load(row_z + cols, mask=inside, other=-float("inf"))
        if not FIXED_SHIFT:
            new_max = tl.maximum(row_max, tl.max(z, axis=0))
            # the sum so far moves to the new maximum; where the maximum stays, it is left exactly as it is
            carried = tl.where(new_max > row_max, _exp_of_difference(row_max, new_max, LIBDEVICE_EXP), 1.0)
            other = other * carried
            row_max = new_max
        # the target's term left out (as the reference's -inf before its exp), so 1 - p_y is never a difference
        terms = tl.where(inside & (cols != target), _exp(z - row_max, LIBDEVICE_EXP), 0.0)
        other += tl.sum(terms, axis=0)
        if WEIGHTED_SUM:
            logits = tl.where(inside, z, 0.0)
            if CLASS_WEIGHT:
                logits = logits * tl.load(class_weight_ptr + cols, mask=inside, other=0.0)
            weighted += tl.sum(logits, axis=0)
    slot = row * splits + split
    tl.store(max_ptr + slot, row_max)
    tl.store(other_ptr + slot, other)
    if WEIGHTED_SUM:
        tl.store(weighted_ptr + slot, weighted)
    if split == 0:
        in_columns = (target >= 0) & (target < num_cols)
        tl.store(target_logit_ptr + row, tl.load(row_z + target, mask=in_columns, other=-float("inf")))


@triton.jit
def grad_logits_kernel(
    z_ptr, z_row_stride, num_cols,
    target_ptr,
    shift_ptr, divisor_ptr,
    prob_coef_ptr, target_coef_ptr, other_prob_ptr,
    smoothing_ptr, class_weight_ptr,
    BLOCK: tl.constexpr,
    DIVIDE: tl.constexpr,
    SMOOTHING: tl.constexpr,
    CLASS_WEIGHT: tl.constexpr,
    LIBDEVICE_EXP: tl.constexpr,
):
    """dz over one block of one row's logits, in place.

    ``p = exp(z - shift)`` (divided by ``divisor``, correctly rounded, where ``DIVIDE``); ``dz = prob_coef * p``,
    the target's entry ``(prob_coef - target_coef) * p_y - target_coef * other_prob``; then, with smoothing,
    ``+ smoothing * w_c`` (``+ smoothing`` without class weights). All per-row values are (rows,) fp32.
    """
    row = tl.program_id(0)
    block = tl.program_id(1)
    row_z = z_ptr + row.to(tl.int64) * z_row_stride
    cols = block * BLOCK + tl.arange(0, BLOCK)
    inside = cols < num_cols
    z = tl.load(row_z + cols, mask=inside, other=0.0)
    probs = _exp(z - tl.load(shift_ptr + row), LIBDEVICE_EXP)
    if DIVIDE:
        probs = tl.math.div_rn(probs, tl.load(divisor_ptr + row))
    prob_coef = tl.load(prob_coef_ptr + row)
    target_coef = tl.load(target_coef_ptr + row)
    other_prob = tl.load(other_prob_ptr + row)
    target_entry = (prob_coef - target_coef) * probs - target_coef * other_prob
    dz = tl.where(cols == tl.load(target_ptr + row), target_entry, prob_coef * probs)
    if SMOOTHING:
        smoothing = tl.load(smoothing_ptr + row)
        if CLASS_WEIGHT:
            dz = dz + smoothing * tl.load(class_weight_ptr + cols, mask=inside, other=0.0)
        else:
            dz = dz + smoothing
    tl.store(row_z + cols, dz, mask=inside)


INTERPRETED: bool = type(row_statistics_kernel).__name__ == "InterpretedFunction"
"""Whether Triton decorated these kernels for its CPU interpreter (``TRITON_INTERPRET`` set at import)."""

TRITON_VERSION: str = triton.__version__
"""The triton these kernels were built with (plans and the GPU check's rows name it)."""

_LIBDEVICE_EXP = libdevice_exp(INTERPRETED)


def row_statistics(z: torch.Tensor, target: torch.Tensor, start: torch.Tensor | None, *, fixed_shift: bool,
                   class_weight: torch.Tensor | None, weighted_sum: bool, launch: Launch,
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Launch :func:`row_statistics_kernel` and merge its splits: ``(row_max, other, target_logit, weighted)``.

    Arguments as validated by :mod:`lce.kernels`. The splits of a row merge in split order: the maximum over
    them, each partial sum moved to it (``exp(split_max - row_max)``, exactly 1 where they agree) and summed.
    """
    rows, num_cols = z.shape
    splits = launch.splits
    max_parts = torch.empty(rows, splits, dtype=torch.float32, device=z.device)
    other_parts = torch.empty_like(max_parts)
    weighted_parts = torch.empty_like(max_parts) if weighted_sum else max_parts
    target_logit = torch.empty(rows, dtype=torch.float32, device=z.device)
    if rows:
        row_statistics_kernel[(rows, splits)](
            z, z.stride(0), num_cols, target, z if start is None else start,
            z if class_weight is None else class_weight,
            max_parts, other_parts, weighted_parts, target_logit, launch.blocks_per_split(num_cols),
            BLOCK=launch.block, FIXED_SHIFT=fixed_shift, HAS_START=start is not None and not fixed_shift,
            WEIGHTED_SUM=weighted_sum, CLASS_WEIGHT=class_weight is not None, LIBDEVICE_EXP=_LIBDEVICE_EXP,
            num_warps=launch.num_warps, **LAUNCH_OPTIONS,
        )
    weighted = weighted_parts.sum(1) if weighted_sum else None
    if splits == 1:
        return max_parts[:, 0], other_parts[:, 0], target_logit, weighted
    row_max = max_parts.amax(1)
    carried = torch.where(max_parts == row_max[:, None], 1.0, exp_of_difference(max_parts, row_max[:, None]))
    return row_max, (other_parts * carried).sum(1), target_logit, weighted


def exp_of_difference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """:func:`_exp_of_difference` in PyTorch ops, for the merge of a row's splits (``a <= b``)."""
    gathered = a > -torch.inf
    a = torch.where(gathered, a, b)
    d = a - b
    back = d - a
    lost = (a - (d - back)) + (-b - back)
    e = d.exp()
    return torch.where(gathered, e + e * lost, 0.0)


def grad_logits_(z: torch.Tensor, target: torch.Tensor, shift: torch.Tensor, divisor: torch.Tensor | None,
                 prob_coef: torch.Tensor, target_coef: torch.Tensor, other_prob: torch.Tensor,
                 smoothing: torch.Tensor | None, class_weight: torch.Tensor | None, launch: Launch) -> torch.Tensor:
    """Launch :func:`grad_logits_kernel` over every row and block of ``z``; returns ``z``, now dz."""
    rows, num_cols = z.shape
    if rows:
        grad_logits_kernel[(rows, launch.blocks(num_cols))](
            z, z.stride(0), num_cols, target, shift, shift if divisor is None else divisor,
            prob_coef, target_coef, other_prob, shift if smoothing is None else smoothing,
            z if class_weight is None else class_weight,
            BLOCK=launch.block, DIVIDE=divisor is not None, SMOOTHING=smoothing is not None,
            CLASS_WEIGHT=class_weight is not None, LIBDEVICE_EXP=_LIBDEVICE_EXP,
            num_warps=launch.num_warps, **LAUNCH_OPTIONS,
        )
    return z
