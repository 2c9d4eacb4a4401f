"""The figures of ``lce.recommend`` under memory budgets and of class tiling's cost.

Each function draws from a results table (``budgets.csv``, ``class_tiling.csv``; see
:mod:`analysis.studies.budgets`) and measures nothing; each returns a
:class:`~analysis.plots.CaptionedFigure`, or None when its data is absent.
"""

from __future__ import annotations

import pandas as pd

from .plots import PALETTE, CaptionedFigure, _figure, _log_axes, _style

__all__ = ["BUDGET_TOLERANCE", "plot_budgets", "plot_class_tiling", "draw_all"]

BUDGET_TOLERANCE = 1.15
"""Measured peak over budget that issue 11 accepts (allocator and kernel workspaces the model does not list)."""


def _shape_label(row) -> str:
    return f"{row.N}x{row.D}x{row.C}"


def plot_budgets(budgets: pd.DataFrame) -> CaptionedFigure | None:
    """Left: measured and predicted peak over the budget, per budget; right: predicted against measured error."""
    if budgets.empty:
        return None
    _style()
    fig = _figure(10.5, 4.2)
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
    _log_axes(memory, y=False)
    memory.set_xlabel("budget (multiples of the bf16 gradients' bytes; rightmost: lce auto's peak)")
    memory.set_ylabel("peak extra memory / budget")
    memory.set_title(f"Recommended options stay within {BUDGET_TOLERANCE:g}x the budget")
    memory.legend(fontsize=6, ncol=2)
    top = max(data["grad_weight_floors"].max(), data["predicted_grad_weight_floors"].max(),
              data["grad_input_floors"].max()) * 1.2
    error.plot([0.9, top], [0.9, top], color="k", lw=0.8)
    _log_axes(error)
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
    _style()
    fig = _figure(6.5, 4.2)
    ax = fig.add_subplot()
    for policy, group in tiling.groupby("policy", sort=False):
        group = group.sort_values("num_class_chunks")
        ax.plot(group["num_class_chunks"], group["time_ratio"], marker="o", color=PALETTE.get(policy),
                label=f"{policy} (untiled {group['time_median_s'].iloc[0]:.2f} s)")
        for row in group.itertuples():
            ax.annotate(f"{row.measured_peak_bytes / 2**20:.0f} MiB", (row.num_class_chunks, row.time_ratio),
                        xytext=(4, 4), textcoords="offset points", fontsize=6)
    _log_axes(ax, y=False, x_base=2)
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


def draw_all(budgets: pd.DataFrame, tiling: pd.DataFrame) -> list[CaptionedFigure]:
    """Every figure this module draws that has data."""
    return [figure for figure in (plot_budgets(budgets), plot_class_tiling(tiling)) if figure is not None]
