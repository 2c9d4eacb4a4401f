"""Notebook 02 (accuracy against fp64): its figure, its key numbers and the README's bf16 table.

The notebook's prose quotes these numbers; ``tests/claims/test_nb02_accuracy.py`` asserts each claim the prose
makes about them, and the README's claims next to its bf16 table.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from analysis.core.problem import Shape
from analysis.judge.pareto import ERROR, INTERVAL, VS_UNFUSED, load_table, seed_interval
from analysis.paths import display_path
from analysis.report.style import (
    ERROR_SPAN,
    CaptionedFigure,
    apply_style,
    chunk_lines,
    family_panels,
    honest_limits,
    legend_below,
    log_axes,
    seed_caption,
)


def plot_error_vs_chunks(table: pd.DataFrame, device: str = "cpu") -> CaptionedFigure | None:
    """grad_weight error vs number of chunks per policy and family, lce next to torch; seed median and band."""
    data = table[(table["device"] == device) & table["op"].isin(["lce", "torch"])]
    if data.empty:
        return None
    apply_style()
    column = "grad_weight_fro_in_floors"
    fig, axes, panels = family_panels(data)
    for ax, group in panels:
        points = chunk_lines(ax, group, column)
        log_axes(ax, x_base=2)
        honest_limits(ax, "y", pd.concat([points[f"{column}_low"], points[f"{column}_high"]]), span=ERROR_SPAN,
                       floor=1.0)
        ax.set_xlabel("number of chunks")
    fig.supylabel("grad_weight error (multiples of the rounding floor)", fontsize=9)
    legend_below(fig, axes)
    stem = f"error_vs_chunks_{device}"
    return CaptionedFigure(fig, stem,
                           f"Weight-gradient error (in rounding floors) vs number of chunks, per policy, on {device}, "
                           "one row of panels per input family: circles lce, crosses torch's native op; solid lines "
                           "where the resolved acc_dtype is wider than the input, dotted where it equals it (all "
                           "policies then compute the same numbers and their lines coincide). A policy that rounds "
                           "the weight gradient per chunk grows with the chunk count; one that keeps a wide "
                           f"accumulator stays flat. {seed_caption(data)} Error axes reach down to the rounding "
                           f"floor (1) and span at least a factor {ERROR_SPAN:g}.")

QUICK_GROWTH = (Shape(512, 64, 2048), (1, 2, 4, 8, 16, 32, 64))
"""The problem and chunk counts of the notebook's quick growth measurement (its claims re-measure them)."""
QUICK_DRIFT = (Shape(1024, 128, 4096), (1, 4, 16, 64), (0, 1, 2))
"""The problem, chunk counts and seeds of the notebook's quick loss-drift measurement."""
GROWTH_EXPONENT = 0.2
"""A fitted exponent above this counts as growth with the chunk count (0.5: independent per-chunk rounding)."""
AT_FLOOR = 1.005
"""An error below this many floors prints as 1.00: the exact answer rounded once, as good as the dtype allows."""
OUTPUTS = {"loss": "loss_fro_in_floors", "grad_input": "grad_input_fro_in_floors",
           "grad_weight": "grad_weight_fro_in_floors", "grad_bias": "grad_bias_fro_in_floors", "worst gradient": ERROR}
"""Each error a table of errors carries, in floors, by the name a reader sees."""


def shapes(frame: pd.DataFrame) -> str:
    """``32×128×16384, 2048×128×16384``: the distinct shapes (N×D×C) of ``frame``, in order."""
    return ", ".join(f"{n}×{d}×{c}" for n, d, c in sorted(set(zip(frame["N"], frame["D"], frame["C"], strict=True))))


def cpus(frame: pd.DataFrame) -> str:
    """``Intel(R) Xeon(R) Processor, 1 thread``: the CPUs and thread counts in ``frame``'s provenance."""
    threads = "/".join(str(n) for n in sorted(set(frame["num_threads"].dropna().astype(int))))
    return f"{' and '.join(sorted(set(frame['cpu_model'].dropna())))}, {threads} thread{'s' if threads != '1' else ''}"


def policy_errors(table: pd.DataFrame) -> pd.DataFrame:
    """Per family, dtype, shape and setting (``lce default``, ``torch compact``, ``lce balanced, acc fp32``) of the
    CPU runs of lce and torch with default chunking: the seed median of each :data:`OUTPUTS` error and of
    ``VS_UNFUSED``, with its INTERVAL (``_low``, ``_high``) and the number of ``seeds``."""
    data = table[(table["device"] == "cpu") & table["op"].isin(["lce", "torch"]) & (table["chunking"] == "auto")]
    default = (data["policy"] == "auto") & (data["acc_dtype"] == "default")
    setting = data["op"] + " " + data["policy"].where(~default, "default") + data["acc_dtype"].map(
        {"float32": ", acc fp32"}).fillna("")
    return seed_interval(data.assign(setting=setting), [*OUTPUTS.values(), VS_UNFUSED],
                         by=["family", "dtype", "N", "D", "C", "setting"])


def error_ranges(errors: pd.DataFrame, column: str = ERROR) -> pd.DataFrame:
    """Per setting of some :func:`policy_errors` rows, over their families, dtypes and shapes: the lowest and highest
    seed median of ``column`` (``low``, ``high``) and the highest 95th percentile over seeds (``p95``)."""
    return errors.groupby("setting").agg(low=(column, "min"), high=(column, "max"), p95=(f"{column}_high", "max"))


def grows(fits: pd.DataFrame) -> pd.Series:
    """Which series of ``growth.fit_power_law`` fits grow with the chunk count (exponent above GROWTH_EXPONENT)."""
    return fits["exponent"] > GROWTH_EXPONENT


def worst_drift(drift: pd.DataFrame) -> pd.DataFrame:
    """The worst ulps from the exact loss over the seeds of ``defects.loss_drift`` rows, per chunk count and op."""
    return drift.pivot_table(index="chunks", columns="impl", values="ulps_from_exact", aggfunc="max")


def nan_gradients(ignored: pd.DataFrame) -> pd.DataFrame:
    """Per op of ``defects.all_ignored_gradients``: its NaN gradient entries, all its gradient entries (N·D + C·D,
    + C with a bias) and its largest finite |gradient|."""
    entries = ignored["N"] * ignored["D"] + ignored["C"] * (ignored["D"] + ("grad_bias_nan_entries" in ignored))
    return pd.DataFrame({"impl": ignored["impl"], "nan": ignored.filter(like="_nan_entries").sum(axis=1),
                         "entries": entries, "largest": ignored["max_abs_finite_grad"]})


README_SETTINGS = ("lce default", "torch default", "lce balanced, acc fp32")
"""The settings the README's bf16 table compares (the bench table's columns)."""


def _holds_cpu_bf16(path: Path) -> bool:
    """Whether a sweep results file has CPU bf16 rows (the ones the README's bf16 tables read)."""
    rows = pd.read_csv(path, usecols=["device", "dtype"])
    return bool(((rows["device"] == "cpu") & (rows["dtype"] == "bfloat16")).any())


def readme_bf16_errors(results: Path) -> str:
    """The README's bf16 tables, one per input family: per shape and :data:`README_SETTINGS`, the error of the loss
    and of each gradient in floors on the CPU (default chunking), seed median [INTERVAL]."""
    paths, table = load_table(results)
    runs = table[(table["device"] == "cpu") & (table["dtype"] == "bfloat16")]
    errors = policy_errors(runs)
    errors = errors[errors["setting"].isin(README_SETTINGS)]
    names = [name for name in OUTPUTS if name != "worst gradient"]
    parts = []
    for family, rows in errors.groupby("family", sort=True):
        lines = [f"`{family}` inputs, {rows['seeds'].max()} seeds:", "",
                 "| N×D×C | setting | " + " | ".join(names) + " |", "|---" * (len(names) + 2) + "|"]
        rows = rows.assign(order=rows["setting"].map(README_SETTINGS.index)).sort_values(["N", "D", "C", "order"])
        for row in rows.to_dict("records"):
            cells = [f"{row[OUTPUTS[n]]:.2f} [{row[OUTPUTS[n] + '_low']:.2f}–{row[OUTPUTS[n] + '_high']:.2f}]"
                     for n in names]
            lines.append(f"| {row['N']}×{row['D']}×{row['C']} | {row['setting']} | " + " | ".join(cells) + " |")
        parts.append("\n".join(lines) + "\n")
    files = ", ".join(f"`{display_path(path)}`" for path in paths if _holds_cpu_bf16(path))
    return "\n".join(parts) + (f"\nRounding floors (1 = the exact answer rounded once to bf16), seed medians "
                               f"[{INTERVAL}]; CPU runs ({cpus(runs)}) with default chunking, from {files}; a "
                               "setting missing from a shape was not run there.\n")
