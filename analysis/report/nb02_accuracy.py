"""Notebook 02 (accuracy against fp64): its figure, conclusions and README block.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from analysis.judge.pareto import (
    ERROR,
    INTERVAL,
    seed_interval,
)
from analysis.report.nb04_pareto import _shape_count
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
from analysis.report.wording import (
    _conclusion,
    _devices,
    _dtypes,
    _emulation_limit,
    _families,
    _format,
    _join,
    _one_cpu,
    _one_seed,
    _range,
    _seeds,
    _shapes,
    _unfused,
    _values,
    _with_seeds,
    random_family,
    spread,
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

GROWTH_EXPONENT = 0.2
"""A fitted exponent above this counts as growth with the chunk count (0.5: independent per-chunk rounding)."""


# --- 02 · accuracy ---------------------------------------------------------------------------------------------


def _seed_medians(rows: pd.DataFrame, column: str) -> list[float]:
    """``column``'s seed median per shape of ``rows``."""
    if rows.empty:
        return []
    return list(seed_interval(_with_seeds(rows), column, by=["N", "D", "C"])[column])


def policy_errors(table: pd.DataFrame) -> str:
    """02: errors in floors of lce's and torch's defaults and explicit policies, per input family and dtype
    (prepared sweep table).

    Uses the CPU rows with default ("auto") chunking; seed medians (ranges over shapes) with their interval.
    """
    data = table[(table["device"] == "cpu") & table["op"].isin(["lce", "torch"]) & (table["chunking"] == "auto")]
    if data.empty:
        return _conclusion("The results hold no CPU runs of lce or torch with default chunking.",
                           inputs="the committed sweep results.", limits="nothing to conclude from.")
    data = _with_seeds(data)
    bullets, low_precision = [], {}
    for (family, dtype), rows in data.groupby(["family", "dtype"], sort=True):
        default = rows[(rows["policy"] == "auto") & (rows["acc_dtype"] == "default")]
        parts = []
        for op in ("lce", "torch"):
            mine = default[default["op"] == op]
            parts.append(f"{op} {spread(mine, ERROR)} on its worst gradient{_unfused(mine, dtype)} and "
                         f"{spread(mine, 'loss_fro_in_floors')} on the loss")
            if dtype != "float32":
                found = low_precision.setdefault(family, {})
                found.setdefault(op, []).extend(_seed_medians(mine, ERROR))
                found.setdefault(f"{op}_loss", []).extend(_seed_medians(mine, "loss_fro_in_floors"))
        explicit = rows[(rows["policy"] != "auto") & (rows["acc_dtype"] == "default")]
        spans = []
        for op in ("lce", "torch"):
            medians = [median for _, mine in explicit[explicit["op"] == op].groupby("policy")
                       for median in _seed_medians(mine, ERROR)]
            if medians:
                spans.append(f"{op} {_range(medians)}")
        wide = rows[(rows["op"] == "lce") & (rows["policy"] != "auto") & (rows["acc_dtype"] == "float32")]
        wide_text = ""
        if dtype != "float32" and len(wide):
            wide_text = ("; with `acc_dtype=float32`, lce " + ", ".join(
                f"{policy} {spread(mine, ERROR)}" for policy, mine in wide.groupby("policy")))
        bullets.append(f"**{family}, {dtype}**, default options: " + "; ".join(parts)
                       + (f". Explicit policies without acc_dtype (computing in {dtype}): " + ", ".join(spans)
                          if spans else "") + wide_text + ".")
    finding = ("Worst-gradient and loss errors in rounding floors (1 = the exact answer rounded once), seed medians "
               "per input family.")
    if low_precision:
        per_family = [f"{'' if len(low_precision) == 1 else f'on {family} inputs, '}lce is at "
                      f"{_range(found.get('lce', []))} rounding floors on its worst gradient and "
                      f"{_range(found.get('lce_loss', []))} on the loss, torch 2.13 at "
                      f"{_range(found.get('torch', []))} and {_range(found.get('torch_loss', []))}"
                      for family, found in low_precision.items()]
        finding = ("With default options in bf16 and fp16, " + "; ".join(per_family) + " (seed medians, ranges "
                   "over shapes and dtypes; 1 = the exact answer rounded once).")
    return _conclusion(
        finding, bullets,
        inputs=(f"{_families(data)}; {_shapes(data)}; {_dtypes(data)}; {_devices(data)}; default (\"auto\") "
                f"chunking; {_seeds(data)}, medians over seeds with the {INTERVAL} in brackets; fp32 errors also as "
                "multiples of the unfused fp32 computation's on the same inputs; the committed sweep results."),
        limits=(f"{_one_seed(data)}{_shape_count(data)}, so a median hides the spread over shapes (the figures show "
                f"every run); {_one_cpu(data)}; CPU layouts only here (the CUDA layouts are in notebook 04)."))


def chunk_growth(runs: pd.DataFrame, fits: pd.DataFrame, *, cpu: str) -> str:
    """02: which policies' weight-gradient error grows with the chunk count (``growth.chunk_growth`` rows, their
    ``fit_power_law`` fits with a ``layouts`` column)."""
    counts = sorted(runs["chunks"].unique())
    growing = fits[fits["exponent"] > GROWTH_EXPONENT].sort_values("exponent", ascending=False)
    flat = fits[fits["exponent"] <= GROWTH_EXPONENT]
    bullets = [f"{r.impl} {r.policy} ({r.layouts} layouts): error ∝ chunks^{_format(r.exponent, '.2f')}, "
               f"{r.at_max_chunks:.2f} floors at {counts[-1]} chunks" for r in growing.itertuples()]
    accurate = fits[(fits["impl"] == "lce") & (fits["policy"] == "accurate")]
    if growing.empty:
        finding = ("No policy's weight-gradient error grows with the chunk count (every fitted exponent ≤ "
                   f"{GROWTH_EXPONENT}).")
    else:
        finding = (f"Rounding the weight gradient once per chunk makes its error grow with the chunk count: "
                   f"{len(growing)} of {len(fits)} series have a fitted exponent above {GROWTH_EXPONENT} "
                   f"({_range(growing['exponent'])}).")
    if len(accurate):
        finding += (f" lce's accurate policy, which sums in fp32 and rounds once, stays at "
                    f"{_range(accurate['at_max_chunks'])} floors at {counts[-1]} chunks "
                    f"(exponent {_range(accurate['exponent'])}).")
    if len(flat):
        bullets.append("flat (exponent ≤ " + f"{GROWTH_EXPONENT}): " + ", ".join(
            f"{r.impl} {r.policy} ({r.layouts}, {_format(r.exponent, '.2f')})" for r in flat.itertuples()))
    acc = _join(_values(runs, "acc_dtype"))
    return _conclusion(
        finding, bullets,
        inputs=(f"{random_family()}; {_shapes(runs)}; {_dtypes(runs)} with acc_dtype={acc}; chunk counts "
                f"{_join([str(c) for c in counts])} (explicit rows per chunk); "
                f"{_devices(runs, f'{cpu}, when the notebook executed')}; {_seeds(runs)}."),
        limits=(f"{_one_seed(runs)}one shape: the exponents are least-squares fits to {len(counts)} points, a "
                f"description of this run rather than a law; {_emulation_limit(runs)}torch's op runs on the CPU "
                "only."))


def loss_drift(drift: pd.DataFrame, *, cpu: str) -> str:
    """02: how far the default-options loss is from the exact one, in ulps, per chunk count (``defects.loss_drift``
    rows for one or more seeds)."""
    worst = drift.groupby(["impl", "chunks"])["ulps_from_exact"].max()
    counts = sorted(drift["chunks"].unique())
    first, last = counts[0], counts[-1]
    impls = set(worst.index.get_level_values(0))
    seeds = drift["seed"].nunique()
    finding = ""
    if "torch" in impls:
        torch = worst["torch"]
        finding += (f"torch's loss is up to {torch[first]:.2f} ulps from the exact loss at {first} chunk"
                    f"{'s' if first != 1 else ''} and up to {torch[last]:.2f} at {last} (worst over {seeds} "
                    f"seed{'s' if seeds != 1 else ''}). ")
    if "lce" in impls:
        lce_max = float(worst["lce"].max())
        rounding = ("correctly rounded (≤ 0.5 ulp)" if lce_max <= 0.5 else "within 1 ulp" if lce_max <= 1
                    else f"**{lce_max:.2f} ulps** off")
        finding += (f"lce's loss is {rounding} at every chunk count, at most {lce_max:.2f} ulps from the exact loss: "
                    "it sums across chunks in fp64 and rounds once.")
    return _conclusion(
        finding,
        inputs=(f"{random_family()}; {_shapes(drift)}; {_dtypes(drift)}; default options with explicit chunk "
                f"counts {_join([str(c) for c in counts])}; CPU ({cpu}, when the notebook executed); "
                f"{_seeds(drift)}; ulps of {_dtypes(drift)} at the exact (fp64) loss."),
        limits=("one shape and few seeds; the CPU path of torch's op (its CUDA path may sum differently); "
                "one ulp of a loss near 10 is 0.06 in bf16, small for training, large for a reference."))


def all_ignored(table: pd.DataFrame, *, cpu: str) -> str:
    """02: what each op returns when every target is ignored (``defects.all_ignored_gradients``)."""
    nan_columns = [c for c in table.columns if c.endswith("_nan_entries")]
    bullets = []
    for row in table.itertuples():
        nans = int(sum(getattr(row, c) for c in nan_columns))
        loss = "NaN" if not np.isfinite(row.loss) else f"{row.loss:.3g}"
        grads = (f"**{nans:,} NaN gradient entries**" if nans else
                 f"finite gradients, largest |entry| {row.max_abs_finite_grad:.3g}"
                 + (" (all zero)" if row.max_abs_finite_grad == 0 else ""))
        bullets.append(f"{row.impl}: {row.reduction} loss {loss}, {grads}")
    nan_impls = [r.impl for r in table.itertuples() if sum(getattr(r, c) for c in nan_columns)]
    lce = table[table["impl"] == "lce"]
    lce_clean = len(lce) and not sum(int(lce[c].iloc[0]) for c in nan_columns)
    finding = ("With every target ignored, " + ("lce returns zero gradients, as the reference does"
                                                 if lce_clean else "lce returns NaN gradients")
               + ("; " + _join(nan_impls) + " returns NaN gradients, which would poison an optimizer step."
                  if nan_impls else "; no op returns NaN gradients."))
    chunks = table["chunk_rows"].dropna().unique() if "chunk_rows" in table else []
    chunk_text = f"; chunked ops with default options and {int(chunks[0])}-row chunks" if len(chunks) else ""
    return _conclusion(
        finding, bullets,
        inputs=(f"{random_family()} with every target set to ignore_index; {_shapes(table)}; {_dtypes(table)}"
                f"{chunk_text}; CPU ({cpu}, when the notebook executed); {_seeds(table)}."),
        limits="one shape, one dtype and one reduction; the CPU path of torch's op.")


def readme_bf16_errors(results: Path) -> str:
    """Errors in floors of lce's and torch's defaults on CPU bf16 (quick grid, default chunking), per input family:
    seed medians with their 5th-95th percentile interval."""
    from analysis.judge.pareto import INTERVAL, load_table
    from analysis.report.wording import spread

    _, table = load_table(results)
    data = table[(table["device"] == "cpu") & (table["dtype"] == "bfloat16") & (table["chunking"] == "auto")]
    parts, shapes, seeds = [], set(), set()
    for family, rows in data.groupby("family", sort=True):
        default = rows[(rows["policy"] == "auto") & (rows["acc_dtype"] == "default")]
        mine, theirs = default[default["op"] == "lce"], default[default["op"] == "torch"]
        balanced = rows[(rows["op"] == "lce") & (rows["policy"] == "balanced") & (rows["acc_dtype"] == "float32")]
        if mine.empty or theirs.empty or balanced.empty:
            continue
        shapes |= {f"{r.N}x{r.D}x{r.C}" for r in mine.itertuples()}
        seeds |= set(mine["seed"])
        parts.append(f"on `{family}` inputs lce's default is {spread(mine, 'worst_grad_in_floors', unit='x')} the "
                     f"rounding floor on its worst gradient and {spread(mine, 'loss_fro_in_floors', unit='x')} on "
                     f"the loss; torch's default is {spread(theirs, 'loss_fro_in_floors', unit='x')} on the loss, "
                     f"{spread(theirs, 'grad_weight_fro_in_floors', unit='x')} on grad_weight and "
                     f"{spread(theirs, 'grad_bias_fro_in_floors', unit='x')} on grad_bias; `balanced` with "
                     f"`acc_dtype=torch.float32` gives {spread(balanced, 'grad_weight_fro_in_floors', unit='x')} "
                     "on grad_weight")
    if not parts:
        return "The quick grid has no CPU bf16 runs with default chunking yet.\n"
    interval = f"; in brackets the {INTERVAL}" if len(seeds) > 1 else ""
    return ("In bf16 on the CPU, with lce's default (\"accurate\": every GEMM in fp32) and `balanced` with bf16 "
            "backward GEMMs: " + "; ".join(parts) + f". Quick grid, default chunking, shapes "
            f"{', '.join(sorted(shapes))}, {len(seeds)} seed{'s' if len(seeds) != 1 else ''}: medians over seeds"
            f"{interval} (`analysis/results/quick.csv`).\n")
