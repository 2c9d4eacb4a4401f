"""What differs when Triton's CPU interpreter (``TRITON_INTERPRET=1``) runs the kernels instead of a GPU.

The interpreter executes a kernel's Python body with numpy, one program at a time, on CPU tensors: it is how CI
tests the kernels without a GPU. Three things differ from a compiled launch, and each is handled here or in the
kernel by one named flag, never by a second copy of a kernel:

* ``exp``: on NVIDIA GPUs ``tl.exp`` on fp32 compiles to ``ex2.approx`` of ``x * log2(e)``; rounding that product
  costs about ``|x|`` half-ulps, some 30 ulps at ``x = -40`` (a confident row's other classes), so the compiled
  kernels call libdevice's ``exp`` (``__nv_expf``, the function torch's own CUDA ``exp`` calls, within 2 ulps).
  The interpreter has no libdevice, and numpy's fp32 ``exp`` strays up to about 2.2 ulps (torch's CPU ``exp``
  0.55), which would blur every comparison with the reference by 2 ulps: interpreted, the kernels take ``exp``
  in fp64 and round it once (within half an ulp). :func:`libdevice_exp` says which (``LIBDEVICE_EXP``).
* fused multiply-adds: a compiled launch would contract ``a * b + c`` into one rounding where the PyTorch
  reference rounds twice; :data:`LAUNCH_OPTIONS` turns contraction off, so each operation rounds as the
  reference's does. The interpreter never contracts (it accepts and ignores the option).
* whether a kernel object is interpreted is fixed when Triton decorates it (``triton.jit`` reads
  ``TRITON_INTERPRET`` then), so :func:`interpreting` is asked once, when :mod:`lce.kernels.softmax_passes` is
  imported, and the module remembers the answer (``INTERPRETED``). Tests set the variable before that import.

Versions measured: Triton 3.9's interpreter runs with numpy 2.4; Triton 3.6's needs numpy < 2.3.
"""

from __future__ import annotations

import os

__all__ = ["interpreting", "libdevice_exp", "LAUNCH_OPTIONS"]

LAUNCH_OPTIONS = {"enable_fp_fusion": False}
"""Keyword options every launch passes: no fused multiply-adds, so every product and sum rounds on its own."""


def interpreting() -> bool:
    """Whether ``TRITON_INTERPRET`` asks for the interpreter, read as Triton reads it ("1", "true", "on"; any case)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in {"1", "true", "on"}


def libdevice_exp(interpreted: bool) -> bool:
    """Whether a launch calls libdevice's ``exp`` (compiled) rather than numpy's in fp64 (the interpreter)."""
    return not interpreted
