"""The exact answer: loss and gradients in fp64 from the same rounded inputs.

:func:`reference_outputs` upcasts the (already rounded) inputs exactly to fp64
and evaluates the loss and its gradients in closed form, a bounded block of
rows at a time (:data:`REFERENCE_BLOCK_ELEMENTS` logits), so its memory stays
bounded at any N x C. fp64 carries 29 more mantissa bits than fp32, so its own
error is negligible next to any fp32/bf16/fp16 error measured against it --
provided nothing cancels. The textbook formulas do cancel where a row is
predicted with near certainty: ``lse - z_y`` and ``p_y - 1`` subtract numbers
that agree in every digit fp64 has once the other classes' share ``1 - p_y``
falls below about 1e-16 (a 37-nat margin). The reference therefore sums the
other classes' exponentials apart from the target's (``other``) and forms

* the row loss as ``log1p(other / e_y)`` when the target dominates
  (``e_y >= other``), ``log(e_y + other) - (z_y - max)`` otherwise;
* the target's entry of ``softmax - onehot`` as ``-other / (e_y + other)``.

Label smoothing, lce's soft-capping and z-loss, and K-dimensional weights
fall back to autograd through the unfused formula in fp64, as does a "mean"
over a batch whose every row is ignored (whose value is torch's NaN).

:func:`gradcheck` wraps :func:`torch.autograd.gradcheck` (finite differences
in fp64) around one implementation, to check that the analytic gradients it
hands out are the derivatives of the loss it returns.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import torch

from analysis.core.implementations import ImplSpec, make_implementation
from analysis.core.inputs import Inputs, Outputs, outputs_of
from lce.unfused import unfused_linear_cross_entropy

__all__ = ["reference_outputs", "residual_blocks", "fp64_loss", "gradcheck", "REFERENCE_BLOCK_ELEMENTS"]

F64 = torch.float64

REFERENCE_BLOCK_ELEMENTS = 2**24
"""Logits per block of rows of the fp64 reference (128 MiB of fp64; a few such buffers are live at once)."""


def fp64_loss(inputs: Inputs) -> torch.Tensor:
    """``cross_entropy(linear(input, W, b), target, ...)`` on ``inputs`` as given (no dtype change, unfused)."""
    return unfused_linear_cross_entropy(inputs.input, inputs.weight, inputs.target, **inputs.loss_arguments())


def reference_outputs(inputs: Inputs, *, block_elements: int = REFERENCE_BLOCK_ELEMENTS) -> Outputs:
    """fp64 loss and gradients of ``inputs``; every value returned is fp64.

    ``inputs`` may be in any dtype: they are upcast exactly, so the reference
    sees precisely the rounded values the low-precision run sees. Backward
    starts from ``inputs.grad_output`` (for ``reduction="none"`` without one:
    the gradients of the sum of the per-row losses).
    """
    exact = inputs.to(F64)
    if exact.label_smoothing or exact.has_features or exact.weight.dim() != 2 or exact.input.dim() != 2:
        return outputs_of(fp64_loss(exact), exact)
    target = exact.target
    valid = target != exact.ignore_index
    row_weight = valid.to(F64)
    if exact.class_weight is not None:
        row_weight = row_weight * exact.class_weight[target.clamp_min(0).where(valid, 0)]
    if exact.reduction == "mean" and row_weight.sum() == 0:
        return outputs_of(fp64_loss(exact), exact)
    return _closed_form(exact, target, valid, row_weight, block_elements)


def residual_blocks(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, target: torch.Tensor,
                    block_elements: int = REFERENCE_BLOCK_ELEMENTS
                    ) -> Iterator[tuple[slice, torch.Tensor, torch.Tensor]]:
    """``(rows, softmax - onehot, row losses)`` of fp64 ``x @ w.T + b`` one block of rows at a time.

    ``target`` holds a class index for every row (callers map ignored rows to a valid class and drop
    them themselves). Both the residual's target entry and the loss are formed without cancellation
    (see the module docstring). The residual is a fresh ``(rows, C)`` block the caller may overwrite.
    """
    n, c = x.shape[0], w.shape[0]
    rows_per_block = max(1, block_elements // c)
    for start in range(0, n, rows_per_block):
        block = slice(start, min(n, start + rows_per_block))
        rows = torch.arange(block.stop - start, device=x.device)
        y = target[block]
        z = x[block] @ w.T
        if b is not None:
            z += b
        z -= z.amax(1, keepdim=True)
        shifted_target = z[rows, y]
        z.exp_()  # z now holds each class's exponential, relative to the row's max
        exp_target = z[rows, y].clone()
        z[rows, y] = 0.0
        other = z.sum(1)
        total = exp_target + other
        losses = torch.where(exp_target >= other, torch.log1p(other / exp_target), total.log() - shifted_target)
        z /= total[:, None]
        z[rows, y] = -other / total
        yield block, z, losses


def _closed_form(exact: Inputs, target: torch.Tensor, valid: torch.Tensor, row_weight: torch.Tensor,
                 block_elements: int) -> Outputs:
    x, w = exact.input.detach(), exact.weight.detach()
    b = None if exact.bias is None else exact.bias.detach()
    n, c, device = x.shape[0], w.shape[0], x.device
    if exact.reduction == "none":
        coefficient = row_weight if exact.grad_output is None else row_weight * exact.grad_output
    else:
        scale = 1.0 if exact.grad_output is None else exact.grad_output
        total_weight = row_weight.sum() if exact.reduction == "mean" else torch.ones((), dtype=F64, device=device)
        coefficient = row_weight * (scale / total_weight)
    losses = torch.empty(n, dtype=F64, device=device)
    grad_input = torch.empty_like(x)
    grad_weight = torch.zeros_like(w)
    grad_bias = torch.zeros(c, dtype=F64, device=device) if b is not None else None
    for block, z, block_losses in residual_blocks(x, w, b, target.where(valid, 0), block_elements):
        losses[block] = block_losses
        z *= coefficient[block, None]  # rows that are ignored (coefficient 0) drop out here
        grad_input[block] = z @ w
        grad_weight.addmm_(z.T, x[block])
        if grad_bias is not None:
            grad_bias += z.sum(0)
    losses = torch.where(valid, losses * row_weight, 0.0)
    if exact.reduction == "none":
        loss = losses
    elif exact.reduction == "sum":
        loss = losses.sum()
    else:
        loss = losses.sum() / row_weight.sum()
    return Outputs(loss, grad_input, grad_weight, grad_bias)


def gradcheck(spec: ImplSpec, inputs: Inputs, *, device: str = "cpu", raise_exception: bool = True) -> bool:
    """``torch.autograd.gradcheck`` of ``spec``'s loss on ``device`` at ``inputs`` (fp64), w.r.t. every leaf.

    Chunked ops run with ``allow_retain_graph=True`` (gradcheck runs backward
    more than once); with fp64 inputs and ``acc_dtype="default"`` they
    accumulate in fp64. ``device="cuda-emulated"`` checks lce's CUDA layouts
    on CPU tensors. Returns True, or False / raises
    ``torch.autograd.gradcheck.GradcheckError`` per ``raise_exception``.
    """
    if inputs.dtype != torch.float64:
        raise ValueError(f"gradcheck needs fp64 inputs, got {inputs.dtype}")
    implementation = make_implementation(dataclasses.replace(spec, retain_graph=spec.chunked), device)

    def loss(*leaves: torch.Tensor) -> torch.Tensor:
        return implementation.loss(inputs.with_leaves(*leaves))

    return torch.autograd.gradcheck(loss, tuple(inputs.leaves()), eps=1e-6, atol=1e-8, rtol=1e-6,
                                    raise_exception=raise_exception)
