"""The decision table: what lce's decision procedure (:mod:`lce.decide`) answers per device, dtype and reference head.

One row per (device kind, dtype, reference head): the plan lce's default options run there
(:func:`lce.decide.default_candidate`, the plan :func:`lce.plan` prints; its rows per chunk are the chunking rule's
or, where that gives fewer, the auto table's floor), its predicted peak and
what that saves against torch 2.13's own default, the predicted errors in floors, the predicted time (and where
the prediction comes from), the weight gradient's bias/noise ratio at the head's own N and at 2^20 rows
(:attr:`lce.decide.Candidate.bias`: measured by the noise-scaling study where N is within its data, predicted by its
fitted scaling beyond; fp32 rows: the noise study's measurement at N = 1024), and what :func:`lce.recommend` picks
there without a budget. CPU rows plan for a CPU with native bf16 GEMMs
(:data:`lce.planning.cpu_gemms.REFERENCE_NATIVE_RATE`), so the table is the same on every machine. The README opens
with it; notebook 07 leads with it; ``tests/claims/test_decision_table.py`` keeps its prose true.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import torch

import lce
from analysis.core.results_io import NOISE, load_kind
from analysis.report.tables import markdown_table
from lce.decide import (
    DEFAULT_MAX_ERROR,
    OBJECTIVE,
    REFERENCE_HEADS,
    TORCH_DEFAULTS,
    TORCH_FALLBACK,
    default_candidate,
    rule_candidate,
)
from lce.decide.noise_scaling import bias_at
from lce.decide.time_model import TIME_SOURCE
from lce.planning.cpu_gemms import REFERENCE_NATIVE_RATE
from lce.planning.options import dtype_name, parse_chunking_method
from lce.planning.plan import aspect_ratio_chunk_size
from lce.planning.policies import AUTO_TABLE
from lce.testing import cpu_gemms

__all__ = ["ENTRIES", "decision_table", "readme_decision_table"]

ENTRIES: tuple[tuple[str, torch.dtype], ...] = (("cuda", torch.bfloat16), ("cuda", torch.float16),
                                                 ("cpu", torch.bfloat16), ("cpu", torch.float32))
"""The (device kind, dtype) pairs the table shows (CPU fp16 is CPU bf16's answer with fp32 GEMMs throughout)."""


def _measured_bias(results: Path) -> dict[tuple[str, str], float]:
    from analysis.judge.rule import rule_table

    _, noise = load_kind(results, NOISE.name)
    if noise.empty:
        return {}
    table = rule_table(noise)
    return {(row.device, row.dtype): row.weight_bias_over_noise for row in table.itertuples()
            if row.worst_family != "(no data)"}


def _buffer_bytes(plan, name: str) -> int:
    """The bytes of the plan's buffer ``name`` (0 where it makes none)."""
    return sum(buffer.nbytes for buffer in plan.buffers if buffer.name == name)


LLM_STEP_ROWS = 2**20
"""The batch of an LLM training step at which the table also states each auto entry's bias/noise (predicted)."""


def decision_table(results: Path) -> pd.DataFrame:
    """The table's rows (see the module docstring); every number is a prediction except the bias/noise ratios
    within the noise studies' data (``bias_predicted`` says which)."""
    bias = _measured_bias(results)
    rows = []
    with cpu_gemms("native"):
        for kind, dtype in ENTRIES:
            entry = AUTO_TABLE[(kind, dtype)]
            torch_rule = TORCH_DEFAULTS.get((kind, dtype), TORCH_FALLBACK)
            for head in REFERENCE_HEADS:
                auto = default_candidate(head, dtype, kind)
                theirs = rule_candidate(*torch_rule, head, dtype, kind, min_rows=False)
                ruled = aspect_ratio_chunk_size(head.N, head.D, head.C, parse_chunking_method(entry.chunking_method))
                tuned = lce.recommend(head.N, head.D, head.C, dtype, "cpu" if kind == "cpu" else "cuda")
                rows.append(dict(
                    device=kind, dtype=dtype_name(dtype), head=str(head), head_name=head.name,
                    auto=f"{entry.acc_policy}, "
                         f"{'batch-invariant' if auto.plan.batch_invariant else entry.chunking_method}",
                    policy=auto.plan.acc_policy, rows=auto.plan.batch_chunk_size,
                    floored=auto.plan.batch_chunk_size > ruled and not auto.plan.batch_invariant,
                    min_rows=entry.min_rows, chunks=auto.plan.num_chunks,
                    logits_chunk_gib=_buffer_bytes(auto.plan, "logits_chunk") / 2**30,
                    accumulator_gib=_buffer_bytes(auto.plan, "weight_grad_accumulator") / 2**30,
                    peak_gib=auto.peak_bytes / 2**30,
                    torch_peak_gib=theirs.peak_bytes / 2**30,
                    saves_gib=(theirs.peak_bytes - auto.peak_bytes) / 2**30,
                    grad_input_floors=auto.errors["grad_input"], grad_weight_floors=auto.errors["grad_weight"],
                    torch_grad_weight_floors=theirs.errors["grad_weight"],
                    worst_row_floors=auto.details["worst_row"], weight_bias_bound=auto.details["weight_bias"],
                    limit=DEFAULT_MAX_ERROR.get(dtype, float("inf")),
                    seconds=auto.seconds, torch_seconds=theirs.seconds, time_source=TIME_SOURCE[kind],
                    bias_over_noise=(auto.bias.value if auto.bias is not None
                                     else bias.get((kind, dtype_name(dtype)), float("nan"))),
                    bias_low=auto.bias.low if auto.bias is not None else float("nan"),
                    bias_high=auto.bias.high if auto.bias is not None else float("nan"),
                    bias_predicted=auto.bias.predicted if auto.bias is not None else False,
                    **_step_columns(bias_at(auto.plan, LLM_STEP_ROWS)),
                    recommend=tuned.chosen.label(), recommend_peak_gib=tuned.peak_bytes / 2**30,
                    recommend_grad_weight_floors=tuned.errors["grad_weight"],
                    recommend_worst_row_floors=tuned.chosen.details["worst_row"]))
    return pd.DataFrame(rows)


def _step_columns(at_step) -> dict[str, float]:
    nan = float("nan")
    if at_step is None:
        return {"bias_at_step": nan, "bias_at_step_low": nan, "bias_at_step_high": nan}
    return {"bias_at_step": at_step.value, "bias_at_step_low": at_step.low, "bias_at_step_high": at_step.high}


def _ratio_text(value: float, low: float, high: float, predicted: bool = False) -> str:
    if value != value:  # NaN
        return "–"
    if low != low:
        return f"{value:.2g}"
    return f"{value:.2g} [{low:.2g}, {high:.2g}]{' (predicted)' if predicted else ''}"


def _worst_row_caveat(results: Path) -> str:
    from analysis.report.nb07_choosing_options import detail_validation

    held = detail_validation(results).set_index(["detail", "split"]).loc[("worst_row", "held out")]
    if held["median_ratio"] >= 1:
        return f"held out, it covered {held['covered']:.0%} of the measurements"
    return (f"a low estimate: held out, it fell short of {1 - held['covered']:.0%} of the measurements, the median "
            f"measurement {1 / held['median_ratio']:.1f}x the prediction")


def readme_decision_table(results: Path) -> str:
    """The README's decision table with its legend."""
    table = decision_table(results)
    shown = pd.DataFrame({
        "device, dtype": table["device"] + ", " + table["dtype"],
        "head (N x D x C)": table["head"],
        "auto": [f"{auto} ({rows} rows{', its floor' if floored else ''})" for auto, rows, floored in
                 zip(table["auto"], table["rows"], table["floored"], strict=True)],
        "peak GiB": table["peak_gib"],
        "GiB saved vs torch's default (− more)": table["saves_gib"],
        "floors (input, weight)": [f"{a:.2f}, {b:.2f}" for a, b in zip(table["grad_input_floors"],
                                                                       table["grad_weight_floors"], strict=True)],
        "torch's weight floors": table["torch_grad_weight_floors"],
        "worst row floors": table["worst_row_floors"],
        "time vs torch's default": table["seconds"] / table["torch_seconds"],
        "bias/noise at this N": [_ratio_text(*values) for values in zip(
            table["bias_over_noise"], table["bias_low"], table["bias_high"], table["bias_predicted"], strict=True)],
        f"bias/noise at 2^{LLM_STEP_ROWS.bit_length() - 1} rows (predicted)": [_ratio_text(*values) for values in zip(
            table["bias_at_step"], table["bias_at_step_low"], table["bias_at_step_high"], strict=True)],
        "recommend, no budget": [f"{label}: {gib:.2f} GiB, {floors:.2f} floors" for label, gib, floors in
                                 zip(table["recommend"], table["recommend_peak_gib"],
                                     table["recommend_grad_weight_floors"], strict=True)],
    })
    limits = ", ".join(f"{dtype_name(d)} {v:g}" for d, v in DEFAULT_MAX_ERROR.items())
    legend = [
        "- *floor*: a gradient's Frobenius error against fp64, over the error of the exact answer rounded once to "
        "the input dtype; 1 is the best any implementation can do.",
        "- *auto*: the plan lce's default options run (`lce.plan`); *its floor*: the chunking rule gives fewer rows, "
        "and auto keeps its floor on rows per chunk (`lce.planning.policies.AutoPick.min_rows`: "
        + ", ".join(f"{kind} {dtype_name(dtype)} {AUTO_TABLE[(kind, dtype)].min_rows}" for kind, dtype in ENTRIES)
        + "); *batch-invariant*: the same rows per chunk whatever N (`AutoPick.invariant_rows`), the last chunk "
        "padded, so a row's loss and input gradient do not depend on its batch (docs/using-lce.md).",
        "- *worst row*: the weight gradient's worst class row, in that row's own floors (the rare classes'); "
        f"predicted by `lce.decide.error_model.predict_weight_details`, "
        f"{lce.decide.error_model.DETAIL_ACCURACY['worst_row']}; "
        f"{_worst_row_caveat(results)}.",
        "- every peak, floor and time is a prediction of lce's models (`lce.decide`); times: CUDA "
        f"{TIME_SOURCE['cuda']}; CPU predicted for a CPU with native bf16 GEMMs at "
        f"{REFERENCE_NATIVE_RATE:g}x fp32's rate (`lce.planning.cpu_gemms.REFERENCE_NATIVE_RATE`).",
        "- bias/noise: the weight gradient's bias along the exact gradient over one batch's sampling noise along it, "
        "at the head's own N and at an LLM step's 2^20 rows (`lce.decide.noise_scaling`): measured by the "
        "noise-scaling study (N = 2^10-2^16 at D = 128, C = 16384; worst input family with a nonzero expected "
        "gradient, median of 3 seeds, [seed interval]), predicted beyond by its fitted power law [95% band] "
        "(notebook 06); the rule's limit is "
        f"{lce.decide.BIAS_LIMIT}. Every bf16/fp16 auto entry rounds its weight gradient once, so its ratio is "
        "that dtype's rounding floor's, the least any op returning the dtype has. fp32 rows: the noise study's "
        "measurement at 1024x128x16384.",
        f"- conditions: predicted error at most {limits} floors; a weight gradient summed in the input dtype only "
        "at chunk counts training passed (notebook 10) and with a bias/noise at the head's N within the limit; "
        "a default no less accurate than torch's. Objective: " + OBJECTIVE + ".",
    ]
    formats = {"peak GiB": "{:.2f}", "GiB saved vs torch's default (− more)": "{:+.2f}",
               "torch's weight floors": "{:.2f}", "worst row floors": "{:.1f}", "time vs torch's default": "{:.2f}x"}
    return markdown_table(shown, formats) + "\n" + "\n".join(legend) + "\n"
