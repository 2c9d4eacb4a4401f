"""Notebook 07 (choosing options): its figures, tables, conclusions and README blocks.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import torch

import lce
from analysis.core.problem import LLM_SHAPES, Shape
from analysis.core.results_io import load_kind
from analysis.report.style import PALETTE, CaptionedFigure, apply_style, log_axes, new_figure
from analysis.report.wording import _conclusion, _join, _missing, _range, _shapes
from analysis.studies.error_model import SHARE_BAND, hit_share, point_name, summary
from lce.recommend import DEFAULT_MAX_ERROR, candidates

BUDGET_TOLERANCE = 1.15
"""Measured peak over budget that issue 11 accepts (allocator and kernel workspaces the model does not list)."""


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
    error.set_ylabel("predicted by lce.error_model (floors)")
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
    ax.set_ylabel("predicted by lce.error_model")
    ax.set_title(f"Error model: {hit_share(held_out):.0%} of held-out points within ±{SHARE_BAND:.0%}")
    ax.legend(loc="upper left", fontsize=7)
    caption = (f"lce.error_model's predicted Frobenius error of grad_input and grad_weight against the measured one "
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
    caption = ("Extrapolation, not measurement: lce.error_model's predicted weight-gradient error at three LLM "
               "output heads in bf16 on the CUDA layouts (fp32 acc_dtype), against the chunk count (aspect-ratio "
               "chunkings and fixed counts), with the conservative default statistics (calibrated Zipfian "
               "inputs). The model was fitted at N <= 1024, D = 128, C = 16384.")
    return CaptionedFigure(fig, "error_model_llm", caption)


def draw_error_model_figures(validation: pd.DataFrame, predictions: pd.DataFrame) -> list[CaptionedFigure]:
    """Both figures, where their data exists."""
    drawn = [plot_error_model_validation(validation), plot_error_model_llm(predictions)]
    return [figure for figure in drawn if figure is not None]

CCE_SHAPE = Shape(8192, 2304, 256000)
CCE_REPORTED_MB = 1164
"""Cut Cross-Entropy's reported memory at CCE_SHAPE (bf16), against a lower bound of 1161 MB: the gradients."""
LLM_BUDGET_MULTIPLES: tuple[float | None, ...] = (None, 1.2, 1.05)
"""Budgets of the LLM table: recommend's default (lce auto's peak), then multiples of the bf16 gradients."""


def _gradient_bytes(shape: Shape, dtype: torch.dtype) -> int:
    return (shape.N + shape.C) * shape.D * dtype.itemsize


def llm_recommendations(dtype: torch.dtype = torch.bfloat16, devices: tuple[str, ...] = ("cuda", "cpu"),
                        multiples: tuple[float | None, ...] = LLM_BUDGET_MULTIPLES) -> pd.DataFrame:
    """recommend's pick per LLM head, device and budget: options, predicted peak and errors (all predictions).

    Where the default error limit cannot be met within a budget, the row holds the least predicted error that
    fits and ``default_limit_met`` is False.
    """
    rows = []
    for shape in LLM_SHAPES:
        for device in devices:
            for multiple in multiples:
                budget = None if multiple is None else int(multiple * _gradient_bytes(shape, dtype))
                chosen = lce.recommend(shape.N, shape.D, shape.C, dtype, device, memory_budget=budget)
                met = chosen.limit_met
                rows.append(dict(shape=str(shape), device=device,
                                 budget="auto's peak" if multiple is None else f"{multiple:g}x gradients",
                                 budget_gib=chosen.memory_budget / 2**30, choice=chosen.chosen.label(),
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


def recommend_markdown() -> str:
    """The README passage: recommend's picks at LLM heads (bf16, predictions) and the CCE anchor."""
    table = llm_recommendations()
    lines = ["| head (N x D x C) | device | budget | recommended | predicted peak | predicted floors (input, weight) |",
             "|---|---|---|---|---|---|"]
    for row in table.itertuples():
        limit = "" if row.default_limit_met else " (default limit unmet: least error shown)"
        lines.append(f"| {row.shape} | {row.device} | {row.budget} ({row.budget_gib:.2f} GiB) | {row.choice} | "
                     f"{row.peak_gib:.2f} GiB | {row.grad_input_floors:.2f}, {row.grad_weight_floors:.2f}{limit} |")
    anchor = cce_anchor()
    lines += ["", f"All of the table is predicted by lce's memory and error models (nothing at these shapes ran "
              f"here). At Cut Cross-Entropy's benchmark shape ({CCE_SHAPE}, bf16) the gradients alone take "
              f"{anchor['gradients_mib']:,.0f} MiB (CCE reports {CCE_REPORTED_MB} MB); lce's smallest predicted "
              f"peak is {anchor['smallest_mib']:,.1f} MiB ({anchor['smallest_label']}, impractically slow), and "
              f"the smallest within the default error limit ({anchor['limit']:g} floors) is "
              f"{anchor['within_limit_mib']:,.1f} MiB ({anchor['within_limit_label']}, "
              f"{anchor['within_limit_error']:.2f} floors predicted)."]
    return "\n".join(lines) + "\n"


def budgets_markdown(budgets: pd.DataFrame, tiling: pd.DataFrame) -> str:
    """The README passage: measured peak over budget and errors of the budgets study, and class tiling's cost."""
    if budgets.empty:
        return "(no budgets study yet: run `python -m analysis budgets`)\n"
    ratio = budgets["measured_peak_bytes"] / budgets["budget_bytes"]
    model = budgets["measured_peak_bytes"] / budgets["predicted_peak_bytes"]
    worst = budgets.loc[ratio.idxmax()]
    cpu = budgets["cpu_model"].iloc[0]
    text = [f"Measured (CPU: {cpu}; bf16, {budgets['family'].iloc[0]} inputs, {len(budgets)} budgets over "
            f"{budgets[['N', 'D', 'C']].drop_duplicates().shape[0]} shapes, a fresh process each): the recommended "
            f"options' peak was {ratio.min():.2f}-{ratio.max():.2f}x the budget (limit {BUDGET_TOLERANCE:g}x; "
            f"largest at {worst.N}x{worst.D}x{worst.C}, budget {worst.budget}) and "
            f"{model.min():.3f}-{model.max():.3f}x the memory model's prediction, down to budgets of "
            f"{(budgets['budget_bytes'] / budgets['gradients_bytes']).min():.2f}x the gradients' own bytes."]
    for output in ("grad_input", "grad_weight"):
        miss = budgets[f"predicted_{output}_floors"] / budgets[f"{output}_floors"] - 1
        text.append(f"{output}: measured {budgets[f'{output}_floors'].min():.2f}-"
                    f"{budgets[f'{output}_floors'].max():.2f} floors, predicted within {miss.abs().max():.0%}.")
    if not tiling.empty:
        parts = []
        for policy, group in tiling.groupby("policy", sort=False):
            most = group.loc[group["num_class_chunks"].idxmax()]
            parts.append(f"{policy} {most.time_ratio:.2f}x at {most.num_class_chunks} blocks "
                         f"({group['measured_peak_bytes'].max() / 2**20:.0f} -> {most.measured_peak_bytes / 2**20:.0f}"
                         " MiB)")
        row = tiling.iloc[0]
        text.append(f"Class tiling's time cost at {row.N}x{row.D}x{row.C} ({row.batch_chunk_size} rows per chunk, one "
                    f"run, {tiling['cpu_model'].iloc[0]}): " + "; ".join(parts) + ".")
    return " ".join(text) + "\n"

POLICIES = ("accurate", "balanced", "compact")


def error_model(validation: pd.DataFrame) -> str:
    """07: how well the error model predicts measured floors it was fitted on, and those it never saw."""
    report = summary(validation, worst=3)
    (fit_share, fit_count), (held_share, held_count) = report["fit"], report["held_out"]
    splits = [f"{split}: {share:.0%} of {count}" for split, (share, count) in report["per_split"].items()]
    finding = (f"Within ±{SHARE_BAND:.0%} of the measured floors: {held_share:.0%} of the {held_count} held-out "
               f"points and {fit_share:.0%} of the {fit_count} fitted ones. The model ranks options well enough to "
               f"choose between them; a single prediction can be off by more than a quarter, most often in the "
               f"direction of the worst misses below.")
    held = validation[validation["split"] != "fit"]
    return _conclusion(finding, splits + [f"worst held-out miss: {miss}" for miss in report["worst"]],
                       inputs=f"the committed grids' seed medians ({_join(sorted(validation['source'].unique()))}); "
                              f"fitted on {_join(sorted(validation[validation['split'] == 'fit']['family'].unique()))}"
                              f" inputs at N ≤ {validation[validation['split'] == 'fit']['N'].max()}, held out: "
                              f"{_join(sorted(held['family'].unique()))} and {_shapes(held)}.",
                       limits="the input statistics the model uses are those of the committed families; an input "
                              "far from them (e.g. much more confident rows) is outside what was validated.")


def llm_predictions(predictions: pd.DataFrame, dtype: str = "bfloat16", kind: str = "cuda") -> str:
    """07: the predicted weight-gradient floors per policy at the LLM heads (extrapolation)."""
    rows = predictions[(predictions["dtype"] == dtype) & (predictions["kind"] == kind)]
    default = rows[rows["chunking"] == "aspect_ratio:2"]
    most = int(rows["num_chunks"].max())
    per_policy = {policy: default[default["policy"] == policy]["grad_weight"] for policy in POLICIES}
    compact_most = rows[(rows["policy"] == "compact") & (rows["num_chunks"] == most)]["grad_weight"]
    finding = (f"Predicted, not measured: with `aspect_ratio:2` ({_range(default['num_chunks'], '.0f')} chunks at "
               f"these heads) compact's weight gradient is {_range(per_policy['compact'], '.1f')} floors, "
               f"balanced's {_range(per_policy['balanced'])} and accurate's {_range(per_policy['accurate'])}; "
               f"compact grows with the chunk count to {_range(compact_most, '.0f')} floors at {most} chunks, while "
               f"the fp32 accumulators keep balanced and accurate flat.")
    bullets = [f"{shape}: compact {group[group['policy'] == 'compact']['grad_weight'].iloc[0]:.1f}, balanced "
               f"{group[group['policy'] == 'balanced']['grad_weight'].iloc[0]:.2f}, accurate "
               f"{group[group['policy'] == 'accurate']['grad_weight'].iloc[0]:.2f} floors (aspect_ratio:2)"
               for shape, group in default.groupby("shape", sort=False)]
    return _conclusion(finding, bullets,
                       inputs=f"lce's error model (`lce.error_model`), {dtype}, {kind.upper()} layouts with fp32 "
                              f"acc_dtype, the worst committed input statistics, heads "
                              f"{_join(list(default['shape'].unique()))} (N×D×C).",
                       limits="an extrapolation from shapes up to N=2048, C=65536; the chunk-walk and stagnation "
                              "terms are the ones that grow here and were fitted where they are small.")


def recommendations(table: pd.DataFrame) -> str:
    """07: what recommend picks at the LLM heads, per device and budget, and the Cut Cross-Entropy anchor."""
    default = table[table["budget"] == "auto's peak"]
    unmet = table[~table["default_limit_met"]]
    anchor = cce_anchor()
    finding = (f"With no budget, recommend keeps within lce auto's peak and the default error limit and picks "
               f"{_join(sorted(set(default['choice'].str.split(',').str[0])))}; predicted peaks "
               f"{_range(default['peak_gib'])} GiB. {len(table) - len(unmet)} of the {len(table)} (head, device, "
               f"budget) cases meet the default limit; the others"
               f"{' (' + _join(sorted(set(unmet['device'] + ' at ' + unmet['budget']))) + ')' if len(unmet) else ''} "
               f"get the least predicted error that fits. At Cut Cross-Entropy's shape ({CCE_SHAPE}) the smallest "
               f"peak within the default limit is {anchor['within_limit_mib']:,.1f} MiB against the gradients' "
               f"{anchor['gradients_mib']:,.0f} MiB (CCE reports {CCE_REPORTED_MB} MB).")
    return _conclusion(finding, [f"{row.shape} {row.device}, {row.budget}: {row.choice} — {row.peak_gib:.2f} GiB, "
                                 f"{row.grad_weight_floors:.2f} weight floors" for row in default.itertuples()],
                       inputs="lce's memory model and error model at the heads above, bf16, \"mean\" reduction, no "
                              "bias (`lce.recommend`, nothing measured).",
                       limits="predictions only; the time estimate that breaks ties between feasible candidates is "
                              "a roofline, not a measurement.")


def budgets(table: pd.DataFrame) -> str:
    """07: the recommended options under budgets, measured in a fresh process each."""
    if table.empty:
        return _missing("No budgets study yet (`python -m analysis budgets`).")
    over = table["measured_peak_bytes"] / table["budget_bytes"]
    model = table["measured_peak_bytes"] / table["predicted_peak_bytes"]
    within = (over <= BUDGET_TOLERANCE).all()
    finding = (f"{'Every' if within else 'Not every'} recommended option set stayed within {BUDGET_TOLERANCE:g}× "
               f"its budget: measured peak {_range(over, '.3f')}× the budget and {_range(model, '.3f')}× the memory "
               f"model, down to {(table['budget_bytes'] / table['gradients_bytes']).min():.2f}× the gradients' own "
               f"bytes. The default error limit was met in {int(table['default_limit_met'].sum())} of {len(table)} "
               f"budgets; below that, recommend returned its least-error fit and said so.")
    bullets = []
    for output in ("grad_input", "grad_weight"):
        miss = table[f"predicted_{output}_floors"] / table[f"{output}_floors"] - 1
        bullets.append(f"{output}: measured {_range(table[f'{output}_floors'])} floors, predicted within "
                       f"{miss.abs().max():.0%} (median miss {miss.abs().median():.0%})")
    return _conclusion(finding, bullets,
                       inputs=f"{table['family'].iloc[0]} inputs, {table['dtype'].iloc[0]}, {_shapes(table)}, one "
                              f"seed per budget, CPU {table['cpu_model'].iloc[0]} (`python -m analysis budgets`).",
                       limits="CPU layouts only; the input gradient's error is where the model misses most (it "
                              "under-predicts CPU balanced on calibrated inputs).")


def class_tiling(table: pd.DataFrame) -> str:
    """07: the time and memory class tiling costs against row-only chunking, per policy."""
    if table.empty:
        return _missing("No class-tiling measurement yet (`python -m analysis budgets`).")
    bullets, savings = [], []
    for policy, group in table.groupby("policy", sort=False):
        rows_only = group[group["num_class_chunks"] == 1].iloc[0]
        tiled = group[group["num_class_chunks"] > 1]
        bullets.append(f"{policy}: " + ", ".join(f"{row.num_class_chunks} blocks {row.time_ratio:.2f}× the time, "
                                                  f"{row.measured_peak_bytes / 2**20:.0f} MiB"
                                                  for row in tiled.itertuples())
                       + f" (row-only {rows_only.measured_peak_bytes / 2**20:.0f} MiB)")
        savings.append(1 - tiled["measured_peak_bytes"].min() / rows_only["measured_peak_bytes"])
    row = table.iloc[0]
    tiled = table[table["num_class_chunks"] > 1]
    finding = (f"Tiling the vocabulary cut the measured peak by {_range(savings, '.0%')} per policy at a time cost "
               f"of {_range(tiled['time_ratio'])}× row-only chunking: each block's logits are computed twice, and "
               f"small blocks make small GEMMs, so choose tiling only when the budget needs it (recommend does).")
    return _conclusion(finding, bullets,
                       inputs=f"{row.N}×{row.D}×{row.C}, {row['dtype']}, {row.batch_chunk_size} rows per chunk, one "
                              f"run each, CPU {row.cpu_model}.",
                       limits="one run per point on a shared 2-core machine (a ratio below 1 is noise or cache "
                              "effects, not a speed-up to rely on); GPU costs are unmeasured.")


def temporaries(peaks: pd.DataFrame) -> str:
    """07: the predicted peaks per layout and policy once no (C, D) product is formed whole."""
    cuda = peaks[peaks["layouts"] == "cuda"].set_index("policy")["peak_kib"]
    gap = cuda["balanced"] / cuda["accurate"] - 1
    finding = (f"On the CUDA layouts balanced now needs {cuda['balanced']:.1f} KiB against accurate's "
               f"{cuda['accurate']:.1f} KiB ({gap:+.1%}) and compact's {cuda['compact']:.1f} KiB: each layout's "
               f"peak is its accumulator plus chunk-sized buffers, with no whole (C, D) product on top. On memory "
               f"alone balanced still does not undercut accurate on CUDA, so whether it earns its \"auto\" entry "
               f"there is a question of speed, which only a GPU can measure.")
    bullets = [f"{row.layouts} {row.policy}: {row.peak_kib:.1f} KiB" for row in peaks.itertuples()]
    return _conclusion(finding, bullets,
                       inputs="lce's memory model (`lce.plan`) at N=256, D=32, C=1000, bf16, fp32 acc_dtype; the "
                              "model matches the CPU allocator within 0.5% on the re-measured grids (notebook 03).",
                       limits="the CUDA figures are the model's; no GPU allocator was measured in this notebook.")


def readme_error_model(results: Path) -> str:
    """The error model's validation summary and its predicted weight-gradient floors at LLM heads (CUDA layouts,
    acc fp32, default statistics), marked as extrapolations."""
    import pandas as pd

    from analysis.studies.error_model import SHARE_BAND, VALIDATION_FILE, llm_predictions, summary

    path = results / VALIDATION_FILE
    if not path.exists():
        return "(no error-model validation yet: run `python -m analysis error-model`)\n"
    report = summary(pd.read_csv(path), worst=3)
    (fit_share, fit_count), (held_share, held_count) = report["fit"], report["held_out"]
    lines = [f"`lce.error_model` predicts each gradient's error in rounding floors from the plan and a few input "
             f"statistics. Within ±{SHARE_BAND:.0%} of the measurement: {held_share:.0%} of {held_count} held-out "
             f"points (calibrated inputs, larger shapes), {fit_share:.0%} of the {fit_count} it was fitted on. "
             "Worst held-out misses: " + "; ".join(report["worst"]) + ".", ""]
    table = llm_predictions(dtypes=("bfloat16",))
    table = table[table["kind"] == "cuda"]
    grad_input = ", ".join(f"{policy} {group['grad_input'].min():.2f}-{group['grad_input'].max():.2f}"
                           for policy, group in table.groupby("policy"))
    lines += ["**Predictions (extrapolated, not measured)**: grad_weight floors in bf16 on the CUDA layouts, fp32 "
              f"acc_dtype, worst committed input statistics (grad_input over all cells: {grad_input}).", ""]
    chunkings = list(dict.fromkeys(table["chunking"]))
    lines += ["| N x D x C | policy | " + " | ".join(chunkings) + " |", "|---|---|" + "---:|" * len(chunkings)]
    for (shape, policy), group in table.groupby(["shape", "policy"], sort=False):
        cells = [f"{row.grad_weight:.1f} (k={row.num_chunks})" for row in group.itertuples()]
        lines.append(f"| {shape} | {policy} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def readme_recommend(results: Path) -> str:
    """lce.recommend's picks at LLM heads (predictions of lce's models) and the Cut Cross-Entropy anchor."""
    from analysis.report.nb07_choosing_options import recommend_markdown

    return recommend_markdown()


def readme_budgets(results: Path) -> str:
    """The budgets study: measured peak over budget, errors against their prediction, class tiling's cost."""
    from analysis.core.results_io import BUDGETS, CLASS_TILING
    from analysis.report.nb07_choosing_options import budgets_markdown

    return budgets_markdown(*(load_kind(results, kind.name)[1] for kind in (BUDGETS, CLASS_TILING)))
