"""Claims of notebook 08 and of the README's feature and vocab-parallel passages, each a named assertion over the
committed results. A failure names the sentence to rewrite."""

from __future__ import annotations

import functools

import pandas as pd

from analysis.core.results_io import FEATURE_COST, FEATURES, VOCAB_PARALLEL, load_kind
from analysis.paths import RESULTS_DIR
from analysis.report import nb08_beyond_torch as nb08
from analysis.studies.fp64_checks import PARITY_TOLERANCE


@functools.cache
def _kind(name: str) -> pd.DataFrame:
    return load_kind(RESULTS_DIR, name)[1]


def test_features_keep_every_lce_contender_within_a_quarter_of_its_plain_op_error():
    """"with a feature, every lce contender's gradient error is {low}-{high}x its error with the plain op on the same
    inputs, within a quarter of it" (also the README's sentence above the features block)."""
    assert nb08.error_ratios(_kind(FEATURES.name)).between(0.75, 1.25).all()


def test_the_largest_ratio_to_the_plain_op_comes_with_a_cap():
    """"The largest ratio ... is {output} of {impl} with {name!r}: a cap changes the softmax itself"."""
    assert "softcap" in nb08.error_ratios(_kind(FEATURES.name)).idxmax()[-1]


def test_accurate_stays_at_the_floor_where_the_unfused_formula_does_not():
    """"lce's accurate policy stays at the rounding floor with every feature, where the unfused formula in the input
    dtype is {low}-{high} floors on the weight gradient"."""
    for output in ("grad_input", "grad_weight"):
        medians = nb08.seed_medians(_kind(FEATURES.name), f"{output}_floors")
        impls = medians.index.get_level_values("impl")
        accurate = medians[impls.str.startswith("lce accurate")].groupby(level=["dtype", "family", "features"]).max()
        unfused = medians[impls == "unfused"].droplevel("impl").reindex(accurate.index)
        assert accurate.max() < 1.01 and (unfused > accurate).all()


def test_every_cap_lowers_every_familys_largest_logits_the_stronger_cap_more():
    """"every cap lowers every family's largest logits ... the stronger cap lowering it more on each family"."""
    softmax = nb08.softmax_numbers(_kind(FEATURES.name)).dropna()
    drop = softmax.pivot(index="family", columns="features", values="max_logit_drop")
    assert (drop > 0).all().all() and (drop["softcap 5"] > drop["softcap 30"]).all()


def test_features_are_slower_by_less_than_the_spread_of_their_rounds():
    """"each is slower, but by less than the spread of its own rounds, so the size of the cost is not resolved"."""
    costs = nb08.cost_numbers(_kind(FEATURE_COST.name))
    plain = costs.loc[costs["features"] == nb08.PLAIN, "time_median_s"].iloc[0]
    others = costs[costs["features"] != nb08.PLAIN]
    assert (others["time_ratio"] > 1).all() and (others["time_median_s"] - plain < others["time_spread_s"]).all()


def test_features_add_no_measurable_peak_and_match_the_memory_model():
    """"They added no measurable peak memory ..., and every measured peak is {low}-{high}x lce's model"."""
    costs = nb08.cost_numbers(_kind(FEATURE_COST.name))
    assert (costs["extra_mib"].abs() < 0.5).all() and ((costs["over_model"] - 1).abs() < 0.01).all()


def test_vocab_parallel_fp64_equals_one_process_to_rounding():
    """README: "In fp64 the sharded loss and gradients equal one process's to rounding"."""
    assert (nb08.vocab_parallel_numbers(_kind(VOCAB_PARALLEL.name))[0] < PARITY_TOLERANCE).all()


def test_vocab_parallel_floors_do_not_depend_on_the_ranks_and_the_peak_falls():
    """README: "the floors do not change with the rank count, and the largest rank's peak falls as ranks are
    added"."""
    medians = nb08.vocab_parallel_numbers(_kind(VOCAB_PARALLEL.name))[1]
    for _, group in medians.sort_values("ranks").groupby(["dtype", "policy"]):
        floors = group[["grad_input_floors", "grad_weight_floors"]]
        assert (floors.max() / floors.min() < 1.01).all()
        assert group["peak_mib"].is_monotonic_decreasing and group["peak_mib"].is_unique
