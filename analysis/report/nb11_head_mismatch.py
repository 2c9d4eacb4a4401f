"""Notebook 11's section on which trainer head matches which inference head (issue 51): the pair table, the
heatmap, the batch component and the README sentence, from ``head_mismatch.csv`` and ``head_batch.csv``
(``python -m analysis head-mismatch``). Nothing here measures.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from analysis.report.style import CaptionedFigure, apply_style, new_figure
from analysis.report.tables import markdown_table

__all__ = ["TRAINER_ORDER", "INFERENCE_ORDER", "LOGITS_GRID", "MASKS", "QWEN_CLASSES", "wilson", "pair_summary",
           "PROSE_NAMES", "pairing", "pair_table", "batch_summary", "batch_table", "inputs_line", "best_pairs",
           "mixed_pairs", "join_names", "prose_names",
           "plot_head_mismatch", "draw_head_mismatch_figures", "headline", "readme_rl_head_mismatch"]

TRAINER_ORDER = ("trl", "trl cast_lm_head_to_fp32", "liger-style bf16 chunks", "materialized", "lce auto cuda",
                 "lce auto cpu", "lce compact cuda")
INFERENCE_ORDER = ("vllm default", "vllm head_dtype=float32", "fp16")
LOGITS_GRID = {"trl": "bf16", "liger-style bf16 chunks": "bf16", "lce compact cuda": "bf16",
               "materialized": "bf16, bf16 log-softmax", "trl cast_lm_head_to_fp32": "fp32", "lce auto cuda": "fp32",
               "lce auto cpu": "fp32", "vllm default": "bf16", "vllm head_dtype=float32": "fp32", "fp16": "fp16"}
"""What each head rounds its logits to before its statistics (what it computes: analysis.studies.head_mismatch);
the materialized loop's statistics are bf16 too. Two heads on the same grid are a matching pair by construction,
two on different grids a mixed one: the data says what each costs."""
PROSE_NAMES = {"trl": "TRL 1.16's default fused head", "trl cast_lm_head_to_fp32": "TRL with `cast_lm_head_to_fp32`",
               "liger-style bf16 chunks": "a Liger-style chunked head", "materialized": "the materialized bf16 loop",
               "lce auto cuda": "lce's default (CUDA layouts)", "lce auto cpu": "lce's default (CPU layouts)",
               "lce compact cuda": "lce's `acc_policy=\"compact\"`", "vllm default": "vLLM's default head",
               "vllm head_dtype=float32": "vLLM's `head_dtype=float32` head", "fp16": "an fp16 engine"}
"""How the README's sentence names each head."""


def pairing(trainer: str, inference: str) -> str:
    """The class of a pair by the grids its heads round the logits to (:data:`LOGITS_GRID`): ``same grid``,
    ``materialized`` (the bf16 loop, whose statistics round too), or ``<grid> against <grid>`` (``bf16 against
    fp32``, ``fp16 against fp32``, ``bf16 against fp16``)."""
    grids = LOGITS_GRID.get(trainer), LOGITS_GRID.get(inference)
    if grids[0] == grids[1]:
        return "same grid"
    if trainer == "materialized":
        return "materialized"
    order = ("bf16", "fp16", "fp32")
    first, second = sorted(grids, key=lambda g: order.index(g) if g in order else len(order))
    return f"{first} against {second}"


MASKS = {"masked_trl_default": "TRL default (ratio > 3)", "masked_trl_two_sided": "TRL, [1/3, 3]",
         "masked_nemo_rl_2": "NeMo-RL 2.0"}
"""The sequence masks of the study (analysis.studies.head_mismatch.SEQUENCE_MASKS), as the tables name them."""
QWEN_CLASSES = 151936
Z95 = 1.959963984540054
"""The standard normal's 97.5th percentile: the Wilson interval's 95%."""


def wilson(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of a share of ``k`` out of ``n`` (95% by default); (0, 1) when ``n`` is 0."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def _sort(frame: pd.DataFrame) -> pd.DataFrame:
    trainer = {label: i for i, label in enumerate(TRAINER_ORDER)}
    inference = {label: i for i, label in enumerate(INFERENCE_ORDER)}
    return frame.assign(_t=frame["trainer"].map(trainer), _i=frame["inference"].map(inference)).sort_values(
        ["family", "_t", "_i"], ignore_index=True).drop(columns=["_t", "_i"])


def pair_summary(table: pd.DataFrame) -> pd.DataFrame:
    """Per family, trainer head and inference head, over every item (batch sizes, temperatures, seeds): the RMS
    log-ratio's median and range, the median and worst p99 of |ratio - 1| and the worst token, the median mean
    log-ratio and bit-for-bit share, the sequences (consecutive 512-token blocks, pooled over the items) each mask
    drops with their Wilson 95% interval, the largest sequence log-ratio and NeMo-RL statistic, each side's median
    RMS error against fp64, and whether the two heads round to the same grid (:data:`LOGITS_GRID`)."""
    out = []
    for (family, trainer, inference), group in table.groupby(["family", "trainer", "inference"], sort=False):
        row = {"family": family, "trainer": trainer, "inference": inference, "items": len(group),
               "batches": ", ".join(str(n) for n in sorted(group["N"].unique())),
               "seeds": group["seed"].nunique(), "temperatures": group["temperature"].nunique(),
               "rms": float(group["rms_nats"].median()), "rms_low": float(group["rms_nats"].min()),
               "rms_high": float(group["rms_nats"].max()), "mean_delta": float(group["mean_delta"].median()),
               "ratio_p99": float(group["ratio_err_p99"].median()),
               "ratio_p99_high": float(group["ratio_err_p99"].max()), "ratio_max": float(group["ratio_err_max"].max()),
               "bitwise": float(group["bitwise_equal_share"].median()), "sequences": int(group["sequences"].sum()),
               "seq_log_ratio_max": float(group["seq_log_ratio_max"].max()),
               "seq_mult_prob_error_max": float(group["seq_mult_prob_error_max"].max()),
               "trainer_rms_exact": float(group["trainer_rms_exact"].median()),
               "inference_rms_exact": float(group["inference_rms_exact"].median()),
               "same_grid": LOGITS_GRID.get(trainer) == LOGITS_GRID.get(inference),
               "pairing": pairing(trainer, inference)}
        for mask in MASKS:
            dropped = int(group[mask].sum())
            low, high = wilson(dropped, row["sequences"])
            row.update({mask: dropped, f"{mask}_share": dropped / row["sequences"] if row["sequences"] else math.nan,
                        f"{mask}_low": low, f"{mask}_high": high})
        out.append(row)
    summary = pd.DataFrame(out)
    return _sort(summary) if not summary.empty else summary


def _share(r, mask: str) -> str:
    share, low, high = getattr(r, f"{mask}_share"), getattr(r, f"{mask}_low"), getattr(r, f"{mask}_high")
    return f"{getattr(r, mask)}/{r.sequences} = {share:.0%} ({low:.0%}–{high:.0%})"


def pair_table(table: pd.DataFrame, family: str) -> pd.DataFrame:
    """The pair table of ``family`` as printed: per trainer and inference head the RMS log-ratio (median, range over
    the items), the p99 of |ratio - 1| (median), the sequences each mask drops (count, share, Wilson 95%), and each
    side's RMS error against fp64."""
    summary = pair_summary(table)
    summary = summary[summary["family"] == family]
    return pd.DataFrame({
        "trainer": summary["trainer"], "inference": summary["inference"],
        "RMS nats (range)": [f"{r.rms:.1e} ({r.rms_low:.0e}–{r.rms_high:.0e})" for r in summary.itertuples()],
        "p99 of abs(ratio − 1)": [f"{v:.1e}" for v in summary["ratio_p99"]],
        **{f"dropped: {name}": [_share(r, mask) for r in summary.itertuples()] for mask, name in MASKS.items()},
        "trainer vs fp64 (RMS)": [f"{v:.0e}" for v in summary["trainer_rms_exact"]],
        "engine vs fp64 (RMS)": [f"{v:.0e}" for v in summary["inference_rms_exact"]]})


def batch_summary(batch: pd.DataFrame) -> pd.DataFrame:
    """Per family, batch, head and leading-rows count, over the seeds: the largest and RMS difference between the
    rows scored alone and inside the batch (worst seed), and whether every seed gave the same bits."""
    if batch.empty:
        return batch
    out = batch.groupby(["family", "N", "side", "head", "gemms", "rows"], sort=False).agg(
        seeds=("seed", "nunique"), max_abs_diff=("max_abs_diff", "max"), rms_diff=("rms_diff", "max"),
        bitwise_equal=("bitwise_equal", "all")).reset_index()
    order = {label: i for i, label in enumerate((*TRAINER_ORDER, *INFERENCE_ORDER))}
    return out.assign(_h=out["head"].map(order)).sort_values(["family", "_h", "rows"], ascending=[True, True, False],
                                                             ignore_index=True).drop(columns="_h")


def batch_table(batch: pd.DataFrame) -> pd.DataFrame:
    """:func:`batch_summary` as printed, one row per family and head, the two leading-rows counts side by side."""
    summary = batch_summary(batch)
    rows = []
    for (family, n, side, head, gemms), group in summary.groupby(["family", "N", "side", "head", "gemms"],
                                                                 sort=False):
        row = {"family": f"{family} ({n} rows)", "head": head, "side": side, "GEMMs here": gemms}
        for r in group.itertuples():
            row[f"first {r.rows}: same bits"] = bool(r.bitwise_equal)
            row[f"first {r.rows}: max |diff|"] = f"{r.max_abs_diff:.1e}"
        rows.append(row)
    return pd.DataFrame(rows)


def inputs_line(table: pd.DataFrame) -> str:
    """What the study ran on."""
    cases = ", ".join(f"{family} {' and '.join(str(n) for n in sorted(g['N'].unique()))} x {int(g['D'].iloc[0])} x "
                      f"{int(g['C'].iloc[0]):,}" for family, g in table.groupby("family", sort=True))
    first = table.iloc[0]
    temperatures = ", ".join(f"{t:g}" for t in sorted(table["temperature"].unique()))
    return (f"{cases}; {first['dtype']} inputs shared by both sides; targets sampled from the exact tempered softmax; "
            f"T = {temperatures}; {table['seed'].nunique()} seeds; sequences of {int(first['sequence_tokens'])} "
            f"tokens; {first['cpu_model']} ({first['cpu_gemms']}), torch {first['torch_version']} "
            f"(`python -m analysis head-mismatch`)")


def best_pairs(table: pd.DataFrame, family: str = "calibrated") -> pd.DataFrame:
    """The pairs of ``family`` that both match each other and the exact policy: the smallest worst of the RMS
    log-ratio and either side's RMS error against fp64 (``score``), and every pair within twice it."""
    summary = pair_summary(table)
    summary = summary[summary["family"] == family]
    score = summary[["rms", "trainer_rms_exact", "inference_rms_exact"]].max(axis=1)
    return summary.assign(score=score)[score <= 2 * score.min()]


def mixed_pairs(table: pd.DataFrame, family: str = "calibrated", kind: str = "bf16 against fp32") -> pd.DataFrame:
    """The pairs of ``family`` of one :func:`pairing` class (default: bf16 logits on one side, fp32 on the other)."""
    summary = pair_summary(table)
    return summary[(summary["family"] == family) & (summary["pairing"] == kind)]


# ---- figure -------------------------------------------------------------------------------------------------------

def plot_head_mismatch(table: pd.DataFrame) -> CaptionedFigure | None:
    """One heatmap per family: trainer heads down, inference heads across, the colour the median RMS log-ratio
    (log scale), each cell's text that RMS and the share of 512-token sequences TRL's default mask drops."""
    summary = pair_summary(table)
    if summary.empty:
        return None
    from matplotlib.colors import LogNorm

    apply_style()
    families = [f for f in ("calibrated", "trained") if f in set(summary["family"])]
    fig = new_figure(4.6 * len(families) + 0.8, 4.4)
    axes = np.atleast_1d(fig.subplots(1, len(families), sharey=True))
    low = max(summary["rms"].min(), 1e-8)
    norm = LogNorm(vmin=low, vmax=max(summary["rms"].max(), 10 * low))
    image = None
    for ax, family in zip(axes, families, strict=True):
        here = summary[summary["family"] == family]
        grid = here.pivot(index="trainer", columns="inference", values="rms").reindex(
            index=[t for t in TRAINER_ORDER if t in set(here["trainer"])],
            columns=[i for i in INFERENCE_ORDER if i in set(here["inference"])])
        shares = here.set_index(["trainer", "inference"])["masked_trl_default_share"]
        image = ax.imshow(grid.to_numpy().clip(min=low), norm=norm, cmap="magma_r", aspect="auto")
        for i, trainer in enumerate(grid.index):
            for j, inference in enumerate(grid.columns):
                value = grid.iloc[i, j]
                share = shares.loc[(trainer, inference)]
                ax.text(j, i, f"{value:.1e}\n{share:.0%} dropped", ha="center", va="center", fontsize=6.5,
                        color="white" if norm(max(value, low)) > 0.55 else "black")
        ax.set_xticks(range(len(grid.columns)), [c.replace(" head_dtype", "\nhead_dtype") for c in grid.columns],
                      fontsize=7)
        ax.set_yticks(range(len(grid.index)), grid.index, fontsize=7)
        ax.grid(False)
        shape = here["batches"].iloc[0]
        first = table[table["family"] == family].iloc[0]
        ax.set_title(f"{family}: {shape} x {int(first['D'])} x {int(first['C']):,}", fontsize=8)
        ax.set_xlabel("inference head (engine)")
    axes[0].set_ylabel("trainer head")
    fig.colorbar(image, ax=list(axes), label="RMS of log π_trainer − log π_infer (nats)", shrink=0.8)
    same = summary.loc[summary["same_grid"], "rms_high"].max()
    bf16_fp32 = summary.loc[summary["pairing"] == "bf16 against fp32", "rms"].median()
    caption = (f"Which trainer head matches which inference head: the RMS over tokens of log π_trainer − log π_infer "
               f"in nats (colour and first number: median over batch sizes, temperatures and seeds) and the share of "
               f"512-token sequences that TRL 1.16's default sequence mask (importance ratio above 3) drops (second "
               f"number, pooled), on the same bf16 hidden states and head weight ({inputs_line(table)}). Pairs whose "
               f"heads round the logits to the same grid agree to {same:.0e} nats at most; bf16 logits on one side "
               f"and fp32 on the other differ by {bf16_fp32:.3f} nats (median).")
    return CaptionedFigure(fig, "rl_head_mismatch", caption)


def draw_head_mismatch_figures(table: pd.DataFrame) -> list[CaptionedFigure]:
    figure = plot_head_mismatch(table) if not table.empty else None
    return [figure] if figure is not None else []


# ---- README -------------------------------------------------------------------------------------------------------

def join_names(labels) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    labels = list(labels)
    return labels[0] if len(labels) == 1 else ", ".join(labels[:-1]) + " and " + labels[-1]


def prose_names(labels) -> str:
    """The heads as the README names them (:data:`PROSE_NAMES`), lce's two default layouts as one."""
    labels = list(dict.fromkeys(labels))
    names = dict(PROSE_NAMES)
    if {"lce auto cuda", "lce auto cpu"} <= set(labels):
        labels.remove("lce auto cpu")
        names["lce auto cuda"] = "lce's default (either layout)"
    return join_names(names.get(label, label) for label in labels)


def headline(table: pd.DataFrame, family: str = "calibrated") -> str:
    """The README's sentence: at the Qwen-size head, the pair to use (matching each other and fp64), the bf16 pairs
    that match each other but not fp64, and what a pair with bf16 logits on one side and fp32 on the other costs
    (RMS, p99 ratio error, sequences TRL's default mask drops)."""
    best = best_pairs(table, family)
    summary = pair_summary(table)
    summary = summary[summary["family"] == family]
    bf16 = summary[summary["same_grid"] & (summary["inference"] == "vllm default")]
    mixed = mixed_pairs(table, family)
    first = table[table["family"] == family].iloc[0]
    dropped, sequences = int(mixed["masked_trl_default"].sum()), int(mixed["sequences"].sum())
    _, high = wilson(dropped, sequences)
    own = best[["trainer_rms_exact", "inference_rms_exact"]].max().max()
    return (f"At a {int(first['C']):,}-class head (D = {int(first['D'])}, the same bf16 hidden states and weight on "
            f"both sides), the pair to use is {prose_names(best['trainer'])} with "
            f"{prose_names(best['inference'])}: they agree to {best['rms'].max():.0e} nats RMS and each side is "
            f"within {own:.0e} nats of fp64. {prose_names(bf16['trainer'])} match vLLM's default bf16 head as "
            f"closely ({bf16['rms'].max():.0e} nats), but both sides then sit "
            f"{bf16['trainer_rms_exact'].median():.3f} nats from fp64. Pairing bf16 logits on one side with fp32 "
            f"on the other costs {mixed['rms'].median():.3f} nats RMS ({mixed['rms_low'].min():.3f}–"
            f"{mixed['rms_high'].max():.3f} over temperatures, seeds and batch sizes) and |ratio − 1| up to "
            f"{mixed['ratio_p99'].max():.1%} at the 99th percentile of the sampled tokens; TRL's default sequence "
            f"mask drops {dropped} of those pairs' {sequences} sequences of 512 tokens (95% up to {high:.1%}).")


def readme_rl_head_mismatch(results) -> str:
    """The "rl-head-mismatch" block (docs/using-lce.md's TRL section): the headline sentence and the pair table of
    the Qwen-size head."""
    from analysis.core.results_io import HEAD_MISMATCH, load_kind

    _, table = load_kind(results, HEAD_MISMATCH.name)
    if table.empty or "calibrated" not in set(table["family"]):
        return "The head-mismatch study has not been run yet (`python -m analysis head-mismatch`).\n"
    return (f"{headline(table)}\n\nPer pair ({inputs_line(table)}), at the Qwen-size head:\n\n"
            f"{markdown_table(pair_table(table, 'calibrated'))}\n")
