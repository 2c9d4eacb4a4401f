"""Autograd wiring of the chunk loop.

* "mean"/"sum": forward already produces the gradients (one pass over the
  logits instead of two); backward only multiplies them by the incoming
  scalar. Without ``allow_retain_graph`` that multiply happens in place and
  the buffers are released, so a second backward is an error, not a silent
  double-scaled gradient.
* "none": forward saves the per-row log-sum-exp (and, with class tiling,
  ``1 - p_y``); backward recomputes the
  logits chunk by chunk with the per-row incoming gradient, so backward can
  run any number of times.

With ``plan.return_lse`` both also return the per-row log-sum-exp (fp32), marked
non-differentiable: it is for logging, and backward ignores any gradient sent to it.
"""

from __future__ import annotations

import torch

from .autocasting import outside_autocast
from .passes.chunk import HeadTensors, Targets, pad_rows
from .passes.loss import per_row_grads, per_row_loss, scalar_loss_and_grads
from .planning.plan import Plan

__all__ = ["ScalarReductionLoss", "PerRowLoss", "keep_gradients", "hand_out_gradients"]

_SECOND_BACKWARD = (
    "lce.linear_cross_entropy: backward ran a second time through a chunked loss whose gradients were "
    "already handed out (they are scaled in place to save memory). Pass "
    "LinearCrossEntropyOptions(allow_retain_graph=True) to backpropagate through it more than once."
)


def _targets(plan: Plan, target, class_weight, ignore_index: int, label_smoothing: float) -> Targets:
    return Targets.build(target, class_weight=class_weight, ignore_index=ignore_index,
                         label_smoothing=label_smoothing, num_classes=plan.num_classes,
                         stats_dtype=plan.stats_dtype, z_loss=plan.z_loss)


def _with_lse(ctx, loss: torch.Tensor, lse: torch.Tensor | None):
    """``loss``, or ``(loss, lse)`` with ``lse`` marked non-differentiable when the plan returns it."""
    if lse is None:
        return loss
    ctx.mark_non_differentiable(lse)
    return loss, lse


def keep_gradients(ctx, grads, plan: Plan) -> None:
    """Keep a scalar reduction's gradients (and the powers of two they are stored scaled by) for backward."""
    ctx.grads = (grads.input, grads.weight, grads.bias)
    ctx.grad_scales = grads.scales
    ctx.allow_retain_graph = plan.allow_retain_graph


def hand_out_gradients(ctx, grad_loss: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
    """The gradients a scalar reduction computed in forward (``ctx.grads``), times the incoming ``grad_loss``:
    in place, and only once, unless ``ctx.allow_retain_graph``. fp16 gradients stored scaled
    (``ctx.grad_scales``, :mod:`lce.passes.headroom`) are multiplied by ``grad_loss`` over their scale in fp32 and
    rounded once."""
    if ctx.grads is None:
        raise RuntimeError(_SECOND_BACKWARD)
    grads = ctx.grads
    scales = getattr(ctx, "grad_scales", None)
    if scales is not None:
        if not ctx.allow_retain_graph:
            ctx.grads = None
        return scales.unscale_(grads, grad_loss, in_place=not ctx.allow_retain_graph)
    if ctx.allow_retain_graph:
        return tuple(None if g is None else g * grad_loss for g in grads)
    ctx.grads = None
    return tuple(None if g is None else g.mul_(grad_loss) for g in grads)


class ScalarReductionLoss(torch.autograd.Function):
    """Loss with reduction "mean" or "sum"; gradients computed in forward."""

    @staticmethod
    @outside_autocast
    def forward(ctx, input, weight, bias, target, class_weight, ignore_index, label_smoothing, plan: Plan):
        n = input.shape[0]  # a batch-invariant plan runs whole chunks: per-row vectors padded, outputs sliced
        targets = _targets(plan, pad_rows(plan, target, ignore_index), class_weight, ignore_index, label_smoothing)
        loss, grads, lse = scalar_loss_and_grads(plan, HeadTensors(input, weight, bias), targets)
        keep_gradients(ctx, grads, plan)
        return _with_lse(ctx, loss, None if lse is None else lse[:n])

    @staticmethod
    @outside_autocast
    def backward(ctx, grad_loss, *_grad_lse):
        return (*hand_out_gradients(ctx, grad_loss), None, None, None, None, None)


class PerRowLoss(torch.autograd.Function):
    """Loss with reduction "none"; backward recomputes the logits chunk by chunk."""

    @staticmethod
    @outside_autocast
    def forward(ctx, input, weight, bias, target, class_weight, ignore_index, label_smoothing, plan: Plan):
        n = input.shape[0]  # a batch-invariant plan runs whole chunks: per-row vectors padded, outputs sliced
        targets = _targets(plan, pad_rows(plan, target, ignore_index), class_weight, ignore_index, label_smoothing)
        losses, lse, other_prob = per_row_loss(plan, HeadTensors(input, weight, bias), targets)
        ctx.save_for_backward(input, weight, bias, target, class_weight, lse, other_prob)  # lse: the padded rows'
        ctx.ignore_index, ctx.label_smoothing, ctx.plan = ignore_index, label_smoothing, plan
        # a copy: the saved log-sum-exp must not change if the caller edits what it logs
        return _with_lse(ctx, losses[:n], lse[:n].to(torch.float32, copy=True) if plan.return_lse else None)

    @staticmethod
    @outside_autocast
    def backward(ctx, grad_losses, *_grad_lse):
        input, weight, bias, target, class_weight, lse, other_prob = ctx.saved_tensors
        plan = ctx.plan
        targets = _targets(plan, pad_rows(plan, target, ctx.ignore_index), class_weight, ctx.ignore_index,
                           ctx.label_smoothing)
        grads = per_row_grads(plan, HeadTensors(input, weight, bias), targets, lse,
                              pad_rows(plan, grad_losses, 0), other_prob)
        return grads.input, grads.weight, grads.bias, None, None, None, None, None
