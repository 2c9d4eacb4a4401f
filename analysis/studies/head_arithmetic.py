"""The weight gradient of lce's CUDA layouts, restated in a few vectorised tensor ops for long head-only runs.

The head-only study (:mod:`analysis.studies.head_training`) takes 10^4 steps per arm and seed, and
lce's CUDA layouts, emulated on CPU tensors, cost about 4 ms per chunk at a (2048, 64) head (a
compact step at 256 chunks: about 1 s). This module computes the *same arithmetic* in a handful
of whole-batch ops: for input dtype ``t`` (bf16 or fp16), fp32 ``acc_dtype`` and a mean over ``N``
rows cut into ``num_chunks`` contiguous chunks of ``ceil(N / num_chunks)`` rows,

* logits ``z = x_t @ W_t.T`` with exact products and fp32 sums (the layouts' mixed-precision GEMM);
  ``dz = softmax(z) - onehot(y)`` in fp32;
* ``accurate``: ``grad_W = round_t(s * dz.T @ x_t)``, one fp32 GEMM, one rounding;
* ``balanced``: ``dz`` rounded to ``t`` first, its target entries' rounding residual added back in the fp32 sum
  (:class:`lce.passes.gradients.TargetResidual`: the target entries count unrounded), then one rounding;
* ``compact``: ``dz`` rounded to ``t``; each chunk's product ``s * dz_j.T @ x_j`` (fp32) is added to
  the gradient *in* ``t``: ``g = round_t(g + product_j)``, once per chunk, in chunk order (a sum in ``t`` takes
  no residual);
* the input gradient (``with_input``): ``round_t(s * dz @ W_t)``, ``dz`` rounded with its target entries'
  residual added back, except in accurate, whose ``dz`` is not rounded;

where ``s = 1 / N`` multiplies the products. In fp16 lce keeps the gradient scaled by a power of two
``sigma`` (:mod:`lce.passes.headroom`): chosen from the fp32 sum's largest entry for accurate and balanced, and for
compact kept by :class:`lce.passes.headroom.RunningSum` from a bound on each chunk's product; backward then
multiplies the stored gradient by ``loss_scale / sigma`` in fp32 and rounds once, so a loss scale decides the
rounding of the entries fp16 could not hold at their true size. The result is returned unscaled in fp32, with
a flag saying whether it is finite (a loss-scaled step overflows). ``headroom=False`` restates lce before
the headroom (issue 31): the gradient rounded at its true size, the loss scale multiplied in afterwards.

The restatement differs from lce only in the order of fp32 sums inside a GEMM. That it is lce's
arithmetic is checked, not assumed: :func:`check_against_lce` runs lce itself on the same inputs and
the tests require the two gradients to agree to within a small fraction of the gradient's own
rounding error, and the study re-measures the bias ratio with lce at every checkpoint.
"""

from __future__ import annotations

import math

import torch

import lce
from lce.passes.headroom import STORE_LIMIT, RunningSum, largest_entry, power_of_two_under
from lce.testing import emulate_device_kind

__all__ = ["POLICIES", "HeadStep", "head_step", "restated_loss", "grad_logits_scale", "chunk_rows",
           "lce_weight_gradient", "check_against_lce"]

POLICIES: tuple[str, ...] = ("accurate", "balanced", "compact")


class HeadStep:
    """One forward and weight-gradient of the head: ``loss`` (fp32 scalar, mean over rows), ``grad_weight``
    ((C, D) fp32, unscaled), ``finite`` (False when the scaled gradient overflowed its dtype) and, when asked for,
    ``grad_input`` (as lce stores it: the (N, D) gradient in the input dtype and its per-chunk scales) and
    ``stored_weight`` (the weight gradient as lce stores it, and its scale)."""

    __slots__ = ("loss", "grad_weight", "finite", "grad_input", "stored_weight")

    def __init__(self, loss: torch.Tensor, grad_weight: torch.Tensor, finite: bool, grad_input=None,
                 stored_weight: tuple[torch.Tensor, float] | None = None):
        self.loss, self.grad_weight, self.finite, self.grad_input = loss, grad_weight, finite, grad_input
        self.stored_weight = stored_weight


def chunk_rows(num_rows: int, num_chunks: int) -> int:
    """Rows per chunk when ``num_rows`` are cut into ``num_chunks`` (the last chunk may be shorter)."""
    if num_chunks < 1 or num_chunks > num_rows:
        raise ValueError(f"num_chunks must lie in 1..{num_rows} (the rows), got {num_chunks}")
    return -(-num_rows // num_chunks)


def grad_logits_scale(num_rows: int, dtype: torch.dtype) -> tuple[float, float]:
    """``(row_scale, rescale)``: the mean's ``1 / N``, and the power of two lce divides ``dz`` by before rounding
    it to fp16 (``dz`` then peaks near 2**13, far from fp16's subnormals; 1.0 for bf16, whose range is fp32's)."""
    row_scale = 1.0 / num_rows
    if dtype != torch.float16:
        return row_scale, 1.0
    return row_scale, 2.0 ** (math.ceil(math.log2(2.0 * row_scale)) - 14)


def head_step(x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, dtype: torch.dtype, policy: str,
              num_chunks: int, loss_scale: float = 1.0, *, with_input: bool = False,
              headroom: bool = True) -> HeadStep:
    """lce's CUDA-layout loss and weight gradient for fp32 ``x`` (N, D) and ``weight`` (C, D), both rounded to
    ``dtype`` first (see the module docstring), as lce returns them under an incoming gradient ``loss_scale``,
    divided by it again. ``with_input`` also forms the input gradient, ``round_t(s * dz @ W_t)`` with fp32 sums
    (``dz`` rounded first except in accurate; in fp16 stored scaled per chunk as lce does), whose rows do not
    depend on the chunking of the weight gradient. ``headroom=False``: lce before :mod:`lce.passes.headroom`."""
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {list(POLICIES)}, got {policy!r}")
    if dtype not in (torch.bfloat16, torch.float16):
        raise TypeError(f"dtype must be torch.bfloat16 or torch.float16, got {dtype}")
    n = x.shape[0]
    rows = chunk_rows(n, num_chunks)
    row_scale, rescale = grad_logits_scale(n, dtype)
    headroom = headroom and dtype == torch.float16
    x_t = x.to(dtype).float()  # exact: the rounded values, held in fp32 for the fp32-sum GEMMs
    w_t = weight.to(dtype).float()
    z = x_t @ w_t.T
    log_p = torch.log_softmax(z, dim=1)
    loss = -log_p.gather(1, target[:, None]).mean()
    dz = log_p.exp_()
    dz[torch.arange(n), target] -= 1.0
    dz.mul_(row_scale / rescale)
    with_residual = dz  # accurate: dz is not rounded
    if policy != "accurate":
        exact_targets = dz[torch.arange(n), target]
        dz = dz.to(dtype).float()
        with_residual = dz.clone()
        with_residual[torch.arange(n), target] = exact_targets
    if policy == "compact":
        stored, sigma = _compact_sum(dz, x_t, rows, rescale, dtype, headroom)
    else:
        total = (with_residual.T @ x_t).mul_(rescale)
        sigma = power_of_two_under(STORE_LIMIT, largest_entry(total)) if headroom else 1.0
        stored = total.mul_(sigma).to(dtype)
    returned = _returned(stored, sigma, loss_scale, headroom)
    grad_input = _grad_input(with_residual, w_t, rows, rescale, dtype, headroom) if with_input else None
    finite = bool(torch.isfinite(returned).all())
    return HeadStep(loss, returned.float().div_(loss_scale), finite, grad_input, (stored, sigma))


def _returned(stored: torch.Tensor, sigma: float, loss_scale: float, headroom: bool) -> torch.Tensor:
    """The gradient lce hands out: ``stored * (loss_scale / sigma)`` in fp32, rounded once (with the headroom), or
    the stored gradient times the loss scale in its dtype (before it)."""
    if headroom:
        return stored.mul(loss_scale / sigma)
    return stored.mul(torch.tensor(loss_scale, dtype=stored.dtype))


def _grad_input(dz: torch.Tensor, w_t: torch.Tensor, rows: int, rescale: float, dtype: torch.dtype,
                headroom: bool) -> tuple[torch.Tensor, tuple[tuple[slice, float], ...]]:
    """The input gradient as lce stores it (rounded to ``dtype``) and its per-chunk scales."""
    stored = torch.empty(dz.shape[0], w_t.shape[1], dtype=dtype)
    scales = []
    weight_max = largest_entry(w_t)
    for start in range(0, dz.shape[0], rows):
        block = slice(start, min(start + rows, dz.shape[0]))
        sigma = 1.0
        if headroom:
            bound = rescale * largest_entry(torch.linalg.vector_norm(dz[block], ord=1, dim=1)) * weight_max
            sigma = power_of_two_under(STORE_LIMIT, bound)
        stored[block] = (dz[block] @ w_t).mul_(rescale * sigma).to(dtype)
        scales.append((block, sigma))
    return stored, tuple(scales)


class _RestatedLoss(torch.autograd.Function):
    """The restated op as an autograd function: gradients formed in forward, multiplied by the incoming gradient
    in backward as lce does for a scalar loss (over their stored scales in fp32, rounded once, in fp16)."""

    @staticmethod
    def forward(ctx, hidden, weight, target, dtype, policy, num_chunks):
        step = head_step(hidden.detach().float(), weight.detach().float(), target, dtype, policy, num_chunks,
                         with_input=True)
        ctx.grads = (step.grad_input, step.stored_weight)
        ctx.dtypes = (hidden.dtype, weight.dtype)
        return step.loss

    @staticmethod
    def backward(ctx, grad_loss):
        (stored_input, input_scales), (stored_weight, weight_scale) = ctx.grads
        ctx.grads = None
        incoming = float(grad_loss)
        grad_input = torch.empty_like(stored_input)
        for rows, sigma in input_scales:
            torch.mul(stored_input[rows], incoming / sigma, out=grad_input[rows])
        grad_weight = stored_weight.mul(incoming / weight_scale)
        return grad_input.to(ctx.dtypes[0]), grad_weight.to(ctx.dtypes[1]), None, None, None, None


def restated_loss(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, dtype: torch.dtype, policy: str,
                  num_chunks: int) -> torch.Tensor:
    """The mean loss of lce's CUDA layout ``policy`` at ``num_chunks`` chunks on ``hidden`` and ``weight`` rounded
    to ``dtype``, differentiable: the input and weight gradients are lce's (rounded to ``dtype``), restated. For
    training runs whose lce arms would spend hours in the emulated layouts."""
    return _RestatedLoss.apply(hidden, weight, target, dtype, policy, num_chunks)


def _compact_sum(dz: torch.Tensor, x: torch.Tensor, rows: int, scale: float, dtype: torch.dtype,
                 headroom: bool) -> tuple[torch.Tensor, float]:
    """``g = round(g + alpha * dz_j.T @ x_j)`` over the chunks ``j`` of ``rows`` rows, in order: each chunk's
    product is added to the fp32 copy of the rounded sum by one ``addmm_`` and the sum rounded again; with the
    headroom ``alpha`` is ``scale`` times :class:`lce.passes.headroom.RunningSum`'s scale, as lce keeps it. Returns the
    sum and its scale."""
    total = torch.zeros(dz.shape[1], x.shape[1], dtype=torch.float32)
    rounded = torch.zeros(total.shape, dtype=dtype)
    running = RunningSum(rounded) if headroom else None
    for start in range(0, dz.shape[0], rows):
        alpha = scale
        if running is not None:
            chunk, block = dz[start:start + rows], x[start:start + rows]
            bound = scale * largest_entry(torch.linalg.vector_norm(chunk, ord=1, dim=0)) * largest_entry(block)
            alpha = scale * running.scale_for(bound)
            total.copy_(rounded)  # the running sum may have been divided by a power of two
        total.addmm_(dz[start:start + rows].T, x[start:start + rows], alpha=alpha)
        rounded.copy_(total)
        total.copy_(rounded)
    return rounded, (running.scale or 1.0) if running is not None else 1.0


def lce_weight_gradient(x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, dtype: torch.dtype,
                        policy: str, num_chunks: int, loss_scale: float = 1.0, *,
                        with_loss: bool = False) -> torch.Tensor | HeadStep:
    """lce's own weight gradient (its CUDA layout: emulated on CPU tensors, real on CUDA ones) for the same inputs
    as :func:`head_step`, unscaled, in fp32: the arithmetic :func:`head_step` restates. ``with_loss``: a
    :class:`HeadStep` (loss, gradient, finite) instead."""
    options = lce.LinearCrossEntropyOptions(acc_policy=policy, chunking_method=None,
                                            batch_chunk_size=chunk_rows(x.shape[0], num_chunks),
                                            acc_dtype=torch.float32)
    w = weight.detach().to(dtype, copy=True).requires_grad_(True)
    with emulate_device_kind("cuda"):
        loss = lce.linear_cross_entropy(x.to(dtype), w, target, options=options)
    (loss * loss_scale).backward() if loss_scale != 1.0 else loss.backward()
    grad = w.grad.float()
    if not with_loss:
        return grad.div_(loss_scale)
    return HeadStep(loss.detach().float(), grad.div_(loss_scale), bool(torch.isfinite(grad).all()))


def check_against_lce(x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, dtype: torch.dtype,
                      policy: str, num_chunks: int, loss_scale: float = 1.0) -> dict[str, float]:
    """How far :func:`head_step`'s gradient is from lce's, against the gradient's rounding error.

    ``mismatch_over_error``: ``||g_restated - g_lce|| / ||g_lce - g_fp64||`` (the fp64 gradient of the rounded
    inputs); ``elements_differing``: the share of elements that differ at all; ``ulps_max``: the largest
    difference in units of ``dtype``'s spacing at that element.
    """
    restated = head_step(x, weight, target, dtype, policy, num_chunks, loss_scale).grad_weight
    own = lce_weight_gradient(x, weight, target, dtype, policy, num_chunks, loss_scale)
    x64, w64 = x.to(dtype).double(), weight.to(dtype).double()
    p = torch.softmax(x64 @ w64.T, dim=1)
    p[torch.arange(x.shape[0]), target] -= 1.0
    exact = p.T @ x64 / x.shape[0]
    error = torch.linalg.vector_norm(own.double() - exact).item()
    difference = restated.double() - own.double()
    spacing = _spacing(own, dtype)
    return {"mismatch_over_error": torch.linalg.vector_norm(difference).item() / error if error else math.inf,
            "elements_differing": float((difference != 0).double().mean()),
            "ulps_max": float((difference.abs() / spacing).max())}


def _spacing(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The spacing of ``dtype`` at each of ``values`` (its smallest subnormal spacing at zero), in fp64."""
    info = torch.finfo(dtype)
    exponent = torch.floor(torch.log2(values.double().abs().clamp_min(info.tiny)))
    return torch.exp2(exponent - _MANTISSA_BITS[dtype])


_MANTISSA_BITS = {torch.bfloat16: 7, torch.float16: 10}
