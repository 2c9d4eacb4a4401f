"""Claims of the README's own prose (the notebooks' claims are in their files here)."""

from __future__ import annotations

import torch

import lce
from analysis.core.problem import BENCH_SHAPE


def test_the_quick_start_call_never_holds_the_logits():
    """Quick start: "chunked ... the (N, C) logits never exist at once": lce's plan for that call allocates no
    buffer, and peaks at less, than one copy of the (N, C) logits in bf16."""
    shape = BENCH_SHAPE
    x = torch.empty(shape.N, shape.D, dtype=torch.bfloat16, device="meta", requires_grad=True)
    weight = torch.empty(shape.C, shape.D, dtype=torch.bfloat16, device="meta", requires_grad=True)
    plan = lce.plan(lce.LinearCrossEntropyOptions(), x, weight)
    logits_bytes = shape.N * shape.C * torch.bfloat16.itemsize
    assert plan.num_chunks > 1
    assert max(buffer.nbytes for buffer in plan.buffers) < logits_bytes
    assert plan.peak_extra_bytes < logits_bytes
