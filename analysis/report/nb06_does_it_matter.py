"""Notebook 06 (does a gradient error matter?): its figures, conclusions and README block.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import torch
from matplotlib.axes import Axes

from analysis.core.results_io import load_kind
from analysis.judge.pareto import INTERVAL, seed_interval
from analysis.judge.rule import BIAS_LIMIT, ERROR_LIMIT, checkpoint_bias, peer_table, rule_lines, rule_table, study_rows
from analysis.report.style import PALETTE, CaptionedFigure, apply_style, legend_below, log_axes, new_figure
from analysis.report.wording import _conclusion, _finding, _join, _missing, _range, count_range
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

SOURCE_WORDS = {"cuda": "on one H200 (cuBLAS, torch 2.11)", "cuda-emulated": "on the CUDA layouts emulated on CPU"}
NO_DATA = "No noise-study results yet (`python -m analysis noise`)."


def _policy_at(rows: pd.DataFrame, policy: str, chunks: int, column: str) -> pd.Series:
    """Per (family, dtype): the seed median of ``column`` for ``policy`` at ``chunks``."""
    picked = rows[(rows["policy"] == policy) & (rows["num_chunks"] == chunks) & (rows["layout"] == "cuda")]
    return picked.groupby(["family", "dtype"])[column].median()


def _best_source(noise: pd.DataFrame) -> tuple[str, pd.DataFrame]:
    rows = study_rows(noise)
    device = "cuda" if (rows["device"] == "cuda").any() else "cuda-emulated"
    return device, rows[(rows["device"] == device) & rows["dtype"].isin(["bfloat16", "float16"])]


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


def torch_claim(noise: pd.DataFrame) -> str:
    """06: does compact match balanced on CUDA (torch's reason to drop balanced)?"""
    if noise.empty:
        return _missing(NO_DATA)
    device, rows = _best_source(noise)
    most = int(rows["num_chunks"].max())
    compact = _policy_at(rows, "compact", most, "grad_weight_floors")
    balanced = _policy_at(rows, "balanced", most, "grad_weight_floors")
    one = _policy_at(rows, "compact", 1, "grad_weight_floors")
    bullets = []
    for dtype in ("bfloat16", "float16"):
        c, b = compact.xs(dtype, level="dtype"), balanced.xs(dtype, level="dtype")
        bullets.append(f"{dtype}: compact {_range(one.xs(dtype, level='dtype'))} floors at 1 chunk, "
                       f"{_range(c)} at {most} chunks (per family); balanced {_range(b)} at {most} chunks")
    agreement = emulation_agreement(noise)
    if agreement is not None:
        typical, largest, where = agreement
        bullets.append(f"the CPU emulation of the CUDA layouts (`noise.csv`) reproduces the H200's floors: median "
                       f"relative difference {100 * typical:.2g}% over every policy, chunk count, family and dtype "
                       f"(seed medians, the seeds both ran), largest {100 * largest:.0f}% ({where})")
    if (compact / balanced).min() > 1.5:
        finding = (f"No: {SOURCE_WORDS[device]}, compact's per-chunk `addmm_` into the bf16/fp16 gradient rounds "
                   f"the running sum once per chunk whatever cuBLAS accumulates inside one product, and its "
                   f"weight-gradient error grows with the chunk count to {_range(compact)} floors at {most} chunks, "
                   f"while balanced stays at {_range(balanced)} floors. Torch's premise (compact's bulk precision "
                   f"matches balanced) holds only for a single chunk.")
    else:
        finding = (f"{SOURCE_WORDS[device]}, compact at {most} chunks is {_range(compact)} floors against balanced's "
                   f"{_range(balanced)}: within 1.5x on some family, as torch's premise says.")
    return _conclusion(finding, bullets,
                       inputs=f"families {_join(sorted(rows['family'].unique()))} at N={NOISE_SHAPE.N}, "
                              f"D={NOISE_SHAPE.D}, C={NOISE_SHAPE.C}, {rows['seed'].nunique()} seeds (medians), lce "
                              f"with fp32 acc_dtype and explicit chunk sizes (`python -m analysis noise"
                              f"{' --device cuda' if device == 'cuda' else ''}`).",
                       limits="one shape (D=128; at LLM shapes aspect_ratio:2 gives 64–256 chunks, the range "
                              "measured here); torch's own op was not run on the GPU (torch 2.11 there has none): "
                              "compact is lce's layout with the arithmetic torch documents.")


def error_against_noise(noise: pd.DataFrame) -> str:
    """06: how each policy's error compares with the sampling noise of the same batch."""
    if noise.empty:
        return _missing(NO_DATA)
    device, rows = _best_source(noise)
    most = int(rows["num_chunks"].max())
    bias = {policy: _policy_at(rows, policy, most, "weight_bias_over_noise")
            for policy in ("accurate", "balanced", "compact")}
    error = {policy: _policy_at(rows, policy, most, "weight_error_over_noise")
             for policy in ("accurate", "balanced", "compact")}
    unfused = rows[rows["policy"] == "unfused"].groupby(["family", "dtype"])["weight_bias_over_noise"].median()
    def steps(policy: str) -> str:
        return _range(bias[policy] ** -2, ".2g")

    worst_error = max(s.max() for s in error.values())
    per_step = (f"Per step every policy's error hides in the sampling noise (whole-error/noise at most "
                f"{worst_error:.2g})" if worst_error < 1 else
                f"Some policy's error exceeds one step's sampling noise (whole-error/noise up to {worst_error:.2g})")
    finding = (f"{per_step}; what separates the policies is the error's component along the gradient, a bias: "
               f"compact's is {_range(bias['compact'], '.2g')} times the noise along it at {most} chunks (seed "
               f"medians per family and dtype), so it stands out of the averaged noise after {steps('compact')} "
               f"steps; balanced's is {_range(bias['balanced'], '.2g')} ({steps('balanced')} steps) and "
               f"accurate's {_range(bias['accurate'], '.2g')} ({steps('accurate')} steps); the unfused op in the "
               f"input dtype {_range(unfused, '.2g')}.")
    bullets = [f"{policy} at {most} chunks: bias/noise {_range(bias[policy], '.2g')}, error/noise "
               f"{_range(error[policy], '.2g')}" for policy in ("accurate", "balanced", "compact")]
    return _conclusion(finding, bullets,
                       inputs=f"{SOURCE_WORDS[device]}; families {_join(sorted(rows['family'].unique()))}, bf16 "
                              f"and fp16, N={NOISE_SHAPE.N} rows per batch, {rows['seed'].nunique()} seeds.",
                       limits="the noise is that of one batch of 1024 rows (it shrinks as 1/sqrt(batch): a 16x "
                              "larger batch makes every ratio 4x larger); the input gradient's ratio treats the layers "
                              "below as the identity; the bias→steps reading assumes a steady bias and independent "
                              "noise from step to step.")


def training(table: pd.DataFrame, noise: pd.DataFrame, device: str) -> str:
    """06: the final held-out loss gap of each arm to the fp32 head, beside the seed-to-seed spread."""
    rows = table[(table["device"] == device) & (table["setting"] == "full")]
    if rows.empty:
        return _missing(f"No full training results on {device} yet (`python -m analysis train`).")
    last = final_losses(rows)
    fp32 = last[last["arm"] == ARMS[0].name]["loss"]
    spread = fp32.max() - fp32.min() if len(fp32) > 1 else float("nan")
    gaps = last[(last["arm"] != ARMS[0].name) & last["gap"].notna()]
    if gaps.empty:
        return _missing(f"No finished pair of runs (an arm and the fp32 head of the same seed) on {device} yet.")
    widest = gaps.loc[gaps["gap"].abs().idxmax()]
    bullets = []
    for arm in [a.name for a in ARMS[1:]]:
        arm_gaps = gaps[gaps["arm"] == arm]["gap"]
        if len(arm_gaps):
            bullets.append(f"{arm}: {arm_gaps.mean():+.3f} nats (seeds: {_range(arm_gaps, '+.3f')}; "
                           f"{len(arm_gaps)} seed{'s' if len(arm_gaps) > 1 else ''})")
    compact_bias = checkpoint_bias(noise)
    compact_bias = compact_bias[compact_bias["device"] == ("cuda" if device == "cuda" else "cuda-emulated")]
    steps = int(rows["steps"].max())
    during = (f" Compact's bias/noise (256 chunks, bf16) on the fp32 run's snapshots was "
              f"{_range(compact_bias['median'], '.2g')} (steps {_join([str(int(s)) for s in compact_bias['step']])}), "
              f"above the 1/sqrt(steps) = {steps ** -0.5:.2g} at which a steady bias would stand out by the end of "
              f"the run: the r**-2 reading is conservative at this scale." if not compact_bias.empty else "")
    where = "one H200" if device == "cuda" else f"CPU ({rows['cpu_model'].iloc[0]}, CUDA layouts emulated)"
    spread_text = (f"the fp32 head alone varies by {spread:.3f} nats between seeds" if spread == spread
                   else "one finished fp32 seed, so no seed-to-seed spread yet")
    if spread == spread and abs(widest["gap"]) <= spread:
        finding = (f"No arm can be told from the fp32 head after {steps} steps on {where}: the largest final held-out "
                   f"gap is {widest['gap']:+.3f} nats ({widest['arm']}) while {spread_text}; arms of the same seed "
                   f"drift apart by a few hundredths as soon as any rounding differs.{during}")
    else:
        finding = (f"After {steps} steps on {where} the largest final held-out gap to the fp32 head is "
                   f"{widest['gap']:+.3f} nats ({widest['arm']}); {spread_text}.{during}")
    seeds = rows.groupby("arm")["seed"].nunique()
    return _conclusion(finding, bullets,
                       inputs=f"TinyLM (D=128, 4 layers, C=16384), {int(rows['batch_rows'].max())} tokens per step, "
                              f"{count_range(seeds)} seeds per arm, same initialisation and batches per seed, "
                              f"held-out loss on 2048 tokens in fp32 (`python -m analysis train"
                              f"{' --device cuda' if device == 'cuda' else ''}`).",
                       limits="a small model, a few hundred steps and one vocabulary: a gap below the arm-to-arm "
                              "drift is all such runs can resolve; they say nothing about 10⁴–10⁶ steps at "
                              "128k–256k classes, where compact's bias has far longer to act.")


def rule(noise: pd.DataFrame) -> str:
    """06: the decision rule, each "auto" entry against it, and the peers' picks."""
    if noise.empty:
        return _missing(NO_DATA)
    table = rule_table(noise)
    peers = peer_table(noise)
    failing = peers[~peers["passes"]]
    peer_text = _join([f"{row.rule} in {row.dtype} ({row.policy}, {row.num_chunks} chunks: bias/noise "
                       f"{row.weight_bias_over_noise:.2g} on {row.worst_family})" for row in failing.itertuples()])
    finding = (f"Every \"auto\" entry meets the rule ({int(table['passes'].sum())} of {len(table)}): bias/noise at "
               f"most {BIAS_LIMIT} and error/noise at most {ERROR_LIMIT} on the worst input family. "
               if table["passes"].all() else
               f"{int((~table['passes']).sum())} \"auto\" entries fail the rule. ")
    finding += (f"The peers' CUDA picks that fail it: {peer_text}." if peer_text else "Every peer pick meets it too.")
    return _conclusion(finding, rule_lines(noise),
                       inputs="the noise-study results (real-GPU rows for the CUDA entries where committed, the "
                              "CPU's for the CPU entries), worst family, seed medians.",
                       limits="the limits extrapolate the training study's reading of a bias (r**-2 steps to stand "
                              "out) from 300 to 10⁴ steps; the ratios are at N=1024 rows per batch.")


def readme_does_it_matter(results: Path) -> str:
    """Notebook 06's findings, one bullet each: torch's claim, error against noise, training, the rule."""
    from analysis.core.results_io import NOISE, TRAINING
    from analysis.report import nb06_does_it_matter as matter

    noise, training = (load_kind(results, kind.name)[1] for kind in (NOISE, TRAINING))
    findings = [("Compact against balanced on CUDA", matter.torch_claim(noise)),
                ("Error against sampling noise", matter.error_against_noise(noise)),
                *((f"Training ({'one H200' if device == 'cuda' else 'CPU, emulated CUDA layouts'})",
                   matter.training(training, noise, device)) for device in ("cuda", "cpu")
                  if (training["device"] == device).any()),
                ("The rule", matter.rule(noise))]
    return "\n".join(f"- **{name}.** {_finding(text)}" for name, text in findings) + "\n"
