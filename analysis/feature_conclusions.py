"""The conclusions of notebook 08 (lce's features beyond torch's op), written from the ``features`` and
``feature_cost`` results.

Each function returns Markdown that starts with :data:`analysis.conclusions.MARKER` and ends with the inputs and
limits it rests on, like :mod:`analysis.conclusions`.
"""

from __future__ import annotations

import math

import pandas as pd

from .conclusions import _conclusion, _join, _missing, _range, _shapes

__all__ = ["PLAIN", "error_ratios", "errors", "softmax_statistics", "cost"]

PLAIN = "plain"
"""The feature set without any feature: what every other set is compared with."""
NO_DATA = "No features study yet (`python -m analysis features`)."


def _seed_medians(table: pd.DataFrame, column: str) -> pd.Series:
    return table.groupby(["impl", "dtype", "family", "features"])[column].median()


def error_ratios(table: pd.DataFrame, output: str) -> pd.Series:
    """Per (lce contender, dtype, family, feature set): the seed-median floors of ``output`` over the plain op's
    on the same inputs."""
    lce_rows = table[table["op"] == "lce"]
    medians = _seed_medians(lce_rows, f"{output}_floors")
    plain = medians.xs(PLAIN, level="features")
    others = medians[medians.index.get_level_values("features") != PLAIN]
    return others / plain.reindex(others.index.droplevel("features")).to_numpy()


def errors(table: pd.DataFrame) -> str:
    """08: each feature's error in floors next to the plain op's, per dtype, and the returned log-sum-exp's."""
    if table.empty:
        return _missing(NO_DATA)
    worst = {output: error_ratios(table, output) for output in ("grad_input", "grad_weight")}
    output, ratios = max(worst.items(), key=lambda item: item[1].max())
    impl, dtype, family, name = ratios.idxmax()
    lce_rows = table[table["op"] == "lce"]
    lse = lce_rows["lse_max_error"]
    finding = (f"Soft-capping and z-loss keep lce's errors at the plain op's level: every lce contender's gradient "
               f"error with a feature is {_range(pd.concat(worst.values()))}× the same contender's with the plain op "
               f"on the same inputs (seed medians; the largest, {ratios.max():.2f}×, is {output} of {impl} with "
               f"{name!r} on {family} in {dtype}, where the cap reshapes the softmax itself, see below). The "
               f"log-sum-exp lce returns is within {lse.max():.2g} nats of fp64 for every contender and input.")
    bullets = []
    for name_, rows in lce_rows.groupby("features", sort=False):
        parts = []
        for dtype_, group in rows.groupby("dtype", sort=False):
            medians = {out: _seed_medians(group, f"{out}_floors") for out in ("grad_input", "grad_weight")}
            parts.append(f"{dtype_}: grad_input {_range(medians['grad_input'])}, grad_weight "
                         f"{_range(medians['grad_weight'])} floors")
        unfused = table[(table["impl"] == "unfused") & (table["features"] == name_)]
        unfused_weight = _seed_medians(unfused, "grad_weight_floors")
        bullets.append(f"{name_}: " + "; ".join(parts) + f" (lce, every policy and layout; the unfused formula in the "
                       f"input dtype: grad_weight {_range(unfused_weight)})")
    return _conclusion(finding, bullets,
                       inputs=f"families {_join(sorted(table['family'].unique()))} at {_shapes(table)}, bf16 and "
                              f"fp16, {table['seed'].nunique()} seeds; lce per policy on the CPU and the CUDA layouts "
                              "(emulated on CPU tensors) with fp32 acc_dtype, and \"auto\"; errors against the fp64 "
                              "result of the same formula (`python -m analysis features`).",
                       limits="the CUDA layouts are emulated (real cuBLAS sums in another order); a z-loss of 1e-4 "
                              "moves the gradient little, so its row says that the term is computed without new "
                              "rounding, not that a large z-loss would be as benign.")


def softmax_statistics(table: pd.DataFrame) -> str:
    """08: what a cap does to the softmax, from the fp64 statistics of the inputs."""
    if table.empty:
        return _missing(NO_DATA)
    problems = table.drop_duplicates(["family", "dtype", "seed", "features"])
    problems = problems[problems["z_loss"].fillna(0) == 0]
    stats = problems.groupby(["features", "family"])[["stat_mean_max_logit", "stat_median_target_prob",
                                                      "stat_mean_lse"]].median()
    plain = stats.xs(PLAIN, level="features")
    bullets = []
    for name in dict.fromkeys(problems["features"]):
        if name == PLAIN:
            continue
        capped = stats.xs(name, level="features")
        drop = 1 - capped["stat_mean_max_logit"] / plain["stat_mean_max_logit"]
        bullets.append(f"{name}: the mean largest logit falls by {_range(drop, '.0%')} and the median target "
                       f"probability goes from {_range(plain['stat_median_target_prob'], '.2g')} to "
                       f"{_range(capped['stat_median_target_prob'], '.2g')} (per family)")
    finding = (f"A cap compresses the logits long before they reach it (tanh(1/3) is already "
               f"{1 - 3 * math.tanh(1 / 3):.1%} below 1/3), so even a cap of 30 lowers every family's largest logits "
               "and raises the entropy a little; a cap of 5 "
               "flattens the softmax. The statistics lce's error depends on (how peaked each row is, how far the "
               "target leads) therefore change with the cap, and the errors above are measured against the fp64 "
               "result of the capped formula itself.")
    return _conclusion(finding, bullets,
                       inputs=f"fp64 logits of the rounded inputs, families "
                              f"{_join(sorted(problems['family'].unique()))}, {problems['seed'].nunique()} seeds "
                              "(medians).",
                       limits="the statistics of three families; a model trained with a cap learns logits shaped by "
                              "it, which a cap applied to these inputs after the fact does not reproduce.")


def cost(table: pd.DataFrame) -> str:
    """08: the time and memory each feature set costs lce's default options at the bench shape."""
    if table.empty:
        return _missing("No feature cost measurement yet (`python -m analysis features --cost-only`).")
    row = table.iloc[0]
    others = table[table["features"] != PLAIN]
    model = table["measured_peak_bytes"] / table["predicted_peak_bytes"]
    plain = table[table["features"] == PLAIN].iloc[0]
    extra = (others["measured_peak_bytes"] - plain["measured_peak_bytes"]) / 2**20
    finding = (f"At {row.N}×{row.D}×{row.C} in {row['dtype']} (lce's default options: {row.policy}, "
               f"{row.num_chunks} chunks) the features took {_range(others['time_ratio'])}× the plain op's time in "
               f"the same run, and {_range(extra, '.1f')} MiB more peak memory (plain: "
               f"{plain.measured_peak_bytes / 2**20:.0f} MiB); the measured peaks are {_range(model, '.3f')}× "
               f"lce's model.")
    bullets = [f"{r.features}: {r.time_median_s:.2f} s ({r.time_ratio:.2f}×, spread {r.time_spread_s:.2f} s over "
               f"{r.repeats} rounds), peak {r.measured_peak_bytes / 2**20:.1f} MiB measured, "
               f"{r.predicted_peak_bytes / 2**20:.1f} MiB modeled" for r in table.itertuples()]
    return _conclusion(finding, bullets,
                       inputs=f"random inputs, no bias, forward + backward, {row.repeats} alternating rounds after a "
                              f"warm-up in one process, CPU {row.cpu_model}, {int(row.num_threads)} threads "
                              "(`python -m analysis features --cost-only`).",
                       limits="one CPU and one shape on a shared machine; the tanh and the extra passes over the "
                              "logits are element-wise work whose share is larger where the GEMMs are faster (GPU).")
