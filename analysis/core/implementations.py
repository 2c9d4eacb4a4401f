"""Every compared implementation behind one signature: ``Implementation.run(inputs) -> Outputs``.

An implementation is named by an :class:`ImplSpec` (which op, which policy,
chunking and ``acc_dtype``) and built by :func:`make_implementation` for a
device. ``run`` does one forward and one backward (gradients with respect to
every leaf of the :class:`~analysis.core.inputs.Inputs`, from its ``grad_output``)
and returns detached outputs, so error, memory and time are all measured on
the same call; ``loss`` is the forward alone (gradcheck, loss-only studies).
Every op gets the same call arguments (:meth:`Inputs.loss_arguments`:
reduction, class weights, ``ignore_index``, label smoothing).

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
CPU memory and time. ``device="cuda-tf32"`` runs on the GPU with fp32 GEMMs
allowed to use TF32 (``torch.set_float32_matmul_precision("high")``, as many
training scripts set it) for the duration of each call.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F

import lce
from analysis.core.emulated_gemms import Fp32LowPrecisionGemms, emulated_peer_note
from analysis.core.inputs import Inputs, Outputs, outputs_of
from analysis.core.problem import DTYPES, Shape
from lce.planning.options import dtype_name
from lce.testing import emulate_device_kind
from lce.unfused import DEFAULT_IGNORE_INDEX, unfused_linear_cross_entropy

__all__ = ["ImplSpec", "Implementation", "OPS", "DEVICES", "make_implementation", "unavailable_reason", "meta_plan",
           "resolved_plan", "CUDA_DEVICES", "tensor_device"]

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
DEVICES = ("cpu", "cuda", "cuda-emulated", "cuda-tf32")
CUDA_DEVICES = ("cuda", "cuda-tf32")
"""The devices whose tensors live on the GPU (``cuda-tf32``: fp32 GEMMs may use TF32)."""


def tensor_device(device: str) -> str:
    """Where a run on ``device`` keeps its tensors: ``"cuda"`` for :data:`CUDA_DEVICES`, else ``"cpu"``."""
    if device not in DEVICES:
        raise ValueError(f"device must be one of {DEVICES}, got {device!r}")
    return "cuda" if device in CUDA_DEVICES else "cpu"


ROWS_PREFIX = "rows:"
"""``chunking="rows:K"`` asks for chunks of exactly K rows (``chunking_method=None, batch_chunk_size=K``)."""


@dataclasses.dataclass(frozen=True)
class ImplSpec:
    """Which op runs, and for the chunked ops with which options.

    ``policy`` is ``acc_policy``; ``chunking`` is a ``chunking_method``
    (``"auto"``, ``"aspect_ratio"``, ``"aspect_ratio:N"``) or ``"rows:K"`` for
    an explicit chunk size; ``acc_dtype`` is ``"default"`` (None: resolved by
    the options contract) or a dtype name; ``retain_graph`` is
    ``allow_retain_graph`` (gradcheck runs backward more than once). They are
    ignored (and should be left empty) for the unchunked ops.
    """

    op: str
    policy: str = ""
    chunking: str = ""
    acc_dtype: str = "default"
    retain_graph: bool = False
    classes: int | None = None
    """``class_chunk_size`` (lce's class tiling), None for none."""

    def __post_init__(self) -> None:
        if self.op not in OPS:
            raise ValueError(f"op must be one of {tuple(OPS)}, got {self.op!r}")
        if self.acc_dtype != "default" and self.acc_dtype not in DTYPES:
            raise ValueError(f"acc_dtype must be 'default' or one of {tuple(DTYPES)}, got {self.acc_dtype!r}")
        if self.chunking.startswith(ROWS_PREFIX):
            rows = self.chunking.removeprefix(ROWS_PREFIX)
            if not rows.isdigit() or int(rows) < 1:
                raise ValueError(f"chunking 'rows:K' needs an integer K >= 1, got {self.chunking!r}")

    @property
    def chunked(self) -> bool:
        return self.op in CHUNKED_OPS

    def options(self) -> lce.LinearCrossEntropyOptions:
        """lce's options for this spec (torch's op gets the same fields through ``.to_torch()``)."""
        if self.chunking.startswith(ROWS_PREFIX):
            chunking = dict(chunking_method=None, batch_chunk_size=int(self.chunking.removeprefix(ROWS_PREFIX)))
        else:
            chunking = dict(chunking_method=self.chunking or "auto")
        return lce.LinearCrossEntropyOptions(
            acc_policy=self.policy or "auto", acc_dtype=None if self.acc_dtype == "default" else DTYPES[self.acc_dtype],
            allow_retain_graph=self.retain_graph, class_chunk_size=self.classes, **chunking)

    def __str__(self) -> str:
        if not self.chunked:
            return self.op
        retain = ",retain_graph" if self.retain_graph else ""
        classes = f"x{self.classes}" if self.classes else ""
        return f"{self.op}[{self.policy},{self.chunking}{classes},acc={self.acc_dtype}{retain}]"


def meta_plan(spec: ImplSpec, shape: Shape, dtype: str, device_kind: str) -> lce.Plan:
    """lce's plan of ``spec`` (a chunked op) at ``shape`` in ``dtype`` under ``device_kind``'s layouts, made on meta
    tensors: nothing is allocated, so it serves LLM heads on any machine."""
    x = torch.empty(shape.N, shape.D, dtype=DTYPES[dtype], device="meta")
    weight = torch.empty(shape.C, shape.D, dtype=DTYPES[dtype], device="meta")
    with emulate_device_kind(device_kind):
        return lce.plan(x, weight, options=spec.options())


def unavailable_reason(op: str, device: str) -> str | None:
    """Why ``op`` cannot run on ``device`` here, or None if it can."""
    if op not in OPS:
        raise ValueError(f"op must be one of {tuple(OPS)}, got {op!r}")
    if device not in DEVICES:
        raise ValueError(f"device must be one of {DEVICES}, got {device!r}")
    if device in CUDA_DEVICES and not torch.cuda.is_available():
        return "no CUDA device"
    if device == "cuda-emulated" and op != "lce":
        return "only lce can emulate the CUDA layouts on CPU tensors"
    if op == "torch" and not hasattr(F, "linear_cross_entropy"):
        return f"torch {torch.__version__} has no torch.nn.functional.linear_cross_entropy"
    if op in ("liger", "cce"):
        module = {"liger": "liger_kernel", "cce": "cut_cross_entropy"}[op]
        if device not in CUDA_DEVICES:
            return f"{op} runs on CUDA only (Triton kernels)"
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed"
    return None


@contextlib.contextmanager
def float32_matmul_precision(precision: str) -> Iterator[None]:
    """``torch.set_float32_matmul_precision(precision)`` inside the block, the previous setting restored after."""
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(previous)


def _unfused(inputs: Inputs) -> torch.Tensor:
    return unfused_linear_cross_entropy(inputs.input, inputs.weight, inputs.target, **inputs.loss_arguments())


@dataclasses.dataclass
class Implementation:
    """A runnable implementation: ``run(inputs)`` is one forward + backward."""

    spec: ImplSpec
    device: str
    loss_fn: Callable[[Inputs], torch.Tensor]

    def run(self, inputs: Inputs) -> Outputs:
        """Loss and gradients (w.r.t. input, weight and bias if any) of one forward + backward, detached.

        torch's op and the reference run their bf16/fp16 GEMMs on fp32 copies where this CPU emulates them
        (:mod:`analysis.core.emulated_gemms`): the same arithmetic for the errors; whoever times them says so."""
        with self._context(inputs):
            return outputs_of(self.loss_fn(inputs), inputs)

    def loss(self, inputs: Inputs) -> torch.Tensor:
        """The loss of one forward, with its autograd graph unless called under ``torch.no_grad()``."""
        with self._context(inputs):
            return self.loss_fn(inputs)

    def emulated_note(self, inputs: Inputs) -> str | None:
        """Why this run's GEMMs are a stand-in's on this CPU (and its time and memory not the op's), or None."""
        return emulated_peer_note(self.spec.op, dtype_name(inputs.input.dtype), self.device)

    def _context(self, inputs: Inputs) -> contextlib.AbstractContextManager:
        if self.device == "cuda-emulated":
            return emulate_device_kind("cuda")
        if self.device == "cuda-tf32":
            return float32_matmul_precision("high")
        if self.emulated_note(inputs) is not None:
            return Fp32LowPrecisionGemms()
        return contextlib.nullcontext()

    def plan(self, inputs: Inputs) -> lce.Plan | None:
        """lce's resolved plan for these inputs (chunked ops), or None.

        torch's native op follows the same options contract, so its chunk size
        and count are lce's; its buffers are its own, so the plan's memory
        model is reported for ``lce`` only by the sweep.
        """
        if not self.spec.chunked:
            return None
        with self._context(inputs):
            return resolved_plan(self.spec, inputs)


def resolved_plan(spec: ImplSpec, inputs: Inputs) -> lce.Plan:
    """``lce.plan`` of ``spec``'s options for ``inputs`` (gradients planned for every leaf; lce's features as the
    inputs set them)."""
    return lce.plan(inputs.input, inputs.weight, options=spec.options(), linear_bias=inputs.bias,
                    reduction=inputs.reduction, softcap=inputs.softcap, z_loss=inputs.z_loss)


def make_implementation(spec: ImplSpec, device: str = "cpu") -> Implementation:
    """Build ``spec`` for ``device``; ``RuntimeError`` naming the reason if it cannot run here."""
    reason = unavailable_reason(spec.op, device)
    if reason is not None:
        raise RuntimeError(f"implementation {spec} cannot run on {device}: {reason}")
    return Implementation(spec, device, _LOSS_FACTORIES[spec.op](spec))


def _lce_loss(spec: ImplSpec) -> Callable[[Inputs], torch.Tensor]:
    options = spec.options()

    def loss(inputs: Inputs) -> torch.Tensor:
        return lce.linear_cross_entropy(inputs.input, inputs.weight, inputs.target, options=options,
                                        **inputs.loss_arguments())

    return loss


def _torch_loss(spec: ImplSpec) -> Callable[[Inputs], torch.Tensor]:
    options = spec.options().to_torch()

    def loss(inputs: Inputs) -> torch.Tensor:
        if inputs.has_features:
            raise ValueError(f"{spec}: torch's op has no softcap or z_loss; run lce or the reference instead")
        return F.linear_cross_entropy(inputs.input, inputs.weight, inputs.target, options=options,
                                      **inputs.loss_arguments())

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
        _plain_only(spec, inputs)
        return module(inputs.weight, inputs.input, inputs.target, inputs.bias)

    return loss


def _cce_loss(spec: ImplSpec) -> Callable[[Inputs], torch.Tensor]:  # pragma: no cover - CUDA only
    from cut_cross_entropy import linear_cross_entropy as cce

    def loss(inputs: Inputs) -> torch.Tensor:
        _plain_only(spec, inputs)
        if inputs.bias is not None:  # its linear_cross_entropy(e, c, targets, ...) takes no bias (25.1)
            raise ValueError("cce: Cut Cross-Entropy takes no linear bias; run it with bias=None")
        return cce(inputs.input, inputs.weight, inputs.target, reduction=inputs.reduction)

    return loss


def _plain_only(spec: ImplSpec, inputs: Inputs) -> None:  # pragma: no cover - CUDA only
    """Liger and CCE run the grids' plain calls only; other arguments would be dropped silently."""
    if (inputs.class_weight is not None or inputs.ignore_index != DEFAULT_IGNORE_INDEX or inputs.label_smoothing
            or inputs.grad_output is not None or inputs.has_features):
        raise ValueError(f"{spec.op} is run without class weights, ignore_index, label smoothing or grad_output")


_LOSS_FACTORIES: dict[str, Callable[[ImplSpec], Callable[[Inputs], torch.Tensor]]] = {
    "lce": _lce_loss,
    "torch": _torch_loss,
    "reference": _reference_loss,
    "compiled": _compiled_loss,
    "liger": _liger_loss,
    "cce": _cce_loss,
}
