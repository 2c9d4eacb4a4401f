"""Pareto fronts on (cost, error) and a verdict for every "auto" pick.

Error, for a front, is :data:`ERROR`: the worst of the gradient errors of a run,
each in units of its rounding floor (1 = as good as rounding the exact answer).
Costs are the measured peak extra memory (:data:`MEMORY`) and the median time
(:data:`TIME`); for ``cuda-emulated`` runs the memory is lce's model (their
measured memory is the CPU stand-in's, not the GPU's).

A run is on the front of its group (same input family, device, dtype, shape and
seed) when no other run of the group is at most as costly *and* at most as
wrong, and strictly better in one of the two. Verdicts judge a pick on every
seed of a problem and call it on a front only if it is on it for each one;
numbers quoted across seeds are medians with the :data:`INTERVAL` of
:func:`seed_interval`.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from lce.planning.options import dtype_name
from lce.planning.policies import AUTO_FALLBACK, AUTO_TABLE, auto_pick

__all__ = ["ERROR", "MEMORY", "TIME", "GROUP", "CONFIG", "PROBLEM", "VS_UNFUSED", "INTERVAL", "SEED_PERCENTILES",
           "load_table", "prepare", "front_mask", "auto_entries", "verdicts", "verdict_summary", "recommend",
           "same_numbers", "recommend_choices", "choices_summary", "TIE_RULE", "label", "verdict_lines",
           "seed_interval", "vs_unfused_text", "unfused_words"]

ERROR = "worst_grad_in_floors"
MEMORY = "peak_mib"
TIME = "time_ms"
GROUP = ["family", "device", "dtype", "N", "D", "C", "seed"]
PROBLEM = ["family", "device", "dtype", "N", "D", "C"]
"""One problem of a verdict: :data:`GROUP` without the seed (its seeds are draws of the same problem)."""
CONFIG = ["op", "family", "device", "dtype", "N", "D", "C", "policy", "chunking", "acc_dtype", "bias"]
"""What identifies one configuration of a problem; its rows differ only by seed."""
VS_UNFUSED = "worst_grad_vs_unfused"
"""A run's :data:`ERROR` over the unfused ``reference`` op's on the same inputs (same family, dtype, shape, seed):
how much error the op adds beyond what the plain same-dtype computation (its GEMMs' own summation) makes."""
SEED_PERCENTILES = (5.0, 95.0)
"""The interval over seeds that every seed-aggregated number comes with (:func:`seed_interval`)."""
INTERVAL = f"{SEED_PERCENTILES[0]:g}th–{SEED_PERCENTILES[1]:g}th percentile over seeds"
""":data:`SEED_PERCENTILES` in words, for captions and tables."""
_GRADS = ("grad_input", "grad_weight", "grad_bias")


def load_table(folder: Path | None = None) -> tuple[list[Path], pd.DataFrame]:
    """Every sweep results file in ``folder`` (default: the committed results), merged and :func:`prepare`-d."""
    from analysis.core.results_io import SWEEP, load_results, paths_of_kind
    from analysis.paths import RESULTS_DIR

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
    if "seed" not in table:
        table["seed"] = 0
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
    config = [c for c in CONFIG if c in table]
    for cost in (MEMORY, TIME):
        table[cost] = table[cost].fillna(table.groupby(config, dropna=False)[cost].transform("first"))
    table[VS_UNFUSED] = _vs_unfused(table)
    table["label"] = [label(row) for row in table.itertuples()]
    return table.reset_index(drop=True)


def _vs_unfused(table: pd.DataFrame) -> pd.Series:
    """:data:`VS_UNFUSED` per row: NaN where the sweep has no ``reference`` run of the same inputs.

    ``cuda-emulated`` rows are divided by the CPU reference (the same inputs: the emulation runs on CPU tensors).
    """
    keys = [c for c in ("family", "dtype", "N", "D", "C", "seed", "bias") if c in table]
    where = table["device"].replace({"cuda-emulated": "cpu"}).rename("_where")
    reference = table[table["op"] == "reference"].assign(_where=where)
    unfused = reference.groupby(["_where", *keys], dropna=False)[ERROR].median().rename("_unfused")
    rows = table[keys].assign(_where=where)
    joined = rows.join(unfused, on=["_where", *keys])
    return table[ERROR] / joined["_unfused"]


def seed_interval(table: pd.DataFrame, columns: str | list[str], by: list[str] | None = None) -> pd.DataFrame:
    """The median over seeds of each of ``columns`` per ``by`` group (default :data:`CONFIG` and ``label``), with
    its :data:`INTERVAL`.

    One row per group: the ``by`` columns, then per column ``{column}`` (median), ``{column}_low`` and
    ``{column}_high`` (``numpy.percentile`` at :data:`SEED_PERCENTILES`, linear interpolation, NaNs skipped),
    and ``seeds`` (how many rows the group has). ``by`` columns missing from ``table`` are left out.
    """
    columns = [columns] if isinstance(columns, str) else list(columns)
    by = [c for c in (by if by is not None else [*CONFIG, "label"]) if c in table]
    low, high = (q / 100 for q in SEED_PERCENTILES)
    grouped = table.groupby(by, dropna=False, sort=True)
    parts = [grouped.size().rename("seeds")]
    for column in columns:
        values = grouped[column]
        parts += [values.median().rename(column), values.quantile(low).rename(f"{column}_low"),
                  values.quantile(high).rename(f"{column}_high")]
    return pd.concat(parts, axis=1).reset_index()


def unfused_words(dtype: str = "float32") -> str:
    """What a :data:`VS_UNFUSED` ratio is a multiple of, in words: ``"the unfused fp32 computation's own error"``."""
    return f"the unfused {dtype.replace('float', 'fp')} computation's own error"


def vs_unfused_text(ratio: float, dtype: str = "float32") -> str:
    """A :data:`VS_UNFUSED` value in words: ``"1.2x the unfused fp32 computation's own error"`` ("" if NaN)."""
    if ratio is None or not np.isfinite(ratio):
        return ""
    return f"{ratio:.1f}x {unfused_words(dtype)}"


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


def auto_entries() -> list[tuple[str, str]]:
    """(device kind, dtype name) of every "auto" table entry, plus the fp32 ones the table lacks."""
    keys = [(kind, dtype_name(dtype)) for kind, dtype in AUTO_TABLE]
    for kind in ("cpu", "cuda"):
        if (kind, "float32") not in keys:
            keys.append((kind, "float32"))
    return keys


def _devices_for(kind: str, table: pd.DataFrame | None = None, dtype: str | None = None) -> tuple[str, ...]:
    """The devices whose runs judge ``kind``'s entries: for CUDA the GPU's own runs (``cuda``) where ``table`` holds
    any in ``dtype``, the CPU emulation of the layouts otherwise (real data replaces the stand-in)."""
    if kind == "cpu":
        return ("cpu",)
    if table is not None and ((table["device"] == "cuda") & (table["dtype"] == dtype)).any():
        return ("cuda",)
    return ("cuda-emulated",) if table is not None else ("cuda", "cuda-emulated")


@dataclasses.dataclass(frozen=True)
class Verdict:
    """How one auto pick fares on one problem's (memory, error) and (time, error) fronts, over its seeds.

    ``error`` is the pick's :data:`ERROR` median over the ``seeds``, ``error_low``/``error_high`` its
    :data:`INTERVAL`, ``vs_unfused`` the median of :data:`VS_UNFUSED`; costs are medians. A pick is
    ``on_*_front`` only if no rival knocks it off in any seed; ``*_off_seeds`` counts the seeds where one
    does, ``*_dominator`` is the rival that does so most often (``*_dominator_seeds`` times), with its
    error and cost as medians over the problem's seeds.
    """

    family: str
    device: str
    dtype: str
    shape: str
    pick: str
    listed: bool
    seeds: int
    error: float
    error_low: float
    error_high: float
    vs_unfused: float
    peak_mib: float
    time_ms: float
    on_memory_front: bool
    memory_off_seeds: int
    memory_dominator: str
    memory_dominator_seeds: int
    memory_dominator_error: float
    memory_dominator_peak_mib: float
    on_time_front: bool
    time_off_seeds: int
    time_dominator: str
    time_dominator_seeds: int
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


def _is_auto_pick(rows: pd.DataFrame) -> pd.Series:
    return ((rows["op"] == "lce") & (rows["policy"] == "auto") & (rows["chunking"] == "auto")
            & (rows["acc_dtype"] == "default"))


def _rival(problem: pd.DataFrame, picks: pd.DataFrame, cost: str) -> dict:
    """Across the seeds of one problem: in how many a rival beats the pick on (``cost``, error), and the rival
    that does so most often (ties: the first by name) with its median error and cost over the seeds."""
    knockers = []
    for seed, me in picks.groupby("seed", sort=True):
        rival = _best_dominator(problem[problem["seed"] == seed], me.iloc[0], cost)
        if rival is not None:
            knockers.append(rival["label"])
    if not knockers:
        return dict(off=0, name="", seeds=0, error=math.nan, cost=math.nan)
    counts = pd.Series(knockers).value_counts()
    name = sorted(counts[counts == counts.max()].index)[0]
    rows = problem[problem["label"] == name]
    return dict(off=len(knockers), name=name, seeds=int(counts[name]), error=float(rows[ERROR].median()),
                cost=float(rows[cost].median()))


def verdicts(table: pd.DataFrame) -> pd.DataFrame:
    """One :class:`Verdict` row per auto entry x problem (family, device, dtype, shape) in ``table`` (from
    :func:`prepare`), judged on every seed of the problem.

    Per seed, the pick is off a front when a run is no worse on both axes and more than
    :data:`VERDICT_TOLERANCE` better on one; ``on_*_front`` means: on it in every seed.

    The auto pick's row is lce with default options (``acc_policy`` and
    ``chunking_method`` "auto", acc_dtype left default): exactly what a user
    gets; fronts are over every run of the problem (lce, torch and the reference).
    """
    rows: list[Verdict] = []
    low, high = (q / 100 for q in SEED_PERCENTILES)
    for kind, dtype in auto_entries():
        pick = auto_pick(kind, getattr(torch, dtype))
        listed = pick is not AUTO_FALLBACK
        for device in _devices_for(kind, table, dtype):
            subset = table[(table["device"] == device) & (table["dtype"] == dtype)]
            for (family, n, d, c), problem in subset.groupby(["family", "N", "D", "C"], sort=True):
                mine = problem[_is_auto_pick(problem)].drop_duplicates("seed")
                if mine.empty:
                    continue
                memory, time = _rival(problem, mine, MEMORY), _rival(problem, mine, TIME)
                label = f"{pick.acc_policy} {pick.chunking_method}"
                measured = sorted(set(mine["resolved_policy"].dropna().astype(str)) - {pick.acc_policy})
                if measured:  # rows from before the auto table changed: say what they measured
                    label += f" (rows measured when auto resolved to {', '.join(measured)}; rerun the sweep)"
                rows.append(Verdict(
                    family, device, dtype, f"{n}x{d}x{c}", label, listed,
                    len(mine), float(mine[ERROR].median()), float(mine[ERROR].quantile(low)),
                    float(mine[ERROR].quantile(high)), float(mine[VS_UNFUSED].median()),
                    float(mine[MEMORY].median()), float(mine[TIME].median()),
                    memory["off"] == 0, memory["off"], memory["name"], memory["seeds"], memory["error"],
                    memory["cost"],
                    time["off"] == 0, time["off"], time["name"], time["seeds"], time["error"], time["cost"],
                ))
    return pd.DataFrame([dataclasses.asdict(v) for v in rows],
                        columns=[field.name for field in dataclasses.fields(Verdict)])


def _lce_rows(table: pd.DataFrame, device: str, dtype: str, family: str | None) -> pd.DataFrame:
    rows = table[(table["device"] == device) & (table["dtype"] == dtype) & (table["op"] == "lce")]
    return rows if family is None else rows[rows["family"] == family]


_PROBLEM_SEED = ["family", "N", "D", "C", "seed"]


def recommend(table: pd.DataFrame, device: str, dtype: str, *, cost: str = MEMORY,
              family: str | None = None) -> pd.DataFrame:
    """lce configs for (device, dtype) ranked by mean over problems (family x shape x seed) of
    log(cost/best) + log(error/best); only ``family``'s problems when given, else every family's.

    Lower ``score`` is better: 0 would be the cheapest *and* most accurate run
    on every problem. Only configs measured on every problem are ranked.
    Columns: ``label``, ``score``, :data:`ERROR` (median over the config's runs), ``{ERROR}_low`` and
    ``{ERROR}_high`` (its :data:`INTERVAL` over the same runs: seeds and shapes pooled), ``cost`` (median).
    """
    subset = _lce_rows(table, device, dtype, family).copy()
    columns = ["label", "score", ERROR, f"{ERROR}_low", f"{ERROR}_high", cost]
    if subset.empty:
        return pd.DataFrame(columns=columns)
    best_cost = subset.groupby(_PROBLEM_SEED)[cost].transform("min")
    best_error = subset.groupby(_PROBLEM_SEED)[ERROR].transform("min")
    subset["score"] = np.log(subset[cost] / best_cost) + np.log(subset[ERROR] / best_error)
    problems = subset[_PROBLEM_SEED].drop_duplicates().shape[0]
    spread = seed_interval(subset, ERROR, by=["label"]).set_index("label")
    ranked = subset.groupby("label").agg(score=("score", "mean"), runs=("score", "size"), **{cost: (cost, "median")})
    ranked = ranked.join(spread.drop(columns="seeds"))
    ranked = ranked[ranked["runs"] == problems]
    return ranked.sort_values("score").reset_index()[columns]


def _front_text(v, axis: str, cost_text: str) -> str:
    """✓, or ✗ with the seeds it is off in and the rival (how often, its median numbers)."""
    if getattr(v, f"on_{axis}_front"):
        return "✓" if v.seeds == 1 else f"✓ (all {v.seeds} seeds)"
    off = getattr(v, f"{axis}_off_seeds")
    rival, often = getattr(v, f"{axis}_dominator"), getattr(v, f"{axis}_dominator_seeds")
    where = "" if v.seeds == 1 else f" in {off} of {v.seeds} seeds"
    most = "" if v.seeds == 1 else f" ({often} of them)"
    return f"✗{where}: {rival}{most}: {getattr(v, f'{axis}_dominator_error'):.2f} floors, {cost_text}"


def verdict_summary(verdicts_table: pd.DataFrame) -> pd.DataFrame:
    """:func:`verdicts` as a reader's table: one readable column per question, the rival named where there is one.

    Columns: ``family``, ``device``, ``dtype``, ``shape``, ``auto pick`` (``(fallback)`` when unlisted),
    ``seeds``, ``error (floors)`` (median over seeds), ``error interval`` (its :data:`INTERVAL`, as text),
    ``× unfused`` (the median :data:`VS_UNFUSED`), ``peak MiB``, ``memory front``, ``time ms`` and
    ``time front``. A front column reads ✓ (on it in every seed), or ✗ with the number of seeds the pick is
    off it in and the rival that knocks it off most often, with its median numbers; ``cuda-emulated`` picks
    have no time (NaN) and a time front "not judged".
    """
    rows = []
    for v in verdicts_table.itertuples():
        emulated = v.device == "cuda-emulated"
        memory = _front_text(v, "memory", f"{v.memory_dominator_peak_mib:.2f} MiB")
        time = ("not judged (CPU stand-in)" if emulated else
                _front_text(v, "time", f"{v.time_dominator_ms:.1f} ms"))
        rows.append({"family": v.family, "device": v.device, "dtype": v.dtype, "shape": v.shape,
                     "auto pick": v.pick + ("" if v.listed else " (fallback)"), "seeds": v.seeds,
                     "error (floors)": v.error, "error interval": f"{v.error_low:.2f}–{v.error_high:.2f}",
                     "× unfused": v.vs_unfused, "peak MiB": v.peak_mib, "memory front": memory,
                     "time ms": math.nan if emulated else v.time_ms, "time front": time})
    return pd.DataFrame(rows, columns=["family", "device", "dtype", "shape", "auto pick", "seeds", "error (floors)",
                                       "error interval", "× unfused", "peak MiB", "memory front", "time ms",
                                       "time front"])


TIE_RULE = ("configurations that compute the same numbers (bit-identical errors on every shape) are one choice, "
            "named by its spelling with the fewest explicit options (\"auto\" policy and chunking, default "
            "acc_dtype), then compact (it allocates least when the policies coincide), then by name")
"""How :func:`recommend_choices` merges ties and names the merged choice (the notebooks quote it)."""


def same_numbers(table: pd.DataFrame, device: str, dtype: str, *, family: str | None = None) -> dict[str, str]:
    """lce config label -> the label naming its class of configs that compute the same numbers (:data:`TIE_RULE`).

    Two configs compute the same numbers when, on every problem (family, shape and seed: ``family``'s only
    when given), they resolve to the same chunk size and every error column (relative Frobenius, every
    output) is equal to the last bit.
    """
    subset = _lce_rows(table, device, dtype, family)
    errors = [c for c in ERROR_COLUMNS if c in subset]
    keys = [*_PROBLEM_SEED, "chunk_size", *errors]
    classes: dict[tuple, list[str]] = {}
    for name, rows in subset.groupby("label", sort=True):
        rows = rows.sort_values(_PROBLEM_SEED)
        signature = tuple(rows[keys].astype(str).itertuples(index=False, name=None))
        classes.setdefault(signature, []).append(name)
    options = subset.drop_duplicates("label").set_index("label")

    def order(name: str) -> tuple:
        row = options.loc[name]
        explicit = int(row["policy"] != "auto") + int(row["chunking"] != "auto") + int(row["acc_dtype"] != "default")
        return explicit, row["policy"] != "compact", name

    return {name: min(members, key=order) for members in classes.values() for name in members}


def recommend_choices(table: pd.DataFrame, device: str, dtype: str, *, cost: str = MEMORY,
                      family: str | None = None) -> pd.DataFrame:
    """:func:`recommend` with the configs that compute the same numbers merged into one choice each.

    Columns: ``choice`` (named by :data:`TIE_RULE`), ``members`` (every label of the class, the choice first),
    ``score`` (mean of the members' scores: they differ only by timing noise), ``score_low`` and
    ``score_high`` (the members' range), :data:`ERROR`, ``{ERROR}_low``, ``{ERROR}_high`` and ``cost``
    (medians over the members); best first. ``family``: as in :func:`recommend`.
    """
    ranked = recommend(table, device, dtype, cost=cost, family=family)
    columns = ["choice", "members", "score", "score_low", "score_high", ERROR, f"{ERROR}_low", f"{ERROR}_high", cost]
    if ranked.empty:
        return pd.DataFrame(columns=columns)
    names = same_numbers(table, device, dtype, family=family)
    ranked["choice"] = ranked["label"].map(names)
    rows = []
    for choice, group in ranked.groupby("choice", sort=False):
        members = [choice] + sorted(label for label in group["label"] if label != choice)
        rows.append({"choice": choice, "members": members, "score": group["score"].mean(),
                     "score_low": group["score"].min(), "score_high": group["score"].max(),
                     **{column: group[column].median() for column in columns[5:]}})
    return pd.DataFrame(rows, columns=columns).sort_values("score", kind="stable").reset_index(drop=True)


def choices_summary(table: pd.DataFrame, dtype: str, *, top: int = 4) -> pd.DataFrame:
    """The ``top`` :func:`recommend_choices` per family, device and cost for ``dtype``, as a reader's table.

    Costs: memory on every device, time except on ``cuda-emulated`` (its times are the CPU stand-in's).
    Columns: ``family``, ``device``, ``ranked by``, ``rank``, ``choice``, ``same numbers as`` (the other members
    of its class, comma-separated), ``score``, ``worst gradient (floors)`` (median over shapes and seeds),
    ``interval`` (its :data:`INTERVAL`, shapes pooled, as text), ``× unfused`` (the choice's median
    :data:`VS_UNFUSED`), ``median cost`` (with its unit).
    """
    rows = []
    for family in sorted(set(table["family"])):
        for device in sorted(set(table["device"])):
            costs = [(MEMORY, "memory", "{:.2f} MiB")]
            if device != "cuda-emulated":
                costs.append((TIME, "time", "{:.1f} ms"))
            lce = _lce_rows(table, device, dtype, family)
            for cost, word, unit in costs:
                choices = recommend_choices(table, device, dtype, cost=cost, family=family).head(top)
                for rank, choice in enumerate(choices.itertuples(index=False), start=1):
                    ratio = lce.loc[lce["label"] == choice.choice, VS_UNFUSED].median()
                    rows.append({"family": family, "device": device, "ranked by": f"{word} × error", "rank": rank,
                                 "choice": choice.choice, "same numbers as": ", ".join(choice.members[1:]),
                                 "score": choice.score, "worst gradient (floors)": getattr(choice, ERROR),
                                 "interval": (f"{getattr(choice, f'{ERROR}_low'):.2f}–"
                                              f"{getattr(choice, f'{ERROR}_high'):.2f}"),
                                 "× unfused": ratio, "median cost": unit.format(getattr(choice, cost))})
    return pd.DataFrame(rows, columns=["family", "device", "ranked by", "rank", "choice", "same numbers as", "score",
                                       "worst gradient (floors)", "interval", "× unfused", "median cost"])


def verdict_lines(table: pd.DataFrame) -> list[str]:
    """Human-readable verdicts (one line per entry x problem, seeds pooled) and the best trade-off per family."""
    lines: list[str] = [f"(a pick is off a front only if another run is no worse on both axes and more than "
                        f"{VERDICT_TOLERANCE:.0%} better on one, in at least one seed; numbers are medians over "
                        f"seeds with the {INTERVAL} in brackets)"]
    for v in verdicts(table).itertuples():
        where = f"{v.family} {v.device} {v.dtype} {v.shape}: auto = {v.pick}{'' if v.listed else ' (fallback)'}"
        memory_kind = "MiB modeled" if v.device == "cuda-emulated" else "MiB"
        unfused = vs_unfused_text(v.vs_unfused, v.dtype) if v.dtype == "float32" else ""
        facts = (f"error {v.error:.2f} floors [{v.error_low:.2f}–{v.error_high:.2f}], {v.seeds} seed"
                 f"{'s' if v.seeds != 1 else ''}{f' ({unfused})' if unfused else ''}, {v.peak_mib:.2f} "
                 f"{memory_kind}" + ("" if v.device == "cuda-emulated" else f", {v.time_ms:.1f} ms"))
        memory = ("on the memory front" + (" in every seed" if v.seeds > 1 else "") if v.on_memory_front else
                  f"off the memory front in {v.memory_off_seeds} of {v.seeds} seeds: {v.memory_dominator} (in "
                  f"{v.memory_dominator_seeds}) has {v.memory_dominator_error:.2f} floors at "
                  f"{v.memory_dominator_peak_mib:.2f} MiB")
        if v.device == "cuda-emulated":
            time = "time not judged (CPU stand-in for the CUDA kernels)"
        elif v.on_time_front:
            time = "on the time front" + (" in every seed" if v.seeds > 1 else "")
        else:
            time = (f"off the time front in {v.time_off_seeds} of {v.seeds} seeds: {v.time_dominator} (in "
                    f"{v.time_dominator_seeds}) has {v.time_dominator_error:.2f} floors in "
                    f"{v.time_dominator_ms:.1f} ms")
        lines.append(f"{where} -- {facts}; {memory}; {time}")
    for family in sorted(set(table["family"])):
        for kind, dtype in auto_entries():
            for device in _devices_for(kind):
                ranked = recommend(table, device, dtype, family=family)
                if len(ranked):
                    top = ranked.iloc[0]
                    lines.append(f"best memory x error trade-off for {family} {device} {dtype}: {top['label']} "
                                 f"(score {top['score']:.2f}, median {top[ERROR]:.2f} floors "
                                 f"[{top[f'{ERROR}_low']:.2f}–{top[f'{ERROR}_high']:.2f}], {top[MEMORY]:.2f} MiB)")
    return lines
