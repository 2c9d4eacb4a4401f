"""Notebook 10 (does a gradient bias change training over a long horizon?): its figures and the README block,
from ``head_training.csv.gz`` (``python -m analysis head-train``) and the language model's long run in
``training_long.csv.gz`` (``python -m analysis train --setting long``); the numbers come from
:mod:`analysis.judge.horizon`. Nothing here measures.
"""

from __future__ import annotations

import pandas as pd

from analysis.core.buckets import BUCKETS
from analysis.judge.horizon import CONFIDENCE, arm_summary, final_gaps, gaps, interval_table
from analysis.report.style import CaptionedFigure, apply_style, new_figure
from analysis.report.tables import markdown_table

__all__ = ["headroom_comparison", "BEFORE_HEADROOM", "AFTER_HEADROOM",
           "plot_gap_vs_step", "gap_finding", "plot_gap_vs_bias", "plot_row_distance", "draw_long_horizon_figures",
           "readme_long_horizon", "lm_long_gaps"]


# ---- figures -------------------------------------------------------------------------------------------------

ARM_COLOURS = {"bf16 unfused": "tab:gray", "bf16 accurate@64": "tab:cyan", "bf16 balanced@64": "tab:blue",
               "bf16 compact@32": "gold", "bf16 compact@64": "tab:orange", "bf16 compact@256": "tab:red",
               "fp16 balanced@64": "tab:purple", "fp16 compact@64": "tab:pink",
               # the tight-budget group (optimizer "adamw-budget")
               "bf16 compact@4": "yellowgreen", "bf16 compact@8": "tab:olive", "bf16 compact@16": "tab:brown",
               "bf16 balanced@4": "navy", "fp16 compact@4": "plum", "fp16 compact@8": "mediumvioletred"}


OPTIMIZER_TEXT = {"adamw": "AdamW", "sgd": "SGD", "adamw-budget": "AdamW, tight-budget arms",
                  "adamw-headroom": "AdamW, fp16 arms with lce.passes.headroom",
                  "adamw-large": "AdamW, 4096 rows per step (16x)"}
"""How a figure title names each group of arms (its ``optimizer`` column)."""


def gap_finding(table: pd.DataFrame, optimizer: str) -> str:
    """The finding of :func:`plot_gap_vs_step`, for its title: which arms' final gaps count (leave the fp32 head's
    seed-spread band with a t-interval excluding zero, :mod:`analysis.judge.horizon`), in which buckets, and
    how many arms stay inside the band everywhere."""
    summary = arm_summary(table)
    summary = summary[summary["optimizer"] == optimizer]
    if summary.empty:
        return ""
    step = int(summary["step"].max())
    counted = summary[summary["counts_in"] != ""]
    inside = len(summary) - len(counted)
    if counted.empty:
        return f"At step {step:,} no arm's gap leaves the fp32 head's seed-spread band"
    names = [f"{row.arm} ({row.counts_in.replace('all', 'all rows')})" for row in counted.itertuples()]
    named = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
    rest = "" if not inside else ("; the other arm stays inside it" if inside == 1 else
                                  f"; the other {inside} arms stay inside it")
    whose = "the gap of" if len(names) == 1 else "the gaps of"
    verb = "leaves" if len(names) == 1 else "leave"
    return f"At step {step:,} {whose} {named} {verb} the fp32 head's seed-spread band{rest}"


def plot_gap_vs_step(table: pd.DataFrame, optimizer: str = "adamw") -> CaptionedFigure | None:
    """Held-out gap to the fp32 head vs step, one panel per bucket (and overall), mean over seeds with the
    seeds' range as a band, and the fp32 head's own seed spread (:func:`analysis.judge.horizon.interval_table`)
    as a grey band around zero; the title states which arms' final gaps leave it."""
    gap_rows = gaps(table)
    gap_rows = gap_rows[gap_rows["optimizer"] == optimizer]
    if gap_rows.empty:
        return None
    apply_style()
    spread = interval_table(gap_rows, ["optimizer", "step", "bucket"]).set_index(["bucket", "step"])["seed_spread"]
    panels = ["all", *BUCKETS]
    fig = new_figure(13.0, 4.0)
    axes = fig.subplots(1, len(panels), sharex=True)
    for ax, bucket in zip(axes, panels, strict=True):
        here = gap_rows[gap_rows["bucket"] == bucket]
        band = spread.loc[bucket].sort_index() * 1e3
        ax.fill_between(band.index, -band, band, color="0.55", alpha=0.25, lw=0, zorder=1,
                        label="± the fp32 head's seed spread (max - min over seeds)")
        extent = []
        for arm, group in here.groupby("arm", sort=False):
            by_step = group.groupby("step")["gap"]
            steps = by_step.mean().index
            colour = ARM_COLOURS.get(arm, "k")
            ax.plot(steps, by_step.mean() * 1e3, color=colour, lw=1.4, label=arm, zorder=3)
            ax.fill_between(steps, by_step.min() * 1e3, by_step.max() * 1e3, color=colour, alpha=0.12, lw=0,
                            zorder=2)
            extent += [by_step.min().min() * 1e3, by_step.max().max() * 1e3]
        ax.axhline(0, color="k", lw=0.6)
        # The arms' gaps set the limits: where the band is wider it runs off the panel (no gap there counts).
        low, high = min(min(extent), 0.0), max(max(extent), 0.0)
        pad = 0.12 * max(high - low, 1e-3)
        ax.set_ylim(low - pad, high + pad)
        ax.set_xscale("symlog", linthresh=100)
        ax.set_title(f"{bucket} classes" if bucket != "all" else "all held-out rows", fontsize=9)
        ax.set_xlabel("step")
    axes[0].set_ylabel("gap = arm's held-out loss - fp32's (millinats)\n> 0: worse than fp32, < 0: better")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=min(5, len(labels)), frameon=False, fontsize=8)
    finding = gap_finding(table, optimizer)
    fig.suptitle(f"{OPTIMIZER_TEXT.get(optimizer, optimizer)}: {finding}" if finding else
                 OPTIMIZER_TEXT.get(optimizer, optimizer), fontsize=10)
    first = table.iloc[0]
    caption = (f"Head-only training ({optimizer}), calibrated teacher, D={int(first.D)}, C={int(first.C)}, "
               f"{int(first.batch_rows)} rows per step from a pool of {int(first.pool_rows)}: each arm's held-out "
               f"loss minus the fp32 arm's of the same seed (same start, same batches; positive = worse than fp32), "
               f"mean over {table['seed'].nunique()} seeds, coloured band = the seeds' range. Grey band: plus and "
               f"minus the fp32 head's own spread over the seeds at each step (max - min; analysis.judge.horizon), "
               f"running off the panel where it is wider than every gap (the limits follow the gaps); a gap counts "
               f"only outside it, with its {CONFIDENCE:.0%} t-interval over the seeds excluding zero. The "
               f"title names the arms whose gap at the last step counts, and in which buckets. Buckets: classes "
               f"whose targets make up the first 50% of the pool's targets (frequent), the next 40% (middle), the "
               f"last 10% (rare). lce arms: CUDA layouts, fp32 acc_dtype, '@k' = k chunks (python -m analysis "
               f"head-train).")
    return CaptionedFigure(fig, f"head_gap_vs_step_{optimizer}", caption)


def plot_gap_vs_bias(table: pd.DataFrame) -> CaptionedFigure | None:
    """Final rare-bucket gap (with its interval) against the arm's bias/noise ratio, both optimizers; the steps
    after which a ratio r stands out by the ratio^-2 reading drawn as the top axis."""
    summary = arm_summary(table)
    summary = summary[summary["bias_over_noise"].notna() & summary["gap_rare"].notna()]
    if summary.empty:
        return None
    apply_style()
    fig = new_figure(6.4, 4.2)
    ax = fig.add_subplot()
    markers = {"adamw": "o", "sgd": "s", "adamw-budget": "D"}
    for row in summary.itertuples():
        colour = ARM_COLOURS.get(row.arm, "k")
        ax.errorbar(row.bias_over_noise, row.gap_rare * 1e3,
                    yerr=[[(row.gap_rare - row.gap_rare_low) * 1e3], [(row.gap_rare_high - row.gap_rare) * 1e3]],
                    xerr=[[row.bias_over_noise - row.bias_low], [row.bias_high - row.bias_over_noise]],
                    fmt=markers.get(row.optimizer, "o"), color=colour, ms=5, capsize=2, lw=0.8,
                    label=f"{row.arm} ({row.optimizer})")
    ax.axhline(0, color="k", lw=0.6)
    spread = final_gaps(table)
    spread = spread[(spread["bucket"] == "rare") & (spread["optimizer"] == "adamw")]["seed_spread"].max() * 1e3
    ax.axhspan(-spread, spread, color="tab:gray", alpha=0.12, lw=0, label="fp32 head's seed spread (rare, AdamW)")
    horizon = int(summary["step"].max())
    ax.axvline(horizon ** -0.5, color="tab:green", lw=0.8, ls="--", label=f"1/sqrt({horizon:,} steps)")
    ax.set_xscale("log")
    ax.set_xlabel("bias / sampling noise of the weight gradient (median along the run; bars: range)")
    ax.set_ylabel(f"rare classes' held-out gap at step {horizon:,} (millinats)")
    ax.legend(fontsize=5.5, loc="upper left")
    caption = (f"What a bias does to the rarely targeted classes: each arm's final held-out gap to the fp32 head on "
               f"the rare bucket (the classes holding the last 10% of the pool's targets; error bars: "
               f"{CONFIDENCE:.0%} t-interval over the seeds' paired gaps) against its weight gradient's bias/noise "
               f"ratio measured at the fp32 arm's weights along the run (bars: range over seeds and checkpoints). "
               f"Dashed: the ratio a steady bias needs to stand out of the noise within the run by the ratio^-2 "
               f"reading. Grey band: the fp32 head's own spread over seeds on the rare classes; a gap counts "
               f"beyond it. Circles AdamW, squares SGD, diamonds AdamW's tight-budget arms (compact with few "
               f"chunks, balanced at 4).")
    return CaptionedFigure(fig, "head_gap_vs_bias", caption)


def plot_row_distance(table: pd.DataFrame, optimizer: str = "adamw") -> CaptionedFigure | None:
    """Relative distance of each arm's class rows to the fp32 head's, per bucket, vs step (mean over seeds)."""
    rows = table[(table["metric"] == "w_distance") & (table["optimizer"] == optimizer)]
    if rows.empty:
        return None
    apply_style()
    fig = new_figure(9.0, 3.2)
    axes = fig.subplots(1, len(BUCKETS), sharey=True)
    for ax, bucket in zip(axes, BUCKETS, strict=True):
        here = rows[rows["bucket"] == bucket]
        for arm, group in here.groupby("arm", sort=False):
            mean = group.groupby("step")["value"].mean()
            ax.plot(mean.index[1:], mean.to_numpy()[1:], color=ARM_COLOURS.get(arm, "k"), lw=1.1, label=arm)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(f"{bucket} classes' rows of W", fontsize=8)
        ax.set_xlabel("step")
    axes[0].set_ylabel("||W - W_fp32|| / ||W_fp32|| (mean over seeds)")
    axes[-1].legend(fontsize=6)
    caption = (f"How far each arm's head drifts from the fp32 arm's ({optimizer}, same start and batches): the "
               f"relative distance of the class rows of W, per target-frequency bucket. Arms that round once "
               f"(accurate, balanced) drift least and their drift shrinks as the learning rate decays; bf16 "
               f"compact's drift grows with the steps and the chunk count; fp16 compact's rare-class rows leave "
               f"once their small gradients are lost (the fp16 arms' jumps are steps skipped by the dynamic loss "
               f"scale).")
    return CaptionedFigure(fig, f"head_row_distance_{optimizer}", caption)


def draw_long_horizon_figures(table: pd.DataFrame) -> list[CaptionedFigure]:
    """Every figure this module draws that has data."""
    if table.empty:
        return []
    candidates = (plot_gap_vs_step(table, "adamw"), plot_gap_vs_step(table, "sgd"),
                  plot_gap_vs_step(table, "adamw-budget"), plot_gap_vs_step(table, "adamw-headroom"),
                  plot_gap_vs_bias(table),
                  plot_row_distance(table, "adamw"))
    return [figure for figure in candidates if figure is not None]


# ---- the language model's long run ---------------------------------------------------------------------------

def lm_long_gaps(training: pd.DataFrame) -> pd.DataFrame:
    """The ``long`` setting's held-out gap to the fp32 run of the same seed per arm, bucket and evaluated step."""
    rows = training[(training["setting"] == "long") & training["split"].str.startswith("heldout")]
    if rows.empty:
        return pd.DataFrame(columns=["arm", "seed", "step", "bucket", "gap"])
    rows = rows.assign(bucket=rows["split"].str.partition(":")[2].replace("", "all"))
    keys = ["seed", "step", "bucket"]
    reference = rows[rows["arm"] == "fp32"].set_index(keys)["loss"].rename("fp32")
    joined = rows[rows["arm"] != "fp32"].join(reference, on=keys).dropna(subset=["fp32"])
    return joined.assign(gap=joined["loss"] - joined["fp32"])[["arm", "seed", "step", "bucket", "gap", "chunking"]]


BEFORE_HEADROOM, AFTER_HEADROOM = "adamw", "adamw-headroom"
"""The groups whose fp16 arms were trained before and after lce.passes.headroom (issue 31)."""


def headroom_comparison(summary: pd.DataFrame) -> pd.DataFrame:
    """Per fp16 arm trained in both groups: its final gap to its group's fp32 arm, overall and on the rare classes
    (with intervals), and the buckets where it counts, before and after lce.passes.headroom; empty without both
    groups."""
    keep = ["arm", "step", "seeds", "gap_all", "gap_all_low", "gap_all_high", "gap_rare", "gap_rare_low",
            "gap_rare_high", "counts_in", "systematic_in"]
    before = summary[summary["optimizer"] == BEFORE_HEADROOM][keep].set_index("arm")
    after = summary[summary["optimizer"] == AFTER_HEADROOM][keep].set_index("arm")
    arms = [arm for arm in after.index if arm in before.index]
    if not arms:
        return pd.DataFrame(columns=["arm", "when", *keep[1:]])
    rows = [before.loc[arms].assign(when="before"), after.loc[arms].assign(when="after")]
    table = pd.concat(rows).reset_index()
    return table.sort_values(["arm", "when"], ascending=[True, False], ignore_index=True)[["arm", "when", *keep[1:]]]


# ---- README --------------------------------------------------------------------------------------------------

def readme_long_horizon(results) -> str:
    """The README's "long-horizon" block: per arm, its bias/noise and its final held-out gaps with intervals."""
    from analysis.core.results_io import HEAD_TRAINING, load_kind

    _, table = load_kind(results, HEAD_TRAINING.name)
    table = table[table["setting"] == "full"] if not table.empty else table
    if table.empty:
        return "The head-only study has not been run yet (`python -m analysis head-train`).\n"
    summary = arm_summary(table)

    def gap(row, bucket):
        mean, low, high = (row[f"gap_{bucket}{s}"] * 1e3 for s in ("", "_low", "_high"))
        return f"{mean:+.2f} [{low:+.2f}, {high:+.2f}]"

    out = pd.DataFrame({
        "optimizer": summary["optimizer"], "arm": summary["arm"], "stands for": summary["rule"].replace("", "—"),
        "steps": summary["step"], "seeds": summary["seeds"],
        "bias/noise (median, range)": [f"{r.bias_over_noise:.2g} ({r.bias_low:.2g}–{r.bias_high:.2g})"
                                       for r in summary.itertuples()],
        "gap, all rows (mnats)": [gap(row, "all") for _, row in summary.iterrows()],
        "gap, rare classes (mnats)": [gap(row, "rare") for _, row in summary.iterrows()],
        "counts in (beyond the seed spread)": summary["counts_in"].replace("", "—"),
        "systematic in": summary["systematic_in"].replace("", "—")})
    first = table.iloc[0]
    head = (f"Head-only training (`python -m analysis head-train`; calibrated teacher, D={int(first.D)}, "
            f"C={int(first.C)}, {int(first.batch_rows)} rows per step, CUDA layouts' arithmetic on the CPU, "
            f"{first.cpu_model}): held-out gap to the fp32 head of the same seed, mean and {CONFIDENCE:.0%} "
            f"t-interval over seeds; buckets where it is systematic (the interval excludes zero) and where it counts "
            f"(also larger than the fp32 head's spread over seeds).\n\n")
    return head + markdown_table(out)
