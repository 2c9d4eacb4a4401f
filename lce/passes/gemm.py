"""The three GEMMs of the op, executed in the precision the plan asks for.

Callers state numerics (operand dtype = the tensors' dtype, result dtype);
this module picks a mechanism that delivers exactly those numerics on the
tensors' device:

* same dtype in and out: the native GEMM (fp32 accumulation inside for
  fp16/bf16 on both oneDNN and cuBLAS, one rounding of the result);
* the same, where the operands' dtype has no fast GEMM on this CPU
  (``in_fp32``, which the plan decides: fp16 on every CPU, bf16 where
  :mod:`lce.planning.cpu_gemms` finds it emulated, about 80x slower than fp32 on an
  AVX2-only CPU): fp32 copies of the operands a block at a time, fp32 sums,
  one rounding of the result -- the arithmetic of the native kernel at fp32's
  speed, and no fp32 copy of a whole (C, D) weight (:func:`in_fp32_blocks`
  says what the blocks are, for the memory model);
* low-precision operands, wider result: CUDA's mixed-precision ``mm`` with
  ``out_dtype`` where the build has it (:func:`mixed_mm_supported`, probed once
  per device: an error of the real call, out of memory included, is the call's
  own, never a reason to take another path), else an exact stand-in that upcasts
  the operands (a product of two bf16/fp16 numbers is exact in fp32, so only the
  summation order differs). The stand-in is what lets the CUDA layouts run,
  numerically faithfully, on CPU tensors in CI.
"""

from __future__ import annotations

import torch

from ..planning.blocks import in_fp32_blocks, rows_per_block
from ..planning.device import mixed_mm_supported


def mm(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype, out: torch.Tensor | None = None,
       alpha: float = 1.0, *, in_fp32: bool = False, addend: torch.Tensor | None = None) -> torch.Tensor:
    """``alpha * (a @ b + addend)`` for same-dtype 2-D operands, summed in at least fp32, returned in ``out_dtype``.

    ``out`` (contiguous, ``out_dtype``) receives the result without a temporary
    when the native GEMM applies; otherwise the result is copied into it.
    ``alpha`` is a power of two here (exact), applied before any narrowing.
    ``in_fp32``: the operands' dtype has no fast GEMM here (see the module docstring).
    ``addend`` (the result's shape, any floating dtype): a small correction added in the GEMM's own sum, before
    its one rounding (a native GEMM takes it as ``addmm``'s ``input``, in the operands' dtype).
    """
    if a.dtype == out_dtype and not in_fp32:
        if addend is not None:
            result = torch.addmm(addend.to(a.dtype), a, b, out=out)
        else:
            result = torch.mm(a, b, out=out) if out is not None else a @ b
        return result.mul_(alpha) if alpha != 1.0 else result
    if a.dtype == out_dtype:
        return _mm_in_fp32(a, b, out_dtype, alpha, out, addend)
    if out is not None:
        return out.copy_(mm(a, b, out_dtype, alpha=alpha, in_fp32=in_fp32, addend=addend))
    if a.is_cuda and out_dtype == torch.float32 and mixed_mm_supported(a.device):
        result = torch.mm(a, b, out_dtype=out_dtype)  # any error here is the call's own (out of memory included)
        result = result if addend is None else result.add_(addend)
        return result.mul_(alpha) if alpha != 1.0 else result
    return _mm_via_upcast(a, b, out_dtype, alpha, addend)


def _mm_via_upcast(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype, alpha: float,
                   addend: torch.Tensor | None = None) -> torch.Tensor:
    """Operands upcast to at least fp32 (products of fp16/bf16 numbers are exact there), one GEMM (plus
    ``addend``, then times ``alpha``), one rounding to ``out_dtype``. Where it stands in for CUDA's
    mixed-precision ``mm`` on CPU tensors its temporaries are not the CUDA op's, so the memory-model test counts
    only its result."""
    wide = torch.promote_types(out_dtype, torch.float32)
    result = a.to(wide) @ b.to(wide)
    result = result if addend is None else result.add_(addend)
    return (result.mul_(alpha) if alpha != 1.0 else result).to(out_dtype)


def _mm_in_fp32(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype, alpha: float,
                out: torch.Tensor | None, addend: torch.Tensor | None = None) -> torch.Tensor:
    """``alpha * (a @ b + addend)`` rounded once to ``out_dtype``, computed on fp32 copies of blocks
    (:func:`in_fp32_blocks`)."""
    (m, k), n = a.shape, b.shape[1]
    if out is None:
        out = torch.empty(m, n, dtype=out_dtype, device=a.device)
    blocks = in_fp32_blocks(m, k, n)
    if blocks.axis == "n":
        a_wide = a.float()
        for start in range(0, n, blocks.size):
            cols = slice(start, start + blocks.size)
            product = a_wide @ b[:, cols].float()
            product = product if addend is None else product.add_(addend[:, cols])
            out[:, cols] = product.mul_(alpha) if alpha != 1.0 else product
        return out
    total = torch.zeros(m, n, dtype=torch.float32, device=a.device)
    for start in range(0, k, blocks.size):
        part = slice(start, start + blocks.size)
        total.addmm_(a[:, part].float(), b[part].float())
    total = total if addend is None else total.add_(addend)
    return out.copy_(total.mul_(alpha) if alpha != 1.0 else total)


def mm_upcast_weight_t(a: torch.Tensor, weight: torch.Tensor, device_kind: str = "cpu") -> torch.Tensor:
    """``a @ weight.T`` with the low-precision ``weight`` (C, D) upcast to ``a.dtype`` one block of rows at a time.

    The same numbers as upcasting the whole weight first (the upcast is exact),
    without a (C, D) wide copy; on a 2-core AVX512 CPU it was no slower
    (blocks stay in cache): 512 x 32768 x 512 fp32, 100 ms blocked vs 109 ms. Blocks of
    :func:`block_elements` of ``device_kind``.
    """
    out = torch.empty(a.shape[0], weight.shape[0], dtype=a.dtype, device=a.device)
    step = rows_per_block(weight.shape[1], device_kind)
    for start in range(0, weight.shape[0], step):
        out[:, start:start + step] = a @ weight[start:start + step].to(a.dtype).T
    return out


def mm_upcast_weight(a: torch.Tensor, weight: torch.Tensor, alpha: float = 1.0, device_kind: str = "cpu",
                     ) -> torch.Tensor:
    """``alpha * (a @ weight)`` with ``weight`` (C, D) upcast to ``a.dtype`` block by block; ``a`` is (rows, C)."""
    out = torch.zeros(a.shape[0], weight.shape[1], dtype=a.dtype, device=a.device)
    step = rows_per_block(weight.shape[1], device_kind)
    for start in range(0, weight.shape[0], step):
        out.addmm_(a[:, start:start + step], weight[start:start + step].to(a.dtype))
    return out.mul_(alpha) if alpha != 1.0 else out


def add_mm_(target: torch.Tensor, a: torch.Tensor, b: torch.Tensor, product_dtype: torch.dtype,
            alpha: float = 1.0, *, in_fp32: bool = False, product_scale: float = 1.0, device_kind: str = "cpu",
            mixed_addmm: bool = False, fresh: bool = False) -> None:
    """``target += alpha * (a @ b) / product_scale`` where ``alpha * (a @ b)`` is rounded to ``product_dtype``
    before the add (``product_scale``: a power of two that lifts a narrow product into its dtype's normal range
    for that rounding; the add divides it out exactly, so it applies only to a product narrower than the target).

    When operands, product and target share a dtype this is a single in-place
    ``addmm_`` (no temporary, one rounding of ``target + alpha * a @ b``); so it is, with ``mixed_addmm``
    (:func:`mixed_addmm_supported`), for low-precision operands whose product is summed in the fp32 target;
    otherwise the product is formed by :func:`mm` a block of ``target`` rows at a time (about
    :func:`block_elements` of ``device_kind``) and each block added as soon as it exists. ``in_fp32``: as for
    :func:`mm`. ``fresh``: ``target`` holds zeros (the only chunk of rows), so a product of its dtype is written
    into it by ``mm`` rather than added (a CPU's ``addmm_`` into a bf16 target copies the target to fp32).
    """
    if product_scale != 1.0 and torch.promote_types(target.dtype, product_dtype) == product_dtype:
        raise ValueError(f"add_mm_: product_scale applies to a product narrower than its target, got a "
                         f"{product_dtype} product for a {target.dtype} target")
    if target.dtype == a.dtype == product_dtype and not in_fp32:
        if fresh:
            mm(a, b, product_dtype, out=target, alpha=alpha)
        else:
            target.addmm_(a, b, alpha=alpha)
        return
    if mixed_addmm and target.dtype == product_dtype and a.dtype != product_dtype and not in_fp32:
        torch.addmm(target, a, b, out_dtype=product_dtype, alpha=alpha, out=target)
        return
    step = rows_per_block(target.shape[1], device_kind)
    if target.dtype == product_dtype == a.dtype:
        # in_fp32: the same single rounding of target + alpha * a @ b, computed in fp32 a block of rows at a time.
        b_wide = b.float()
        for start in range(0, target.shape[0], step):
            block = target[start:start + step]
            block.copy_(block.float().addmm_(a[start:start + step].float(), b_wide, alpha=alpha))
        return
    # A product in another dtype than the target is formed a block of target rows at a time and added
    # at once, so no (C, D) temporary ever exists: the peak is the target plus one block. A product
    # narrower than the target is converted before the add, spelled out so that the memory-model test
    # sees the temporary (the CPU kernel would make the same one, unseen): lce.planning.memory_model lists both.
    common = torch.promote_types(target.dtype, product_dtype)
    for start in range(0, target.shape[0], step):
        block = slice(start, start + step)
        # unnamed: each block's product is freed before the next one is made
        if fresh and product_scale == 1.0:  # written with one rounding, as 0 + product would be, without the add's
            # wide copy of a narrower target block (a CPU's bf16 += fp32 makes one)
            target[block].copy_(mm(a[block], b, product_dtype, alpha=alpha, in_fp32=in_fp32))
        else:
            target[block].add_(mm(a[block], b, product_dtype, alpha=alpha, in_fp32=in_fp32).to(common),
                               alpha=1.0 / product_scale)
