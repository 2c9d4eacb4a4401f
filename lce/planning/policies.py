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
always use at least fp32 (see :mod:`lce.planning.plan`).
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
# compact is balanced's row, as the options contract specifies off CUDA: with
# acc_dtype == input dtype its "acc" sum is the gradient itself (the
# accumulator-free layout), with a wider acc_dtype it is balanced.
CPU_LAYOUTS: dict[str, Layout] = {
    "accurate": Layout(_WIDE, _WIDE, _WIDE, _ACC),  # every GEMM in acc_dtype
    "balanced": Layout(_WIDE, _NARROW, _NARROW, _ACC),  # fp32 logits, fast bf16 backward, fp32 sum
    "compact": Layout(_WIDE, _NARROW, _NARROW, _ACC),  # balanced's (see above)
}

# Where the input dtype's GEMMs are not the fast ones on this CPU -- fp16 on every
# CPU measured, bf16 where lce.planning.cpu_gemms finds it slow or emulated
# (AVX2-only and AVX512F-only parts) -- every GEMM runs in acc_dtype: exact
# upcasts, the same or less error, at fp32's speed.
CPU_LAYOUTS_WITHOUT_FAST_NARROW_GEMMS: dict[str, Layout] = {
    "accurate": Layout(_WIDE, _WIDE, _WIDE, _ACC),
    "balanced": Layout(_WIDE, _WIDE, _WIDE, _ACC),
    "compact": Layout(_WIDE, _WIDE, _WIDE, _ACC),
}

LAYOUTS: dict[str, dict[str, Layout]] = {"cuda": CUDA_LAYOUTS, "cpu": CPU_LAYOUTS}
"""The layout tables of the devices whose input-dtype GEMMs are fast (every CUDA device; a CPU with native bf16)."""


def layout_of(device_kind: str, policy: str, narrow_gemms_fast: bool = True) -> Layout:
    """The layout ``policy`` runs on ``device_kind``: its row of :data:`LAYOUTS`, or of
    :data:`CPU_LAYOUTS_WITHOUT_FAST_NARROW_GEMMS` on a CPU whose input-dtype GEMMs are slower than fp32's."""
    if device_kind == "cpu" and not narrow_gemms_fast:
        return CPU_LAYOUTS_WITHOUT_FAST_NARROW_GEMMS[policy]
    return LAYOUTS[device_kind][policy]

COMPACT_ON_CPU_NOTE = (
    "compact with acc_dtype wider than the input runs the balanced layout off CUDA, "
    "as the options contract specifies; pass acc_dtype equal to the input dtype for "
    "the accumulator-free layout"
)
"""The note a CPU plan of compact with a wider ``acc_dtype`` carries (its layout is balanced's row)."""


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


CUDA_MIN_ROWS = 2048
"""Floor on "auto" chunk rows on CUDA: the decision procedure's pick among lce.decide.CUDA_ROW_FLOORS (each step
costs a GPU a fixed time; lce.decide.time_model)."""

CPU_MIN_ROWS = {torch.float32: 512, torch.bfloat16: 256, torch.float16: 256}
"""Floor on "auto" chunk rows on CPU, per input dtype. At LLM-like aspect ratios torch's
aspect-ratio rule gives CPU chunks of few rows, and every GEMM of such a chunk is bound by
reading the weight. Where the time stops falling as chunks grow, on each CPU kind measured, is
what the chunk sweep shows (``python -m analysis bench --chunk-sweep``: ``figures/chunk_sweep.png``
and the README's generated "cpu-chunking" table); its numbers live there. The bf16 and fp16
floors sit below fp32's because their fp32 logits chunk would otherwise dominate the peak memory."""


# The "auto" picks keyed by (device kind, input dtype): the decision procedure's output (lce.decide.derive_auto)
# at its reference heads, and on CPU on every CPU kind; tests/lce/test_decide.py fails when the two differ. lce
# departs from torch 2.13's table where the procedure says so: balanced instead of compact on CUDA (compact's
# per-chunk rounding at the aspect-ratio chunk counts is over the error limit, and training moved the rare classes'
# loss at 256 bf16 chunks and 64 fp16 ones); aspect_ratio instead of aspect_ratio:2 (the same predicted peak
# at the reference heads, predicted faster). For bf16 on CPU the procedure keeps accurate (balanced's GEMMs
# would be faster where bf16 GEMMs are native, but a default must be no less accurate than torch's: it stays
# accurate).
AUTO_TABLE: dict[tuple[str, torch.dtype], AutoPick] = {
    ("cuda", torch.bfloat16): AutoPick(
        "balanced", "aspect_ratio",
        "at least CUDA_MIN_ROWS rows per chunk: each step of the chunk loop costs an H200 about a millisecond of "
        "launches and Python (lce.decide.time_model, fitted to the H200's runs: the cuda grid's 2048x128x16384 head "
        "took "
        "0.1-0.3 s at the aspect ratio's 8-16-row chunks, the unfused op 1 ms), so the aspect ratio's chunks of a "
        "few hundred rows at the LLM heads were predicted 1.5-1.8x slower than 2048-row ones. "
        "balanced sums the weight gradient in an fp32 (C, D) buffer, so its error stays near the rounding floor at "
        "every chunk count (figures error_vs_chunks_cuda-emulated, row_errors_cuda-emulated); compact's "
        "once-per-chunk rounding at the aspect-ratio chunk counts is over the error limit at the reference heads, "
        "its error growing with the chunk count and worst on the rarely targeted classes (rare_rows), its bias a "
        "sizeable share of the sampling noise (noise_vs_chunks_cuda); over 10^4 head-only steps compact at 256 "
        "chunks moved the rare classes' loss beyond the seed spread while balanced moved no bucket "
        "(head_gap_vs_step_adamw). The factor-1 aspect ratio: the same predicted peak as aspect_ratio:2 at the "
        "reference heads with half the chunks, predicted faster (H200 datasheet rates; an H200's fp32 runs rank it "
        "first by time, notebook 04). Meets "
        "the error/noise rule (analysis.judge.rule, notebook 06)",
        evidence=("rare_rows", "row_errors_cuda-emulated", "error_vs_chunks_cuda-emulated", "noise_vs_chunks_cuda",
                  "head_gap_vs_step_adamw"),
        min_rows=CUDA_MIN_ROWS,
    ),
    ("cuda", torch.float16): AutoPick(
        "balanced", "aspect_ratio",
        "as for bf16 (chunks of at least CUDA_MIN_ROWS rows), and compact's fp16 weight-gradient sum fails training "
        "sooner: over 10^4 head-only AdamW "
        "steps fp16 compact at 64 chunks changed the rare classes' loss far beyond the seed spread (its tiny "
        "per-chunk products are lost in fp16), while balanced stayed within a millinat (figure head_gap_vs_bias). "
        "Meets the error/noise rule (analysis.judge.rule, notebook 06)",
        evidence=("rare_rows", "row_errors_cuda-emulated", "error_vs_chunks_cuda-emulated", "noise_vs_chunks_cuda",
                  "head_gap_vs_bias"),
        min_rows=CUDA_MIN_ROWS,
    ),
    ("cpu", torch.bfloat16): AutoPick(
        "accurate", "aspect_ratio",
        "every GEMM in fp32: the lowest gradient error. balanced would be faster where bf16 GEMMs are native "
        "(AVX512-BF16, AMX) and within the error limit, but its input gradient is predicted less accurate than "
        "torch 2.13's default (accurate), which a default must not be (the drop-in condition of lce.decide); on "
        "CPUs whose bf16 GEMMs are slow or emulated (lce.planning.cpu_gemms) fp32 GEMMs are the fast ones, so the "
        "pick is "
        "also the fastest there. Chunks of at least CPU_MIN_ROWS rows. Meets the error/noise rule "
        "(analysis.judge.rule, notebook 06)",
        evidence=("error_vs_memory_cpu", "chunk_sweep", "cpu_gemm_rates"),
        min_rows=CPU_MIN_ROWS[torch.bfloat16],
    ),
    ("cpu", torch.float16): AutoPick(
        "accurate", "aspect_ratio",
        "no CPU kind measured runs fp16 GEMMs faster than fp32 (emulated on AVX2 and AVX512-BF16 parts, about "
        "fp32's rate with AVX512-FP16), so lce runs them in fp32 under every policy: the policies tie, and a tie "
        "keeps torch's pick; chunks of at least CPU_MIN_ROWS rows. Meets the error/noise rule "
        "(analysis.judge.rule, notebook 06)",
        evidence=("error_vs_memory_cpu", "time_vs_shape", "cpu_gemm_rates"),
        min_rows=CPU_MIN_ROWS[torch.float16],
    ),
    ("cpu", torch.float32): AutoPick(
        "compact", "aspect_ratio",
        "not in torch's table: with acc_dtype == fp32 every policy computes the same numbers and allocates the "
        "same, so they tie and a tie keeps torch's fallback policy (compact); the factor-1 aspect ratio is "
        "predicted fastest. Chunks of at least CPU_MIN_ROWS rows. Meets the error/noise rule (analysis.judge.rule, "
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


def format_layout_table(device_kind: str, narrow_gemms_fast: bool = True) -> str:
    """The policy table of one device kind (and, on a CPU, of its narrow GEMMs' speed) as aligned text (the policies
    page shows each)."""
    rows = [("policy", "logits", "grad_input", "grad_weight", "weight-grad sum")]
    for name in LAYOUTS[device_kind]:
        layout = layout_of(device_kind, name, narrow_gemms_fast)
        rows.append((name, str(layout.logits), str(layout.grad_input), str(layout.grad_weight),
                     layout.weight_grad_sum))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows)
