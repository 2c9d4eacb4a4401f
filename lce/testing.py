"""Helpers for tests and the analysis that need lce's internals on purpose."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from .device import DEVICE_KIND_OVERRIDE, DEVICE_KINDS

__all__ = ["emulate_device_kind"]


@contextlib.contextmanager
def emulate_device_kind(kind: str) -> Iterator[None]:
    """Plan as if tensors lived on ``kind`` ("cpu" or "cuda"), whatever their device.

    Used to run the CUDA layouts on CPU tensors: :mod:`lce.gemm` then computes
    each mixed-precision GEMM with an exact stand-in, so the numbers are those
    the CUDA kernels produce up to summation order. CUDA is assumed to be
    sm80 or newer (bf16 and fp16 mixed-precision GEMMs available).
    """
    if kind not in DEVICE_KINDS:
        raise ValueError(f"kind must be one of {DEVICE_KINDS}, got {kind!r}")
    token = DEVICE_KIND_OVERRIDE.set(kind)
    try:
        yield
    finally:
        DEVICE_KIND_OVERRIDE.reset(token)
