"""Claims of the README's prose on the transformers integration's training step (section "Hugging Face
transformers"), over the committed ``hf_step`` rows (``python -m analysis hf-step``)."""

from __future__ import annotations

import pandas as pd
import pytest

from analysis.core.results_io import HF_STEP, load_kind
from analysis.paths import RESULTS_DIR
from analysis.report.hf_step import latest_run, step_numbers

PATCHED = ["lce", "lce recommend", "lce recommend budget"]


@pytest.fixture(scope="module")
def table() -> pd.DataFrame:
    return load_kind(RESULTS_DIR, HF_STEP.name)[1]


@pytest.fixture(scope="module")
def numbers(table) -> pd.DataFrame:
    return step_numbers(table, "cpu").set_index("arm")


def test_every_patched_step_peaks_at_a_fifth_of_the_unpatched_steps_3260_mib_or_less(numbers):
    assert round(numbers.loc["unpatched", "peak_mib"]) == 3260
    assert (numbers.loc[PATCHED, "peak_ratio"] <= 0.2).all()


def test_the_unpatched_step_holds_the_logits_several_times_over(table):
    row = latest_run(table, "cpu").set_index("arm").loc["unpatched"]
    assert (row["tokens"], row["vocab"]) == (2048, 128256)
    assert row["measured_peak_bytes"] >= 3 * row["logits_bytes"]  # logits_bytes: one fp32 copy


def test_the_budget_cuts_the_heads_buffers_from_384_to_149_mib_but_the_steps_peak_from_650_to_527(numbers):
    default, budget = numbers.loc["lce"], numbers.loc["lce recommend budget"]
    assert (round(default["head_model_mib"]), round(budget["head_model_mib"])) == (384, 149)
    assert (round(default["peak_mib"]), round(budget["peak_mib"])) == (650, 527)
    assert budget["head_model_mib"] / default["head_model_mib"] < budget["peak_mib"] / default["peak_mib"]


def test_the_budgeted_steps_peak_is_within_10_percent_of_the_embeddings_and_heads_fp32_gradients(table, numbers):
    row = latest_run(table, "cpu").iloc[0]
    gradients_mib = 2 * row["vocab"] * row["hidden"] * 4 / 2**20  # embedding and lm_head, untied, fp32
    assert round(gradients_mib / 2) == 250
    assert 1.0 <= numbers.loc["lce recommend budget", "peak_mib"] / gradients_mib <= 1.1


def test_every_patched_step_took_more_than_twice_the_unpatched_ones_time(table, numbers):
    assert (numbers.loc[PATCHED, "time_ratio"] > 2).all()
    policies = latest_run(table, "cpu").set_index("arm")["policy"]
    assert (policies["lce"], policies["lce recommend budget"]) == ("accurate", "compact")


def test_the_losses_of_the_measured_step_agree_to_within_1e_3_nats(numbers):
    assert numbers["loss_diff"].abs().max() < 1e-3


def test_no_gpu_run_of_the_step_is_committed_yet(table):
    assert latest_run(table, "cuda").empty
