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
from analysis.studies.training import ARMS, final_losses

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


def draw_all(noise: pd.DataFrame, training: pd.DataFrame) -> list[CaptionedFigure]:
    """Every notebook-06 figure the tables have data for (real GPU first, then the CPU's)."""
    drawn = [plot_noise_vs_chunks(noise, "cuda"), plot_noise_vs_chunks(noise, "cuda-emulated"),
             plot_checkpoint_errors(noise), plot_training(training, "cuda"), plot_training(training, "cpu")]
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
