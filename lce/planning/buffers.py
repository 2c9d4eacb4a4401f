"""What a buffer of the op is, and how a plan's buffers add up to its peak (the arithmetic of spans and steps).

:mod:`lce.planning.memory_model` lists a plan's buffers; this module defines the record it lists and turns a
listing into the most bytes one chunk holds (:func:`chunk_peak_bytes`) and the predicted peak of a whole call
(:func:`peak_extra_bytes`). It reads nothing but the buffers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Literal

import torch

__all__ = ["Buffer", "Stage", "Span", "Step", "chunk_peak_bytes", "peak_extra_bytes"]

Stage = Literal["forward", "backward"]
Span = Literal["call", "chunk", "final", "kept"]
Step = Literal["logits", "to_stats", "workspace", "grad_input", "grad_weight_target", "grad_weight", "grad_bias"]
"""The steps of one chunk: the logits GEMM, the logits' conversion to the stats dtype (when it
differs), the statistics and dz formed a workspace of columns at a time (soft-capped logits, and every block of
the per-token log-probabilities), the two backward GEMMs and the bias-gradient sum."""


@dataclasses.dataclass(frozen=True)
class Buffer:
    """One allocation the op makes: its purpose, shape, dtype and when it is alive.

    ``stage`` is the pass that allocates it. ``span`` is "call" (made before
    the chunk loop, freed when the pass returns), "chunk" (remade per chunk,
    one generation alive at a time), "final" (made after the loop, when the
    chunk buffers are gone: a gradient rounded from its accumulator) or "kept"
    (outlives the pass: returned gradients and what forward saves for backward).
    A "chunk" buffer lives through the chunk ``steps`` listed; the others have none.
    """

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    stage: Stage
    span: Span
    purpose: str
    steps: tuple[Step, ...] = ()

    @property
    def nbytes(self) -> int:
        count = 1
        for size in self.shape:
            count *= size
        return count * self.dtype.itemsize


def chunk_peak_bytes(buffers: Sequence[Buffer], stage: Stage) -> int:
    """The most bytes one chunk of a pass holds at once: the largest total over its steps."""
    chunk = [b for b in buffers if b.stage == stage and b.span == "chunk"]
    steps = dict.fromkeys(step for b in chunk for step in b.steps)
    return max((sum(b.nbytes for b in chunk if step in b.steps) for step in steps), default=0)


def peak_extra_bytes(buffers: Sequence[Buffer], *, backward_copies_kept: bool = False) -> int:
    """Predicted peak of bytes allocated by one forward + backward, beyond the inputs.

    In each pass the peak is what that pass keeps from earlier, plus its call-long buffers, plus the larger of one
    chunk's peak (:func:`chunk_peak_bytes`) and the buffers made after the loop. ``backward_copies_kept``: the
    scalar reductions' backward scales the kept gradients into fresh copies (``allow_retain_graph``), which then
    coexist with them; otherwise it scales them in place.
    """

    def total(stage: Stage, span: Span) -> int:
        return sum(b.nbytes for b in buffers if b.stage == stage and b.span == span)

    forward = total("forward", "call") + max(chunk_peak_bytes(buffers, "forward"), total("forward", "final"))
    kept = total("forward", "kept") + total("forward", "final")
    backward = kept + total("backward", "call") + max(chunk_peak_bytes(buffers, "backward"),
                                                      total("backward", "final"))
    if backward_copies_kept:
        backward = 2 * kept
    return max(forward + total("forward", "kept"), backward)
