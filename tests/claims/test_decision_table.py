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
    """"On CUDA, lce's default holds more than torch's compact default (the negative savings): an fp32 copy of the
    weight gradient, and chunks of at least 2048 rows, whose fp32 logits take up to 2 GiB at the 256000-class head
    [...]; it buys gradients near the floor where torch's sit several floors off"."""
    cuda = _rows("cuda")
    assert (cuda["saves_gib"] < 0).all()
    assert (cuda["accumulator_gib"] > 0).all() and (cuda["rows"] >= 2048).all() and (cuda["min_rows"] == 2048).all()
    widest = cuda.loc[cuda["logits_chunk_gib"].idxmax()]
    assert widest["head"].endswith("x256000") and 1.5 < widest["logits_chunk_gib"] <= 2.0
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


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_every_row_is_the_plan_lce_plan_prints_for_the_default_options(device):
    """Each row's rows per chunk, policy and peak are those of ``lce.plan`` for that head with the default options
    on that device kind (the head's tensors as zero-stride CPU views, or meta tensors planned as CUDA ones), so the
    table cannot describe a plan "auto" does not run (issue 48: the CUDA rows once showed the chunking rule's
    64-512 rows where auto keeps its 2048-row floor)."""
    import torch

    import lce
    from lce.testing import cpu_gemms, emulate_device_kind

    for row in _rows(device).itertuples():
        n, d, c = (int(v) for v in row.head.split("x"))
        dtype = getattr(torch, row.dtype)
        where = "meta" if device == "cuda" else "cpu"
        x = torch.empty((), dtype=dtype, device=where).expand(n, d).requires_grad_()
        w = torch.empty((), dtype=dtype, device=where).expand(c, d).requires_grad_()
        with emulate_device_kind(device), cpu_gemms("native"):
            plan = lce.plan(x, w)
        assert (plan.acc_policy, plan.batch_chunk_size) == (row.policy, row.rows), (row.head, row.dtype, str(plan))
        assert plan.peak_extra_bytes / 2**30 == pytest.approx(row.peak_gib, rel=0.02), (row.head, row.dtype)
        if device == "cuda":
            assert row.rows >= min(row.min_rows, n), "a CUDA row below the auto table's floor"


def test_the_bias_columns_read_the_procedure_at_the_heads_n_and_at_an_llm_step():
    """The table's "bias/noise at this N" is measured (the heads' N are within the noise-scaling study's range) for
    every bf16/fp16 row, and its 2^20 column is a prediction with a band around it."""
    table = _table()
    narrow = table[table["dtype"].isin(["bfloat16", "float16"])]
    assert not narrow["bias_predicted"].any()
    assert (narrow["bias_low"] <= narrow["bias_over_noise"]).all()
    assert (narrow["bias_over_noise"] <= narrow["bias_high"]).all()
    assert (narrow["bias_at_step_low"] <= narrow["bias_at_step"]).all()
    assert (narrow["bias_at_step"] <= narrow["bias_at_step_high"]).all()
    assert table[table["dtype"] == "float32"]["bias_at_step"].isna().all()
