"""How the kernels of :mod:`lce.kernels` are launched: block widths, warps and the statistics pass's column splits.

Plain Python (no triton import), so the configuration can be read and tested anywhere. A configuration changes
which partial sums are formed, so it changes the last bits of the statistics, never their determinism: the same
shape on the same device kind always gets the same configuration (nothing here is autotuned or timed).

These are starting points sized from first principles, not measured yet: each pass streams a (rows, C) fp32 chunk
once, so what matters is enough independent 16-byte loads in flight per SM -- a block of 4096 columns over 8 warps
is 16 fp32 per thread -- and enough programs to cover every SM (about four per SM).
"""

from __future__ import annotations

import dataclasses

import torch

__all__ = ["Launch", "statistics_launch", "grad_launch", "PROGRAMS_PER_SM"]

PROGRAMS_PER_SM = 4
"""Programs the statistics pass aims at per SM; a chunk of few rows splits each row's columns to reach it."""

_WIDEST_BLOCK = 4096
_NARROWEST_BLOCK = 128


@dataclasses.dataclass(frozen=True)
class Launch:
    """One kernel launch's shape: ``block`` columns per step (a power of two), ``num_warps`` per program, and, for
    the statistics pass, ``splits`` programs per row, each over a contiguous run of blocks (1: one program sweeps
    the whole row). The gradient pass ignores ``splits`` (one program per row and block)."""

    block: int
    num_warps: int = 4
    splits: int = 1

    def __post_init__(self):
        if self.block < 1 or self.block & (self.block - 1):
            raise ValueError(f"Launch.block must be a power of two, got {self.block}")
        if self.num_warps < 1 or self.num_warps & (self.num_warps - 1):
            raise ValueError(f"Launch.num_warps must be a power of two, got {self.num_warps}")
        if self.splits < 1:
            raise ValueError(f"Launch.splits must be at least 1, got {self.splits}")

    def blocks(self, num_cols: int) -> int:
        """Blocks of ``block`` columns covering ``num_cols`` (the last one partial)."""
        return max(1, -(-num_cols // self.block))

    def blocks_per_split(self, num_cols: int) -> int:
        """Consecutive blocks each of the ``splits`` programs of a row sweeps (the last split may get fewer)."""
        return -(-self.blocks(num_cols) // self.splits)


def _block_for(num_cols: int) -> int:
    """The narrowest power of two covering ``num_cols``, within [128, 4096]."""
    return min(_WIDEST_BLOCK, max(_NARROWEST_BLOCK, 1 << max(num_cols - 1, 0).bit_length()))


def _warps_for(block: int) -> int:
    """Eight warps for the widest block (16 fp32 per thread), fewer for narrower ones (at least 4 per thread)."""
    return max(1, min(8, block // 512))


def multiprocessors(device: torch.device) -> int:
    """The SM count of a CUDA device; 1 elsewhere (the interpreter runs one program at a time anyway)."""
    if device.type != "cuda":
        return 1
    return torch.cuda.get_device_properties(device).multi_processor_count


def statistics_launch(num_rows: int, num_cols: int, device: torch.device) -> Launch:
    """The statistics pass's launch: one program per row and split; a row's columns are split only where the
    rows alone would leave SMs idle (a chunk of 256 rows on a 132-SM H100 splits each row in three)."""
    block = _block_for(num_cols)
    blocks = -(-num_cols // block)
    wanted = PROGRAMS_PER_SM * multiprocessors(device)
    splits = max(1, min(blocks, -(-wanted // max(num_rows, 1))))
    launch = Launch(block, _warps_for(block), splits)
    # the split count actually used: no split left without blocks
    return dataclasses.replace(launch, splits=-(-blocks // launch.blocks_per_split(num_cols)))


def grad_launch(num_rows: int, num_cols: int, device: torch.device) -> Launch:
    """The gradient pass's launch: one program per row and block of columns, which every SM count fills."""
    block = min(_block_for(num_cols), 2048)
    return Launch(block, _warps_for(block))
