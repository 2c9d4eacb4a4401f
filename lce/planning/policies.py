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

# Where dz may not be rounded to an fp16 operand -- a batch-invariant fp16 call, whose dz would need a power-of-two
# scale that follows the batch -- the CUDA layouts keep dz in acc_dtype for both backward GEMMs (fp32 GEMMs: slower).
CUDA_LAYOUTS_WITH_WIDE_DZ: dict[str, Layout] = {
    "accurate": Layout(_MIXED, _WIDE, _WIDE, _ACC),
    "balanced": Layout(_MIXED, _WIDE, _WIDE, _ACC),
    "compact": Layout(_MIXED, _WIDE, _WIDE, _IN),
}


def layout_of(device_kind: str, policy: str, narrow_gemms_fast: bool = True, narrow_dz: bool = True) -> Layout:
    """The layout ``policy`` runs on ``device_kind``: its row of :data:`LAYOUTS`; of
    :data:`CPU_LAYOUTS_WITHOUT_FAST_NARROW_GEMMS` on a CPU whose input-dtype GEMMs are slower than fp32's; of
    :data:`CUDA_LAYOUTS_WITH_WIDE_DZ` on CUDA where dz may not be rounded to a narrow operand."""
    if device_kind == "cpu" and not narrow_gemms_fast:
        return CPU_LAYOUTS_WITHOUT_FAST_NARROW_GEMMS[policy]
    if device_kind == "cuda" and not narrow_dz:
        return CUDA_LAYOUTS_WITH_WIDE_DZ[policy]
    return LAYOUTS[device_kind][policy]

COMPACT_ON_CPU_NOTE = (
    "compact with acc_dtype wider than the input runs the balanced layout off CUDA, "
    "as the options contract specifies; pass acc_dtype equal to the input dtype for "
    "the accumulator-free layout"
)
"""The note a CPU plan of compact with a wider ``acc_dtype`` carries (its layout is balanced's row)."""


@dataclasses.dataclass(frozen=True)
class AutoPick:
    """One entry of the "auto" table: the policy and chunking rule it resolves to, and ``min_rows``, a floor on the
    rows per chunk that "auto" chunking keeps (never above N); ``reason`` says why, in a sentence."""

    acc_policy: str
    chunking_method: str
    reason: str
    min_rows: int = 1
    invariant_rows: int = 256
    """Rows per chunk of a batch-invariant call with "auto" chunking: fixed whatever N, the last chunk padded
    (:func:`lce.decide.invariance.derive_invariance` picks them)."""
    batch_invariant: bool = False
    """What ``batch_invariant=None`` resolves to for the loss: the contract costs at most
    :data:`lce.decide.invariance.INVARIANCE_COST` of the time and peak memory at every reference head."""


CUDA_MIN_ROWS = 2048
"""Floor on "auto" chunk rows on CUDA: the decision procedure's pick among :data:`lce.decide.CUDA_ROW_FLOORS` (each
step of the chunk loop costs a GPU a fixed time, :mod:`lce.decide.time_model`)."""

CPU_MIN_ROWS = {torch.float32: 512, torch.bfloat16: 256, torch.float16: 256}
"""Floor on "auto" chunk rows on CPU, per input dtype: below it every GEMM of a chunk is bound by reading the weight
(at LLM-like aspect ratios torch's rule gives CPU chunks of a few rows). The bf16 and fp16 floors sit below fp32's
because their fp32 logits chunk would otherwise dominate the peak memory."""


# The "auto" picks keyed by (device kind, input dtype): the decision procedure's output (lce.decide.derive_auto) at
# its reference heads, and on CPU on every CPU kind; a test fails when the two differ.
AUTO_TABLE: dict[tuple[str, torch.dtype], AutoPick] = {
    ("cuda", torch.bfloat16): AutoPick(
        "balanced", "aspect_ratio",
        "an fp32 (C, D) sum keeps the weight gradient near its rounding floor at every chunk count, where "
        "compact's once-per-chunk rounding is over the error limit and moved rare classes' loss in training; "
        "chunks of at least CUDA_MIN_ROWS rows, since each step costs a GPU a fixed time",
        min_rows=CUDA_MIN_ROWS, invariant_rows=2048, batch_invariant=True,
    ),
    ("cuda", torch.float16): AutoPick(
        "balanced", "aspect_ratio",
        "as for bf16, and an fp16 weight-gradient sum fails training sooner (its small per-chunk products are "
        "lost); chunks of at least CUDA_MIN_ROWS rows",
        min_rows=CUDA_MIN_ROWS, invariant_rows=1024,
    ),
    ("cpu", torch.bfloat16): AutoPick(
        "accurate", "aspect_ratio",
        "every GEMM in fp32, the lowest error: a default no less accurate than torch's own (accurate), and the "
        "fastest where bf16 GEMMs are slow or emulated; chunks of at least CPU_MIN_ROWS rows",
        min_rows=CPU_MIN_ROWS[torch.bfloat16], invariant_rows=512,
    ),
    ("cpu", torch.float16): AutoPick(
        "accurate", "aspect_ratio",
        "fp16 GEMMs run in fp32 on every CPU, so the policies tie and a tie keeps torch's pick; chunks of at "
        "least CPU_MIN_ROWS rows",
        min_rows=CPU_MIN_ROWS[torch.float16], invariant_rows=512,
    ),
    ("cpu", torch.float32): AutoPick(
        "compact", "aspect_ratio",
        "with acc_dtype fp32 every policy computes and allocates the same, and a tie keeps torch's fallback "
        "(compact); the factor-1 aspect ratio is predicted fastest; chunks of at least CPU_MIN_ROWS rows",
        min_rows=CPU_MIN_ROWS[torch.float32], invariant_rows=512, batch_invariant=True,
    ),
}

AUTO_FALLBACK = AutoPick(
    "compact", "aspect_ratio:2",
    "unlisted (device, dtype): with acc_dtype == input dtype all policies compute the same numbers, and compact "
    "allocates least",
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
