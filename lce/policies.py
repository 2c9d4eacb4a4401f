"""Precision policies as data: one layout table per device kind, and the "auto" table.

A *layout* says, for each of the three GEMMs of the op, which dtype its
operands are cast to and which dtype its result is produced in, and where the
weight gradient is summed across chunks. ``"input"`` means the input dtype,
``"acc"`` means the resolved ``acc_dtype``. When the two coincide (fp32 input,
or an explicit ``acc_dtype`` equal to the input dtype) every policy collapses
to the same arithmetic; only the accumulator choice is then meaningful, and an
accumulator that would have the gradient's own dtype is never allocated.

The three GEMMs, for one chunk of rows ``x_c`` (rows, D) against ``W`` (C, D):

* ``logits``       z   = x_c @ W.T (+ b)          (rows, C)
* ``grad_input``   g_x = dz @ W                   (rows, D)
* ``grad_weight``  g_W += dz.T @ x_c              (C, D), summed over chunks

where ``dz`` is softmax(z) minus the (smoothed, class-weighted) target
distribution, scaled for the reduction. The softmax statistics and the loss
always use at least fp32 (see :mod:`lce.plan`).
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import torch

Role = Literal["input", "acc"]


@dataclasses.dataclass(frozen=True)
class Gemm:
    """Operand and result precision of one GEMM."""

    operands: Role
    result: Role

    def __str__(self) -> str:
        return self.operands if self.operands == self.result else f"{self.operands}->{self.result}"


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where each GEMM of the op runs, and where the weight gradient is summed.

    ``weight_grad_sum`` is ``"acc"`` for a ``(C, D)`` buffer in acc_dtype that
    carries the sum over *all* chunks and is rounded once at the end, or
    ``"input"`` to add each chunk's product straight into the gradient, which
    rounds once per chunk.
    """

    logits: Gemm
    grad_input: Gemm
    grad_weight: Gemm
    weight_grad_sum: Role


_IN, _ACC = "input", "acc"
_MIXED = Gemm(operands=_IN, result=_ACC)
_WIDE = Gemm(operands=_ACC, result=_ACC)
_NARROW = Gemm(operands=_IN, result=_IN)

# CUDA has a native mixed-precision GEMM (low-precision operands, fp32
# accumulate, fp32 result), so "input -> acc" costs nothing extra there.
CUDA_LAYOUTS: dict[str, Layout] = {
    #                   logits  grad_input grad_weight  weight-grad sum
    "accurate": Layout(_MIXED, _WIDE, _WIDE, _ACC),  # dz kept in fp32 for both backward GEMMs
    "balanced": Layout(_MIXED, _MIXED, _MIXED, _ACC),  # dz rounded once; fp32 (C, D) accumulator
    "compact": Layout(_MIXED, _MIXED, _NARROW, _IN),  # no (C, D) buffer: rounds into the grad per chunk
}

# The CPU has no mixed-output GEMM: bf16 GEMMs accumulate in fp32 but round
# their result to bf16, so a fp32 result needs fp32 operands (an exact upcast).
# bf16 GEMMs are the fast ones on AVX512-BF16/AMX parts, so "balanced" keeps
# its two backward GEMMs narrow and sums their products in a fp32 accumulator.
# Where the CPU emulates bf16 GEMMs (lce.cpu_gemms; AVX2-only parts), lce.plan
# runs those narrow GEMMs in acc_dtype instead: the fast ones there.
CPU_LAYOUTS: dict[str, Layout] = {
    "accurate": Layout(_WIDE, _WIDE, _WIDE, _ACC),  # every GEMM in acc_dtype
    "balanced": Layout(_WIDE, _NARROW, _NARROW, _ACC),  # fp32 logits, fast bf16 backward, fp32 sum
    # With acc_dtype == input dtype this is the accumulator-free layout; with a
    # wider acc_dtype, lce.plan substitutes "balanced" (see COMPACT_ON_CPU_NOTE).
    "compact": Layout(_WIDE, _NARROW, _NARROW, _IN),
}

LAYOUTS: dict[str, dict[str, Layout]] = {"cuda": CUDA_LAYOUTS, "cpu": CPU_LAYOUTS}

COMPACT_ON_CPU_NOTE = (
    "compact with acc_dtype wider than the input runs the balanced layout off CUDA, "
    "as the options contract specifies; pass acc_dtype equal to the input dtype for "
    "the accumulator-free layout"
)


@dataclasses.dataclass(frozen=True)
class AutoPick:
    """One entry of the "auto" table, why it was chosen, and the figures that carry the evidence.

    ``min_rows`` is a floor on the rows per chunk that "auto" chunking resolves
    to (never above N): below it the GEMMs of a chunk stop being efficient.
    ``evidence`` names figures ``python -m analysis figures`` draws (``figures/<stem>.png``);
    the numbers live there and in the README passages generated from the same
    data, not in this table, so they cannot drift.
    """

    acc_policy: str
    chunking_method: str
    reason: str
    evidence: tuple[str, ...]
    min_rows: int = 1


CPU_MIN_ROWS = {torch.float32: 512, torch.bfloat16: 256, torch.float16: 256}
"""Floor on "auto" chunk rows on CPU, per input dtype. At LLM-like aspect ratios torch's
aspect-ratio rule gives CPU chunks of few rows, and every GEMM of such a chunk is bound by
reading the weight. Where the time stops falling as chunks grow, on each CPU kind measured, is
what the chunk sweep shows (``python -m analysis bench --chunk-sweep``: ``figures/chunk_sweep.png``
and the README's generated "cpu-chunking" table); its numbers live there. The bf16 and fp16
floors sit below fp32's because their fp32 logits chunk would otherwise dominate the peak memory."""


# The "auto" picks keyed by (device kind, input dtype). On CPU the policies agree
# with torch 2.13's defaults and lce's auto chunking keeps at least CPU_MIN_ROWS
# rows per chunk; CPU fp32, which torch's table lacks, has an entry of its own.
# On CUDA lce departs from torch (compact): the realistic input families of
# notebook 05 overturned compact's claim. The analysis measures every entry and
# marks it on its fronts, per input family.
AUTO_TABLE: dict[tuple[str, torch.dtype], AutoPick] = {
    ("cuda", torch.bfloat16): AutoPick(
        "balanced", "aspect_ratio:2",
        "compact's once-per-chunk rounding of the bf16 weight gradient overturned on realistic inputs: on "
        "calibrated Zipfian heads its error grows with the chunk count, and the rows of rarely targeted classes "
        "fare worst (figures error_vs_chunks_cuda-emulated, rare_rows, row_errors_cuda-emulated); balanced, "
        "which sums the weight gradient in an fp32 (C, D) buffer, stays near the rounding floor. Meets the "
        "error/noise rule (analysis.judge.rule, notebook 06), judged on a GPU's own runs where they are committed; "
        "torch's pick (compact with its auto chunking) fails it, its bias a sizeable share of the sampling noise "
        "(figure noise_vs_chunks_cuda). Trained for 10^4 steps with the head alone (notebook 10), balanced moves no "
        "more than accurate in any target-frequency bucket, while compact shifts the rare classes' loss, beyond the "
        "seed spread at 256 chunks (figure head_gap_vs_step_adamw)",
        evidence=("rare_rows", "row_errors_cuda-emulated", "error_vs_chunks_cuda-emulated", "noise_vs_chunks_cuda",
                  "head_gap_vs_step_adamw"),
    ),
    ("cuda", torch.float16): AutoPick(
        "balanced", "aspect_ratio:2",
        "as for bf16: measured in each dtype's own floors, compact's per-chunk rounding costs fp16 as much as "
        "bf16 (fp16's extra mantissa bits do not help the rare classes' tiny rows). Meets the error/noise rule "
        "(analysis.judge.rule, notebook 06), judged on a GPU's own runs where they are committed; torch's pick "
        "(compact with its auto chunking) fails it. Over 10^4 head-only steps with AdamW (notebook 10) torch's fp16 "
        "compact changes the rare classes' loss far beyond the seed spread (its tiny per-chunk products are lost "
        "in fp16), while balanced stays within a millinat (figure head_gap_vs_bias)",
        evidence=("rare_rows", "row_errors_cuda-emulated", "error_vs_chunks_cuda-emulated", "noise_vs_chunks_cuda",
                  "head_gap_vs_bias"),
    ),
    ("cpu", torch.bfloat16): AutoPick(
        "accurate", "aspect_ratio",
        "every GEMM in fp32: the lowest gradient error. On CPUs with native bf16 GEMMs (AVX512-BF16, AMX) it "
        "is paid for with fp32 GEMMs, slower than the bf16 ones of balanced; on CPUs that emulate them "
        "(lce.cpu_gemms) fp32 GEMMs are the fast ones, so the same pick is also the fastest there. Chunks of at "
        "least CPU_MIN_ROWS rows. Meets the error/noise rule (analysis.judge.rule, notebook 06)",
        evidence=("error_vs_memory_cpu", "chunk_sweep", "cpu_gemm_rates"),
        min_rows=CPU_MIN_ROWS[torch.bfloat16],
    ),
    ("cpu", torch.float16): AutoPick(
        "accurate", "aspect_ratio",
        "no CPU kind measured runs fp16 GEMMs faster than fp32 (emulated on AVX2 and AVX512-BF16 parts, about "
        "fp32's rate with AVX512-FP16), so fp32 GEMMs are also the fast ones; chunks of at least CPU_MIN_ROWS "
        "rows. Meets the error/noise rule (analysis.judge.rule, notebook 06)",
        evidence=("error_vs_memory_cpu", "time_vs_shape", "cpu_gemm_rates"),
        min_rows=CPU_MIN_ROWS[torch.float16],
    ),
    ("cpu", torch.float32): AutoPick(
        "compact", "aspect_ratio",
        "not in torch's table: with acc_dtype == fp32 all policies compute the same numbers and compact "
        "allocates least; chunks of at least CPU_MIN_ROWS rows. Meets the error/noise rule (analysis.judge.rule, "
        "notebook 06)",
        evidence=("error_vs_memory_cpu", "chunk_sweep"),
        min_rows=CPU_MIN_ROWS[torch.float32],
    ),
}

AUTO_FALLBACK = AutoPick(
    "compact", "aspect_ratio:2",
    "unlisted (device, dtype): with acc_dtype == input dtype all policies compute the same "
    "numbers, and compact allocates least",
    evidence=("error_vs_memory_cpu",),
)


def auto_pick(device_kind: str, dtype: torch.dtype) -> AutoPick:
    """The "auto" entry for a device kind and input dtype (the fallback if unlisted)."""
    return AUTO_TABLE.get((device_kind, dtype), AUTO_FALLBACK)


def format_layout_table(device_kind: str) -> str:
    """The policy table of one device kind as aligned text (used by the README and plans)."""
    rows = [("policy", "logits", "grad_input", "grad_weight", "weight-grad sum")]
    for name, layout in LAYOUTS[device_kind].items():
        rows.append((name, str(layout.logits), str(layout.grad_input), str(layout.grad_weight),
                     layout.weight_grad_sum))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows)
