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


def test_the_committed_gpu_runs_are_the_noise_and_training_studies_and_one_partial_gpu_check():
    """"On a GPU" (docs/reproducing.md): "The GPU runs committed so far are the noise and training studies on an H200
    (noise_cuda.csv, training_cuda.csv.gz) and one gpu-check on an H200 (cuda.csv, gpu_memory.csv, gpu_bench.csv)";
    "its grid reached 27 of its 36 problems ...; no head_training_cuda.csv.gz; the compiled and Cut Cross-Entropy bench
    arms did not run"."""
    import pandas as pd

    from analysis.paths import RESULTS_DIR
    from analysis.sweep.grids import get_grid

    for name in ("noise_cuda.csv", "training_cuda.csv.gz", "gpu_memory.csv", "gpu_bench.csv"):
        table = pd.read_csv(RESULTS_DIR / name)
        assert table["device_name"].str.contains("H200").all(), name
    grid = pd.read_csv(RESULTS_DIR / "cuda.csv")
    problems = ["device", "family", "dtype", "N", "D", "C", "seed"]
    planned = {(c.device, c.family, c.dtype, c.N, c.D, c.C, c.seed) for c in get_grid("cuda").configs}
    assert len(planned) == 36 and len(grid[problems].drop_duplicates()) == 27
    assert not any((RESULTS_DIR / f"head_training_cuda{form}").exists() for form in (".csv", ".csv.gz"))
    bench = pd.read_csv(RESULTS_DIR / "gpu_bench.csv").set_index("op")
    assert bench.loc["cce", "status"] == "error" and bench.loc["compiled", "status"] == "not run"


# ---- the headline findings (analysis/report/headlines.py writes them; each test asserts what one says) ----------

def _results():
    from analysis.paths import RESULTS_DIR

    return RESULTS_DIR


def test_headline_accuracy_for_memory():
    """"lce's default (balanced) keeps the weight gradient at ... rounding floors where torch 2.13's default sits at
    ..., for ... GiB more"."""
    from analysis.report.headlines import decision_headline

    numbers = decision_headline(_results())
    assert numbers["auto"] == "balanced"
    assert numbers["weight_floors"] < 1.5 and numbers["torch_weight_floors"] > 4 * numbers["weight_floors"]
    assert numbers["saved_gib"] < 0  # more memory, as the sentence says


def test_headline_the_pick_measured_on_an_h200():
    """"Measured on an H200: {1.01} floors (worst gradient) in {3.06} GiB, at {9}x the unfused op's time, spent
    adding into its fp32 accumulator in million-element blocks; lce now sums it in one GEMM or a few large blocks per
    chunk of {2048} rows, predicted at {1.3}x in {3.83} GiB (not yet run on a GPU)": the H200 ran an older, smaller
    plan, so today's predicted peak is the larger."""
    from analysis.report.headlines import decision_headline, measured_head_headline

    decision = decision_headline(_results())
    measured = measured_head_headline(_results(), decision["head"].replace("x", "×"))
    assert measured is not None and measured["floors"] < 1.05 and measured["vs_unfused_time"] > 5
    assert measured["predicted_vs_unfused"] < 2
    assert decision["rows"] >= 2048 and decision["peak_gib"] > measured["gib"]


def test_headline_the_error_matters_on_rare_classes():
    """"compact at 256 chunks moved the rare classes' held-out loss by ... millinats, beyond the fp32 head's own seed
    spread (...), while balanced stayed at ..."."""
    from analysis.report.headlines import training_headline

    numbers = training_headline(_results())
    assert abs(numbers["compact_gap"]) > numbers["spread"] > abs(numbers["balanced_gap"])
    assert numbers["seeds"] >= 3


def test_headline_rl_ratio():
    """"At a 151,936-class head in bf16, TRL 1.16's fused log-probability head moves the PPO/GRPO ratio by ...% at the
    99th percentile ...; lce.linear_log_probs, routed into TRL ..., keeps every token within ... from the same bf16
    operands, as TRL's fp32 cast of the head does (...)"."""
    from analysis.report.headlines import rl_headline

    numbers = rl_headline(_results())
    assert numbers["classes"] == 151936 and numbers["trl_p99"] > 0.01 and numbers["lce_worst"] < 1e-4
    assert numbers["lce_worst"] < 1.25 * numbers["cast_worst"]


def test_headline_memory():
    """"... peaks at ... GiB with materialized logits, ... GiB with TRL's fused head and ... GiB with lce"."""
    from analysis.report.headlines import memory_headline

    numbers = memory_headline(_results())
    assert numbers["classes"] == 151936 and numbers["lce_gib"] * 2 < numbers["materialized_gib"]
    assert numbers["lce_gib"] < numbers["trl_gib"]


def test_headline_trainer_and_inference_heads():
    """"the pair to use is ... lce ... with ... head_dtype=float32 ...: they agree to ... nats RMS and each side is
    within ... nats of fp64. ... match vLLM's default bf16 head as closely ..., but both sides then sit ... nats from
    fp64. Pairing bf16 logits on one side with fp32 on the other costs ... nats RMS ... TRL's default sequence mask
    drops ...": lce's default is in the pair to use, which beats the bf16 pairs on fp64 error by 100x and the
    mixed pairs' mismatch by 100x."""
    from analysis.core.results_io import HEAD_MISMATCH, load_kind
    from analysis.report.nb11_head_mismatch import best_pairs, mixed_pairs, pair_summary

    table = load_kind(_results(), HEAD_MISMATCH.name)[1]
    best, mixed = best_pairs(table), mixed_pairs(table)
    assert any(name.startswith("lce auto") for name in best["trainer"])
    assert set(best["inference"]) == {"vllm head_dtype=float32"}
    worst_best = best[["rms", "trainer_rms_exact", "inference_rms_exact"]].max().max()
    summary = pair_summary(table)
    calibrated = summary[summary["family"] == "calibrated"]
    bf16 = calibrated[calibrated["same_grid"] & (calibrated["inference"] == "vllm default")]
    assert len(bf16) and 100 * worst_best < bf16["trainer_rms_exact"].median()
    assert len(mixed) and 100 * worst_best < mixed["rms"].min()
