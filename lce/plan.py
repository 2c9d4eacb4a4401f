"""Resolve options against one call into a :class:`Plan`: what will actually run.

The plan fixes the chunk size and count, ``acc_dtype``, the precision layout
(from :mod:`lce.policies`), the dtype and shape of every buffer the chunk loop
allocates, and from those the predicted peak of extra memory. The chunk loop
(:mod:`lce.chunked`) takes every dtype decision from here.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Literal

import torch

from .device import device_kind_of, has_mixed_precision_mm
from .gemm import rows_per_block
from .options import LinearCrossEntropyOptions, dtype_name, parse_chunking_method
from .policies import COMPACT_ON_CPU_NOTE, LAYOUTS, Gemm, Layout, Role, auto_pick

__all__ = ["Plan", "Buffer", "make_plan"]

Stage = Literal["forward", "backward"]
Span = Literal["call", "chunk", "final", "kept"]

def aspect_ratio_chunk_size(num_rows: int, in_features: int, num_classes: int, divisor: int) -> int:
    """Rows per chunk for ``"aspect_ratio:divisor"``.

    A chunk's logits are ``(rows, C)``; choosing ``rows = N / ceil(C / D)``
    makes them about as large as the ``(N, D)`` input. Rounded up to a power of
    two, divided by ``divisor``, at most ``N``. Worked example: N=4096, D=512,
    C=32768 gives ceil(C/D)=64, 4096/64=64 rows, so 64 chunks of (64, 32768)
    logits -- 2M elements, the size of the input.
    """
    ratio = -(-num_classes // in_features)
    target = -(-num_rows // ratio)
    power_of_two = 1 << max(target - 1, 0).bit_length()
    return max(1, min(power_of_two // divisor, num_rows))


@dataclasses.dataclass(frozen=True)
class Buffer:
    """One allocation the op makes: its purpose, shape, dtype and when it is alive.

    ``stage`` is the pass that allocates it. ``span`` is "call" (made before
    the chunk loop, freed when the pass returns), "chunk" (remade per chunk,
    one generation alive at a time), "final" (made after the loop, when the
    chunk buffers are gone: a gradient rounded from its accumulator) or "kept"
    (outlives the pass: returned gradients and what forward saves for backward).
    """

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    stage: Stage
    span: Span
    purpose: str

    @property
    def nbytes(self) -> int:
        count = 1
        for size in self.shape:
            count *= size
        return count * self.dtype.itemsize


@dataclasses.dataclass(frozen=True)
class Plan:
    """Everything the chunk loop needs to know, resolved for one call.

    ``acc_policy`` is the resolved policy name; ``layout`` is the precision
    layout that actually runs (it can be another policy's, see ``notes``).
    """

    device_kind: str
    input_dtype: torch.dtype
    acc_dtype: torch.dtype
    acc_policy: str
    chunking_method: str | None
    batch_chunk_size: int
    num_rows: int
    in_features: int
    num_classes: int
    reduction: str
    layout: Layout
    needs_grad: tuple[bool, bool, bool]
    allow_retain_graph: bool
    notes: tuple[str, ...] = ()

    # ---- derived precision -------------------------------------------------
    def dtype(self, role: Role) -> torch.dtype:
        """The dtype a layout role ("input" or "acc") stands for in this plan."""
        return self.input_dtype if role == "input" else self.acc_dtype

    @property
    def stats_dtype(self) -> torch.dtype:
        """Softmax statistics, per-row losses and dz: at least fp32 and at least the logits'."""
        return torch.promote_types(self.dtype(self.layout.logits.result), torch.float32)

    @property
    def loss_sum_dtype(self) -> torch.dtype:
        """The cross-chunk loss total: fp64, so the loss never drifts with the chunk count."""
        return torch.float64

    @property
    def weight_grad_sum_dtype(self) -> torch.dtype:
        return self.dtype(self.layout.weight_grad_sum)

    @property
    def num_chunks(self) -> int:
        return -(-self.num_rows // self.batch_chunk_size)

    @property
    def needs_input_grad(self) -> bool:
        return self.needs_grad[0]

    @property
    def needs_weight_grad(self) -> bool:
        return self.needs_grad[1]

    @property
    def needs_bias_grad(self) -> bool:
        return self.needs_grad[2]

    @property
    def any_grad(self) -> bool:
        return any(self.needs_grad)

    def gemm_operand_dtype(self, gemm: Gemm) -> torch.dtype:
        return self.dtype(gemm.operands)

    def gemm_result_dtype(self, gemm: Gemm) -> torch.dtype:
        return self.dtype(gemm.result)

    @property
    def rounds_grad_logits_narrow(self) -> bool:
        """Whether dz is rounded to the input dtype for a backward GEMM."""
        narrow_input_grad = self.needs_input_grad and self.layout.grad_input.operands == "input"
        narrow_weight_grad = self.needs_weight_grad and self.layout.grad_weight.operands == "input"
        return (narrow_input_grad or narrow_weight_grad) and self.input_dtype != self.stats_dtype

    @property
    def rescales_grad_logits(self) -> bool:
        """Whether dz needs a power-of-two rescale to stay normal in the input dtype (fp16)."""
        return self.rounds_grad_logits_narrow and torch.finfo(self.input_dtype).max < 1e6

    @property
    def upcasts_fp16_gemms(self) -> bool:
        """Whether fp16 GEMMs on CPU upcast their operands per call (only when acc_dtype is fp16 too)."""
        return self.device_kind == "cpu" and self.input_dtype == torch.float16 and self.acc_dtype == torch.float16

    def upcasts_weight_for(self, gemm_name: str) -> bool:
        """Whether the named GEMM ("logits" or "grad_input") reads the weight upcast to acc_dtype.

        The upcast happens a block of rows at a time (:func:`lce.gemm.rows_per_block`),
        so no ``(C, D)`` acc_dtype copy of the weight ever exists.
        """
        if self.acc_dtype == self.input_dtype:
            return False
        if gemm_name == "grad_input" and not self.needs_input_grad:
            return False
        return getattr(self.layout, gemm_name).operands == "acc"

    @property
    def uses_input_in_acc(self) -> bool:
        """Whether each chunk of the input is upcast to acc_dtype."""
        if self.acc_dtype == self.input_dtype:
            return False
        if self.layout.logits.operands == "acc":
            return True
        return self.needs_weight_grad and self.layout.grad_weight.operands == "acc"

    @property
    def uses_weight_grad_accumulator(self) -> bool:
        """Whether a separate ``(C, D)`` buffer sums the weight gradient over chunks."""
        return self.needs_weight_grad and self.weight_grad_sum_dtype != self.input_dtype

    # ---- memory model ------------------------------------------------------
    @functools.cached_property
    def buffers(self) -> tuple[Buffer, ...]:
        """Every allocation of one forward + backward, in the order the loop makes them."""
        n, d, c, rows = self.num_rows, self.in_features, self.num_classes, self.batch_chunk_size
        rows = min(rows, n)
        in_dt, acc_dt, stats_dt = self.input_dtype, self.acc_dtype, self.stats_dtype
        scalar = self.reduction != "none"
        out: list[Buffer] = []

        grad_stage: Stage = "forward" if scalar else "backward"
        kept_grad: Span = "kept" if scalar else "call"

        def add(name: str, shape: tuple[int, ...], dtype: torch.dtype, stage: Stage, span: Span,
                purpose: str) -> None:
            out.append(Buffer(name, shape, dtype, stage, span, purpose))

        if not scalar:
            add("loss_per_row", (n,), in_dt, "forward", "kept", "the (N,) output of reduction='none'")
            add("row_logsumexp", (n,), stats_dt, "forward", "kept", "log-sum-exp per row, saved for backward")
        stages: tuple[Stage, ...] = ("forward",) if scalar else ("forward", "backward")
        for stage in stages:
            if stage == "backward" or self.any_grad or not scalar:
                add("row_weights", (n,), stats_dt, stage, "call", "class weight of each row's target, 0 if ignored")
        if self.needs_input_grad:
            add("grad_input", (n, d), in_dt, grad_stage, kept_grad, "gradient w.r.t. input (returned)")
        if self.needs_weight_grad:
            if self.uses_weight_grad_accumulator:
                add("weight_grad_accumulator", (c, d), self.weight_grad_sum_dtype, grad_stage, "call",
                    "sum of the weight gradient over all chunks, rounded once at the end")
                add("grad_weight", (c, d), in_dt, grad_stage, "final",
                    "gradient w.r.t. the weight, rounded from the accumulator (returned)")
            else:
                add("grad_weight", (c, d), in_dt, grad_stage, kept_grad,
                    "gradient w.r.t. the weight, accumulated in place (returned)")
        if self.needs_bias_grad:
            add("bias_grad_accumulator", (c,), stats_dt, grad_stage, "call", "bias gradient summed over chunks")
            add("grad_bias", (c,), in_dt, grad_stage, "final",
                "gradient w.r.t. the bias (returned)")

                # Per chunk: the logits in every pass that computes them, the gradient chunk where gradients are made.
        logits_dt = self.gemm_result_dtype(self.layout.logits)
        for stage in stages:
            if self.uses_input_in_acc:
                add("input_chunk_in_acc", (rows, d), acc_dt, stage, "chunk", "chunk of the input upcast to acc_dtype")
            add("logits_chunk", (rows, c), logits_dt, stage, "chunk", "logits of one chunk, then softmax in place")
            if self.upcasts_weight_for("logits") or (stage == grad_stage and self.upcasts_weight_for("grad_input")):
                block = min(rows_per_block(d), c)
                add("weight_block_in_acc", (block, d), acc_dt, stage, "chunk",
                    "a block of weight rows upcast to acc_dtype (no full-size copy)")
                add("logits_block", (rows, block), acc_dt, stage, "chunk",
                    "one block's GEMM result before it is placed")
            if logits_dt != stats_dt:
                add("probs_chunk", (rows, c), stats_dt, stage, "chunk", "softmax of the chunk in fp32")
            if self.upcasts_fp16_gemms:
                add("fp16_gemm_upcast", (c, d), torch.float32, stage, "chunk",
                    "fp32 copy of the fp16 weight for one GEMM (CPU has no fast fp16 GEMM)")
        if self.any_grad:
            if self.rounds_grad_logits_narrow:
                add("grad_logits_narrow", (rows, c), in_dt, grad_stage, "chunk",
                    "dz rounded for the low-precision GEMMs")
            gi_dt = self.gemm_result_dtype(self.layout.grad_input)
            if self.needs_input_grad and gi_dt != in_dt:
                add("grad_input_chunk", (rows, d), gi_dt, grad_stage, "chunk",
                    "grad_input of one chunk before rounding")
            wg_operands = self.gemm_operand_dtype(self.layout.grad_weight)
            wg_product = self.gemm_result_dtype(self.layout.grad_weight)
            if self.needs_weight_grad and not (wg_operands == wg_product == self.weight_grad_sum_dtype):
                add("weight_grad_chunk", (c, d), wg_product, grad_stage, "chunk",
                    "one chunk's weight-gradient product")
        return tuple(out)

    @property
    def peak_extra_bytes(self) -> int:
        """Predicted peak of bytes allocated by one forward + backward, beyond the inputs.

        In each pass the peak is what that pass keeps from earlier, plus its
        call-long buffers, plus the larger of one chunk's buffers and the
        buffers made after the loop. For the scalar reductions backward only
        scales the kept gradients, in place, or -- with ``allow_retain_graph``
        -- into fresh copies, which then coexist with the kept ones.
        """
        def total(stage: Stage, span: Span) -> int:
            return sum(b.nbytes for b in self.buffers if b.stage == stage and b.span == span)

        forward = total("forward", "call") + max(total("forward", "chunk"), total("forward", "final"))
        kept = total("forward", "kept") + total("forward", "final")
        backward = kept + total("backward", "call") + max(total("backward", "chunk"), total("backward", "final"))
        if self.reduction != "none" and self.allow_retain_graph:
            backward = 2 * kept
        return max(forward + total("forward", "kept"), backward)

    def __str__(self) -> str:
        layout = self.layout
        lines = [
            f"lce plan on {self.device_kind}: input {dtype_name(self.input_dtype)}, acc {dtype_name(self.acc_dtype)}, "
            f"policy {self.acc_policy}",
            f"  shape      N={self.num_rows} D={self.in_features} C={self.num_classes}, "
            f"reduction={self.reduction!r}",
            f"  chunking   {self.chunking_method or 'explicit'}: {self.num_chunks} chunk(s) of "
            f"{self.batch_chunk_size} rows",
            f"  GEMMs      logits {self._gemm_text(layout.logits)}, grad_input "
            f"{self._gemm_text(layout.grad_input)}, grad_weight {self._gemm_text(layout.grad_weight)}",
            f"  sums       softmax/loss {dtype_name(self.stats_dtype)}, loss total {dtype_name(self.loss_sum_dtype)}, "
            f"weight grad {dtype_name(self.weight_grad_sum_dtype)}",
            "  buffers",
        ]
        for b in self.buffers:
            lines.append(f"    {b.name:<24} {str(b.shape):<16} {dtype_name(b.dtype):<9} {b.stage:<8} {b.span:<5} "
                         f"{b.nbytes / 2**20:10.2f} MiB")
        lines.append(f"  predicted peak extra memory: {self.peak_extra_bytes / 2**20:.2f} MiB")
        lines.extend(f"  note: {note}" for note in self.notes)
        return "\n".join(lines)

    def _gemm_text(self, gemm: Gemm) -> str:
        operands = dtype_name(self.gemm_operand_dtype(gemm))
        result = dtype_name(self.gemm_result_dtype(gemm))
        return operands if operands == result else f"{operands}->{result}"


def make_plan(
    options: LinearCrossEntropyOptions,
    *,
    num_rows: int,
    in_features: int,
    num_classes: int,
    dtype: torch.dtype,
    device: torch.device,
    reduction: str = "mean",
    needs_grad: tuple[bool, bool, bool] = (True, True, False),
) -> Plan:
    """Resolve ``options`` for one call (the rules of the options contract).

    * ``"auto"`` policy/chunking come from :func:`lce.policies.auto_pick` for
      (device kind, dtype); an explicit ``batch_chunk_size`` switches "auto"
      chunking off;
    * an explicit chunking method decides the size; a ``batch_chunk_size``
      that disagrees with it is a ``ValueError``;
    * ``acc_dtype=None`` becomes fp32 for fp16/bf16 input under the "auto"
      policy where a mixed-precision GEMM exists, else the input dtype.
    """
    kind = device_kind_of(device)
    pick = auto_pick(kind, dtype)
    policy = pick.acc_policy if options.acc_policy == "auto" else options.acc_policy
    method = options.chunking_method
    if method == "auto":
        method = None if options.batch_chunk_size is not None else pick.chunking_method

    notes: list[str] = []
    if method is None:
        chunk = num_rows if options.batch_chunk_size is None else min(options.batch_chunk_size, num_rows)
    else:
        chunk = aspect_ratio_chunk_size(num_rows, in_features, num_classes, parse_chunking_method(method))
        if options.batch_chunk_size is not None and options.batch_chunk_size != chunk:
            raise ValueError(
                f"batch_chunk_size={options.batch_chunk_size} disagrees with chunking_method="
                f"{method!r}, which gives {chunk} rows for N={num_rows}, D={in_features}, "
                f"C={num_classes}; pass only one of them"
            )
        if options.chunking_method == "auto" and chunk < min(pick.min_rows, num_rows):
            chunk = min(pick.min_rows, num_rows)
            notes.append(f"auto chunking on {kind} keeps at least {pick.min_rows} rows per chunk (GEMM efficiency)")
    chunk = max(1, chunk)

    acc_dtype = options.acc_dtype
    if acc_dtype is None:
        use_fp32 = options.acc_policy == "auto" and has_mixed_precision_mm(device, kind, dtype)
        acc_dtype = torch.float32 if use_fp32 else dtype

    layout_policy = policy
    if kind == "cpu" and policy == "compact" and acc_dtype != dtype:
        layout_policy = "balanced"
        notes.append(COMPACT_ON_CPU_NOTE)
    layout = LAYOUTS[kind][layout_policy]
    if kind == "cpu" and dtype == torch.float16 and acc_dtype != dtype:
        layout = _all_gemms_in_acc(layout)
        notes.append("fp16 GEMMs run in acc_dtype on CPU: fp16 GEMMs are emulated there, so narrow ones "
                     "would only lose precision, not time")

    return Plan(
        device_kind=kind,
        input_dtype=dtype,
        acc_dtype=acc_dtype,
        acc_policy=policy,
        chunking_method=method,
        batch_chunk_size=chunk,
        num_rows=num_rows,
        in_features=in_features,
        num_classes=num_classes,
        reduction=reduction,
        layout=layout,
        needs_grad=needs_grad,
        allow_retain_graph=options.allow_retain_graph,
        notes=tuple(notes),
    )


def _all_gemms_in_acc(layout: Layout) -> Layout:
    wide = Gemm(operands="acc", result="acc")
    return dataclasses.replace(layout, logits=wide, grad_input=wide, grad_weight=wide)
