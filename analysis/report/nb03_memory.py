"""Notebook 03 (memory profiling): its figures and conclusions.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib import ticker
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from analysis.report.style import CaptionedFigure, apply_style, log_axes, new_figure
from analysis.report.wording import (
    _conclusion,
    _cpus,
    _dtypes,
    _families,
    _join,
    _one_cpu,
    _one_seed,
    _range,
    _seeds,
    _shapes,
    _values,
    random_family,
)


def plot_memory_model(table: pd.DataFrame) -> CaptionedFigure | None:
    """lce's predicted peak (Plan.peak_extra_bytes) vs the measured one, with the +-15% band."""
    data = table[(table["op"] == "lce") & (table["device"] != "cuda-emulated")].dropna(
        subset=["peak_bytes_modeled", "peak_bytes_measured"])
    if data.empty:
        return None
    apply_style()
    fig = new_figure(5, 4.4)
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
    log_axes(ax)
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
    apply_style()
    breakdown = breakdown.assign(MiB=breakdown["nbytes"] / 2**20)
    configs = list(dict.fromkeys(breakdown["config"]))
    fig = new_figure(8, 0.9 * len(configs) + 1.6)
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
    apply_style()
    fig = new_figure(7, 4.2)
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

MODEL_BAND = 0.15
"""A memory prediction within this fraction of the measured peak counts as matching it."""


# --- 03 · memory -----------------------------------------------------------------------------------------------


def memory_model(table: pd.DataFrame) -> str:
    """03: how close lce's predicted peak is to the measured one over the lce CPU runs of a prepared sweep table."""
    data = table[(table["op"] == "lce") & (table["device"] == "cpu")].dropna(
        subset=["peak_bytes_measured", "peak_bytes_modeled"])
    if data.empty:
        return _conclusion("The results hold no measured lce CPU runs.", inputs="the committed sweep results.",
                           limits="nothing to conclude from.")
    ratio = data["peak_bytes_measured"].astype(float) / data["peak_bytes_modeled"].astype(float)
    within = int(((ratio - 1).abs() <= MODEL_BAND).sum())
    finding = (f"lce's memory model predicts the measured peak within ±{MODEL_BAND:.0%} on {within} of {len(ratio)} "
               f"runs (measured/modeled {ratio.min():.2f}–{ratio.max():.2f}, median {ratio.median():.2f}).")
    off = data.assign(ratio=ratio)[(ratio - 1).abs() > MODEL_BAND]
    bullets = []
    if len(off):
        worst = off.groupby(["dtype", "policy", "acc_dtype"])["ratio"].agg(["min", "max", "size"])
        worst = worst.reindex(worst["max"].sub(1).abs().sort_values(ascending=False).index).head(4)
        bullets = [f"{dtype} {policy} acc={acc}: {int(row['size'])} runs outside, measured/modeled "
                   f"{_range([row['min'], row['max']])}" for (dtype, policy, acc), row in worst.iterrows()]
        above = int((off["ratio"] > 1).sum())
        share = f"all {above}" if above == len(off) else f"{above} of the {len(off)}"
        finding += f" Outside it, {share} measure more than predicted" + (":" if bullets else ".")
    methods = _join(_values(data, "memory_method"))
    return _conclusion(
        finding, bullets,
        inputs=(f"every lce run of the committed sweep on the CPU: {_families(data)}; {_shapes(data)}; "
                f"{_dtypes(data)}; {_cpus(data)}; {_seeds(data)}; measured: peak live tensor bytes of one "
                f"forward+backward ({methods}); modeled: lce.plan's peak_extra_bytes."),
        limits=(f"{_one_seed(data)}small shapes, where fixed overheads weigh more than at LLM sizes; the CPU "
                f"allocator only (no GPU data committed); {_one_cpu(data)}."))


def _mib(nbytes: float) -> str:
    return f"{nbytes / 2**20:.1f} MiB"


def buffer_breakdown(breakdown: pd.DataFrame) -> str:
    """03: what lce's plan allocates per configuration and what separates the largest from the smallest peak
    (a ``memory_breakdown`` results table)."""
    peaks = breakdown.groupby("config", sort=False)["predicted_peak_bytes"].first()
    largest, smallest = peaks.idxmax(), peaks.idxmin()
    bullets = []
    for config, peak in peaks.items():
        buffers = breakdown[breakdown["config"] == config].sort_values("nbytes", ascending=False)
        top = buffers.head(2)
        bullets.append(f"{config}: predicted peak {_mib(peak)}, {len(buffers)} buffers; largest "
                       + _join([f"{b.buffer} ({b.buffer_dtype}, {b.span}, {_mib(b.nbytes)})"
                                for b in top.itertuples()]))
    finding = (f"lce's plans predict peaks from {_mib(peaks.min())} ({smallest}) to {_mib(peaks.max())} "
               f"({largest}), {peaks.max() / peaks.min():.1f}x apart.")
    missing = set(breakdown[breakdown["config"] == largest]["buffer"]) - set(
        breakdown[breakdown["config"] == smallest]["buffer"])
    if missing:
        rows = breakdown[(breakdown["config"] == largest) & breakdown["buffer"].isin(missing)]
        finding += (f" {smallest} has no " + _join([f"{b.buffer} ({b.buffer_dtype}, {_mib(b.nbytes)})"
                                                   for b in rows.itertuples()]) + ".")
    return _conclusion(
        finding, bullets,
        inputs=(f"lce.plan for {_shapes(breakdown)}, {_dtypes(breakdown)} input, no bias; configurations "
                f"{_join(list(peaks.index))}; recorded by `python -m analysis memory-study` (revision "
                f"{_join(_values(breakdown, 'git_revision'))})."),
        limits=("a plan, not a measurement (the next section measures); one shape and one input dtype; the sum of "
                "the buffers exceeds the peak because chunk buffers and the final rounding never coexist."))


def memory_trace(peaks: pd.DataFrame, trace: pd.DataFrame) -> str:
    """03: measured peaks of one forward+backward against lce's predictions and the unfused reference
    (``memory_study.peaks`` of a ``memory_trace`` table, and that table for its provenance)."""
    bullets = []
    for row in peaks.itertuples():
        text = f"{row.config}: {row.measured_mib:.1f} MiB"
        if np.isfinite(row.predicted_mib):
            text += f" (predicted {row.predicted_mib:.1f}, measured/predicted {row.measured_over_predicted:.2f})"
        if np.isfinite(row.over_reference) and row.config != "reference":
            text += f", {row.over_reference:.2f}x the reference"
        bullets.append(text)
    lce = peaks[peaks["config"].str.startswith("lce")]
    others = peaks[~peaks["config"].str.startswith("lce")]
    finding = (f"Measured over one forward+backward, lce's configurations peak at "
               f"{_range(lce['measured_mib'], '.1f')} MiB, within {_range(lce['measured_over_predicted'])}x of "
               f"their predicted peaks")
    if len(others):
        finding += "; " + _join([f"{r.config} peaks at {r.measured_mib:.1f} MiB" for r in others.itertuples()])
    finding += "."
    return _conclusion(
        finding, bullets,
        inputs=(f"{random_family(bias=False)}; {_shapes(trace)}; {_dtypes(trace)}; CPU ({_cpus(trace)}); one call "
                "per configuration after a warm-up call, live tensor bytes after each allocator event "
                "(memory does not depend on the input values)."),
        limits=("the CPU allocator only (CUDA needs a GPU); one shape and one dtype; live tensor bytes, not the "
                "process's resident memory."))
