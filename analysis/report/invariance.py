"""What lce's batch-invariance contract costs, measured (:mod:`analysis.studies.invariance_cost`): the table of
docs/using-lce.md's generated "invariance-cost" passage and the ratios its claims test reads."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from analysis.core.results_io import INVARIANCE_COST, latest, load_kind

__all__ = ["cost_ratios", "readme_invariance_cost"]

_KEYS = ["cpu_model", "cpu_gemms", "N", "D", "C", "op", "dtype", "arm"]


def cost_ratios(table: pd.DataFrame) -> pd.DataFrame:
    """One row per (CPU, problem, op, dtype) of the latest runs: both arms' median times, rows per chunk and loop
    rows, and ``ratio`` (batch-invariant over rows that follow N) with ``low``/``high``, the ratios of the arms'
    fastest and slowest rounds (the spread of the interleaved rounds)."""
    table = latest(table, _KEYS)
    rows = []
    for key, group in table.groupby(_KEYS[:-1], sort=False):
        arms = group.set_index("arm")
        if {"follows N", "batch-invariant"} - set(arms.index):
            continue
        follows, fixed = arms.loc["follows N"], arms.loc["batch-invariant"]
        samples = {arm: [float(v) for v in str(arms.loc[arm, "time_samples"]).split()] for arm in arms.index}
        rows.append(dict(zip(_KEYS[:-1], key, strict=True), follows_s=follows.time_s, invariant_s=fixed.time_s,
                         follows_rows=int(follows.batch_chunk_size), invariant_rows=int(fixed.batch_chunk_size),
                         loop_rows=int(fixed.loop_rows), ratio=fixed.time_s / follows.time_s,
                         low=min(samples["batch-invariant"]) / max(samples["follows N"]),
                         high=max(samples["batch-invariant"]) / min(samples["follows N"]),
                         same_plan=int(follows.batch_chunk_size) == int(fixed.batch_chunk_size)
                         and int(follows.loop_rows) == int(fixed.loop_rows),
                         rounds=int(fixed.rounds), threads=fixed.num_threads, date=str(fixed.date)[:10],
                         git_revision=fixed.git_revision))
    return pd.DataFrame(rows)


def readme_invariance_cost(results: Path) -> str:
    """docs/using-lce.md's table: per CPU, problem, op and dtype, each arm's time and rows, and the ratio."""
    _, table = load_kind(results, INVARIANCE_COST.name)
    if table.empty:
        return "Not measured yet (`python -m analysis invariance-cost`).\n"
    ratios = cost_ratios(table)
    parts = []
    for (model, gemms), group in ratios.groupby(["cpu_model", "cpu_gemms"], sort=False):
        first = group.iloc[0]
        lines = [f"{model} ({gemms}), {first.threads} threads, {first.date}, revision {first.git_revision}; median of "
                 f"{first.rounds} interleaved rounds (range: fastest and slowest rounds' ratio):", "",
                 "| N x D x C | op | dtype | rows follow N | batch-invariant | ratio |", "|---|---|---|---|---|---|"]
        for r in group.itertuples():
            same = " (the same plan)" if r.same_plan else ""
            lines.append(f"| {r.N} x {r.D} x {r.C} | {r.op} | {r.dtype} | {r.follows_s:.2f} s, {r.follows_rows} rows | "
                         f"{r.invariant_s:.2f} s, {r.invariant_rows} rows, {r.loop_rows} loop rows | "
                         f"{r.ratio:.3f} ({r.low:.2f}-{r.high:.2f}){same} |")
        parts.append("\n".join(lines) + "\n")
    return "\n".join(parts)
