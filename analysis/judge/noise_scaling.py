"""How each candidate's error/noise ratio grows with the batch: a power law in N, its interval, a held-out check.

Per candidate, dtype, D and ratio column (:data:`analysis.judge.rule.RATIO_COLUMNS`), over a set of families::

    log2(ratio) = a_family + b * log2(N)

``b`` is the exponent shared by the families (``ratio ~ N**b``: 0.5 for an error that does not shrink while the
sampling noise does as ``1/sqrt(N)``, 0 for an error that shrinks with the noise), ``a_family`` each family's
level. It is fitted by least squares to every (family, seed, N) measurement (:func:`fit_line`; exact zeros, if
any, left out). Its interval comes from a bootstrap over the points (:func:`bootstrap_lines`): each family's
(seed, N) measurements are resampled with replacement and the line refitted; percentiles :data:`BAND` of the refits
give the interval of the exponent and the band of the line at any N (seeded: the same data give the same
interval). :func:`family_exponents` fits each family alone, the check that one exponent suits them all.

The error/noise rule lets the worst family decide (:mod:`analysis.judge.rule`), so a prediction at N is the worst
family's line there (the largest ``a_family + b log2 N``, per refit for the band), over the families whose
*expected* gradient is nonzero (:func:`rule_families`; :data:`analysis.studies.noise_scaling.EXPECTED_GRADIENT`
says why the calibrated family's is zero and hides a growing bias). Where the data hold N, the rule reads the
measurement: the worst family's median over seeds (:func:`measured`).

:func:`heldout_check` fits on the even powers of two only and predicts the odd ones: per family, the mean of
``log2(ratio)`` over seeds against the line, with a prediction interval that adds the spread of a mean over that
many seeds (the fit's residual spread) to the line's band. :func:`scaling_json` exports what the decision procedure
reads (``lce/decide/noise_scaling.json``, :mod:`lce.decide.noise_scaling`).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.core.families import family_kind
from analysis.judge.pareto import seed_interval
from analysis.judge.rule import BIAS_LIMIT, RATIO_COLUMNS
from analysis.studies.noise_scaling import CANDIDATES, EXPECTED_GRADIENT

__all__ = ["BAND", "RESAMPLES", "REFERENCE_D", "LLM_ROWS", "JSON_FILE", "Line", "rule_families", "points",
           "fit_line", "bootstrap_lines", "ScalingFit", "family_exponents", "fit_scaling", "fits", "fit_table",
           "measured", "heldout_check", "scaling_json", "write_scaling_json"]

BAND = (2.5, 97.5)
"""Percentiles of the bootstrap refits that bound an interval (95%)."""
RESAMPLES = 2000
"""Bootstrap refits per fit."""
REFERENCE_D = 128
"""The D whose fits the decision procedure reads (the study's full N range; the larger D check the exponent)."""
LLM_ROWS: tuple[int, ...] = tuple(2**k for k in range(17, 21))
"""Rows per step of LLM training, where the study cannot measure and the fit predicts."""
JSON_FILE = Path(__file__).resolve().parents[2] / "lce" / "decide" / "noise_scaling.json"
_Z95 = 1.959963984540054


def rule_families(table: pd.DataFrame) -> list[str]:
    """The families of ``table`` whose expected gradient is nonzero (the ones the rule's fit uses), sorted."""
    return sorted(family for family in table["family"].unique() if EXPECTED_GRADIENT[family_kind(family)])


def points(table: pd.DataFrame, candidate: str, dtype: str, column: str, D: int = REFERENCE_D,
           families: Sequence[str] | None = None) -> pd.DataFrame:
    """``family, seed, N, log2_n, log2_ratio`` of one candidate's ``column`` (rows with a zero ratio left out)."""
    rows = table[(table["candidate"] == candidate) & (table["dtype"] == dtype) & (table["D"] == D)]
    if families is not None:
        rows = rows[rows["family"].isin(families)]
    rows = rows[rows[column] > 0]
    return pd.DataFrame({"family": rows["family"].to_numpy(), "seed": rows["seed"].to_numpy(),
                         "N": rows["N"].to_numpy(), "log2_n": np.log2(rows["N"].to_numpy(dtype=float)),
                         "log2_ratio": np.log2(rows[column].to_numpy(dtype=float))})


@dataclasses.dataclass(frozen=True)
class Line:
    """``log2(ratio) = levels[family] + slope * log2(N)``; ``spread``: the residuals' standard deviation."""

    slope: float
    levels: dict[str, float]
    spread: float

    def at(self, rows: int | float, family: str | None = None) -> float:
        """log2 of the ratio at ``rows``: the family's line, or the worst family's (None)."""
        level = self.levels[family] if family is not None else max(self.levels.values())
        return level + self.slope * math.log2(rows)


def _draw_sums(data: pd.DataFrame) -> tuple[list[tuple[str, int, int]], np.ndarray]:
    """Per point (family, seed, N): ``[n, sum L, sum y, sum L^2, sum L y]`` (L = log2 N, y = log2 ratio)."""
    grouped = data.assign(ll=data["log2_n"] ** 2, ly=data["log2_n"] * data["log2_ratio"]).groupby(
        ["family", "seed", "N"], sort=True)
    sums = grouped.agg(n=("log2_n", "size"), l=("log2_n", "sum"), y=("log2_ratio", "sum"), ll=("ll", "sum"),
                       ly=("ly", "sum"))
    return list(sums.index), sums.to_numpy(dtype=float)


def _lines_from_counts(counts: np.ndarray, sums: np.ndarray, family_of: np.ndarray, families: list[str]
                       ) -> tuple[np.ndarray, np.ndarray]:
    """Slopes ``(R,)`` and levels ``(R, F)`` (NaN where a family is absent) of ``R`` weightings ``counts (R, draws)``
    of the draws: the within-family least squares of :class:`Line`."""
    sxx = np.zeros(len(counts))
    sxy = np.zeros(len(counts))
    per_family = []
    for index in range(len(families)):
        mine = family_of == index
        n, sum_l, sum_y, sum_ll, sum_ly = (counts[:, mine] @ sums[mine]).T
        with np.errstate(invalid="ignore", divide="ignore"):
            sxx += np.where(n > 0, sum_ll - sum_l * sum_l / n, 0.0)
            sxy += np.where(n > 0, sum_ly - sum_l * sum_y / n, 0.0)
        per_family.append((n, sum_l, sum_y))
    with np.errstate(invalid="ignore", divide="ignore"):
        slope = np.where(sxx > 1e-12, sxy / sxx, np.nan)
        levels = np.stack([np.where(n > 0, (sum_y - slope * sum_l) / n, np.nan) for n, sum_l, sum_y in per_family],
                          axis=1)
    return slope, levels


def fit_line(data: pd.DataFrame) -> Line:
    """The least-squares :class:`Line` through ``data`` (:func:`points`); ``ValueError`` without two distinct N."""
    if data.empty or data["N"].nunique() < 2:
        raise ValueError(f"a line needs points at two batch sizes or more, got N={sorted(set(data['N']))}")
    draws, sums = _draw_sums(data)
    families = sorted({family for family, *_ in draws})
    family_of = np.array([families.index(family) for family, *_ in draws])
    slope, levels = _lines_from_counts(np.ones((1, len(draws))), sums, family_of, families)
    line = Line(float(slope[0]), {family: float(levels[0, i]) for i, family in enumerate(families)}, 0.0)
    residuals = data["log2_ratio"] - [line.at(n, family) for n, family in zip(data["N"], data["family"], strict=True)]
    dof = max(1, len(data) - len(families) - 1)
    return dataclasses.replace(line, spread=float(np.sqrt((residuals ** 2).sum() / dof)))


def bootstrap_lines(data: pd.DataFrame, resamples: int = RESAMPLES, seed: int = 0
                    ) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Refits of :func:`fit_line` on ``resamples`` resamples of the points: slopes ``(R,)``, levels ``(R, F)`` and
    the family order.

    Each refit draws every family's (seed, N) points with replacement, as many as it has (a stratified case
    bootstrap): the points are independent draws (a seed's weight is drawn after its N rows, so two N of one seed
    share no weight), and the families are kept, each with its own level, so every refit has a line for every
    family and the worst family is always among them. Resampling the families themselves is not done: with one
    family spanning the whole range of N and another (the trained one) one octave, a family resample would let
    that octave's scatter alone set the slope. Refits whose points span one N only have a NaN slope."""
    draws, sums = _draw_sums(data)
    families = sorted({family for family, *_ in draws})
    family_of = np.array([families.index(family) for family, *_ in draws])
    rng = np.random.default_rng(seed)
    counts = np.zeros((resamples, len(draws)))
    for index in range(len(families)):
        own = np.flatnonzero(family_of == index)
        picks = own[rng.integers(0, len(own), size=(resamples, len(own)))]
        np.add.at(counts, (np.repeat(np.arange(resamples), len(own)), picks.ravel()), 1.0)
    slope, levels = _lines_from_counts(counts, sums, family_of, families)
    return slope, levels, families


def _worst(slope: np.ndarray, levels: np.ndarray, log2_n: float) -> np.ndarray:
    return np.nanmax(levels, axis=1) + slope * log2_n


@dataclasses.dataclass(frozen=True)
class ScalingFit:
    """One candidate's fit: the line, the exponent's interval, and the worst family's band at any N."""

    candidate: str
    dtype: str
    column: str
    D: int
    families: tuple[str, ...]
    line: Line
    exponent_low: float
    exponent_high: float
    refit_slopes: np.ndarray = dataclasses.field(repr=False)
    refit_levels: np.ndarray = dataclasses.field(repr=False)
    rows: tuple[int, ...] = ()

    @property
    def exponent(self) -> float:
        return self.line.slope

    def band(self, rows: int, family: str | None = None) -> tuple[float, float, float]:
        """``(ratio, low, high)`` of the line at ``rows``: the family's, or the worst family's (None), with the
        bootstrap band (:data:`BAND`)."""
        log2_n = math.log2(rows)
        if family is None:
            spread = _worst(self.refit_slopes, self.refit_levels, log2_n)
        else:
            spread = self.refit_levels[:, self.families.index(family)] + self.refit_slopes * log2_n
        low, high = np.nanpercentile(spread, BAND)
        return 2 ** self.line.at(rows, family), float(2 ** low), float(2 ** high)


def fit_scaling(table: pd.DataFrame, candidate: str, dtype: str, column: str, D: int = REFERENCE_D,
                families: Sequence[str] | None = None, resamples: int = RESAMPLES,
                rows: Iterable[int] | None = None) -> ScalingFit:
    """:func:`fit_line` and :func:`bootstrap_lines` of one candidate over ``families`` (default: the rule's), at
    the batch sizes ``rows`` (default: every one measured)."""
    families = rule_families(table) if families is None else list(families)
    data = points(table, candidate, dtype, column, D, families)
    if rows is not None:
        data = data[data["N"].isin(list(rows))]
    line = fit_line(data)
    slopes, levels, order = bootstrap_lines(data, resamples)
    low, high = np.nanpercentile(slopes, BAND)
    return ScalingFit(candidate, dtype, column, D, tuple(order), line, float(low), float(high), slopes, levels,
                      tuple(sorted(int(n) for n in data["N"].unique())))


def fits(table: pd.DataFrame, column: str = "weight_bias_over_noise", D: int = REFERENCE_D,
         families: Sequence[str] | None = None, resamples: int = RESAMPLES) -> list[ScalingFit]:
    """:func:`fit_scaling` of every (candidate, dtype) measured at ``D`` with two batch sizes or more, in
    :data:`~analysis.studies.noise_scaling.CANDIDATES` order, then by dtype."""
    out = []
    here = table[table["D"] == D]
    for candidate in [name for name in CANDIDATES if name in set(here["candidate"])]:
        for dtype in sorted(here[here["candidate"] == candidate]["dtype"].unique()):
            try:
                out.append(fit_scaling(table, candidate, dtype, column, D, families, resamples))
            except ValueError:
                continue
    return out


def fit_table(table: pd.DataFrame, column: str = "weight_bias_over_noise", D: int = REFERENCE_D,
              families: Sequence[str] | None = None, resamples: int = RESAMPLES,
              predict_at: Sequence[int] = LLM_ROWS) -> pd.DataFrame:
    """One row per (candidate, dtype) measured at ``D`` (:func:`fits`): the exponent with its interval and the worst
    family's predicted ratio with its band at each of ``predict_at`` (columns ``at_<N>``, ``at_<N>_low``,
    ``at_<N>_high``)."""
    out = []
    for fit in fits(table, column, D, families, resamples):
        row = {"candidate": fit.candidate, "dtype": fit.dtype, "D": D, "column": column,
               "families": ", ".join(fit.families), "rows": f"{min(fit.rows)}-{max(fit.rows)}",
               "exponent": fit.exponent, "exponent_low": fit.exponent_low, "exponent_high": fit.exponent_high}
        for n in predict_at:
            row[f"at_{n}"], row[f"at_{n}_low"], row[f"at_{n}_high"] = fit.band(n)
        out.append(row)
    return pd.DataFrame(out)


def family_exponents(table: pd.DataFrame, column: str = "weight_bias_over_noise", D: int = REFERENCE_D,
                     resamples: int = RESAMPLES, min_rows: int = 3) -> pd.DataFrame:
    """Per (candidate, dtype, family) measured at ``D`` over ``min_rows`` batch sizes or more: that family's own
    exponent with its bootstrap interval (every family, the calibrated one included: whether one exponent suits
    them all, and how a zero expected gradient hides the growth)."""
    out = []
    here = table[table["D"] == D]
    for candidate in [name for name in CANDIDATES if name in set(here["candidate"])]:
        for dtype in sorted(here[here["candidate"] == candidate]["dtype"].unique()):
            for family in sorted(here["family"].unique()):
                data = points(table, candidate, dtype, column, D, [family])
                if data["N"].nunique() < min_rows:
                    continue
                slopes, _, _ = bootstrap_lines(data, resamples)
                low, high = np.nanpercentile(slopes, BAND)
                out.append({"candidate": candidate, "dtype": dtype, "family": family, "column": column,
                            "rows": f"{data['N'].min()}-{data['N'].max()}", "points": len(data),
                            "exponent": fit_line(data).slope, "exponent_low": low, "exponent_high": high})
    return pd.DataFrame(out)


def measured(table: pd.DataFrame, column: str = "weight_bias_over_noise", D: int = REFERENCE_D,
             families: Sequence[str] | None = None) -> pd.DataFrame:
    """Per (candidate, dtype, N): the worst family's median over seeds of ``column`` with its seed interval
    (:func:`analysis.judge.pareto.seed_interval`), the family and its seed count."""
    families = rule_families(table) if families is None else list(families)
    rows = table[(table["D"] == D) & table["family"].isin(families)]
    per_family = seed_interval(rows, column, by=["candidate", "dtype", "N", "family"])
    worst = per_family.loc[per_family.groupby(["candidate", "dtype", "N"])[column].idxmax()]
    return worst.reset_index(drop=True)


def heldout_check(table: pd.DataFrame, candidate: str, dtype: str, column: str = "weight_bias_over_noise",
                  D: int = REFERENCE_D, families: Sequence[str] | None = None,
                  resamples: int = RESAMPLES) -> pd.DataFrame:
    """Fit on the even powers of two, predict the odd ones: per (family, odd N) the measured mean of log2(ratio)
    over seeds, the prediction, the error (log2 units: 1 = a factor of 2) and whether the prediction interval
    (the line's band widened, in quadrature, by the residual spread of a mean over that many seeds) holds it."""
    families = rule_families(table) if families is None else list(families)
    data = points(table, candidate, dtype, column, D, families)
    even = [n for n in sorted(data["N"].unique()) if int(math.log2(n)) % 2 == 0]
    fit = fit_scaling(table, candidate, dtype, column, D, families, resamples, rows=even)
    held = data[~data["N"].isin(even)].groupby(["family", "N"])["log2_ratio"].agg(["mean", "size"]).reset_index()
    out = []
    for row in held.itertuples(index=False):
        if row.family not in fit.families:
            continue
        predicted, low, high = (math.log2(value) for value in fit.band(row.N, row.family))
        scatter = _Z95 * fit.line.spread / math.sqrt(row.size)
        low, high = predicted - math.hypot(predicted - low, scatter), predicted + math.hypot(high - predicted, scatter)
        out.append({"candidate": candidate, "dtype": dtype, "column": column, "family": row.family, "N": row.N,
                    "seeds": row.size, "measured_log2": row.mean, "predicted_log2": predicted,
                    "error_log2": row.mean - predicted, "low_log2": low, "high_log2": high,
                    "covered": low <= row.mean <= high})
    return pd.DataFrame(out)


def scaling_json(table: pd.DataFrame, provenance: dict[str, str], resamples: int = RESAMPLES,
                 predict_to: int = LLM_ROWS[-1]) -> dict:
    """What ``lce/decide/noise_scaling.json`` holds (:mod:`lce.decide.noise_scaling` reads it): per candidate and
    dtype at :data:`REFERENCE_D`, per ratio column, the measured worst-family median (and seed interval) at each N
    of the data and the worst family's fitted line with its band at each power of two from the data's first N to
    ``predict_to``, the exponent with its interval, and how the held-out check went."""
    families = rule_families(table[table["D"] == REFERENCE_D])
    entries = []
    for column in RATIO_COLUMNS:
        points_measured = measured(table, column)
        for fit in fits(table, column, resamples=resamples):
            mine = points_measured[(points_measured["candidate"] == fit.candidate)
                                   & (points_measured["dtype"] == fit.dtype)].sort_values("N")
            check = heldout_check(table, fit.candidate, fit.dtype, column, resamples=resamples)
            powers = [2**k for k in range(int(math.log2(min(fit.rows))), int(math.log2(predict_to)) + 1)]
            entries.append({
                "candidate": fit.candidate, "dtype": fit.dtype, "ratio": column,
                "measured": [{"N": int(r["N"]), "ratio": float(r[column]), "low": float(r[f"{column}_low"]),
                              "high": float(r[f"{column}_high"]), "family": r["family"], "seeds": int(r["seeds"])}
                             for r in mine.to_dict("records")],
                "fit": {"exponent": fit.exponent, "exponent_interval": [fit.exponent_low, fit.exponent_high],
                        "levels_log2": fit.line.levels, "residual_spread_log2": fit.line.spread,
                        "band": [{"N": n, **dict(zip(("ratio", "low", "high"), fit.band(n), strict=True))}
                                 for n in powers]},
                "heldout": {"points": len(check), "covered": int(check["covered"].sum()) if len(check) else 0,
                            "largest_error_log2": float(check["error_log2"].abs().max()) if len(check) else None},
            })
    return {"what": ("the error/noise ratios of lce's candidates against the batch size N: measured at the study's N "
                     "(worst family with a nonzero expected gradient, median over seeds), predicted beyond by "
                     "log2(ratio) = level[family] + exponent * log2(N) (worst family; 95% bootstrap band over "
                     "families and seeds)"),
            "bias_limit": BIAS_LIMIT, "D": REFERENCE_D, "C": int(table["C"].iloc[0]), "families": families,
            "entries": entries, "provenance": provenance}


def write_scaling_json(results: Path, path: Path = JSON_FILE, resamples: int = RESAMPLES) -> Path:
    """Fit ``results`` (the study's CSV) and write :func:`scaling_json` to ``path``."""
    import datetime

    from analysis.core.provenance import git_revision
    from analysis.core.results_io import read_table

    table = read_table(results)
    revisions = sorted(table["git_revision"].astype(str).unique())
    provenance = {"fit_date": datetime.date.today().isoformat(), "git_revision": git_revision(),
                  "file": results.name, "rows": str(len(table)), "measured_at_revisions": ", ".join(revisions),
                  "command": "python -m analysis noise-scaling-fit"}
    path.write_text(json.dumps(scaling_json(table, provenance, resamples), indent=1) + "\n", encoding="utf-8")
    return path


# ---- python -m analysis noise-scaling-fit ----------------------------------------------------------------------

DESCRIPTION = ("Fits log2(ratio) = level[family] + exponent * log2(N) to the noise-scaling results per candidate and "
               "dtype (families with a nonzero expected gradient), with bootstrap intervals and a held-out check; "
               "prints the exponents and each candidate's predicted bias/noise at N = 2^17-2^20, and writes "
               "lce/decide/noise_scaling.json. Measures nothing (seconds).")


def add_arguments(parser) -> None:
    from analysis.core.arguments import results_option
    from analysis.studies.noise_scaling import SCALING_FILE

    results_option(parser)
    parser.add_argument("--file", default=SCALING_FILE, metavar="NAME", help=f"results file (default: {SCALING_FILE})")
    parser.add_argument("--out", type=Path, default=JSON_FILE, help="the JSON to write (default: lce's)")


def run(args) -> None:
    from analysis.core.results_io import read_table
    from analysis.paths import display_path

    path = args.results / args.file
    table = read_table(path)
    fits = fit_table(table)
    pd.set_option("display.width", 200)
    print(f"families with a nonzero expected gradient: {', '.join(rule_families(table))}")
    print(fits.to_string(index=False, float_format=lambda value: f"{value:.3g}"))
    written = write_scaling_json(path, args.out)
    print(f"{display_path(written)}: written")
