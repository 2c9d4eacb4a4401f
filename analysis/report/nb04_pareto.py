"""Notebook 04 (Pareto fronts and the auto table): its figures and key numbers, and the speed figures of the README.

The notebook's prose quotes these numbers; ``tests/claims/test_nb04_pareto.py`` asserts each claim the prose makes
about them.
"""

from __future__ import annotations

import textwrap

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib import ticker

from analysis.core.provenance import cpu_kinds
from analysis.core.results_io import latest
from analysis.judge.pareto import (
    ERROR,
    INTERVAL,
    MEMORY,
    TIME,
    front_mask,
    recommend_choices,
    same_numbers,
    seed_interval,
    verdicts,
)
from analysis.report.style import (
    COST_SPAN,
    ERROR_LABEL,
    ERROR_SPAN,
    MARKERS,
    PALETTE,
    POLICY_ORDER,
    CaptionedFigure,
    apply_style,
    honest_limits,
    legend_below,
    log_axes,
    new_figure,
    panel_grid,
    seed_caption,
)

FAMILY_MARKERS = {"random": "o", "calibrated": "s", "trained": "^"}
"""Marker shape per input family in the error-vs-memory figures (other families take :data:`_SPARE_MARKERS`)."""
_SPARE_MARKERS = ("D", "v", "P", "X", "<", ">")
FRONT_STYLES = ("-", "--", ":", "-.")
"""Line style of each family's Pareto front, families in sorted order."""
OPEN_OPS = ("torch", "compiled")
"""Ops drawn as open markers (lce and the unfused reference are filled)."""


def _family_styles(families) -> dict[str, tuple[str, str]]:
    """(marker, front line style) per family, sorted by name."""
    spare = iter(_SPARE_MARKERS)
    return {family: (FAMILY_MARKERS.get(family) or next(spare), FRONT_STYLES[index % len(FRONT_STYLES)])
            for index, family in enumerate(sorted(families))}


def main_shape(data: pd.DataFrame) -> tuple[int, int, int]:
    """(N, D, C) of the largest problem (by N*D*C) every input family of ``data`` was measured at; the largest
    of all when no shape is common to every family."""
    families = data.groupby(["N", "D", "C"])["family"].nunique()
    common = families[families == data["family"].nunique()]
    pool = common if len(common) else families
    return max(pool.index, key=lambda shape: (shape[0] * shape[1] * shape[2], shape))


def _pick_text(pick: str) -> str:
    """``auto: accurate ar`` from a verdict's pick (``accurate aspect_ratio``, notes in brackets dropped)."""
    return "auto: " + pick.split(" (")[0].replace("aspect_ratio", "ar")


POLICY_SIZES = {"auto": 120.0, "accurate": 80.0, "balanced": 48.0, "compact": 24.0, "": 60.0}
"""Marker area (points^2) per policy in the error-vs-memory figures: policies that compute the same numbers at the
same memory land on one spot, so each is drawn smaller than the one before and the coinciding ones show as rings
around each other (the largest, drawn first, at the back)."""


def _pareto_panel(ax, group: pd.DataFrame, picks: pd.DataFrame, styles: dict[str, tuple[str, str]]) -> pd.DataFrame:
    """One (device, dtype, shape) panel: each configuration's seed median (bar: its interval) marked by family,
    coloured by policy, filled for lce and open for torch; each family's Pareto front of the medians; the auto
    picks ringed and labelled. Returns the points drawn."""
    points = seed_interval(group, [ERROR, MEMORY])
    order = {policy: index for index, policy in enumerate(POLICY_ORDER)}
    series = sorted(points.groupby(["family", "op", "policy"], sort=True),
                    key=lambda item: (order.get(item[0][2], len(order)), item[0]))
    for (family, op, policy), rows in series:
        colour = PALETTE.get(policy, PALETTE[""])
        below, above = rows[ERROR] - rows[f"{ERROR}_low"], rows[f"{ERROR}_high"] - rows[ERROR]
        ax.errorbar(rows[MEMORY], rows[ERROR], yerr=[below, above], fmt="none", ecolor=colour, elinewidth=0.7,
                    alpha=0.35, zorder=2)
        ax.scatter(rows[MEMORY], rows[ERROR], s=POLICY_SIZES.get(policy, 40.0), marker=styles[family][0],
                   linewidths=1.3, facecolors="none" if op in OPEN_OPS else colour, edgecolors=colour, zorder=3,
                   label=f"{family} {op} {policy}".strip())
    for family, rows in points.groupby("family", sort=True):
        front = rows[front_mask(rows[MEMORY], rows[ERROR])].sort_values(MEMORY)
        ax.step(front[MEMORY], front[ERROR], where="post", color="k", lw=1.1, ls=styles[family][1], alpha=0.75,
                zorder=4, label=f"Pareto front ({family})")
    log_axes(ax)
    honest_limits(ax, "x", points[MEMORY], span=COST_SPAN)
    honest_limits(ax, "y", pd.concat([points[f"{ERROR}_low"], points[f"{ERROR}_high"]]), span=ERROR_SPAN, floor=1.0)
    _label_picks(ax, picks, sorted(set(points["family"])))
    return points


def _label_picks(ax, picks: pd.DataFrame, families: list[str]) -> None:
    """Ring each auto pick (seed median) and label what it resolved to, once per resolution (naming the families
    only when they resolve differently), inside the axes on the side away from the nearest edge."""
    texts = {family: _pick_text(pick) for family, pick in zip(picks["family"], picks["pick"], strict=True)}
    to_axes = ax.transScale + ax.transLimits  # data -> axes fraction, whatever the figure's layout
    for number, (text, rows) in enumerate(picks.groupby(picks["family"].map(texts), sort=True)):
        ax.scatter(rows["peak_mib"], rows["error"], s=230, facecolors="none", edgecolors="k", linewidths=1.6,
                   zorder=5)
        members = sorted(rows["family"])
        if members != families:
            text += f" ({', '.join(members)})"
        top = rows.loc[rows["error"].idxmax()]
        fx, fy = to_axes.transform((top["peak_mib"], top["error"]))
        right, up = fx < 0.5, fy < 0.75
        dx, dy = (16 if right else -16), (24 + 16 * number) * (1 if up else -1)
        ax.annotate(text, (top["peak_mib"], top["error"]), xytext=(dx, dy), textcoords="offset points",
                    ha="left" if right else "right", va="bottom" if up else "top", fontsize=8, fontweight="bold",
                    zorder=6, bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": "none", "alpha": 0.85},
                    arrowprops={"arrowstyle": "-", "color": "k", "lw": 0.8, "shrinkB": 7})


def _device_verdicts(table: pd.DataFrame, device: str) -> pd.DataFrame:
    """The verdicts that hold ``device``'s picks: the emulation's own when a GPU's rows judge the CUDA entries."""
    return verdicts(table[table["device"] != "cuda"] if device == "cuda-emulated" else table)


def _picks_of(picks: pd.DataFrame, device: str, dtype: str, shape: tuple[int, int, int]) -> pd.DataFrame:
    return picks[(picks["device"] == device) & (picks["dtype"] == dtype)
                 & (picks["shape"] == "x".join(str(int(v)) for v in shape))]


def _pareto_legend(fig, data: pd.DataFrame, styles: dict[str, tuple[str, str]]) -> None:
    """One compact legend in two rows: the colours (policies) and the ring (auto pick) above, the fills (ops) and
    the marker shapes and front line styles (families) below."""
    from matplotlib.lines import Line2D

    def dot(label, colour="k", marker="o", filled=True, ls="none"):
        return Line2D([], [], color=colour, marker=marker, ls=ls, ms=7, mew=1.3,
                      mfc=colour if filled else "none", label=label)

    ops = set(data["op"])
    top = [dot(policy, PALETTE[policy]) for policy in POLICY_ORDER if policy and policy in set(data["policy"])]
    if ops & {"reference", "compiled"}:
        top.append(dot(" / ".join(text for op, text in (("reference", "unfused (filled)"),
                                                        ("compiled", "torch.compile (open)")) if op in ops),
                       PALETTE[""]))
    top.append(Line2D([], [], ls="none", marker="o", ms=12, mfc="none", mec="k", mew=1.6, label='"auto" pick'))
    bottom = [dot("lce: filled", "0.35")] + ([dot("torch: open", "0.35", filled=False)] if "torch" in ops else [])
    bottom += [dot(f"{family} and its front", "k", marker, filled=False, ls=ls)
               for family, (marker, ls) in styles.items()]
    columns = max(len(top), len(bottom))
    blank = Line2D([], [], ls="none", label=" ")
    top += [blank] * (columns - len(top))
    bottom += [blank] * (columns - len(bottom))
    handles = [handle for pair in zip(top, bottom, strict=True) for handle in pair]  # filled column by column
    fig.legend(handles=handles, loc="outside lower center", ncol=columns, frameon=False, fontsize=8,
               handlelength=2.8, columnspacing=1.6)


def _memory_source(device: str) -> str:
    return "modeled by lce: the CPU stand-in's measured memory is not the GPU's" if device == "cuda-emulated" \
        else "measured"


def _pareto_caption(data: pd.DataFrame, device: str, where: str) -> str:
    ops = set(data["op"])
    fill = "lce filled, torch open" if "torch" in ops else "lce's runs only: torch and the unfused reference ran " \
        "on the CPU only"
    unchunked = ""
    if ops & {"reference", "compiled"}:
        unchunked = "; grey: the unchunked unfused reference (filled)" + (
            " and its torch.compile (open, run on the first seed only)" if "compiled" in ops else "")
    return (f"Gradient error (in rounding floors) vs peak extra memory ({_memory_source(device)}) on {device}, "
            f"{where}. Each point is one configuration's median over seeds (bar: the {INTERVAL}); marker shape: "
            f"the input family; colour: the accumulation policy ({fill}{unchunked}); a policy's chunkings and "
            "acc_dtypes share its colour. Black steps: each family's Pareto front of the medians "
            "(analysis.judge.pareto.front_mask), one line style per family; ringed and labelled: the \"auto\" "
            "pick (lce with default options, its seed median; the label names what auto resolved to). "
            f"{seed_caption(data)} Error axes reach down to the rounding floor (1) and span at least a factor "
            f"{ERROR_SPAN:g}; memory axes at least a factor {COST_SPAN:g}.")


def plot_error_vs_memory(table: pd.DataFrame, device: str = "cpu") -> CaptionedFigure | None:
    """Error vs peak memory on ``device`` at its :func:`main_shape`, one panel per dtype: seed medians with their
    interval as bars, families as marker shapes, one colour per policy, each family's front, the auto picks
    labelled. The other shapes: :func:`plot_error_vs_memory_all_shapes`."""
    data = table[table["device"] == device]
    if data.empty:
        return None
    apply_style()
    shape = main_shape(data)
    here = data[(data["N"] == shape[0]) & (data["D"] == shape[1]) & (data["C"] == shape[2])]
    dtypes = sorted(here["dtype"].unique())
    styles = _family_styles(here["family"].unique())
    picks = _device_verdicts(table, device)
    fig = new_figure(4.6 * len(dtypes), 4.6)
    axes = fig.subplots(1, len(dtypes), squeeze=False)
    for ax, dtype in zip(axes.flat, dtypes, strict=True):
        _pareto_panel(ax, here[here["dtype"] == dtype], _picks_of(picks, device, dtype, shape), styles)
        ax.set_title(dtype, fontsize=10)
        ax.set_xlabel("peak extra memory (MiB)")
    axes[0, 0].set_ylabel(ERROR_LABEL, fontsize=9)
    n, d, c = shape
    fig.suptitle(f"Error vs memory on {device}, N={n} D={d} C={c}", fontsize=11)
    _pareto_legend(fig, here, styles)
    others = data[["N", "D", "C"]].drop_duplicates()
    rest = (f"; the other {len(others) - 1} shape{'s' if len(others) > 2 else ''} measured on {device}: "
            f"error_vs_memory_{device}_all_shapes" if len(others) > 1 else "")
    where = (f"at N={n} D={d} C={c}, the largest shape every input family was measured at, one panel per dtype"
             + rest)
    return CaptionedFigure(fig, f"error_vs_memory_{device}", _pareto_caption(here, device, where))


def plot_error_vs_memory_all_shapes(table: pd.DataFrame, device: str = "cpu") -> CaptionedFigure | None:
    """The appendix to :func:`plot_error_vs_memory`: the same panels at every other shape measured on ``device``,
    one row per shape (smallest first), one column per dtype; None with a single shape."""
    data = table[table["device"] == device]
    if data.empty:
        return None
    main = main_shape(data)
    shapes = [shape for shape in data[["N", "D", "C"]].drop_duplicates().itertuples(index=False, name=None)
              if shape != main]
    if not shapes:
        return None
    apply_style()
    shapes.sort(key=lambda shape: (shape[0] * shape[1] * shape[2], shape))
    dtypes = sorted(data["dtype"].unique())
    styles = _family_styles(data["family"].unique())
    picks = _device_verdicts(table, device)
    fig = new_figure(4.2 * len(dtypes), 3.5 * len(shapes) + 0.9)
    axes = fig.subplots(len(shapes), len(dtypes), squeeze=False)
    for row, shape in enumerate(shapes):
        n, d, c = shape
        problem = data[(data["N"] == n) & (data["D"] == d) & (data["C"] == c)]
        for column, dtype in enumerate(dtypes):
            ax = axes[row, column]
            group = problem[problem["dtype"] == dtype]
            if group.empty:
                ax.set_visible(False)
                continue
            _pareto_panel(ax, group, _picks_of(picks, device, dtype, shape), styles)
            families = ", ".join(sorted(set(group["family"])))
            ax.set_title(f"{dtype}, N={n} D={d} C={c} ({families})", fontsize=9)
            ax.set_xlabel("peak extra memory (MiB)", fontsize=8)
    fig.supylabel(ERROR_LABEL, fontsize=9)
    fig.suptitle(f"Error vs memory on {device}: the other shapes", fontsize=11)
    rest = data[~data.set_index(["N", "D", "C"]).index.isin([main])]
    _pareto_legend(fig, rest, styles)
    n, d, c = main
    where = (f"at every shape but N={n} D={d} C={c} (that one is error_vs_memory_{device}), one row of panels per "
             "shape (its families in the title), one column per dtype")
    return CaptionedFigure(fig, f"error_vs_memory_{device}_all_shapes", _pareto_caption(rest, device, where))


def plot_time_vs_shape(table: pd.DataFrame) -> CaptionedFigure | None:
    """Median time vs problem size N*D*C, per op and policy, one panel per (device, dtype); untimed rows
    (``cuda-emulated``, NaN) are left out."""
    data = table[np.isfinite(table[TIME]) & (table[TIME] > 0)].copy()
    if data.empty:
        return None
    apply_style()
    data["work"] = data["N"].astype(float) * data["D"] * data["C"]
    data["series"] = (data["op"] + " " + data["policy"]).str.strip()
    panels = data[["device", "dtype"]].drop_duplicates().sort_values(["device", "dtype"])
    fig, axes = panel_grid(len(panels))
    for ax, panel in zip(axes.flat, panels.itertuples(index=False), strict=False):
        group = data[(data["device"] == panel.device) & (data["dtype"] == panel.dtype)]
        summary = group.groupby(["series", "op", "policy", "work"], as_index=False)[TIME].median()
        for (series, op, policy), points in summary.groupby(["series", "op", "policy"], sort=True):
            points = points.sort_values("work")
            ax.plot(points["work"], points[TIME], marker=MARKERS.get(op, "o"), ms=4, lw=1,
                    ls="-" if op == "lce" else "--", color=PALETTE.get(policy, "k"), label=series)
        log_axes(ax)
        ax.xaxis.set_major_formatter(ticker.EngFormatter(sep=""))  # 50M, not 5e+07
        honest_limits(ax, "y", summary[TIME], span=COST_SPAN)
        ax.set_title(f"{panel.device}, {panel.dtype}", fontsize=9)
        ax.set_xlabel("problem size N*D*C (multiply-adds per GEMM)")
    fig.supylabel("median time of forward+backward (ms)", fontsize=9)
    legend_below(fig, axes)
    return CaptionedFigure(fig, "time_vs_shape",
                           "Median wall time of one forward+backward vs problem size N*D*C (each point: "
                           "median over the chunking methods and acc_dtypes of one op and policy); lce "
                           "solid, others dashed. CPU timings: one intra-op thread in each of the sweep's "
                           "worker processes (one per core), on a shared machine; measured on each configuration's "
                           "first seed (time does not depend on the values), untimed emulated-CUDA rows left out.")


def plot_bench_scaling(bench: pd.DataFrame) -> CaptionedFigure | None:
    """Time and peak memory vs N and vs C (log-log), per implementation and dtype, from bench.csv."""
    if bench.empty or not {"N", "C", "metric"} <= set(bench.columns):
        return None
    apply_style()
    # One CPU kind's data: the kind measured at the most shapes (timings of different kinds never share a line).
    bench = bench.assign(cpu_kind=cpu_kinds(bench, bench))
    shapes_per_cpu = bench.groupby("cpu_kind")[["N", "C"]].apply(lambda rows: len(rows.drop_duplicates()))
    cpu = shapes_per_cpu.idxmax()
    bench = bench[bench["cpu_kind"] == cpu]
    base_n, base_c = bench["N"].max(), bench["C"].max()
    data = bench[bench["impl"].isin(["lce", "torch", "unfused", "3-GEMM floor"])].copy()
    data = latest(data, ["impl", "dtype", "N", "D", "C", "metric"])
    fig = new_figure(10, 7.5)
    axes = fig.subplots(2, 2, squeeze=False)
    colours = dict(zip(["lce", "torch", "unfused"], sns.color_palette("colorblind", 3), strict=True))
    colours["3-GEMM floor"] = (0.1, 0.1, 0.1)  # the floor: black, far from torch's orange
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
                floor = impl == "3-GEMM floor"
                ax.plot(points[axis], points["value"] * scale, marker="x" if floor else "o", ms=5 if floor else 4,
                        lw=1.0 if floor else 1.3, color=colours[impl], ls=styles.get(dtype, ":"),
                        label=f"{impl} {dtype}")
            log_axes(ax, x_base=2)
            honest_limits(ax, "y", subset["value"] * scale, span=COST_SPAN)
            ax.set_xlabel(f"{axis} ({fixed}={fixed_value}, D={int(data['D'].iloc[0])})")
            ax.set_ylabel(unit)
    legend_below(fig, axes)
    return CaptionedFigure(fig, "bench_scaling",
                           "Time (median of repeats) and peak extra memory (measured, fresh process) of one "
                           f"forward+backward vs N and vs C on {cpu}, for lce with default options, torch's native "
                           "op with default options, the unfused reference and the 3-GEMM floor "
                           "(6*N*D*C at the measured GEMM rate, black crosses); solid fp32, dashed bf16. Data: "
                           "analysis/results/bench.csv (python -m analysis bench --scaling).")


def plot_chunk_sweep(chunks: pd.DataFrame, bench: pd.DataFrame | None = None) -> CaptionedFigure | None:
    """lce's time per chunk size, per policy, one panel per (dtype, CPU kind), auto's row floor marked (``bench``:
    what names the kinds of rows from before the capability was recorded, see
    :func:`analysis.core.provenance.cpu_kinds`)."""
    if chunks.empty:
        return None
    from analysis.core.problem import DTYPES
    from lce.planning.policies import CPU_MIN_ROWS

    apply_style()
    data = chunks[chunks["metric"] == "time_s"]
    data = latest(data.assign(cpu_kind=cpu_kinds(data, bench)), ["cpu_kind", "impl", "dtype", "N", "D", "C",
                                                                  "chunk_size"])
    # One row per CPU kind, one column per dtype: the titles stay short (the CPU kind wrapped, the shape once above).
    panels = data[["cpu_kind", "dtype"]].drop_duplicates().sort_values(["cpu_kind", "dtype"])
    fig, axes = panel_grid(len(panels), width=4.6, height=3.3, columns=data["dtype"].nunique())
    series = sorted(data["impl"].unique())
    colours = dict(zip(series, sns.color_palette("colorblind", len(series)), strict=True))
    shapes = data[["N", "D", "C"]].drop_duplicates()
    for ax, panel in zip(axes.flat, panels.itertuples(index=False), strict=False):
        group = data[(data["dtype"] == panel.dtype) & (data["cpu_kind"] == panel.cpu_kind)]
        for impl, points in group.groupby("impl", sort=True):
            points = points.sort_values("chunk_size")
            label = "lce default options" if impl == "lce" else f"{impl} (explicit)"
            ax.plot(points["chunk_size"], points["value"], marker="o", ms=4, lw=1.2, color=colours[impl],
                    label=label)
        floor = CPU_MIN_ROWS.get(DTYPES[panel.dtype])
        if floor is not None:
            ax.axvline(floor, color="k", ls="--", lw=0.8, label="auto's row floor (CPU_MIN_ROWS)")
        log_axes(ax, y=False, x_base=2)
        ax.set_ylim(bottom=0)
        first = group.iloc[0]
        shape = f"\nN={first.N} D={first.D} C={first.C}" if len(shapes) > 1 else ""
        ax.set_title(f"{panel.dtype}, {textwrap.fill(str(panel.cpu_kind), 52)}{shape}\n"
                     f"{int(first.num_threads)} thread(s)", fontsize=8)
        ax.set_xlabel("rows per chunk")
    fig.supylabel("time of forward+backward (s)", fontsize=9)
    if len(shapes) == 1:
        first = shapes.iloc[0]
        fig.suptitle(f"lce's time against its rows per chunk, N={first.N} D={first.D} C={first.C}", fontsize=10)
    legend_below(fig, axes)
    return CaptionedFigure(fig, "chunk_sweep",
                           "Time of one forward+backward against the rows per chunk, per policy and CPU kind (median "
                           "of interleaved repeats; threads in each title, the spreads are in the data). The dashed "
                           "line is the floor lce's CPU \"auto\" chunking keeps (CPU_MIN_ROWS); torch's aspect-ratio "
                           "rule gives 32-64 rows at this shape. Data: the chunk_sweep results "
                           "(python -m analysis bench --chunk-sweep).")

PAIR_KEYS: tuple[str, ...] = ("op", "dtype", "N", "D", "C", "policy", "chunking", "acc_dtype", "bias", "family",
                              "seed")
"""What must match for an emulated run and a real one to be the same call on the same inputs..."""
PLAN_KEYS: tuple[str, ...] = ("resolved_policy", "resolved_acc_dtype", "chunk_size")
"""...and what their plans must share: a key whose "auto" resolves differently today (CUDA's "auto" chunking takes
at least 2048 rows since 2026-12-06; the H200 ran 16-row chunks at N=2048) names another computation."""
GRADIENTS: tuple[str, ...] = ("grad_input", "grad_weight")
_MARKERS = {"bfloat16": "o", "float16": "s", "float32": "^"}


def emulated_vs_real(table: pd.DataFrame) -> pd.DataFrame:
    """One row per lce configuration run both emulated (``cuda-emulated``) and on a GPU (``cuda``, TF32 off) with the
    same plan (:data:`PLAN_KEYS`), with each gradient's Frobenius error in floors from both (``<grad>_emulated``,
    ``<grad>_real``) and their ratio (``<grad>_ratio``, real over emulated); empty without pairs."""
    columns = [f"{grad}_fro_in_floors" for grad in GRADIENTS]
    needed = {"device", "status", *PAIR_KEYS, *PLAN_KEYS, *columns}
    if table.empty or not needed <= set(table.columns):
        return pd.DataFrame()
    ok = table[(table["status"] == "ok") & (table["op"] == "lce")]
    keep = [*PAIR_KEYS, *PLAN_KEYS, *columns]
    emulated = ok[ok["device"] == "cuda-emulated"][keep]
    real = ok[ok["device"] == "cuda"][keep]
    pairs = emulated.merge(real, on=[*PAIR_KEYS, *PLAN_KEYS], suffixes=("_emulated", "_real"))
    for grad in GRADIENTS:
        pairs = pairs.rename(columns={f"{grad}_fro_in_floors_emulated": f"{grad}_emulated",
                                      f"{grad}_fro_in_floors_real": f"{grad}_real"})
        pairs[f"{grad}_ratio"] = pairs[f"{grad}_real"] / pairs[f"{grad}_emulated"]
    return pairs.reset_index(drop=True)


def plot_emulated_vs_real(table: pd.DataFrame) -> CaptionedFigure | None:
    """Per gradient, each pair's error on the GPU against its emulated error, coloured by the layout (resolved
    policy) and marked by dtype; the diagonal is a faithful stand-in. None without pairs."""
    pairs = emulated_vs_real(table)
    if pairs.empty:
        return None
    apply_style()
    fig = new_figure(7.5, 3.4)
    axes = fig.subplots(1, len(GRADIENTS))
    for ax, grad in zip(axes, GRADIENTS, strict=True):
        data = pairs.dropna(subset=[f"{grad}_emulated", f"{grad}_real"])
        for (policy, dtype), group in data.groupby(["resolved_policy", "dtype"], sort=True):
            ax.scatter(group[f"{grad}_emulated"], group[f"{grad}_real"], s=14, alpha=0.7,
                       color=PALETTE.get(policy, PALETTE[""]), marker=_MARKERS.get(dtype, "o"),
                       label=f"{policy} {dtype}")
        values = data[[f"{grad}_emulated", f"{grad}_real"]].to_numpy(dtype=float)
        low, high = (np.nanmin(values), np.nanmax(values)) if values.size else (1.0, 2.0)
        ax.plot([low, high], [low, high], color="0.4", lw=0.8, ls="--")
        log_axes(ax)
        ax.set_title(grad, fontsize=9)
        ax.set_xlabel("emulated on CPU (floors)")
        ax.set_ylabel("on the GPU (floors)")
    axes[-1].legend(fontsize=6, frameon=False, loc="upper left")
    ratios = pd.concat([pairs[f"{grad}_ratio"] for grad in GRADIENTS]).dropna()
    devices = ", ".join(sorted(set(table.loc[table["device"] == "cuda", "device_name"].dropna().astype(str))))
    caption = (f"How faithful the CPU stand-in for the CUDA layouts was: {len(pairs)} lce configurations run both "
               f"emulated and on {devices or 'a GPU'} on the same inputs (families "
               f"{', '.join(sorted(set(pairs['family'])))}; seeds {', '.join(map(str, sorted(set(pairs['seed']))))})."
               f" Real over emulated error: median {ratios.median():.2f}, range {ratios.min():.2f}-{ratios.max():.2f}."
               " Points on the dashed diagonal: the emulation's numbers are the GPU's. Data: the sweep results with "
               "device cuda (python -m analysis gpu-check) and cuda-emulated (the medium grid).")
    return CaptionedFigure(fig, "cuda_emulated_vs_real", caption)


def draw_gpu_figures(table: pd.DataFrame) -> list[CaptionedFigure]:
    """The figures a GPU's sweep rows add (none without them)."""
    return [figure for figure in (plot_emulated_vs_real(table),) if figure is not None]


def entry_verdicts(verdicts_table: pd.DataFrame) -> pd.DataFrame:
    """Per entry of a ``pareto.verdicts`` table (device, dtype, pick): how many problems (family × shape) it is
    judged on, on how many its pick is on the memory and the time front in every seed (time: NaN where not
    timed), the range of the pick's seed-median error, its highest 95th percentile, and the rivals that knock it
    off each front."""
    def rivals(names: pd.Series) -> str:
        return ", ".join(sorted(set(names) - {""}))

    summary = verdicts_table.groupby(["device", "dtype", "pick"], sort=True).agg(
        problems=("shape", "size"), memory_front=("on_memory_front", "sum"), time_front=("on_time_front", "sum"),
        error_low=("error", "min"), error_high=("error", "max"), error_p95=("error_high", "max"),
        memory_rivals=("memory_dominator", rivals), time_rivals=("time_dominator", rivals)).reset_index()
    return summary.assign(time_front=summary["time_front"].where(summary["device"] != "cuda-emulated"))


def fronts(table: pd.DataFrame, verdicts_table: pd.DataFrame, device: str) -> pd.DataFrame:
    """Per family, dtype and shape on ``device`` (seed medians over a prepared sweep table): the ``lowest`` error of
    any run, the auto pick's error (``pick``, with ``pick_low``/``pick_high``) and memory (``pick_mib``), torch's
    best run (``torch``, NaN where torch did not run), and the run needing the least memory (``cheapest_mib``,
    its error ``cheapest_error``; ties: the first configuration in sweep order)."""
    configs = seed_interval(table[table["device"] == device], [ERROR, MEMORY])
    picks = verdicts_table[verdicts_table["device"] == device].set_index(["family", "dtype", "shape"])
    rows = []
    for (family, dtype, n, d, c), group in configs.groupby(["family", "dtype", "N", "D", "C"], sort=True):
        pick = picks.loc[(family, dtype, f"{n}x{d}x{c}")]
        cheapest = group.loc[group[MEMORY].idxmin()]
        rows.append({"family": family, "dtype": dtype, "shape": f"{n}×{d}×{c}", "lowest": group[ERROR].min(),
                     "pick": pick["error"], "pick_low": pick["error_low"], "pick_high": pick["error_high"],
                     "pick_mib": pick["peak_mib"], "torch": group.loc[group["op"] == "torch", ERROR].min(),
                     "cheapest_mib": cheapest[MEMORY], "cheapest_error": cheapest[ERROR]})
    return pd.DataFrame(rows)


HEAD_MIN_CLASSES = 100_000
"""A shape with at least this many classes is an LLM head (the GPU grid's Llama-3 and Gemma-size heads)."""


def head_costs(table: pd.DataFrame, device: str = "cuda") -> pd.DataFrame:
    """At every LLM-head shape ``device`` ran (at least :data:`HEAD_MIN_CLASSES` classes), each lce configuration and
    the unfused ``reference`` (seed medians): its error in floors, peak MiB, time in ms, time over the unfused op's,
    and lce's predicted time (``predicted_ms``, lce's time model for the plan the call ran; NaN for the reference),
    with ``pick`` marking the "auto" call (``lce auto auto``); empty without runs."""
    runs = table[(table["device"] == device) & (table["C"] >= HEAD_MIN_CLASSES)
                 & table["op"].isin(["lce", "reference"])]
    if runs.empty:
        return pd.DataFrame()
    keys = ["N", "D", "C", "dtype", "label"]
    medians = runs.groupby(keys, sort=True)[[ERROR, MEMORY, TIME]].median()
    calls = runs.groupby(keys, sort=True)[["op", "policy", "chunking", "acc_dtype", "resolved_policy",
                                           "resolved_acc_dtype", "chunk_size", "bias", "date"]].first()
    medians = medians.join(calls).reset_index()
    unfused = medians[medians["label"] == "reference"].set_index(["N", "D", "C"])[TIME]
    shapes = pd.MultiIndex.from_frame(medians[["N", "D", "C"]])
    return pd.DataFrame({
        "shape": [f"{n}×{d}×{c}" for n, d, c in shapes], "run": medians["label"],
        "pick": medians["label"] == "lce auto auto", "error": medians[ERROR], "peak_mib": medians[MEMORY],
        "time_ms": medians[TIME], "vs_unfused_time": medians[TIME].to_numpy() / unfused.reindex(shapes).to_numpy(),
        "predicted_ms": [_predicted_ms(call, device) for call in medians.itertuples()]})


def todays_pick(costs: pd.DataFrame) -> pd.DataFrame:
    """At each head of :func:`head_costs`, the plan lce's default makes there today on CUDA (policy, rows per chunk,
    chunks), its predicted peak beside the measured peak of the plan the H200 ran, and its time as lce's time model
    predicts it -- on the path every CUDA build has (the weight-gradient
    product added into the fp32 accumulator in blocks of 2^26 elements, the elementwise passes as PyTorch ops: no
    mixed-precision addmm, no Triton kernels) -- beside the unfused op's measured time. A prediction: no GPU has run
    this plan."""
    import torch

    import lce
    from lce.decide.time_model import estimated_seconds
    from lce.planning.resolve import make_plan
    from lce.testing import emulate_device_kind

    rows = []
    for shape, group in costs.groupby("shape", sort=False):
        n, d, c = (int(v) for v in shape.split("×"))
        with emulate_device_kind("cuda"):
            plan = make_plan(lce.LinearCrossEntropyOptions(), num_rows=n, in_features=d, num_classes=c,
                             dtype=torch.bfloat16, device=torch.device("meta"), needs_grad=(True, True, False))
        unfused = float(group.loc[group["run"] == "reference", "time_ms"].iloc[0])
        measured = group[group["pick"]].iloc[0]
        predicted = 1e3 * estimated_seconds(plan)
        rows.append({"shape": shape, "policy": plan.acc_policy, "rows": plan.batch_chunk_size,
                     "chunks": plan.num_chunks, "predicted_gib": plan.peak_extra_bytes / 2**30,
                     "measured_pick_gib": float(measured["peak_mib"]) / 1024, "predicted_ms": predicted,
                     "unfused_ms": unfused,
                     "predicted_vs_unfused": predicted / unfused, "measured_pick_ms": measured["time_ms"],
                     "measured_pick_vs_unfused": measured["vs_unfused_time"]})
    return pd.DataFrame(rows)


def _predicted_ms(call, device: str) -> float:
    """lce's time model for the plan one sweep call ran (its recorded rows per chunk, counted as the code of its date
    ran it: :func:`analysis.studies.time_model.predicted_seconds_as_run`)."""
    from analysis.studies.time_model import predicted_seconds_as_run

    if call.op != "lce":
        return float("nan")
    return 1e3 * predicted_seconds_as_run(call._asdict(), device)


def fp32_rankings(table: pd.DataFrame) -> pd.DataFrame:
    """Per family, device and cost (memory; time where timed) of the fp32 lce runs: the first of
    ``pareto.recommend_choices`` (``choice``, its ``chunking``, ``score``, how many spellings compute its numbers),
    and the rank of the current default ``lce auto auto`` among the ``choices``."""
    rows = []
    for family in sorted(set(table["family"])):
        for device in sorted(set(table.loc[table["dtype"] == "float32", "device"])):
            for cost, word in ((MEMORY, "memory"), (TIME, "time"))[: 1 if device == "cuda-emulated" else 2]:
                choices = recommend_choices(table, device, "float32", cost=cost, family=family)
                if choices.empty:
                    continue
                first = choices.iloc[0]
                runs = table[(table["label"] == first["choice"]) & (table["family"] == family)]
                default = choices.index[choices["members"].map(lambda members: "lce auto auto" in members)]
                rows.append({"family": family, "device": device, "ranked by": f"{word} × error",
                             "choice": first["choice"], "chunking": runs["chunking"].iloc[0], "score": first["score"],
                             "spellings": len(first["members"]), "choices": len(choices),
                             "default's rank": default[0] + 1 if len(default) else np.nan})
    return pd.DataFrame(rows)


def fp32_computations(table: pd.DataFrame) -> pd.DataFrame:
    """Per family, device and chunking of the fp32 lce runs: how many policies were run and how many distinct
    computations they make (``pareto.same_numbers`` classes: 1 when the policy changes no number)."""
    rows = []
    fp32 = table[(table["dtype"] == "float32") & (table["op"] == "lce")]
    for (family, device), runs in fp32.groupby(["family", "device"], sort=True):
        names = same_numbers(table, device, "float32", family=family)
        for chunking, rows_ in runs.groupby("chunking", sort=True):
            rows.append({"family": family, "device": device, "chunking": chunking,
                         "policies": rows_["policy"].nunique(), "computations": rows_["label"].map(names).nunique()})
    return pd.DataFrame(rows)
