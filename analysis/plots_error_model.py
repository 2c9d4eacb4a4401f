"""The error model's figures: predicted against measured floors, and its predictions at LLM heads.

Like :mod:`analysis.plots`, each function draws from tables (the validation file, or
:func:`analysis.error_model_fit.llm_predictions`) and measures nothing; each returns a
:class:`~analysis.plots.CaptionedFigure`, or None when its data is absent.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .error_model_fit import SHARE_BAND, hit_share, point_name
from .plots import PALETTE, CaptionedFigure, _figure, _log_axes, _style

__all__ = ["plot_error_model_validation", "plot_error_model_llm", "draw_all"]

SPLIT_STYLES = {"fit": ("o", (0.6, 0.6, 0.6)), "held-out family": ("s", "tab:red"),
                "held-out shape": ("^", "tab:blue")}


def plot_error_model_validation(rows: pd.DataFrame, annotate: int = 4) -> CaptionedFigure | None:
    """Predicted against measured floors (log-log) with the ±25% band; fit and held-out points apart."""
    if rows.empty:
        return None
    _style()
    fig = _figure(6.5, 5.5)
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
    _log_axes(ax)
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
    _style()
    shapes = list(dict.fromkeys(rows["shape"]))
    fig = _figure(4.0 * len(shapes), 3.6)
    axes = fig.subplots(1, len(shapes), sharey=True, squeeze=False)[0]
    for ax, shape in zip(axes, shapes, strict=True):
        for policy, group in rows[rows["shape"] == shape].groupby("policy"):
            group = group.sort_values("num_chunks").drop_duplicates("num_chunks")
            ax.plot(group["num_chunks"], group["grad_weight"], marker="o", color=PALETTE.get(policy), label=policy)
        _log_axes(ax, x_base=2)
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


def draw_all(validation: pd.DataFrame, predictions: pd.DataFrame) -> list[CaptionedFigure]:
    """Both figures, where their data exists."""
    drawn = [plot_error_model_validation(validation), plot_error_model_llm(predictions)]
    return [figure for figure in drawn if figure is not None]
