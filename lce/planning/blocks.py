"""How the passes cut their work into blocks: the sizes the memory model counts and the GEMMs use.

A (C, D) target (the weight gradient, an upcast weight) is converted or updated a block of rows at a time, a
GEMM on fp32 copies of narrow operands is cut into blocks of its ``b`` operand, and the target rows' residual
sums are taken a block of chunk rows at a time. These sizes are decided here, once, so that what
:mod:`lce.passes.gemm` and :mod:`lce.passes` allocate and what :mod:`lce.planning.memory_model` lists are
the same numbers.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["TARGET_ROWS_PER_GEMM", "block_elements", "rows_per_block", "Fp32Blocks", "in_fp32_blocks"]

_BLOCK_ELEMENTS = 1 << 20
"""Rows of a (C, D) target are updated in blocks of about this many elements when a
dtype conversion is involved, so the products and converted temporaries stay ~4 MiB, not (C, D)-sized."""

_CUDA_BLOCK_ELEMENTS = 1 << 26
"""The same on CUDA, for the weight-gradient product added into its accumulator where the device has no
mixed-precision ``addmm`` (:func:`mixed_addmm_supported`): 256 MiB of fp32 per block, so a 256000 x 2304 head
takes 9 GEMMs a chunk, each large enough to run at the GEMM's rate. Blocks of a million elements (the CPU's size,
chosen for its caches) cost an H200 over 500 small GEMMs a chunk: 1.6 s a step at that head, against 49 ms for the
unfused op (``analysis/results/gpu_bench.csv``)."""


TARGET_ROWS_PER_GEMM = 2048
"""Rows of a chunk whose target-entry residuals :meth:`lce.passes.gradients.TargetResidual.add_to_weight_rows_` sums per
target class in one fp32 GEMM against their indicator matrix: that work grows as the square of the rows, so a chunk
of more rows is taken in blocks of this many (CUDA's chunks of 2048 rows in one)."""


def block_elements(device_kind: str) -> int:
    """Elements of a (C, D) target updated at a time on ``device_kind`` ("cpu" or "cuda")."""
    return _CUDA_BLOCK_ELEMENTS if device_kind == "cuda" else _BLOCK_ELEMENTS


def rows_per_block(cols: int, device_kind: str = "cpu") -> int:
    """Rows of a ``(rows, cols)`` matrix converted at a time (:func:`block_elements`): the weight upcast by
    the ``*_upcast_weight`` GEMMs and the weight-gradient target updated by :func:`add_mm_`."""
    return max(1, block_elements(device_kind) // max(cols, 1))


class Fp32Blocks(NamedTuple):
    """How :func:`mm` cuts an ``in_fp32`` product ``(m, k) @ (k, n)``: along ``n`` (columns of ``b``, each
    block's fp32 product rounded into its columns of the result) when ``n > k`` -- the logits, ``x @ W.T`` --
    else along ``k`` (the summed dimension, the block products added into one fp32 ``(m, n)`` total,
    rounded at the end) -- the input gradient, ``dz @ W``. ``size`` is the block's extent on that axis."""

    axis: str  # "n" or "k"
    size: int


def in_fp32_blocks(m: int, k: int, n: int) -> Fp32Blocks:
    """The blocks of an ``in_fp32`` product (see :class:`Fp32Blocks`): ~:data:`_BLOCK_ELEMENTS` elements of ``b``."""
    if n > k:
        return Fp32Blocks("n", min(rows_per_block(k), n))
    return Fp32Blocks("k", min(rows_per_block(n), k))
