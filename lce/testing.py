"""Helpers for tests and the analysis that need lce's internals on purpose."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from .planning.cpu_gemms import Support, assumed_support
from .planning.device import planned_as
from .planning.plan import HEADROOM_OFF

__all__ = ["emulate_device_kind", "cpu_gemms", "without_headroom", "interpreted_kernels"]


@contextlib.contextmanager
def emulate_device_kind(kind: str) -> Iterator[None]:
    """Plan as if tensors lived on ``kind`` ("cpu" or "cuda"), whatever their device.

    Used to run the CUDA layouts on CPU tensors: :mod:`lce.passes.gemm` then computes
    each mixed-precision GEMM with an exact stand-in, so the numbers are those
    the CUDA kernels produce up to summation order. CUDA is assumed to be
    sm80 or newer (bf16 and fp16 mixed-precision GEMMs available).
    """
    with planned_as(kind):
        yield


@contextlib.contextmanager
def cpu_gemms(support: Support | dict[torch.dtype, Support]) -> Iterator[None]:
    """Plan and run as if this CPU's bf16 and fp16 GEMMs were ``support`` ("native", "slow" or "emulated"), or per
    dtype (``{torch.bfloat16: "emulated"}``), whatever :mod:`lce.planning.cpu_gemms` measures.

    Wins over the ``LCE_CPU_GEMMS`` environment variable. Plans record what they were made under, so
    a plan made inside the context runs the same way outside it (reduction="none"'s backward).
    """
    with assumed_support(support):
        yield


@contextlib.contextmanager
def without_headroom() -> Iterator[None]:
    """Run lce's fp16 arithmetic as it was before :mod:`lce.passes.headroom`: gradients formed at their true size in
    forward, the incoming gradient (a loss scale) multiplied in afterwards, so entries below fp16's normal range
    are rounded before the scale can lift them.

    For studies that measure what the headroom changes (``analysis.studies.loss_scale``). Plans made inside the
    block record it (:attr:`lce.Plan.gradient_headroom`), so a backward run outside it follows its forward.
    """
    token = HEADROOM_OFF.set(True)
    try:
        yield
    finally:
        HEADROOM_OFF.reset(token)


@contextlib.contextmanager
def interpreted_kernels() -> Iterator[None]:
    """Run :mod:`lce.kernels`' Triton kernels on CPU tensors through Triton's interpreter inside the block, as they
    run compiled on CUDA (plans made inside say :attr:`lce.Plan.fused_passes`): how the kernels are tested without
    a GPU. The interpreter must have been asked for before triton was first imported (``TRITON_INTERPRET=1``:
    ``tests/conftest.py`` sets it for a test session without CUDA); ``RuntimeError`` otherwise."""
    from .kernels import INTERPRETED_ON_CPU
    from .kernels.interpreter import interpreting

    if not interpreting():
        raise RuntimeError("lce.testing.interpreted_kernels needs TRITON_INTERPRET=1 set before triton is imported")
    token = INTERPRETED_ON_CPU.set(True)
    try:
        yield
    finally:
        INTERPRETED_ON_CPU.reset(token)
