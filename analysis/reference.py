"""The exact answer: loss and gradients in fp64 from the same rounded inputs.

:func:`reference_outputs` upcasts the (already rounded) inputs exactly to fp64
and evaluates the unfused formula ``cross_entropy(linear(x, W, b), y)``. fp64
carries 29 more mantissa bits than fp32, so its own error is negligible next to
any fp32/bf16/fp16 error measured against it.

:func:`gradcheck` wraps :func:`torch.autograd.gradcheck` (finite differences
in fp64) around one implementation, to check that the analytic gradients it
hands out are the derivatives of the loss it returns.
"""

from __future__ import annotations

import dataclasses

import torch

from lce.reference import reference_linear_cross_entropy

from .implementations import ImplSpec, make_implementation
from .inputs import Inputs, Outputs, outputs_of

__all__ = ["reference_outputs", "fp64_loss", "gradcheck"]


def fp64_loss(inputs: Inputs) -> torch.Tensor:
    """``cross_entropy(linear(input, W, b), target, ...)`` on ``inputs`` as given (no dtype change)."""
    return reference_linear_cross_entropy(inputs.input, inputs.weight, inputs.target, **inputs.loss_arguments())


def reference_outputs(inputs: Inputs) -> Outputs:
    """fp64 loss and gradients of ``inputs``; every value returned is fp64.

    ``inputs`` may be in any dtype: they are upcast exactly, so the reference
    sees precisely the rounded values the low-precision run sees. Backward
    starts from ``inputs.grad_output`` (for ``reduction="none"`` without one:
    the gradients of the sum of the per-row losses).
    """
    exact = inputs.to(torch.float64)
    return outputs_of(fp64_loss(exact), exact)


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
