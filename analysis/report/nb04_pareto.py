"""Notebook 04 (Pareto fronts and the auto table): its figures and key numbers, and the speed figures of the README.

The notebook's prose quotes these numbers; ``tests/claims/test_nb04_pareto.py`` asserts each claim the prose makes
about them.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib import ticker

from analysis.core.provenance import cpu_kinds
from analysis.core.results_io import latest
from analysis.judge.pareto import (
    ERROR,
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
    CaptionedFigure,
    apply_style,
    family_panels,
    honest_limits,
    legend_below,
    log_axes,
    new_figure,
    panel_grid,
    seed_caption,
)


def plot_error_vs_memory(table: pd.DataFrame, device: str = "cpu") -> CaptionedFigure | None:
    """Error vs peak memory per (family, dtype, shape) on ``device``: seed medians with their interval as bars,
    the front of the medians drawn, the auto pick starred."""
    data = table[table["device"] == device]
    if data.empty:
        return None
    apply_style()
    fig, axes, panels = family_panels(data)
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
        log_axes(ax)
        honest_limits(ax, "x", points[MEMORY], span=COST_SPAN)
        honest_limits(ax, "y", pd.concat([points[f"{ERROR}_low"], points[f"{ERROR}_high"]]), span=ERROR_SPAN,
                       floor=1.0)
        ax.set_xlabel("peak extra memory (MiB)")
    fig.supylabel(ERROR_LABEL, fontsize=9)
    legend_below(fig, axes)
    stem = f"error_vs_memory_{device}"
    memory_source = "lce's model (CPU stand-in measured otherwise)" if device == "cuda-emulated" else "measured"
    return CaptionedFigure(fig, stem,
                           f"Gradient error (in rounding floors) vs peak extra memory ({memory_source}) on {device}, "
                           "one row of panels per input family, one panel per dtype and shape; black steps: Pareto "
                           "front of the medians; red star: the \"auto\" pick (seed median). "
                           f"{seed_caption(data)} Error axes reach down to the rounding floor (1) and span at least "
                           f"a factor {ERROR_SPAN:g}; memory axes at least a factor {COST_SPAN:g}.")


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
            log_axes(ax, x_base=2)
            honest_limits(ax, "y", subset["value"] * scale, span=COST_SPAN)
            ax.set_xlabel(f"{axis} ({fixed}={fixed_value}, D={int(data['D'].iloc[0])})")
            ax.set_ylabel(unit)
    legend_below(fig, axes)
    return CaptionedFigure(fig, "bench_scaling",
                           "Time (median of repeats) and peak extra memory (measured, fresh process) of one "
                           f"forward+backward vs N and vs C on {cpu}, for lce with default options, torch's native "
                           "op with default options, the unfused reference and the 3-GEMM floor "
                           "(6*N*D*C at the measured GEMM rate); solid fp32, dashed bf16. Data: "
                           "analysis/results/bench.csv (python -m analysis bench --scaling).")


def plot_chunk_sweep(chunks: pd.DataFrame, bench: pd.DataFrame | None = None) -> CaptionedFigure | None:
    """lce's time per chunk size, per policy, one panel per (dtype, CPU kind), auto's row floor marked (``bench``:
    what names the kinds of rows from before the capability was recorded, see
    :func:`analysis.core.provenance.cpu_kinds`)."""
    if chunks.empty:
        return None
    from analysis.core.problem import DTYPES
    from lce.policies import CPU_MIN_ROWS

    apply_style()
    data = chunks[chunks["metric"] == "time_s"]
    data = latest(data.assign(cpu_kind=cpu_kinds(data, bench)), ["cpu_kind", "impl", "dtype", "N", "D", "C",
                                                                  "chunk_size"])
    panels = data[["dtype", "cpu_kind"]].drop_duplicates().sort_values(["dtype", "cpu_kind"])
    fig, axes = panel_grid(len(panels), columns=2)
    series = sorted(data["impl"].unique())
    colours = dict(zip(series, sns.color_palette("colorblind", len(series)), strict=True))
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
        ax.set_title(f"{panel.dtype}, {panel.cpu_kind}\nN={first.N} D={first.D} C={first.C}, "
                     f"{int(first.num_threads)} thread(s)", fontsize=8)
        ax.set_xlabel("rows per chunk")
    fig.supylabel("time of forward+backward (s)", fontsize=9)
    legend_below(fig, axes)
    return CaptionedFigure(fig, "chunk_sweep",
                           "Time of one forward+backward against the rows per chunk, per policy and CPU kind (median "
                           "of interleaved repeats; threads in each title, the spreads are in the data). The dashed "
                           "line is the floor lce's CPU \"auto\" chunking keeps (CPU_MIN_ROWS); torch's aspect-ratio "
                           "rule gives 32-64 rows at this shape. Data: the chunk_sweep results "
                           "(python -m analysis bench --chunk-sweep).")

PAIR_KEYS: tuple[str, ...] = ("op", "dtype", "N", "D", "C", "policy", "chunking", "acc_dtype", "bias", "family",
                              "seed")
"""What must match for an emulated run and a real one to be the same computation on the same inputs."""
GRADIENTS: tuple[str, ...] = ("grad_input", "grad_weight")
_MARKERS = {"bfloat16": "o", "float16": "s", "float32": "^"}


def emulated_vs_real(table: pd.DataFrame) -> pd.DataFrame:
    """One row per lce configuration run both emulated (``cuda-emulated``) and on a GPU (``cuda``, TF32 off), with
    each gradient's Frobenius error in floors from both (``<grad>_emulated``, ``<grad>_real``) and their ratio
    (``<grad>_ratio``, real over emulated); empty without pairs."""
    columns = [f"{grad}_fro_in_floors" for grad in GRADIENTS]
    needed = {"device", "status", "resolved_policy", *PAIR_KEYS, *columns}
    if table.empty or not needed <= set(table.columns):
        return pd.DataFrame()
    ok = table[(table["status"] == "ok") & (table["op"] == "lce")]
    keep = [*PAIR_KEYS, "resolved_policy", *columns]
    emulated = ok[ok["device"] == "cuda-emulated"][keep]
    real = ok[ok["device"] == "cuda"][[*PAIR_KEYS, *columns]]
    pairs = emulated.merge(real, on=list(PAIR_KEYS), suffixes=("_emulated", "_real"))
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
