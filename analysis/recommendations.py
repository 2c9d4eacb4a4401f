"""What ``lce.recommend`` answers at LLM heads (predictions), and what the budgets study measured.

The tables here feed the README's generated passages and notebook 07. At LLM
heads nothing is measured: every number is a prediction of lce's memory and
error models, and is labelled so.
"""

from __future__ import annotations

import math

import pandas as pd
import torch

import lce
from lce.recommend import DEFAULT_MAX_ERROR, candidates

from .decision import LLM_SHAPES
from .inputs import Shape
from .plots_budgets import BUDGET_TOLERANCE

__all__ = ["CCE_SHAPE", "CCE_REPORTED_MB", "LLM_BUDGET_MULTIPLES", "llm_recommendations", "cce_anchor",
           "recommend_markdown", "budgets_markdown"]

CCE_SHAPE = Shape(8192, 2304, 256000)
CCE_REPORTED_MB = 1164
"""Cut Cross-Entropy's reported memory at CCE_SHAPE (bf16), against a lower bound of 1161 MB: the gradients."""
LLM_BUDGET_MULTIPLES: tuple[float | None, ...] = (None, 1.2, 1.05)
"""Budgets of the LLM table: recommend's default (lce auto's peak), then multiples of the bf16 gradients."""


def _gradient_bytes(shape: Shape, dtype: torch.dtype) -> int:
    return (shape.N + shape.C) * shape.D * dtype.itemsize


def llm_recommendations(dtype: torch.dtype = torch.bfloat16, devices: tuple[str, ...] = ("cuda", "cpu"),
                        multiples: tuple[float | None, ...] = LLM_BUDGET_MULTIPLES) -> pd.DataFrame:
    """recommend's pick per LLM head, device and budget: options, predicted peak and errors (all predictions).

    Where the default error limit cannot be met within a budget, the row holds the least predicted error that
    fits and ``default_limit_met`` is False.
    """
    rows = []
    for shape in LLM_SHAPES:
        for device in devices:
            for multiple in multiples:
                budget = None if multiple is None else int(multiple * _gradient_bytes(shape, dtype))
                chosen = lce.recommend(shape.N, shape.D, shape.C, dtype, device, memory_budget=budget)
                met = chosen.limit_met
                rows.append(dict(shape=str(shape), device=device,
                                 budget="auto's peak" if multiple is None else f"{multiple:g}x gradients",
                                 budget_gib=chosen.memory_budget / 2**30, choice=chosen.chosen.label(),
                                 peak_gib=chosen.peak_bytes / 2**30, grad_input_floors=chosen.errors["grad_input"],
                                 grad_weight_floors=chosen.errors["grad_weight"], default_limit_met=met,
                                 estimated_s=chosen.chosen.seconds, status="prediction"))
    return pd.DataFrame(rows)


def cce_anchor(dtype: torch.dtype = torch.bfloat16) -> dict[str, float]:
    """At Cut Cross-Entropy's benchmark shape (CUDA layouts): the gradients' MiB, the smallest peak any
    candidate reaches, and the smallest peak meeting the default error limit, with its predicted error."""
    shape = CCE_SHAPE
    pool = candidates(shape.N, shape.D, shape.C, dtype, torch.device("cuda"))
    limit = DEFAULT_MAX_ERROR.get(dtype, math.inf)
    smallest = min(pool, key=lambda c: c.peak_bytes)
    accurate_enough = min((c for c in pool if c.error <= limit), key=lambda c: c.peak_bytes)
    return dict(gradients_mib=_gradient_bytes(shape, dtype) / 2**20, smallest_mib=smallest.peak_bytes / 2**20,
                smallest_label=smallest.label(),
                within_limit_mib=accurate_enough.peak_bytes / 2**20, within_limit_label=accurate_enough.label(),
                within_limit_error=accurate_enough.error, limit=limit)


def recommend_markdown() -> str:
    """The README passage: recommend's picks at LLM heads (bf16, predictions) and the CCE anchor."""
    table = llm_recommendations()
    lines = ["| head (N x D x C) | device | budget | recommended | predicted peak | predicted floors (input, weight) |",
             "|---|---|---|---|---|---|"]
    for row in table.itertuples():
        limit = "" if row.default_limit_met else " (default limit unmet: least error shown)"
        lines.append(f"| {row.shape} | {row.device} | {row.budget} ({row.budget_gib:.2f} GiB) | {row.choice} | "
                     f"{row.peak_gib:.2f} GiB | {row.grad_input_floors:.2f}, {row.grad_weight_floors:.2f}{limit} |")
    anchor = cce_anchor()
    lines += ["", f"All of the table is predicted by lce's memory and error models (nothing at these shapes ran "
              f"here). At Cut Cross-Entropy's benchmark shape ({CCE_SHAPE}, bf16) the gradients alone take "
              f"{anchor['gradients_mib']:,.0f} MiB (CCE reports {CCE_REPORTED_MB} MB); lce's smallest predicted "
              f"peak is {anchor['smallest_mib']:,.1f} MiB ({anchor['smallest_label']}, impractically slow), and "
              f"the smallest within the default error limit ({anchor['limit']:g} floors) is "
              f"{anchor['within_limit_mib']:,.1f} MiB ({anchor['within_limit_label']}, "
              f"{anchor['within_limit_error']:.2f} floors predicted)."]
    return "\n".join(lines) + "\n"


def budgets_markdown(budgets: pd.DataFrame, tiling: pd.DataFrame) -> str:
    """The README passage: measured peak over budget and errors of the budgets study, and class tiling's cost."""
    if budgets.empty:
        return "(no budgets study yet: run `python -m analysis budgets`)\n"
    ratio = budgets["measured_peak_bytes"] / budgets["budget_bytes"]
    model = budgets["measured_peak_bytes"] / budgets["predicted_peak_bytes"]
    worst = budgets.loc[ratio.idxmax()]
    cpu = budgets["cpu_model"].iloc[0]
    text = [f"Measured (CPU: {cpu}; bf16, {budgets['family'].iloc[0]} inputs, {len(budgets)} budgets over "
            f"{budgets[['N', 'D', 'C']].drop_duplicates().shape[0]} shapes, a fresh process each): the recommended "
            f"options' peak was {ratio.min():.2f}-{ratio.max():.2f}x the budget (limit {BUDGET_TOLERANCE:g}x; "
            f"largest at {worst.N}x{worst.D}x{worst.C}, budget {worst.budget}) and "
            f"{model.min():.3f}-{model.max():.3f}x the memory model's prediction, down to budgets of "
            f"{(budgets['budget_bytes'] / budgets['gradients_bytes']).min():.2f}x the gradients' own bytes."]
    for output in ("grad_input", "grad_weight"):
        miss = budgets[f"predicted_{output}_floors"] / budgets[f"{output}_floors"] - 1
        text.append(f"{output}: measured {budgets[f'{output}_floors'].min():.2f}-"
                    f"{budgets[f'{output}_floors'].max():.2f} floors, predicted within {miss.abs().max():.0%}.")
    if not tiling.empty:
        parts = []
        for policy, group in tiling.groupby("policy", sort=False):
            most = group.loc[group["num_class_chunks"].idxmax()]
            parts.append(f"{policy} {most.time_ratio:.2f}x at {most.num_class_chunks} blocks "
                         f"({group['measured_peak_bytes'].max() / 2**20:.0f} -> {most.measured_peak_bytes / 2**20:.0f}"
                         " MiB)")
        row = tiling.iloc[0]
        text.append(f"Class tiling's time cost at {row.N}x{row.D}x{row.C} ({row.batch_chunk_size} rows per chunk, one "
                    f"run, {tiling['cpu_model'].iloc[0]}): " + "; ".join(parts) + ".")
    return " ".join(text) + "\n"
