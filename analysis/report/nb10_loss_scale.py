"""Notebook 10's loss-scale section (fp16 gradients under a loss scale, issue 31): the per-arm comparison with the
unfused autocast reference, its figure and the README block, from ``loss_scale.csv.gz`` (``python -m analysis
loss-scale``). Nothing here measures.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.report.style import CaptionedFigure, apply_style, new_figure
from analysis.report.tables import markdown_table

__all__ = ["REFERENCE", "TORCH_DEFAULT", "against_reference", "arm_verdicts", "plot_lost_entries",
           "readme_loss_scale", "inputs_line"]

REFERENCE, TORCH_DEFAULT = "unfused autocast", "torch default"
"""The ``impl`` labels of the baseline (the unfused op under fp16 autocast) and torch 2.13's own op."""

_KEYS = ["N", "D", "C", "seed", "scale_log2", "gradient"]


def against_reference(table: pd.DataFrame) -> pd.DataFrame:
    """lce's rows (and torch's), each beside the reference's row of the same problem, seed, scale and gradient:
    ``extra_lost`` (entries lost beyond the reference's), ``extra_lost_fraction`` (of the eligible entries) and
    ``floor_ratio`` (floors over the reference's; NaN where a gradient is not finite)."""
    reference = table[table["impl"] == REFERENCE].set_index(_KEYS)[["lost", "floors"]]
    reference = reference.rename(columns={"lost": "reference_lost", "floors": "reference_floors"})
    rows = table[table["impl"] != REFERENCE].join(reference, on=_KEYS)
    return rows.assign(extra_lost=rows["lost"] - rows["reference_lost"],
                       extra_lost_fraction=(rows["lost"] - rows["reference_lost"]) / rows["eligible"],
                       floor_ratio=rows["floors"] / rows["reference_floors"])


def _arm(row) -> str:
    """The contender without its before/after, "auto" with the policy it resolved to (the auto table may change
    between the two)."""
    arm = row["impl"].removesuffix(" before").removesuffix(" after")
    return f"{arm} ({row['resolved_policy']})" if row["policy"] == "auto" else arm


def arm_verdicts(table: pd.DataFrame) -> pd.DataFrame:
    """Per lce arm and ``headroom`` (before/after), over every shape, seed and scale: the most entries lost beyond
    the reference (weight and input gradients, as a fraction of the eligible entries), whether it never lost more,
    and the range of its weight- and input-gradient floors over the reference's."""
    rows = against_reference(table)
    rows = rows[rows["op"] == "lce"].assign(arm=lambda r: r.apply(_arm, axis=1))
    out = []
    for (arm, when), group in rows.groupby(["arm", "headroom"], sort=False):
        record = {"arm": arm, "headroom": when, "problems": group[["N", "C", "seed"]].drop_duplicates().shape[0]}
        for gradient in ("weight", "input", "bias"):
            here = group[group["gradient"] == gradient]
            record[f"{gradient}_never_more"] = bool((here["extra_lost"] <= 0).all())
            record[f"{gradient}_extra_lost_fraction"] = float(here["extra_lost_fraction"].max())
            record[f"{gradient}_lost_max"] = int(here["lost"].max())
            record[f"{gradient}_floor_ratio_low"] = float(here["floor_ratio"].min())
            record[f"{gradient}_floor_ratio_high"] = float(here["floor_ratio"].max())
        out.append(record)
    return pd.DataFrame(out)


def inputs_line(table: pd.DataFrame) -> str:
    """What the study ran on: family, shapes with their seeds, scales, reduction, CPU and torch."""
    shapes = (table.groupby(["N", "D", "C"])["seed"].nunique().reset_index()
              .sort_values(["N", "C"]).itertuples(index=False))
    listed = ", ".join(f"{n}x{d}x{c} ({seeds} seed{'s' if seeds > 1 else ''})" for n, d, c, seeds in shapes)
    scales = ", ".join(f"2^{s}" for s in sorted(table["scale_log2"].unique()))
    first = table.iloc[0]
    return (f"{first['family']} family, {first['dtype']}, reduction \"mean\", N x D x C = {listed}; loss scales "
            f"{scales}; {first['cpu_model']}, torch {first['torch_version']}, CUDA layouts emulated on the CPU "
            f"(`python -m analysis loss-scale`)")


def plot_lost_entries(table: pd.DataFrame) -> CaptionedFigure | None:
    """Weight-gradient entries lost to fp16's subnormal range per lce arm, before and after lce.passes.headroom, at the
    largest shape, one panel per scale, with the reference's count as a line."""
    if table.empty:
        return None
    rows = table[table["gradient"] == "weight"]
    largest = rows.sort_values(["N", "C"]).iloc[-1]
    rows = rows[(rows["N"] == largest["N"]) & (rows["C"] == largest["C"])]
    lce_rows = rows[rows["op"] == "lce"].assign(arm=lambda r: r.apply(_arm, axis=1))
    arms = list(dict.fromkeys(lce_rows["arm"]))
    scales = sorted(rows["scale_log2"].unique())
    apply_style()
    fig = new_figure(12.0, 3.8)
    axes = fig.subplots(1, len(scales), sharey=True)
    positions = np.arange(len(arms))
    for ax, scale in zip(np.atleast_1d(axes), scales, strict=True):
        here = lce_rows[lce_rows["scale_log2"] == scale]
        for offset, when, colour in ((-0.2, "before", "tab:red"), (0.2, "after", "tab:blue")):
            counts = here[here["headroom"] == when].groupby("arm")["lost"].max().reindex(arms)
            ax.bar(positions + offset, counts.clip(lower=0.5), width=0.4, color=colour, label=f"lce {when}")
        reference = rows[(rows["impl"] == REFERENCE) & (rows["scale_log2"] == scale)]["lost"].max()
        ax.axhline(reference, color="k", lw=1.0, ls="--", label=f"unfused autocast ({reference:,})")
        ax.set_yscale("log")
        ax.set_xticks(positions, [arm.removeprefix("lce ") for arm in arms], rotation=70, fontsize=6, ha="right")
        ax.set_title(f"loss scale 2^{scale}", fontsize=8)
        ax.legend(fontsize=6, loc="upper right")
    np.atleast_1d(axes)[0].set_ylabel("weight-gradient entries lost (max over seeds)")
    caption = (f"Weight-gradient entries that fp16 loses to its subnormal range under a loss scale (zero or "
               f"subnormal where fp64 times the scale is a normal fp16 number), at {int(largest['N'])}x"
               f"{int(largest['D'])}x{int(largest['C'])}, {inputs_line(table)}. Red: lce's arithmetic before "
               f"lce.passes.headroom (the gradients formed at their true size in fp16 and the scale applied after); "
               f"blue: "
               f"after. Dashed: the unfused op under fp16 autocast with the same scale. Bars below 1 are drawn at "
               f"0.5 (none lost).")
    return CaptionedFigure(fig, "loss_scale_lost_entries", caption)


def readme_loss_scale(results) -> str:
    """The README's "loss-scale" block: per lce arm, before and after the headroom, the entries lost against the
    reference and the floors over the reference's."""
    from analysis.core.results_io import LOSS_SCALE, load_kind

    _, table = load_kind(results, LOSS_SCALE.name)
    if table.empty:
        return "The loss-scale study has not been run yet (`python -m analysis loss-scale`).\n"
    verdicts = arm_verdicts(table)

    def ratio(row, gradient):
        return f"{row[f'{gradient}_floor_ratio_low']:.2f}–{row[f'{gradient}_floor_ratio_high']:.2f}"

    def lost(row, gradient):
        mark = "✓" if row[f"{gradient}_never_more"] else "✗"
        return f"{mark} ({100 * row[f'{gradient}_extra_lost_fraction']:+.3f}%)"

    out = pd.DataFrame({
        "arm": verdicts["arm"], "headroom": verdicts["headroom"],
        "weight: never loses more than the reference (worst excess)": [lost(r, "weight")
                                                                       for _, r in verdicts.iterrows()],
        "input: never loses more (worst excess)": [lost(r, "input") for _, r in verdicts.iterrows()],
        "weight floors / reference's": [ratio(r, "weight") for _, r in verdicts.iterrows()],
        "input floors / reference's": [ratio(r, "input") for _, r in verdicts.iterrows()]})
    torch_rows = table[table["impl"] == TORCH_DEFAULT]
    overflow = sorted(torch_rows[~torch_rows["finite"].astype(bool)]["scale_log2"].unique())
    torch_line = ("" if torch_rows.empty else
                  f" torch 2.13's own op (its default options, an fp16 loss) returns inf gradients at "
                  f"{', '.join(f'2^{s}' for s in overflow) or 'no scale'}.")
    return (f"Loss-scale study ({inputs_line(table)}): per lce arm, over every shape, seed and scale, whether it "
            f"loses more weight- or input-gradient entries to fp16's subnormal range than the unfused op under fp16 "
            f"autocast (worst excess as a share of the eligible entries), and its floors over the reference's."
            f"{torch_line}\n\n{markdown_table(out)}")
