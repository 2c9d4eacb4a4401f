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
    plan = lce.plan(x, weight, options=lce.LinearCrossEntropyOptions())
    logits_bytes = shape.N * shape.C * torch.bfloat16.itemsize
    assert plan.num_chunks > 1
    assert max(buffer.nbytes for buffer in plan.buffers) < logits_bytes
    assert plan.peak_extra_bytes < logits_bytes


def test_the_committed_gpu_runs_are_the_noise_and_training_studies_and_no_gpu_check_output():
    """"On a GPU": "The GPU runs committed so far are the noise and training studies on an H200 (noise_cuda.csv,
    training_cuda.csv ...); no gpu-check output (cuda.csv, gpu_memory.csv, gpu_bench.csv) has been committed yet"."""
    import pandas as pd

    from analysis.paths import RESULTS_DIR

    for name in ("noise_cuda.csv", "training_cuda.csv"):
        table = pd.read_csv(RESULTS_DIR / name)
        assert (table["device"] == "cuda").all() and table["device_name"].str.contains("H200").all(), name
    assert not any((RESULTS_DIR / name).exists() for name in ("cuda.csv", "gpu_memory.csv", "gpu_bench.csv"))
