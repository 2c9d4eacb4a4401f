"""The hf-step study's figure and numbers (``python -m analysis hf-step``), drawn from ``hf_step`` rows only.

:func:`step_numbers` is what the README's generated passage shows and what the README's prose about the
transformers integration quotes; ``tests/claims/test_hf_step.py`` asserts each sentence of that prose on it.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from analysis.core.results_io import HF_STEP, load_kind
from analysis.report.style import CaptionedFigure, apply_style, new_figure
from analysis.report.tables import markdown_table

__all__ = ["latest_run", "step_numbers", "plot_hf_step", "draw_hf_step_figures", "readme_hf_step", "ARM_LABELS"]

ARM_LABELS: dict[str, str] = {
    "unpatched": "unpatched",
    "lce": "patch(model)",
    "lce recommend": 'patch(model, "recommend")',
    "lce recommend budget": "patch(model, Recommended(budget))",
    "liger": "Liger-Kernel's patch",
}
"""How the README and the figure name each arm: the call that made it."""


def latest_run(table: pd.DataFrame, device: str) -> pd.DataFrame:
    """The rows of the latest run on ``device`` (one run: one date and revision), in arm order."""
    rows = table[(table["device"] == device) & (table["status"] == "ok")]
    if rows.empty:
        return rows
    last = rows.sort_values("date").iloc[-1]
    rows = rows[(rows["date"] == last["date"]) & (rows["git_revision"] == last["git_revision"])]
    order = {arm: rank for rank, arm in enumerate(ARM_LABELS)}
    return rows.sort_values("arm", key=lambda arms: arms.map(order)).reset_index(drop=True)


def _options_text(row) -> str:
    if pd.isna(row.policy):
        return "-"
    tiles = "" if pd.isna(row.class_chunk_size) or row.class_chunk_size >= row.vocab else \
        f" x {int(row.class_chunk_size)} classes"
    return f"{row.policy}, acc {row.acc_dtype}, {int(row.batch_chunk_size)} rows{tiles}"


def step_numbers(table: pd.DataFrame, device: str = "cpu") -> pd.DataFrame:
    """Per arm of the latest run on ``device``: the head's options, lce's predicted peak of the head alone (MiB),
    the measured peak of the step (MiB) and its ratio to the unpatched model's, the median time (s), its spread
    over the rounds and its ratio, the measured step's loss and its difference to the unpatched model's."""
    rows = latest_run(table, device)
    return pd.DataFrame({
        "arm": rows["arm"],
        "call": rows["arm"].map(ARM_LABELS),
        "head options": [_options_text(row) for row in rows.itertuples()],
        "head_model_mib": rows["predicted_head_peak_bytes"] / 2**20,
        "peak_mib": rows["measured_peak_bytes"] / 2**20,
        "peak_ratio": rows["peak_ratio"],
        "time_s": rows["time_median_s"],
        "time_spread_s": rows["time_spread_s"],
        "time_ratio": rows["time_ratio"],
        "loss": rows["loss"],
        "loss_diff": rows["loss_diff"],
    })


def plot_hf_step(table: pd.DataFrame, device: str = "cpu") -> CaptionedFigure | None:
    """Left: each arm's measured peak of one training step; right: its median time; both with the ratio to the
    unpatched model written on the bar."""
    rows = latest_run(table, device)
    if rows.empty:
        return None
    numbers = step_numbers(table, device)
    first = rows.iloc[0]
    apply_style()
    fig = new_figure(10.5, 3.8)
    memory, time = fig.subplots(1, 2, sharey=True)
    labels = numbers["call"].tolist()
    for ax, value, ratio, unit in ((memory, numbers["peak_mib"], numbers["peak_ratio"], "MiB"),
                                   (time, numbers["time_s"], numbers["time_ratio"], "s")):
        bars = ax.barh(labels, value, color=["0.45" if arm == "unpatched" else "tab:blue" for arm in numbers["arm"]])
        for bar, number, share in zip(bars, value, ratio, strict=True):
            ax.annotate(f"{number:,.0f} {unit}  ({share:.2f}x)" if unit == "MiB" else f"{number:.1f} {unit}  "
                        f"({share:.2f}x)", (bar.get_width(), bar.get_y() + bar.get_height() / 2), xytext=(3, 0),
                        textcoords="offset points", va="center", fontsize=7)
        ax.set_xlim(0, value.max() * 1.45)
    logits = first["logits_bytes"] / 2**20
    memory.axvline(logits, color="tab:red", lw=0.8, ls="--", label=f"fp32 logits ({logits:,.0f} MiB)")
    memory.legend(fontsize=7, loc="lower right")
    memory.invert_yaxis()
    memory.set_xlabel("peak memory of one step beyond parameters and optimizer state (MiB)")
    time.set_xlabel(f"median time of one step over {int(first['rounds'])} rounds (s)")
    memory.set_title("Peak memory")
    time.set_title("Time")
    where = first["device_name"] if device == "cuda" else f"CPU {first['cpu_model']}, {first['num_threads']} threads"
    caption = (f"One training step (forward, backward, {first['optimizer']}) of a transformers LlamaForCausalLM with a "
               f"{first['layers']}-layer, {first['hidden']}-wide trunk and {first['vocab']:,} classes, fp32 parameters "
               f"under {first['compute_dtype']} autocast, {first['tokens']:,} tokens, on {where}: unpatched and "
               "patched by lce.integrations.transformers (default options; options='recommend'; lce.recommend under "
               f"{_budget_text(rows)}), each arm in a fresh process per round, rounds alternating. Ratios to the "
               f"unpatched model in parentheses. {first['date'][:10]}, revision {first['git_revision']} "
               "(analysis/results/hf_step.csv).")
    stem = "hf_step" if device == "cpu" else f"hf_step_{device}"
    return CaptionedFigure(fig, stem, caption)


def _budget_text(rows: pd.DataFrame) -> str:
    budget = rows["budget_bytes"].dropna()
    return f"a {budget.iloc[0] / 2**20:,.0f} MiB budget for the head" if len(budget) else "a budget"


def draw_hf_step_figures(table: pd.DataFrame) -> list[CaptionedFigure]:
    """The CPU figure and, where a GPU run is committed, the GPU's."""
    if table.empty:
        return []
    figures = [plot_hf_step(table, device) for device in ("cpu", "cuda")]
    return [figure for figure in figures if figure is not None]


def readme_hf_step(results: Path) -> str:
    """The README's generated passage: the latest CPU run's table, and where and how it was measured."""
    table = load_kind(results, HF_STEP.name)[1]
    numbers = step_numbers(table, "cpu") if not table.empty else pd.DataFrame()
    if numbers.empty:
        return "(no hf-step study yet: run `python -m analysis hf-step`)\n"
    row = latest_run(table, "cpu").iloc[0]
    shown = numbers.drop(columns=["arm", "loss"]).rename(columns={
        "head_model_mib": "head alone, lce.plan (MiB)", "peak_mib": "step's peak (MiB)",
        "peak_ratio": "peak / unpatched", "time_s": "time (s)", "time_spread_s": "spread (s)",
        "time_ratio": "time / unpatched", "loss_diff": "loss - unpatched (nats)"})
    return "\n".join([
        f"- LlamaForCausalLM, {row['layers']} layers x {row['hidden']} wide, {row['vocab']:,} classes, fp32 "
        f"parameters under {row['compute_dtype']} autocast, {row['optimizer']}, {row['batch']} x {row['seq_len']} = "
        f"{row['tokens']:,} tokens per step; CPU {row['cpu_model']} ({row['num_threads']} threads), "
        f"{row['date'][:10]}, revision {row['git_revision']}; a fresh process per arm and round, {row['rounds']} "
        "alternating rounds",
        "",
        markdown_table(shown, {"head alone, lce.plan (MiB)": "{:,.0f}", "step's peak (MiB)": "{:,.0f}",
                               "peak / unpatched": "{:.2f}", "time (s)": "{:.1f}", "spread (s)": "{:.1f}",
                               "time / unpatched": "{:.2f}", "loss - unpatched (nats)": "{:+.1e}"}),
        "Spread: the largest minus the smallest round's time; peaks beyond the parameters and AdamW's state, "
        "measured in the first round.", ""])
