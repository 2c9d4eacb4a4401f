"""Notebook 04 (Pareto fronts and the auto table): its figures and conclusions, and the speed figures of the README.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib import ticker

from analysis.core.results_io import latest
from analysis.judge.pareto import (
    ERROR,
    INTERVAL,
    MEMORY,
    TIE_RULE,
    TIME,
    VERDICT_TOLERANCE,
    front_mask,
    recommend_choices,
    same_numbers,
    seed_interval,
    unfused_words,
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
from analysis.report.wording import (
    RATIO,
    _conclusion,
    _devices,
    _dtypes,
    _emulation_limit,
    _families,
    _join,
    _number,
    _one_cpu,
    _one_seed,
    _range,
    _seeds,
    _shapes,
    _unfused,
    _with_seeds,
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
    # One CPU's data: the CPU measured at the most shapes (timings of different CPUs never share a line).
    shapes_per_cpu = bench.groupby("cpu_model")[["N", "C"]].apply(lambda rows: len(rows.drop_duplicates()))
    cpu = shapes_per_cpu.idxmax()
    bench = bench[bench["cpu_model"] == cpu]
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


def plot_chunk_sweep(chunks: pd.DataFrame) -> CaptionedFigure | None:
    """lce's time per chunk size, per policy, one panel per (dtype, CPU model), auto's row floor marked."""
    if chunks.empty:
        return None
    from analysis.core.problem import DTYPES
    from lce.policies import CPU_MIN_ROWS

    apply_style()
    data = latest(chunks[chunks["metric"] == "time_s"], ["cpu_model", "impl", "dtype", "N", "D", "C", "chunk_size"])
    panels = data[["dtype", "cpu_model"]].drop_duplicates().sort_values(["dtype", "cpu_model"])
    fig, axes = panel_grid(len(panels), columns=2)
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
        log_axes(ax, y=False, x_base=2)
        ax.set_ylim(bottom=0)
        first = group.iloc[0]
        ax.set_title(f"{panel.dtype}, {panel.cpu_model}\nN={first.N} D={first.D} C={first.C}", fontsize=9)
        ax.set_xlabel("rows per chunk")
    fig.supylabel("time of forward+backward (s)", fontsize=9)
    legend_below(fig, axes)
    return CaptionedFigure(fig, "chunk_sweep",
                           "Time of one forward+backward against the rows per chunk, per policy and CPU (median of "
                           "interleaved repeats, 2 threads; the spreads are in the data). The dashed "
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


# --- 04 · Pareto and the auto table ----------------------------------------------------------------------------


def auto_table(entries: pd.DataFrame, verdicts_table: pd.DataFrame, drawn: Iterable[str]) -> str:
    """04: what the "auto" table claims and what can test it.

    ``entries`` has one row per entry (``device``, ``dtype``, ``evidence``: a tuple of figure stems; the
    fallback's ``device`` is ``"other"``); ``drawn`` holds the stems of the figures the committed results draw.
    """
    drawn = set(drawn)
    listed = entries[entries["device"] != "other"]
    stems = sorted({stem for evidence in entries["evidence"] for stem in evidence})
    missing = [stem for stem in stems if stem not in drawn]
    finding = (f"lce's \"auto\" table has {len(listed)} entries and a fallback; each names the figures that carry "
               f"its evidence, {len(stems)} in all, ")
    finding += ("every one drawn from the committed results." if not missing else
                f"of which {len(stems) - len(missing)} {'is' if len(stems) - len(missing) == 1 else 'are'} drawn "
                "from the committed results; "
                f"{_join([f'`{stem}`' for stem in missing])} {'has' if len(missing) == 1 else 'have'} no data yet.")
    bullets = []
    if len(verdicts_table):
        shapes = verdicts_table.groupby(["device", "dtype"]).size()
        per_device = [f"{device}: {_join(list(rows.index.get_level_values('dtype')))}"
                      for device, rows in shapes.groupby(level="device")]
        entries_word = "entry" if len(shapes) == 1 else "entries"
        seeds = verdicts_table["seeds"] if "seeds" in verdicts_table else pd.Series([1])
        seeds_text = f"{_range(seeds, '.0f')} seed{'' if seeds.max() == 1 else 's'}"
        bullets.append(f"the verdicts below judge {len(shapes)} {entries_word} on {_range(shapes, '.0f')} problems "
                       f"(input family × shape) each, {seeds_text} a problem (" + "; ".join(per_device) + ")")
    if "cuda" not in set(verdicts_table.get("device", [])):
        bullets.append("no real-GPU results are committed: the cuda entries are judged on the emulated CUDA layouts")
    return _conclusion(
        finding, bullets,
        inputs="the table in `lce/policies.py` at this revision; the results files in `analysis/results/`.",
        limits="a reason is a claim; only the verdicts and figures test it, on the shapes and machines they cover.")


def _off_front(off: pd.DataFrame, everything: pd.DataFrame, axis: str) -> list[str]:
    """One line per (family, device, dtype) with picks off the ``axis`` ("memory" or "time") front: on which
    shapes, in how many seeds, the rivals, their error next to the pick's, and what they save (seed medians)."""
    lines = []
    for (family, device, dtype), rows in off.groupby(["family", "device", "dtype"], sort=True):
        total = len(everything[(everything["family"] == family) & (everything["device"] == device)
                               & (everything["dtype"] == dtype)])
        names = list(dict.fromkeys(rows[f"{axis}_dominator"]))
        rivals = _join([f"`{name}`" for name in names]) + (" reaches" if len(names) == 1 else " reach")
        if axis == "memory":
            saving = rows["peak_mib"] / rows["memory_dominator_peak_mib"]
            gain = f"with {_range(saving, '.1f')}x less memory"
        else:
            saving = rows["time_ms"] / rows["time_dominator_ms"]
            gain = f"in {_range(1 / saving, '.2f')}x the time"
        seeds = f"off in {_range(rows[f'{axis}_off_seeds'], '.0f')} of {_range(rows['seeds'], '.0f')} seeds"
        text = (f"{family} {device} {dtype}, {len(rows)} of {total} shapes ({', '.join(rows['shape'])}), {seeds}: "
                f"{rivals} {_range(rows[f'{axis}_dominator_error'])} floors (the pick: {_range(rows['error'])}) "
                f"{gain}")
        if axis == "memory" and device != "cuda-emulated" and rows["on_time_front"].all():
            text += "; the pick is on the time front there"
        lines.append(text)
    return lines


def _sweep_inputs(data: pd.DataFrame) -> str:
    repeats = sorted(int(r) for r in data["time_repeats"].dropna().unique()) if "time_repeats" in data else []
    time = ("not timed" if not repeats else
            f"time: median of {_join([str(r) for r in repeats])} repeats (measured on the first seed: memory and "
            "time do not depend on the values)")
    return (f"{_families(data)}; {_shapes(data)}; {_dtypes(data)}; {_devices(data)}; {_seeds(data)}, errors are "
            f"medians over seeds with the {INTERVAL} in brackets; {time}; the committed sweep results.")


def _shape_count(data: pd.DataFrame) -> str:
    """``one small shape per family`` / ``3 small shapes per family`` (the most any family has)."""
    counts = _with_seeds(data).groupby("family")[["N", "D", "C"]].apply(lambda rows: len(rows.drop_duplicates()))
    most = int(counts.max()) if len(counts) else 0
    return f"{'one small shape' if most == 1 else f'{most} small shapes'} per family"


def _pick_errors(verdicts_table: pd.DataFrame) -> list[str]:
    """Per (family, dtype): the auto picks' seed-median worst-gradient error with its interval (fp32: against the
    unfused computation too)."""
    lines = []
    for (family, dtype), rows in verdicts_table.groupby(["family", "dtype"], sort=True):
        text = (f"{family} {dtype}: the auto picks' worst gradient at {_range(rows['error'])} floors "
                f"[{_number(rows['error_low'].min(), '.2f')}–{_number(rows['error_high'].max(), '.2f')}] over "
                f"{_range(rows['seeds'], '.0f')} seed{'' if rows['seeds'].max() == 1 else 's'}")
        if dtype == "float32" and np.isfinite(rows["vs_unfused"]).any():
            text += f", {_range(rows['vs_unfused'], RATIO)}x {unfused_words(dtype)}"
        lines.append(text)
    return lines


def verdicts_conclusion(verdicts_table: pd.DataFrame, table: pd.DataFrame) -> str:
    """04: how many auto picks are on each front in every seed, and who beats the others
    (``pareto.verdicts`` of ``table``)."""
    if verdicts_table.empty:
        return _conclusion("The results hold no run of an \"auto\" pick to judge.",
                           inputs="the committed sweep results.", limits="nothing to conclude from.")
    timed = verdicts_table[verdicts_table["device"] != "cuda-emulated"]
    memory_on = int(verdicts_table["on_memory_front"].sum())
    time_on = int(timed["on_time_front"].sum())
    finding = (f"{memory_on} of {len(verdicts_table)} auto picks (entries × input families × shapes) are on the "
               "error–memory front in every seed")
    finding += (f", and {time_on} of the {len(timed)} measured on the CPU on the error–time front "
                "(emulated CUDA picks are not timed)." if len(timed) else ".")
    off_memory = verdicts_table[~verdicts_table["on_memory_front"].astype(bool)]
    off_time = timed[~timed["on_time_front"].astype(bool)]
    bullets = [f"off the memory front — {line}" for line in _off_front(off_memory, verdicts_table, "memory")]
    bullets += [f"off the time front — {line}" for line in _off_front(off_time, verdicts_table, "time")]
    bullets += _pick_errors(verdicts_table)
    judged = _with_seeds(table)
    judged = judged[judged["device"].isin(set(verdicts_table["device"]))
                    & judged["dtype"].isin(set(verdicts_table["dtype"]))
                    & judged["family"].isin(set(verdicts_table["family"]))]
    return _conclusion(
        finding, bullets,
        inputs=_sweep_inputs(judged) + " A rival must be no worse on both axes and more than "
                                       f"{VERDICT_TOLERANCE:.0%} better on one, in one seed, to knock a pick off.",
        limits=(f"{_one_seed(judged)}{_shape_count(judged)}; {_emulation_limit(judged)}"
                f"{_one_cpu(judged)}; times of one thread on a shared machine."))


def fronts(table: pd.DataFrame, device: str) -> str:
    """04: per input family and dtype on ``device``, where the auto pick, the best lce run and torch's best run
    sit (prepared table; seed medians)."""
    from analysis.judge.pareto import verdicts as judge

    data = _with_seeds(table[table["device"] == device])
    if data.empty:
        return _conclusion(f"The results hold no {device} runs.", inputs="the committed sweep results.",
                           limits="nothing to conclude from.")
    picks = judge(_with_seeds(table))
    picks = picks[picks["device"] == device]
    configs = seed_interval(data, [ERROR, MEMORY])
    bullets = []
    for (family, dtype), rows in configs.groupby(["family", "dtype"], sort=True):
        shapes = ["N", "D", "C"]
        text = f"**{family}, {dtype}**: lowest error of any run {_range(rows.groupby(shapes)[ERROR].min())} floors"
        mine = picks[(picks["family"] == family) & (picks["dtype"] == dtype)]
        if len(mine):
            unfused = ""
            if dtype == "float32" and np.isfinite(mine["vs_unfused"]).any():
                unfused = f", {_range(mine['vs_unfused'], RATIO)}x {unfused_words(dtype)}"
            text += (f"; the auto pick {_range(mine['error'])} floors [{_number(mine['error_low'].min(), '.2f')}–"
                     f"{_number(mine['error_high'].max(), '.2f')}]{unfused} at {_range(mine['peak_mib'])} MiB")
        torch = rows[rows["op"] == "torch"]
        if len(torch):
            text += f"; torch's best run {_range(torch.groupby(shapes)[ERROR].min())} floors"
        cheapest = rows.loc[rows.groupby(shapes)[MEMORY].idxmin()]
        text += (f"; the least memory any run needs {_range(cheapest[MEMORY])} MiB, at "
                 f"{_range(cheapest[ERROR])} floors")
        bullets.append(text + ".")
    memory_kind = "lce's modeled memory" if device == "cuda-emulated" else "measured peak memory"
    finding = (f"On {device}, per input family and dtype ({memory_kind}; seed medians, ranges over shapes, the "
               f"pick's {INTERVAL} in brackets; 1 floor = the exact answer rounded once):")
    return _conclusion(
        finding, bullets,
        inputs=_sweep_inputs(data),
        limits=f"{_one_seed(data)}{_shape_count(data)}; {_emulation_limit(data)}{_one_cpu(data)}.")


def _members(members: Sequence[str]) -> str:
    return _join([f"`{m}`" for m in members])


def fp32_choice(table: pd.DataFrame) -> str:
    """04: what fp32 should use, per input family, device and cost, with ties named as ties
    (:data:`analysis.judge.pareto.TIE_RULE`); errors are compared across every seed."""
    table = _with_seeds(table)
    fp32 = table[(table["dtype"] == "float32") & (table["op"] == "lce")]
    devices = [d for d in ("cpu", "cuda", "cuda-emulated") if len(fp32[fp32["device"] == d])]
    if not devices:
        return _conclusion("The results hold no fp32 lce runs.", inputs="the committed sweep results.",
                           limits="nothing to conclude from.")
    families = sorted(set(fp32["family"]))
    bullets, answers, policy_free, judged = [], [], [], []
    for family in families:
        for device in devices:
            rows = fp32[(fp32["device"] == device) & (fp32["family"] == family)]
            if rows.empty:
                continue
            judged.append((family, device))
            where = device if len(families) == 1 else f"{family}, {device}"
            costs = [(MEMORY, "memory", "MiB", ".2f")]
            if device != "cuda-emulated":  # its times are the CPU stand-in's, as in the verdicts
                costs.append((TIME, "time", "ms", ".1f"))
            chunking_of = dict(zip(rows["label"], rows["chunking"], strict=False))
            for cost, word, unit, spec in costs:
                choices = recommend_choices(table, device, "float32", cost=cost, family=family)
                if choices.empty:
                    continue
                top = choices.iloc[0]
                mine = rows[rows["label"] == top["choice"]]
                interval = (f" [{top[f'{ERROR}_low']:.2f}–{top[f'{ERROR}_high']:.2f}]"
                            if mine["seed"].nunique() > 1 else "")
                unfused = _unfused(mine, "float32", brackets=False)
                text = (f"**{where}, {word} × error**: `{top['choice']}` (score {top['score']:.2f}, "
                        f"{top[ERROR]:.2f} floors{interval}{unfused}, {format(top[cost], spec)} {unit})")
                if len(top["members"]) > 1:
                    spread = "" if cost == MEMORY else (f"; their scores differ only by timing noise, "
                                                        f"{top['score_low']:.2f}–{top['score_high']:.2f}")
                    text += (f" — a tie of {len(top['members'])} spellings that compute the same numbers: "
                             f"{_members(top['members'])}{spread}")
                if len(choices) > 1:
                    runner = choices.iloc[1]
                    text += f"; next: `{runner['choice']}` ({runner['score']:.2f})"
                pick = choices[choices["members"].map(lambda members: "lce auto auto" in members)]
                if len(pick):
                    rank = int(pick.index[0]) + 1
                    text += (". The current default (`lce auto auto`) is " + ("this choice" if rank == 1 else
                             f"choice {rank} of {len(choices)} (score {pick['score'].iloc[0]:.2f})"))
                bullets.append(text + ".")
                chunking = chunking_of.get(top["choice"], "")
                answers.append((family, device, word, "the default chunking" if chunking == "auto" else
                                f"`{chunking}`"))
            names = same_numbers(table, device, "float32", family=family)
            per_chunking = rows.assign(choice=rows["label"].map(names)).groupby("chunking")["choice"].nunique()
            if rows["policy"].nunique() > 1 and len(per_chunking) and (per_chunking == 1).all():
                policy_free.append((family, device))
    per_device = []
    for family, device in judged:
        mine = [f"{chunking} for {word} × error" for f, where, word, chunking in answers
                if (f, where) == (family, device)]
        if mine:
            place = f"on {device}" if len(families) == 1 else f"for {family} inputs on {device}"
            per_device.append(f"{place}, {_join(mine)}")
    if set(policy_free) == set(judged):
        finding = ("What should fp32 use? The policy does not matter: for a given chunking every policy gives "
                   "bit-identical errors on every shape and seed. The chunking does: " + "; ".join(per_device) + ".")
    else:
        finding = "What should fp32 use? By the data: " + "; ".join(per_device) + "."
        bullets += [f"on {device}{'' if len(families) == 1 else f' ({family} inputs)'} the policy makes no "
                    "difference: for each chunking every policy gives bit-identical errors on every shape and seed"
                    for family, device in policy_free]
    data = fp32[fp32["device"].isin(devices)]
    return _conclusion(
        finding, bullets,
        inputs=(_sweep_inputs(data) + " Score: mean over shapes and seeds of log(cost / best cost) + log(error / "
                f"best error), lower is better; ties: {TIE_RULE}."),
        limits=(f"{_one_seed(data)}{_shape_count(data)}, and the score weighs a factor in cost like the same factor "
                f"in error; {_emulation_limit(data)}{_one_cpu(data)}."))
