"""The figures of lce's features beyond torch's op: their errors next to the plain op, and what a cap does to the
softmax.

Each function draws from the ``features`` results table (:mod:`analysis.studies.features`) and measures nothing;
each returns a :class:`~analysis.plots.CaptionedFigure`, or None when its data is absent.
"""

from __future__ import annotations

import pandas as pd

from .plots import CaptionedFigure, _figure, _log_axes, _style

__all__ = ["SHOWN_CONTENDERS", "plot_feature_errors", "plot_softcap_statistics", "draw_all"]

SHOWN_CONTENDERS: tuple[str, ...] = ("lce accurate cuda acc=fp32", "lce balanced cuda acc=fp32",
                                     "lce compact cuda acc=fp32", "lce auto cpu acc=default", "unfused")
"""The contenders the error figure draws (the others are in the table): CUDA layouts per policy, CPU auto, unfused."""


def _feature_order(table: pd.DataFrame) -> list[str]:
    return list(dict.fromkeys(table["features"]))


def plot_feature_errors(features: pd.DataFrame) -> CaptionedFigure | None:
    """Floors of both gradients per feature set and contender: median over seeds and families, bars from the
    smallest to the largest seed median of a family."""
    shown = features[features["impl"].isin(SHOWN_CONTENDERS)] if not features.empty else features
    if shown.empty:
        return None
    _style()
    dtypes = list(dict.fromkeys(shown["dtype"]))
    fig = _figure(11.0, 3.4 * len(dtypes))
    axes = fig.subplots(len(dtypes), 2, squeeze=False)
    order = _feature_order(shown)
    impls = [impl for impl in SHOWN_CONTENDERS if impl in set(shown["impl"])]
    width = 0.8 / len(impls)
    for row, dtype in enumerate(dtypes):
        for col, output in enumerate(("grad_input", "grad_weight")):
            ax = axes[row][col]
            rows = shown[shown["dtype"] == dtype]
            medians = rows.groupby(["impl", "features", "family"])[f"{output}_floors"].median()
            for index, impl in enumerate(impls):
                per_family = medians.xs(impl, level="impl")
                centre = per_family.groupby(level="features").median().reindex(order)
                low = per_family.groupby(level="features").min().reindex(order)
                high = per_family.groupby(level="features").max().reindex(order)
                x = [position + (index - (len(impls) - 1) / 2) * width for position in range(len(order))]
                ax.errorbar(x, centre, yerr=[centre - low, high - centre], fmt="o", ms=4, capsize=2, label=impl)
            ax.set_xticks(range(len(order)), order, rotation=15, fontsize=7)
            _log_axes(ax, x=False)
            ax.axhline(1.0, color="0.5", lw=0.8)
            ax.set_ylabel(f"{output} error (floors)")
            ax.set_title(f"{output}, {dtype}")
            if row == 0 and col == 0:
                ax.legend(fontsize=6)
    families = ", ".join(sorted(shown["family"].unique()))
    shapes = ", ".join(sorted({f"{r.N}x{r.D}x{r.C}" for r in shown[["N", "D", "C"]].drop_duplicates().itertuples()}))
    caption = (f"Error against fp64 (rounding floors of the exact result of the same formula) of lce's soft-capping "
               f"and z-loss next to the plain op, on {families} inputs ({shapes}), {shown['seed'].nunique()} seeds. "
               "Points: median over families of the seed median; bars: the smallest and the largest family. CUDA "
               "layouts emulated on CPU tensors; 'unfused' is the formula in the input dtype. Every contender, "
               "the loss's ulps and the returned log-sum-exp's error are in features.csv.")
    return CaptionedFigure(fig, "feature_errors", caption)


def plot_softcap_statistics(features: pd.DataFrame) -> CaptionedFigure | None:
    """What the cap does to the softmax (fp64 statistics of the inputs): mean largest logit and median target
    probability, per family and feature set."""
    if features.empty:
        return None
    per_problem = features.drop_duplicates(["family", "dtype", "seed", "features"])
    per_problem = per_problem[per_problem["z_loss"].fillna(0) == 0]
    if per_problem.empty:
        return None
    _style()
    fig = _figure(10.0, 3.8)
    axes = fig.subplots(1, 2)
    order = _feature_order(per_problem)
    families = list(dict.fromkeys(per_problem["family"]))
    width = 0.8 / len(families)
    for ax, column, label in ((axes[0], "stat_mean_max_logit", "mean over rows of the largest logit"),
                              (axes[1], "stat_median_target_prob", "median target probability")):
        for index, family in enumerate(families):
            values = per_problem[per_problem["family"] == family].groupby("features")[column].median().reindex(order)
            x = [position + (index - (len(families) - 1) / 2) * width for position in range(len(order))]
            ax.bar(x, values, width=width, label=family)
        ax.set_xticks(range(len(order)), order, fontsize=7)
        ax.set_ylabel(label)
    axes[1].set_yscale("log")
    axes[0].legend(fontsize=7)
    fig.suptitle("What a logit cap does to the softmax (fp64, before any rounding)")
    max_logit = per_problem.groupby(["features", "family"])["stat_mean_max_logit"].median()
    plain = max_logit.xs(order[0], level="features")
    shifts = "; ".join(f"{name}: {(1 - max_logit.xs(name, level='features') / plain).min():.0%}-"
                       f"{(1 - max_logit.xs(name, level='features') / plain).max():.0%} lower"
                       for name in order[1:])
    caption = (f"The softmax statistics of each feature set's logits, computed in fp64 from the same rounded inputs "
               f"(median over seeds), per family. Mean largest logit against {order[0]!r} ({shifts}). The cap "
               "changes the function itself, not only its rounding: errors in figure feature_errors are measured "
               "against the fp64 result of the capped formula.")
    return CaptionedFigure(fig, "softcap_statistics", caption)


def draw_all(features: pd.DataFrame) -> list[CaptionedFigure]:
    """Every figure this module draws that has data."""
    return [figure for figure in (plot_feature_errors(features), plot_softcap_statistics(features))
            if figure is not None]
