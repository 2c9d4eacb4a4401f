"""Checks of tensor *values* (targets in range, temperatures > 0, finite logits) without a host synchronisation on
CUDA.

Reading a CUDA tensor's value on the host (``bool(t.any())``) waits for the GPU: a synchronisation per call,
which stalls a training step and breaks ``torch.cuda.set_sync_debug_mode("error")``. So on CUDA tensors lce
checks values on the device by default: :func:`torch._assert_async` raises a device-side assert when the check
fails (the message is printed by the kernel; the error surfaces at the next synchronisation, and the CUDA context
is unusable after it, as with torch's own ``cross_entropy`` on an out-of-range target). On the CPU, and inside
:func:`eager_checks`, the same checks read the value and raise ``ValueError`` naming the argument, the value and
what was expected (on CUDA: one synchronisation per check).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import torch

__all__ = ["eager_checks", "checks_eagerly", "require"]

_EAGER: contextvars.ContextVar[bool] = contextvars.ContextVar("lce_eager_checks", default=False)


@contextlib.contextmanager
def eager_checks(enabled: bool = True) -> Iterator[None]:
    """Inside it, value checks on CUDA tensors read the value and raise ``ValueError`` (one host synchronisation per
    check) instead of a device-side assert; CPU tensors are always checked eagerly. For debugging a bad batch."""
    if not isinstance(enabled, bool):
        raise TypeError(f"enabled must be a bool, got {type(enabled).__name__}")
    token = _EAGER.set(enabled)
    try:
        yield
    finally:
        _EAGER.reset(token)


def checks_eagerly(tensor: torch.Tensor) -> bool:
    """Whether a check of ``tensor``'s values reads them on the host: off the GPU always, on it inside
    :func:`eager_checks`."""
    return tensor.device.type != "cuda" or _EAGER.get()


def require(ok: torch.Tensor, message: str) -> bool:
    """Check that the boolean tensor ``ok`` holds True everywhere. Eagerly (:func:`checks_eagerly`): return whether
    it does, for the caller to raise its own ``ValueError`` naming the value. On CUDA otherwise: enqueue a
    device-side assert carrying ``message`` and return True without waiting."""
    if checks_eagerly(ok):
        return bool(ok.all())
    torch._assert_async(ok.all(), message)
    return True
