"""Notebook 07 (the error model, ``lce.recommend``, budgets): its figures, the recommend tables (predictions of
lce's models), the key numbers its prose quotes (each claim asserted in tests/claims/test_nb07_choosing_options.py)
and its README blocks.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import torch

import lce
from analysis.core.problem import CCE_SHAPE, DTYPES, LLM_SHAPES, Shape
from analysis.core.results_io import load_kind
from analysis.report.style import PALETTE, CaptionedFigure, apply_style, log_axes, new_figure
from analysis.report.tables import markdown_table
from analysis.studies.budgets import BUDGET_TOLERANCE
from analysis.studies.error_model import SHARE_BAND, hit_share, point_name
from lce.decide.recommendation import DEFAULT_MAX_ERROR, candidates
from lce.planning.options import EXPLICIT_POLICIES
from lce.planning.policies import auto_pick
from lce.testing import emulate_device_kind


def _shape_label(row) -> str:
    return f"{row.N}x{row.D}x{row.C}"


def plot_budgets(budgets: pd.DataFrame) -> CaptionedFigure | None:
    """Left: measured and predicted peak over the budget, per budget; right: predicted against measured error."""
    if budgets.empty:
        return None
    apply_style()
    fig = new_figure(10.5, 4.2)
    memory, error = fig.subplots(1, 2)
    data = budgets.assign(shape=[_shape_label(row) for row in budgets.itertuples()],
                          budget_multiple=budgets["budget_bytes"] / budgets["gradients_bytes"])
    for (shape, group), marker in zip(data.groupby("shape", sort=False), "osD^v", strict=False):
        group = group.sort_values("budget_multiple")
        memory.plot(group["budget_multiple"], group["measured_peak_bytes"] / group["budget_bytes"], marker=marker,
                    label=f"{shape} measured")
        memory.plot(group["budget_multiple"], group["predicted_peak_bytes"] / group["budget_bytes"], marker=marker,
                    ls=":", color=memory.lines[-1].get_color(), alpha=0.6, label=f"{shape} predicted")
        for output, colour in (("grad_weight", "tab:red"), ("grad_input", "tab:blue")):
            error.scatter(group[f"{output}_floors"], group[f"predicted_{output}_floors"], marker=marker, s=22,
                          color=colour, alpha=0.75, label=f"{output}, {shape}")
    memory.axhline(BUDGET_TOLERANCE, color="k", lw=0.8, ls="--")
    memory.axhline(1.0, color="0.5", lw=0.8)
    log_axes(memory, y=False)
    memory.set_xlabel("budget (multiples of the bf16 gradients' bytes; rightmost: lce auto's peak)")
    memory.set_ylabel("peak extra memory / budget")
    memory.set_title(f"Recommended options stay within {BUDGET_TOLERANCE:g}x the budget")
    memory.legend(fontsize=6, ncol=2)
    top = max(data["grad_weight_floors"].max(), data["predicted_grad_weight_floors"].max(),
              data["grad_input_floors"].max()) * 1.2
    error.plot([0.9, top], [0.9, top], color="k", lw=0.8)
    log_axes(error)
    error.set_xlabel("measured error (floors)")
    error.set_ylabel("predicted by lce.decide.error_model (floors)")
    error.set_title("Error of the recommended options")
    error.legend(fontsize=6)
    families = ", ".join(sorted(data["family"].unique()))
    caption = ("lce.recommend on CPU for bf16 inputs, one budget per point: lce auto's own peak (the default) and "
               "multiples of the gradients' bytes down to 1.05x. Left: the peak of one forward + backward of the "
               "recommended options, measured in a fresh process (solid) and predicted by lce's memory model "
               f"(dotted), over the budget; the dashed line is {BUDGET_TOLERANCE:g}x. Right: each gradient's "
               f"measured error against the error model's prediction ({families} inputs, seed 0). Where the default "
               "error limit could not be met within a budget, recommend chose the least predicted error that fits "
               "(budgets.csv: default_limit_met).")
    return CaptionedFigure(fig, "recommend_budgets", caption)


def plot_class_tiling(tiling: pd.DataFrame) -> CaptionedFigure | None:
    """Time of one forward + backward against the number of class blocks, per policy, relative to untiled."""
    if tiling.empty:
        return None
    apply_style()
    fig = new_figure(6.5, 4.2)
    ax = fig.add_subplot()
    for policy, group in tiling.groupby("policy", sort=False):
        group = group.sort_values("num_class_chunks")
        ax.plot(group["num_class_chunks"], group["time_ratio"], marker="o", color=PALETTE.get(policy),
                label=f"{policy} (untiled {group['time_median_s'].iloc[0]:.2f} s)")
        for row in group.itertuples():
            ax.annotate(f"{row.measured_peak_bytes / 2**20:.0f} MiB", (row.num_class_chunks, row.time_ratio),
                        xytext=(4, 4), textcoords="offset points", fontsize=6)
    log_axes(ax, y=False, x_base=2)
    ax.axhline(1.0, color="0.5", lw=0.8)
    ax.set_xlabel("class blocks (1 = the whole vocabulary per chunk of rows)")
    ax.set_ylabel("time / untiled time (same policy, same rows per chunk)")
    ax.set_title("What class tiling costs")
    ax.legend(fontsize=7)
    row = tiling.iloc[0]
    caption = (f"lce at N={row.N} D={row.D} C={row.C} ({row.dtype}, {row.family} inputs, CPU), "
               f"{row.batch_chunk_size} rows per chunk, one process: each policy with the vocabulary whole and cut "
               "into blocks (an online log-sum-exp over the blocks, then every block's logits computed again for "
               "the gradients). Labels: measured peak extra memory.")
    return CaptionedFigure(fig, "class_tiling_cost", caption)


def draw_budget_figures(budgets: pd.DataFrame, tiling: pd.DataFrame) -> list[CaptionedFigure]:
    """Every figure this module draws that has data."""
    return [figure for figure in (plot_budgets(budgets), plot_class_tiling(tiling)) if figure is not None]

SPLIT_STYLES = {"fit": ("o", (0.6, 0.6, 0.6)), "held-out family": ("s", "tab:red"),
                "held-out shape": ("^", "tab:blue")}


def plot_error_model_validation(rows: pd.DataFrame, annotate: int = 4) -> CaptionedFigure | None:
    """Predicted against measured floors (log-log) with the ±25% band; fit and held-out points apart."""
    if rows.empty:
        return None
    apply_style()
    fig = new_figure(6.5, 5.5)
    ax = fig.add_subplot()
    low, high = 0.9, max(rows["measured"].max(), rows["predicted"].max()) * 1.2
    line = np.geomspace(low, high, 50)
    ax.fill_between(line, line * (1 - SHARE_BAND), line * (1 + SHARE_BAND), color="0.9", label=f"±{SHARE_BAND:.0%}")
    ax.plot(line, line, color="k", lw=0.8)
    for split, (marker, colour) in SPLIT_STYLES.items():
        group = rows[rows["split"] == split]
        if len(group):
            ax.scatter(group["measured"], group["predicted"], marker=marker, s=16, color=colour, alpha=0.7,
                       label=f"{split}: {hit_share(group):.0%} of {len(group)} within ±{SHARE_BAND:.0%}")
    held_out = rows[rows["split"] != "fit"]
    worst = held_out.reindex(held_out["relative_miss"].abs().sort_values(ascending=False).index)
    worst = worst.drop_duplicates(["N", "D", "C", "family", "dtype", "acc_dtype", "output"]).head(annotate)
    for number, row in enumerate(worst.itertuples()):
        ax.annotate(point_name(row), (row.measured, row.predicted), xytext=(8, -12 - 10 * number),
                    textcoords="offset points", fontsize=6, arrowprops={"arrowstyle": "-", "lw": 0.5})
    log_axes(ax)
    ax.set_xlim(low, high)
    ax.set_ylim(low, high)
    ax.set_xlabel("measured error (multiples of the rounding floor)")
    ax.set_ylabel("predicted by lce.decide.error_model")
    ax.set_title(f"Error model: {hit_share(held_out):.0%} of held-out points within ±{SHARE_BAND:.0%}")
    ax.legend(loc="upper left", fontsize=7)
    caption = (f"lce.decide.error_model's predicted Frobenius error of grad_input and grad_weight against the "
               f"measured one "
               f"(seed means of quick.csv, medium.csv, noise.csv, noise_cuda.csv), in rounding floors. Grey: the "
               f"points the constants were fitted on (random and trained inputs, N <= 1024); red: calibrated "
               f"inputs, never fitted; blue: larger shapes. The shaded band is ±{SHARE_BAND:.0%}; the worst "
               f"held-out misses are named.")
    return CaptionedFigure(fig, "error_model_validation", caption)


def plot_error_model_llm(predictions: pd.DataFrame) -> CaptionedFigure | None:
    """Predicted grad_weight floors against the chunk count at each LLM head, per policy (bf16, CUDA layouts)."""
    rows = predictions[(predictions["dtype"] == "bfloat16") & (predictions["kind"] == "cuda")]
    if rows.empty:
        return None
    apply_style()
    shapes = list(dict.fromkeys(rows["shape"]))
    fig = new_figure(4.0 * len(shapes), 3.6)
    axes = fig.subplots(1, len(shapes), sharey=True, squeeze=False)[0]
    for ax, shape in zip(axes, shapes, strict=True):
        for policy, group in rows[rows["shape"] == shape].groupby("policy"):
            group = group.sort_values("num_chunks").drop_duplicates("num_chunks")
            ax.plot(group["num_chunks"], group["grad_weight"], marker="o", color=PALETTE.get(policy), label=policy)
        log_axes(ax, x_base=2)
        ax.set_title(f"N x D x C = {shape}", fontsize=9)
        ax.set_xlabel("chunks")
    axes[0].set_ylabel("predicted grad_weight error (floors)")
    axes[0].legend(fontsize=7)
    fig.suptitle("PREDICTIONS (extrapolated, not measured): bf16 at LLM heads, CUDA layouts, acc fp32")
    caption = ("Extrapolation, not measurement: lce.decide.error_model's predicted weight-gradient error at three LLM "
               "output heads in bf16 on the CUDA layouts (fp32 acc_dtype), against the chunk count (aspect-ratio "
               "chunkings and fixed counts), with the conservative default statistics (calibrated Zipfian "
               "inputs). The model was fitted at N <= 1024, D = 128, C = 16384.")
    return CaptionedFigure(fig, "error_model_llm", caption)


def draw_error_model_figures(validation: pd.DataFrame, predictions: pd.DataFrame) -> list[CaptionedFigure]:
    """Both figures, where their data exists."""
    drawn = [plot_error_model_validation(validation), plot_error_model_llm(predictions)]
    return [figure for figure in drawn if figure is not None]

CCE_REPORTED_MB = 1164
"""Cut Cross-Entropy's reported memory at CCE_SHAPE (bf16), against a lower bound of 1161 MB: the gradients."""
LLM_BUDGET_MULTIPLES: tuple[float | None, ...] = (None, 1.2, 1.05)
"""Budgets of the LLM table: none (the objective alone), then multiples of the bf16 gradients."""


def _gradient_bytes(shape: Shape, dtype: torch.dtype) -> int:
    return (shape.N + shape.C) * shape.D * dtype.itemsize


def llm_recommendations(dtype: torch.dtype = torch.bfloat16, devices: tuple[str, ...] = ("cuda", "cpu"),
                        multiples: tuple[float | None, ...] = LLM_BUDGET_MULTIPLES) -> pd.DataFrame:
    """recommend's pick per LLM head, device and budget: options, predicted peak and errors (all predictions).

    Where the default error limit cannot be met within a budget, the row holds the least predicted error that
    fits and ``default_limit_met`` is False.
    """
    from lce.decide.recommendation import RecommendationWarning
    from lce.testing import cpu_gemms

    rows = []
    for shape in LLM_SHAPES:
        for device in devices:
            for multiple in multiples:
                budget = None if multiple is None else int(multiple * _gradient_bytes(shape, dtype))
                # CPU rows: a CPU with native bf16 GEMMs, the same table on every machine; an unmet limit is the
                # table's own column (default_limit_met), not a warning
                with cpu_gemms("native"), warnings.catch_warnings():
                    warnings.simplefilter("ignore", RecommendationWarning)
                    chosen = lce.recommend(shape.N, shape.D, shape.C, dtype, device, memory_budget=budget)
                met = chosen.limit_met
                rows.append(dict(shape=str(shape), device=device,
                                 budget="none" if multiple is None else f"{multiple:g}x gradients",
                                 budget_gib=math.nan if budget is None else budget / 2**30,
                                 choice=chosen.chosen.label(), auto=chosen.auto.label(),
                                 auto_peak_gib=chosen.auto.peak_bytes / 2**30,
                                 peak_gib=chosen.peak_bytes / 2**30, grad_input_floors=chosen.errors["grad_input"],
                                 grad_weight_floors=chosen.errors["grad_weight"], default_limit_met=met,
                                 estimated_s=chosen.chosen.seconds, status="prediction"))
    return pd.DataFrame(rows)


def cce_anchor(dtype: torch.dtype = torch.bfloat16) -> dict[str, float]:
    """At Cut Cross-Entropy's benchmark shape (CUDA layouts): the gradients' MiB, the smallest peak any
    candidate reaches, and the smallest peak meeting the default error limit, with its predicted error."""
    shape = CCE_SHAPE
    pool = candidates(shape.N, shape.D, shape.C, dtype, torch.device("cuda"))
    limit = DEFAULT_MAX_ERROR.get(dtype, math.inf)
    smallest = min(pool, key=lambda c: c.peak_bytes)
    accurate_enough = min((c for c in pool if c.error <= limit), key=lambda c: c.peak_bytes)
    return dict(gradients_mib=_gradient_bytes(shape, dtype) / 2**20, smallest_mib=smallest.peak_bytes / 2**20,
                smallest_label=smallest.label(),
                within_limit_mib=accurate_enough.peak_bytes / 2**20, within_limit_label=accurate_enough.label(),
                within_limit_error=accurate_enough.error, limit=limit)


# --- key numbers: what the notebook's prose quotes and tests/claims/test_nb07_choosing_options.py asserts -------

MISS_KEY = ["N", "D", "C", "family", "dtype", "acc_dtype", "policy", "output"]
"""A validation problem apart from its layout kind and chunk count: the worst misses are listed once per problem,
ties broken by this key, then kind and chunk count, so the list is the same on every machine (issue 21)."""


def validation_numbers(validation: pd.DataFrame, worst: int = 3) -> tuple[pd.DataFrame, pd.DataFrame]:
    """From ``error_model/validation.csv``: per split (and all held out) the points, the share within ±SHARE_BAND
    and the rank (Spearman) correlation of predicted and measured floors; the ``worst`` held-out problems by their
    largest miss (``relative_miss`` = predicted / measured - 1; ``points``: the problem's layouts and chunk counts)."""
    held = validation[validation["split"] != "fit"]
    shares = pd.DataFrame([dict(split=name, points=len(rows), within=hit_share(rows),
                                rank=rows["predicted"].rank().corr(rows["measured"].rank()))
                           for name, rows in [*validation.groupby("split"), ("held out", held)]]).set_index("split")
    key = [*MISS_KEY, "kind", "num_chunks"]
    ranked = held.assign(size=held["relative_miss"].abs()).sort_values(["size", *key],
                                                                       ascending=[False] + [True] * len(key))
    ranked = ranked.assign(points=ranked.groupby(MISS_KEY)["size"].transform("size")).drop_duplicates(MISS_KEY)
    return shares, ranked[[*key, "predicted", "measured", "relative_miss", "points"]].head(worst).reset_index(drop=True)


def prediction_numbers(predictions: pd.DataFrame, dtype: str = "bfloat16", kind: str = "cuda") -> pd.DataFrame:
    """Per head and policy (:func:`~analysis.studies.error_model.llm_predictions`): predicted grad_weight floors with
    one chunk, with "auto" chunking (``chunks``) and with the most chunks; the largest over the smallest prediction
    over every chunking, and whether they rise with each step in the chunk count."""
    auto, rows = auto_pick(kind, DTYPES[dtype]).chunking_method, []
    chosen = predictions[(predictions["dtype"] == dtype) & (predictions["kind"] == kind)]
    for (shape, policy), group in chosen.groupby(["shape", "policy"], sort=False):
        at_auto, group = group[group["chunking"] == auto].iloc[0], group.sort_values("num_chunks")
        weight = group.drop_duplicates("num_chunks")["grad_weight"]
        rows.append(dict(shape=shape, policy=policy, one_chunk=weight.iloc[0], chunks=at_auto.num_chunks,
                         auto=at_auto.grad_weight, most_chunks=group["num_chunks"].max(), at_most=weight.iloc[-1],
                         spread=weight.max() / weight.min(), rises=bool((weight.diff().dropna() > 0).all())))
    return pd.DataFrame(rows)


def recommend_numbers(picks: pd.DataFrame) -> pd.DataFrame:
    """Per device and budget (:func:`llm_recommendations`): heads, how many meet the default error limit and tile
    the vocabulary, the policies picked, the largest predicted peak over the budget and the largest errors."""
    picks = picks.assign(tiled=picks["choice"].str.contains("classes per block"),
                         policy=picks["choice"].str.split(",").str[0], over=picks["peak_gib"] / picks["budget_gib"])
    return picks.groupby(["device", "budget"], sort=False).agg(
        heads=("shape", "size"), limit_met=("default_limit_met", "sum"), tiled=("tiled", "sum"),
        policies=("policy", lambda p: ", ".join(sorted(set(p)))), peak_over_budget=("over", "max"),
        grad_input=("grad_input_floors", "max"), grad_weight=("grad_weight_floors", "max")).reset_index()


def budget_ratios(budgets: pd.DataFrame) -> pd.DataFrame:
    """``budgets.csv`` with the measured peak over the budget and over the memory model, the budget in gradients'
    bytes, and each gradient's miss (predicted / measured floors - 1)."""
    return budgets.assign(over_budget=budgets["measured_peak_bytes"] / budgets["budget_bytes"],
                          over_model=budgets["measured_peak_bytes"] / budgets["predicted_peak_bytes"],
                          multiple=budgets["budget_bytes"] / budgets["gradients_bytes"],
                          **{f"{out}_miss": budgets[f"predicted_{out}_floors"] / budgets[f"{out}_floors"] - 1
                             for out in ("grad_input", "grad_weight")})


def tiling_numbers(tiling: pd.DataFrame) -> pd.DataFrame:
    """Per policy (``class_tiling.csv``): the row-only and the smallest tiled peak (MiB), the saving, and the tiled
    runs' time over the row-only one (lowest, highest)."""
    rows = []
    for policy, group in tiling.groupby("policy", sort=False):
        whole, tiled = group[group["num_class_chunks"] == 1].iloc[0], group[group["num_class_chunks"] > 1]
        smallest = tiled["measured_peak_bytes"].min()
        rows.append(dict(policy=policy, row_only_mib=whole.measured_peak_bytes / 2**20, tiled_mib=smallest / 2**20,
                         saving=1 - smallest / whole.measured_peak_bytes, time_low=tiled["time_ratio"].min(),
                         time_high=tiled["time_ratio"].max()))
    return pd.DataFrame(rows)


TEMPORARIES_SHAPE = Shape(256, 32, 1000)
TEMPORARIES_ROWS = 64
"""Rows per chunk of :func:`planned_peaks`: four chunks, so each layout's weight-gradient sum is a sum (one chunk of
rows needs no accumulator; "auto" on CUDA takes at least 2048 rows, one chunk at this N)."""


def planned_peaks(shape: Shape = TEMPORARIES_SHAPE) -> pd.DataFrame:
    """lce's planned peak extra memory (KiB) per layout table and policy: bf16, fp32 acc_dtype, chunks of
    :data:`TEMPORARIES_ROWS` rows."""
    x = torch.empty(shape.N, shape.D, dtype=torch.bfloat16, device="meta", requires_grad=True)
    w = torch.empty(shape.C, shape.D, dtype=torch.bfloat16, device="meta", requires_grad=True)
    peaks = []
    for kind in ("cpu", "cuda"):
        with emulate_device_kind(kind):
            for policy in EXPLICIT_POLICIES:
                options = lce.LinearCrossEntropyOptions(acc_policy=policy, acc_dtype=torch.float32,
                                                        batch_chunk_size=TEMPORARIES_ROWS, chunking_method=None)
                plan = lce.plan(x, w, options=options)
                peaks.append(dict(layouts=kind, policy=policy, peak_kib=plan.peak_extra_bytes / 1024))
    return pd.DataFrame(peaks)


# --- README blocks ---------------------------------------------------------------------------------------------

def detail_validation(results: Path) -> pd.DataFrame:
    """Per detail of the weight gradient (bias bound, worst row) and split: points, the share the prediction covers
    (at or above the measurement), within ±25% and within 2x, and the median prediction over measurement."""
    from analysis.studies.error_model import DETAIL_VALIDATION_FILE, SHARE_BAND
    from lce.decide.error_model import DETAILS

    rows = pd.read_csv(results / DETAIL_VALIDATION_FILE)
    rows = rows.assign(split=rows["split"].where(rows["split"] == "fit", "held out"),
                       ratio=rows["predicted"] / rows["measured"])
    summary = rows.groupby(["output", "split"]).agg(
        points=("ratio", "size"), covered=("ratio", lambda r: (r >= 1).mean()),
        within=("ratio", lambda r: ((r - 1).abs() <= SHARE_BAND).mean()),
        within_2x=("ratio", lambda r: r.between(0.5, 2.0).mean()), median_ratio=("ratio", "median"),
    ).reset_index().rename(columns={"output": "detail"})
    order = {name: i for i, name in enumerate(DETAILS)}
    return summary.sort_values(["detail", "split"], key=lambda column: column.map(order) if column.name == "detail"
                               else column != "held out", ignore_index=True)


def readme_error_model(results: Path) -> str:
    """The validation's shares and worst held-out misses; predicted floors at LLM heads (extrapolations)."""
    from analysis.studies.error_model import VALIDATION_FILE, llm_predictions

    if not (results / VALIDATION_FILE).exists():
        return "(no error-model validation yet: run `python -m analysis error-model`)\n"
    shares, worst = validation_numbers(pd.read_csv(results / VALIDATION_FILE))
    table = llm_predictions(dtypes=("bfloat16",))
    table = table[table["kind"] == "cuda"]
    chunkings = list(dict.fromkeys(table["chunking"]))
    lines = ["| N x D x C | policy | " + " | ".join(chunkings) + " | grad_input, every chunking |",
             "|---|---|" + "---:|" * (len(chunkings) + 1)]
    for (shape, policy), group in table.groupby(["shape", "policy"], sort=False):
        cells = [f"{row.grad_weight:.1f} (k={row.num_chunks})" for row in group.itertuples()]
        cells.append(f"{group['grad_input'].min():.2f}-{group['grad_input'].max():.2f}")
        lines.append(f"| {shape} | {policy} | " + " | ".join(cells) + " |")
    details = markdown_table(detail_validation(results), {"covered": "{:.0%}", "within": "{:.0%}",
                                                          "within_2x": "{:.0%}", "median_ratio": "{:.2f}"})
    return (markdown_table(shares.reset_index(), {"within": "{:.0%}", "rank": "{:.3f}"}) + "\n"
            + markdown_table(worst, {"predicted": "{:.2f}", "measured": "{:.2f}", "relative_miss": "{:+.0%}"})
            + "\n" + "\n".join(lines) + "\n\nThe weight gradient's details "
                                        "(`lce.decide.error_model.predict_weight_details`; "
            "the bias is a bound, so *covered* is its hit rate; `error_model/detail_validation.csv`):\n\n"
            + details)


def readme_recommend(results: Path) -> str:
    """lce.recommend's picks at LLM heads and the Cut Cross-Entropy anchor (predictions of lce's models)."""
    lines = ["| head (N x D x C) | device | budget | recommended | predicted peak | predicted floors (input, weight) "
             "| auto's plan, peak |",
             "|---|---|---|---|---|---|---|"]
    for row in llm_recommendations().itertuples():
        limit = "" if row.default_limit_met else " (default limit unmet: least error shown)"
        budget = row.budget if row.budget == "none" else f"{row.budget} ({row.budget_gib:.2f} GiB)"
        lines.append(f"| {row.shape} | {row.device} | {budget} | {row.choice} | {row.peak_gib:.2f} GiB | "
                     f"{row.grad_input_floors:.2f}, {row.grad_weight_floors:.2f}{limit} | {row.auto}, "
                     f"{row.auto_peak_gib:.2f} GiB |")
    anchor = cce_anchor()
    limits = ", ".join(f"{str(dtype).removeprefix('torch.')} {limit:g}" for dtype, limit in DEFAULT_MAX_ERROR.items())
    return "\n".join([*lines, "", f"- default error limit (`lce.decide.DEFAULT_MAX_ERROR`, floors): {limits}",
                      f"- Cut Cross-Entropy's shape {CCE_SHAPE} (bf16), the gradients: {anchor['gradients_mib']:,.0f} "
                      f"MiB (CCE reports {CCE_REPORTED_MB} MB)",
                      f"- there, the smallest predicted peak: {anchor['smallest_mib']:,.1f} MiB "
                      f"({anchor['smallest_label']})",
                      f"- there, the smallest within the default limit: {anchor['within_limit_mib']:,.1f} MiB "
                      f"({anchor['within_limit_label']}; {anchor['within_limit_error']:.2f} floors predicted)"]) + "\n"


def readme_budgets(results: Path) -> str:
    """The budgets study and class tiling's cost, as a list of numbers and a table."""
    from analysis.core.results_io import BUDGETS, CLASS_TILING

    (_, budgets), (_, tiling) = (load_kind(results, kind.name) for kind in (BUDGETS, CLASS_TILING))
    if budgets.empty:
        return "(no budgets study yet: run `python -m analysis budgets`)\n"
    b, row = budget_ratios(budgets), budgets.iloc[0]
    lines = [f"- {len(b)} budgets, {b['multiple'].min():.2f}x the gradients' bytes and up, at "
             f"{b[['N', 'D', 'C']].drop_duplicates().shape[0]} shapes ({row['dtype']}, {row.family} inputs, CPU "
             f"{row.cpu_model}, a fresh process each); default error limit met in {int(b['default_limit_met'].sum())}",
             f"- measured peak / budget: {b['over_budget'].min():.3f}-{b['over_budget'].max():.3f} (tolerance "
             f"{BUDGET_TOLERANCE:g}); / memory model: {b['over_model'].min():.3f}-{b['over_model'].max():.3f}"]
    lines += [f"- {out}: measured {b[f'{out}_floors'].min():.2f}-{b[f'{out}_floors'].max():.2f} floors; predicted "
              f"/ measured - 1: {b[f'{out}_miss'].min():+.0%} to {b[f'{out}_miss'].max():+.0%}"
              for out in ("grad_input", "grad_weight")]
    if not tiling.empty:
        row = tiling.iloc[0]
        lines += ["", f"- class tiling: {row.N}x{row.D}x{row.C}, {row.batch_chunk_size} rows per chunk, class blocks "
                  f"{', '.join(map(str, sorted(set(tiling['num_class_chunks']) - {1})))}, one run each", "",
                  markdown_table(tiling_numbers(tiling), {"row_only_mib": "{:.0f}", "tiled_mib": "{:.0f}",
                                                          "saving": "{:.0%}", "time_low": "{:.2f}",
                                                          "time_high": "{:.2f}"}).rstrip("\n")]
    return "\n".join(lines) + "\n"
