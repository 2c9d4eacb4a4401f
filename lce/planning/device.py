"""Which layout table a call uses ("cpu" or "cuda"), and what its device can do.

:func:`device_kind_of` is the only place lce looks at a device's type; the
chunk loop never does. Tests and the analysis can make CPU tensors plan as
CUDA ones through :func:`lce.testing.emulate_device_kind`, which sets
:data:`DEVICE_KIND_OVERRIDE`.
"""

from __future__ import annotations

import contextvars

import torch

__all__ = ["DEVICE_KINDS", "DEVICE_KIND_OVERRIDE", "device_kind_of", "has_mixed_precision_mm"]

DEVICE_KINDS: tuple[str, ...] = ("cpu", "cuda")
"""Device kinds with a layout table of their own (:data:`lce.planning.policies.LAYOUTS`)."""

DEVICE_KIND_OVERRIDE: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "lce_device_kind_override", default=None
)


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
