"""The exact answer: loss and gradients in fp64 from the same rounded inputs.

:func:`reference_outputs` upcasts the (already rounded) inputs exactly to fp64
and evaluates the unfused formula ``cross_entropy(linear(x, W, b), y)``. fp64
carries 29 more mantissa bits than fp32, so its own error is negligible next to
any fp32/bf16/fp16 error measured against it.

:func:`gradcheck_lce` wraps :func:`torch.autograd.gradcheck` (finite
differences in fp64) around one chunked lce path, to check that the analytic
gradients lce hands out are the derivatives of the loss it returns.
"""

from __future__ import annotations

import torch

import lce
from lce.reference import reference_linear_cross_entropy

from .inputs import Inputs, Outputs, Shape, make_inputs

__all__ = ["reference_outputs", "fp64_loss", "gradcheck_lce"]


def fp64_loss(inputs: Inputs) -> torch.Tensor:
    """``cross_entropy(linear(input, W, b), target)`` on ``inputs`` as given (no dtype change)."""
    return reference_linear_cross_entropy(inputs.input, inputs.weight, inputs.target, linear_bias=inputs.bias,
                                          reduction=inputs.reduction)


def reference_outputs(inputs: Inputs) -> Outputs:
    """fp64 loss and gradients of ``inputs``; every value returned is fp64.

    ``inputs`` may be in any dtype: they are upcast exactly, so the reference
    sees precisely the rounded values the low-precision run sees. For
    ``reduction="none"`` the gradients are those of the sum of the per-row losses.
    """
    exact = inputs.to(torch.float64)
    loss = fp64_loss(exact)
    total = loss.sum() if loss.dim() else loss
    grads = torch.autograd.grad(total, exact.leaves())
    grad_bias = grads[2] if exact.bias is not None else None
    return Outputs(loss.detach(), grads[0], grads[1], grad_bias)


def gradcheck_lce(options: lce.LinearCrossEntropyOptions, shape: Shape | None = None, *,
                  bias: bool = True, reduction: str = "mean", seed: int = 0,
                  device_kind: str = "cpu") -> bool:
    """``torch.autograd.gradcheck`` of ``lce.linear_cross_entropy`` with ``options`` in fp64.

    ``options`` is copied with ``allow_retain_graph=True`` (gradcheck runs
    backward more than once) and ``acc_dtype=float64``. ``device_kind="cuda"``
    checks the CUDA layout on CPU tensors via :func:`lce.testing.emulate_device_kind`.
    Returns True or raises ``torch.autograd.gradcheck.GradcheckError``.
    """
    import dataclasses

    from lce.testing import emulate_device_kind

    options = dataclasses.replace(options, allow_retain_graph=True, acc_dtype=torch.float64)
    shape = shape or Shape(6, 4, 10)
    inputs = make_inputs(shape, torch.float64, seed=seed, bias=bias, reduction=reduction)

    def loss(x: torch.Tensor, w: torch.Tensor, *maybe_bias: torch.Tensor) -> torch.Tensor:
        b = maybe_bias[0] if maybe_bias else None
        with emulate_device_kind(device_kind):
            return lce.linear_cross_entropy(x, w, inputs.target, linear_bias=b, reduction=reduction,
                                            options=options)

    return torch.autograd.gradcheck(loss, tuple(inputs.leaves()), eps=1e-6, atol=1e-8, rtol=1e-6)
