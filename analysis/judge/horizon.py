"""How long a gradient bias takes to show in training: the head-only study's gaps, intervals and horizons, and the
error/noise rule's bias limit derived from them (:mod:`analysis.judge.rule` states the limit; this module measures
nothing and reads ``head_training`` rows, :mod:`analysis.studies.head_training`).

A *gap* is an arm's held-out loss minus the fp32 arm's of the same seed (same start, same batches), in
nats; positive is worse. Its interval is Student's t at :data:`CONFIDENCE` over the seeds' paired gaps.
A gap *separates* when that interval excludes zero.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

__all__ = ["CONFIDENCE", "gaps", "interval_table", "final_gaps", "separation_steps", "bias_numbers", "arm_summary",
           "horizon_fit", "rule_verdicts"]

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
    """Mean gap, its interval and the seeds, per ``by`` group; ``separates`` when the interval excludes zero."""
    out = []
    for key, group in gap_rows.groupby(by, sort=False):
        mean, low, high, n = _interval(group["gap"])
        out.append({**dict(zip(by, key if isinstance(key, tuple) else (key,), strict=True)), "gap": mean,
                    "low": low, "high": high, "seeds": n, "separates": bool(low > 0 or high < 0)})
    return pd.DataFrame(out)


def final_gaps(table: pd.DataFrame) -> pd.DataFrame:
    """Each arm's held-out gap at the last step every seed of its optimizer reached, per bucket, with the fp32
    arm's own seed-to-seed spread there (``seed_spread``: max - min of its loss over the seeds, which differ in
    start and batch order) and ``exceeds_spread``: the gap separates and its size exceeds that spread."""
    gap_rows = gaps(table)
    last = gap_rows.groupby(["optimizer", "seed"])["step"].max().groupby("optimizer").min()
    gap_rows = gap_rows[gap_rows["step"] == gap_rows["optimizer"].map(last)]
    out = interval_table(gap_rows, ["optimizer", "arm", "bucket", "step"])
    fp32 = gap_rows.drop_duplicates(["optimizer", "bucket", "seed"]).groupby(["optimizer", "bucket"])["fp32"]
    spread = (fp32.max() - fp32.min()).rename("seed_spread")
    out = out.join(spread, on=["optimizer", "bucket"])
    return out.assign(exceeds_spread=out["separates"] & (out["gap"].abs() > out["seed_spread"]))


def separation_steps(table: pd.DataFrame, bucket: str = "rare") -> pd.DataFrame:
    """Per (optimizer, arm): the first evaluated step from which the ``bucket`` gap separates at every later
    evaluation (NaN if it never does), and the sign of the gap there."""
    curves = interval_table(gaps(table)[lambda t: t["bucket"] == bucket], ["optimizer", "arm", "step"])
    out = []
    for (optimizer, arm), group in curves.groupby(["optimizer", "arm"], sort=False):
        group = group.sort_values("step")
        separated = group["separates"].to_numpy()
        later = np.flip(np.cumprod(np.flip(separated)))  # true where this and every later step separate
        first = group["step"].to_numpy()[later.astype(bool)]
        step = float(first[0]) if len(first) else math.nan
        sign = float(np.sign(group.loc[group["step"] == step, "gap"].iloc[0])) if len(first) else math.nan
        out.append({"optimizer": optimizer, "arm": arm, "bucket": bucket, "separates_from": step, "sign": sign,
                    "last_step": int(group["step"].max())})
    return pd.DataFrame(out)


def bias_numbers(table: pd.DataFrame) -> pd.DataFrame:
    """Per (optimizer, arm): the bias/noise ratio along the run (median over seeds and checkpoints, and its range),
    the error/noise median, and how far the restated arithmetic's ratio is from lce's own (largest relative gap)."""
    rows = table[table["metric"].str.startswith(("bias_over_noise", "error_over_noise"))]
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
    and on the rare bucket with intervals, and from which step its rare gap separates."""
    final = final_gaps(table)
    bias = bias_numbers(table).set_index(["optimizer", "arm"])
    horizon = separation_steps(table).set_index(["optimizer", "arm"])
    arms = table.drop_duplicates(["optimizer", "arm"])[["optimizer", "arm", "rule", "policy", "num_chunks",
                                                        "dtype"]]
    out = []
    for row in arms.itertuples():
        if row.arm == "fp32":
            continue
        entry = {"optimizer": row.optimizer, "arm": row.arm, "rule": row.rule if isinstance(row.rule, str) else ""}
        for bucket in ("all", "rare"):
            got = final[(final["optimizer"] == row.optimizer) & (final["arm"] == row.arm) & (final["bucket"] == bucket)]
            if got.empty:
                continue
            got = got.iloc[0]
            entry.update({"step": int(got["step"]), "seeds": int(got["seeds"]), f"gap_{bucket}": got["gap"],
                          f"gap_{bucket}_low": got["low"], f"gap_{bucket}_high": got["high"],
                          f"separates_{bucket}": got["separates"]})
        key = (row.optimizer, row.arm)
        if key in bias.index:
            entry.update(bias.loc[key, ["bias_over_noise", "bias_low", "bias_high"]].to_dict())
        if key in horizon.index:
            entry["rare_separates_from"] = horizon.loc[key, "separates_from"]
        out.append(entry)
    return pd.DataFrame(out)


def horizon_fit(table: pd.DataFrame) -> dict[str, float]:
    """The relation between an arm's bias/noise ``r`` and the step from which its rare-bucket gap separates:
    a least-squares line ``log10(step) = a + b log10(r)`` over the separating arms (the ratio^-2 reading says
    b = -2), and the ratio at which the fitted line reaches the study's last step -- the largest bias that
    stays hidden for that many steps -- with the range over leave-one-arm-out fits. Also the largest ratio
    among arms that never separate and the smallest among those that do."""
    summary = arm_summary(table)
    summary = summary[summary["bias_over_noise"].notna()]
    separating = summary[summary["rare_separates_from"].notna() & (summary["rare_separates_from"] > 0)]
    hidden = summary[summary["rare_separates_from"].isna()]
    steps = int(summary["step"].max()) if len(summary) else 0
    result = {"arms_separating": len(separating), "arms_hidden": len(hidden), "horizon": steps,
              "largest_hidden_ratio": float(hidden["bias_over_noise"].max()) if len(hidden) else math.nan,
              "smallest_separating_ratio": float(separating["bias_over_noise"].min()) if len(separating) else math.nan}
    if len(separating) < 3:
        return {**result, "slope": math.nan, "threshold": math.nan, "threshold_low": math.nan,
                "threshold_high": math.nan}
    x = np.log10(separating["bias_over_noise"].to_numpy())
    y = np.log10(separating["rare_separates_from"].to_numpy())

    def fit(xs, ys):
        slope, intercept = np.polyfit(xs, ys, 1)
        return slope, intercept, 10 ** ((math.log10(steps) - intercept) / slope)

    slope, _, threshold = fit(x, y)
    others = [fit(np.delete(x, i), np.delete(y, i))[2] for i in range(len(x))] if len(x) > 3 else [threshold]
    return {**result, "slope": float(slope), "threshold": float(threshold),
            "threshold_low": float(min(others)), "threshold_high": float(max(others))}


def rule_verdicts(table: pd.DataFrame) -> pd.DataFrame:
    """Per chunk-count rule the study stands for (lce auto, torch 2.13 auto, torch 2.14's rule), dtype and
    optimizer: the arm, its bias/noise, and the buckets whose final held-out gap separates from the fp32 head's
    (empty: none), with the largest separating gap. An "auto" pick passes when no bucket separates."""
    final = final_gaps(table)
    bias = bias_numbers(table).set_index(["optimizer", "arm"])["bias_over_noise"]
    arms = table[table["rule"].notna() & (table["rule"] != "")].drop_duplicates(["optimizer", "arm"])
    out = []
    for row in arms.itertuples():
        mine = final[(final["optimizer"] == row.optimizer) & (final["arm"] == row.arm)]
        separating = mine[mine["separates"]]
        worst = separating.loc[separating["gap"].abs().idxmax()] if len(separating) else None
        out.append({"rule": row.rule, "dtype": row.dtype, "optimizer": row.optimizer, "arm": row.arm,
                    "bias_over_noise": bias.get((row.optimizer, row.arm), math.nan),
                    "separating_buckets": ", ".join(separating["bucket"]),
                    "largest_gap": float(worst["gap"]) if worst is not None else math.nan,
                    "largest_gap_bucket": str(worst["bucket"]) if worst is not None else "",
                    "passes": separating.empty, "seeds": int(mine["seeds"].min()) if len(mine) else 0})
    return pd.DataFrame(out)
