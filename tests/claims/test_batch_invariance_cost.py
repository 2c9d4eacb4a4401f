"""Claims of docs/using-lce.md's batch-invariance section over the committed timings
(analysis/results/invariance_cost.csv, python -m analysis invariance-cost)."""

from __future__ import annotations

import pytest
import torch

from analysis.core.problem import BENCH_SHAPE
from analysis.core.results_io import INVARIANCE_COST, load_kind
from analysis.paths import RESULTS_DIR
from analysis.report.invariance import cost_ratios
from lce.decide.invariance import INVARIANCE_COST as COST_LIMIT
from lce.planning.policies import AUTO_TABLE


def _ratios():
    _, table = load_kind(RESULTS_DIR, INVARIANCE_COST.name)
    if table.empty:
        pytest.fail("no invariance_cost results committed: run python -m analysis invariance-cost")
    return cost_ratios(table)


def test_the_time_cost_is_measured_at_the_bench_shape_for_both_ops_and_dtypes():
    """"What it costs measured on this CPU": both arms of the loss and the log-probabilities, fp32 and bf16, at the
    bench shape, every case with its rows."""
    ratios = _ratios()
    at_bench = ratios[(ratios["N"] == BENCH_SHAPE.N) & (ratios["D"] == BENCH_SHAPE.D) & (ratios["C"] == BENCH_SHAPE.C)]
    for cpu, group in at_bench.groupby("cpu_model"):
        assert {(op, dtype) for op, dtype in zip(group["op"], group["dtype"], strict=True)} == {
            (op, dtype) for op in ("loss", "log_probs") for dtype in ("float32", "bfloat16")}, cpu
        assert (group["invariant_s"] > 0).all() and (group["follows_s"] > 0).all()


def test_the_loss_default_that_keeps_the_contract_on_the_cpu_costs_no_more_than_the_limit_there():
    """"for the loss, on where "auto" sizes the chunks and the auto table says the fixed rows cost at most 5% time
    ... (on the CPU, measured below)": where the CPU's loss default is batch-invariant, its measured time at the bench
    shape is within the limit of the chunks that follow N (within the spread of the interleaved rounds)."""
    ratios = _ratios()
    at_bench = ratios[(ratios["N"] == BENCH_SHAPE.N) & (ratios["op"] == "loss")]
    checked = 0
    for row in at_bench.itertuples():
        if AUTO_TABLE[("cpu", getattr(torch, row.dtype))].batch_invariant:
            assert row.low <= 1 + COST_LIMIT, row
            checked += 1
    assert checked, "no CPU loss default is batch-invariant: rewrite the sentence"


def test_a_call_smaller_than_a_fixed_chunk_pays_for_the_whole_chunk():
    """"a call smaller than the fixed rows runs a whole chunk": at 300 rows the batch-invariant arm loops over its
    fixed rows, more than N."""
    ratios = _ratios()
    small = ratios[ratios["N"] < ratios["invariant_rows"]]
    assert len(small) and (small["loop_rows"] == small["invariant_rows"]).all()
