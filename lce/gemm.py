"""The three GEMMs of the op, executed in the precision the plan asks for.

Callers state numerics (operand dtype = the tensors' dtype, result dtype);
this module picks a mechanism that delivers exactly those numerics on the
tensors' device:

* same dtype in and out: the native GEMM (fp32 accumulation inside for
  fp16/bf16 on both oneDNN and cuBLAS, one rounding of the result);
* low-precision operands, wider result: CUDA's mixed-precision ``mm`` with
  ``out_dtype`` where the build has it, else an exact stand-in that upcasts the
  operands (a product of two bf16/fp16 numbers is exact in fp32, so only the
  summation order differs). The stand-in is what lets the CUDA layouts run,
  numerically faithfully, on CPU tensors in CI;
* fp16 on CPU: oneDNN has no fast fp16 GEMM here (measured 1.5 s vs 13 ms for
  fp32 at 512x8192x256), so the operands are upcast and the result rounded
  once, which is the same arithmetic the slow native kernel performs.
"""

from __future__ import annotations

import torch


def _slow_on_device(dtype: torch.dtype, device: torch.device) -> bool:
    return device.type == "cpu" and dtype == torch.float16


def mm(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype, out: torch.Tensor | None = None,
       alpha: float = 1.0) -> torch.Tensor:
    """``alpha * (a @ b)`` for same-dtype 2-D operands, summed in at least fp32, returned in ``out_dtype``.

    ``out`` (contiguous, ``out_dtype``) receives the result without a temporary
    when the native GEMM applies; otherwise the result is copied into it.
    ``alpha`` is a power of two here (exact), applied before any narrowing.
    """
    if a.dtype == out_dtype and not _slow_on_device(a.dtype, a.device):
        result = torch.mm(a, b, out=out) if out is not None else a @ b
        return result.mul_(alpha) if alpha != 1.0 else result
    if out is not None:
        return out.copy_(mm(a, b, out_dtype, alpha=alpha))
    if a.is_cuda and a.dtype != out_dtype and torch.finfo(out_dtype).bits >= 32:
        try:
            result = torch.mm(a, b, out_dtype=out_dtype)
            return result.mul_(alpha) if alpha != 1.0 else result
        except (TypeError, RuntimeError, NotImplementedError):
            pass  # a build or dtype pair without the mixed-precision kernel
    return _mm_via_upcast(a, b, out_dtype, alpha)


def _mm_via_upcast(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype, alpha: float) -> torch.Tensor:
    """Operands upcast to at least fp32 (products of fp16/bf16 numbers are exact there), one GEMM,
    one rounding to ``out_dtype``. Where it stands in for CUDA's mixed-precision ``mm`` on CPU
    tensors its temporaries are not the CUDA op's, so the memory-model test counts only its result."""
    wide = torch.promote_types(out_dtype, torch.float32)
    result = a.to(wide) @ b.to(wide)
    return (result.mul_(alpha) if alpha != 1.0 else result).to(out_dtype)


_BLOCK_ELEMENTS = 1 << 20
"""Rows of a (C, D) target are updated in blocks of about this many elements when a
dtype conversion is involved, so the products and converted temporaries stay ~4 MiB, not (C, D)-sized."""


def rows_per_block(cols: int) -> int:
    """Rows of a ``(rows, cols)`` matrix converted at a time (~1M elements): the weight upcast by
    the ``*_upcast_weight`` GEMMs and the weight-gradient target updated by :func:`add_mm_`."""
    return max(1, _BLOCK_ELEMENTS // max(cols, 1))


def mm_upcast_weight_t(a: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``a @ weight.T`` with the low-precision ``weight`` (C, D) upcast to ``a.dtype`` one block of rows at a time.

    The same numbers as upcasting the whole weight first (the upcast is exact),
    without a (C, D) wide copy; on a 2-core AVX512 CPU it was no slower
    (blocks stay in cache): 512 x 32768 x 512 fp32, 100 ms blocked vs 109 ms.
    """
    out = torch.empty(a.shape[0], weight.shape[0], dtype=a.dtype, device=a.device)
    step = rows_per_block(weight.shape[1])
    for start in range(0, weight.shape[0], step):
        out[:, start:start + step] = a @ weight[start:start + step].to(a.dtype).T
    return out


def mm_upcast_weight(a: torch.Tensor, weight: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
    """``alpha * (a @ weight)`` with ``weight`` (C, D) upcast to ``a.dtype`` block by block; ``a`` is (rows, C)."""
    out = torch.zeros(a.shape[0], weight.shape[1], dtype=a.dtype, device=a.device)
    step = rows_per_block(weight.shape[1])
    for start in range(0, weight.shape[0], step):
        out.addmm_(a[:, start:start + step], weight[start:start + step].to(a.dtype))
    return out.mul_(alpha) if alpha != 1.0 else out


def add_mm_(target: torch.Tensor, a: torch.Tensor, b: torch.Tensor, product_dtype: torch.dtype,
            alpha: float = 1.0) -> None:
    """``target += alpha * (a @ b)`` where the product is rounded to ``product_dtype`` before the add.

    When operands, product and target share a dtype this is a single in-place
    ``addmm_`` (no temporary, one rounding of ``target + alpha * a @ b``);
    otherwise the product is formed by :func:`mm` a block of ``target`` rows at a time (about
    :data:`_BLOCK_ELEMENTS` elements) and each block added as soon as it exists.
    """
    if target.dtype == a.dtype == product_dtype and not _slow_on_device(a.dtype, a.device):
        target.addmm_(a, b, alpha=alpha)
        return
    step = rows_per_block(target.shape[1])
    if target.dtype == product_dtype == a.dtype:
        # fp16 on CPU: the same single rounding of target + alpha * a @ b, computed in fp32.
        b_wide = b.float()
        for start in range(0, target.shape[0], step):
            block = target[start:start + step]
            block.copy_(block.float().addmm_(a[start:start + step].float(), b_wide, alpha=alpha))
        return
    # A product in another dtype than the target is formed a block of target rows at a time and added
    # at once, so no (C, D) temporary ever exists: the peak is the target plus one block. A product
    # narrower than the target is converted before the add, spelled out so that the memory-model test
    # sees the temporary (the CPU kernel would make the same one, unseen): lce.memory_model lists both.
    common = torch.promote_types(target.dtype, product_dtype)
    for start in range(0, target.shape[0], step):
        block = slice(start, start + step)
        target[block].add_(mm(a[block], b, product_dtype, alpha=alpha).to(common))  # unnamed: freed per block
