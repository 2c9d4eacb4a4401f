"""Fit :mod:`lce.decide.error_model`'s constants on committed measurements and validate them on held-out data.

Data: the lce rows of the sweep grids (``quick.csv``, ``medium.csv``; status ok) and of the noise
study on the CUDA layouts (``noise.csv`` emulated on CPU, ``noise_cuda.csv`` on an H200), averaged
over seeds. Each row's :class:`lce.Plan` is rebuilt from its *resolved* policy, acc_dtype and chunk
size (explicit policies without acc_dtype collapse layouts), and the model sees only that plan and
the input statistics of its family and shape (``error_model/stats.csv``, measured by
:func:`measure_family_stats` on seed 0 of each family, rounded to bf16).

The split (:func:`split_of`), stated once here and in the validation file:

* **fit**: families ``random`` and ``trained`` (final and early checkpoints) at N <= 1024;
* **held-out family**: ``calibrated`` (Zipfian heads), every shape;
* **held-out shape**: N = 2048 and every shape with D > 128 or C > 16384, every family.

Constants: every term's ``c_s`` enters linearly in squared floors, so for each candidate GEMM
length exponent the fit is a non-negative least squares on the relative miss of ``floors**2``
(an exhaustive search over which terms are active: seven terms, 128 subsets).
"""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import json
import math
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd
import torch

import lce
from analysis.core.problem import LLM_SHAPES, Shape
from analysis.core.provenance import git_revision
from analysis.paths import RESULTS_DIR, ROOT
from lce.decide import error_model
from lce.decide.error_model import OUTPUTS, TERMS, InputStats, measure_input_stats
from lce.planning.options import EXPLICIT_POLICIES, LinearCrossEntropyOptions
from lce.planning.resolve import make_plan
from lce.testing import cpu_gemms, emulate_device_kind

__all__ = ["stats_pairs", "DETAIL_VALIDATION_FILE", "DETAIL_COLUMNS", "DETAIL_MIN", "GRID_FILES", "NOISE_FILES",
           "STATS_FILE", "VALIDATION_FILE", "CONSTANTS_FILE", "SHARE_BAND",
           "GAMMA_CANDIDATES", "split_of", "load_measurements", "measure_family_stats",
           "load_stats", "plan_for", "predict_rows", "fit", "FitResult", "run", "check",
           "llm_predictions", "summary"]

GRID_FILES: tuple[str, ...] = ("quick.csv", "medium.csv")
NOISE_FILES: tuple[str, ...] = ("noise.csv", "noise_cuda.csv")
STATS_FILE = "error_model/stats.csv"  # model inputs and artifacts, not results kinds: a folder of their own
VALIDATION_FILE = "error_model/validation.csv"
DETAIL_VALIDATION_FILE = "error_model/detail_validation.csv"
DETAIL_COLUMNS: dict[str, str] = {"weight_bias": "bias", "worst_row": "worst_row"}
"""Each detail of :func:`lce.decide.error_model.predict_weight_details` and the measured column it is fitted to."""
DETAIL_MIN = 1e-3
"""Points whose measured detail is below this many floors are neither fitted nor scored (a bias that small is the
sign noise of an error unrelated to the gradient; a relative miss on it says nothing)."""
BIAS_QUANTILE = 0.95
"""The bias bound's constants are this quantile of the fit split (see :mod:`lce.decide.error_model`)."""
BIAS_SMALL_EXCESS = 0.1
"""Below this predicted ``floors**2 - 1`` a point fits the bound's ``rounding`` constant, above it ``excess``."""
CONSTANTS_FILE: Path = ROOT / "lce" / "decide" / "error_model.json"
SHARE_BAND = 0.25
"""A prediction counts as a hit when ``|predicted / measured - 1| <= SHARE_BAND``."""
GAMMA_CANDIDATES: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)
"""GEMM summation-length exponents tried (0: blocked sums whose error does not grow; 1: worst case)."""
FIT_FAMILIES: tuple[str, ...] = ("random", "trained", "trained:early", "trained:final")
FIT_MAX_ROWS = 1024
FIT_MAX_FEATURES, FIT_MAX_CLASSES = 128, 16384

LLM_CHUNKINGS: tuple[str, ...] = ("aspect_ratio", "aspect_ratio:2", "chunks:1", "chunks:16", "chunks:256",
                                  "chunks:1024")
LLM_POLICIES: tuple[str, ...] = EXPLICIT_POLICIES
MEASURED_COLUMNS = ["source", "device", "kind", "dtype", "acc_dtype", "policy", "N", "D", "C", "chunk_size",
                    "num_chunks", "family", "output", "measured", "seeds", "bias", "worst_row"]
"""One row per measured point; ``bias`` and ``worst_row`` (the weight gradient's rows only): the seed-mean of
``|grad_weight_bias_in_floors|`` (the error's component along the exact gradient, over the Frobenius floor) and of
``grad_weight_row_max`` (the worst class row's error in that row's floors; the grids only)."""


def split_of(family: str, shape: Shape) -> str:
    """``"fit"``, ``"held-out family"`` or ``"held-out shape"`` (the family takes precedence)."""
    if family not in FIT_FAMILIES:
        return "held-out family"
    if shape.N > FIT_MAX_ROWS or shape.D > FIT_MAX_FEATURES or shape.C > FIT_MAX_CLASSES:
        return "held-out shape"
    return "fit"


# ---- measurements ---------------------------------------------------------------------------------------
def _grid_rows(path: Path) -> pd.DataFrame:
    table = pd.read_csv(path)
    table = table[(table["op"] == "lce") & (table["status"] == "ok")]
    keys = ["device", "dtype", "resolved_acc_dtype", "resolved_policy", "N", "D", "C", "chunk_size", "num_chunks",
            "family"]
    table = table.assign(_bias=table["grad_weight_bias_in_floors"].abs())
    frames = []
    for output in OUTPUTS:
        grouped = table.groupby(keys)[f"{output}_fro_in_floors"].agg(["mean", "count"]).reset_index()
        if output == "grad_weight":
            details = table.groupby(keys)[["_bias", "grad_weight_row_max"]].mean().reset_index(drop=True)
            grouped = grouped.assign(bias=details["_bias"].to_numpy(),
                                     worst_row=details["grad_weight_row_max"].to_numpy())
        frames.append(grouped.rename(columns={"resolved_acc_dtype": "acc_dtype", "resolved_policy": "policy",
                                              "mean": "measured", "count": "seeds"}).assign(output=output))
    rows = pd.concat(frames, ignore_index=True)
    rows["kind"] = np.where(rows["device"] == "cpu", "cpu", "cuda")
    return rows.assign(source=path.name)


def _noise_rows(path: Path) -> pd.DataFrame:
    table = pd.read_csv(path)
    table = table[(table["op"] == "lce") & (table["layout"] == "cuda")
                  & table["policy"].isin(EXPLICIT_POLICIES)]
    table = table.assign(chunk_size=table["N"] // table["num_chunks"], acc_dtype="float32")
    keys = ["device", "dtype", "acc_dtype", "policy", "N", "D", "C", "chunk_size", "num_chunks", "family"]
    table = table.assign(_bias=table["grad_weight_bias_in_floors"].abs())
    frames = []
    for output in OUTPUTS:
        grouped = table.groupby(keys)[f"{output}_floors"].agg(["mean", "count"]).reset_index()
        if output == "grad_weight":  # the noise study records no per-row errors
            grouped = grouped.assign(bias=table.groupby(keys)["_bias"].mean().to_numpy())
        frames.append(grouped.rename(columns={"mean": "measured", "count": "seeds"}).assign(output=output))
    return pd.concat(frames, ignore_index=True).assign(kind="cuda", source=path.name)


def load_measurements(results: Path = RESULTS_DIR) -> pd.DataFrame:
    """One row per (file, device, plan numerics, shape, family, output): the seed-mean ``fro_in_floors``."""
    frames = [_grid_rows(results / name) for name in GRID_FILES if (results / name).exists()]
    frames += [_noise_rows(results / name) for name in NOISE_FILES if (results / name).exists()]
    if not frames:
        raise FileNotFoundError(f"no measurements in {results}: expected {GRID_FILES + NOISE_FILES}")
    rows = pd.concat(frames, ignore_index=True).reindex(columns=MEASURED_COLUMNS)
    rows = rows.astype({"N": int, "D": int, "C": int, "chunk_size": int, "num_chunks": int})
    # Policies that resolve to the same numerics measured the same run twice over: count each once per file.
    return rows.assign(_key=rows["measured"].round(9)).drop_duplicates(
        ["source", "kind", "dtype", "acc_dtype", "N", "D", "C", "chunk_size", "family", "output", "_key"]
    ).drop(columns="_key").reset_index(drop=True)


# ---- input statistics -----------------------------------------------------------------------------------
def measure_family_stats(pairs: Iterable[tuple[str, Shape]]) -> pd.DataFrame:
    """:class:`InputStats` of each (family, shape): seed 0, inputs rounded to bf16 once (as the runs did)."""
    from analysis.core.families import draw
    from analysis.core.provenance import provenance

    rows = []
    for family, shape in pairs:
        tensors = draw(family, shape, seed=0)
        bias = None if tensors.bias is None else tensors.bias.bfloat16()
        stats = measure_input_stats(tensors.x.bfloat16(), tensors.weight.bfloat16(), tensors.target, bias=bias)
        rows.append({"family": family, "N": shape.N, "D": shape.D, "C": shape.C, **dataclasses.asdict(stats),
                     **provenance("cpu")})
    return pd.DataFrame(rows)


def load_stats(results: Path = RESULTS_DIR) -> dict[tuple[str, Shape], InputStats]:
    """The committed statistics per (family, shape)."""
    table = pd.read_csv(results / STATS_FILE)
    names = [field.name for field in dataclasses.fields(InputStats)]
    return {(row.family, Shape(int(row.N), int(row.D), int(row.C))): InputStats(**{n: float(getattr(row, n))
                                                                                   for n in names})
            for row in table.itertuples()}


def _family_key(family: str) -> str:
    return "trained:final" if family == "trained" else family


# ---- the model on the rows -----------------------------------------------------------------------------
def plan_for(kind: str, dtype: str, acc_dtype: str, policy: str, shape: Shape, chunk_size: int) -> lce.Plan:
    """The plan a row ran, rebuilt from its resolved values (no tensors needed), as on a CPU whose bf16/fp16 GEMMs are
    native: the grids' rows ran that way (on an emulating CPU with ``LCE_CPU_GEMMS=native``), and the fit must not
    depend on the CPU it is made on."""
    options = LinearCrossEntropyOptions(acc_policy=policy, acc_dtype=getattr(torch, acc_dtype), chunking_method=None,
                                        batch_chunk_size=chunk_size)
    with emulate_device_kind(kind), cpu_gemms("native"):
        return make_plan(options, num_rows=shape.N, in_features=shape.D, num_classes=shape.C,
                         dtype=getattr(torch, dtype), device=torch.device("cpu"))


def _features(rows: pd.DataFrame, stats: dict[tuple[str, Shape], InputStats], gamma: float | None = None
              ) -> np.ndarray:
    """The model's ``f_s`` per row (rows x TERMS), with GEMM length exponent ``gamma`` (default: the fitted one)."""
    features = []
    for row in rows.itertuples():
        shape = Shape(row.N, row.D, row.C)
        plan = plan_for(row.kind, row.dtype, row.acc_dtype, row.policy, shape, row.chunk_size)
        terms = error_model.source_terms(plan, stats[(_family_key(row.family), shape)], gamma)[row.output]
        features.append([terms[name] for name in TERMS])
    return np.array(features)


def predict_rows(rows: pd.DataFrame, stats: dict[tuple[str, Shape], InputStats]) -> np.ndarray:
    """:func:`lce.decide.error_model.predict_errors` for each measured row, with its family's statistics."""
    constants = error_model.load_constants()
    weights = np.array([constants.terms[name] for name in TERMS])
    return np.sqrt(1.0 + _features(rows, stats) @ weights)


def _nonnegative_fit(features: np.ndarray, measured: np.ndarray, offset: float = 1.0) -> tuple[np.ndarray, float]:
    """Minimise ``sum ((offset + F c) / m**2 - 1)**2`` over ``c >= 0``: the best feasible subset of terms."""
    a = features / measured[:, None] ** 2
    b = 1.0 - offset / measured ** 2
    best, best_loss = np.zeros(features.shape[1]), float(np.sum(b ** 2))
    used = [j for j in range(features.shape[1]) if np.any(a[:, j] > 0)]
    for size in range(1, len(used) + 1):
        for subset in itertools.combinations(used, size):
            coefficients, *_ = np.linalg.lstsq(a[:, subset], b, rcond=None)
            if np.any(coefficients < 0):
                continue
            loss = float(np.sum((a[:, subset] @ coefficients - b) ** 2))
            if loss < best_loss:
                best_loss, best = loss, np.zeros(features.shape[1])
                best[list(subset)] = coefficients
    return best, best_loss


@dataclasses.dataclass(frozen=True)
class FitResult:
    """Fitted constants (as :mod:`lce.decide.error_model` stores them) and the rows with their predictions."""

    constants: dict
    rows: pd.DataFrame
    detail_rows: pd.DataFrame


def fit(measurements: pd.DataFrame, stats: dict[tuple[str, Shape], InputStats]) -> FitResult:
    """Fit the constants on the ``fit`` split; return them with every row's prediction and miss."""
    rows = measurements.copy()
    rows["split"] = [split_of(r.family, Shape(r.N, r.D, r.C)) for r in rows.itertuples()]
    train = (rows["split"] == "fit").to_numpy()
    best = None
    for gamma in GAMMA_CANDIDATES:
        features = _features(rows, stats, gamma)
        coefficients, loss = _nonnegative_fit(features[train], rows["measured"].to_numpy()[train])
        if best is None or loss < best[2] - 1e-12:
            best = (gamma, coefficients, loss, features)
    gamma, coefficients, _, features = best
    rows["predicted"] = np.sqrt(1.0 + features @ coefficients)
    rows["relative_miss"] = rows["predicted"] / rows["measured"] - 1.0
    details, detail_rows = _fit_details(rows, features, train)
    worst = _worst_stats(stats, coefficients, gamma)
    held_out = rows[rows["split"] != "fit"]
    accuracy = (f"within ±{SHARE_BAND:.0%} on held-out data for "
                f"{np.mean(held_out['relative_miss'].abs() <= SHARE_BAND):.0%} of {len(held_out)} points "
                f"(fit: {np.mean(rows.loc[train, 'relative_miss'].abs() <= SHARE_BAND):.0%} of {int(train.sum())})")
    constants = {
        "terms": {name: _round(value) for name, value in zip(TERMS, coefficients, strict=True)},
        "gemm_length_exponent": gamma,
        "worst_stats": {name: _round(value) for name, value in dataclasses.asdict(worst).items()},
        "accuracy": accuracy,
        "details": details,
        "provenance": {"fit_date": datetime.date.today().isoformat(), "git_revision": git_revision(),
                       "files": ", ".join([*GRID_FILES, *NOISE_FILES, STATS_FILE]),
                       "rows": f"{int(train.sum())} fit, {int((~train).sum())} held out "
                               "(analysis.studies.error_model.split_of)",
                       "command": "python -m analysis error-model"},
    }
    return FitResult(constants, rows.drop(columns=list(DETAIL_COLUMNS.values())), detail_rows)


def _accuracy_text(rows: pd.DataFrame) -> str:
    held_out, fitted = rows[rows["split"] != "fit"], rows[rows["split"] == "fit"]
    within_two = np.mean((held_out["predicted"] / held_out["measured"]).between(0.5, 2.0))
    return (f"within ±{SHARE_BAND:.0%} on held-out data for {hit_share(held_out):.0%} of {len(held_out)} points, "
            f"within 2x for {within_two:.0%} (fit: {hit_share(fitted):.0%} of {len(fitted)} within ±{SHARE_BAND:.0%})")


def _bound_text(rows: pd.DataFrame) -> str:
    held_out, fitted = rows[rows["split"] != "fit"], rows[rows["split"] == "fit"]
    covered = np.mean(held_out["predicted"] >= held_out["measured"])
    return (f"an upper bound: at or above the measurement for {covered:.0%} of {len(held_out)} held-out points "
            f"(fit: {np.mean(fitted['predicted'] >= fitted['measured']):.0%} of {len(fitted)}), a median "
            f"{np.median(held_out['predicted'] / held_out['measured']):.1f}x the measurement there")


def _fit_details(rows: pd.DataFrame, features: np.ndarray, train: np.ndarray) -> tuple[dict, pd.DataFrame]:
    """Fit each detail of :data:`DETAIL_COLUMNS` on the weight gradient's ``fit`` points, with the Frobenius fit's
    features and predictions; return the constants (as ``lce/decide/error_model.json`` stores them) and every scored
    point
    with its prediction."""
    weight = (rows["output"] == "grad_weight").to_numpy()
    excess = rows["predicted"].to_numpy() ** 2 - 1.0
    constants, frames = {}, []
    for detail, column in DETAIL_COLUMNS.items():
        measured = rows[column].to_numpy(dtype=float)
        scored = weight & np.isfinite(measured) & (np.nan_to_num(measured) >= DETAIL_MIN)
        fitted = scored & train
        if detail == "weight_bias":
            small = fitted & (excess <= BIAS_SMALL_EXCESS)
            large = fitted & (excess > BIAS_SMALL_EXCESS)
            values = {"rounding": float(np.quantile(measured[small], BIAS_QUANTILE)),
                      "excess": float(np.quantile(measured[large] / np.sqrt(excess[large]), BIAS_QUANTILE))}
            values = {name: _round(value) for name, value in values.items()}
            predicted = values["rounding"] + values["excess"] * np.sqrt(np.maximum(excess, 0.0))
        else:
            coefficients, _ = _nonnegative_fit(features[fitted], measured[fitted])
            values = {name: _round(value) for name, value in zip(TERMS, coefficients, strict=True)}
            predicted = np.sqrt(1.0 + features @ np.array([values[name] for name in TERMS]))
        frame = rows.loc[scored].drop(columns=list(DETAIL_COLUMNS.values())).assign(
            output=detail, measured=measured[scored], predicted=predicted[scored])
        frame["relative_miss"] = frame["predicted"] / frame["measured"] - 1.0
        text = _bound_text(frame) if detail == "weight_bias" else _accuracy_text(frame)
        constants[detail] = {"terms": values, "accuracy": text}
        frames.append(frame)
    return constants, pd.concat(frames, ignore_index=True)


def _round(value: float) -> float:
    return float(f"{value:.4g}")


def _worst_stats(stats: dict[tuple[str, Shape], InputStats], coefficients: np.ndarray, gamma: float) -> InputStats:
    """The committed (family, shape) whose statistics predict the largest errors on a probe of plans: the
    conservative default of ``predict_errors``."""
    def score(candidate: InputStats) -> float:
        values = [candidate.weight_dz_share, candidate.weight_logit_share, candidate.input_dz_share,
                  candidate.input_logit_share, candidate.input_cancellation]
        return candidate.weight_signal_fraction * 1e3 + sum(math.log1p(v) for v in values)

    return max(stats.values(), key=score)


def stats_pairs(measurements: pd.DataFrame) -> list[tuple[str, Shape]]:
    """Every (family, shape) the measurements need statistics for."""
    pairs = measurements[["family", "N", "D", "C"]].drop_duplicates()
    return sorted({(_family_key(r.family), Shape(int(r.N), int(r.D), int(r.C))) for r in pairs.itertuples()})


def hit_share(rows: pd.DataFrame) -> float:
    """Share of rows whose prediction is within :data:`SHARE_BAND` of the measurement."""
    return float(np.mean(rows["relative_miss"].abs() <= SHARE_BAND)) if len(rows) else math.nan


def fit_and_write(results: Path = RESULTS_DIR, constants_file: Path = CONSTANTS_FILE, *, remeasure_stats: bool = False
        ) -> tuple[FitResult, list[Path]]:
    """Fit, then write the validation file and the constants; statistics are measured first when missing
    (or with ``remeasure_stats``). Returns the fit and the files written."""
    measurements = load_measurements(results)
    written = []
    (results / STATS_FILE).parent.mkdir(parents=True, exist_ok=True)
    if remeasure_stats or not (results / STATS_FILE).exists():
        measure_family_stats(stats_pairs(measurements)).to_csv(results / STATS_FILE, index=False)
        written.append(results / STATS_FILE)
    result = fit(measurements, load_stats(results))
    result.rows.to_csv(results / VALIDATION_FILE, index=False, float_format="%.6g")
    result.detail_rows.to_csv(results / DETAIL_VALIDATION_FILE, index=False, float_format="%.6g")
    constants_file.write_text(json.dumps(result.constants, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    error_model.load_constants.cache_clear()
    return result, [*written, results / VALIDATION_FILE, results / DETAIL_VALIDATION_FILE, constants_file]


def check(results: Path = RESULTS_DIR, constants_file: Path = CONSTANTS_FILE) -> list[str]:
    """Refit from the committed files without writing; the differences from ``constants_file`` beyond the
    stored rounding (empty when it is up to date)."""
    committed = json.loads(constants_file.read_text(encoding="utf-8"))
    refit = fit(load_measurements(results), load_stats(results)).constants
    problems = [f"{name}: committed {committed['terms'].get(name)}, refit {value}"
                for name, value in refit["terms"].items()
                if not math.isclose(committed["terms"].get(name, math.nan), value, rel_tol=1e-3, abs_tol=1e-9)]
    if committed["gemm_length_exponent"] != refit["gemm_length_exponent"]:
        problems.append(f"gemm_length_exponent: committed {committed['gemm_length_exponent']}, "
                        f"refit {refit['gemm_length_exponent']}")
    if committed["accuracy"] != refit["accuracy"]:
        problems.append(f"accuracy: committed {committed['accuracy']!r}, refit {refit['accuracy']!r}")
    for detail, entry in refit["details"].items():
        stored = committed.get("details", {}).get(detail, {"terms": {}, "accuracy": None})
        problems += [f"{detail} {name}: committed {stored['terms'].get(name)}, refit {value}"
                     for name, value in entry["terms"].items()
                     if not math.isclose(stored["terms"].get(name, math.nan), value, rel_tol=1e-3, abs_tol=1e-9)]
        if stored["accuracy"] != entry["accuracy"]:
            problems.append(f"{detail} accuracy: committed {stored['accuracy']!r}, refit {entry['accuracy']!r}")
    return problems


def _chunk_size(shape: Shape, chunking: str) -> int:
    if chunking.startswith("chunks:"):
        return -(-shape.N // int(chunking.removeprefix("chunks:")))
    from lce.planning.options import parse_chunking_method
    from lce.planning.plan import aspect_ratio_chunk_size

    return aspect_ratio_chunk_size(shape.N, shape.D, shape.C, parse_chunking_method(chunking))


def llm_predictions(shapes: Iterable[Shape] = LLM_SHAPES, dtypes: Iterable[str] = ("bfloat16", "float16"),
                    stats: InputStats | None = None) -> pd.DataFrame:
    """Predicted floors at LLM heads per device kind, dtype, policy (acc fp32) and chunking: every row is an
    *extrapolation* (the fit saw N <= 1024, D = 128, C = 16384), marked so in its ``status`` column."""
    rows = []
    for shape, dtype, kind, policy, chunking in itertools.product(shapes, dtypes, ("cpu", "cuda"), LLM_POLICIES,
                                                                 LLM_CHUNKINGS):
        plan = plan_for(kind, dtype, "float32", policy, shape, _chunk_size(shape, chunking))
        predicted = error_model.predict_errors(plan, stats)
        rows.append({"shape": f"{shape.N}x{shape.D}x{shape.C}", "N": shape.N, "D": shape.D, "C": shape.C,
                     "dtype": dtype, "kind": kind, "policy": policy, "layout_policy": _layout_name(plan),
                     "chunking": chunking, "num_chunks": plan.num_chunks, **predicted,
                     "status": "prediction (extrapolation)"})
    return pd.DataFrame(rows)


def _layout_name(plan: lce.Plan) -> str:
    from lce.planning.policies import LAYOUTS

    for name, layout in LAYOUTS[plan.device_kind].items():
        if layout == plan.layout:
            return name
    return "custom"


def summary(rows: pd.DataFrame, worst: int = 5) -> dict:
    """Validation summary: hit shares per split and the worst held-out misses (as text)."""
    held_out = rows[rows["split"] != "fit"]
    misses = held_out.reindex(held_out["relative_miss"].abs().sort_values(ascending=False).index).head(worst)
    return {"fit": (hit_share(rows[rows["split"] == "fit"]), int((rows["split"] == "fit").sum())),
            "held_out": (hit_share(held_out), len(held_out)),
            "per_split": {split: (hit_share(group), len(group)) for split, group in rows.groupby("split")},
            "worst": [point_name(row) + f": predicted {row.predicted:.2f}, measured {row.measured:.2f}"
                      for row in misses.itertuples()]}


def point_name(row) -> str:
    """A validation point in words: shape, family, dtype/acc, layout kind, policy, chunks, output."""
    return (f"{row.N}x{row.D}x{row.C} {row.family} {row.dtype}/{row.acc_dtype} {row.kind} {row.policy} "
            f"k={row.num_chunks} {row.output}")


# ---- python -m analysis error-model --------------------------------------------------------------------------

DESCRIPTION = ("Reads the sweep grids and the noise study, fits lce/decide/error_model.json's constants on random and "
               "trained inputs at N <= 1024, and writes analysis/results/error_model/validation.csv (prediction, "
               "measurement and split of every point; calibrated inputs and larger shapes are held out). "
               "Seconds. --check refits without writing and exits with 1 if the committed constants differ.")


def add_arguments(parser) -> None:
    from analysis.core.arguments import results_option

    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if the constants are out of date")
    parser.add_argument("--remeasure-stats", action="store_true",
                        help="measure each family's input statistics again (error_model/stats.csv; about 20 s)")
    results_option(parser)


def run(args) -> int:
    from analysis.paths import display_path

    if args.check:
        problems = check(args.results)
        for problem in problems:
            print(f"lce/decide/error_model.json is out of date: {problem}")
        return 1 if problems else 0
    result, paths = fit_and_write(args.results, remeasure_stats=args.remeasure_stats)
    print(result.constants["accuracy"])
    for detail, entry in result.constants["details"].items():
        print(f"{detail}: {entry['accuracy']}")
    for line in summary(result.rows)["worst"]:
        print(f"  worst held-out miss: {line}")
    for path in paths:
        print(display_path(path))
    return 0
