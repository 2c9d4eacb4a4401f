"""Notebook 07's conclusions (analysis.report.nb07_choosing_options) quote the numbers of small hand-made tables."""

from __future__ import annotations

import pandas as pd

from analysis.report import nb07_choosing_options as choice
from analysis.report.notebooks import MARKER


def _budget_row(budget: str, budget_mib: float, measured_mib: float, **extra) -> dict:
    mib = 2**20
    return dict(budget=budget, budget_bytes=budget_mib * mib, gradients_bytes=36 * mib, default_limit_met=True,
                dtype="bfloat16", family="calibrated", N=4096, D=512, C=32768, predicted_peak_bytes=measured_mib * mib,
                measured_peak_bytes=measured_mib * mib, predicted_grad_input_floors=2.0, grad_input_floors=2.0,
                predicted_grad_weight_floors=1.5, grad_weight_floors=1.0, cpu_model="Test CPU") | extra


def test_budgets_says_when_a_budget_was_exceeded_and_by_how_much():
    table = pd.DataFrame([_budget_row("auto", 100, 90), _budget_row("1.05x gradients", 37.8, 45.0,
                                                                     default_limit_met=False)])
    text = choice.budgets(table)
    finding = text.split("\n\n")[0]
    assert finding.startswith(MARKER)
    assert "Not every recommended option set stayed within 1.15× its budget" in finding
    assert "0.900–1.190× the budget" in finding and "met in 1 of 2 budgets" in finding
    assert "grad_weight: measured 1.00 floors, predicted within 50%" in text
    assert "Test CPU" in text and "4096×512×32768" in text


def test_class_tiling_quotes_the_saving_and_the_time_ratio_per_policy():
    rows = [dict(policy="compact", num_class_chunks=blocks, time_ratio=ratio, measured_peak_bytes=mib * 2**20,
                 N=4096, D=512, C=32768, dtype="bfloat16", batch_chunk_size=512, cpu_model="Test CPU")
            for blocks, ratio, mib in ((1, 1.0, 100), (4, 1.5, 50))]
    text = choice.class_tiling(pd.DataFrame(rows))
    assert "cut the measured peak by 50% per policy at a time cost of 1.50×" in text
    assert "compact: 4 blocks 1.50× the time, 50 MiB (row-only 100 MiB)" in text
    assert "bfloat16, 512 rows per chunk" in text


def test_llm_predictions_separate_the_default_chunking_from_the_most_chunks():
    chunkings = {2: "aspect_ratio:2", 64: "chunks:64"}
    rows = [dict(shape="8x4x16", dtype="bfloat16", kind="cuda", policy=policy, chunking=chunkings[chunks],
                 num_chunks=chunks, grad_weight=floors)
            for policy, floors_at in (("compact", {2: 3.0, 64: 40.0}), ("balanced", {2: 1.1, 64: 1.1}),
                                      ("accurate", {2: 1.0, 64: 1.0}))
            for chunks, floors in floors_at.items()]
    text = choice.llm_predictions(pd.DataFrame(rows))
    assert "compact's weight gradient is 3.0 floors, balanced's 1.10 and accurate's 1.00" in text
    assert "to 40 floors at 64 chunks" in text
    assert "Predicted, not measured" in text
