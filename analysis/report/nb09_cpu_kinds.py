"""Notebook 09 (CPU kinds: native or emulated bf16/fp16 GEMMs): its figures, the key numbers its prose quotes
(each claim asserted in tests/claims/test_nb09_cpu_kinds.py) and its README block, from ``cpu_gemm_rates.csv``
and ``recommend_check.csv`` (``python -m analysis cpu-kinds [--avx2-stand-in]``), and ``cpu_gemm_probe.csv``
(``python -m analysis cpu-probe [--avx2-stand-in]``). Nothing here measures.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.core.provenance import cpu_kind
from analysis.core.results_io import CPU_GEMM_PROBE, CPU_GEMM_RATES, RECOMMEND_CHECK, latest, load_kind
from analysis.report.style import CaptionedFigure, apply_style, new_figure
from analysis.report.tables import markdown_table
from lce.planning.cpu_gemms import EMULATED_SLOWDOWN

__all__ = ["with_kinds", "rate_numbers", "recommend_numbers", "blind_numbers", "estimate_overshoot", "probe_numbers",
           "plot_cpu_gemm_rates", "plot_recommend_check", "plot_cpu_gemm_probe", "draw_cpu_kind_figures",
           "readme_cpu_kinds", "readme_cpu_probe"]

DTYPE_COLOURS = {"float32": "tab:blue", "bfloat16": "tab:orange", "float16": "tab:green"}
ROLES = ("pick", "pick measure=True", "capability-blind pick")


def with_kinds(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` with a ``cpu_kind`` column (model, AVX2 stand-in or not, bf16 GEMMs native or emulated)."""
    if table.empty:
        return table.assign(cpu_kind=pd.Series(dtype=str))
    return table.assign(cpu_kind=[cpu_kind(model, gemms) for model, gemms
                                  in zip(table["cpu_model"], table["cpu_gemms"], strict=True)])


def rate_numbers(rates: pd.DataFrame) -> pd.DataFrame:
    """Per CPU kind (its latest run): fp32 GFLOP/s, bf16 and fp16 rates over fp32's, lce.planning.cpu_gemms' verdicts,
    the probe's slowdown and cost."""
    rates = latest(with_kinds(rates), ["cpu_kind", "dtype"])
    rows = []
    for kind, group in rates.groupby("cpu_kind", sort=True):
        by = group.set_index("dtype")
        rows.append({"cpu_kind": kind, "fp32_gflops": by.at["float32", "gflops"],
                     "bf16_over_fp32": by.at["bfloat16", "rate_over_fp32"],
                     "fp16_over_fp32": by.at["float16", "rate_over_fp32"],
                     "bf16": by.at["bfloat16", "support"], "fp16": by.at["float16", "support"],
                     "bf16_probe_slowdown": by.at["bfloat16", "probe_slowdown"],
                     "fp16_probe_slowdown": by.at["float16", "probe_slowdown"],
                     "probe_cost_s": by.loc[["bfloat16", "float16"], "probe_cost_s"].sum(),
                     "date": str(group["date"].max())[:10]})
    return pd.DataFrame(rows)


def _check(check: pd.DataFrame) -> pd.DataFrame:
    """The latest run of each CPU kind, with a problem label (shape and budget)."""
    check = with_kinds(check)
    latest_dates = check.groupby("cpu_kind")["date"].transform("max")
    check = check[check["date"] == latest_dates]
    return check.assign(problem=[f"{r.N}x{r.D}x{r.C}, {r.budget}" for r in check.itertuples()])


def recommend_numbers(check: pd.DataFrame) -> pd.DataFrame:
    """Per CPU kind and (shape, budget): the pick's and measure=True's time over the fastest option set timed in the
    same run, how many were timed, and the pick's label."""
    rows = []
    for (kind, problem), group in _check(check).groupby(["cpu_kind", "problem"], sort=False):
        pick, measured = _with_role(group, "pick"), _with_role(group, "pick measure=True")
        rows.append({"cpu_kind": kind, "problem": problem, "pick": pick["label"],
                     "pick_time_s": pick["time_median_s"], "pick_over_fastest": pick["time_over_fastest"],
                     "measured_pick_over_fastest": measured["time_over_fastest"],
                     "timed": len(group), "fastest": group.loc[group["time_over_fastest"].idxmin(), "label"]})
    return pd.DataFrame(rows)


def _with_role(group: pd.DataFrame, role: str) -> pd.Series:
    """The row of ``group`` that plays ``role`` (a row's ``role`` lists all it plays, joined by " + ")."""
    return group[group["role"].str.split(" + ", regex=False).map(lambda roles: role in roles)].iloc[0]


def blind_numbers(check: pd.DataFrame) -> pd.DataFrame:
    """Where the CPU emulates bf16 GEMMs: the capability-blind pick's time over lce's pick, per (shape, budget); its
    time is measured where its estimate from the GEMM rates (``blind_estimate_s``) was short enough, else that
    estimate (``timing``)."""
    rows = []
    for (kind, problem), group in _check(check).groupby(["cpu_kind", "problem"], sort=False):
        if not group["role"].str.contains("capability-blind pick", regex=False).any():
            continue
        blind, pick = _with_role(group, "capability-blind pick"), _with_role(group, "pick")
        rows.append({"cpu_kind": kind, "problem": problem, "blind_pick": blind["label"],
                     "blind_time_s": blind["time_median_s"], "timing": blind["timing"],
                     "blind_estimate_s": blind["blind_estimate_s"], "pick_time_s": pick["time_median_s"],
                     "blind_over_pick": blind["time_median_s"] / pick["time_median_s"]})
    table = pd.DataFrame(rows)
    if table.empty:
        return table
    discount = np.where(table["timing"] != "measured", estimate_overshoot(table), 1.0)
    return table.assign(conservative_over_pick=table["blind_over_pick"] / discount)


def estimate_overshoot(blind: pd.DataFrame) -> float:
    """The largest factor by which the blind picks' estimate exceeded their measured time where both exist (at
    least 1): the estimate takes one 512x512x8192 product's emulated rate, and smaller products run faster there."""
    both = blind[blind["timing"] == "measured"]
    return max(1.0, float((both["blind_estimate_s"] / both["blind_time_s"]).max())) if len(both) else float("nan")


def plot_cpu_gemm_rates(rates: pd.DataFrame) -> CaptionedFigure | None:
    """GFLOP/s per dtype and CPU kind (log scale), each low-precision bar marked with lce.planning.cpu_gemms'
    verdict."""
    if rates.empty:
        return None
    apply_style()
    data = latest(with_kinds(rates), ["cpu_kind", "dtype"])
    kinds = sorted(data["cpu_kind"].unique())
    fig = new_figure(max(6.0, 2.4 * len(kinds) + 2), 4.0)
    ax = fig.add_subplot()
    width = 0.26
    for offset, (dtype, colour) in enumerate(DTYPE_COLOURS.items()):
        rows = data[data["dtype"] == dtype].set_index("cpu_kind").reindex(kinds)
        positions = np.arange(len(kinds)) + (offset - 1) * width
        ax.bar(positions, rows["gflops"], width, color=colour, label=dtype)
        for x, row in zip(positions, rows.itertuples(), strict=True):
            if dtype != "float32" and row.support == row.support:
                ax.annotate(f"{row.support}\n{row.rate_over_fp32:.2g}x", (x, row.gflops), ha="center",
                            va="bottom", fontsize=6)
    ax.set_yscale("log")
    ax.set_xticks(np.arange(len(kinds)), [kind.replace(" (", "\n(") for kind in kinds], fontsize=6)
    ax.set_ylabel("GEMM rate (GFLOP/s, 512x512x8192, best of 3)")
    ax.set_title("bf16/fp16 GEMMs: native on some CPU kinds, emulated on others")
    ax.legend(fontsize=7)
    shape = data.iloc[0]
    caption = (f"GEMM rate of a {int(shape.m)}x{int(shape.k)}x{int(shape.n)} product per dtype on each CPU kind "
               f"measured (python -m analysis cpu-kinds; the AVX2 stand-in limits oneDNN, MKL and ATen to AVX2 on "
               f"the same machine). Labels: lce.planning.cpu_gemms' verdict from its own small probe (emulated when "
               f"the "
               f"dtype takes over {EMULATED_SLOWDOWN:g}x fp32's time) and the rate over fp32's. Where bf16 is "
               f"emulated lce runs those GEMMs in fp32 (lce.plan), and recommend's time model knows it.")
    return CaptionedFigure(fig, "cpu_gemm_rates", caption)


def plot_recommend_check(check: pd.DataFrame) -> CaptionedFigure | None:
    """Per CPU kind: the pick's, measure=True's and the capability-blind pick's time over the fastest option set
    timed in the same run, per (shape, budget)."""
    if check.empty:
        return None
    apply_style()
    data = _check(check)
    kinds = sorted(data["cpu_kind"].unique())
    fig = new_figure(5.2 * len(kinds), 4.2)
    axes = np.atleast_1d(fig.subplots(1, len(kinds), sharey=True))
    colours = {"pick": "tab:blue", "pick measure=True": "tab:green", "capability-blind pick": "tab:red"}
    for ax, kind in zip(axes, kinds, strict=True):
        group = data[data["cpu_kind"] == kind]
        problems = list(dict.fromkeys(group["problem"]))
        for offset, role in enumerate(ROLES):
            plays = group["role"].str.split(" + ", regex=False).map(lambda roles, role=role: role in roles)
            for timing, hatch in (("measured", None), ("estimated from the GEMM rates", "//")):
                values = (group[plays & (group["timing"] == timing)].groupby("problem")["time_over_fastest"].min()
                          .reindex(problems))
                if values.notna().any():
                    label = role if timing == "measured" else f"{role} (estimated)"
                    ax.bar(np.arange(len(problems)) + (offset - 1) * 0.26, values, 0.26, color=colours[role],
                           hatch=hatch, edgecolor="white" if hatch else None, label=label)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.legend(fontsize=6, loc="upper left")
        ax.set_yscale("log")
        ax.set_xticks(np.arange(len(problems)), [p.replace(", ", "\n") for p in problems], fontsize=6, rotation=60)
        ax.set_title(kind, fontsize=7)
    axes[0].set_ylabel("time / fastest option set timed (one fwd+bwd, bf16)")
    caption = ("lce.recommend on each CPU kind: for three shapes (bf16, random inputs) and three budgets (lce auto's "
               "peak, 1.5x and 1.1x the gradients' bytes), the pick of its models, the pick of measure=True and, "
               "where the CPU emulates bf16 GEMMs, the pick a model that assumed them native would make, each timed "
               "in one process with interleaved rounds beside the feasible alternatives its time model ranks best "
               "per policy; the bar is a median over the fastest of them (1 = the pick was the fastest tried). "
               "Hatched: the blind pick's time estimated from the GEMM rates where one call would take minutes "
               "(notebook 09 says how far the estimate is from the measurement where both exist).")
    return CaptionedFigure(fig, "recommend_check", caption)


def probe_numbers(probe: pd.DataFrame) -> pd.DataFrame:
    """Per CPU kind, method and dtype (every run of ``cpu_gemm_probe.csv``): how many fresh processes measured, how
    many called the dtype native and how many emulated, in how many conditions (thread count x load) the verdict
    was not unanimous, and the slowdowns' range."""
    data = with_kinds(probe)
    rows = []
    for (kind, method, dtype), group in data.groupby(["cpu_kind", "method", "dtype"], sort=True):
        per_condition = group.groupby(["threads", "load"])["support"].nunique()
        native = group[group["support"] == "native"]
        native_conditions = list(dict.fromkeys(zip(native["threads"], native["load"], strict=True)))
        rows.append({"cpu_kind": kind, "method": method, "dtype": dtype, "processes": len(group),
                     "conditions": len(per_condition), "native": int((group["support"] == "native").sum()),
                     "emulated": int((group["support"] == "emulated").sum()),
                     "split_conditions": int((per_condition > 1).sum()),
                     "slowdown_min": group["slowdown"].min(), "slowdown_max": group["slowdown"].max(),
                     "native_conditions": ", ".join(f"{t} thr {load}" for t, load in native_conditions),
                     "native_condition_count": len(native_conditions),
                     "probe_s_max": group["probe_s"].max(), "date": str(group["date"].max())[:10]})
    return pd.DataFrame(rows)


def plot_cpu_gemm_probe(probe: pd.DataFrame) -> CaptionedFigure | None:
    """Per CPU kind: each fresh process's slowdown (dtype over fp32's time) per thread count and load, for
    lce.planning.cpu_gemms and for the earlier probe, with each method's threshold."""
    if probe.empty:
        return None
    from analysis.studies.cpu_probe import EARLIER_METHOD, EARLIER_THRESHOLD, THIS_METHOD

    apply_style()
    data = with_kinds(probe)
    kinds = sorted(data["cpu_kind"].unique())
    fig = new_figure(5.0 * len(kinds), 4.2)
    axes = np.atleast_1d(fig.subplots(1, len(kinds), sharey=True))
    markers = {THIS_METHOD: "o", EARLIER_METHOD: "x"}
    for ax, kind in zip(axes, kinds, strict=True):
        group = data[data["cpu_kind"] == kind]
        conditions = sorted(dict.fromkeys(zip(group["load"], group["threads"], strict=True)),
                            key=lambda condition: (condition[0] != "idle", condition[1]))
        position = {condition: index for index, condition in enumerate(conditions)}
        for (method, dtype), rows in group.groupby(["method", "dtype"]):
            shift = (0.12 if method == THIS_METHOD else -0.12) + (0.05 if dtype == "float16" else -0.05)
            x = [position[(load, threads)] + shift for load, threads in zip(rows["load"], rows["threads"],
                                                                             strict=True)]
            ax.scatter(x, rows["slowdown"], marker=markers[method], color=DTYPE_COLOURS[dtype], s=22,
                       label=f"{dtype}, {method}")
        ax.axhline(EMULATED_SLOWDOWN, color="tab:blue", lw=0.8, ls="--")
        ax.axhline(EARLIER_THRESHOLD, color="tab:red", lw=0.8, ls=":")
        ax.text(len(conditions) - 0.5, EMULATED_SLOWDOWN * 1.08, f"lce: emulated above {EMULATED_SLOWDOWN:g}x",
                ha="right", fontsize=6, color="tab:blue")
        ax.text(len(conditions) - 0.5, EARLIER_THRESHOLD / 1.25, f"earlier: above {EARLIER_THRESHOLD:g}x", ha="right",
                fontsize=6, color="tab:red")
        ax.set_xticks(range(len(conditions)), [f"{threads} thread{'s' if threads > 1 else ''}\n{load}"
                                               for load, threads in conditions], fontsize=6)
        ax.set_yscale("log")
        ax.set_title(kind, fontsize=7)
    axes[0].set_ylabel("dtype's time / fp32's (64x256x256 product)")
    axes[0].legend(fontsize=6, loc="center left")
    fig.suptitle("Native or emulated: does the verdict depend on the thread count or on the load?", fontsize=9)
    caption = ("Each point is one fresh process's verdict on bf16 (orange) or fp16 (green): lce.planning.cpu_gemms' "
               "one-thread "
               "interleaved check (circles; emulated above the dashed line) and the earlier probe at the process's "
               "thread count (crosses; above the dotted line), per thread count, with the other cores idle or every "
               "core busy with a spinning process (python -m analysis cpu-probe [--avx2-stand-in]). A verdict that "
               "does not depend on the conditions keeps one side of its line in every column.")
    return CaptionedFigure(fig, "cpu_gemm_probe", caption)


def draw_cpu_kind_figures(rates: pd.DataFrame, check: pd.DataFrame,
                          probe: pd.DataFrame | None = None) -> list[CaptionedFigure]:
    """Every figure this module draws that has data."""
    figures = (plot_cpu_gemm_rates(rates), plot_recommend_check(check),
               plot_cpu_gemm_probe(probe if probe is not None else pd.DataFrame()))
    return [figure for figure in figures if figure is not None]


def readme_cpu_probe(results) -> str:
    """The README's "cpu-probe" block: per CPU kind, method and dtype, the verdicts of every fresh process over the
    thread counts and loads measured."""
    _, probe = load_kind(results, CPU_GEMM_PROBE.name)
    if probe.empty:
        return "No probe run has been recorded yet (`python -m analysis cpu-probe`).\n"
    numbers = probe_numbers(probe)
    threads = ", ".join(str(t) for t in sorted(probe["threads"].unique()))
    numbers = numbers.assign(
        verdicts=[f"{n} native, {e} emulated" for n, e in zip(numbers["native"], numbers["emulated"], strict=True)],
        slowdowns=[f"{low:.2g}-{high:.2g}x" for low, high in zip(numbers["slowdown_min"], numbers["slowdown_max"],
                                                                 strict=True)],
        native_conditions=["none" if count == 0 else "every one" if count == conditions else text
                           for text, count, conditions in zip(numbers["native_conditions"],
                                                              numbers["native_condition_count"],
                                                              numbers["conditions"], strict=True)])
    text = markdown_table(numbers[["cpu_kind", "method", "dtype", "verdicts", "native_conditions", "slowdowns",
                                   "date"]].rename(columns={
        "cpu_kind": "CPU kind", "method": "method", "verdicts": f"fresh processes (threads {threads}, idle / busy)",
        "native_conditions": "conditions where it said native", "slowdowns": "slowdown range"}), {})
    return text


def readme_cpu_kinds(results) -> str:
    """The README's "cpu-kinds" block: GEMM rates and verdicts per CPU kind, and recommend's picks against the
    fastest option set timed beside them."""
    _, rates = load_kind(results, CPU_GEMM_RATES.name)
    _, check = load_kind(results, RECOMMEND_CHECK.name)
    if rates.empty:
        return "No CPU kind has been measured yet (`python -m analysis cpu-kinds`).\n"
    numbers = rate_numbers(rates)
    table = numbers.assign(probe=[f"{b:.2g}x / {f:.2g}x, {cost * 1e3:.0f} ms" for b, f, cost in zip(
        numbers["bf16_probe_slowdown"], numbers["fp16_probe_slowdown"], numbers["probe_cost_s"], strict=True)])
    text = markdown_table(table[["cpu_kind", "fp32_gflops", "bf16_over_fp32", "bf16", "fp16_over_fp32", "fp16",
                                 "probe", "date"]].rename(columns={
        "cpu_kind": "CPU kind", "fp32_gflops": "fp32 GFLOP/s", "bf16_over_fp32": "bf16 / fp32 rate",
        "bf16": "bf16 verdict", "fp16_over_fp32": "fp16 / fp32 rate", "fp16": "fp16 verdict",
        "probe": "probe slowdown bf16 / fp16, its cost"}),
        {"fp32 GFLOP/s": "{:.0f}", "bf16 / fp32 rate": "{:.3g}", "fp16 / fp32 rate": "{:.3g}"})
    if check.empty:
        return text
    picks = recommend_numbers(check)
    summary = picks.groupby("cpu_kind").agg(problems=("problem", "size"), worst=("pick_over_fastest", "max"),
                                            median=("pick_over_fastest", "median"),
                                            measured=("measured_pick_over_fastest", "max")).reset_index()
    blind = blind_numbers(check)
    if not blind.empty:
        summary = summary.merge(blind.groupby("cpu_kind")["blind_over_pick"].agg(["min", "max"]).reset_index(),
                                on="cpu_kind", how="left")
        summary["blind"] = [f"{low:.1f}-{high:.1f}x" if low == low else "—"
                            for low, high in zip(summary["min"], summary["max"], strict=True)]
    else:
        summary["blind"] = "—"
    text += "\n" + markdown_table(summary[["cpu_kind", "problems", "median", "worst", "measured", "blind"]].rename(
        columns={"cpu_kind": "CPU kind", "problems": "shapes x budgets", "median": "pick / fastest (median)",
                 "worst": "pick / fastest (worst)", "measured": "measure=True / fastest (worst)",
                 "blind": "capability-blind pick / pick"}),
        {"pick / fastest (median)": "{:.2f}", "pick / fastest (worst)": "{:.2f}",
         "measure=True / fastest (worst)": "{:.2f}"})
    return text
