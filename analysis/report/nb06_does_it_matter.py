"""Notebook 06 (does a gradient error matter?): its figures, its key numbers and its README block.

The notebook's prose quotes the key numbers; ``tests/claims/test_nb06_does_it_matter.py`` asserts each claim the
prose (and the README around the block) makes about them, on the committed noise and training results.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from matplotlib import ticker
from matplotlib.axes import Axes

from analysis.core.results_io import load_kind
from analysis.judge.pareto import INTERVAL, seed_interval
from analysis.judge.rule import (
    BIAS_LIMIT,
    ERROR_LIMIT,
    RATIO_COLUMNS,
    checkpoint_bias,
    peer_table,
    rule_table,
    study_rows,
)
from analysis.report.style import PALETTE, CaptionedFigure, apply_style, legend_below, log_axes, new_figure
from analysis.report.tables import markdown_table, span
from analysis.studies.noise import NOISE_SHAPE, chunk_rules
from analysis.studies.noise_scaling import AUTO_CPU, AUTO_CUDA
from analysis.studies.training import ARMS, final_losses
from lce.decide import noise_scaling as noise_scaling_data

SOURCE_NAMES = {"cuda": "CUDA layouts on one H200 (cuBLAS)", "cuda-emulated": "CUDA layouts emulated on CPU"}
RULE_STYLES = {"lce auto": ("k", "-"), "torch 2.13 auto": ("tab:red", "--"), "torch #187838": ("tab:purple", ":")}
ARM_COLOURS = {"fp32": "k", "bf16 unfused": (0.5, 0.5, 0.5), **{arm.name: PALETTE[arm.policy] for arm in ARMS
                                                                if arm.op == "lce"}}
ARM_STYLES = {arm.name: ("--" if arm.dtype == "float16" else "-") for arm in ARMS}


def _rule_marks(ax: Axes, dtype: str) -> None:
    """Vertical lines at the chunk counts the CUDA chunking rules pick at the study's shape."""
    for rule, (policy, chunks) in chunk_rules(NOISE_SHAPE, getattr(torch, dtype)).items():
        colour, style = RULE_STYLES[rule]
        ax.axvline(chunks, color=colour, ls=style, lw=0.9, alpha=0.7, label=f"{rule} ({policy}, {chunks} chunks)")


def plot_noise_vs_chunks(noise: pd.DataFrame, device: str = "cuda") -> CaptionedFigure | None:
    """Bias/noise (solid) and error/noise (dotted) of grad_weight against the chunk count, one line per policy,
    one panel per (dtype row, family column), seed medians with intervals; the rule's limits as grey lines."""
    rows = study_rows(noise)
    rows = rows[(rows["device"] == device) & (rows["layout"] == "cuda") & rows["dtype"].isin(["bfloat16", "float16"])]
    if rows.empty:
        return None
    apply_style()
    families = list(dict.fromkeys(sorted(rows["family"])))
    dtypes = sorted(rows["dtype"].unique())
    fig = new_figure(3.3 * len(families), 2.9 * len(dtypes) + 0.9)
    axes = fig.subplots(len(dtypes), len(families), squeeze=False, sharex=True, sharey=True)
    points = seed_interval(rows, ["weight_bias_over_noise", "weight_error_over_noise"],
                           by=["dtype", "family", "policy", "num_chunks"])
    for (row, dtype), (column, family) in ((r, c) for r in enumerate(dtypes) for c in enumerate(families)):
        ax = axes[row, column]
        here = points[(points["dtype"] == dtype) & (points["family"] == family)]
        for policy, lines in here.groupby("policy"):
            lines = lines.sort_values("num_chunks")
            colour = PALETTE.get(policy, "k")
            ax.plot(lines["num_chunks"], lines["weight_bias_over_noise"], marker="o", ms=3.5, color=colour,
                    label=f"{policy}: bias/noise")
            ax.fill_between(lines["num_chunks"], lines["weight_bias_over_noise_low"],
                            lines["weight_bias_over_noise_high"], color=colour, alpha=0.15, lw=0)
            ax.plot(lines["num_chunks"], lines["weight_error_over_noise"], ls=":", lw=1.1, color=colour,
                    label=f"{policy}: error/noise")
        unfused = rows[(rows["policy"] == "unfused") & (rows["dtype"] == dtype) & (rows["family"] == family)]
        if not unfused.empty:
            ax.axhline(unfused["weight_bias_over_noise"].median(), color=(0.4, 0.4, 0.4), lw=0.8, ls="-.",
                       label="unfused op in the dtype: bias/noise")
        ax.axhline(BIAS_LIMIT, color="tab:green", lw=1.0, alpha=0.6, label=f"bias limit {BIAS_LIMIT}")
        ax.axhline(ERROR_LIMIT, color="tab:olive", lw=1.0, alpha=0.6, ls=":", label=f"error limit {ERROR_LIMIT}")
        _rule_marks(ax, dtype)
        log_axes(ax, x_base=2)
        ax.set_title(f"{family}, {dtype}", fontsize=9)
        if row == len(dtypes) - 1:
            ax.set_xlabel("chunks (explicit rows per chunk)")
        if column == 0:
            ax.set_ylabel("grad_weight error / sampling noise")
    legend_below(fig, axes, columns=5)
    seeds = rows.groupby("family")["seed"].nunique().min()
    return CaptionedFigure(
        fig, f"noise_vs_chunks_{device}",
        f"When does the weight-gradient error stand out of SGD's own noise? Ratio of lce's error (fp32 acc_dtype, "
        f"{SOURCE_NAMES[device]}) to the sampling noise of the same batch, against the number of "
        f"chunks, per policy: solid, the error's component along the exact gradient (a bias, which does not "
        f"average out over steps; it stands out after about ratio**-2 steps) over the noise along it; dotted, the "
        f"whole error over the Frobenius noise. Inputs: N={NOISE_SHAPE.N}, D={NOISE_SHAPE.D}, C={NOISE_SHAPE.C} per "
        f"family, {seeds}+ seeds (medians, bands the {INTERVAL}). Vertical lines: the chunk counts that lce's auto, "
        f"torch 2.13's CUDA default and torch pull request 187838's rule pick at this shape. Green: the limits of "
        f"the rule in analysis.judge.rule. Data: noise results (python -m analysis noise"
        f"{' --device cuda, on a lent GPU' if device == 'cuda' else ''}).")


def _training_rows(training: pd.DataFrame, device: str) -> pd.DataFrame:
    rows = training[(training["device"] == device) & (training["setting"] == "full")]
    return rows[rows["split"] == "heldout"]


def plot_training(training: pd.DataFrame, device: str = "cpu") -> CaptionedFigure | None:
    """Left: held-out loss against step per arm (seed mean, band min-max over seeds). Right: each seed's final
    held-out loss gap to the fp32 head of the same seed, per arm, beside the seed-to-seed spread of fp32."""
    from analysis.studies.training import final_losses

    rows = _training_rows(training, device)
    if rows.empty:
        return None
    apply_style()
    fig = new_figure(11.5, 4.2)
    curve_ax, gap_ax = fig.subplots(1, 2, width_ratios=[1.3, 1.0])
    arms = [arm.name for arm in ARMS if arm.name in set(rows["arm"])]
    for arm in arms:
        data = rows[rows["arm"] == arm].groupby("step")["loss"]
        mean = data.mean()
        curve_ax.plot(mean.index, mean.to_numpy(), color=ARM_COLOURS[arm], ls=ARM_STYLES[arm], lw=1.2, label=arm)
        curve_ax.fill_between(mean.index, data.min().to_numpy(), data.max().to_numpy(), color=ARM_COLOURS[arm],
                              alpha=0.08, lw=0)
    curve_ax.set_xlabel("step")
    curve_ax.set_ylabel("held-out loss (nats, fp32 evaluation)")
    last = final_losses(rows.assign(split="heldout"))
    spread = last[last["arm"] == ARMS[0].name]["loss"]
    for index, arm in enumerate(arms):
        gaps = last[last["arm"] == arm]
        gap_ax.scatter(gaps["gap"], np.full(len(gaps), index), color=ARM_COLOURS[arm], s=22, zorder=3)
        if len(gaps):
            gap_ax.plot([gaps["gap"].min(), gaps["gap"].max()], [index, index], color=ARM_COLOURS[arm], lw=1.0)
    if len(spread) > 1:
        half = (spread.max() - spread.min()) / 2
        gap_ax.axvspan(-half, half, color="0.85", zorder=0, label="± half the fp32 head's seed-to-seed spread")
    gap_ax.axvline(0.0, color="k", lw=0.8)
    gap_ax.set_yticks(range(len(arms)), arms, fontsize=8)
    gap_ax.set_ylim(len(arms) - 0.5, -0.5)
    gap_ax.set_xlabel("final held-out loss − fp32 head's, same seed (nats)")
    legend_below(fig, np.array([curve_ax, gap_ax]), columns=5)
    steps = int(rows["steps"].max())
    seeds = rows.groupby("arm")["seed"].nunique()
    where = ("one H200 (real cuBLAS kernels)" if device == "cuda"
             else f"CPU ({rows['cpu_model'].iloc[0]}; lce's CUDA layouts emulated)")
    return CaptionedFigure(
        fig, f"training_{device}",
        f"The small language model (D=128, 4 layers, C=16384, {int(rows['batch_rows'].max())} tokens per step, "
        f"{steps} steps) trained with its head loss under each arm, on {where}; same initialisation and batches per "
        f"seed ({span(seeds, 'd')} seeds per arm). lce arms: fp32 acc_dtype, aspect_ratio:2 (256 chunks of "
        f"8 rows), fp16 with a dynamic loss scale. Left: held-out loss (mean over seeds, band min–max). Right: each "
        f"seed's final gap to the fp32 head of the same seed (dots, line: range), grey: ± half the fp32 head's "
        f"seed-to-seed spread. Data: training results (python -m analysis train"
        f"{' --device cuda' if device == 'cuda' else ''}).")


def plot_checkpoint_errors(noise: pd.DataFrame) -> CaptionedFigure | None:
    """Bias/noise of each policy on the fp32 arm's snapshots against the training step, per device and dtype."""
    rows = noise[noise["step"].notna()] if "step" in noise else noise.iloc[:0]
    if rows.empty:
        return None
    apply_style()
    panels = rows[["device", "dtype"]].drop_duplicates().sort_values(["device", "dtype"]).itertuples(index=False)
    panels = list(panels)
    fig = new_figure(4.2 * len(panels), 3.6)
    axes = np.atleast_1d(fig.subplots(1, len(panels), squeeze=False)[0])
    for ax, (device, dtype) in zip(axes, panels, strict=True):
        here = rows[(rows["device"] == device) & (rows["dtype"] == dtype)]
        points = seed_interval(here, "weight_bias_over_noise", by=["policy", "num_chunks", "step"])
        most = points["num_chunks"].max()
        for (policy, chunks), lines in points.groupby(["policy", "num_chunks"]):
            if policy == "unfused" or (policy != "compact" and chunks != most):
                continue
            lines = lines.sort_values("step")
            fade = 1.0 if policy != "compact" else min(1.0, 0.35 + 0.65 * np.log2(chunks) / np.log2(most))
            ax.plot(lines["step"], lines["weight_bias_over_noise"], marker="o", ms=3.5, color=PALETTE.get(policy, "k"),
                    alpha=fade, label=f"{policy}, {int(chunks)} chunk(s)")
        ax.axhline(BIAS_LIMIT, color="tab:green", lw=1.0, alpha=0.6, label=f"bias limit {BIAS_LIMIT}")
        log_axes(ax, x=False)
        ax.set_title(f"{SOURCE_NAMES[device]}, {dtype}", fontsize=9)
        ax.set_xlabel("training step of the snapshot")
        ax.set_ylabel("grad_weight bias / sampling noise")
    legend_below(fig, axes, columns=4)
    first = rows.iloc[0]
    return CaptionedFigure(
        fig, "noise_during_training",
        f"The weight-gradient bias over the sampling noise along the gradient, on the fp32 arm's snapshots during "
        f"training (the head's inputs: the model's hidden states on {int(first.N)} held-out tokens, its head weight "
        f"and the next tokens), per policy (lce, fp32 acc_dtype, CUDA layouts, 256 chunks; compact also at 1 and 16, "
        f"fainter). "
        f"Medians over the seeds whose snapshots exist. Data: noise_checkpoints results (python -m analysis train).")


def draw_all(noise: pd.DataFrame, training: pd.DataFrame, noise_scaling: pd.DataFrame | None = None
             ) -> list[CaptionedFigure]:
    """Every notebook-06 figure the tables have data for (real GPU first, then the CPU's; the ratios over the batch
    size where ``noise_scaling`` is given)."""
    drawn = [plot_noise_vs_chunks(noise, "cuda"), plot_noise_vs_chunks(noise, "cuda-emulated"),
             plot_checkpoint_errors(noise), plot_training(training, "cuda"), plot_training(training, "cpu")]
    if noise_scaling is not None:
        drawn.append(plot_noise_scaling(noise_scaling))
    return [figure for figure in drawn if figure is not None]

# --- key numbers: the notebook's prose quotes them, tests/claims/test_nb06_does_it_matter.py asserts its claims

SOURCE_WORDS = {"cuda": "one H200 (cuBLAS, torch 2.11)", "cuda-emulated": "the CUDA layouts emulated on CPU"}


@dataclasses.dataclass(frozen=True)
class NoiseNumbers:
    """The noise study on its best source of CUDA data: seed medians per (dtype, family, policy, num_chunks) of
    grad_weight's floors and of the ratios :data:`analysis.judge.rule.RATIO_COLUMNS`, bf16 and fp16 (lce on the
    CUDA layouts with fp32 acc_dtype at explicit chunk counts; the unfused op in the input dtype at 1)."""

    source: str  # "cuda" (the H200's rows, where committed) or "cuda-emulated"
    seeds: int
    families: tuple[str, ...]
    most: int  # the most chunks measured
    medians: pd.DataFrame

    def at(self, policy: str, column: str, chunks: int | None = None, dtype: str | None = None) -> pd.Series:
        """``column`` of ``policy`` at ``chunks`` (default: :attr:`most`), per (dtype, family) or, given
        ``dtype``, per family."""
        picked = self.medians.xs((policy, self.most if chunks is None else chunks), level=("policy", "num_chunks"))
        return picked[column] if dtype is None else picked[column].xs(dtype, level="dtype")


def noise_numbers(noise: pd.DataFrame) -> NoiseNumbers:
    """From the ``noise`` results."""
    rows = study_rows(noise)
    source = "cuda" if (rows["device"] == "cuda").any() else "cuda-emulated"
    rows = rows[(rows["device"] == source) & rows["dtype"].isin(["bfloat16", "float16"])
                & ((rows["layout"] == "cuda") | (rows["policy"] == "unfused"))]
    medians = rows.groupby(["dtype", "family", "policy", "num_chunks"])[["grad_weight_floors", *RATIO_COLUMNS]]
    return NoiseNumbers(source, int(rows["seed"].nunique()), tuple(sorted(rows["family"].unique())),
                        int(rows["num_chunks"].max()), medians.median())


def emulation_agreement(noise: pd.DataFrame) -> tuple[float, float, str] | None:
    """How closely the CPU emulation of the CUDA layouts reproduces the H200: the median and the largest relative
    difference of the seed-median weight-gradient floors over the (dtype, family, policy, chunk count) both
    measured on the same seeds, and where the largest is; None without both."""
    rows = study_rows(noise)
    rows = rows[rows["layout"] == "cuda"]
    seeds = set(rows[rows["device"] == "cuda"]["seed"]) & set(rows[rows["device"] == "cuda-emulated"]["seed"])
    if not seeds:
        return None
    rows = rows[rows["seed"].isin(seeds)]
    medians = rows.groupby(["dtype", "family", "policy", "num_chunks", "device"])["grad_weight_floors"].median()
    both = medians.unstack("device").dropna()
    if both.empty:
        return None
    difference = (both["cuda-emulated"] - both["cuda"]).abs() / both["cuda"]
    dtype, family, policy, chunks = difference.idxmax()
    return float(difference.median()), float(difference.max()), f"{policy} at {chunks} chunks, {family}, {dtype}"


@dataclasses.dataclass(frozen=True)
class TrainingNumbers:
    """The full training study on one device: the final held-out loss of each arm against the fp32 head."""

    where: str  # "one H200" or "CPU (<model>, CUDA layouts emulated)"
    steps: int
    tokens: int  # per step
    seeds: str  # seeds per arm: "3", or "1–2" where arms have different counts
    summary: pd.DataFrame  # analysis.studies.training.summary: per arm seeds, loss, gap_mean/min/max, seed_spread
    fp32_spread: float  # the fp32 head's final held-out loss, max − min over its seeds (0 with one seed)
    widest: pd.Series  # the finished run (arm, seed, loss, gap) whose gap to fp32 is largest in size
    snapshots: pd.DataFrame  # compact's bias/noise (256 chunks) on the fp32 run's snapshots, per dtype and step


def training_numbers(training: pd.DataFrame, noise: pd.DataFrame, device: str) -> TrainingNumbers | None:
    """From the ``training`` and ``noise`` results, on ``device`` ("cuda" or "cpu"); None without full runs."""
    from analysis.studies.training import summary

    rows = training[(training["device"] == device) & (training["setting"] == "full")]
    gaps = final_losses(rows).dropna(subset=["gap"])
    gaps = gaps[gaps["arm"] != ARMS[0].name]
    if gaps.empty:
        return None
    table = summary(rows)
    seeds = table["seeds"].astype(int)
    snapshots = checkpoint_bias(noise)
    where = "one H200" if device == "cuda" else f"CPU ({rows['cpu_model'].iloc[0]}, CUDA layouts emulated)"
    return TrainingNumbers(where, int(rows["steps"].max()), int(rows["batch_rows"].max()), span(seeds, "d"), table,
                           float(table.loc[ARMS[0].name, "seed_spread"]), gaps.loc[gaps["gap"].abs().idxmax()],
                           snapshots[snapshots["device"] == ("cuda" if device == "cuda" else "cuda-emulated")])


def readme_does_it_matter(results: Path) -> str:
    """Notebook 06's key numbers as three small tables: error and noise per policy, training, the rule."""
    from analysis.core.results_io import NOISE, TRAINING

    noise, training = (load_kind(results, kind.name)[1] for kind in (NOISE, TRAINING))
    numbers = noise_numbers(noise)
    policies = []
    for policy, chunks in (("compact", 1), ("compact", numbers.most), ("balanced", numbers.most),
                           ("accurate", numbers.most), ("unfused", 1)):
        bias = numbers.at(policy, "weight_bias_over_noise", chunks)
        policies.append({"policy": policy, "chunks": chunks,
                         **{f"{short} floors": span(numbers.at(policy, "grad_weight_floors", chunks, dtype))
                            for dtype, short in (("bfloat16", "bf16"), ("float16", "fp16"))},
                         "bias/noise": span(bias, ".2g"), "error/noise": span(numbers.at(
                             policy, "weight_error_over_noise", chunks), ".2g"),
                         "bias stands out after (steps)": span(bias ** -2, ".2g")})
    runs = []
    for device in ("cuda", "cpu"):
        run = training_numbers(training, noise, device)
        if run is not None:
            runs.append({"trained on": run.where, "steps": run.steps, "seeds per arm": run.seeds,
                         "fp32 head's seed-to-seed spread (nats)": f"{run.fp32_spread:.3f}",
                         "largest final gap to fp32 (nats)": f"{run.widest['gap']:+.3f} ({run.widest['arm']})",
                         "compact's bias/noise on the snapshots": span(run.snapshots["median"], ".2g")})
    peers = peer_table(noise).query("rule != 'lce auto'")
    picks = pd.concat([rule_table(noise).assign(rule="lce auto"), peers.assign(
        device="cuda", pick=peers["policy"] + ", " + peers["num_chunks"].astype(str) + " chunks")])
    picks = picks.assign(error=picks[["weight_error_over_noise", "input_error_over_noise"]].max(axis=1))[
        ["rule", "device", "dtype", "pick", "source", "worst_family", "weight_bias_over_noise", "error", "passes"]]
    picks.columns = ["entry", "device", "dtype", "pick", "data", "worst family", f"bias/noise (≤ {BIAS_LIMIT})",
                     f"error/noise (≤ {ERROR_LIMIT})", "meets the rule"]
    return "\n\n".join(part.rstrip("\n") for part in [
        f"Weight-gradient error per policy on {SOURCE_WORDS[numbers.source]} (`python -m analysis noise`, "
        f"N={NOISE_SHAPE.N} D={NOISE_SHAPE.D} C={NOISE_SHAPE.C}, {numbers.seeds} seeds, families "
        f"{', '.join(numbers.families)}): floors, and the ratios to the batch's sampling noise (range over families "
        "and both dtypes of the seed medians):",
        markdown_table(pd.DataFrame(policies)),
        "Training the small language model (`python -m analysis train`):",
        markdown_table(pd.DataFrame(runs)),
        "The rule (`analysis/judge/rule.py`; worst family, seed medians; data \"cuda\": the H200's rows) on lce's "
        "\"auto\" entries and torch's CUDA picks:",
        markdown_table(picks, {c: ".2g" for c in picks.columns if "noise" in c}),
    ]) + "\n"


# --- the ratios over the batch size (python -m analysis noise-scaling; tests/claims/test_nb06_noise_scaling.py)

SCALING_STYLES: dict[str, tuple[object, str, str]] = {
    "lce auto cuda": (PALETTE["balanced"], "-", "o"),
    "lce auto cpu": (PALETTE["accurate"], "-", "s"),
    "torch 2.13 auto": ("tab:red", "-", "X"),
    "lce compact rows=2048": (PALETTE["compact"], "-", "^"),
    "lce compact chunks=16": (PALETTE["compact"], ":", "v"),
    "lce balanced chunks=256": (PALETTE["balanced"], ":", "D"),
    "lce accurate chunks=256": (PALETTE["accurate"], ":", "d"),
    "unfused": ((0.4, 0.4, 0.4), "-.", "P"),
}
"""Colour (the policy's), line and marker per candidate of :mod:`analysis.studies.noise_scaling`."""


def _scaling_rows(scaling: pd.DataFrame) -> pd.DataFrame:
    from analysis.judge.noise_scaling import REFERENCE_D

    return scaling[scaling["D"] == REFERENCE_D] if not scaling.empty else scaling


def plot_noise_scaling(scaling: pd.DataFrame, column: str = "weight_bias_over_noise") -> CaptionedFigure | None:
    """``column`` against the batch size N per candidate, one panel per dtype (columns) and per kind of family
    (rows): the worst family with a nonzero expected gradient (measured seed medians with their interval, the
    fitted power law solid over the data and dashed beyond, with its 95% band, to N = 2^20), and the calibrated
    family (medians only). The rule's limit and the LLM range 2^17-2^20 are marked."""
    from analysis.judge.noise_scaling import LLM_ROWS, fit_scaling, measured, rule_families

    rows = _scaling_rows(scaling)
    if rows.empty:
        return None
    apply_style()
    dtypes = [dtype for dtype in ("bfloat16", "float16") if dtype in set(rows["dtype"])]
    families = rule_families(rows)
    zero = sorted(set(rows["family"]) - set(families))
    panel_rows = [("worst of " + ", ".join(families), families)] + [(f"{family} (expected gradient 0)", [family])
                                                                     for family in zero]
    fig = new_figure(5.2 * len(dtypes), 3.6 * len(panel_rows) + 1.0)
    axes = fig.subplots(len(panel_rows), len(dtypes), squeeze=False, sharex=True, sharey=True)
    limit = {"weight_bias_over_noise": BIAS_LIMIT}.get(column, ERROR_LIMIT)
    powers = [2**k for k in range(int(np.log2(rows["N"].min())), int(np.log2(LLM_ROWS[-1])) + 1)]
    shown: list[float] = []  # measured values and predicted lines: the y range (bands may reach far beyond)
    for (row, (title, chosen)), (col, dtype) in ((r, c) for r in enumerate(panel_rows) for c in enumerate(dtypes)):
        ax = axes[row, col]
        points = measured(rows[rows["dtype"] == dtype], column, families=chosen)
        for candidate, (colour, style, marker) in SCALING_STYLES.items():
            mine = points[points["candidate"] == candidate].sort_values("N")
            if mine.empty:
                continue
            ax.errorbar(mine["N"], mine[column], yerr=[mine[column] - mine[f"{column}_low"],
                                                       mine[f"{column}_high"] - mine[column]],
                        color=colour, marker=marker, ms=4, lw=0, elinewidth=0.8, label=candidate)
            shown += [*mine[f"{column}_low"], *mine[f"{column}_high"]]
            if row > 0:
                ax.plot(mine["N"], mine[column], color=colour, ls=style, lw=0.9)
                continue
            fit = fit_scaling(rows, candidate, dtype, column, families=chosen)
            band = np.array([fit.band(n) for n in powers])
            inside = np.array(powers) <= max(fit.rows)
            ax.plot(np.array(powers)[inside], band[inside, 0], color=colour, ls=style, lw=1.1)
            beyond = np.array(powers) >= max(fit.rows)
            ax.plot(np.array(powers)[beyond], band[beyond, 0], color=colour, ls="--", lw=1.1)
            ax.fill_between(np.array(powers)[beyond], band[beyond, 1], band[beyond, 2], color=colour, alpha=0.1,
                            lw=0)
            shown += list(band[:, 0])
        ax.axhline(limit, color="tab:green", lw=1.2, alpha=0.7, label=f"the rule's limit ({limit})")
        ax.axvspan(LLM_ROWS[0], LLM_ROWS[-1], color="0.9", zorder=0, label="LLM steps: 2^17-2^20 rows")
        log_axes(ax, x_base=2)
        ax.xaxis.set_major_locator(ticker.FixedLocator([2**k for k in range(10, 21, 2)]))
        ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda value, _: f"$2^{{{round(np.log2(value))}}}$"))
        ax.yaxis.set_major_locator(ticker.LogLocator(base=10, numticks=12))  # decades: the range spans many
        ax.set_title(f"{title}, {dtype}", fontsize=9)
        if row == len(panel_rows) - 1:
            ax.set_xlabel("rows per batch N (D=128, C=16384)")
        if col == 0:
            ax.set_ylabel(column.replace("_over_", " / ").replace("_", " "))
    positive = [value for value in shown if value > 0 and np.isfinite(value)]
    axes[0, 0].set_ylim(min(min(positive), limit) / 2, max(max(positive), limit) * 2)
    legend_below(fig, axes, columns=5)
    seeds = int(rows.groupby("family")["seed"].nunique().max())
    return CaptionedFigure(
        fig, f"noise_scaling_{column.removesuffix('_over_noise')}",
        f"How the gradient error compares with one batch's sampling noise as the batch grows: {column} of each "
        f"candidate (lce with fp32 acc_dtype, CUDA layouts emulated on CPU tensors, at the chunk counts the rules "
        f"give at each N; the CPU table's auto pick; the unfused op in the input dtype) against the rows per batch, "
        f"D=128, C=16384. Top: the worst of the families whose expected gradient is nonzero "
        f"({', '.join(families)}), medians over up to {seeds} seeds with their {INTERVAL}; lines: the fitted power "
        f"law log2(ratio) = level[family] + exponent * log2(N) (worst family), solid over the data, dashed beyond "
        f"it with its 95% bootstrap band (each family's (seed, N) points resampled). Below: the calibrated family, "
        f"whose "
        f"targets are drawn from the model (expected gradient 0), medians only. Green: the rule's limit; grey: "
        f"the rows of an LLM training step. Data: noise_scaling results (python -m analysis noise-scaling).")


@dataclasses.dataclass(frozen=True)
class ScalingNumbers:
    """The noise-scaling study's key numbers (D=128 unless stated): the families the rule's fit uses, the fits of
    the bias ratio per candidate and dtype with predictions at 2^17-2^20, each family's own exponent, the held-out
    check, how each family's gradient grows against its noise, and the exponents at the larger D."""

    families: tuple[str, ...]
    zero_gradient_families: tuple[str, ...]
    rows: tuple[int, ...]
    seeds: int
    bias: pd.DataFrame  # analysis.judge.noise_scaling.fit_table of weight_bias_over_noise
    own: pd.DataFrame  # analysis.judge.noise_scaling.family_exponents of the bias ratio (each family alone)
    heldout: pd.DataFrame  # heldout_check of the bias ratio, every candidate and dtype
    gradient: pd.DataFrame  # per family: gradient_over_noise (median over seeds) at the smallest and largest N
    by_d: pd.DataFrame  # fit_table of the bias ratio per D on the random family (exponent per candidate, dtype, D)
    measured_bias: pd.DataFrame  # analysis.judge.noise_scaling.measured of the bias ratio

    def at(self, candidate: str, dtype: str, rows: int = 2**20) -> tuple[float, float, float]:
        """The worst family's predicted bias/noise ``(ratio, low, high)`` of ``candidate`` at ``rows``."""
        row = self.bias[(self.bias["candidate"] == candidate) & (self.bias["dtype"] == dtype)].iloc[0]
        return row[f"at_{rows}"], row[f"at_{rows}_low"], row[f"at_{rows}_high"]

    def crossing(self, rows: int = 2**20) -> pd.DataFrame:
        """The (candidate, dtype) whose predicted bias/noise at ``rows`` is above the rule's limit."""
        return self.bias[self.bias[f"at_{rows}"] > BIAS_LIMIT]


def scaling_numbers(scaling: pd.DataFrame) -> ScalingNumbers | None:
    """From the ``noise_scaling`` results; None without rows at D=128."""
    from analysis.judge.noise_scaling import family_exponents, fit_table, heldout_check, measured, rule_families

    rows = _scaling_rows(scaling)
    if rows.empty:
        return None
    families = rule_families(rows)
    bias = fit_table(rows)
    heldout = pd.concat([heldout_check(rows, fit.candidate, fit.dtype) for fit in bias.itertuples()],
                        ignore_index=True)
    per_case = rows.drop_duplicates(["family", "dtype", "seed", "N"])
    medians = per_case.groupby(["family", "N"])["gradient_over_noise"].median().reset_index()  # sorted by N
    gradient = medians.groupby("family").agg(first_N=("N", "first"), last_N=("N", "last"),
                                             first=("gradient_over_noise", "first"),
                                             last=("gradient_over_noise", "last"))
    random = scaling[scaling["family"] == "random"]
    by_d = pd.concat([fit_table(random, D=d, families=["random"], predict_at=())
                      for d in sorted(random["D"].unique()) if random[random["D"] == d]["N"].nunique() > 1],
                     ignore_index=True)
    return ScalingNumbers(tuple(families), tuple(sorted(set(rows["family"]) - set(families))),
                          tuple(sorted(int(n) for n in rows["N"].unique())), int(rows["seed"].nunique()), bias,
                          family_exponents(rows), heldout, gradient.reset_index(), by_d, measured(rows))


FLOOR_CANDIDATES: tuple[str, ...] = tuple(name for names in noise_scaling_data.FLOOR_CANDIDATES.values()
                                          for name in names)
"""The candidates whose weight gradient is summed in fp32 and rounded once into the input dtype
(:data:`lce.decide.noise_scaling.FLOOR_CANDIDATES`)."""


def floor_check(scaling: pd.DataFrame) -> pd.DataFrame:
    """Per candidate and dtype (every family, seed, N and D): the range of the weight gradient's Frobenius error in
    floors -- 1 is the exact gradient rounded once to the input dtype, the least any op returning it has."""
    grouped = scaling.groupby(["candidate", "dtype"])["grad_weight_floors"]
    table = grouped.agg(floors_min="min", floors_max="max", rows="size").reset_index()
    order = {name: index for index, name in enumerate(SCALING_STYLES)}
    return table.sort_values(["candidate", "dtype"], key=lambda column: column.map(order).fillna(column)
                             if column.name == "candidate" else column).reset_index(drop=True)


def scaling_table(numbers: ScalingNumbers, rows: tuple[int, ...] = (2**17, 2**20)) -> pd.DataFrame:
    """Per candidate and dtype: the fitted exponent of the bias ratio with its interval, the worst family's median
    at the largest measured N, and the prediction at ``rows`` with its 95% band, and whether it is within the
    rule's limit there (by the prediction's value, and by the band's upper end)."""
    last = numbers.measured_bias.sort_values("N").groupby(["candidate", "dtype"]).tail(1).set_index(
        ["candidate", "dtype"])
    out = []
    for row in numbers.bias.itertuples(index=False):
        measured_row = last.loc[(row.candidate, row.dtype)]
        entry = {"candidate": row.candidate, "dtype": row.dtype,
                 "exponent": f"{row.exponent:.2f} [{row.exponent_low:.2f}, {row.exponent_high:.2f}]",
                 "measured at N": int(measured_row["N"]),
                 "measured": f"{measured_row['weight_bias_over_noise']:.2g}"}
        for n in rows:
            value, low, high = numbers.at(row.candidate, row.dtype, n)
            entry[f"2^{n.bit_length() - 1}"] = f"{value:.2g} [{low:.2g}, {high:.2g}]"
        value, _, high = numbers.at(row.candidate, row.dtype, rows[-1])
        entry[f"within {BIAS_LIMIT} at 2^{rows[-1].bit_length() - 1}"] = (
            "yes" if high <= BIAS_LIMIT else ("value yes, band no" if value <= BIAS_LIMIT else "no"))
        out.append(entry)
    return pd.DataFrame(out)


def heldout_summary(numbers: ScalingNumbers) -> pd.DataFrame:
    """Per candidate and dtype: how many held-out (odd power of two) family means the even-N fit's 95% prediction
    interval covered, and the largest miss in log2 units."""
    grouped = numbers.heldout.groupby(["candidate", "dtype"], sort=False)
    return grouped.agg(points=("covered", "size"), covered=("covered", "sum"),
                       largest_error_log2=("error_log2", lambda values: values.abs().max())).reset_index()


LARGE_BATCH_SETTING = "large-batch"
"""The head-only study at 16x the batch per step (``python -m analysis head-train --setting large-batch
--optimizers adamw-large --file head_training_large_batch.csv.gz``), its rows' ``setting``."""


def large_batch_rows(head: pd.DataFrame) -> pd.DataFrame:
    """The rows of :data:`LARGE_BATCH_SETTING` among the head-only study's ``head`` rows (every setting's)."""
    return head[head["setting"] == LARGE_BATCH_SETTING] if not head.empty else head


def large_batch_training(results: Path) -> pd.DataFrame:
    """The head-only study's rows of :data:`LARGE_BATCH_SETTING` in ``results`` (empty where it has not run)."""
    from analysis.core.results_io import HEAD_TRAINING

    return large_batch_rows(load_kind(results, HEAD_TRAINING.name)[1])


def draw_large_batch_figures(head: pd.DataFrame) -> list[CaptionedFigure]:
    """The large-batch head study's gap-vs-step figure (notebook 10's drawing), where ``head`` holds its rows."""
    from analysis.report.nb10_long_horizon import plot_gap_vs_step

    rows = large_batch_rows(head)
    figure = plot_gap_vs_step(rows, "adamw-large") if not rows.empty else None
    return [figure] if figure is not None else []


def large_batch_summary(table: pd.DataFrame) -> pd.DataFrame:
    """Per arm of the large-batch head study: its final held-out gap to the fp32 head per target-frequency bucket
    with the seeds' t-interval, the fp32 head's seed spread there, and whether the gap counts (systematic and
    beyond that spread: :mod:`analysis.judge.horizon`)."""
    from analysis.judge.horizon import final_gaps

    if table.empty:
        return table
    final = final_gaps(table)
    return final[["arm", "bucket", "step", "seeds", "gap", "low", "high", "seed_spread", "systematic",
                  "counts"]].reset_index(drop=True)


AUTO_PICKS: dict[str, str] = {AUTO_CUDA: "CUDA", AUTO_CPU: "CPU"}
"""The auto picks among the noise-scaling candidates, by the device kind whose table they are."""


def auto_at_step(rows: int = 2**20) -> pd.DataFrame:
    """Per "auto" entry with bf16/fp16 input: the weight-gradient bias/noise the decision procedure reads for its plan
    over a batch of ``rows`` rows (:func:`lce.decide.noise_scaling.bias_at`: the larger of the measured candidates
    that share the plan's arithmetic), with the band and the candidate read -- what the decision table prints."""
    from lce.decide import REFERENCE_HEADS, default_candidate
    from lce.decide.noise_scaling import bias_at
    from lce.planning.options import dtype_name
    from lce.planning.policies import AUTO_TABLE
    from lce.testing import cpu_gemms

    out = []
    with cpu_gemms("native"):
        for kind, dtype in AUTO_TABLE:
            if dtype in (torch.bfloat16, torch.float16):
                at = bias_at(default_candidate(REFERENCE_HEADS[0], dtype, kind).plan, rows)
                out.append({"device": kind, "dtype": dtype_name(dtype), "candidate": at.candidate,
                            "value": at.value, "low": at.low, "high": at.high})
    return pd.DataFrame(out)


def first_crossing(numbers: ScalingNumbers, candidate: str, dtype: str) -> int | None:
    """The smallest measured N where ``candidate``'s worst-family median bias/noise exceeds the limit (None:
    nowhere in the data)."""
    rows = numbers.measured_bias
    over = rows[(rows["candidate"] == candidate) & (rows["dtype"] == dtype)
                & (rows["weight_bias_over_noise"] > BIAS_LIMIT)]
    return int(over["N"].min()) if len(over) else None


def _at_text(numbers: ScalingNumbers, candidate: str, dtype: str, rows: int = 2**20) -> str:
    value, low, high = numbers.at(candidate, dtype, rows)
    return f"{value:.2g} [{low:.2g}, {high:.2g}]"


def _exponent_text(numbers: ScalingNumbers, candidate: str, dtype: str) -> str:
    row = numbers.bias[(numbers.bias["candidate"] == candidate) & (numbers.bias["dtype"] == dtype)].iloc[0]
    return f"{row.exponent:.2f} [{row.exponent_low:.2f}, {row.exponent_high:.2f}]"


def _measured_last(numbers: ScalingNumbers, candidate: str, dtype: str) -> tuple[int, float]:
    rows = numbers.measured_bias
    mine = rows[(rows["candidate"] == candidate) & (rows["dtype"] == dtype)].sort_values("N").iloc[-1]
    return int(mine["N"]), float(mine["weight_bias_over_noise"])


def scaling_conclusion(numbers: ScalingNumbers, scaling: pd.DataFrame) -> str:
    """Notebook 06's conclusion on the ratios over the batch size, from the fit and the data (the claims tests in
    ``tests/claims/test_nb06_noise_scaling.py`` check each statement)."""
    floors = floor_check(scaling)
    at_floor = floors[floors["candidate"].isin(FLOOR_CANDIDATES)]
    read = auto_at_step()
    picks = []
    for row in read.itertuples():
        n, value = _measured_last(numbers, row.candidate, row.dtype)
        picks.append(f"{row.device.upper()} {row.dtype} (read from {row.candidate}): exponent "
                     f"{_exponent_text(numbers, row.candidate, row.dtype)}, {value:.2g} measured at N = {n:,}, "
                     f"{row.value:.2g} [{row.low:.2g}, {row.high:.2g}] predicted at 2^20")
    crossing = numbers.crossing()
    crossing = crossing[~crossing["candidate"].isin(FLOOR_CANDIDATES)]
    crossed = []
    for row in crossing.itertuples():
        first = first_crossing(numbers, row.candidate, row.dtype)
        where = f"measured over it from N = {first:,}" if first else "predicted over it beyond the data"
        crossed.append(f"{row.candidate} in {row.dtype} ({where}; {_at_text(numbers, row.candidate, row.dtype)} "
                       f"at 2^20)")
    auto_max, auto_high = read["value"].max(), read["high"].max()
    verdict = ("below the limit" if auto_high <= BIAS_LIMIT else
               "below the limit by the fit's value, though its band reaches above it" if auto_max < 0.9 * BIAS_LIMIT
               else "at the limit, its band reaching well above it" if auto_max <= 1.1 * BIAS_LIMIT
               else "over the limit")
    held = heldout_summary(numbers)
    own = numbers.own.set_index(["candidate", "dtype", "family"])
    hidden = own.loc[("torch 2.13 auto", "bfloat16", "calibrated")]
    shown = own.loc[("torch 2.13 auto", "bfloat16", "random")]
    by_d = numbers.by_d[numbers.by_d["D"] > 128]
    auto_d = by_d[(by_d["candidate"] == "lce auto cuda") & (by_d["dtype"] == "bfloat16")].set_index("D")
    larger_d = "; ".join(f"D = {d}: N = {row.rows}, {row.exponent:.2f} [{row.exponent_low:.2f}, "
                         f"{row.exponent_high:.2f}]" for d, row in auto_d.iterrows())
    grad = numbers.gradient.set_index("family")
    growth = "; ".join(f"{family} {grad.at[family, 'first']:.2g} at {int(grad.at[family, 'first_N']):,} rows to "
                       f"{grad.at[family, 'last']:.2g} at {int(grad.at[family, 'last_N']):,}" for family in grad.index)
    return f"""**Conclusion.** The auto picks' weight gradients are rounded once into the input dtype, and the study
measured them at that dtype's rounding floor at every batch size ({at_floor["floors_min"].min():.2f}–{at_floor[
"floors_max"].max():.2f} floors over {int(at_floor["rows"].sum())} rows): no op that returns the input dtype has
less error. Their bias/noise grows more slowly than sqrt(N) -- {"; ".join(picks)} -- so at an LLM step of 2^20 rows
the worst is {auto_max:.3g} (band up to {auto_high:.2g}), {verdict} ({BIAS_LIMIT}). No auto pick changes: every
policy that returns the input dtype sits at or above this floor, and the decision procedure now reads each head's
ratio at its own N (`lce.decide.Candidate.bias`). What crosses the limit at LLM batch sizes:
{"; ".join(crossed) or "nothing"}. Those are the per-chunk input-dtype sums and the unfused op's low-precision
GEMM; the bias condition (`lce.decide.bias_fault`) now drops such candidates at the head's N. On the calibrated
family, whose expected gradient is zero, torch 2.13's bf16 default's ratio does not grow (exponent
{hidden["exponent"]:.2f} [{hidden["exponent_low"]:.2f}, {hidden["exponent_high"]:.2f}]) while on the random family
it grows as N^{shown["exponent"]:.1f}: the growth is a bias along a nonzero expected gradient, which is why the
fit uses only the families that have one. The fit, fitted on
the even powers of two, held {int(held["covered"].sum())} of {int(held["points"].sum())} held-out family means
in its 95% prediction interval (largest miss {held["largest_error_log2"].max():.2f} in log2: the bias statistic of
a gradient at the floor scatters by factors of several between draws). At the larger D (random family, bf16, over
two or three octaves of N) every candidate's exponent interval overlaps its D = 128 one, but they are wide, and the
CUDA auto pick's point estimate is larger there ({larger_d}): whether the floor's ratio grows faster at LLM widths
is not settled by this data.

*Inputs:* {len(scaling):,} rows, N = {min(numbers.rows):,}–{max(numbers.rows):,} at D = 128, C = 16384
({", ".join(numbers.families)}: nonzero expected gradient; {", ".join(numbers.zero_gradient_families) or "none"}:
zero), up to {numbers.seeds} seeds, bf16 and fp16, lce's CUDA layouts emulated on CPU tensors and the CPU table's
pick, fp32 acc_dtype, on {", ".join(sorted(scaling["cpu_model"].astype(str).unique()))} (torch
{", ".join(sorted(scaling["torch_version"].astype(str).unique()))}); the gradient's norm over its noise grows as
{growth}.

*Limits:* beyond 2^16 every number is a prediction of a power law fitted to 2^10–2^16 (its band is over the
points' scatter, not over the choice of model); the trained family stops at its dump's 2048 rows, so the slope is
the random family's; CUDA layouts are emulated (exact products, fp32 sums), not cuBLAS."""


def large_batch_conclusion(table: pd.DataFrame) -> str:
    """The large-batch head study's conclusion: which arms' final gaps count in which buckets, beside the fp32 head's
    seed spread (or that it has not run)."""
    if table.empty:
        return ("*The large-batch head study has not been run (`python -m analysis head-train --setting "
                "large-batch`).*")
    summary = large_batch_summary(table)
    counted = summary[summary["counts"]]
    systematic = summary[summary["systematic"] & ~summary["counts"]]
    first = table.iloc[0]
    step = int(summary["step"].max())

    def listed(rows: pd.DataFrame) -> str:
        def gaps(group: pd.DataFrame) -> str:
            return ", ".join(f"{gap * 1e3:+.2f}" for gap in group["gap"])

        return "; ".join(f"{arm} ({', '.join(group['bucket'])}: {gaps(group)} millinats)"
                         for arm, group in rows.groupby("arm", sort=False)) or "none"

    auto = summary[summary["arm"] == "bf16 balanced@64"]
    auto_text = ("counts in no bucket" if not auto["counts"].any() else
                 f"counts in {', '.join(auto[auto['counts']]['bucket'])}")
    return f"""**Conclusion.** After {step:,} steps of {int(first.batch_rows):,} rows, the arms whose held-out gap to
the fp32 head counts (its {int(summary["seeds"].min())}-seed t-interval excludes zero and it is larger than the fp32
head's own spread over the seeds): {listed(counted)}. Systematic but within the seed spread: {listed(systematic)}.
lce's auto pick (bf16 balanced@64) {auto_text}.

*Inputs:* head-only AdamW training, calibrated teacher, D = {int(first.D)}, C = {int(first.C)}, a pool of
{int(first.pool_rows):,} rows, lce's CUDA layouts' arithmetic on the CPU ({first.cpu_model}).

*Limits:* a small head and {step:,} steps (3.2x the rows of notebook 10's 10⁴-step study); the calibrated teacher's
targets come from a softmax, so the gradient's expectation vanishes only at the teacher, not along the run."""


def readme_noise_scaling(results: Path) -> str:
    """docs/findings.md's block on the ratios over the batch size: the fit per candidate (exponent, the worst family's
    measurement at the largest N, predictions at 2^17 and 2^20 with bands) and the large-batch head study's gaps."""
    from analysis.core.results_io import NOISE_SCALING

    _, scaling = load_kind(results, NOISE_SCALING.name)
    numbers = scaling_numbers(scaling) if not scaling.empty else None
    if numbers is None:
        return "The noise-scaling study has not been run (`python -m analysis noise-scaling`).\n"
    cpu = scaling["cpu_model"].dropna().iloc[0] if "cpu_model" in scaling else "?"
    parts = [f"Weight-gradient bias over the sampling noise against the rows per batch (`python -m analysis "
             f"noise-scaling`, then `noise-scaling-fit`; D=128, C=16384, N = {min(numbers.rows):,}–"
             f"{max(numbers.rows):,}, up to {numbers.seeds} seeds, worst of {', '.join(numbers.families)}; CUDA "
             f"layouts emulated on {cpu}): exponent of N with its 95% bootstrap interval, the measurement at the "
             f"largest N, and the fitted line's prediction with its 95% band (limit {BIAS_LIMIT}):",
             markdown_table(scaling_table(numbers))]
    large = large_batch_summary(large_batch_training(results))
    if not large.empty:
        shown = large.assign(**{
            "gap (mnats)": [f"{g * 1e3:+.2f} [{lo * 1e3:+.2f}, {hi * 1e3:+.2f}]"
                            for g, lo, hi in zip(large["gap"], large["low"], large["high"], strict=True)],
            "fp32 seed spread (mnats)": [f"{value * 1e3:.2f}" for value in large["seed_spread"]],
            "counts": large["counts"].map({True: "yes", False: "no"})})
        parts += ["The head-only study at 4096 rows per step (`python -m analysis head-train --setting large-batch`): "
                  "final held-out gap to the fp32 head per bucket, with the seeds' t-interval:",
                  markdown_table(shown[["arm", "bucket", "step", "seeds", "gap (mnats)", "fp32 seed spread (mnats)",
                                        "counts"]])]
    return "\n\n".join(part.rstrip("\n") for part in parts) + "\n"
