"""Claims of notebook 10's loss-scale section and of the README's "fp16 and a loss scale" passage, each a named
assertion over the committed loss_scale.csv.gz (``python -m analysis loss-scale``). A failure names the sentence to
rewrite."""

from __future__ import annotations

import functools

import pandas as pd

from analysis.core.results_io import LOSS_SCALE, load_kind
from analysis.paths import RESULTS_DIR
from analysis.report import nb10_loss_scale as nb10


@functools.cache
def _table() -> pd.DataFrame:
    return load_kind(RESULTS_DIR, LOSS_SCALE.name)[1]


@functools.cache
def _verdicts() -> pd.DataFrame:
    return nb10.arm_verdicts(_table())


def _sums_in_fp16(arm: str) -> bool:
    """Arms whose weight gradient is summed across chunks in fp16: compact on the CUDA layouts and any arm computing
    in fp16 (an explicit policy, default acc_dtype)."""
    return "acc=fp16" in arm or arm.startswith("lce compact cuda")


def _after() -> pd.DataFrame:
    return _verdicts()[_verdicts()["headroom"] == "after"]


def test_the_study_reaches_n_16384_and_c_131072_with_seeds_and_provenance():
    """"on the calibrated family up to N=16384 and C=131072, under scales of 2^12 to 2^16, 3 seeds at the
    smallest problem"."""
    table = _table()
    assert table["N"].max() == 16384 and table["C"].max() == 131072
    assert set(table["scale_log2"]) == {12, 14, 16}
    assert table[table["N"] == table["N"].min()]["seed"].nunique() >= 3
    for column in ("git_revision", "cpu_model", "torch_version", "date"):
        assert table[column].notna().all() and (table[column] != "").all(), column


def test_after_the_headroom_every_arm_with_fp32_accumulation_never_loses_more_entries_than_the_reference():
    """"every lce arm that accumulates in fp32 (the defaults, and every policy with acc_dtype=float32) loses no
    more gradient entries than the reference at any shape, seed or scale"."""
    fp32 = _after()[~_after()["arm"].str.contains("acc=fp16")]
    assert len(fp32) == 8
    for gradient in ("weight", "input", "bias"):
        assert fp32[f"{gradient}_never_more"].all(), fp32[["arm", f"{gradient}_extra_lost_fraction"]]


def test_those_that_sum_in_fp32_also_have_fewer_floors_than_the_reference():
    """"Those that sum the weight gradient in fp32 ... sit at 0.2–0.5 times the reference's floors (they round
    once; the reference rounds its fp16 logits and their gradient first)"."""
    fp32_sum = _after()[~_after()["arm"].map(_sums_in_fp16)]
    assert len(fp32_sum) == 7
    for gradient in ("weight", "input"):
        assert fp32_sum[f"{gradient}_floor_ratio_high"].max() <= 0.55
        assert fp32_sum[f"{gradient}_floor_ratio_low"].min() >= 0.2


def test_arms_computing_in_fp16_lose_at_most_two_hundredths_of_a_percent_more():
    """"An explicit policy without acc_dtype computes in fp16 and loses at most 0.02% of the eligible entries more
    than the reference"."""
    fp16 = _after()[_after()["arm"].str.contains("acc=fp16")]
    assert len(fp16) == 2
    for gradient in ("weight", "input"):
        assert (fp16[f"{gradient}_extra_lost_fraction"] <= 2e-4).all()
    assert not fp16["weight_never_more"].all()  # the sentence says "more": it does lose a few more somewhere


def test_a_fp16_weight_sum_costs_floors_the_headroom_does_not_change():
    """"compact's fp16 running sum on the CUDA layouts and fp16 arithmetic cost 2–16 times
    the reference's floors on the weight gradient, before the headroom as after it: the error of their own
    arithmetic, which a loss scale cannot give back"."""
    verdicts = _verdicts()
    fp16_sum = verdicts[verdicts["arm"].map(_sums_in_fp16)]
    after = fp16_sum[fp16_sum["headroom"] == "after"].set_index("arm")
    before = fp16_sum[fp16_sum["headroom"] == "before"].set_index("arm")
    assert after["weight_floor_ratio_low"].min() >= 2 and after["weight_floor_ratio_high"].max() <= 16
    shared = after.index.intersection(before.index)
    assert len(shared) >= 3
    assert (after.loc[shared, "weight_floor_ratio_high"] <= 1.01 * before.loc[shared, "weight_floor_ratio_high"]).all()
    assert (after.loc[shared, "weight_floor_ratio_high"] >= 0.9 * before.loc[shared, "weight_floor_ratio_high"]).all()


def test_before_the_headroom_every_arm_lost_more_than_half_of_the_eligible_weight_entries_somewhere():
    """"Before it, every arm lost more weight-gradient entries than the reference at every problem and scale, up
    to 65–80% of the entries the scale should have kept"."""
    rows = nb10.against_reference(_table())
    before = rows[(rows["op"] == "lce") & (rows["headroom"] == "before") & (rows["gradient"] == "weight")]
    assert (before["lost"] > 10 * before["reference_lost"]).all()
    worst = before.groupby("impl")["extra_lost_fraction"].max()
    assert worst.min() >= 0.6 and worst.max() <= 0.85


def test_torch_213s_op_overflows_at_2_16_and_only_there():
    """"torch 2.13's own op (an fp16 loss) returns inf gradients at 2^16"."""
    torch_rows = _table()[_table()["impl"] == nb10.TORCH_DEFAULT]
    finite = torch_rows.groupby("scale_log2")["finite"].apply(lambda v: v.astype(bool).all())
    assert not torch_rows[torch_rows["scale_log2"] == 16]["finite"].astype(bool).any()
    assert finite.loc[12] and finite.loc[14]


# ---- the transformers run (hf_fp16.csv) ----------------------------------------------------------------------

@functools.cache
def _hf_final() -> pd.DataFrame:
    from analysis.core.results_io import read_table
    from analysis.report import hf_fp16
    from analysis.studies.hf_fp16 import HF_FP16_FILE

    return hf_fp16.final_gaps(read_table(RESULTS_DIR / HF_FP16_FILE)).set_index("arm")


def test_the_transformers_run_keeps_a_2_16_scale_without_a_skipped_step():
    """"Every run is finite, the scaler skipped 0 steps and the scale stayed at 2^16"."""
    final = _hf_final()
    assert final["finite"].all() and (final["skipped_high"] == 0).all()
    assert (final["scale_low"] == 2.0 ** 16).all() and (final["seeds"] >= 3).all()


def test_the_patched_model_trains_as_the_unpatched_one():
    """"the patched model's held-out gap to fp32 is {...} against {...} for the unpatched model; every interval
    includes zero" (README: "trains as the unpatched model does")."""
    final = _hf_final()
    assert ((final["low"] <= 0) & (final["high"] >= 0)).all()
    for arm in ("lce", "lce cuda-layouts"):
        assert abs(final.loc[arm, "gap"] - final.loc["unpatched", "gap"]) <= 5e-3

