"""Claims of the README's decision-table passage ("Which options"), over analysis.report.decision_table.

A failure names the sentence to rewrite."""

from __future__ import annotations

import functools

import pytest

from analysis.paths import RESULTS_DIR
from analysis.report.decision_table import decision_table
from lce.decide import BIAS_LIMIT, TRAINED_CHUNK_COUNTS


@functools.cache
def _table():
    return decision_table(RESULTS_DIR)


def _rows(device, dtype=None):
    table = _table()
    rows = table[table["device"] == device]
    return rows if dtype is None else rows[rows["dtype"] == dtype]


def test_on_cuda_the_default_holds_more_memory_than_torchs_and_is_near_the_floor_where_torchs_is_not():
    """"On CUDA, lce's default holds an fp32 copy of the weight gradient that torch's compact default does not (the
    negative savings), and buys gradients near the floor where torch's sit several floors off"."""
    cuda = _rows("cuda")
    assert (cuda["saves_gib"] < 0).all()
    assert (cuda["grad_weight_floors"] <= 1.1).all() and (cuda["torch_grad_weight_floors"] >= 5).all()


def test_recommend_gets_memory_back_at_the_llm_heads_with_trained_compact_chunks_and_spends_it_at_the_small_one():
    """"less memory than auto at the two LLM heads, more at the small one" and "compact with few, large row chunks
    gets most of that memory back within the error limit, a pick the head-only training study trained"."""
    for dtype in ("bfloat16", "float16"):
        cuda = _rows("cuda", dtype).set_index("head_name")
        llm = cuda.drop(index="small")
        assert (llm["recommend_peak_gib"] < llm["peak_gib"]).all()
        recovered = (llm["peak_gib"] - llm["recommend_peak_gib"]) / -llm["saves_gib"]
        assert (recovered > 0.2).all(), recovered  # a share of the accumulator's memory, within the limit
        assert (llm["recommend_grad_weight_floors"] <= llm["limit"]).all()
        assert llm["recommend"].str.startswith("compact").all()
        assert cuda.loc["small", "recommend_peak_gib"] > cuda.loc["small", "peak_gib"]
    chunks = {int(16384 / 2048), int(8192 / 1024)}
    assert all((k, True) in TRAINED_CHUNK_COUNTS[dtype] for k in chunks for dtype in TRAINED_CHUNK_COUNTS)


def test_on_cpu_the_default_is_torchs_policy_at_torchs_accuracy():
    """"On CPU the default is torch's own policy"."""
    for dtype in ("bfloat16",):
        cpu = _rows("cpu", dtype)
        assert (cpu["auto"].str.startswith("accurate")).all()
        assert (cpu["grad_weight_floors"] <= cpu["torch_grad_weight_floors"] * 1.02).all()


def test_every_measured_auto_bias_is_within_the_rule():
    assert (_table()["bias_over_noise"] <= BIAS_LIMIT).all()


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_the_table_names_where_its_times_come_from(device):
    assert _rows(device)["time_source"].str.startswith("predicted").all()
