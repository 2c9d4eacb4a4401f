"""Notebook 11 (per-token log-probabilities and entropy for RL, issue 32): each recipe's error on RL's scale, the
confident rows, the costs, their figures and the README block, from ``rl_logprobs.csv.gz``, ``rl_cost.csv`` and
``rl_example.csv``. Nothing here measures.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.report.style import CaptionedFigure, apply_style, new_figure
from analysis.report.tables import markdown_table

__all__ = ["RECIPE_ORDER", "RL_FAMILIES", "QWEN_CLASSES", "recipe_summary", "qwen_summary", "verdicts",
           "confident_summary", "chunking_summary", "cost_summary", "grown_peak", "inputs_line", "qwen_line",
           "plot_ratio_error", "plot_entropy_error", "plot_confident_rows", "plot_qwen_head", "plot_costs",
           "draw_rl_figures", "readme_rl_logprobs", "readme_rl_qwen_head", "qwen_table", "example_line"]

RECIPE_ORDER = ("trl", "trl cast_lm_head_to_fp32", "materialized", "fp32 statistics, cast back", "fp32 head",
                "lce auto cuda", "lce auto cpu", "lce compact cuda acc=fp32", "lce compact cuda acc=input")
RL_FAMILIES = ("trained", "calibrated")
"""The families whose targets are sampled from the policy: the rows an RL batch holds (the confident rows are
judged apart, :func:`confident_summary`)."""
QWEN_CLASSES = 151936
"""The Qwen-size head's classes: its rows (bf16, two temperatures) are judged apart (:func:`qwen_summary`), beside
the costs measured at the same head."""
CLIP, TIGHT = 0.2, 1e-3
COLORS = {"trl": "tab:brown", "trl cast_lm_head_to_fp32": "tab:pink", "materialized": "tab:red",
          "fp32 statistics, cast back": "tab:orange", "fp32 head": "tab:purple", "lce auto cuda": "tab:blue",
          "lce auto cpu": "tab:cyan", "lce compact cuda acc=fp32": "tab:green",
          "lce compact cuda acc=input": "tab:olive"}


def _ordered(labels) -> list[str]:
    present = list(dict.fromkeys(labels))
    return [label for label in RECIPE_ORDER if label in present] + [x for x in present if x not in RECIPE_ORDER]


def _sampled(table: pd.DataFrame) -> pd.DataFrame:
    """The sampled-target rows of the main grid (the Qwen-size head's apart)."""
    return table[table["family"].isin(RL_FAMILIES) & (table["C"] != QWEN_CLASSES)]


def _qwen(table: pd.DataFrame) -> pd.DataFrame:
    return table[table["C"] == QWEN_CLASSES]


def recipe_summary(table: pd.DataFrame) -> pd.DataFrame:
    """Per recipe and dtype over the sampled-target problems (families x temperatures x seeds): the median of the
    per-problem median and p99 ratio errors, the worst token's ratio error (max over problems), the mean share of
    tokens over 1e-3, the k3 KL's mean and range, the entropy's worst absolute error, the median policy-gradient
    floors, and the worst tokens' median exact p_target and rank."""
    return _summarized(_sampled(table))


def _summarized(rows: pd.DataFrame) -> pd.DataFrame:
    out = []
    for (recipe, dtype), group in rows.groupby(["recipe", "dtype"], sort=False):
        out.append({"recipe": recipe, "dtype": dtype, "problems": len(group),
                    "seeds": group["seed"].nunique(), "temperatures": group["temperature"].nunique(),
                    "ratio_median": float(group["ratio_err_median"].median()),
                    "ratio_p99": float(group["ratio_err_p99"].median()),
                    "ratio_p99_low": float(group["ratio_err_p99"].min()),
                    "ratio_p99_high": float(group["ratio_err_p99"].max()),
                    "ratio_max": float(group["ratio_err_max"].max()),
                    "share_over_1e-3": float(group["ratio_share_over_1e-3"].mean()),
                    "share_over_clip": float(group["ratio_share_over_clip"].mean()),
                    "kl": float(group["kl_k3"].mean()), "kl_low": float(group["kl_k3"].min()),
                    "kl_high": float(group["kl_k3"].max()),
                    "entropy_err_p99": float(group["entropy_err_p99"].median()),
                    "entropy_err_max": float(group["entropy_err_max"].max()),
                    "grad_input_floors": float(group["grad_input_floors"].median()),
                    "grad_weight_floors": float(group["grad_weight_floors"].median()),
                    "grad_weight_floors_high": float(group["grad_weight_floors"].max()),
                    "worst_p_target": float(group["worst_p_target"].median()),
                    "worst_rank": float(group["worst_rank"].median())})
    summary = pd.DataFrame(out)
    if summary.empty:
        return summary
    order = {label: i for i, label in enumerate(_ordered(summary["recipe"]))}
    return summary.sort_values(["dtype", "recipe"], key=lambda s: s.map(order) if s.name == "recipe" else s,
                               ignore_index=True)


def qwen_summary(table: pd.DataFrame, costs: pd.DataFrame) -> pd.DataFrame:
    """At the Qwen-size head, per recipe (bf16): :func:`recipe_summary`'s columns over its temperatures and seeds,
    beside the cost measured at the same head and batch (peak GiB, its multiple of one bf16 logits copy, seconds,
    how the GEMMs ran); the CUDA-layout arms have no CPU cost."""
    summary = _summarized(_qwen(table))
    if summary.empty:
        return summary
    n = int(_qwen(table)["N"].iloc[0])
    cost = cost_summary(costs)
    here = cost[cost["N"] == n].set_index("recipe") if not cost.empty else pd.DataFrame()
    columns = {"peak_gib": "peak_gib", "logits_copies": "logits_copies", "time_median_s": "time_s", "gemms": "gemms"}
    for column, name in columns.items():
        summary[name] = summary["recipe"].map(here[column]) if column in here else None
    return summary.assign(N=n)


def verdicts(table: pd.DataFrame) -> pd.DataFrame:
    """Per recipe and dtype: whether every sampled token of every problem keeps its importance-ratio error below
    1e-3, and below the 0.2 clip."""
    summary = recipe_summary(table)
    return summary.assign(below_tight=summary["ratio_max"] < TIGHT, below_clip=summary["ratio_max"] < CLIP)[
        ["recipe", "dtype", "ratio_max", "below_tight", "below_clip"]]


def confident_summary(table: pd.DataFrame) -> pd.DataFrame:
    """The confident rows (targets leading by M nats), per recipe, dtype and margin: the worst relative error of
    log p and of the entropy over seeds and temperatures, and the policy-gradient floors (worst)."""
    rows = table[table["family"].str.startswith("confident")]
    out = rows.groupby(["recipe", "dtype", "margin"], sort=False).agg(
        logp_rel_err_max=("logp_rel_err_max", "max"), entropy_rel_err_max=("entropy_rel_err_max", "max"),
        grad_input_floors=("grad_input_floors", "max"), grad_weight_floors=("grad_weight_floors", "max"),
        seeds=("seed", "nunique")).reset_index()
    return out


def chunking_summary(chunking: pd.DataFrame) -> pd.DataFrame:
    """lce at fixed row chunk counts and class-tiled (``rl_logprobs_chunking.csv``), per family and arm: the worst
    token's ratio error and entropy error (max over seeds) and the policy-gradient floors (median over seeds)."""
    if chunking.empty:
        return chunking
    arms = chunking["recipe"].str.extract(r"lce (\w+) cuda (?:@(\d+)|(tiled))")
    rows = chunking.assign(policy=arms[0], chunks=pd.to_numeric(arms[1]), tiled=arms[2].notna())
    out = rows.groupby(["family", "policy", "chunks", "tiled"], dropna=False, sort=True).agg(
        ratio_err_max=("ratio_err_max", "max"), entropy_err_max=("entropy_err_max", "max"),
        grad_input_floors=("grad_input_floors", "median"), grad_weight_floors=("grad_weight_floors", "median"),
        seeds=("seed", "nunique")).reset_index()
    return out


def cost_summary(costs: pd.DataFrame) -> pd.DataFrame:
    """Per recipe and batch: peak extra memory (GiB), its multiple of one bf16 copy of the logits, the time, and lce's
    predicted peak."""
    if costs.empty:
        return costs
    out = costs.assign(peak_gib=costs["peak_bytes"] / 2**30, logits_copies=costs["peak_bytes"] / costs["logits_bytes"],
                       predicted_gib=costs["predicted_peak_bytes"] / 2**30)
    order = {label: i for i, label in enumerate(_ordered(out["recipe"]))}
    return out.sort_values(["N", "recipe"], key=lambda s: s.map(order) if s.name == "recipe" else s,
                           ignore_index=True)


def grown_peak(costs: pd.DataFrame, tokens: int) -> pd.DataFrame:
    """Each recipe's peak extended to ``tokens`` tokens along the line through its two measured batches (the
    measured growth per token, not an assumed one), beside the growth's share of one bf16 logits copy per token."""
    rows = []
    for recipe, group in costs.groupby("recipe", sort=False):
        group = group.sort_values("N")
        if len(group) < 2:
            continue
        (n0, p0), (n1, p1) = group[["N", "peak_bytes"]].iloc[[0, -1]].itertuples(index=False)
        per_token = (p1 - p0) / (n1 - n0)
        logits_per_token = group["logits_bytes"].iloc[-1] / n1
        rows.append({"recipe": recipe, "bytes_per_token": per_token, "logits_copies_per_token":
                     per_token / logits_per_token, "peak_gib": (p1 + per_token * (tokens - n1)) / 2**30})
    return pd.DataFrame(rows)


def qwen_line(table: pd.DataFrame) -> str:
    """What the Qwen-size head's rows ran on."""
    rows = _qwen(table)
    first = rows.iloc[0]
    temperatures = ", ".join(f"{t:g}" for t in sorted(rows["temperature"].unique()))
    return (f"{first['family']} family at {int(first['N'])}x{int(first['D'])}x{int(first['C']):,} (Qwen2.5-0.5B's "
            f"head), targets sampled from the exact tempered softmax, {', '.join(sorted(rows['dtype'].unique()))}, "
            f"T = {temperatures}, {rows['seed'].nunique()} seeds; {first['cpu_model']}, torch "
            f"{first['torch_version']}")


def inputs_line(table: pd.DataFrame) -> str:
    """What the study ran on."""
    sampled = _sampled(table)
    shapes = ", ".join(f"{family} {int(r.N)}x{int(r.D)}x{int(r.C)}" for family, r in
                       sampled.groupby("family", sort=False).first().iterrows())
    margins = sorted(table["margin"].dropna().unique())
    first = table.iloc[0]
    temperatures = ", ".join(f"{t:g}" for t in sorted(sampled["temperature"].unique()))
    return (f"{shapes} (targets sampled from the exact tempered softmax) and confident rows (targets leading by "
            f"{', '.join(f'{m:g}' for m in margins)} nats); T = {temperatures}; "
            f"{', '.join(sorted(table['dtype'].unique()))}; {table['seed'].nunique()} seeds; {first['cpu_model']}, "
            f"torch {first['torch_version']}, CUDA layouts emulated on the CPU (`python -m analysis rl-logprobs`)")


# ---- figures ------------------------------------------------------------------------------------------------------

def _marker_legend(ax) -> None:
    """A legend of the marker shapes alone, in grey (the colours are the recipes', named on the axis)."""
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color="0.4", marker=m, ls="", label=label)
               for m, label in (("o", "trained: p99 over tokens"), ("s", "calibrated: p99 over tokens"),
                                ("x", "worst token"))]
    ax.legend(handles=handles, fontsize=6, loc="lower left")


def _recipe_axis(ax, recipes: list[str]) -> np.ndarray:
    positions = np.arange(len(recipes))
    ax.set_xticks(positions, [r.replace("lce compact cuda ", "lce compact\n").replace(", cast back", ",\ncast back")
                              for r in recipes], rotation=35, fontsize=7, ha="right")
    return positions


def _recipe_panels(table: pd.DataFrame, metric: str, ylabel: str, height: float):
    """One panel per dtype, the recipes along x, per family (markers) the per-problem 99th percentile of
    ``{metric}_p99`` (median over temperatures and seeds, bar to their range) and the worst token (``{metric}_max``,
    crosses); returns the figure and its axes, or None without sampled-target rows."""
    rows = _sampled(table)
    if rows.empty:
        return None
    apply_style()
    dtypes = sorted(rows["dtype"].unique())
    fig = new_figure(5.2 * len(dtypes), height)
    axes = np.atleast_1d(fig.subplots(1, len(dtypes), sharey=True))
    recipes = _ordered(rows["recipe"])
    colors = [COLORS.get(r, "k") for r in recipes]
    for ax, dtype in zip(axes, dtypes, strict=True):
        here = rows[rows["dtype"] == dtype]
        positions = _recipe_axis(ax, recipes)
        for offset, family, marker in ((-0.15, "trained", "o"), (0.15, "calibrated", "s")):
            group = here[here["family"] == family].groupby("recipe")
            p99 = group[f"{metric}_p99"]
            ax.scatter(positions + offset, p99.median().reindex(recipes), c=colors, marker=marker, s=30, zorder=3)
            ax.vlines(positions + offset, p99.min().reindex(recipes), p99.max().reindex(recipes), colors=colors,
                      lw=1.2)
            ax.scatter(positions + offset, group[f"{metric}_max"].max().reindex(recipes), c=colors, marker="x",
                       s=30, zorder=3)
        ax.set_yscale("log")
        ax.set_ylim(1e-8, 1.0)
        ax.set_title(f"{dtype} inputs", fontsize=9)
    axes[0].set_ylabel(ylabel)
    _marker_legend(axes[-1])
    return fig, axes, len(recipes)


def plot_ratio_error(table: pd.DataFrame) -> CaptionedFigure | None:
    """The importance-ratio error per recipe: per-problem p99 (median, bar to the range over problems) and the worst
    token (cross), one panel per dtype, with 1e-3 and the 0.2 clip drawn."""
    drawn = _recipe_panels(table, "ratio_err", "importance-ratio error |exp(Δ log p) − 1|", 4.2)
    if drawn is None:
        return None
    fig, axes, count = drawn
    for ax in axes:
        ax.axhline(CLIP, color="k", lw=1.0, ls="--")
        ax.axhline(TIGHT, color="k", lw=0.8, ls=":")
        ax.text(count - 0.5, CLIP * 1.15, "PPO/GRPO clip 0.2", fontsize=7, ha="right")
        ax.text(count - 0.5, TIGHT * 1.15, "1e-3", fontsize=7, ha="right")
    caption = (f"How far each recipe's importance ratio exp(log p_recipe − log p_exact) is from 1 on tokens sampled "
               f"from the exact policy, {inputs_line(table)}. Dots: the 99th percentile over a problem's tokens "
               f"(median over temperatures and seeds; bar: their range); crosses: the worst token of any problem. The "
               f"materialized recipe and the fp32-statistics recipe round the logits (and their results) to the input "
               f"dtype; the fp32 head and lce's default options keep the logits of the rounded inputs in fp32.")
    return CaptionedFigure(fig, "rl_ratio_error", caption)


def plot_entropy_error(table: pd.DataFrame) -> CaptionedFigure | None:
    """The entropy's absolute error (nats) per recipe and dtype, families as markers."""
    drawn = _recipe_panels(table, "entropy_err", "entropy error (nats)", 3.8)
    if drawn is None:
        return None
    caption = (f"Each recipe's per-token entropy against fp64: the 99th percentile of the absolute error over a "
               f"problem's tokens (dots, median over temperatures and seeds; bar: their range) and the worst token "
               f"(crosses), {inputs_line(table)}.")
    return CaptionedFigure(drawn[0], "rl_entropy_error", caption)


def plot_confident_rows(table: pd.DataFrame) -> CaptionedFigure | None:
    """Relative error of log p and of the entropy on rows whose target leads by M nats, per recipe (bf16 inputs)."""
    summary = confident_summary(table)
    summary = summary[summary["dtype"] == "bfloat16"]
    if summary.empty:
        return None
    apply_style()
    fig = new_figure(10.0, 3.8)
    axes = fig.subplots(1, 2, sharey=True)
    for ax, column, title in ((axes[0], "logp_rel_err_max", "log p(target)"), (axes[1], "entropy_rel_err_max",
                                                                                "entropy")):
        for recipe in _ordered(summary["recipe"]):
            here = summary[summary["recipe"] == recipe].sort_values("margin")
            ax.plot(here["margin"], here[column].clip(lower=1e-9), marker="o", ms=3, color=COLORS.get(recipe, "k"),
                    label=recipe)
        ax.set_yscale("log")
        ax.set_ylim(1e-9, 10)
        ax.axhline(1.0, color="k", lw=0.8, ls=":")
        ax.set_xlabel("target's lead over every other class (nats)")
        ax.set_title(f"{title}: worst relative error", fontsize=9)
    axes[0].set_ylabel("relative error against fp64 (drawn at ≥ 1e-9)")
    axes[1].legend(fontsize=6, loc="center right")
    caption = ("Confident rows (bf16 inputs; worst over seeds and temperatures): relative error of log p(target) and "
               "of the entropy against the target-relative fp64 reference. Both are about e^-M here: a recipe that "
               "forms lse − u_y or lse − Σ p u in fp32 loses every digit from about 17 nats (relative error 1, "
               "dotted), "
               "while lce's sums of one sign keep fp32's relative precision at 40 nats. The absolute errors are tiny "
               "(the ratio error at 40 nats is below 1e-16): what a confident row loses is its gradient (notebook).")
    return CaptionedFigure(fig, "rl_confident_rows", caption)


def plot_costs(costs: pd.DataFrame) -> CaptionedFigure | None:
    """Peak extra memory per recipe at the two measured batches, and the time, at the Qwen-size head."""
    summary = cost_summary(costs)
    if summary.empty:
        return None
    apply_style()
    fig = new_figure(10.0, 3.8)
    axes = fig.subplots(1, 2)
    recipes = _ordered(summary["recipe"])
    positions = np.arange(len(recipes))
    batches = sorted(summary["N"].unique())
    width = 0.8 / len(batches)
    for i, n in enumerate(batches):
        here = summary[summary["N"] == n].set_index("recipe").reindex(recipes)
        offset = (i - (len(batches) - 1) / 2) * width
        axes[0].bar(positions + offset, here["peak_gib"], width=width, label=f"{n} tokens",
                    color=[COLORS.get(r, "k") for r in recipes], alpha=0.5 + 0.5 * i / max(1, len(batches) - 1))
        axes[1].bar(positions + offset, here["time_median_s"], width=width, label=f"{n} tokens",
                    color=[COLORS.get(r, "k") for r in recipes], alpha=0.5 + 0.5 * i / max(1, len(batches) - 1))
    for ax, label in ((axes[0], "peak extra memory (GiB)"), (axes[1], "forward + backward (s, this CPU)")):
        ax.set_xticks(positions, [r.replace(", cast back", ",\ncast back") for r in recipes], rotation=30,
                      fontsize=7, ha="right")
        ax.set_ylabel(label)
        ax.legend(fontsize=7)
    first = summary.iloc[0]
    stood_in = sorted(set(summary.loc[summary.get("gemms", pd.Series(dtype=str)) == "fp32 stand-in", "recipe"]))
    gemms = (f"; this CPU emulates bf16 GEMMs, so those of {', '.join(stood_in)} ran on the fp32 stand-in: their "
             f"bytes are their own, their time is at fp32 GEMM speed" if stood_in else "")
    caption = (f"Cost of one forward and backward (a policy-gradient loss with an entropy bonus) at a Qwen-size head, "
               f"D={int(first['D'])}, C={int(first['C'])}, bf16, on {first['cpu_model']} (torch "
               f"{first['torch_version']}{gemms}; `python -m analysis rl-logprobs --costs`). Lighter bars: the "
               f"smaller batch.")
    return CaptionedFigure(fig, "rl_costs", caption)


def plot_qwen_head(table: pd.DataFrame, costs: pd.DataFrame) -> CaptionedFigure | None:
    """At the Qwen-size head, per recipe with a CPU cost: the importance-ratio error (per-item p99, bar to the range
    over temperatures and seeds; cross: the worst token) against the peak extra memory of its forward and backward."""
    summary = qwen_summary(table, costs)
    if summary.empty or summary["peak_gib"].isna().all():
        return None
    summary = summary[summary["peak_gib"].notna()]
    apply_style()
    fig = new_figure(6.4, 4.2)
    ax = fig.subplots()
    for r in summary.itertuples():
        color = COLORS.get(r.recipe, "k")
        ax.scatter(r.peak_gib, r.ratio_p99, color=color, s=30, zorder=3)
        ax.vlines(r.peak_gib, r.ratio_p99_low, r.ratio_p99_high, colors=color, lw=1.2)
        ax.scatter(r.peak_gib, r.ratio_max, color=color, marker="x", s=30, zorder=3)
        ax.annotate(r.recipe, (r.peak_gib, r.ratio_max), textcoords="offset points", xytext=(5, 4), fontsize=7,
                    color=color)
    ax.set_yscale("log")
    ax.set_ylim(1e-8, 1.0)
    ax.set_xlim(0, summary["peak_gib"].max() * 1.35)
    ax.axhline(CLIP, color="k", lw=1.0, ls="--")
    ax.axhline(TIGHT, color="k", lw=0.8, ls=":")
    ax.set_xlabel(f"peak extra memory of one forward and backward, {int(summary['N'].iloc[0])} tokens (GiB)")
    ax.set_ylabel("importance-ratio error |exp(Δ log p) − 1|")
    stood_in = ", ".join(summary.loc[summary["gemms"] == "fp32 stand-in", "recipe"])
    caption = (f"What each recipe buys and costs at a Qwen-size head ({qwen_line(table)}): the importance-ratio "
               f"error's 99th percentile over the sampled tokens (dot: median over temperatures and seeds, bar: their "
               f"range; cross: the worst token) against the measured peak extra memory of a forward and backward "
               f"(`python -m analysis rl-logprobs --costs`). TRL's default fused head rounds each tile's logits to "
               f"bf16; with cast_lm_head_to_fp32 its GEMMs run in fp32; lce (what lce.integrations.trl.route runs "
               f"inside TRL) keeps fp32 logits of the bf16 operands. Dashed: the 0.2 clip; dotted: 1e-3."
               + (f" On this CPU the bf16 GEMMs of {stood_in} ran on the fp32 stand-in (bytes their own)." if stood_in
                  else ""))
    return CaptionedFigure(fig, "rl_qwen_head", caption)


def draw_rl_figures(table: pd.DataFrame, costs: pd.DataFrame) -> list[CaptionedFigure]:
    drawn = ([plot_ratio_error(table), plot_entropy_error(table), plot_confident_rows(table),
              plot_qwen_head(table, costs)] if not table.empty else [])
    drawn.append(plot_costs(costs))
    return [figure for figure in drawn if figure is not None]


# ---- README -------------------------------------------------------------------------------------------------------

def example_line(example: pd.DataFrame) -> str:
    """The worked GRPO example's numbers (its last run)."""
    if example.empty:
        return "The worked example has not been run yet (`python examples/grpo_update.py --csv ...`)."
    row = example.sort_values("date").iloc[-1]
    lce_mib, materialized_mib = row["lce_peak_bytes"] / 2**20, row["materialized_peak_bytes"] / 2**20
    return (f"Worked example (`examples/grpo_update.py`, {row['cpu_model']}, {str(row['date'])[:10]}): two GRPO "
            f"updates of the small LM in fp64 (vocabulary {int(row['parity_vocab'])}, "
            f"{int(row['completion_tokens'])} completion tokens) give the same losses and gradients through lce's "
            f"head as through materialized logits (largest relative difference {row['loss_rel_diff']:.0e} for the "
            f"losses, {row['grad_rel_diff']:.0e} for the gradients); one fp32 update at {int(row['vocab']):,} classes "
            f"and {int(row['tokens'])} tokens peaks at {lce_mib:,.0f} MiB with lce against {materialized_mib:,.0f} MiB "
            f"with materialized logits ({materialized_mib / lce_mib:.1f}x; one fp32 copy of the logits is "
            f"{row['logits_bytes'] / 2**20:,.0f} MiB).")


def qwen_table(table: pd.DataFrame, costs: pd.DataFrame) -> pd.DataFrame:
    """The Qwen-size head's table as printed: per recipe, the ratio error (p99 median and range, worst token), the
    KL, the entropy's worst error, the policy-gradient floors, and the measured peak and time."""
    summary = qwen_summary(table, costs)

    def cost(r) -> str:
        if pd.isna(r.peak_gib):
            return "— (CUDA layouts)"
        stand_in = " †" if r.gemms == "fp32 stand-in" else ""
        return f"{r.peak_gib:.2f} GiB ({r.logits_copies:.1f}x), {r.time_s:.1f} s{stand_in}"

    return pd.DataFrame({
        "recipe": summary["recipe"],
        "ratio error p99 (range)": [f"{r.ratio_p99:.1e} ({r.ratio_p99_low:.0e}–{r.ratio_p99_high:.0e})"
                                    for r in summary.itertuples()],
        "worst token": [f"{v:.1e}" for v in summary["ratio_max"]],
        "KL (k3, mean)": [f"{v:.1e}" for v in summary["kl"]],
        "entropy error, worst (nats)": [f"{v:.1e}" for v in summary["entropy_err_max"]],
        "PG floors input / weight": [f"{r.grad_input_floors:.2f} / {r.grad_weight_floors:.2f}"
                                     for r in summary.itertuples()],
        "peak (bf16 logits copies), time": [cost(r) for r in summary.itertuples()]})


def _qwen_block(table: pd.DataFrame, costs: pd.DataFrame) -> str:
    if _qwen(table).empty:
        return ""
    summary = qwen_summary(table, costs)
    first = costs.iloc[0] if not costs.empty else None
    where = "" if first is None else f" Costs on {first['cpu_model']}, torch {first['torch_version']}."
    dagger = ("" if not (summary["gemms"] == "fp32 stand-in").any() else
              " †: this CPU emulates bf16 GEMMs, so the recipe's bf16 GEMMs ran on the fp32 stand-in (same "
              "arithmetic; the bytes are the recipe's own, the time is at fp32 GEMM speed).")
    return (f"At the Qwen-size head ({qwen_line(table)}): per recipe, the importance-ratio error, the implied KL, the "
            f"entropy's worst error, the policy-gradient floors, and one forward and backward's measured peak extra "
            f"memory and time at the same batch.{where}{dagger}\n\n{markdown_table(qwen_table(table, costs))}\n\n")


def readme_rl_qwen_head(results) -> str:
    """The "rl-qwen-head" block (docs/using-lce.md's TRL section): the Qwen-size head's table."""
    from analysis.core.results_io import RL_COST, RL_LOGPROBS, load_kind

    _, table = load_kind(results, RL_LOGPROBS.name)
    block = _qwen_block(table, load_kind(results, RL_COST.name)[1]) if not table.empty else ""
    return block or "The Qwen-size head has not been measured yet (`python -m analysis rl-logprobs`).\n"


def readme_rl_logprobs(results) -> str:
    """The README's "rl-logprobs" block: per recipe and dtype, the ratio error, KL, entropy error and floors, the
    verdict against 1e-3 and the clip, and the cost at a Qwen-size head."""
    from analysis.core.results_io import RL_COST, RL_EXAMPLE, RL_LOGPROBS, load_kind

    _, table = load_kind(results, RL_LOGPROBS.name)
    if table.empty:
        return "The RL log-probabilities study has not been run yet (`python -m analysis rl-logprobs`).\n"
    _, costs = load_kind(results, RL_COST.name)
    _, example = load_kind(results, RL_EXAMPLE.name)
    summary = recipe_summary(table)
    cost = cost_summary(costs)
    largest = cost[cost["N"] == cost["N"].max()].set_index("recipe") if not cost.empty else pd.DataFrame()

    def cost_cell(recipe):
        if recipe not in largest.index:
            return "—"
        row = largest.loc[recipe]
        return f"{row['peak_gib']:.2f} GiB, {row['time_median_s']:.1f} s"

    out = pd.DataFrame({
        "recipe": summary["recipe"], "dtype": summary["dtype"],
        "ratio error p99 (range)": [f"{r.ratio_p99:.1e} ({r.ratio_p99_low:.0e}–{r.ratio_p99_high:.0e})"
                                    for r in summary.itertuples()],
        "worst token": [f"{v:.1e}" for v in summary["ratio_max"]],
        "< 1e-3 / < 0.2": [f"{'✓' if v < TIGHT else '✗'} / {'✓' if v < CLIP else '✗'}" for v in summary["ratio_max"]],
        "KL (k3, mean)": [f"{v:.1e}" for v in summary["kl"]],
        "entropy error, worst (nats)": [f"{v:.1e}" for v in summary["entropy_err_max"]],
        "PG floors input / weight": [f"{r.grad_input_floors:.2f} / {r.grad_weight_floors:.2f}"
                                     for r in summary.itertuples()],
        "cost at the Qwen head": [cost_cell(r) if d == "bfloat16" else "" for r, d in zip(summary["recipe"],
                                                                                         summary["dtype"],
                                                                                         strict=True)]})
    cost_text = ""
    if not cost.empty:
        first = cost.iloc[-1]
        cost_text = (f" Cost: one forward and backward at D={int(first['D'])}, C={int(first['C']):,}, "
                     f"{int(first['N'])} tokens, bf16, on {first['cpu_model']} (`--costs`).")
    return (f"RL log-probabilities study ({inputs_line(table)}): per recipe and input dtype, over the sampled-target "
            f"problems, the importance-ratio error |exp(Δ log p) − 1| (the per-problem 99th percentile: median and "
            f"range over problems; the worst token of any problem), whether every token stays below 1e-3 and below "
            f"the 0.2 clip, the trainer-vs-sampler KL the errors imply, the entropy's worst error, and the "
            f"policy-gradient loss's gradient floors (median).{cost_text}\n\n{markdown_table(out)}\n"
            f"{example_line(example)}\n")
