"""Which layout table a call uses ("cpu" or "cuda"), and what its device can do: the planner's only source of both.

:func:`device_kind_of` is the only place lce looks at a device's type; the chunk loop never does.
:func:`planned_as` makes plans for another device kind (the decision procedure's what-ifs; the CUDA layouts on CPU
tensors through :func:`lce.testing.emulate_device_kind`). The CUDA GEMM capabilities the plan records --
``torch.mm`` and ``torch.addmm`` with an fp32 ``out_dtype`` for bf16/fp16 operands -- are probed here once per
device on tiny tensors (:func:`mixed_mm_supported`, :func:`mixed_addmm_supported`); the CPU's GEMM verdicts are
:mod:`lce.planning.cpu_gemms`', and the Triton kernels' availability :mod:`lce.kernels`'.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Iterator

import torch

__all__ = ["DEVICE_KINDS", "DEVICE_KIND_OVERRIDE", "planned_as", "device_kind_of", "has_mixed_precision_mm",
           "mixed_mm_supported", "mixed_addmm_supported"]

DEVICE_KINDS: tuple[str, ...] = ("cpu", "cuda")
"""Device kinds with a layout table of their own (:data:`lce.planning.policies.LAYOUTS`)."""

DEVICE_KIND_OVERRIDE: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "lce_device_kind_override", default=None
)


@contextlib.contextmanager
def planned_as(kind: str) -> Iterator[None]:
    """Inside it, plans are made as for a device of ``kind`` ("cpu" or "cuda") whatever the tensors' device: the
    decision procedure's what-if plans for another device, and (:func:`lce.testing.emulate_device_kind`) the CUDA
    layouts run on CPU tensors."""
    if kind not in DEVICE_KINDS:
        raise ValueError(f"kind must be one of {DEVICE_KINDS}, got {kind!r}")
    token = DEVICE_KIND_OVERRIDE.set(kind)
    try:
        yield
    finally:
        DEVICE_KIND_OVERRIDE.reset(token)


def device_kind_of(device: torch.device) -> str:
    """The layout table a device uses: "cuda" for CUDA, "cpu" for everything else (or the override)."""
    override = DEVICE_KIND_OVERRIDE.get()
    if override is not None:
        return override
    return "cuda" if device.type == "cuda" else "cpu"


def has_mixed_precision_mm(device: torch.device, kind: str, dtype: torch.dtype) -> bool:
    """Whether fp16/bf16 GEMMs with a fp32 result are available (the "auto" acc_dtype rule).

    Emulated CUDA (CPU tensors planned as CUDA), and a CUDA device planned on a machine without one (what
    :func:`lce.recommend` answers for "cuda" there), assume a current GPU (sm80 or newer).
    """
    if dtype not in (torch.float16, torch.bfloat16):
        return False
    if kind == "cpu" or device.type != "cuda" or not torch.cuda.is_available():
        return True
    major, _ = torch.cuda.get_device_capability(device)
    return major >= (8 if dtype == torch.bfloat16 else 7)


_PROBE_ERRORS = (TypeError, RuntimeError, NotImplementedError)
"""What a build without a mixed-precision kernel raises for it (a probe on tiny tensors: never out of memory)."""


def _probe_operands(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``a @ b`` is ``1 + 2^-8``: exact in an fp32 sum, 1 in a bf16 one."""
    a = torch.tensor([[1.0, 2.0 ** -8]], dtype=torch.bfloat16, device=device)
    b = torch.tensor([[1.0], [1.0]], dtype=torch.bfloat16, device=device)
    return a, b


@functools.cache
def mixed_mm_supported(device: torch.device) -> bool:
    """Whether ``torch.mm(a, b, out_dtype=torch.float32)`` multiplies bf16/fp16 operands with fp32 accumulation and
    an fp32 result on ``device``: probed once per device on tiny tensors. Where not, :func:`mm` upcasts the operands
    to fp32 first (the same numbers, a full fp32 copy of each operand). False off CUDA and without a GPU."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return False
    a, b = _probe_operands(device)
    try:
        product = torch.mm(a, b, out_dtype=torch.float32)
        return product.dtype == torch.float32 and float(product) == 1.0 + 2.0 ** -8
    except _PROBE_ERRORS:
        return False


@functools.cache
def mixed_addmm_supported(device: torch.device) -> bool:
    """Whether ``torch.addmm(acc, a, b, out_dtype=torch.float32, out=acc)`` sums bf16/fp16 operands' product straight
    into an fp32 ``acc`` on ``device``, in one GEMM with fp32 accumulation: probed once per device on tiny tensors
    (CUDA builds before it rejected ``out=`` with ``out_dtype``, pytorch issue 154086; CPUs have no such kernel).
    Where not, :func:`add_mm_` adds the product in blocks of :func:`block_elements` rows."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return False  # predictions for a GPU made without one assume the blocked sum (the larger peak)
    a, b = _probe_operands(device)
    try:
        acc = torch.ones(1, 1, dtype=torch.float32, device=device)
        torch.addmm(acc, a, b, out_dtype=torch.float32, out=acc)
        return float(acc) == 2.0 + 2.0 ** -8  # an fp32 sum: a bf16 one would lose the 2^-8
    except _PROBE_ERRORS:
        return False
