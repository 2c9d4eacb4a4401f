"""The problem a run solves: its shape (N rows, D features, C classes), dtype names, and the named shapes
every study and report quotes.
"""

from __future__ import annotations

import dataclasses

import torch

from lce.planning.options import dtype_name

DTYPES: dict[str, torch.dtype] = {
    dtype_name(dtype): dtype for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64)
}
"""Dtype names (:func:`lce.planning.options.dtype_name`) as they appear in grids and results files -> dtypes."""


@dataclasses.dataclass(frozen=True, order=True)
class Shape:
    """Problem size: ``N`` rows of ``D`` features against ``C`` classes."""

    N: int
    D: int
    C: int

    def __post_init__(self) -> None:
        for name in ("N", "D", "C"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"Shape.{name} must be a positive int, got {value!r}")

    def __str__(self) -> str:
        return f"{self.N}x{self.D}x{self.C}"


def parse_shape(text: str) -> Shape:
    """``"4096x512x32768"`` -> ``Shape(4096, 512, 32768)`` (the spelling of :meth:`Shape.__str__`)."""
    try:
        n, d, c = (int(part) for part in text.lower().split("x"))
    except ValueError:
        raise ValueError(f"shape must look like NxDxC, e.g. 4096x512x32768; got {text!r}") from None
    return Shape(n, d, c)


# ---- the named shapes every study and report quotes ------------------------------------------------------------

BENCH_SHAPE = Shape(4096, 512, 32768)
"""The CPU bench problem (``python -m analysis bench``): an LLM-like aspect ratio (C/D = 64) that one forward and
backward of every implementation, unfused included, can afford on 2 cores."""

CCE_SHAPE = Shape(8192, 2304, 256000)
"""Cut Cross-Entropy's benchmark head (Gemma 2 2B at 8192 tokens), the GPU bench problem."""

LLM_SHAPES: tuple[Shape, ...] = (Shape(16384, 4096, 128256), CCE_SHAPE, Shape(65536, 8192, 152064))
"""LLM heads (Llama 3 8B at 16k tokens, Gemma 2 2B at 8k, Qwen 2 72B at 64k), where the models predict what
the CPU cannot measure."""
