"""The budgets study, the recommend tables and the sweep rows' peaks against lce's current memory model."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

import lce
from analysis.core.fp64 import reference_outputs
from analysis.core.inputs import make_inputs
from analysis.core.problem import Shape
from analysis.core.results_io import BUDGETS, CLASS_TILING, load_kind
from analysis.paths import RESULTS_DIR
from analysis.report.nb07_choosing_options import cce_anchor, draw_budget_figures, llm_recommendations
from analysis.studies import budgets
from analysis.studies.budgets import BUDGET_TOLERANCE
from analysis.sweep.remeasure import stale_rows


@pytest.mark.parametrize("grid", ["quick", "medium"])
def test_committed_sweep_peaks_match_the_current_memory_model(grid):
    """A change to lce's memory use must bring the committed rows along (python -m analysis remeasure-memory)."""
    table = pd.read_csv(RESULTS_DIR / f"{grid}.csv")
    assert stale_rows(table).empty


def test_measure_options_reports_peak_errors_and_time():
    shape = Shape(64, 16, 512)
    inputs = make_inputs(shape, torch.bfloat16, family="calibrated", bias=False)
    options = lce.LinearCrossEntropyOptions(acc_policy="accurate", acc_dtype=torch.float32, chunking_method=None,
                                            batch_chunk_size=16, class_chunk_size=100)
    row = budgets.measure_options(inputs, reference_outputs(inputs), options, repeats=1)
    plan = lce.plan(inputs.input, inputs.weight, options=options)
    assert row["measured_peak_bytes"] == pytest.approx(plan.peak_extra_bytes, rel=0.15)
    assert 0.99 <= row["grad_weight_floors"] < 1.5 and row["grad_input_floors"] >= 0.99
    assert row["time_median_s"] > 0


@pytest.mark.slow
def test_child_process_measures_the_same_options():
    shape = Shape(64, 16, 512)
    options = lce.LinearCrossEntropyOptions(acc_policy="compact", acc_dtype=torch.float32, batch_chunk_size=32,
                                            chunking_method=None, class_chunk_size=128)
    row = budgets._measure_in_child(shape, "bfloat16", options)
    assert set(row) == {"measured_peak_bytes", "grad_input_floors", "grad_weight_floors", "time_median_s"}


def test_budgets_cover_auto_and_approach_the_gradients():
    labels = [label for label, _ in budgets.budgets_for(Shape(4096, 512, 32768), torch.bfloat16)]
    assert labels[0] == "auto" and labels[-1] == "1.05x gradients"


def test_llm_recommendations_are_labelled_predictions_and_meet_their_budgets():
    table = llm_recommendations(devices=("cuda",), multiples=(None, 1.2))
    assert (table["status"] == "prediction").all()
    budgeted = table[table["budget"] != "none"]
    assert (budgeted["peak_gib"] <= budgeted["budget_gib"]).all()
    unbudgeted = table[table["budget"] == "none"]  # no budget: the objective's pick, never above auto's peak
    assert len(unbudgeted) and (unbudgeted["peak_gib"] <= unbudgeted["auto_peak_gib"]).all()
    assert table["default_limit_met"].all()


def test_cce_anchor_sits_just_above_the_gradients():
    anchor = cce_anchor()
    assert anchor["gradients_mib"] == pytest.approx(1161.0, abs=0.5)  # CCE's stated lower bound, in MiB
    assert anchor["gradients_mib"] < anchor["smallest_mib"] <= anchor["within_limit_mib"]
    assert anchor["within_limit_error"] <= anchor["limit"]


def test_committed_budgets_study_meets_the_tolerance_and_draws():
    (_, study), (_, tiling) = (load_kind(RESULTS_DIR, kind.name) for kind in (BUDGETS, CLASS_TILING))
    if study.empty:
        pytest.skip("no budgets study committed")
    assert (study["measured_peak_bytes"] <= BUDGET_TOLERANCE * study["budget_bytes"]).all()
    assert (study["predicted_peak_bytes"] <= study["budget_bytes"]).all()
    assert {figure.stem for figure in draw_budget_figures(study, tiling)} == {"recommend_budgets", "class_tiling_cost"}
