"""Notebook 05's conclusions (analysis.report.nb05_realistic_inputs) quote the numbers of small hand-made tables."""

from __future__ import annotations

import pandas as pd

from analysis.report import nb05_realistic_inputs as realistic
from analysis.report.notebooks import MARKER


def _stats(family: str, **values: float) -> pd.DataFrame:
    return pd.DataFrame({"family": family, "statistic": list(values), "value": list(values.values()),
                         "rank": float("nan"), "N": 2048, "D": 128, "C": 16384, "seed": 0})


def test_family_portraits_name_each_trait_from_the_statistics():
    base = dict(mean_loss=3.0, share_margin_above_16=0.0, max_margin=5.0, distinct_targets=100.0,
                top_class_share=0.01)
    stats = pd.concat([
        _stats("random", **{**base, "mean_loss": 14.0, "p_target_q0.95": 1e-5, "p_target_q0.5": 1e-7,
                            "share_p_target_above_0.999": 0.0, "feature_rms_max_over_median": 1.02,
                            "zipf_slope": -0.02}),
        _stats("calibrated", **{**base, "p_target_q0.95": 1.0, "p_target_q0.5": 0.08,
                                "share_p_target_above_0.999": 0.1, "feature_rms_max_over_median": 18.0,
                                "zipf_slope": -0.9}),
    ], ignore_index=True)
    text = realistic.family_portraits(stats)
    assert text.startswith(MARKER)
    finding = text.split("\n\n")[0]
    assert "95% of rows below p_target 0.001): `random`." in finding
    assert "slope below −0.5): `calibrated`." in finding
    assert "(p_target > 0.999): `calibrated`." in finding
    assert "`calibrated`: mean loss 3.00 nats, median p_target 0.08, 10.0% of rows" in text
    assert "2048 rows each" in text and "held-out loss" in text  # the trained model from its dump's metadata


def _margins() -> pd.DataFrame:
    rows = []
    for margin in (0.0, 10.0, 30.0):
        for seed in range(3):
            rows.append(dict(impl="lce accurate cpu acc=fp32", dtype="bfloat16", margin=margin, seed=seed,
                             grad_input_floors=1.0, grad_weight_floors=1.0 + 0.01 * seed, loss_ulps=0.5,
                             N=64, D=128, C=4096))
            peer = 1.2 if margin <= 10 else 600.0 + seed
            rows.append(dict(impl="unfused fp32", dtype="bfloat16", margin=margin, seed=seed,
                             grad_input_floors=peer, grad_weight_floors=1.0, loss_ulps=200.0 if margin > 10 else 0.5,
                             N=64, D=128, C=4096))
    return pd.DataFrame(rows)


def test_margins_quote_the_worst_seed_median_and_where_it_is():
    text = realistic.margins(_margins())
    finding = text.split("\n\n")[0]
    assert "stays within 1.01 floors on both gradients at every margin from 0 to 30 nats" in finding
    assert "loss within 0.50 ulp" in finding
    assert "reach 601 floors in bf16 (at 30 nats) and 200 ulps on the loss, while being within 1.20 floors up to " \
           "10 nats" in finding
    assert "3 seeds" in text


def test_rare_rows_compare_compact_and_balanced_on_the_cuda_layouts():
    rows = []
    for impl, frobenius, p99, worst in (("lce compact cuda acc=fp32 aspect_ratio:2", 10.0, 40.0, 150.0),
                                        ("lce balanced cuda acc=fp32 aspect_ratio:2", 1.25, 3.0, 6.5)):
        for seed in range(2):
            for bin_name, scale in (("never", 1.0), ("16+", 0.2)):
                rows.append(dict(impl=impl, dtype="float16", family="calibrated", seed=seed, bin=bin_name,
                                 grad_weight_floors=frobenius, row_p99=p99 * scale, row_max=worst * scale + seed,
                                 N=2048, D=256, C=16384))
    text = realistic.rare_rows(pd.DataFrame(rows))
    finding = text.split("\n\n")[0]
    assert "costs 10.00 floors on the whole grad_weight and up to 151 floors on single class rows" in finding
    assert "is 1.25 floors with no row above 7.5" in finding
    assert "float16 → balanced" in finding  # lce's table, read from lce.policies


def _verdict(family: str, device: str, dtype: str, on_memory: bool, error: float, **more) -> dict:
    return dict(family=family, device=device, dtype=dtype, shape="64x128x16384", pick="balanced aspect_ratio:2",
                listed=True, seeds=5, error=error, error_low=error * 0.9, error_high=error * 1.1,
                on_memory_front=on_memory, memory_off_seeds=0 if on_memory else 5, on_time_front=True,
                time_off_seeds=0, **more)


def test_verdict_matrix_and_changes_name_the_entries_that_change_with_the_inputs():
    table = pd.DataFrame([_verdict("random", "cuda-emulated", "bfloat16", True, 1.2),
                          _verdict("calibrated", "cuda-emulated", "bfloat16", False, 1.3),
                          _verdict("random", "cpu", "float16", True, 1.0),
                          _verdict("calibrated", "cpu", "float16", True, 1.0)])
    matrix = realistic.verdict_matrix(table)
    assert list(matrix.columns) == ["device", "dtype", "auto pick", "random", "calibrated"]
    cell = matrix[(matrix.device == "cuda-emulated")]["calibrated"].iloc[0]
    assert cell == "64x128x16384: mem ✗ (5/5) time –, 1.30 [1.17–1.43]"
    text = realistic.verdict_changes(table)
    assert "changes between input families for cuda-emulated bfloat16." in text.split("\n\n")[0]
    assert "random: memory front ✓, 1.20 floors [up to 1.32]" in text
    assert "cpu float16 → balanced aspect_ratio:2**:" in text  # unchanged: no "(changes with the inputs)"
