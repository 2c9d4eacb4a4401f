"""Peers on a CPU that emulates bf16/fp16 GEMMs: their GEMMs computed in fp32 for the errors, their cost not measured.

lce plans around a CPU whose bf16 or fp16 GEMMs are emulated (:mod:`lce.planning.cpu_gemms`: about 80x slower than fp32
on AVX2-only CPUs); the ops it is compared with -- torch's chunked op, the unfused reference, torch.compile of
it -- call the CPU's own kernel and would take minutes per call at the bench shape. For their *errors* the
analysis runs them (:meth:`analysis.core.implementations.Implementation.run`) under
:class:`Fp32LowPrecisionGemms`, which computes every bf16/fp16 ``mm``/``addmm``/``bmm`` on CPU tensors on fp32
copies of the operands and rounds the result once: the arithmetic of the native kernel (fp32 sums, one
rounding; only the summation order differs), at fp32's speed. Their *time and memory* are not measured there
(that would time the stand-in, not the peer): rows say so in their note (:func:`emulated_peer_note`), and the
README's tables say "not run" for that CPU kind. torch.compile of the reference is not run there at all
(:func:`emulated_peer_skip`): a dispatch mode and the compiler do not mix.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from analysis.core.problem import DTYPES
from lce.planning.cpu_gemms import LOW_PRECISION, gemm_support

__all__ = ["Fp32LowPrecisionGemms", "STAND_IN_OPS", "emulated_peer_note", "emulated_peer_skip",
           "low_precision_linear", "native_gemm_scratch"]

_aten = torch.ops.aten
_DEFAULT_OF = {overload: packet.default for packet in (_aten.mm, _aten.addmm, _aten.bmm, _aten.baddbmm)
               for overload in (packet.default, packet.out)}
"""Each GEMM overload the stand-in takes (the plain op and its ``out=`` form), and the plain op it computes."""

STAND_IN_OPS = ("torch", "reference")
"""The compared ops run under the stand-in where the CPU emulates their dtype's GEMMs (lce routes its own GEMMs,
see lce.passes.gemm; Liger-Kernel and CCE run on CUDA only)."""


class Fp32LowPrecisionGemms(TorchDispatchMode):
    """Inside it, a bf16/fp16 GEMM on CPU tensors (``mm``, ``addmm``, ``bmm``, ``baddbmm``, plain or ``out=``) is
    computed on fp32 copies and rounded once (see the module).

    ``keep_scratch=True`` keeps the fp32 copies and products in buffers the mode owns, one per operand slot and
    shape, reused by every later GEMM of that shape: after one warm-up call, a call measured inside the mode
    allocates nothing for the stand-in, so :func:`analysis.core.memory.measure_peak` sees the peer's own
    allocations. A CPU's own kernel may take scratch from torch's allocator besides (oneDNN's packing buffers: none
    on the AMX Xeon and the AVX2 EPYC this was first measured on, 0.17-0.28 MB per GEMM at 32x128x16384 on an
    AVX512-BF16 EPYC); the stand-in leaves that out (:func:`native_gemm_scratch` measures it).
    """

    def __init__(self, keep_scratch: bool = False):
        super().__init__()
        self._scratch: dict[tuple, torch.Tensor] | None = {} if keep_scratch else None

    def _buffer(self, slot: str, shape: tuple, size: tuple[int, ...] = (0,)) -> torch.Tensor:
        """The kept fp32 buffer of ``slot`` for ``shape`` (created with ``size``; an ``out=`` op resizes an empty
        one to its product's shape on first use)."""
        key = (slot, shape)
        if key not in self._scratch:
            self._scratch[key] = torch.empty(size, dtype=torch.float32)
        return self._scratch[key]

    def _wide(self, tensor: torch.Tensor, slot: str) -> torch.Tensor:
        if self._scratch is None:
            return tensor.float()
        return self._buffer(slot, tuple(tensor.shape), tuple(tensor.shape)).copy_(tensor)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        tensors = [arg for arg in args if isinstance(arg, torch.Tensor)]
        if func not in _DEFAULT_OF or not tensors or tensors[-1].dtype not in LOW_PRECISION or tensors[-1].is_cuda:
            return func(*args, **kwargs)
        out = kwargs.pop("out", None)
        dtype = tensors[-1].dtype
        wide = [self._wide(arg, f"operand {index}") if isinstance(arg, torch.Tensor) else arg
                for index, arg in enumerate(args)]
        if self._scratch is None:
            product = _DEFAULT_OF[func](*wide, **kwargs)
        else:
            shapes = tuple(tuple(arg.shape) for arg in tensors)
            product = _DEFAULT_OF[func].overloadpacket.out(*wide, **kwargs, out=self._buffer("product", shapes))
        if out is None:
            return product.to(dtype)
        return out.copy_(product)


class _GemmRecorder(TorchDispatchMode):
    """Runs every op as it is and keeps a copy of each bf16/fp16 CPU GEMM call (operands with their strides)."""

    def __init__(self):
        super().__init__()
        self.calls: list[tuple] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        tensors = [arg for arg in (*args, *kwargs.values()) if isinstance(arg, torch.Tensor)]
        if func in _DEFAULT_OF and tensors and tensors[0].dtype in LOW_PRECISION and not tensors[0].is_cuda:
            copy = [_strided_copy(arg) if isinstance(arg, torch.Tensor) else arg for arg in args]
            self.calls.append((func, copy, {key: _strided_copy(value) if isinstance(value, torch.Tensor) else value
                                            for key, value in kwargs.items()}))
        return func(*args, **kwargs)


def _strided_copy(tensor: torch.Tensor) -> torch.Tensor:
    return torch.empty_strided(tensor.shape, tensor.stride(), dtype=tensor.dtype).copy_(tensor)


def native_gemm_scratch(fn) -> int:
    """The most bytes one bf16/fp16 CPU GEMM of ``fn()`` takes from torch's allocator beyond its result, on this
    CPU's own kernels: each GEMM ``fn`` calls is replayed alone on copies of its operands (same strides), after a
    warm-up, under the sweep's profiler. 0 where the kernels allocate only their results (the stand-in's premise of
    equal bytes); GEMMs run one at a time, so a run's peak exceeds its stand-in peak by at most this."""
    from analysis.core.memory import measure_peak

    recorder = _GemmRecorder()
    with recorder:
        fn()
    scratch = 0
    for func, args, kwargs in recorder.calls:
        func(*args, **kwargs)
        result, memory = measure_peak(lambda: func(*args, **kwargs))  # noqa: B023
        owned = 0 if "out" in kwargs else result.numel() * result.element_size()
        scratch = max(scratch, memory.peak_bytes - owned)
    return scratch


def _emulated(dtype: str, device: str):
    if device != "cpu" or DTYPES[dtype] not in LOW_PRECISION:
        return None
    support = gemm_support(DTYPES[dtype])
    return support if support.emulated else None


def emulated_peer_note(op: str, dtype: str, device: str) -> str | None:
    """Why ``op`` in ``dtype`` on ``device`` runs under the stand-in and is not timed here, or None."""
    support = _emulated(dtype, device) if op in STAND_IN_OPS else None
    if support is None:
        return None
    return (f"this CPU emulates {dtype} GEMMs ({support.source}): the peer's GEMMs were computed on fp32 copies "
            "and rounded once (same arithmetic, errors measured); its time and memory were not measured")


def emulated_peer_skip(op: str, dtype: str, device: str) -> str | None:
    """Why ``op`` is not run at all in ``dtype`` on ``device`` (torch.compile where the CPU emulates it), or None."""
    support = _emulated(dtype, device) if op == "compiled" else None
    if support is None:
        return None
    return f"not run: this CPU emulates {dtype} GEMMs ({support.source}) and the compiled graph would call them"


class _LinearOnFp32Copies(torch.autograd.Function):
    """``x @ w.T`` rounded to ``x``'s dtype, and its two backward products rounded likewise, each computed on fp32
    copies: the arithmetic of the low-precision GEMMs (fp32 sums, one rounding each) at fp32's speed."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        return (x.float() @ w.float().T).to(x.dtype)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, w = ctx.saved_tensors
        wide = grad.float()
        return (wide @ w.float()).to(x.dtype), (wide.T @ x.float()).to(w.dtype)


def low_precision_linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``F.linear(x, w)`` (no bias) in their dtype, for a training loop that calls backward itself: where this CPU
    emulates that dtype's GEMMs, the same arithmetic on fp32 copies, forward and backward (the unfused bf16 arm
    of the training study)."""
    if x.device.type == "cpu" and x.dtype in LOW_PRECISION and gemm_support(x.dtype).emulated:
        return _LinearOnFp32Copies.apply(x, w)
    return F.linear(x, w)
