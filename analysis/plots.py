"""One function per figure, each drawn from results tables only; nothing here measures or writes files.

Each ``plot_*`` function takes the tables it draws (the sweep table of
:func:`analysis.pareto.load_table`, or a study's results file) and returns a
:class:`CaptionedFigure` (file stem, caption, the ``matplotlib`` figure), or
None when the tables hold no data for it. :func:`draw_all` draws every figure;
:mod:`analysis.figures` saves them and writes ``figures/README.md``; a notebook
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
import textwrap
from collections.abc import Callable

import matplotlib.pyplot as plt  # noqa: F401 -- in a kernel, importing pyplot sets up inline display of figures
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib import rcParams, ticker
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from lce.options import ACC_POLICIES

from .pareto import ERROR, INTERVAL, MEMORY, TIME, front_mask, seed_interval, verdicts
from .results_io import latest

__all__ = ["CaptionedFigure", "SWEEP_FIGURES", "plot_error_vs_memory", "plot_error_vs_chunks", "plot_row_errors",
           "plot_gradient_bias", "plot_memory_model", "plot_time_vs_shape", "plot_buffer_breakdown",
           "plot_memory_trace", "plot_bench_scaling", "plot_families", "plot_margins", "plot_rare_rows", "draw_all"]

POLICY_ORDER = (*ACC_POLICIES, "")  # "": the unchunked ops
PALETTE = dict(zip(POLICY_ORDER, sns.color_palette("colorblind", len(POLICY_ORDER)), strict=True))
PALETTE[""] = (0.3, 0.3, 0.3)
MARKERS = {"lce": "o", "torch": "X", "reference": "s", "compiled": "D", "liger": "^", "cce": "v"}
ERROR_LABEL = "worst gradient error (multiples of the rounding floor)"


@dataclasses.dataclass(frozen=True)
class CaptionedFigure:
    """A drawn figure, the file stem it is saved under (``<stem>.png``, ``<stem>.svg``) and its caption."""

    figure: Figure
    stem: str
    caption: str

    @property
    def markdown(self) -> str:
        """The caption as one italic Markdown paragraph, for display under the figure in a notebook."""
        from .tables import markdown_escape

        return f"*{markdown_escape(self.caption)}*"


def _style() -> None:
    sns.set_theme(style="whitegrid", context="paper", font_scale=1.0)
    rcParams["svg.hashsalt"] = "lce-lab"  # stable element ids: unchanged data gives unchanged SVGs


def _shape_text(row) -> str:
    return f"N={row.N} D={row.D} C={row.C}"


def _figure(width: float, height: float) -> Figure:
    """A constrained-layout figure with an Agg canvas, outside pyplot (nothing to close, nothing shown unasked)."""
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _grid(panels: int, width: float = 4.2, height: float = 3.4, columns: int = 3) -> tuple[Figure, np.ndarray]:
    columns = max(1, min(columns, panels))
    rows = max(1, -(-panels // columns))
    fig = _figure(width * columns, height * rows + 0.8)
    axes = fig.subplots(rows, columns, squeeze=False)
    for ax in axes.flat[panels:]:
        ax.set_visible(False)
    return fig, axes


def _legend_below(fig: Figure, axes: np.ndarray, columns: int = 6) -> None:
    handles, labels = {}, []
    for ax in axes.flat:
        for handle, text in zip(*ax.get_legend_handles_labels(), strict=True):
            if text not in handles:
                handles[text] = handle
                labels.append(text)
    if handles:
        fig.legend([handles[t] for t in labels], labels, loc="outside lower center", ncol=min(columns, len(labels)),
                   frameon=False, fontsize=8)


def _log_axes(ax: Axes, x: bool = True, y: bool = True, x_base: float = 10) -> None:
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


def _honest_limits(ax: Axes, axis: str, values, *, span: float, floor: float | None = None,
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


_PROBLEM = ["family", "dtype", "N", "D", "C"]


def _family_panels(data: pd.DataFrame, width: float = 4.2, height: float = 3.4
                   ) -> tuple[Figure, np.ndarray, list[tuple[Axes, pd.DataFrame]]]:
    """One row of panels per input family, one panel per (dtype, shape) of that family.

    Returns the figure, its axes and ``(axis, rows of that problem)`` per panel, families and problems sorted.
    """
    problems = data[_PROBLEM].drop_duplicates().sort_values(["family", "dtype", "C", "N", "D"])
    families = list(dict.fromkeys(problems["family"]))
    columns = max(int((problems["family"] == family).sum()) for family in families)
    fig = _figure(width * columns, height * len(families) + 0.8)
    axes = fig.subplots(len(families), columns, squeeze=False)
    panels, used = [], set()
    for row, family in enumerate(families):
        for column, problem in enumerate(problems[problems["family"] == family].itertuples(index=False)):
            ax = axes[row, column]
            used.add((row, column))
            mask = np.ones(len(data), dtype=bool)
            for key in _PROBLEM:
                mask &= (data[key] == getattr(problem, key)).to_numpy()
            ax.set_title(f"{family}: {problem.dtype}, {_shape_text(problem)}", fontsize=9)
            panels.append((ax, data[mask]))
    for (row, column), ax in np.ndenumerate(axes):
        ax.set_visible((row, column) in used)
    return fig, axes, panels


def _seeds_text(data: pd.DataFrame) -> str:
    """``random: 5 seeds; calibrated: 1 seed``: how many seeds each family's points pool."""
    counts = data.groupby("family")["seed"].nunique()
    return "; ".join(f"{family}: {n} seed{'s' if n != 1 else ''}" for family, n in counts.items())


def _families_text(data: pd.DataFrame) -> str:
    return ", ".join(sorted(set(data["family"])))


def _seed_caption(data: pd.DataFrame) -> str:
    return (f"Inputs: families {_families_text(data)} ({_seeds_text(data)}); points are medians over seeds, "
            f"bars or bands the {INTERVAL}.")


def plot_error_vs_memory(table: pd.DataFrame, device: str = "cpu") -> CaptionedFigure | None:
    """Error vs peak memory per (family, dtype, shape) on ``device``: seed medians with their interval as bars,
    the front of the medians drawn, the auto pick starred."""
    data = table[table["device"] == device]
    if data.empty:
        return None
    _style()
    fig, axes, panels = _family_panels(data)
    picks = verdicts(table)
    for ax, group in panels:
        points = seed_interval(group, [ERROR, MEMORY])
        for (op, policy), rows in points.groupby(["op", "policy"], sort=False):
            below, above = rows[ERROR] - rows[f"{ERROR}_low"], rows[f"{ERROR}_high"] - rows[ERROR]
            ax.errorbar(rows[MEMORY], rows[ERROR], yerr=[below, above], fmt=MARKERS.get(op, "o"), ms=4.5,
                        alpha=0.75, color=PALETTE.get(policy, "k"), elinewidth=0.8, label=f"{op} {policy}".strip())
        front = points[front_mask(points[MEMORY], points[ERROR])].sort_values(MEMORY)
        ax.step(front[MEMORY], front[ERROR], where="post", color="k", lw=1, alpha=0.6, label="Pareto front")
        first = group.iloc[0]  # a Series: first.dtype would be its own dtype, so index by name
        mine = picks[(picks["device"] == device) & (picks["family"] == first["family"])
                     & (picks["dtype"] == first["dtype"])
                     & (picks["shape"] == f"{first['N']}x{first['D']}x{first['C']}")]
        for pick in mine.itertuples():
            ax.scatter([pick.peak_mib], [pick.error], marker="*", s=220, facecolor="none", edgecolor="red",
                       linewidth=1.5, label="auto pick", zorder=5)
        _log_axes(ax)
        _honest_limits(ax, "x", points[MEMORY], span=COST_SPAN)
        _honest_limits(ax, "y", pd.concat([points[f"{ERROR}_low"], points[f"{ERROR}_high"]]), span=ERROR_SPAN,
                       floor=1.0)
        ax.set_xlabel("peak extra memory (MiB)")
    fig.supylabel(ERROR_LABEL, fontsize=9)
    _legend_below(fig, axes)
    stem = f"error_vs_memory_{device}"
    memory_source = "lce's model (CPU stand-in measured otherwise)" if device == "cuda-emulated" else "measured"
    return CaptionedFigure(fig, stem,
                           f"Gradient error (in rounding floors) vs peak extra memory ({memory_source}) on {device}, "
                           "one row of panels per input family, one panel per dtype and shape; black steps: Pareto "
                           "front of the medians; red star: the \"auto\" pick (seed median). "
                           f"{_seed_caption(data)} Error axes reach down to the rounding floor (1) and span at least "
                           f"a factor {ERROR_SPAN:g}; memory axes at least a factor {COST_SPAN:g}.")


def _series(data: pd.DataFrame) -> pd.Series:
    """``auto``, ``compact acc=fp32``: a run's policy and whether it asked for a wider acc_dtype."""
    return data["policy"] + np.where(data["acc_dtype"] == "default", "", " acc=fp32")


def _chunk_lines(ax: Axes, group: pd.DataFrame, column: str) -> pd.DataFrame:
    """Per (op, series) of ``group``: ``column``'s seed median vs the chunk count, its interval as a band.

    Solid where the resolved acc_dtype is wider than the input, dotted where it is the input's.
    Returns the medians and intervals drawn.
    """
    points = seed_interval(group.assign(series=_series(group)), column,
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


def plot_error_vs_chunks(table: pd.DataFrame, device: str = "cpu") -> CaptionedFigure | None:
    """grad_weight error vs number of chunks per policy and family, lce next to torch; seed median and band."""
    data = table[(table["device"] == device) & table["op"].isin(["lce", "torch"])]
    if data.empty:
        return None
    _style()
    column = "grad_weight_fro_in_floors"
    fig, axes, panels = _family_panels(data)
    for ax, group in panels:
        points = _chunk_lines(ax, group, column)
        _log_axes(ax, x_base=2)
        _honest_limits(ax, "y", pd.concat([points[f"{column}_low"], points[f"{column}_high"]]), span=ERROR_SPAN,
                       floor=1.0)
        ax.set_xlabel("number of chunks")
    fig.supylabel("grad_weight error (multiples of the rounding floor)", fontsize=9)
    _legend_below(fig, axes)
    stem = f"error_vs_chunks_{device}"
    return CaptionedFigure(fig, stem,
                           f"Weight-gradient error (in rounding floors) vs number of chunks, per policy, on {device}, "
                           "one row of panels per input family: circles lce, crosses torch's native op; solid lines "
                           "where the resolved acc_dtype is wider than the input, dotted where it equals it (all "
                           "policies then compute the same numbers and their lines coincide). A policy that rounds "
                           "the weight gradient per chunk grows with the chunk count; one that keeps a wide "
                           f"accumulator stays flat. {_seed_caption(data)} Error axes reach down to the rounding "
                           f"floor (1) and span at least a factor {ERROR_SPAN:g}.")


ROW_METRICS = {"grad_weight_fro_in_floors": ("Frobenius (whole tensor)", "o"),
               "grad_weight_row_p99": ("99th percentile class row", "^"),
               "grad_weight_row_max": ("worst class row", "v")}
"""The grad_weight errors :func:`plot_row_errors` sets side by side, with their legend text and marker."""


def plot_row_errors(table: pd.DataFrame, device: str = "cpu") -> CaptionedFigure | None:
    """grad_weight error per implementation with default chunking: the Frobenius error next to the p99 and
    worst class row, per (family, dtype, shape); seed medians with their interval."""
    data = table[(table["device"] == device) & table["chunking"].isin(["auto", ""])
                 & (table["acc_dtype"] == "default")]
    data = data.dropna(subset=list(ROW_METRICS), how="all")
    if data.empty:
        return None
    _style()
    fig, axes, panels = _family_panels(data, width=4.8)
    for ax, group in panels:
        points = seed_interval(group, list(ROW_METRICS), by=["op", "policy", "label"])
        points["order"] = [(op != "lce", op, POLICY_ORDER.index(p) if p in POLICY_ORDER else 99)
                           for op, p in zip(points["op"], points["policy"], strict=True)]
        points = points.sort_values("order").reset_index(drop=True)
        offsets = np.linspace(-0.22, 0.22, len(ROW_METRICS))
        for offset, (column, (text, marker)) in zip(offsets, ROW_METRICS.items(), strict=True):
            for x, row in points.iterrows():
                ax.errorbar([x + offset], [row[column]], yerr=[[row[column] - row[f"{column}_low"]],
                                                               [row[f"{column}_high"] - row[column]]],
                            fmt=marker, ms=5, color=PALETTE.get(row["policy"], "k"), elinewidth=0.8,
                            mfc="none" if column != "grad_weight_fro_in_floors" else None)
            ax.plot([], [], marker, color="0.3", mfc="none" if marker != "o" else None, ls="", label=text)
        ax.set_xticks(range(len(points)), [f"{op}\n{policy}".strip() for op, policy in
                                           zip(points["op"], points["policy"], strict=True)], fontsize=7)
        values = pd.concat([points[f"{c}{s}"] for c in ROW_METRICS for s in ("_low", "_high")])
        _log_axes(ax, x=False)
        _honest_limits(ax, "y", values, span=ERROR_SPAN, floor=1.0)
    fig.supylabel("grad_weight error (multiples of the rounding floor)", fontsize=9)
    _legend_below(fig, axes)
    return CaptionedFigure(fig, f"row_errors_{device}",
                           f"Weight-gradient error on {device} per implementation with default options and chunking "
                           "(colour: policy), three ways: the Frobenius error of the whole tensor (filled circle), "
                           "and the 99th-percentile and worst class row, each row's error over its own rounding "
                           "floor (open triangles). Rows of rarely targeted classes are tiny and can be far off "
                           "while the Frobenius average, dominated by the frequent classes, stays near the floor. "
                           f"One row of panels per input family. {_seed_caption(data)} Error axes reach down to the "
                           f"rounding floor (1) and span at least a factor {ERROR_SPAN:g}.")


BIAS_COLUMN = "grad_weight_bias_in_floors"
"""The signed error :func:`plot_gradient_bias` draws: grad_weight's error along the exact gradient, in floors."""


def plot_gradient_bias(table: pd.DataFrame, device: str = "cpu") -> CaptionedFigure | None:
    """Signed bias of grad_weight (in floors) vs chunk count per policy, lce next to torch, per (family, dtype,
    shape); seed median and band."""
    data = table[(table["device"] == device) & table["op"].isin(["lce", "torch"])].dropna(subset=[BIAS_COLUMN])
    if data.empty:
        return None
    _style()
    fig, axes, panels = _family_panels(data)
    for ax, group in panels:
        points = _chunk_lines(ax, group, BIAS_COLUMN)
        ax.axhline(0, color="k", lw=0.8)
        reach = np.nanmax(np.abs(points[[f"{BIAS_COLUMN}_low", f"{BIAS_COLUMN}_high"]].to_numpy()))
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda value, _: f"{value:g}"))
        ax.set_yscale("symlog", linthresh=1.0)
        ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda value, _: f"{value:g}"))
        limit = max(2.0, 1.3 * reach) if np.isfinite(reach) else 2.0
        ax.set_ylim(-limit, limit)  # symmetric: a bias of either sign reads at its true size
        ax.set_xlabel("number of chunks")
    fig.supylabel("grad_weight bias along the exact gradient (rounding floors)", fontsize=9)
    _legend_below(fig, axes)
    return CaptionedFigure(fig, "gradient_bias",
                           f"Signed error of the weight gradient along the exact gradient, in Frobenius rounding "
                           f"floors, vs number of chunks, per policy, on {device}: negative means the gradient comes "
                           "out systematically shorter than the exact one (as if the learning rate were lower), "
                           "positive longer. Independent rounding errors contribute about (Frobenius error)/"
                           "sqrt(entries), near 0 here; a bias that does not average out over steps shows at full "
                           "size. Circles lce, crosses torch; solid where the resolved acc_dtype is wider than the "
                           f"input. One row of panels per input family. {_seed_caption(data)} Symmetric symlog "
                           "axis, linear within ±1 floor.")


def plot_memory_model(table: pd.DataFrame) -> CaptionedFigure | None:
    """lce's predicted peak (Plan.peak_extra_bytes) vs the measured one, with the +-15% band."""
    data = table[(table["op"] == "lce") & (table["device"] != "cuda-emulated")].dropna(
        subset=["peak_bytes_modeled", "peak_bytes_measured"])
    if data.empty:
        return None
    _style()
    fig = _figure(5, 4.4)
    ax = fig.subplots()
    modeled = data["peak_bytes_modeled"].astype(float) / 2**20
    measured = data["peak_bytes_measured"].astype(float) / 2**20
    # Colour by what decides the buffers: input dtype and the resolved acc_dtype.
    kinds = data["dtype"].astype(str) + " in, acc " + data["resolved_acc_dtype"].astype(str)
    colours = dict(zip(sorted(kinds.unique()), sns.color_palette("colorblind", kinds.nunique()), strict=True))
    for kind, colour in colours.items():
        mask = kinds == kind
        ax.scatter(modeled[mask], measured[mask], s=18, alpha=0.7, color=colour, label=kind)
    low, high = min(modeled.min(), measured.min()) * 0.8, max(modeled.max(), measured.max()) * 1.25
    line = np.geomspace(low, high, 50)
    ax.plot(line, line, color="k", lw=1, label="measured = modeled")
    ax.fill_between(line, line * 0.85, line * 1.15, color="k", alpha=0.08, label="+-15%")
    _log_axes(ax)
    ax.set_xlabel("modeled peak extra memory, lce Plan (MiB)")
    ax.set_ylabel("measured peak extra memory (MiB)")
    ax.legend(fontsize=8, frameon=False)
    return CaptionedFigure(fig, "memory_measured_vs_modeled",
                           "lce's memory model (Plan.peak_extra_bytes) vs the measured peak of one forward+backward, "
                           "every lce run. " + _model_fit_summary(data))


def _model_fit_summary(data: pd.DataFrame) -> str:
    """Sentence: how many runs sit within +-15%, and the configurations furthest off."""
    ratio = data["peak_bytes_measured"].astype(float) / data["peak_bytes_modeled"].astype(float)
    within = int(((ratio - 1).abs() <= 0.15).sum())
    text = (f"{within} of {len(ratio)} runs within +-15% (measured/modeled from {ratio.min():.2f} to "
            f"{ratio.max():.2f}, median {ratio.median():.2f}).")
    off = data.assign(ratio=ratio)[(ratio - 1).abs() > 0.15]
    if len(off):
        worst = (off.groupby(["dtype", "policy", "acc_dtype"])["ratio"].agg(["max", "size"])
                 .sort_values("max", ascending=False).head(4))
        parts = [f"{dtype} {policy} acc={acc} (up to {row['max']:.2f}x, {int(row['size'])} runs)"
                 for (dtype, policy, acc), row in worst.iterrows()]
        text += " Furthest off: " + "; ".join(parts) + "."
    return text


def plot_time_vs_shape(table: pd.DataFrame) -> CaptionedFigure | None:
    """Median time vs problem size N*D*C, per op and policy, one panel per (device, dtype); untimed rows
    (``cuda-emulated``, NaN) are left out."""
    data = table[np.isfinite(table[TIME]) & (table[TIME] > 0)].copy()
    if data.empty:
        return None
    _style()
    data["work"] = data["N"].astype(float) * data["D"] * data["C"]
    data["series"] = (data["op"] + " " + data["policy"]).str.strip()
    panels = data[["device", "dtype"]].drop_duplicates().sort_values(["device", "dtype"])
    fig, axes = _grid(len(panels))
    for ax, panel in zip(axes.flat, panels.itertuples(index=False), strict=False):
        group = data[(data["device"] == panel.device) & (data["dtype"] == panel.dtype)]
        summary = group.groupby(["series", "op", "policy", "work"], as_index=False)[TIME].median()
        for (series, op, policy), points in summary.groupby(["series", "op", "policy"], sort=True):
            points = points.sort_values("work")
            ax.plot(points["work"], points[TIME], marker=MARKERS.get(op, "o"), ms=4, lw=1,
                    ls="-" if op == "lce" else "--", color=PALETTE.get(policy, "k"), label=series)
        _log_axes(ax)
        ax.xaxis.set_major_formatter(ticker.EngFormatter(sep=""))  # 50M, not 5e+07
        _honest_limits(ax, "y", summary[TIME], span=COST_SPAN)
        ax.set_title(f"{panel.device}, {panel.dtype}", fontsize=9)
        ax.set_xlabel("problem size N*D*C (multiply-adds per GEMM)")
    fig.supylabel("median time of forward+backward (ms)", fontsize=9)
    _legend_below(fig, axes)
    return CaptionedFigure(fig, "time_vs_shape",
                           "Median wall time of one forward+backward vs problem size N*D*C (each point: "
                           "median over the chunking methods and acc_dtypes of one op and policy); lce "
                           "solid, others dashed. CPU timings: one intra-op thread in each of the sweep's "
                           "worker processes (one per core), on a shared machine; measured on each configuration's "
                           "first seed (time does not depend on the values), untimed emulated-CUDA rows left out.")


SPAN_COLOURS = dict(zip(("kept", "call", "final", "chunk"), sns.color_palette("muted", 4), strict=True))


def _study_problem(table: pd.DataFrame) -> str:
    """``N=2048 D=256 C=16384, bfloat16``: the one problem a study's results file was measured at."""
    problems = table[["N", "D", "C", "dtype"]].drop_duplicates()
    return "; ".join(f"N={p.N} D={p.D} C={p.C}, {p.dtype}" for p in problems.itertuples(index=False))


def plot_buffer_breakdown(breakdown: pd.DataFrame) -> CaptionedFigure | None:
    """Stacked bar per lce configuration: every planned buffer (a ``memory_breakdown`` results file).

    Segments are coloured by when the buffer lives; the black tick is the plan's
    predicted peak (less than the sum: chunk buffers and the final rounding of
    an accumulator never coexist).
    """
    if breakdown.empty:
        return None
    _style()
    breakdown = breakdown.assign(MiB=breakdown["nbytes"] / 2**20)
    configs = list(dict.fromkeys(breakdown["config"]))
    fig = _figure(8, 0.9 * len(configs) + 1.6)
    ax = fig.subplots()
    labels = []
    for row, config in enumerate(configs):
        left = 0.0
        for buffer in breakdown[breakdown["config"] == config].itertuples():
            bar = ax.barh(row, buffer.MiB, left=left, color=SPAN_COLOURS[buffer.span], edgecolor="white",
                          height=0.6)[0]
            texts = (f"{buffer.buffer}\n{buffer.buffer_dtype}, {buffer.MiB:.1f} MiB",
                     f"{buffer.buffer}\n{buffer.buffer_dtype}", buffer.buffer)
            label = ax.text(left + buffer.MiB / 2, row, texts[0], ha="center", va="center", fontsize=6.5)
            label.set_in_layout(False)  # labels that do not fit are dropped after layout; they must not move it
            labels.append((label, bar, texts))
            left += buffer.MiB
        peak = breakdown[breakdown["config"] == config]["predicted_peak_bytes"].iloc[0] / 2**20
        ax.plot([peak, peak], [row - 0.38, row + 0.38], color="k", lw=2)
    ax.set_yticks(range(len(configs)), configs)
    ax.invert_yaxis()
    ax.set_xlabel("planned bytes per buffer (MiB); black tick: predicted peak extra memory")
    handles = [Rectangle((0, 0), 1, 1, color=c) for c in SPAN_COLOURS.values()]
    ax.legend(handles, [f"{span}" for span in SPAN_COLOURS], title="lives", fontsize=7, title_fontsize=7,
              frameon=False, loc="lower right")
    _fit_labels(fig, labels)
    return CaptionedFigure(fig, "memory_breakdown",
                           f"Every buffer lce's plan allocates for one forward+backward ({_study_problem(breakdown)}), "
                           "per configuration, coloured by lifetime (kept: returned gradients; call: the whole pass; "
                           "chunk: one chunk at a time; final: made after the loop); black tick: the plan's predicted "
                           "peak. Each segment is labelled with the longest of name, dtype and size that fits inside "
                           "it; narrower ones are left blank (memory_breakdown.csv lists every buffer). From "
                           "lce.plan, no measurement (python -m analysis memory-study).")


def _fit_labels(fig: Figure, labels: list) -> None:
    """Give each label the first of its texts that fits inside its bar segment; remove it if none does.

    ``labels`` holds ``(text artist, bar patch, candidate texts longest first)``. Sizes are measured
    on the laid-out figure, so the result holds at the figure's own size and dpi.
    """
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for label, bar, texts in labels:
        box = bar.get_window_extent(renderer)
        for text in texts:
            label.set_text(text)
            extent = label.get_window_extent(renderer)
            if extent.width <= box.width - 4 and extent.height <= box.height - 2:
                break
        else:
            label.remove()


def plot_memory_trace(trace: pd.DataFrame, breakdown: pd.DataFrame) -> CaptionedFigure | None:
    """Live extra memory over one forward+backward per configuration (a ``memory_trace`` results file).

    lce's predicted peaks, from the ``memory_breakdown`` file, are dashed.
    """
    if trace.empty:
        return None
    _style()
    fig = _figure(7, 4.2)
    ax = fig.subplots()
    configs = list(dict.fromkeys(trace["config"]))
    colours = dict(zip(configs, sns.color_palette("colorblind", len(configs)), strict=True))
    for config, events in trace.groupby("config", sort=False):
        # x: the event index scaled to [0, 1], so calls with different numbers of allocations share an axis.
        progress = events["event"] / max(len(events) - 1, 1)
        live = events["live_bytes"] / 2**20
        ax.step(progress, live.clip(lower=1e-3), where="post", lw=1.2, color=colours[config],
                label=f"{config} (peak {live.max():.1f} MiB)")
        predicted = breakdown[breakdown["config"] == config]["predicted_peak_bytes"]
        if len(predicted):
            ax.axhline(predicted.iloc[0] / 2**20, color=colours[config], ls="--", lw=0.8)
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda value, _: f"{value:g}"))
    ax.set_ylim(bottom=0.5)
    ax.set_xlabel("progress through one forward+backward (allocator events, scaled to 0-1)")
    ax.set_ylabel("live extra memory (MiB)")
    ax.legend(fontsize=7, frameon=False, loc="lower right")
    return CaptionedFigure(fig, "memory_trace",
                           "Live extra tensor memory after each allocation or free during one forward+backward "
                           f"({_study_problem(trace)}, CPU), measured from the allocator's event stream; dashed: "
                           "lce's predicted peak for the same configuration. Measured by python -m analysis "
                           "memory-study (event order is deterministic).")


def plot_bench_scaling(bench: pd.DataFrame) -> CaptionedFigure | None:
    """Time and peak memory vs N and vs C (log-log), per implementation and dtype, from bench.csv."""
    if bench.empty or not {"N", "C", "metric"} <= set(bench.columns):
        return None
    _style()
    # One CPU's data: the CPU measured at the most shapes (timings of different CPUs never share a line).
    shapes_per_cpu = bench.groupby("cpu_model")[["N", "C"]].apply(lambda rows: len(rows.drop_duplicates()))
    cpu = shapes_per_cpu.idxmax()
    bench = bench[bench["cpu_model"] == cpu]
    base_n, base_c = bench["N"].max(), bench["C"].max()
    data = bench[bench["impl"].isin(["lce", "torch", "unfused", "3-GEMM floor"])].copy()
    data = latest(data, ["impl", "dtype", "N", "D", "C", "metric"])
    fig = _figure(10, 7.5)
    axes = fig.subplots(2, 2, squeeze=False)
    colours = dict(zip(["lce", "torch", "unfused", "3-GEMM floor"], sns.color_palette("colorblind", 4), strict=True))
    styles = {"float32": "-", "bfloat16": "--"}
    for column, (axis, fixed, fixed_value) in enumerate((("N", "C", base_c), ("C", "N", base_n))):
        for row, (metric, scale, unit) in enumerate((("time_s", 1.0, "time of forward+backward (s)"),
                                                     ("peak_bytes", 2**-20, "peak extra memory (MiB)"))):
            ax = axes[row, column]
            subset = data[(data[fixed] == fixed_value) & (data["metric"] == metric)]
            for (impl, dtype), points in subset.groupby(["impl", "dtype"], sort=True):
                points = points.sort_values(axis)
                if len(points) < 2:
                    continue
                ax.plot(points[axis], points["value"] * scale, marker="o", ms=4, lw=1.2, color=colours[impl],
                        ls=styles.get(dtype, ":"), label=f"{impl} {dtype}")
            _log_axes(ax, x_base=2)
            _honest_limits(ax, "y", subset["value"] * scale, span=COST_SPAN)
            ax.set_xlabel(f"{axis} ({fixed}={fixed_value}, D={int(data['D'].iloc[0])})")
            ax.set_ylabel(unit)
    _legend_below(fig, axes)
    return CaptionedFigure(fig, "bench_scaling",
                           "Time (median of repeats) and peak extra memory (measured, fresh process) of one "
                           f"forward+backward vs N and vs C on {cpu}, for lce with default options, torch's native "
                           "op with default options, the unfused reference and the 3-GEMM floor "
                           "(6*N*D*C at the measured GEMM rate); solid fp32, dashed bf16. Data: "
                           "analysis/results/bench.csv (python -m analysis bench --scaling).")


def plot_chunk_sweep(chunks: pd.DataFrame) -> CaptionedFigure | None:
    """lce's time per chunk size, per policy, one panel per (dtype, CPU model), auto's row floor marked."""
    if chunks.empty:
        return None
    from lce.policies import CPU_MIN_ROWS

    from .inputs import DTYPES

    _style()
    data = latest(chunks[chunks["metric"] == "time_s"], ["cpu_model", "impl", "dtype", "N", "D", "C", "chunk_size"])
    panels = data[["dtype", "cpu_model"]].drop_duplicates().sort_values(["dtype", "cpu_model"])
    fig, axes = _grid(len(panels), columns=2)
    series = sorted(data["impl"].unique())
    colours = dict(zip(series, sns.color_palette("colorblind", len(series)), strict=True))
    for ax, panel in zip(axes.flat, panels.itertuples(index=False), strict=False):
        group = data[(data["dtype"] == panel.dtype) & (data["cpu_model"] == panel.cpu_model)]
        for impl, points in group.groupby("impl", sort=True):
            points = points.sort_values("chunk_size")
            label = "lce default options" if impl == "lce" else f"{impl} (explicit)"
            ax.plot(points["chunk_size"], points["value"], marker="o", ms=4, lw=1.2, color=colours[impl],
                    label=label)
        floor = CPU_MIN_ROWS.get(DTYPES[panel.dtype])
        if floor is not None:
            ax.axvline(floor, color="k", ls="--", lw=0.8, label="auto's row floor (CPU_MIN_ROWS)")
        _log_axes(ax, y=False, x_base=2)
        ax.set_ylim(bottom=0)
        first = group.iloc[0]
        ax.set_title(f"{panel.dtype}, {panel.cpu_model}\nN={first.N} D={first.D} C={first.C}", fontsize=9)
        ax.set_xlabel("rows per chunk")
    fig.supylabel("time of forward+backward (s)", fontsize=9)
    _legend_below(fig, axes)
    return CaptionedFigure(fig, "chunk_sweep",
                           "Time of one forward+backward against the rows per chunk, per policy and CPU (median of "
                           "interleaved repeats, 2 threads; the spreads are in the data). The dashed "
                           "line is the floor lce's CPU \"auto\" chunking keeps (CPU_MIN_ROWS); torch's aspect-ratio "
                           "rule gives 32-64 rows at this shape. Data: the chunk_sweep results "
                           "(python -m analysis bench --chunk-sweep).")


def plot_families(stats: pd.DataFrame) -> CaptionedFigure | None:
    """What each input family looks like: mean loss, p_target and margin quantiles, feature outliers, rank-frequency."""
    if stats.empty:
        return None
    _style()
    data = latest(stats, ["family", "statistic", "rank"]) if "date" in stats else stats
    families = list(dict.fromkeys(data["family"]))
    colours = dict(zip(families, sns.color_palette("colorblind", len(families)), strict=True))
    value = data[data["statistic"] != "target_count"].pivot(index="family", columns="statistic", values="value")
    value = value.reindex(families)
    fig, axes = _grid(5, width=3.6, height=3.0, columns=5)
    ax = axes.flat[0]
    ax.barh(families, value["mean_loss"], color=[colours[f] for f in families])
    ax.invert_yaxis()
    ax.set_xlabel("mean loss (nats)")
    quantiles = sorted(float(c.split("_q")[1]) for c in value.columns if c.startswith("p_target_q"))
    for ax, name, xlabel, log in ((axes.flat[1], "p_target", "target probability p_y", True),
                                  (axes.flat[2], "margin", "target logit − best other (nats)", False)):
        for position, family in enumerate(families):
            points = [value.loc[family, f"{name}_q{q:g}"] for q in quantiles]
            ax.plot(points, [position] * len(points), "-", color=colours[family], lw=1)
            ax.scatter(points, [position] * len(points), color=colours[family], s=[10, 18, 34, 18, 10][:len(points)])
        ax.set_yticks(range(len(families)), families if name == "p_target" else [""] * len(families))
        ax.invert_yaxis()
        ax.set_xlabel(xlabel + "\n(5, 25, 50, 75, 95th percentiles)")
        if log:
            ax.set_xscale("log")
            ax.set_xlim(left=max(1e-12, np.nanmin(value[[f"p_target_q{q:g}" for q in quantiles]].to_numpy()) / 3),
                        right=1.5)
    ax = axes.flat[3]
    ax.barh(families, value["feature_rms_max_over_median"], color=[colours[f] for f in families])
    ax.set_yticks(range(len(families)), [""] * len(families))
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("largest feature RMS / median feature RMS")
    ax = axes.flat[4]
    curves = data[data["statistic"] == "target_count"]
    for family, curve in curves.groupby("family", sort=False):
        ax.plot(curve["rank"], curve["value"], color=colours[family], lw=1.2, label=family)
    _log_axes(ax)
    ax.set_xlabel("class rank (1 = most frequent target)")
    ax.set_ylabel("times targeted")
    ax.legend(fontsize=7, frameon=False)
    first = data.iloc[0]
    return CaptionedFigure(fig, "families",
                           f"The input families at N={first.N} D={first.D} C={first.C} (seed {first.seed}), in fp64 "
                           "on each family's fp32 draw: mean loss; percentiles of the target's probability and of "
                           "its logit's lead over the best other class; how far the largest feature dimension "
                           "stands out; how often each class is a target. Data: the family_stats results "
                           "(python -m analysis family-stats).")


SWEEP_FIGURES: tuple[Callable[[pd.DataFrame], CaptionedFigure | None], ...] = (
    lambda t: plot_error_vs_memory(t, "cpu"),
    lambda t: plot_error_vs_memory(t, "cuda-emulated"),
    lambda t: plot_error_vs_memory(t, "cuda"),
    lambda t: plot_error_vs_chunks(t, "cpu"),
    lambda t: plot_error_vs_chunks(t, "cuda-emulated"),
    lambda t: plot_error_vs_chunks(t, "cuda"),
    lambda t: plot_row_errors(t, "cpu"),
    lambda t: plot_row_errors(t, "cuda-emulated"),
    lambda t: plot_row_errors(t, "cuda"),
    plot_gradient_bias,
    plot_memory_model,
    plot_time_vs_shape,
)
"""Every figure of the sweep table, in README order (device-specific ones are skipped without data)."""


def _brace_label(names: list[str]) -> str:
    """Names of the same word count that differ word by word, written as one: ``lce {accurate,balanced} cpu``.

    Exact only when the names are every combination of their words' values; otherwise the names are split on
    their third word (the layout), then their last (the chunking), and the parts joined by " = "."""
    words = [name.split(" ") for name in names]
    if len({len(w) for w in words}) == 1:
        columns = list(zip(*words, strict=True))
        values = [sorted(set(column), key=column.index) for column in columns]
        if np.prod([len(v) for v in values]) == len(names):
            return " ".join(v[0] if len(v) == 1 else "{" + ",".join(v) + "}" for v in values)
        for position in (2, -1):
            parts = {}
            for name, w in zip(names, words, strict=True):
                parts.setdefault(w[position], []).append(name)
            if len(parts) > 1:
                return " = ".join(_brace_label(part) for part in parts.values())
    return " = ".join(names)


def _merge_identical(data: pd.DataFrame, keys: list[str], values: list[str]) -> pd.Series:
    """Each ``impl``'s display name, implementations with identical ``values`` at every ``keys`` merged into one
    (:func:`_brace_label`): contenders whose options resolve to the same arithmetic draw one line instead of
    hiding each other."""
    wide = data.pivot_table(index="impl", columns=keys, values=values, aggfunc="first", dropna=False)
    signature = wide.apply(lambda row: tuple(np.round(row.to_numpy(dtype=float), 12)), axis=1)
    names = {}
    for _, members in signature.groupby(signature, sort=False):
        group = sorted(members.index)
        for impl in group:
            names[impl] = _brace_label(group)
    return data["impl"].map(names)


def _study_colours(labels) -> dict[str, tuple]:
    """One colour per (merged) implementation label of a numerics study, in sorted order."""
    labels = sorted(set(labels))
    palette = sns.color_palette("tab20" if len(labels) > 10 else "colorblind", len(labels))
    return dict(zip(labels, palette, strict=True))


MARGIN_OUTPUTS = {"grad_input_floors": "grad_input (floors)", "grad_weight_floors": "grad_weight (floors)",
                  "loss_ulps": "loss (ulps of the dtype)"}


def plot_margins(margins: pd.DataFrame) -> CaptionedFigure | None:
    """Error against the target's lead (nats), one line per implementation: seed median, 5-95% band."""
    if margins.empty:
        return None
    _style()
    data = latest(margins, ["impl", "dtype", "N", "D", "C", "seed", "margin"])
    data = data.assign(impl=_merge_identical(data, ["dtype", "margin", "seed"], list(MARGIN_OUTPUTS)))
    dtypes = sorted(data["dtype"].unique())
    fig = _figure(4.2 * len(MARGIN_OUTPUTS), 3.4 * len(dtypes) + 1.6)
    axes = fig.subplots(len(dtypes), len(MARGIN_OUTPUTS), squeeze=False)
    colours = _study_colours(data["impl"])
    for row, dtype in enumerate(dtypes):
        for column, (output, label) in enumerate(MARGIN_OUTPUTS.items()):
            ax = axes[row, column]
            group = data[data["dtype"] == dtype]
            floor = 0.01 if output == "loss_ulps" else 0.5  # an exact loss is 0 ulps: clamp onto the log axis
            values = group[output].clip(lower=floor)
            stats = values.groupby([group["impl"], group["margin"]]).quantile([0.05, 0.5, 0.95]).unstack()
            for impl in sorted(stats.index.get_level_values(0).unique()):
                line = stats.loc[impl].sort_index()
                ax.plot(line.index, line[0.5], marker="o", ms=3, lw=1.1, color=colours[impl],
                        ls="-" if impl.startswith("lce") else "--", label=impl)
                ax.fill_between(line.index, line[0.05], line[0.95], color=colours[impl], alpha=0.12, lw=0)
            ax.axhline(1.0, color="k", lw=0.8, ls=":")
            _log_axes(ax, x=False)
            _honest_limits(ax, "y", values, span=ERROR_SPAN, floor=None if output == "loss_ulps" else 1.0)
            ax.set_title(f"{dtype}: {label}", fontsize=9)
            ax.set_xlabel("target's lead over every other class (nats)")
    _legend_below(fig, axes, columns=2)
    first = data.iloc[0]
    seeds = data["seed"].nunique()
    caption = ("Error against fp64 on rows whose target logit leads every other class by the margin "
               f"(N={first.N} D={first.D} C={first.C}, every row confident; analysis.families.confident_rows), per "
               f"implementation: the median over {seeds} seeds, the band their 5-95% range; dashed: torch and the "
               "unfused formula. \"cuda\" is lce's CUDA layouts, emulated on CPU; implementations whose numbers "
               "are identical everywhere share one line (names in braces: every combination). Gradients in "
               "multiples of their rounding floor (1 = the exact answer rounded), the loss in ulps of the dtype "
               "(values below 0.01 drawn at 0.01). lce \"accurate\" needs acc=fp32 (or \"auto\") to be at the "
               "floor: with the default acc_dtype an explicit policy computes in the input dtype. In fp16 the exact "
               "gradients of these rows fall below fp16's subnormals from about 15 nats on (mean over the rows), so "
               "every answer reads 1 floor there: only bf16 separates the implementations at large margins. Data: "
               "the margins results (python -m analysis margins).")
    return CaptionedFigure(fig, "margins", caption)


RARE_BIN_COLOURS = dict(zip(("never", "1-2", "3-15", "16+"), sns.color_palette("viridis", 4), strict=True))


def plot_rare_rows(rare: pd.DataFrame) -> CaptionedFigure | None:
    """Per implementation (rows) and dtype (panels): grad_weight's row error per bin of the class's target count
    (filled: p99, median over seeds; open: max over seeds) and the Frobenius error (black bar)."""
    if rare.empty:
        return None
    _style()
    data = latest(rare, ["impl", "dtype", "N", "D", "C", "seed", "bin"])
    n, d, c = data.groupby(["N", "D", "C"]).size().idxmax()  # the study; spot checks at other shapes stay out
    data = data[(data["N"] == n) & (data["D"] == d) & (data["C"] == c)]
    data = data.assign(impl=_merge_identical(data, ["dtype", "seed", "bin"], ["row_p99", "row_max",
                                                                               "grad_weight_floors"]))
    dtypes = sorted(data["dtype"].unique(), reverse=True)  # float16 first: its auto pick is the case
    impls = sorted(data["impl"].unique(), key=lambda name: (not name.startswith("lce"), name))
    position = {impl: index for index, impl in enumerate(impls)}
    fig = _figure(6.0 * len(dtypes) + 3.5, 0.42 * len(impls) + 2.0)
    axes = fig.subplots(1, len(dtypes), squeeze=False, sharey=True)
    offsets = dict(zip(RARE_BIN_COLOURS, np.linspace(-0.27, 0.27, len(RARE_BIN_COLOURS)), strict=True))
    for ax, dtype in zip(axes.flat, dtypes, strict=True):
        group = data[data["dtype"] == dtype]
        p99 = group.groupby(["impl", "bin"])["row_p99"].median()
        worst = group.groupby(["impl", "bin"])["row_max"].max()
        fro = group[group["bin"] == "all"].groupby("impl")["grad_weight_floors"].median()
        for name, colour in RARE_BIN_COLOURS.items():
            here = [impl for impl in impls if (impl, name) in p99.index]
            y = [position[impl] + offsets[name] for impl in here]
            ax.scatter([p99[(impl, name)] for impl in here], y, s=16, color=colour,
                       label=f"p99, class targeted {name} times" if name != "never" else "p99, class never targeted")
            ax.scatter([worst[(impl, name)] for impl in here], y, s=16, facecolor="none", edgecolor=colour,
                       label=f"max ({name})")
        ax.scatter(fro.to_numpy(), [position[impl] for impl in fro.index], marker="|", s=120, color="k",
                   label="Frobenius (median over seeds)")
        ax.axvline(1.0, color="k", lw=0.8, ls=":")
        _log_axes(ax, y=False)
        _honest_limits(ax, "x", pd.concat([p99, worst, fro]), span=ERROR_SPAN, floor=1.0)
        ax.set_yticks(range(len(impls)), [textwrap.fill(impl, 60) for impl in impls], fontsize=7)
        ax.set_ylim(len(impls) - 0.5, -0.5)
        first = group.iloc[0]
        ax.set_title(f"{dtype}, N={first.N} D={first.D} C={first.C}, {group['seed'].nunique()} seeds", fontsize=9)
        ax.set_xlabel("grad_weight row error (multiples of the row's rounding floor)")
    _legend_below(fig, axes)
    return CaptionedFigure(fig, "rare_rows",
                           "Weight-gradient rows of rarely targeted classes: each class's row error over its own "
                           "rounding floor (analysis.metrics.row_floors), binned by how often the class is a target "
                           "in the batch (calibrated family: Zipfian prior, targets sampled from the model), per "
                           "implementation; filled: the 99th percentile (median over seeds), open: the maximum (over "
                           "all seeds), black bar: the Frobenius error of the whole gradient. \"cuda\" rows are "
                           "lce's CUDA layouts emulated on CPU; \"auto\" resolves to the AUTO_TABLE entry of its "
                           "layout and dtype; implementations whose numbers are identical everywhere share one row "
                           "(names in braces: every combination). Drawn at the shape with the most rows; spot checks "
                           "at other shapes are in the data only. Data: the rare_rows results (python -m analysis "
                           "rare-rows).")


def draw_all(table: pd.DataFrame, *, memory_breakdown: pd.DataFrame | None = None,
             memory_trace: pd.DataFrame | None = None, bench: pd.DataFrame | None = None,
             chunk_sweep: pd.DataFrame | None = None, family_stats: pd.DataFrame | None = None,
             margins: pd.DataFrame | None = None, rare_rows: pd.DataFrame | None = None) -> list[CaptionedFigure]:
    """Every figure the given results tables have data for, in README order: sweep, memory study, bench,
    input families, numerics studies.

    ``table`` is the prepared sweep table; the others are the tables of the
    ``memory_breakdown``, ``memory_trace``, ``bench``, ``chunk_sweep``, ``margins`` and ``rare_rows``
    results files (None or empty: their figures are skipped).
    """
    empty = pd.DataFrame()
    breakdown = empty if memory_breakdown is None else memory_breakdown
    drawn = [draw(table) for draw in SWEEP_FIGURES]
    drawn += [plot_buffer_breakdown(breakdown), plot_memory_trace(empty if memory_trace is None else memory_trace,
                                                                  breakdown)]
    drawn.append(plot_bench_scaling(empty if bench is None else bench))
    drawn.append(plot_chunk_sweep(empty if chunk_sweep is None else chunk_sweep))
    drawn.append(plot_families(empty if family_stats is None else family_stats))
    drawn.append(plot_margins(empty if margins is None else margins))
    drawn.append(plot_rare_rows(empty if rare_rows is None else rare_rows))
    return [figure for figure in drawn if figure is not None]
