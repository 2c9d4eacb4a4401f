"""Every compared implementation behind one signature: ``Implementation.run(inputs) -> Outputs``.

An implementation is named by an :class:`ImplSpec` (which op, which policy,
chunking method and ``acc_dtype``) and built by :func:`make_implementation`.
``run`` does one forward and one backward (gradients with respect to every
leaf of the :class:`~analysis.inputs.Inputs`) and returns detached outputs, so
error, memory and time are all measured on the same call.

Registered ops (:data:`OPS`):

* ``lce`` -- ``lce.linear_cross_entropy`` with ``lce.LinearCrossEntropyOptions``;
* ``torch`` -- torch 2.13's ``torch.nn.functional.linear_cross_entropy`` with
  ``torch.nn.LinearCrossEntropyOptions`` built from the same fields;
* ``reference`` -- the unfused ``cross_entropy(linear(x, W, b), y)`` in the
  input dtype (materializes the ``(N, C)`` logits);
* ``compiled`` -- ``torch.compile`` of that reference (slow to compile on CPU);
* ``liger`` / ``cce`` -- Liger-Kernel's fused linear cross-entropy and Apple's
  Cut Cross-Entropy, only when importable and on a CUDA device
  (:func:`unavailable_reason` says why not otherwise).

``device="cuda-emulated"`` runs lce's CUDA precision layouts on CPU tensors
(:func:`lce.testing.emulate_device_kind`): the numbers of the CUDA path, but
CPU memory and time.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
from collections.abc import Callable

import torch
import torch.nn.functional as F

import lce
from lce.reference import reference_linear_cross_entropy
from lce.testing import emulate_device_kind

from .inputs import DTYPES, Inputs, Outputs

__all__ = ["ImplSpec", "Implementation", "OPS", "DEVICES", "make_implementation", "unavailable_reason",
           "resolved_plan"]

OPS: dict[str, str] = {
    "lce": "lce.linear_cross_entropy (chunked, this repo)",
    "torch": "torch.nn.functional.linear_cross_entropy (torch 2.13, chunked)",
    "reference": "cross_entropy(linear(x, W, b), y), unfused, in the input dtype",
    "compiled": "torch.compile of the unfused reference",
    "liger": "Liger-Kernel fused linear cross-entropy (CUDA only)",
    "cce": "Cut Cross-Entropy (CUDA only)",
}
"""Every registered op and what it is."""

CHUNKED_OPS = ("lce", "torch")
DEVICES = ("cpu", "cuda", "cuda-emulated")


@dataclasses.dataclass(frozen=True)
class ImplSpec:
    """Which op runs, and for the chunked ops with which options.

    ``policy``/``chunking`` are ``LinearCrossEntropyOptions`` field values
    (``acc_policy`` / ``chunking_method``); ``acc_dtype`` is ``"default"``
    (None: resolved by the options contract) or a dtype name. They are ignored
    (and should be ``""``) for the unchunked ops.
    """

    op: str
    policy: str = ""
    chunking: str = ""
    acc_dtype: str = "default"

    def __post_init__(self) -> None:
        if self.op not in OPS:
            raise ValueError(f"op must be one of {tuple(OPS)}, got {self.op!r}")
        if self.acc_dtype != "default" and self.acc_dtype not in DTYPES:
            raise ValueError(f"acc_dtype must be 'default' or one of {tuple(DTYPES)}, got {self.acc_dtype!r}")

    @property
    def chunked(self) -> bool:
        return self.op in CHUNKED_OPS

    def options_fields(self) -> dict[str, object]:
        """Keyword arguments of ``LinearCrossEntropyOptions`` (lce's and torch's take the same)."""
        return dict(acc_policy=self.policy or "auto", chunking_method=self.chunking or "auto",
                    acc_dtype=None if self.acc_dtype == "default" else DTYPES[self.acc_dtype])

    def __str__(self) -> str:
        if not self.chunked:
            return self.op
        return f"{self.op}[{self.policy},{self.chunking},acc={self.acc_dtype}]"


def unavailable_reason(op: str, device: str) -> str | None:
    """Why ``op`` cannot run on ``device`` here, or None if it can."""
    if op not in OPS:
        raise ValueError(f"op must be one of {tuple(OPS)}, got {op!r}")
    if device not in DEVICES:
        raise ValueError(f"device must be one of {DEVICES}, got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        return "no CUDA device"
    if device == "cuda-emulated" and op != "lce":
        return "only lce can emulate the CUDA layouts on CPU tensors"
    if op == "torch" and not hasattr(F, "linear_cross_entropy"):
        return f"torch {torch.__version__} has no torch.nn.functional.linear_cross_entropy"
    if op in ("liger", "cce"):
        module = {"liger": "liger_kernel", "cce": "cut_cross_entropy"}[op]
        if device != "cuda":
            return f"{op} runs on CUDA only (Triton kernels)"
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed"
    return None


def _gradients(loss: torch.Tensor, inputs: Inputs) -> Outputs:
    grads = torch.autograd.grad(loss, inputs.leaves())
    return Outputs(loss.detach(), grads[0], grads[1], grads[2] if inputs.bias is not None else None)


def _unfused(inputs: Inputs) -> torch.Tensor:
    return reference_linear_cross_entropy(inputs.input, inputs.weight, inputs.target, linear_bias=inputs.bias,
                                          reduction=inputs.reduction)


@dataclasses.dataclass
class Implementation:
    """A runnable implementation: ``run(inputs)`` is one forward + backward."""

    spec: ImplSpec
    device: str
    loss_fn: Callable[[Inputs], torch.Tensor]

    def run(self, inputs: Inputs) -> Outputs:
        """Loss and gradients (w.r.t. input, weight and bias if any) of one call, detached."""
        with self._context():
            return _gradients(self.loss_fn(inputs), inputs)

    def _context(self) -> contextlib.AbstractContextManager:
        return emulate_device_kind("cuda") if self.device == "cuda-emulated" else contextlib.nullcontext()

    def plan(self, inputs: Inputs) -> lce.Plan | None:
        """lce's resolved plan for these inputs (chunked ops), or None.

        torch's native op follows the same options contract, so its chunk size
        and count are lce's; its buffers are its own, so the plan's memory
        model is reported for ``lce`` only by the sweep.
        """
        if not self.spec.chunked:
            return None
        with self._context():
            return resolved_plan(self.spec, inputs)


def resolved_plan(spec: ImplSpec, inputs: Inputs) -> lce.Plan:
    """``lce.plan`` of ``spec``'s options for ``inputs`` (gradients planned for every leaf)."""
    options = lce.LinearCrossEntropyOptions(**spec.options_fields())
    return lce.plan(options, inputs.input, inputs.weight, linear_bias=inputs.bias, reduction=inputs.reduction)


def make_implementation(spec: ImplSpec, device: str = "cpu") -> Implementation:
    """Build ``spec`` for ``device``; ``RuntimeError`` naming the reason if it cannot run here."""
    reason = unavailable_reason(spec.op, device)
    if reason is not None:
        raise RuntimeError(f"implementation {spec} cannot run on {device}: {reason}")
    return Implementation(spec, device, _LOSS_FACTORIES[spec.op](spec))


def _lce_loss(spec: ImplSpec) -> Callable[[Inputs], torch.Tensor]:
    options = lce.LinearCrossEntropyOptions(**spec.options_fields())

    def loss(inputs: Inputs) -> torch.Tensor:
        return lce.linear_cross_entropy(inputs.input, inputs.weight, inputs.target, linear_bias=inputs.bias,
                                        reduction=inputs.reduction, options=options)

    return loss


def _torch_loss(spec: ImplSpec) -> Callable[[Inputs], torch.Tensor]:
    options = lce.LinearCrossEntropyOptions(**spec.options_fields()).to_torch()

    def loss(inputs: Inputs) -> torch.Tensor:
        return F.linear_cross_entropy(inputs.input, inputs.weight, inputs.target, linear_bias=inputs.bias,
                                      reduction=inputs.reduction, options=options)

    return loss


def _reference_loss(spec: ImplSpec) -> Callable[[Inputs], torch.Tensor]:
    return _unfused


def _compiled_loss(spec: ImplSpec) -> Callable[[Inputs], torch.Tensor]:
    # Dynamo caches compiled code per Python function, across every torch.compile wrapper of it;
    # after config.recompile_limit (8) shapes/dtypes it silently runs eager. A sweep visits more
    # problems than that, so each compiled implementation starts from an empty cache.
    torch._dynamo.reset()
    return torch.compile(_unfused, dynamic=False)


def _liger_loss(spec: ImplSpec) -> Callable[[Inputs], torch.Tensor]:  # pragma: no cover - CUDA only
    from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

    module = LigerFusedLinearCrossEntropyLoss(reduction="mean")

    def loss(inputs: Inputs) -> torch.Tensor:
        return module(inputs.weight, inputs.input, inputs.target, inputs.bias)

    return loss


def _cce_loss(spec: ImplSpec) -> Callable[[Inputs], torch.Tensor]:  # pragma: no cover - CUDA only
    from cut_cross_entropy import linear_cross_entropy as cce

    def loss(inputs: Inputs) -> torch.Tensor:
        return cce(inputs.input, inputs.weight, inputs.target, bias=inputs.bias, reduction=inputs.reduction)

    return loss


_LOSS_FACTORIES: dict[str, Callable[[ImplSpec], Callable[[Inputs], torch.Tensor]]] = {
    "lce": _lce_loss,
    "torch": _torch_loss,
    "reference": _reference_loss,
    "compiled": _compiled_loss,
    "liger": _liger_loss,
    "cce": _cce_loss,
}
