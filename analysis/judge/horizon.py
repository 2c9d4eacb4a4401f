"""How long a gradient bias takes to show in training: the head-only study's gaps, intervals and horizons, and the
error/noise rule's bias limit derived from them (:mod:`analysis.judge.rule` states the limit; this module measures
nothing and reads ``head_training`` rows, :mod:`analysis.studies.head_training`).

A *gap* is an arm's held-out loss minus the fp32 arm's of the same seed (same start, same batches), in
nats; positive is worse. Its interval is Student's t at :data:`CONFIDENCE` over the seeds' paired gaps.
A gap is *systematic* when that interval excludes zero: the paired design detects sub-millinat effects,
which every bf16 arm shows somewhere, accurate included (rounding to bf16 at all moves the trajectory).
A gap *counts* -- the criterion of the verdicts -- when it is systematic and larger than the fp32 arm's own
spread over the seeds at that step (max - min; the seeds differ in start and batch order): a difference a
user comparing two runs could see.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

__all__ = ["CONFIDENCE", "gaps", "interval_table", "final_gaps", "count_steps", "bias_numbers", "arm_summary",
           "bias_bracket", "rule_verdicts"]

CONFIDENCE = 0.95
T_QUANTILES = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}
"""Student's t two-sided 95% quantiles by degrees of freedom (1.96 beyond 9: the normal's, slightly narrow)."""
LOSS = "heldout_loss"


def gaps(table: pd.DataFrame, metric: str = LOSS) -> pd.DataFrame:
    """Per (optimizer, arm, seed, step, bucket): ``metric`` of the arm minus the fp32 arm's (the same group)."""
    rows = table[table["metric"] == metric]
    keys = ["optimizer", "seed", "step", "bucket"]
    reference = rows[rows["arm"] == "fp32"].set_index(keys)["value"].rename("fp32")
    joined = rows[rows["arm"] != "fp32"].join(reference, on=keys)
    return joined.assign(gap=joined["value"] - joined["fp32"])


def _interval(values: pd.Series) -> tuple[float, float, float, int]:
    values = values.dropna()
    n = len(values)
    mean = float(values.mean()) if n else math.nan
    if n < 2:
        return mean, math.nan, math.nan, n
    half = T_QUANTILES.get(n - 1, 1.96) * float(values.std(ddof=1)) / math.sqrt(n)
    return mean, mean - half, mean + half, n


def interval_table(gap_rows: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """Per ``by`` group (which must include optimizer, step and bucket): the mean gap, its interval, the seeds,
    ``systematic`` (the interval excludes zero), the fp32 arm's ``seed_spread`` there, and ``counts``."""
    out = []
    for key, group in gap_rows.groupby(by, sort=False):
        mean, low, high, n = _interval(group["gap"])
        fp32 = group.drop_duplicates("seed")["fp32"]
        out.append({**dict(zip(by, key if isinstance(key, tuple) else (key,), strict=True)), "gap": mean,
                    "low": low, "high": high, "seeds": n, "systematic": bool(low > 0 or high < 0),
                    "seed_spread": float(fp32.max() - fp32.min())})
    table = pd.DataFrame(out)
    if table.empty:
        return table
    return table.assign(counts=table["systematic"] & (table["gap"].abs() > table["seed_spread"]))


def final_gaps(table: pd.DataFrame) -> pd.DataFrame:
    """Each arm's held-out gap at the last step every seed of its optimizer reached, per bucket
    (:func:`interval_table`'s columns)."""
    gap_rows = gaps(table)
    last = gap_rows.groupby(["optimizer", "seed"])["step"].max().groupby("optimizer").min()
    gap_rows = gap_rows[gap_rows["step"] == gap_rows["optimizer"].map(last)]
    return interval_table(gap_rows, ["optimizer", "arm", "bucket", "step"])


def count_steps(table: pd.DataFrame, bucket: str = "rare") -> pd.DataFrame:
    """Per (optimizer, arm): the first evaluated step from which the ``bucket`` gap counts at every later
    evaluation (NaN if it never does), and the first from which it is systematic."""
    curves = interval_table(gaps(table)[lambda t: t["bucket"] == bucket], ["optimizer", "arm", "step", "bucket"])
    out = []
    for (optimizer, arm), group in curves.groupby(["optimizer", "arm"], sort=False):
        group = group.sort_values("step")
        entry = {"optimizer": optimizer, "arm": arm, "bucket": bucket, "last_step": int(group["step"].max())}
        for column in ("counts", "systematic"):
            held = np.flip(np.cumprod(np.flip(group[column].to_numpy()))).astype(bool)  # this and every later one
            steps = group["step"].to_numpy()[held]
            entry[f"{column}_from"] = float(steps[0]) if len(steps) else math.nan
        out.append(entry)
    return pd.DataFrame(out)


def bias_numbers(table: pd.DataFrame, bucket: str = "all") -> pd.DataFrame:
    """Per (optimizer, arm): the bias/noise ratio along the run over ``bucket``'s rows of the gradient (median
    over seeds and checkpoints, and its range), the error/noise median, and how far the restated arithmetic's
    ratio is from lce's own (largest relative gap)."""
    rows = table[table["metric"].str.startswith(("bias_over_noise", "error_over_noise")) & (table["bucket"] == bucket)]
    wide = rows.pivot_table(index=["optimizer", "arm", "seed", "step"], columns="metric", values="value")
    out = []
    for (optimizer, arm), group in wide.groupby(level=["optimizer", "arm"], sort=False):
        bias = group["bias_over_noise"]
        entry = {"optimizer": optimizer, "arm": arm, "bias_over_noise": float(bias.median()),
                 "bias_low": float(bias.min()), "bias_high": float(bias.max()),
                 "error_over_noise": float(group["error_over_noise"].median()), "checkpoints": len(group)}
        if "bias_over_noise_lce" in group and group["bias_over_noise_lce"].notna().any():
            lce_bias = group["bias_over_noise_lce"]
            entry["restated_vs_lce"] = float(((bias - lce_bias).abs() / lce_bias).max())
        out.append(entry)
    return pd.DataFrame(out)


def arm_summary(table: pd.DataFrame) -> pd.DataFrame:
    """One row per (optimizer, arm): what it stands for, steps and seeds, its bias/noise, its final gap overall
    and on the rare bucket with intervals, the buckets where the gap is systematic and where it counts."""
    final = final_gaps(table)
    bias = bias_numbers(table).set_index(["optimizer", "arm"])
    arms = table.drop_duplicates(["optimizer", "arm"])[["optimizer", "arm", "rule", "dtype"]]
    out = []
    for row in arms.itertuples():
        if row.arm == "fp32":
            continue
        mine = final[(final["optimizer"] == row.optimizer) & (final["arm"] == row.arm)].set_index("bucket")
        if mine.empty:
            continue
        entry = {"optimizer": row.optimizer, "arm": row.arm, "dtype": row.dtype,
                 "rule": row.rule if isinstance(row.rule, str) else "", "step": int(mine["step"].max()),
                 "seeds": int(mine["seeds"].min())}
        for bucket in ("all", "rare"):
            entry.update({f"gap_{bucket}": mine.at[bucket, "gap"], f"gap_{bucket}_low": mine.at[bucket, "low"],
                          f"gap_{bucket}_high": mine.at[bucket, "high"]})
        entry["systematic_in"] = ", ".join(mine.index[mine["systematic"]])
        entry["counts_in"] = ", ".join(mine.index[mine["counts"]])
        key = (row.optimizer, row.arm)
        if key in bias.index:
            entry.update(bias.loc[key, ["bias_over_noise", "bias_low", "bias_high"]].to_dict())
        out.append(entry)
    return pd.DataFrame(out)


def bias_bracket(table: pd.DataFrame, optimizer: str = "adamw", dtype: str = "bfloat16") -> dict[str, float]:
    """Where the bias limit lies on this evidence, for ``dtype``'s arms of ``optimizer``: the largest bias/noise
    of an arm whose gap counts in no bucket and the smallest of one whose gap counts somewhere; and the same with
    "systematic beyond accurate's" (a gap systematic in a bucket where the accurate arm's is not) in place of
    "counts"."""
    summary = arm_summary(table)
    summary = summary[(summary["optimizer"] == optimizer) & (summary["dtype"] == dtype)]
    counted = summary["counts_in"] != ""
    accurate = summary[summary["arm"].str.contains("accurate")]
    floor = set(accurate["systematic_in"].iloc[0].split(", ")) if len(accurate) else set()
    beyond = summary["systematic_in"].map(lambda text: bool(set(filter(None, text.split(", "))) - floor))
    ratio = summary["bias_over_noise"]
    return {"hidden_max": float(ratio[~counted].max()), "shown_min": float(ratio[counted].min()),
            "floor_max": float(ratio[~beyond].max()), "beyond_min": float(ratio[beyond].min())}


def rule_verdicts(table: pd.DataFrame) -> pd.DataFrame:
    """Per chunk-count rule the study stands for (lce auto, torch 2.13 auto, torch 2.14's rule, the harsh count),
    dtype and optimizer: the arm, its bias/noise, the buckets where its final gap counts (empty: none) with the
    largest such gap, and the buckets where it is only systematic. A pick passes when no bucket counts."""
    summary = arm_summary(table)
    final = final_gaps(table)
    out = []
    for row in summary[summary["rule"] != ""].itertuples():
        mine = final[(final["optimizer"] == row.optimizer) & (final["arm"] == row.arm)]
        counted = mine[mine["counts"]]
        worst = counted.loc[counted["gap"].abs().idxmax()] if len(counted) else None
        out.append({"rule": row.rule, "dtype": row.dtype, "optimizer": row.optimizer, "arm": row.arm,
                    "bias_over_noise": row.bias_over_noise, "counts_in": row.counts_in,
                    "largest_gap": float(worst["gap"]) if worst is not None else math.nan,
                    "largest_gap_bucket": str(worst["bucket"]) if worst is not None else "",
                    "systematic_in": row.systematic_in, "passes": counted.empty, "seeds": row.seeds})
    return pd.DataFrame(out)
