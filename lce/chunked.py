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
grad_bias = sum over chunks of dz.sum(0). Every dtype comes from the
:class:`~lce.plan.Plan`; the GEMMs run through :mod:`lce.gemm`.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from .gemm import add_mm_, mm, mm_upcast_weight, mm_upcast_weight_t
from .plan import LOSS_SUM_DTYPE, Plan

__all__ = ["Problem", "Gradients", "scalar_loss_and_grads", "per_row_loss", "per_row_grads"]


@dataclasses.dataclass
class Problem:
    """The validated tensors of one call, 2-D input, in the plan's layout."""

    input: torch.Tensor  # (N, D)
    weight: torch.Tensor  # (C, D)
    bias: torch.Tensor | None  # (C,)
    target: torch.Tensor  # (N,) int64
    class_weight: torch.Tensor | None  # (C,)
    ignore_index: int
    label_smoothing: float


@dataclasses.dataclass
class Gradients:
    input: torch.Tensor | None = None
    weight: torch.Tensor | None = None
    bias: torch.Tensor | None = None


class _Call:
    """Per-call state shared by the chunks: row weights, target masks, gradient sums."""

    def __init__(self, plan: Plan, problem: Problem, with_grads: bool):
        self.plan, self.problem = plan, problem
        stats = plan.stats_dtype
        self.bias_for_logits = (
            problem.bias.to(plan.gemm_dtypes("logits").result) if problem.bias is not None else None
        )
        target = problem.target
        self.valid = target != problem.ignore_index
        self.safe_target = torch.where(self.valid, target, 0)
        class_weight = problem.class_weight
        self.class_weight = class_weight.to(stats) if class_weight is not None else None
        if self.class_weight is None:
            self.row_weight = self.valid.to(stats)
        else:
            self.row_weight = torch.where(self.valid, self.class_weight[self.safe_target], 0)
        self.class_weight_sum = (
            float(plan.num_classes) if self.class_weight is None else self.class_weight.sum()
        )
        # dz is multiplied by 1 / unscale (a power of two) before it is rounded to a
        # narrow dtype, and GEMM results by unscale; see set_grad_logits_range().
        self.unscale = 1.0
        self.grads = Gradients()
        self.weight_grad_sum: torch.Tensor | None = None
        self.bias_grad_sum: torch.Tensor | None = None
        if with_grads:
            n, d = problem.input.shape
            c = plan.num_classes
            device = problem.input.device
            if plan.needs_grad.input:
                self.grads.input = torch.empty(n, d, dtype=plan.input_dtype, device=device)
            if plan.needs_grad.weight:
                self.weight_grad_sum = torch.zeros(c, d, dtype=plan.weight_grad_sum_dtype, device=device)
            if plan.needs_grad.bias:
                self.bias_grad_sum = torch.zeros(c, dtype=stats, device=device)

    # ---- one chunk -----------------------------------------------------------
    def logits(self, rows: slice) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The chunk's logits in the stats dtype, and its input upcast to acc (if the plan keeps one)."""
        plan, problem = self.plan, self.problem
        x = problem.input[rows]
        x_in_acc = x.to(plan.acc_dtype) if plan.input_chunk_in_acc else None
        if plan.upcasts_weight_for("logits"):
            z = mm_upcast_weight_t(x_in_acc, problem.weight)
        else:
            z = mm(x, problem.weight.T, plan.gemm_dtypes("logits").result)
        if self.bias_for_logits is not None:
            z.add_(self.bias_for_logits)
        if z.dtype != plan.stats_dtype:
            z = z.to(plan.stats_dtype)
        return z, x_in_acc

    def row_losses(self, lse: torch.Tensor, target_logit: torch.Tensor,
                   weighted_logit_sum: torch.Tensor | None, rows: slice) -> torch.Tensor:
        """Unscaled per-row loss of a chunk (0 for ignored rows)."""
        eps = self.problem.label_smoothing
        loss = (1.0 - eps) * self.row_weight[rows] * (lse - target_logit)
        if weighted_logit_sum is not None:
            loss = loss + eps / self.plan.num_classes * (self.class_weight_sum * lse - weighted_logit_sum)
        # where(), not a product: an ignored row with non-finite logits must not leak NaN.
        return torch.where(self.valid[rows], loss, 0)

    def loss_and_softmax_(self, z: torch.Tensor, rows: slice) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-row losses and log-sum-exp of a chunk; leaves the softmax in ``z``."""
        target_logit = z.gather(1, self.safe_target[rows, None]).squeeze(1)
        weighted_logit_sum = None
        if self.problem.label_smoothing:
            weighted_logit_sum = z.sum(1) if self.class_weight is None else z @ self.class_weight
        row_max = z.amax(1)
        sum_exp = z.sub_(row_max[:, None]).exp_().sum(1)
        z.div_(sum_exp[:, None])
        lse = row_max + sum_exp.log()
        return self.row_losses(lse, target_logit, weighted_logit_sum, rows), lse

    def set_grad_logits_range(self, max_row_scale: torch.Tensor | float) -> None:
        """Pick a power-of-two scale that keeps dz inside the narrow dtype's normal range.

        fp16's smallest normal number is 6.1e-5, while softmax entries are about
        1/C (4e-6 for C = 256k) and "mean" shrinks them by another 1/N, so
        rounding dz to fp16 would flush most of it to subnormals. Every entry of
        dz is bounded by 2 * row_scale * max(class weight); scaling that bound
        to 2**14 keeps all of dz normal and every product finite. Only plans
        whose narrow operands are fp16 need this (bf16 has fp32's exponent range).
        """
        if not self.plan.rescales_grad_logits:
            return
        max_weight = 1.0 if self.class_weight is None else float(self.class_weight.abs().max())
        bound = 2.0 * float(max_row_scale) * max_weight
        if bound > 0 and math.isfinite(bound):
            self.unscale = 2.0 ** (math.ceil(math.log2(bound)) - 14)

    def grad_logits_(self, probs: torch.Tensor, scale: torch.Tensor, rows: slice) -> torch.Tensor:
        """Turn the softmax ``probs`` of a chunk into dz, in place (see the module docstring)."""
        eps = self.problem.label_smoothing
        c = self.plan.num_classes
        valid = self.valid[rows]
        scale = torch.where(valid, scale / self.unscale, 0)
        target_coef = scale * (1.0 - eps) * self.row_weight[rows]
        prob_coef = target_coef
        if eps:
            prob_coef = prob_coef + scale * (eps / c) * self.class_weight_sum
        dz = probs.mul_(prob_coef[:, None])
        dz.scatter_add_(1, self.safe_target[rows, None], -target_coef[:, None])
        if eps:
            if self.class_weight is None:
                dz.sub_((eps / c) * scale[:, None])
            else:
                dz.addr_(scale, self.class_weight, alpha=-eps / c)
        return dz

    def accumulate_grads(self, dz: torch.Tensor, x_in_acc: torch.Tensor | None, rows: slice) -> None:
        """Add the chunk's contribution to every requested gradient."""
        plan, problem = self.plan, self.problem
        as_dtype: dict[torch.dtype, torch.Tensor] = {dz.dtype: dz}

        def dz_in(dtype: torch.dtype) -> torch.Tensor:
            if dtype not in as_dtype:
                as_dtype[dtype] = dz.to(dtype)
            return as_dtype[dtype]

        if plan.needs_grad.input:
            operand_dtype, result_dtype = plan.gemm_dtypes("grad_input")
            rows_of_grad = self.grads.input[rows]
            if plan.upcasts_weight_for("grad_input"):
                rows_of_grad.copy_(mm_upcast_weight(dz_in(operand_dtype), problem.weight, alpha=self.unscale))
            elif result_dtype == plan.input_dtype:
                mm(dz_in(operand_dtype), problem.weight, result_dtype, out=rows_of_grad, alpha=self.unscale)
            else:
                rows_of_grad.copy_(mm(dz_in(operand_dtype), problem.weight, result_dtype, alpha=self.unscale))
        if plan.needs_grad.weight:
            operand_dtype, product_dtype = plan.gemm_dtypes("grad_weight")
            x = problem.input[rows] if operand_dtype == plan.input_dtype else x_in_acc
            add_mm_(self.weight_grad_sum, dz_in(operand_dtype).T, x, product_dtype, alpha=self.unscale)
        if plan.needs_grad.bias:
            self.bias_grad_sum.add_(dz.sum(0), alpha=self.unscale)

    def finish_grads(self) -> Gradients:
        """Round the sums to the input dtype once and hand out the gradients."""
        dtype = self.plan.input_dtype
        if self.weight_grad_sum is not None:
            self.grads.weight = self.weight_grad_sum.to(dtype)  # the sum itself when it has the dtype
            self.weight_grad_sum = None
        if self.bias_grad_sum is not None:
            self.grads.bias = self.bias_grad_sum.to(dtype)
        return self.grads

    def chunks(self):
        n, size = self.problem.input.shape[0], self.plan.batch_chunk_size
        return (slice(start, min(start + size, n)) for start in range(0, n, size))


def scalar_loss_and_grads(plan: Plan, problem: Problem) -> tuple[torch.Tensor, Gradients]:
    """Loss for "mean"/"sum" and, as the plan requests, its gradients (already scaled for the reduction)."""
    call = _Call(plan, problem, with_grads=any(plan.needs_grad))
    total_weight = call.row_weight.sum(dtype=torch.float64)
    if plan.reduction == "mean":
        # An all-ignored batch has a 0/0 = NaN loss but must get zero gradients.
        grad_scale = torch.where(total_weight > 0, 1.0 / total_weight, 0.0).to(plan.stats_dtype)
    else:
        grad_scale = torch.ones((), dtype=plan.stats_dtype, device=problem.input.device)
    if any(plan.needs_grad):
        call.set_grad_logits_range(grad_scale)
    loss_sum = torch.zeros((), dtype=LOSS_SUM_DTYPE, device=problem.input.device)
    for rows in call.chunks():
        loss_sum += _scalar_chunk(call, rows, grad_scale)
    loss = loss_sum / total_weight if plan.reduction == "mean" else loss_sum
    return loss.to(plan.input_dtype), (call.finish_grads() if any(plan.needs_grad) else Gradients())


def _scalar_chunk(call: _Call, rows: slice, grad_scale: torch.Tensor) -> torch.Tensor:
    """One chunk of the scalar reductions: its loss sum (fp64), gradients accumulated into ``call``.

    A function of its own so that the chunk's buffers are freed when it returns.
    """
    z, x_in_acc = call.logits(rows)
    losses, _ = call.loss_and_softmax_(z, rows)
    if any(call.plan.needs_grad):
        dz = call.grad_logits_(z, grad_scale.expand(z.shape[0]), rows)
        call.accumulate_grads(dz, x_in_acc, rows)
    return losses.sum(dtype=LOSS_SUM_DTYPE)


def per_row_loss(plan: Plan, problem: Problem) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row losses for reduction="none" (input dtype) and the log-sum-exp rows backward reuses."""
    call = _Call(plan, problem, with_grads=False)
    n = problem.input.shape[0]
    losses = torch.empty(n, dtype=plan.input_dtype, device=problem.input.device)
    lse = torch.empty(n, dtype=plan.stats_dtype, device=problem.input.device)
    for rows in call.chunks():
        losses[rows], lse[rows] = call.loss_and_softmax_(call.logits(rows)[0], rows)
    return losses, lse


def per_row_grads(plan: Plan, problem: Problem, lse: torch.Tensor, grad_losses: torch.Tensor) -> Gradients:
    """Gradients of sum(grad_losses * losses) for reduction="none", recomputing logits chunk by chunk."""
    call = _Call(plan, problem, with_grads=True)
    scale = grad_losses.to(plan.stats_dtype)
    call.set_grad_logits_range(scale.abs().max() if scale.numel() else 0.0)
    for rows in call.chunks():
        _per_row_grad_chunk(call, rows, lse, scale)
    return call.finish_grads()


def _per_row_grad_chunk(call: _Call, rows: slice, lse: torch.Tensor, scale: torch.Tensor) -> None:
    z, x_in_acc = call.logits(rows)
    probs = z.sub_(lse[rows, None]).exp_()
    call.accumulate_grads(call.grad_logits_(probs, scale[rows], rows), x_in_acc, rows)
