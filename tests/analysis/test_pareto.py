"""analysis.judge.pareto on a small set whose front and verdicts are known."""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.judge.pareto import (
    ERROR,
    INTERVAL,
    MEMORY,
    SEED_PERCENTILES,
    TIME,
    VS_UNFUSED,
    choices_summary,
    front_mask,
    prepare,
    recommend,
    recommend_choices,
    same_numbers,
    seed_interval,
    verdict_lines,
    verdict_summary,
    verdicts,
)


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


# --- seeds and families ----------------------------------------------------------------------------------------


def _seeded(op, policy, chunking, peak, errors, time=1.0, family="random", **fields):
    """One row per seed of one configuration; ``errors[i]`` is seed i's error."""
    return [dict(_row(op, policy, chunking, peak, error, time, **fields), seed=seed, family=family)
            for seed, error in enumerate(errors)]


def _auto(errors, **fields):
    return _seeded("lce", "auto", "auto", 10, errors, time=5, resolved=("accurate", "float32", 8), **fields)


def test_seed_interval_is_the_median_and_numpy_percentiles_per_config():
    errors = [1.0, 4.0, 2.0, 8.0, 3.0]
    table = prepare(pd.DataFrame(_auto(errors) + _seeded("lce", "compact", "auto", 4, [5.0, 6.0, 7.0, 9.0, 5.5])))
    spread = seed_interval(table, [ERROR, MEMORY]).set_index("label")
    auto = spread.loc["lce auto auto"]
    assert auto["seeds"] == 5 and auto[ERROR] == 3.0 and auto[MEMORY] == 10.0
    assert auto[f"{ERROR}_low"] == np.percentile(errors, SEED_PERCENTILES[0])
    assert auto[f"{ERROR}_high"] == np.percentile(errors, SEED_PERCENTILES[1])
    assert spread.loc["lce compact auto", f"{ERROR}_high"] == np.percentile([5.0, 6.0, 7.0, 9.0, 5.5], 95)
    assert INTERVAL == "5th–95th percentile over seeds"


def test_a_pick_knocked_off_in_one_seed_of_five_is_off_the_front():
    rival = _seeded("lce", "balanced", "aspect_ratio", 8, [2.0, 2.0, 2.0, 2.0, 0.5], time=9)  # slower; seed 4 only
    table = prepare(pd.DataFrame(_auto([1.0, 1.0, 1.0, 1.0, 1.0]) + rival))
    verdict = verdicts(table).iloc[0]
    assert verdict.family == "random" and verdict.seeds == 5
    assert not verdict.on_memory_front and verdict.memory_off_seeds == 1
    assert verdict.memory_dominator == "lce balanced ar" and verdict.memory_dominator_seeds == 1
    assert verdict.memory_dominator_error == 2.0 and verdict.memory_dominator_peak_mib == 8.0  # medians over seeds
    assert verdict.on_time_front and verdict.time_off_seeds == 0
    line = next(line for line in verdict_lines(table) if "auto =" in line)
    assert "off the memory front in 1 of 5 seeds: lce balanced ar (in 1)" in line
    assert "error 1.00 floors [1.00–1.00], 5 seeds" in line
    # Without seed 4 it is on the front in every seed.
    verdict = verdicts(table[table["seed"] < 4]).iloc[0]
    assert verdict.on_memory_front and verdict.seeds == 4


def test_the_most_frequent_rival_is_named_and_the_error_is_a_seed_median():
    errors = [1.0, 1.2, 1.4, 1.1, 3.0]
    rows = (_auto(errors) + _seeded("lce", "balanced", "aspect_ratio", 8, [0.9, 0.9, 0.9, 9, 9])
            + _seeded("lce", "compact", "aspect_ratio", 4, [9, 9, 9, 1.0, 1.0]))
    verdict = verdicts(prepare(pd.DataFrame(rows))).iloc[0]
    assert verdict.memory_off_seeds == 5 and verdict.memory_dominator == "lce balanced ar"
    assert verdict.memory_dominator_seeds == 3
    assert verdict.error == 1.2 and verdict.error_low == np.percentile(errors, 5)
    assert verdict.error_high == np.percentile(errors, 95)
    summary = verdict_summary(verdicts(prepare(pd.DataFrame(rows)))).iloc[0]
    assert summary["memory front"] == "✗ in 5 of 5 seeds: lce balanced ar (3 of them): 0.90 floors, 8.00 MiB"
    assert summary["error interval"] == f"{np.percentile(errors, 5):.2f}–{np.percentile(errors, 95):.2f}"


def test_verdicts_are_per_family():
    rows = _auto([1.0, 1.0]) + _auto([2.0, 2.0], family="calibrated")
    rows += _seeded("lce", "balanced", "aspect_ratio", 8, [0.5, 0.5], family="calibrated")
    result = verdicts(prepare(pd.DataFrame(rows))).set_index("family")
    assert result.loc["random"].on_memory_front and not result.loc["calibrated"].on_memory_front
    assert result.loc["calibrated"].error == 2.0


def test_vs_unfused_divides_by_the_reference_of_the_same_inputs():
    rows = (_auto([3.0, 6.0], dtype="float32") + _seeded("reference", "", "", 50, [2.0, 4.0], dtype="float32")
            + _auto([1.5, 2.0], dtype="float32", device="cuda-emulated")
            + _auto([1.0, 1.0], dtype="float32", family="calibrated"))  # no calibrated reference
    table = prepare(pd.DataFrame(rows))
    ratio = table.set_index(["family", "device", "op", "seed"])[VS_UNFUSED]
    assert ratio[("random", "cpu", "lce", 0)] == 1.5 and ratio[("random", "cpu", "lce", 1)] == 1.5
    assert ratio[("random", "cpu", "reference", 0)] == 1.0
    assert ratio[("random", "cuda-emulated", "lce", 0)] == 0.75 and ratio[("random", "cuda-emulated", "lce", 1)] == 0.5
    assert np.isnan(ratio[("calibrated", "cpu", "lce", 0)])
    line = next(line for line in verdict_lines(table) if line.startswith("random cpu float32"))
    assert "(1.5x the unfused fp32 computation's own error)" in line


def test_costs_of_later_seeds_come_from_the_timed_seed():
    rows = _auto([1.0, 1.0, 1.0])
    for row in rows[1:]:
        row.update(peak_bytes_measured=np.nan, time_median_s=np.nan)
    table = prepare(pd.DataFrame(rows))
    assert table[MEMORY].tolist() == [10.0] * 3 and table[TIME].tolist() == [5.0] * 3


def test_same_numbers_compares_every_seed_and_recommend_is_per_family():
    def pair(family, second_seed_differs):
        rows = []
        for policy in ("auto", "compact"):
            for seed in (0, 1):
                row = dict(_row("lce", policy, "auto", 4, 2.0, dtype="float32"), seed=seed, family=family,
                           chunk_size=64, grad_weight_rel_fro=1e-6)
                if second_seed_differs and policy == "compact" and seed == 1:
                    row["grad_weight_rel_fro"] = 2e-6
                rows.append(row)
        return rows

    table = prepare(pd.DataFrame(pair("random", False) + pair("calibrated", True)))
    assert same_numbers(table, "cpu", "float32", family="random") == {"lce auto auto": "lce auto auto",
                                                                      "lce compact auto": "lce auto auto"}
    assert same_numbers(table, "cpu", "float32", family="calibrated")["lce compact auto"] == "lce compact auto"
    assert same_numbers(table, "cpu", "float32")["lce compact auto"] == "lce compact auto"  # all families pooled
    choices = recommend_choices(table, "cpu", "float32", family="random")
    assert len(choices) == 1 and choices.iloc[0]["members"] == ["lce auto auto", "lce compact auto"]
    assert len(recommend_choices(table, "cpu", "float32", family="calibrated")) == 2
    summary = choices_summary(table, "float32")
    assert set(summary["family"]) == {"random", "calibrated"} and summary.iloc[0]["interval"] == "2.00–2.00"
