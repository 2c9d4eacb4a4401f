"""One function per figure, each drawn from results tables only; nothing here measures or writes files.

Each ``plot_*`` function takes the tables it draws (the sweep table of
:func:`analysis.judge.pareto.load_table`, or a study's results file) and returns a
:class:`CaptionedFigure` (file stem, caption, the ``matplotlib`` figure), or
None when the tables hold no data for it. :func:`draw_all` draws every figure;
:mod:`analysis.report.figures` saves them and writes ``figures/README.md``; a notebook
displays them inline (``display(figure.figure)``, the caption as
:attr:`CaptionedFigure.markdown`). Figures are made without pyplot, so a
notebook shows only the figures it displays and drawing many never piles up
open figures. Style: seaborn's "whitegrid" with one palette keyed by policy,
log axes where the data spans decades, units in every axis label; every log
axis spans at least a fixed factor around its data, and error axes reach down
to the rounding floor (1), so a flat result looks flat.
"""

from __future__ import annotations

import dataclasses

import matplotlib.pyplot as plt  # noqa: F401 -- in a kernel, importing pyplot sets up inline display of figures
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib import ticker
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from analysis.judge.pareto import INTERVAL, seed_interval
from lce.planning.options import ACC_POLICIES

__all__ = ["CaptionedFigure"]

POLICY_ORDER = (*ACC_POLICIES, "")  # "": the unchunked ops
# Blue, orange, green, purple: four clearly distinct hues (the colorblind palette's 4th, vermillion, reads as a
# second orange next to its 2nd).
PALETTE = dict(zip(ACC_POLICIES, [sns.color_palette("colorblind")[i] for i in (0, 1, 2, 4)], strict=True))
PALETTE[""] = (0.3, 0.3, 0.3)
MARKERS = {"lce": "o", "torch": "X", "reference": "s", "compiled": "D", "liger": "^", "cce": "v"}
ERROR_LABEL = "worst gradient error (multiples of the rounding floor)"


@dataclasses.dataclass(frozen=True)
class CaptionedFigure:
    """A drawn figure, the file stem it is saved under (``<stem>.png``) and its caption."""

    figure: Figure
    stem: str
    caption: str

    @property
    def markdown(self) -> str:
        """The caption as one italic Markdown paragraph, for display under the figure in a notebook."""
        from analysis.report.tables import markdown_escape

        return f"*{markdown_escape(self.caption)}*"


def apply_style() -> None:
    sns.set_theme(style="whitegrid", context="paper", font_scale=1.0)


def shape_text(row) -> str:
    return f"N={row.N} D={row.D} C={row.C}"


def new_figure(width: float, height: float) -> Figure:
    """A constrained-layout figure with an Agg canvas, outside pyplot (nothing to close, nothing shown unasked)."""
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def panel_grid(panels: int, width: float = 4.2, height: float = 3.4, columns: int = 3) -> tuple[Figure, np.ndarray]:
    columns = max(1, min(columns, panels))
    rows = max(1, -(-panels // columns))
    fig = new_figure(width * columns, height * rows + 0.8)
    axes = fig.subplots(rows, columns, squeeze=False)
    for ax in axes.flat[panels:]:
        ax.set_visible(False)
    return fig, axes


def legend_below(fig: Figure, axes: np.ndarray, columns: int = 6) -> None:
    handles, labels = {}, []
    for ax in axes.flat:
        for handle, text in zip(*ax.get_legend_handles_labels(), strict=True):
            if text not in handles:
                handles[text] = handle
                labels.append(text)
    if handles:
        fig.legend([handles[t] for t in labels], labels, loc="outside lower center", ncol=min(columns, len(labels)),
                   frameon=False, fontsize=8)


def log_axes(ax: Axes, x: bool = True, y: bool = True, x_base: float = 10) -> None:
    """Log scales with plain numbers as labels (no 3x10^-1 clutter on axes spanning < 1 decade)."""
    plain = ticker.FuncFormatter(lambda value, _: f"{value:g}")
    if x:
        ax.set_xscale("log", base=x_base)
        if x_base == 10:
            ax.xaxis.set_major_locator(ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_major_formatter(plain)
        ax.xaxis.set_minor_formatter(ticker.NullFormatter())
    if y:
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(plain)
        ax.yaxis.set_minor_formatter(ticker.NullFormatter())


ERROR_SPAN = 10.0
"""An error axis (in rounding floors) reaches down to the floor, 1, and spans at least this factor."""
COST_SPAN = 4.0
"""A memory or time axis spans at least this factor around its data (a 1% difference stays a 1% sliver)."""


def honest_limits(ax: Axes, axis: str, values, *, span: float, floor: float | None = None,
                   pad: float = 1.15) -> None:
    """Limits of a log ``axis`` ("x" or "y") that show ``values`` at their true scale.

    The axis covers the data (padded by ``pad`` each side) and at least a factor
    ``span``: with a ``floor`` it starts at or below the floor and grows upwards,
    otherwise it grows evenly around the data's geometric centre. Without that,
    matplotlib zooms onto the data, and three points at 67.38-67.44 fill a panel
    as if they differed by a factor of ten.
    """
    data = np.asarray(values, dtype=float)
    data = data[np.isfinite(data) & (data > 0)]
    if not len(data):
        return
    low, high = data.min() / pad, data.max() * pad
    if floor is not None:
        low = min(low, floor / pad)
        high = max(high, low * span)
    elif high / low < span:
        centre, half = np.sqrt(low * high), np.sqrt(span)
        low, high = centre / half, centre * half
    (ax.set_ylim if axis == "y" else ax.set_xlim)(low, high)


PROBLEM_COLUMNS = ["family", "dtype", "N", "D", "C"]


def family_panels(data: pd.DataFrame, width: float = 4.2, height: float = 3.4
                   ) -> tuple[Figure, np.ndarray, list[tuple[Axes, pd.DataFrame]]]:
    """One row of panels per input family, one panel per (dtype, shape) of that family.

    Returns the figure, its axes and ``(axis, rows of that problem)`` per panel, families and problems sorted.
    """
    problems = data[PROBLEM_COLUMNS].drop_duplicates().sort_values(["family", "dtype", "C", "N", "D"])
    families = list(dict.fromkeys(problems["family"]))
    columns = max(int((problems["family"] == family).sum()) for family in families)
    fig = new_figure(width * columns, height * len(families) + 0.8)
    axes = fig.subplots(len(families), columns, squeeze=False)
    panels, used = [], set()
    for row, family in enumerate(families):
        for column, problem in enumerate(problems[problems["family"] == family].itertuples(index=False)):
            ax = axes[row, column]
            used.add((row, column))
            mask = np.ones(len(data), dtype=bool)
            for key in PROBLEM_COLUMNS:
                mask &= (data[key] == getattr(problem, key)).to_numpy()
            ax.set_title(f"{family}: {problem.dtype}, {shape_text(problem)}", fontsize=9)
            panels.append((ax, data[mask]))
    for (row, column), ax in np.ndenumerate(axes):
        ax.set_visible((row, column) in used)
    return fig, axes, panels


def seeds_text(data: pd.DataFrame) -> str:
    """``random: 5 seeds; calibrated: 1 seed``: how many seeds each family's points pool."""
    counts = data.groupby("family")["seed"].nunique()
    return "; ".join(f"{family}: {n} seed{'s' if n != 1 else ''}" for family, n in counts.items())


def families_text(data: pd.DataFrame) -> str:
    return ", ".join(sorted(set(data["family"])))


def seed_caption(data: pd.DataFrame) -> str:
    return (f"Inputs: families {families_text(data)} ({seeds_text(data)}); points are medians over seeds, "
            f"bars or bands the {INTERVAL}.")


def series_labels(data: pd.DataFrame) -> pd.Series:
    """``auto``, ``compact acc=fp32``: a run's policy and whether it asked for a wider acc_dtype."""
    return data["policy"] + np.where(data["acc_dtype"] == "default", "", " acc=fp32")


def chunk_lines(ax: Axes, group: pd.DataFrame, column: str) -> pd.DataFrame:
    """Per (op, series) of ``group``: ``column``'s seed median vs the chunk count, its interval as a band.

    Solid where the resolved acc_dtype is wider than the input, dotted where it is the input's.
    Returns the medians and intervals drawn.
    """
    points = seed_interval(group.assign(series=series_labels(group)), column,
                           by=["op", "series", "num_chunks", "resolved_acc_dtype", "dtype"])
    for (op, series), rows in points.groupby(["op", "series"], sort=True):
        rows = rows.sort_values("num_chunks")
        policy = series.split(" ")[0]
        wide = str(rows["resolved_acc_dtype"].iloc[0]) != str(rows["dtype"].iloc[0])
        colour = PALETTE.get(policy, "k")
        ax.plot(rows["num_chunks"], rows[column], marker=MARKERS[op], ls="-" if wide else ":",
                lw=1.5 if op == "lce" else 1.0, ms=5 if op == "lce" else 6, color=colour,
                alpha=0.9 if op == "lce" else 0.55, label=f"{op} {series}")
        ax.fill_between(rows["num_chunks"], rows[f"{column}_low"], rows[f"{column}_high"], color=colour,
                        alpha=0.12, lw=0)
    return points
