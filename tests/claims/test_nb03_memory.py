"""Claims of notebook 03, over the committed results it reads (the sweep grids, the memory study's breakdown and
trace). A failure names the sentence to rewrite."""

from __future__ import annotations

import functools

from analysis.core.results_io import GPU_MEMORY, MEMORY_BREAKDOWN, MEMORY_TRACE, load_kind
from analysis.judge import pareto
from analysis.paths import RESULTS_DIR
from analysis.report import nb03_memory
from analysis.report.nb03_memory import MODEL_BAND
from analysis.studies import memory_study


@functools.cache
def _load(kind: str):
    return pareto.load_table()[1] if kind == "sweep" else load_kind(RESULTS_DIR, kind)[1]


def test_the_model_predicts_every_sweep_run_within_the_band_and_never_above_it():
    """"predicts the measured peak within ±15% on ... of ... runs [all], and it never predicts more than was
    measured"; "the largest miss, {x}, is a small allocation the model leaves out" (under 2%)."""
    runs = nb03_memory.model_runs(_load("sweep"))
    assert len(runs) and runs["within"].all() and (runs["ratio"] >= 1).all()
    assert runs["ratio"].max() < 1.02


def test_on_the_h200_the_model_predicts_the_cuda_allocators_peak_within_a_fraction_of_a_percent():
    """"On NVIDIA H200 the model predicts the CUDA allocator's peak within {0.18%} on all {12} runs ...; the model
    never predicts more than was measured"."""
    gpu = nb03_memory.gpu_memory_fit(_load(GPU_MEMORY.name))
    assert len(gpu) >= 12 and set(gpu["device_name"]) == {"NVIDIA H200"}
    assert (gpu["measured_over_modeled"] >= 1).all() and (gpu["measured_over_modeled"] < 1.005).all()


def test_the_smallest_plan_lacks_only_fp32_buffers_led_by_the_weight_gradient_accumulator():
    """"[the smallest] has none of ...: all float32 working buffers of [the largest], the largest the persistent
    (C, D) weight-gradient accumulator. `lce balanced acc=fp32` keeps that accumulator"; "A plan's buffers add up
    to more than its peak"."""
    breakdown = _load(MEMORY_BREAKDOWN.name)
    plans = nb03_memory.plan_sizes(breakdown)
    missing = nb03_memory.lacks(breakdown, plans["peak"].idxmin(), plans["peak"].idxmax())
    assert set(missing["buffer_dtype"]) == {"float32"} and missing["buffer"].iloc[0] == "weight_grad_accumulator"
    assert missing["MiB"].iloc[0] * 2**20 == 4 * breakdown["C"].iloc[0] * breakdown["D"].iloc[0]
    assert "weight_grad_accumulator" in set(breakdown.loc[breakdown["config"] == "lce balanced acc=fp32", "buffer"])
    assert (plans["total"] > plans["peak"]).all()


def test_lce_peaks_below_torch_and_the_reference_and_some_but_not_all_match_their_plans():
    """"every lce configuration peaks below torch's op and the unfused reference"; "[some] measure within ... of
    their predicted peaks; [the others] ...: outside the ±15% band"."""
    peaks = memory_study.peaks(_load(MEMORY_TRACE.name), _load(MEMORY_BREAKDOWN.name)).set_index("config")
    lce = peaks[peaks.index.str.startswith("lce")]
    assert lce["measured_mib"].max() < peaks.loc["torch auto", "measured_mib"] < peaks.loc["reference", "measured_mib"]
    assert 0 < ((lce["measured_over_predicted"] - 1).abs() > MODEL_BAND).sum() < len(lce)
