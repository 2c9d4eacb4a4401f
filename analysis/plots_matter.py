"""The figures of notebook 06 ("does it matter"): error against sampling noise, and the training study.

Like :mod:`analysis.plots`, every function draws from results tables and measures nothing; each
returns a :class:`~analysis.plots.CaptionedFigure` or None when its data is absent.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch
from matplotlib.axes import Axes

from .conclusions import count_range
from .decision import BIAS_LIMIT, ERROR_LIMIT, study_rows
from .pareto import INTERVAL, seed_interval
from .plots import PALETTE, CaptionedFigure, _figure, _legend_below, _log_axes, _style
from .studies.noise import NOISE_SHAPE, chunk_rules
from .studies.training import ARMS

__all__ = ["plot_noise_vs_chunks", "plot_training", "plot_checkpoint_errors", "draw_all"]

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
    _style()
    families = list(dict.fromkeys(sorted(rows["family"])))
    dtypes = sorted(rows["dtype"].unique())
    fig = _figure(3.3 * len(families), 2.9 * len(dtypes) + 0.9)
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
        _log_axes(ax, x_base=2)
        ax.set_title(f"{family}, {dtype}", fontsize=9)
        if row == len(dtypes) - 1:
            ax.set_xlabel("chunks (explicit rows per chunk)")
        if column == 0:
            ax.set_ylabel("grad_weight error / sampling noise")
    _legend_below(fig, axes, columns=5)
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
        f"the rule in analysis.decision. Data: noise results (python -m analysis noise"
        f"{' --device cuda, on a lent GPU' if device == 'cuda' else ''}).")


def _training_rows(training: pd.DataFrame, device: str) -> pd.DataFrame:
    rows = training[(training["device"] == device) & (training["setting"] == "full")]
    return rows[rows["split"] == "heldout"]


def plot_training(training: pd.DataFrame, device: str = "cpu") -> CaptionedFigure | None:
    """Left: held-out loss against step per arm (seed mean, band min-max over seeds). Right: each seed's final
    held-out loss gap to the fp32 head of the same seed, per arm, beside the seed-to-seed spread of fp32."""
    from .studies.training import final_losses

    rows = _training_rows(training, device)
    if rows.empty:
        return None
    _style()
    fig = _figure(11.5, 4.2)
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
    _legend_below(fig, np.array([curve_ax, gap_ax]), columns=5)
    steps = int(rows["steps"].max())
    seeds = rows.groupby("arm")["seed"].nunique()
    where = ("one H200 (real cuBLAS kernels)" if device == "cuda"
             else f"CPU ({rows['cpu_model'].iloc[0]}; lce's CUDA layouts emulated)")
    return CaptionedFigure(
        fig, f"training_{device}",
        f"The small language model (D=128, 4 layers, C=16384, {int(rows['batch_rows'].max())} tokens per step, "
        f"{steps} steps) trained with its head loss under each arm, on {where}; same initialisation and batches per "
        f"seed ({count_range(seeds)} seeds per arm). lce arms: fp32 acc_dtype, aspect_ratio:2 (256 chunks of "
        f"8 rows), fp16 with a dynamic loss scale. Left: held-out loss (mean over seeds, band min–max). Right: each "
        f"seed's final gap to the fp32 head of the same seed (dots, line: range), grey: ± half the fp32 head's "
        f"seed-to-seed spread. Data: training results (python -m analysis train"
        f"{' --device cuda' if device == 'cuda' else ''}).")


def plot_checkpoint_errors(noise: pd.DataFrame) -> CaptionedFigure | None:
    """Bias/noise of each policy on the fp32 arm's snapshots against the training step, per device and dtype."""
    rows = noise[noise["step"].notna()] if "step" in noise else noise.iloc[:0]
    if rows.empty:
        return None
    _style()
    panels = rows[["device", "dtype"]].drop_duplicates().sort_values(["device", "dtype"]).itertuples(index=False)
    panels = list(panels)
    fig = _figure(4.2 * len(panels), 3.6)
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
        _log_axes(ax, x=False)
        ax.set_title(f"{SOURCE_NAMES[device]}, {dtype}", fontsize=9)
        ax.set_xlabel("training step of the snapshot")
        ax.set_ylabel("grad_weight bias / sampling noise")
    _legend_below(fig, axes, columns=4)
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
