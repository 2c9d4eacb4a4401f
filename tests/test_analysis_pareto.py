"""analysis.pareto on a small set whose front and verdicts are known."""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.pareto import ERROR, MEMORY, front_mask, prepare, recommend, verdict_lines, verdicts


def test_front_of_a_known_set():
    #            a    b    c    d    e(dup of b)  f(NaN)
    costs = [1.0, 2.0, 3.0, 2.5, 2.0, np.nan]
    errors = [5.0, 2.0, 1.0, 3.0, 2.0, 0.5]
    # d is dominated by b (cheaper and better); b and e tie, so neither dominates the other.
    assert front_mask(costs, errors).tolist() == [True, True, True, False, True, False]


def _row(op, policy, chunking, peak, error, time=1.0, dtype="bfloat16", acc="default", N=64, device="cpu",
         resolved=None):
    resolved_policy, resolved_acc, chunk_size = resolved or (policy, acc, N)
    return dict(status="ok", op=op, policy=policy, chunking=chunking, acc_dtype=acc, dtype=dtype, device=device,
                resolved_policy=resolved_policy, resolved_acc_dtype=resolved_acc, chunk_size=chunk_size,
                N=N, D=8, C=256, peak_bytes_measured=peak * 2**20, peak_bytes_modeled=peak * 2**20,
                time_median_s=time / 1e3, grad_input_fro_in_floors=error, grad_weight_fro_in_floors=error,
                grad_bias_fro_in_floors=np.nan)


def _table():
    rows = [
        _row("lce", "auto", "auto", peak=10, error=1.0, time=5,  # cpu bf16's auto pick
             resolved=("accurate", "float32", 8)),
        # The same computation spelled explicitly: 20% faster by noise alone, never a rival.
        _row("lce", "accurate", "aspect_ratio", peak=10, error=1.0, time=4, acc="float32",
             resolved=("accurate", "float32", 8)),
        _row("lce", "compact", "aspect_ratio", peak=4, error=3.0, time=2),
        _row("lce", "balanced", "aspect_ratio", peak=8, error=0.9, time=4),  # dominates the auto pick
        _row("reference", "", "", peak=50, error=1.0, time=1),
        _row("lce", "auto", "auto", peak=3, error=2.0, time=9, dtype="float32"),  # cpu fp32's auto pick
        _row("lce", "accurate", "aspect_ratio", peak=6, error=2.0, time=3, dtype="float32"),
    ]
    return prepare(pd.DataFrame(rows))


def test_prepare_derives_error_and_cost_columns():
    table = _table()
    assert table.loc[0, ERROR] == 1.0 and table.loc[0, MEMORY] == 10.0
    assert table.loc[4, "label"] == "reference"


def test_verdicts_name_the_dominating_choice():
    result = verdicts(_table()).set_index(["device", "dtype"])
    bf16 = result.loc[("cpu", "bfloat16")]
    assert not bf16.on_memory_front and bf16.memory_dominator == "lce balanced ar"
    assert bf16.memory_dominator_error == 0.9 and bf16.memory_dominator_peak_mib == 8.0
    assert not bf16.on_time_front and bf16.time_dominator == "reference"  # 5x faster, same error
    fp32 = result.loc[("cpu", "float32")]
    assert fp32.listed and fp32.on_memory_front and not fp32.on_time_front


def test_recommend_and_text():
    ranked = recommend(_table(), "cpu", "bfloat16")
    assert ranked.iloc[0]["label"] == "lce balanced ar"
    text = "\n".join(verdict_lines(_table()))
    assert "cpu bfloat16 64x8x256: auto = accurate aspect_ratio" in text and "off the memory front" in text


def test_an_explicit_spelling_of_the_auto_pick_is_not_a_rival():
    same = ("accurate", "float32", 8)
    table = prepare(pd.DataFrame([
        _row("lce", "auto", "auto", peak=10, error=1.0, time=5, resolved=same),
        _row("lce", "accurate", "aspect_ratio", peak=9, error=1.0, time=4, acc="float32", resolved=same),
    ]))
    verdict = verdicts(table).iloc[0]
    assert verdict.on_time_front and verdict.on_memory_front


def test_rivals_within_the_tolerance_do_not_count():
    table = prepare(pd.DataFrame([
        _row("lce", "auto", "auto", peak=10, error=1.0, time=5, resolved=("accurate", "float32", 8)),
        _row("lce", "compact", "aspect_ratio", peak=9.8, error=1.0, time=4.9),  # 2% better: noise
    ]))
    verdict = verdicts(table).iloc[0]
    assert verdict.on_time_front and verdict.on_memory_front


def test_a_policy_computing_the_same_numbers_is_not_a_rival():
    """fp32: every policy gives bit-identical errors at one chunk size; a faster timing of another is noise."""
    rows = [_row("lce", "auto", "auto", peak=3, error=2.0, time=10, dtype="float32",
                 resolved=("compact", "float32", 64)),
            _row("lce", "accurate", "auto", peak=3, error=2.0, time=8, dtype="float32",
                 resolved=("accurate", "float32", 64))]
    for row in rows:
        row.update(grad_weight_rel_fro=1.5e-6, grad_bias_rel_fro=3e-6)
    assert verdicts(prepare(pd.DataFrame(rows))).iloc[0].on_time_front
    rows[1].update(grad_weight_rel_fro=1.4e-6)  # different numbers: a real rival, 20% faster
    verdict = verdicts(prepare(pd.DataFrame(rows))).iloc[0]
    assert not verdict.on_time_front and verdict.time_dominator == "lce accurate auto"
