"""Pareto fronts on (cost, error) and a verdict for every "auto" pick.

Error, for a front, is :data:`ERROR`: the worst of the gradient errors of a run,
each in units of its rounding floor (1 = as good as rounding the exact answer).
Costs are the measured peak extra memory (:data:`MEMORY`) and the median time
(:data:`TIME`); for ``cuda-emulated`` runs the memory is lce's model (their
measured memory is the CPU stand-in's, not the GPU's).

A run is on the front of its group (same device, dtype and shape) when no other
run of the group is at most as costly *and* at most as wrong, and strictly
better in one of the two.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from lce.options import dtype_name
from lce.policies import AUTO_FALLBACK, AUTO_TABLE, auto_pick

__all__ = ["ERROR", "MEMORY", "TIME", "GROUP", "load_table", "prepare", "front_mask", "auto_entries", "verdicts",
           "verdict_summary", "recommend", "same_numbers", "recommend_choices", "choices_summary", "TIE_RULE", "label",
           "verdict_lines"]

ERROR = "worst_grad_in_floors"
MEMORY = "peak_mib"
TIME = "time_ms"
GROUP = ["family", "device", "dtype", "N", "D", "C", "seed"]
_GRADS = ("grad_input", "grad_weight", "grad_bias")


def load_table(folder: Path | None = None) -> tuple[list[Path], pd.DataFrame]:
    """Every sweep results file in ``folder`` (default: the committed results), merged and :func:`prepare`-d."""
    from .paths import RESULTS_DIR
    from .results_io import SWEEP, load_results, paths_of_kind

    paths = paths_of_kind(folder or RESULTS_DIR, SWEEP.name)
    return paths, prepare(load_results(paths))


ERROR_COLUMNS = tuple(f"{name}_rel_fro" for name in ("loss", *_GRADS))
"""The columns that identify a computation's numbers (equal to the last bit: the same numbers)."""


def prepare(results: pd.DataFrame) -> pd.DataFrame:
    """The ``ok`` rows with the derived columns :data:`ERROR`, :data:`MEMORY`, :data:`TIME` and ``label``.

    Memory and time are measured on the timed seeds only (they do not depend
    on the values): every other seed of the same configuration gets them from
    the timed one. ``cuda-emulated`` runs have lce's modeled memory and no time.
    """
    table = results[results["status"] == "ok"].copy()
    if "family" not in table:
        table["family"] = "random"
    for column in ("policy", "chunking", "acc_dtype"):
        table[column] = table[column].fillna("").astype(str)
    columns = [f"{g}_fro_in_floors" for g in _GRADS if f"{g}_fro_in_floors" in table]
    table[ERROR] = table[columns].max(axis=1, skipna=True)
    memory = table["peak_bytes_measured"].astype(float)
    emulated = table["device"] == "cuda-emulated"
    memory[emulated] = table.loc[emulated, "peak_bytes_modeled"].astype(float)
    table[MEMORY] = memory / 2**20
    table[TIME] = table["time_median_s"].astype(float) * 1e3
    table.loc[emulated, TIME] = math.nan
    config = [c for c in ("op", "family", "device", "dtype", "N", "D", "C", "policy", "chunking", "acc_dtype",
                          "bias") if c in table]
    for cost in (MEMORY, TIME):
        table[cost] = table[cost].fillna(table.groupby(config, dropna=False)[cost].transform("first"))
    table["label"] = [label(row) for row in table.itertuples()]
    return table.reset_index(drop=True)


def label(row) -> str:
    """Short name of a run's implementation: ``lce compact ar:2 acc=fp32``."""
    if not getattr(row, "policy", ""):
        return str(row.op)
    chunking = str(row.chunking).replace("aspect_ratio", "ar")
    acc = "" if row.acc_dtype == "default" else f" acc={str(row.acc_dtype).replace('float', 'fp')}"
    return f"{row.op} {row.policy} {chunking}{acc}"


def front_mask(costs: np.ndarray | pd.Series, errors: np.ndarray | pd.Series) -> np.ndarray:
    """Boolean mask of the non-dominated points (minimizing both); NaN points are never on it."""
    cost = np.asarray(costs, dtype=float)
    error = np.asarray(errors, dtype=float)
    valid = np.isfinite(cost) & np.isfinite(error)
    mask = np.zeros(len(cost), dtype=bool)
    for i in np.flatnonzero(valid):
        no_worse = valid & (cost <= cost[i]) & (error <= error[i])
        strictly_better = (cost < cost[i]) | (error < error[i])
        mask[i] = not np.any(no_worse & strictly_better)
    return mask


def with_fronts(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` plus ``on_memory_front`` and ``on_time_front``, computed per :data:`GROUP`."""
    table = table.copy()
    table["on_memory_front"] = False
    table["on_time_front"] = False
    for _, group in table.groupby(GROUP, sort=False):
        table.loc[group.index, "on_memory_front"] = front_mask(group[MEMORY], group[ERROR])
        table.loc[group.index, "on_time_front"] = front_mask(group[TIME], group[ERROR])
    return table


def auto_entries() -> list[tuple[str, str]]:
    """(device kind, dtype name) of every "auto" table entry, plus the fp32 ones the table lacks."""
    keys = [(kind, dtype_name(dtype)) for kind, dtype in AUTO_TABLE]
    for kind in ("cpu", "cuda"):
        if (kind, "float32") not in keys:
            keys.append((kind, "float32"))
    return keys


def _devices_for(kind: str) -> tuple[str, ...]:
    return ("cpu",) if kind == "cpu" else ("cuda", "cuda-emulated")


@dataclasses.dataclass(frozen=True)
class Verdict:
    """How one auto pick fares on one problem's (memory, error) and (time, error) fronts."""

    device: str
    dtype: str
    shape: str
    pick: str
    listed: bool
    error: float
    peak_mib: float
    time_ms: float
    on_memory_front: bool
    on_time_front: bool
    memory_dominator: str
    memory_dominator_error: float
    memory_dominator_peak_mib: float
    time_dominator: str
    time_dominator_error: float
    time_dominator_ms: float


VERDICT_TOLERANCE = 0.05
"""A rival must beat the auto pick by more than this fraction on one axis (and be no worse on the
other) to knock it off a front in a verdict: 1% less time on a shared CPU is noise, not a finding."""


def _best_dominator(group: pd.DataFrame, me: pd.Series, cost: str,
                    tolerance: float = VERDICT_TOLERANCE) -> pd.Series | None:
    """The run that beats ``me`` on both axes by the largest margin (product of ratios), if any.

    "Beats" means no worse on either axis and better by more than ``tolerance`` on at least one.
    """
    no_worse = (group[cost] <= me[cost]) & (group[ERROR] <= me[ERROR])
    strictly = (group[cost] < me[cost] * (1 - tolerance)) | (group[ERROR] < me[ERROR] * (1 - tolerance))
    rivals = group[no_worse & strictly & ~_same_computation(group, me)]
    if rivals.empty:
        return None
    margin = np.log(rivals[cost] / me[cost]) + np.log(rivals[ERROR] / me[ERROR])
    return rivals.loc[margin.idxmin()]


def _same_computation(group: pd.DataFrame, me: pd.Series) -> pd.Series:
    """Runs that compute exactly ``me``'s numbers: the same op resolving to the same plan (e.g. "auto" and
    its explicit spelling), or to the same chunk size with every error column equal to the last bit (policies
    that coincide, as all do when acc_dtype equals the input dtype: :func:`same_numbers`).

    They differ only by measurement noise, so they never count as rivals.
    """
    columns = ("resolved_policy", "resolved_acc_dtype", "chunk_size")
    if any(column not in group for column in columns):
        return pd.Series(False, index=group.index)
    same_op = group["op"] == me["op"]
    same = same_op.copy()
    for column in columns:
        same &= group[column].astype(str) == str(me[column])
    errors = [column for column in ERROR_COLUMNS if column in group]
    if errors:
        identical = same_op & (group["chunk_size"].astype(str) == str(me["chunk_size"]))
        for column in errors:
            identical &= group[column].astype(str) == str(me[column])
        same |= identical
    return same


def verdicts(table: pd.DataFrame) -> pd.DataFrame:
    """One :class:`Verdict` row per auto entry x problem present in ``table`` (from :func:`prepare`).

    ``on_*_front`` means: no run is no worse on both axes and more than
    :data:`VERDICT_TOLERANCE` better on one.

    The auto pick's row is lce with default options (``acc_policy`` and
    ``chunking_method`` "auto", acc_dtype left default): exactly what a user
    gets; fronts are over every run of the problem (lce, torch and the reference).
    """
    rows: list[Verdict] = []
    for kind, dtype in auto_entries():
        pick = auto_pick(kind, getattr(torch, dtype))
        listed = pick is not AUTO_FALLBACK
        for device in _devices_for(kind):
            subset = table[(table["device"] == device) & (table["dtype"] == dtype)]
            for _, group in subset.groupby(["N", "D", "C"], sort=True):
                mine = group[(group["op"] == "lce") & (group["policy"] == "auto")
                             & (group["chunking"] == "auto") & (group["acc_dtype"] == "default")]
                if mine.empty:
                    continue
                me = mine.iloc[0]
                memory_rival, time_rival = _best_dominator(group, me, MEMORY), _best_dominator(group, me, TIME)
                rows.append(Verdict(
                    device, dtype, f"{me.N}x{me.D}x{me.C}", f"{pick.acc_policy} {pick.chunking_method}", listed,
                    float(me[ERROR]), float(me[MEMORY]), float(me[TIME]),
                    memory_rival is None, time_rival is None,
                    "" if memory_rival is None else memory_rival["label"],
                    math.nan if memory_rival is None else float(memory_rival[ERROR]),
                    math.nan if memory_rival is None else float(memory_rival[MEMORY]),
                    "" if time_rival is None else time_rival["label"],
                    math.nan if time_rival is None else float(time_rival[ERROR]),
                    math.nan if time_rival is None else float(time_rival[TIME]),
                ))
    return pd.DataFrame([dataclasses.asdict(v) for v in rows])


def recommend(table: pd.DataFrame, device: str, dtype: str, *, cost: str = MEMORY) -> pd.DataFrame:
    """lce configs for (device, dtype) ranked by mean over shapes of log(cost/best) + log(error/best).

    Lower ``score`` is better: 0 would be the cheapest *and* most accurate run
    on every shape. Only configs measured on every shape are ranked.
    """
    subset = table[(table["device"] == device) & (table["dtype"] == dtype) & (table["op"] == "lce")].copy()
    if subset.empty:
        return pd.DataFrame(columns=["label", "score", ERROR, cost])
    best_cost = subset.groupby(["N", "D", "C"])[cost].transform("min")
    best_error = subset.groupby(["N", "D", "C"])[ERROR].transform("min")
    subset["score"] = np.log(subset[cost] / best_cost) + np.log(subset[ERROR] / best_error)
    shapes = subset[["N", "D", "C"]].drop_duplicates().shape[0]
    ranked = subset.groupby("label").agg(score=("score", "mean"), runs=("score", "size"),
                                         **{ERROR: (ERROR, "median"), cost: (cost, "median")})
    ranked = ranked[ranked["runs"] == shapes].drop(columns="runs")
    return ranked.sort_values("score").reset_index()


def verdict_summary(verdicts_table: pd.DataFrame) -> pd.DataFrame:
    """:func:`verdicts` as a reader's table: one readable column per question, the rival named where there is one.

    Columns: ``device``, ``dtype``, ``shape``, ``auto pick`` (``(fallback)`` when unlisted), ``error (floors)``,
    ``peak MiB``, ``memory front``, ``time ms`` and ``time front``. A front column reads ✓, or ✗ and the rival
    with its numbers; ``cuda-emulated`` picks have no time (NaN) and a time front "not judged".
    """
    rows = []
    for v in verdicts_table.itertuples():
        emulated = v.device == "cuda-emulated"
        memory = "✓" if v.on_memory_front else (f"✗ {v.memory_dominator}: {v.memory_dominator_error:.2f} floors, "
                                                 f"{v.memory_dominator_peak_mib:.2f} MiB")
        if emulated:
            time = "not judged (CPU stand-in)"
        else:
            time = "✓" if v.on_time_front else (f"✗ {v.time_dominator}: {v.time_dominator_error:.2f} floors, "
                                                f"{v.time_dominator_ms:.1f} ms")
        rows.append({"device": v.device, "dtype": v.dtype, "shape": v.shape,
                     "auto pick": v.pick + ("" if v.listed else " (fallback)"), "error (floors)": v.error,
                     "peak MiB": v.peak_mib, "memory front": memory,
                     "time ms": math.nan if emulated else v.time_ms, "time front": time})
    return pd.DataFrame(rows)


TIE_RULE = ("configurations that compute the same numbers (bit-identical errors on every shape) are one choice, "
            "named by its spelling with the fewest explicit options (\"auto\" policy and chunking, default "
            "acc_dtype), then compact (it allocates least when the policies coincide), then by name")
"""How :func:`recommend_choices` merges ties and names the merged choice (the notebooks quote it)."""


def same_numbers(table: pd.DataFrame, device: str, dtype: str) -> dict[str, str]:
    """lce config label -> the label naming its class of configs that compute the same numbers (:data:`TIE_RULE`).

    Two configs compute the same numbers when, on every shape, they resolve to the same chunk size and
    every error column (relative Frobenius and max, every output) is equal to the last bit.
    """
    subset = table[(table["device"] == device) & (table["dtype"] == dtype) & (table["op"] == "lce")]
    errors = [c for c in ERROR_COLUMNS if c in subset]
    classes: dict[tuple, list[str]] = {}
    for name, rows in subset.groupby("label", sort=True):
        rows = rows.sort_values(["N", "D", "C"])
        signature = tuple(rows[["N", "D", "C", "chunk_size", *errors]].astype(str).itertuples(index=False, name=None))
        classes.setdefault(signature, []).append(name)
    options = subset.drop_duplicates("label").set_index("label")

    def order(name: str) -> tuple:
        row = options.loc[name]
        explicit = int(row["policy"] != "auto") + int(row["chunking"] != "auto") + int(row["acc_dtype"] != "default")
        return explicit, row["policy"] != "compact", name

    return {name: min(members, key=order) for members in classes.values() for name in members}


def recommend_choices(table: pd.DataFrame, device: str, dtype: str, *, cost: str = MEMORY) -> pd.DataFrame:
    """:func:`recommend` with the configs that compute the same numbers merged into one choice each.

    Columns: ``choice`` (named by :data:`TIE_RULE`), ``members`` (every label of the class, the choice first),
    ``score`` (mean of the members' scores: they differ only by timing noise), ``score_low`` and
    ``score_high`` (the members' range), :data:`ERROR` and ``cost`` (medians); best first.
    """
    ranked = recommend(table, device, dtype, cost=cost)
    columns = ["choice", "members", "score", "score_low", "score_high", ERROR, cost]
    if ranked.empty:
        return pd.DataFrame(columns=columns)
    names = same_numbers(table, device, dtype)
    ranked["choice"] = ranked["label"].map(names)
    rows = []
    for choice, group in ranked.groupby("choice", sort=False):
        members = [choice] + sorted(label for label in group["label"] if label != choice)
        rows.append({"choice": choice, "members": members, "score": group["score"].mean(),
                     "score_low": group["score"].min(), "score_high": group["score"].max(),
                     ERROR: group[ERROR].median(), cost: group[cost].median()})
    return pd.DataFrame(rows, columns=columns).sort_values("score", kind="stable").reset_index(drop=True)


def choices_summary(table: pd.DataFrame, dtype: str, *, top: int = 4) -> pd.DataFrame:
    """The ``top`` :func:`recommend_choices` per device and cost for ``dtype``, as a reader's table.

    Costs: memory on every device, time except on ``cuda-emulated`` (its times are the CPU stand-in's).
    Columns: ``device``, ``ranked by``, ``rank``, ``choice``, ``same numbers as`` (the other members of
    its class, comma-separated), ``score``, ``worst gradient (floors)``, ``median cost`` (with its unit).
    """
    rows = []
    for device in sorted(set(table["device"])):
        costs = [(MEMORY, "memory", "{:.2f} MiB")]
        if device != "cuda-emulated":
            costs.append((TIME, "time", "{:.1f} ms"))
        for cost, word, unit in costs:
            choices = recommend_choices(table, device, dtype, cost=cost).head(top)
            for rank, choice in enumerate(choices.itertuples(index=False), start=1):
                rows.append({"device": device, "ranked by": f"{word} × error", "rank": rank, "choice": choice.choice,
                             "same numbers as": ", ".join(choice.members[1:]), "score": choice.score,
                             "worst gradient (floors)": getattr(choice, ERROR),
                             "median cost": unit.format(getattr(choice, cost))})
    return pd.DataFrame(rows, columns=["device", "ranked by", "rank", "choice", "same numbers as", "score",
                                       "worst gradient (floors)", "median cost"])


def verdict_lines(table: pd.DataFrame) -> list[str]:
    """Human-readable verdicts (one line per entry x problem) and fp32 recommendations."""
    lines: list[str] = [f"(a pick is off a front only if another run is no worse on both axes and more than "
                         f"{VERDICT_TOLERANCE:.0%} better on one)"]
    for v in verdicts(table).itertuples():
        where = f"{v.device} {v.dtype} {v.shape}: auto = {v.pick}{'' if v.listed else ' (fallback)'}"
        memory_kind = "MiB modeled" if v.device == "cuda-emulated" else "MiB"
        facts = f"error {v.error:.2f} floors, {v.peak_mib:.2f} {memory_kind}, {v.time_ms:.1f} ms"
        memory = ("on the memory front" if v.on_memory_front else
                  f"off the memory front: {v.memory_dominator} has {v.memory_dominator_error:.2f} floors at "
                  f"{v.memory_dominator_peak_mib:.2f} MiB")
        if v.device == "cuda-emulated":
            time = "time not judged (CPU stand-in for the CUDA kernels)"
        elif v.on_time_front:
            time = "on the time front"
        else:
            time = (f"off the time front: {v.time_dominator} has {v.time_dominator_error:.2f} floors in "
                    f"{v.time_dominator_ms:.1f} ms")
        lines.append(f"{where} -- {facts}; {memory}; {time}")
    for kind, dtype in auto_entries():
        for device in _devices_for(kind):
            ranked = recommend(table, device, dtype)
            if len(ranked):
                top = ranked.iloc[0]
                lines.append(f"best memory x error trade-off for {device} {dtype}: {top['label']} "
                             f"(score {top['score']:.2f}, median {top[ERROR]:.2f} floors, {top[MEMORY]:.2f} MiB)")
    return lines
