"""The memory model: every buffer one forward + backward allocates, and the predicted peak.

:func:`plan_buffers` walks the chunk loop of :mod:`lce.chunked` step by step
and lists what each step allocates, with the dtypes the :class:`~lce.plan.Plan`
gives it: the buffers made once per call, those remade per chunk, and the
gradients rounded after the loop. :func:`peak_extra_bytes` turns the list into
the predicted peak. Two tests keep it honest: ``tests/test_memory_model.py``
runs the loop under an allocation recorder for every policy, device kind,
reduction and dtype and checks that every buffer listed here is made, with its
shape and dtype, and that nothing large is made that is not listed; the
analysis (``tests/test_analysis_memory.py``) compares the peak with a
measured one.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Literal

import torch

from .gemm import rows_per_block

if TYPE_CHECKING:
    from .plan import Plan

__all__ = ["Buffer", "Stage", "Span", "plan_buffers", "peak_extra_bytes"]

Stage = Literal["forward", "backward"]
Span = Literal["call", "chunk", "final", "kept"]


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


def plan_buffers(plan: Plan) -> tuple[Buffer, ...]:
    """Every allocation of one forward + backward under ``plan``, in the order the loop makes them."""
    return (*_call_buffers(plan), *_chunk_buffers(plan))


def _grad_stage(plan: Plan) -> Stage:
    """The pass that computes the gradients: forward for "mean"/"sum", backward for "none"."""
    return "forward" if plan.reduction != "none" else "backward"


def _stages(plan: Plan) -> tuple[Stage, ...]:
    return ("forward",) if plan.reduction != "none" else ("forward", "backward")


def _uses_weight_grad_accumulator(plan: Plan) -> bool:
    """Whether a ``(C, D)`` buffer separate from the gradient sums the weight gradient over chunks."""
    return plan.needs_grad.weight and plan.weight_grad_sum_dtype != plan.input_dtype


def _call_buffers(plan: Plan) -> list[Buffer]:
    """What each pass makes before its chunk loop, and what it rounds after it."""
    n, d, c = plan.num_rows, plan.in_features, plan.num_classes
    in_dt, stats_dt = plan.input_dtype, plan.stats_dtype
    scalar = plan.reduction != "none"
    grad_stage = _grad_stage(plan)
    kept_grad: Span = "kept" if scalar else "call"
    out: list[Buffer] = []
    if not scalar:
        out.append(Buffer("loss_per_row", (n,), in_dt, "forward", "kept", "the (N,) output of reduction='none'"))
        out.append(Buffer("row_logsumexp", (n,), stats_dt, "forward", "kept",
                          "log-sum-exp per row, saved for backward"))
    for stage in _stages(plan):
        if stage == "backward" or any(plan.needs_grad) or not scalar:
            out.append(Buffer("row_weights", (n,), stats_dt, stage, "call",
                              "class weight of each row's target, 0 if ignored"))
    if plan.needs_grad.input:
        out.append(Buffer("grad_input", (n, d), in_dt, grad_stage, kept_grad, "gradient w.r.t. input (returned)"))
    if plan.needs_grad.weight:
        if _uses_weight_grad_accumulator(plan):
            out.append(Buffer("weight_grad_accumulator", (c, d), plan.weight_grad_sum_dtype, grad_stage, "call",
                              "sum of the weight gradient over all chunks, rounded once at the end"))
            out.append(Buffer("grad_weight", (c, d), in_dt, grad_stage, "final",
                              "gradient w.r.t. the weight, rounded from the accumulator (returned)"))
        else:
            out.append(Buffer("grad_weight", (c, d), in_dt, grad_stage, kept_grad,
                              "gradient w.r.t. the weight, accumulated in place (returned)"))
    if plan.needs_grad.bias:
        out.append(Buffer("bias_grad_accumulator", (c,), stats_dt, grad_stage, "call",
                          "bias gradient summed over chunks"))
        out.append(Buffer("grad_bias", (c,), in_dt, grad_stage, "final", "gradient w.r.t. the bias (returned)"))
    return out


def _chunk_buffers(plan: Plan) -> list[Buffer]:
    """What one chunk makes: its logits in every pass that computes them, dz products where gradients are made."""
    d, c = plan.in_features, plan.num_classes
    rows = min(plan.batch_chunk_size, plan.num_rows)
    in_dt, acc_dt, stats_dt = plan.input_dtype, plan.acc_dtype, plan.stats_dtype
    grad_stage = _grad_stage(plan)
    logits_dt = plan.gemm_dtypes("logits").result
    out: list[Buffer] = []
    for stage in _stages(plan):
        if plan.input_chunk_in_acc:
            out.append(Buffer("input_chunk_in_acc", (rows, d), acc_dt, stage, "chunk",
                              "chunk of the input upcast to acc_dtype"))
        out.append(Buffer("logits_chunk", (rows, c), logits_dt, stage, "chunk",
                          "logits of one chunk, then softmax in place"))
        if plan.upcasts_weight_for("logits") or (stage == grad_stage and plan.upcasts_weight_for("grad_input")):
            block = min(rows_per_block(d), c)
            out.append(Buffer("weight_block_in_acc", (block, d), acc_dt, stage, "chunk",
                              "a block of weight rows upcast to acc_dtype (no full-size copy)"))
            out.append(Buffer("logits_block", (rows, block), acc_dt, stage, "chunk",
                              "one block's GEMM result before it is placed"))
        if logits_dt != stats_dt:
            out.append(Buffer("probs_chunk", (rows, c), stats_dt, stage, "chunk", "softmax of the chunk in fp32"))
        if plan.device_kind == "cpu" and in_dt == torch.float16 and acc_dt == torch.float16:
            out.append(Buffer("fp16_gemm_upcast", (c, d), torch.float32, stage, "chunk",
                              "fp32 copy of the fp16 weight for one GEMM (CPU has no fast fp16 GEMM)"))
    if any(plan.needs_grad):
        if plan.rounds_grad_logits_narrow:
            out.append(Buffer("grad_logits_narrow", (rows, c), in_dt, grad_stage, "chunk",
                              "dz rounded for the low-precision GEMMs"))
        grad_input_dt = plan.gemm_dtypes("grad_input").result
        if plan.needs_grad.input and grad_input_dt != in_dt:
            out.append(Buffer("grad_input_chunk", (rows, d), grad_input_dt, grad_stage, "chunk",
                              "grad_input of one chunk before rounding"))
        weight_gemm = plan.gemm_dtypes("grad_weight")
        if plan.needs_grad.weight and not (weight_gemm.operands == weight_gemm.result == plan.weight_grad_sum_dtype):
            out.append(Buffer("weight_grad_chunk", (c, d), weight_gemm.result, grad_stage, "chunk",
                              "one chunk's weight-gradient product"))
    return out


def peak_extra_bytes(plan: Plan) -> int:
    """Predicted peak of bytes allocated by one forward + backward, beyond the inputs.

    In each pass the peak is what that pass keeps from earlier, plus its
    call-long buffers, plus the larger of one chunk's buffers and the
    buffers made after the loop. For the scalar reductions backward only
    scales the kept gradients, in place, or -- with ``allow_retain_graph``
    -- into fresh copies, which then coexist with the kept ones.
    """
    buffers = plan.buffers

    def total(stage: Stage, span: Span) -> int:
        return sum(b.nbytes for b in buffers if b.stage == stage and b.span == span)

    forward = total("forward", "call") + max(total("forward", "chunk"), total("forward", "final"))
    kept = total("forward", "kept") + total("forward", "final")
    backward = kept + total("backward", "call") + max(total("backward", "chunk"), total("backward", "final"))
    if plan.reduction != "none" and plan.allow_retain_graph:
        backward = 2 * kept
    return max(forward + total("forward", "kept"), backward)
