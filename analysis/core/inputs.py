"""The inputs of one run and the outputs every implementation returns.

Inputs are drawn in fp32 from a seeded generator and rounded *once* to the
run's dtype; those rounded tensors are what the implementation under test
sees, and their exact fp64 upcast is what :mod:`analysis.core.fp64` sees, so
an error measured against the reference is the op's own error, never the
error of rounding the inputs.
"""

from __future__ import annotations

import dataclasses

import torch

from analysis.core.problem import DTYPES, Shape
from lce.unfused import DEFAULT_IGNORE_INDEX

__all__ = ["Shape", "Inputs", "Outputs", "outputs_of", "make_inputs", "rounded_inputs", "OUTPUT_NAMES", "DTYPES"]

OUTPUT_NAMES: tuple[str, ...] = ("loss", "grad_input", "grad_weight", "grad_bias")
"""The outputs compared against fp64, in CSV column order."""


@dataclasses.dataclass
class Inputs:
    """Everything one call of the op takes: leaf tensors in one dtype on one device, and the loss's options.

    ``input`` (N, D), ``weight`` (C, D) and ``bias`` (C,) or None require
    grad; ``target`` is (N,) int64 in ``[0, C)`` (or ``ignore_index``).
    ``class_weight`` (C,) in the input dtype, ``reduction``, ``ignore_index``
    and ``label_smoothing`` are the loss's keyword arguments (the defaults
    are torch's); ``softcap`` and ``z_loss`` are lce's features beyond
    torch's op (off by default; only lce and the reference formula take
    them). Backward starts from ``grad_output`` (shaped like the loss); None
    means the gradient of the loss's sum.
    """

    input: torch.Tensor
    weight: torch.Tensor
    bias: torch.Tensor | None
    target: torch.Tensor
    reduction: str = "mean"
    class_weight: torch.Tensor | None = None
    ignore_index: int = DEFAULT_IGNORE_INDEX
    label_smoothing: float = 0.0
    grad_output: torch.Tensor | None = None
    softcap: float | None = None
    z_loss: float = 0.0

    @property
    def has_features(self) -> bool:
        """Whether lce's soft-capping or z-loss is on (torch's op has neither)."""
        return self.softcap is not None or bool(self.z_loss)

    @property
    def dtype(self) -> torch.dtype:
        return self.input.dtype

    @property
    def shape(self) -> Shape:
        return Shape(self.input.shape[0], self.input.shape[1], self.weight.shape[0])

    def leaves(self) -> list[torch.Tensor]:
        """The tensors gradients are taken with respect to, in OUTPUT_NAMES order."""
        return [t for t in (self.input, self.weight, self.bias) if t is not None]

    def with_leaves(self, *leaves: torch.Tensor) -> Inputs:
        """These inputs with :meth:`leaves` replaced by ``leaves`` (same order; e.g. gradcheck's)."""
        if len(leaves) != len(self.leaves()):
            raise ValueError(f"leaves must be {len(self.leaves())} tensors (input, weight[, bias]), got {len(leaves)}")
        bias = leaves[2] if self.bias is not None else None
        return dataclasses.replace(self, input=leaves[0], weight=leaves[1], bias=bias)

    def loss_arguments(self) -> dict[str, object]:
        """Keyword arguments of ``linear_cross_entropy`` (lce's, torch's and the reference's) besides the options;
        ``softcap`` and ``z_loss`` only when on (torch's op does not take them)."""
        arguments = dict(linear_bias=self.bias, weight=self.class_weight, reduction=self.reduction,
                         ignore_index=self.ignore_index, label_smoothing=self.label_smoothing)
        if self.softcap is not None:
            arguments["softcap"] = self.softcap
        if self.z_loss:
            arguments["z_loss"] = self.z_loss
        return arguments

    def to(self, dtype: torch.dtype) -> Inputs:
        """Exact upcast (or rounding) of every float tensor to ``dtype``; the leaves are fresh leaves."""

        def leaf(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.detach().to(dtype).requires_grad_(True)

        def value(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.detach().to(dtype)

        return dataclasses.replace(self, input=leaf(self.input), weight=leaf(self.weight), bias=leaf(self.bias),
                                   class_weight=value(self.class_weight), grad_output=value(self.grad_output))


@dataclasses.dataclass
class Outputs:
    """Loss (0-dim, or (N,) for ``reduction="none"``) and gradients, detached; ``grad_bias`` is None without a bias."""

    loss: torch.Tensor
    grad_input: torch.Tensor
    grad_weight: torch.Tensor
    grad_bias: torch.Tensor | None = None

    def get(self, name: str) -> torch.Tensor | None:
        if name not in OUTPUT_NAMES:
            raise ValueError(f"name must be one of {OUTPUT_NAMES}, got {name!r}")
        return getattr(self, name)


def outputs_of(loss: torch.Tensor, inputs: Inputs) -> Outputs:
    """``loss`` and its gradients with respect to every leaf of ``inputs``, from ``inputs.grad_output``.

    Gradients are returned, never accumulated into the leaves' ``.grad``.
    """
    if inputs.grad_output is not None:
        grads = torch.autograd.grad(loss, inputs.leaves(), inputs.grad_output)
    else:
        grads = torch.autograd.grad(loss.sum() if loss.dim() else loss, inputs.leaves())
    return Outputs(loss.detach(), grads[0], grads[1], grads[2] if inputs.bias is not None else None)


def make_inputs(shape: Shape, dtype: torch.dtype, *, family: str = "random", seed: int = 0, bias: bool = True,
                device: str | torch.device = "cpu", reduction: str = "mean") -> Inputs:
    """Seeded inputs of ``family`` (:mod:`analysis.core.families`) rounded once to ``dtype``.

    The family draws fp32 tensors on the CPU, so the same seed gives the same
    values on every device; :func:`rounded_inputs` rounds them to ``dtype`` and
    moves them to ``device`` as fresh leaves.
    """
    from analysis.core.families import draw

    if dtype not in DTYPES.values():
        raise ValueError(f"dtype must be one of {list(DTYPES)}, got {dtype}")
    return rounded_inputs(draw(family, shape, seed=seed, bias=bias), dtype, device=device, reduction=reduction)


def rounded_inputs(drawn, dtype: torch.dtype, *, device: str | torch.device = "cpu",
                   reduction: str = "mean") -> Inputs:
    """A family's fp32 draw (:class:`analysis.core.families.Draw`) rounded once to ``dtype`` on ``device``, as
    leaves."""

    def leaf(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t.to(device=device, dtype=dtype).requires_grad_(True)

    return Inputs(leaf(drawn.x), leaf(drawn.weight), leaf(drawn.bias), drawn.target.to(device), reduction)
