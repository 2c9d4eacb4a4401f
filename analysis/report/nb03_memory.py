"""Notebook 03 (memory profiling): its figures and key numbers.

The notebook's prose quotes these numbers; ``tests/claims/test_nb03_memory.py`` asserts each claim the prose makes
about them.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib import ticker
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from analysis.report.style import CaptionedFigure, apply_style, log_axes, new_figure


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


def model_runs(table: pd.DataFrame) -> pd.DataFrame:
    """The lce CPU runs of a prepared sweep table with a measured and a modeled peak, with their ``ratio``
    (measured over modeled) and whether it is ``within`` :data:`MODEL_BAND` of 1."""
    data = table[(table["op"] == "lce") & (table["device"] == "cpu")].dropna(
        subset=["peak_bytes_measured", "peak_bytes_modeled"])
    ratio = data["peak_bytes_measured"].astype(float) / data["peak_bytes_modeled"].astype(float)
    return data.assign(ratio=ratio, within=(ratio - 1).abs() <= MODEL_BAND)


def plan_sizes(breakdown: pd.DataFrame) -> pd.DataFrame:
    """Per configuration of a ``memory_breakdown`` table, in its order: the plan's predicted ``peak`` and the
    ``total`` of its buffers in MiB, and how many ``buffers`` it plans."""
    sizes = breakdown.groupby("config", sort=False).agg(peak=("predicted_peak_bytes", "first"),
                                                        total=("nbytes", "sum"), buffers=("buffer", "size"))
    return sizes.assign(peak=sizes["peak"] / 2**20, total=sizes["total"] / 2**20)


def lacks(breakdown: pd.DataFrame, config: str, other: str) -> pd.DataFrame:
    """The buffers ``other`` plans and ``config`` does not (``buffer``, ``buffer_dtype``, ``MiB``), largest first."""
    theirs = breakdown[(breakdown["config"] == other) & ~breakdown["buffer"].isin(
        breakdown.loc[breakdown["config"] == config, "buffer"])]
    return theirs.assign(MiB=theirs["nbytes"] / 2**20).sort_values("MiB", ascending=False)[
        ["buffer", "buffer_dtype", "MiB"]]


def gpu_memory_fit(gpu: pd.DataFrame) -> pd.DataFrame:
    """The ``ok`` rows of a ``gpu_memory`` results table, one per call and shape: the call (policy, and acc_dtype
    where given), the policy it resolved to, modeled and measured (peak allocated) GiB and their ratio."""
    rows = gpu[gpu["status"] == "ok"]
    calls = rows["policy"] + rows["acc_dtype"].map(lambda acc: "" if acc == "default" else f" acc={acc}")
    return pd.DataFrame({
        "device_name": rows["device_name"], "torch_version": rows["torch_version"],
        "shape": [f"{n}×{d}×{c}" for n, d, c in zip(rows["N"], rows["D"], rows["C"], strict=True)],
        "call": calls, "resolved_policy": rows["resolved_policy"], "num_chunks": rows["num_chunks"],
        "modeled_gib": rows["modeled_peak_bytes"] / 2**30, "measured_gib": rows["peak_allocated_bytes"] / 2**30,
        "measured_over_modeled": rows["peak_allocated_bytes"] / rows["modeled_peak_bytes"]}).reset_index(drop=True)

