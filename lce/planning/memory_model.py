"""The memory model: every buffer one forward + backward allocates, and the predicted peak.

A class-tiled plan (``class_chunk_size`` below C) has the same buffers with a
block of classes in place of the whole vocabulary, plus the input gradient of
its rows summed over the blocks. Soft-capping adds one workspace of
:attr:`~lce.planning.plan.Plan.workspace_columns` columns beside a chunk's logits
(step "workspace"); a z-loss adds per-row values only; ``return_lse`` adds the
returned ``(N,)`` fp32 log-sum-exp. A batch-invariant plan pads the call to whole chunks: its per-row
buffers have :attr:`~lce.planning.plan.Plan.loop_rows` rows, and where N is not a whole number of chunks the last
chunk reads a padded copy of its input rows (and writes its input gradient to a chunk-sized buffer). The per-token
log-probabilities (``plan.op == "log_probs"``, :mod:`lce.passes.logprob_passes`) run as reduction "none"
does, with per-row outputs and saved statistics and workspaces of their own
(:func:`_token_workspaces`).

:func:`plan_buffers` follows the chunk loop of :mod:`lce.passes` and the GEMMs
of :mod:`lce.passes.gemm` and lists what they allocate, with the shapes and dtypes the
:class:`~lce.planning.plan.Plan` gives them: the buffers made once per pass, those remade
per chunk, and the gradients rounded after the loop. A chunk buffer also says
through which steps of the chunk it lives (the logits GEMM, the conversion to
the stats dtype, the backward GEMMs, ...), so :func:`chunk_peak_bytes` is what a
chunk really holds at once, not the sum of everything it ever makes.
:mod:`lce.planning.buffers` builds the predicted peak from those.

Nothing here reads the loop's code, so two tests tie them together:
``tests/lce/test_memory_model.py`` runs the op for every policy x device kind x
reduction x dtype x acc_dtype, records every tensor it creates, and requires
each listed buffer to be made with its shape and dtype, nothing as large as a
chunk of logits to be made unlisted, and each pass's chunk peak to equal the
recorded one; ``tests/analysis/test_memory.py`` compares the predicted peak with
one measured by the allocator (which also sees the kernels' own workspaces).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from .blocks import TARGET_ROWS_PER_GEMM, in_fp32_blocks, rows_per_block
from .buffers import Buffer, Span, Stage, Step
from .plan import GemmName, Plan

__all__ = ["plan_buffers"]

def plan_buffers(plan: Plan) -> tuple[Buffer, ...]:
    """Every allocation of one forward + backward under ``plan``, in the order the loop makes them."""
    return (*_call_buffers(plan), *_chunk_buffers(plan))


def _token_row_buffers(plan: Plan) -> list[Buffer]:
    """The per-row values of the per-token log-probabilities: outputs, what forward saves, backward's coefficients."""
    n, stats_dt = plan.loop_rows, plan.stats_dtype  # a batch-invariant call's padded rows included
    entropy = plan.returns_entropy
    rows = [("token_log_probs", "forward", "kept", "the returned log p(target) per row", True),
            ("token_entropy", "forward", "kept", "the returned entropy per row", entropy),
            ("row_nll", "forward", "kept", "-log p(target) per row, saved for backward", True),
            ("row_logsumexp", "forward", "kept", "log-sum-exp of the tempered logits, saved for backward", True),
            ("row_other_prob", "forward", "kept", "1 - p(target) per row, saved for backward", True),
            ("row_entropy", "forward", "kept", "the entropy per row, saved for backward", entropy),
            ("row_entropy_gap", "forward", "kept", "H + log p(target) per row, saved for backward", entropy),
            ("row_grad_coefficients", "backward", "call", "incoming gradients over the temperature, 0 if ignored",
             any(plan.needs_grad))]
    returned = ("token_log_probs", "token_entropy")  # the caller's N rows, the padded ones left out
    return [Buffer(name, (plan.num_rows if name in returned else n,), stats_dt, stage, span, purpose)
            for name, stage, span, purpose, made in rows if made]


def _grad_stage(plan: Plan) -> Stage:
    """The pass that computes the gradients: forward for "mean"/"sum", backward for "none"."""
    return "forward" if plan.reduction != "none" else "backward"


def _stages(plan: Plan) -> tuple[Stage, ...]:
    """The passes that run: "none" has a backward pass only when gradients are due."""
    return ("forward", "backward") if plan.reduction == "none" and any(plan.needs_grad) else ("forward",)


def _in_fp32(plan: Plan, gemm: GemmName) -> bool:
    """Whether :mod:`lce.passes.gemm` computes this GEMM on fp32 copies of blocks of its operands
    (:attr:`~lce.planning.plan.Plan.narrow_gemms_in_fp32`; CPU layouts only: the CUDA layouts model the GPU's kernels).

    For the weight gradient, only when it adds straight into a sum of its own dtype, the one case
    the CPU layouts produce (a narrow product for a wider sum makes these layouts run in acc_dtype).
    """
    if plan.device_kind != "cpu" or not plan.gemm_in_fp32(gemm):
        return False
    if gemm == "grad_weight":
        return plan.gemm_dtypes(gemm).result == plan.weight_grad_sum_dtype
    return True


def _call_buffers(plan: Plan) -> list[Buffer]:
    """What each pass makes before its chunk loop, and the gradients it rounds after it."""
    n, d, c = plan.loop_rows, plan.in_features, plan.num_classes  # a batch-invariant call's padded rows included
    in_dt, stats_dt = plan.input_dtype, plan.stats_dtype
    scalar = plan.reduction != "none"
    grad_stage = _grad_stage(plan)
    kept_grad: Span = "kept" if scalar else "call"
    out: list[Buffer] = []
    if plan.op == "log_probs":
        out += _token_row_buffers(plan)
    elif not scalar:
        out.append(Buffer("loss_per_row", (n,), in_dt, "forward", "kept", "the (N,) output of reduction='none'"))
        out.append(Buffer("row_logsumexp", (n,), stats_dt, "forward", "kept",
                          "log-sum-exp per row, saved for backward"))
        if plan.saves_other_prob:
            out.append(Buffer("row_other_prob", (n,), stats_dt, "forward", "kept",
                              "1 - p_y per row, saved for backward (no step of it sees a whole row's softmax)"))
    if plan.return_lse:
        # reduction "none" copies the caller's N rows out; a scalar reduction's pass makes it, padded rows included
        out.append(Buffer("row_logsumexp_out", (n if scalar else plan.num_rows,), torch.float32, "forward", "kept",
                          "the returned per-row log-sum-exp (return_lse)"))
    for stage in _stages(plan) if plan.op == "cross_entropy" else ("forward",):
        out.append(Buffer("row_weights", (n,), stats_dt, stage, "call",
                          "class weight of each row's target, 0 if ignored"))
    if plan.needs_grad.input:
        out.append(Buffer("grad_input", (plan.num_rows, d), in_dt, grad_stage, kept_grad,
                          "gradient w.r.t. input (returned)"))
    if plan.needs_grad.weight:
        if plan.weight_grad_sum_dtype != in_dt:
            out.append(Buffer("weight_grad_accumulator", (c, d), plan.weight_grad_sum_dtype, grad_stage, "call",
                              "sum of the weight gradient over all chunks, rounded once at the end"))
            out.append(Buffer("grad_weight", (c, d), in_dt, grad_stage, "final",
                              "gradient w.r.t. the weight, rounded from the accumulator (returned)"))
        else:
            out.append(Buffer("grad_weight", (c, d), in_dt, grad_stage, kept_grad,
                              "gradient w.r.t. the weight, accumulated in place (returned)"))
    if plan.needs_grad.bias:
        if stats_dt != in_dt:
            out.append(Buffer("bias_grad_accumulator", (c,), stats_dt, grad_stage, "call",
                              "bias gradient summed over chunks"))
            out.append(Buffer("grad_bias", (c,), in_dt, grad_stage, "final",
                              "gradient w.r.t. the bias, rounded from the accumulator (returned)"))
        else:
            out.append(Buffer("grad_bias", (c,), in_dt, grad_stage, kept_grad,
                              "gradient w.r.t. the bias, accumulated in place (returned)"))
    return out


def _steps(plan: Plan, stage: Stage) -> tuple[Step, ...]:
    """The steps of one chunk in a pass, in loop order."""
    steps: list[Step] = ["logits"]
    if plan.gemm_dtypes("logits").result != plan.stats_dtype:
        steps.append("to_stats")
    if plan.softcap is not None or plan.op == "log_probs":
        steps.append("workspace")
    if stage == _grad_stage(plan):
        steps += [step for step, wanted in zip(("grad_input", "grad_weight", "grad_bias"), plan.needs_grad,
                                               strict=True) if wanted]
        if "grad_weight" in steps and plan.target_residual_to_weight:  # the target rows' residuals, added first
            steps.insert(steps.index("grad_weight"), "grad_weight_target")
    return tuple(steps)


def _token_workspaces(plan: Plan, stage: Stage) -> list[tuple[str, str]]:
    """The workspaces of columns one chunk of the per-token log-probabilities holds at once (name, purpose):
    forward's exponentials; in backward the capped, tempered logits (with a soft cap) and the probabilities
    beside their logarithms (when the entropy, whose gradient needs both, is computed; the model assumes a
    gradient reaches it)."""
    if stage == "forward":
        return [("token_exp_workspace", "exp(u - max) of a few columns: the row sums, and the entropy's terms")]
    out = []
    if plan.softcap is not None:
        out.append(("token_capped_workspace", "capped, tempered logits of a few columns, then log p and dz"))
    if plan.returns_entropy:
        out.append(("token_probs_workspace", "p of a few columns beside log p (the entropy's gradient)"))
    return out


def _chunk_buffers(plan: Plan) -> list[Buffer]:
    """What one chunk makes: its logits in every pass, dz and the gradient products where gradients are made."""
    return [buffer for stage in _stages(plan) for buffer in _chunk_buffers_of(plan, stage)]


def _chunk_buffers_of(plan: Plan, stage: Stage) -> list[Buffer]:
    """One chunk of one pass, following chunk_logits, chunk_loss_and_softmax_ and GradientSums.add_chunk."""
    d, c = plan.in_features, plan.class_chunk_size  # a class-tiled chunk holds one block of classes at a time
    rows = min(plan.batch_chunk_size, plan.loop_rows)
    in_dt, acc_dt, stats_dt = plan.input_dtype, plan.acc_dtype, plan.stats_dtype
    logits_dt = plan.gemm_dtypes("logits").result
    steps = _steps(plan, stage)
    out: list[Buffer] = []

    def add(name: str, shape: tuple[int, ...], dtype: torch.dtype, alive: Iterable[Step], purpose: str) -> None:
        out.append(Buffer(name, shape, dtype, stage, "chunk", purpose, tuple(s for s in steps if s in alive)))

    if plan.input_chunk_in_acc:
        # reduction="none" drops it after the logits when no gradient is made in the pass, unless every class
        # block of the chunk needs it
        keeps_input = plan.reduction != "none" or stage == "backward" or plan.tiles_classes
        add("input_chunk_in_acc", (rows, d), acc_dt, steps if keeps_input else ("logits", "to_stats"),
            "chunk of the input upcast to acc_dtype")
    if plan.loop_rows > plan.num_rows:  # lce.passes.chunk.input_rows: the padded last chunk's copy of its input
        add("padded_input_chunk", (rows, d), in_dt, steps,
            "the last chunk's input rows with rows of zeros after them (batch-invariant padding)")
    if plan.op == "log_probs":
        for name, purpose in _token_workspaces(plan, stage):
            add(name, (rows, plan.workspace_columns), stats_dt, ("workspace",), purpose)
    elif "workspace" in steps:
        add("softcap_workspace", (rows, plan.workspace_columns), stats_dt, ("workspace",),
            "capped logits of a few columns, then their softmax and dz (the chunk's buffer keeps tanh)")
    # The logits exist from the GEMM on, until they are converted to the stats dtype.
    last = steps.index("to_stats") + 1 if "to_stats" in steps else len(steps)
    add("logits_chunk", (rows, c), logits_dt, steps[:last],
        "logits of one chunk (then its softmax and dz, in place, when it has the stats dtype)")
    upcast_for = [gemm for gemm in ("logits", "grad_input") if gemm in steps and plan.upcasts_weight_for(gemm)]
    if upcast_for:
        block = min(rows_per_block(d, plan.device_kind), c)
        add("weight_block_in_acc", (block, d), acc_dt, upcast_for,
            "a block of weight rows upcast to acc_dtype (no full-size copy)")
        if "logits" in upcast_for:
            add("logits_block", (rows, block), acc_dt, ("logits",), "one block's logits before they are placed")
    if "to_stats" in steps:
        add("probs_chunk", (rows, c), stats_dt, steps[steps.index("to_stats"):],
            "the chunk's logits in fp32, then softmax and dz")
    backward_steps = [step for step in steps if step.startswith("grad_")]
    rounded: list[torch.dtype] = []
    for gemm in ("grad_input", "grad_weight"):
        dtype = plan.gemm_dtypes(gemm).operands
        if gemm in steps and dtype != stats_dt and dtype not in rounded:
            rounded.append(dtype)
            first = "grad_weight_target" if gemm == "grad_weight" and "grad_weight_target" in steps else gemm
            add("grad_logits_narrow" if dtype == in_dt else "grad_logits_in_acc", (rows, c), dtype,
                backward_steps[backward_steps.index(first):], "dz rounded to a backward GEMM's operand dtype")
    # lce.passes.gradients.TargetResidual: the rounding residual of each row's target entry, times the target's weight
    # row
    # (added in the input gradient's GEMM) and times the row's input (added to a wider weight-gradient sum)
    if "grad_input" in steps and plan.gemm_dtypes("grad_input").operands != stats_dt:
        add("target_input_correction", (rows, d), in_dt, ("grad_input",),
            "the target entries' rounding residual times their weight rows, added in the GEMM's sum")
    # lce.passes.gradients.TargetResidual.add_to_weight_rows_, a block of rows at a time
    if "grad_weight_target" in steps:
        block = min(rows, TARGET_ROWS_PER_GEMM)
        add("target_products", (block, d), torch.float32, ("grad_weight_target",),
            "the target entries' rounding residual times the rows' input")
        add("target_members", (block, block), torch.float32, ("grad_weight_target",),
            "which rows share a target (1 or 0), the GEMM that sums each target's products")
        add("target_class_sums", (block, d), torch.float32, ("grad_weight_target",),
            "each row's target's summed products, written to the target rows of the sum")
    grad_input_dt = plan.gemm_dtypes("grad_input").result
    if "grad_input" in steps and plan.tiles_classes:
        # made after the statistics sweep; the gradient sweep, which holds the most, has it throughout
        add("grad_input_rows_sum", (rows, d), stats_dt, steps, "grad_input of one chunk summed over the class blocks")
        if not plan.sums_input_blocks_in_place:
            add("grad_input_chunk", (rows, d), grad_input_dt, ("grad_input",), "one class block's grad_input product")
        # (a GEMM in fp32 rounds into its product after its fp32 total, listed below, and holds more then)
        if grad_input_dt != stats_dt and not _in_fp32(plan, "grad_input"):
            add("grad_input_chunk_in_sum", (rows, d), stats_dt, ("grad_input",),
                "that product converted to the sum's dtype before it is added")
    elif "grad_input" in steps and grad_input_dt != in_dt:
        add("grad_input_chunk", (rows, d), grad_input_dt, ("grad_input",),
            "grad_input of one chunk before rounding")
    elif ("grad_input" in steps and plan.loop_rows > plan.num_rows
          and not plan.upcasts_weight_for("grad_input")):  # GradientSums._input_rows_out
        add("padded_grad_input_chunk", (rows, d), in_dt, ("grad_input",),
            "the padded last chunk's input gradient, before its real rows are copied out")
    weight_gemm = plan.gemm_dtypes("grad_weight")
    # (lce.passes.headroom's bounds, a (rows,) or (C,) fp32 sum of |dz|, are made and freed before the step's GEMM)
    summed_in_place = (weight_gemm.operands == weight_gemm.result == plan.weight_grad_sum_dtype
                       or (plan.mixed_addmm and weight_gemm.result == plan.weight_grad_sum_dtype))
    if "grad_weight" in steps and not summed_in_place:
        block = (min(rows_per_block(d, plan.device_kind), c), d)
        add("weight_grad_chunk", block, weight_gemm.result, ("grad_weight",),
            "one block of classes of a chunk's weight-gradient product (no (C, D) product exists)")
        common = torch.promote_types(weight_gemm.result, plan.weight_grad_sum_dtype)
        if common != weight_gemm.result:
            add("weight_grad_block_in_sum", block, common, ("grad_weight",),
                "that block converted to the sum's dtype before it is added")
    if "grad_bias" in steps:
        add("bias_grad_chunk", (c,), stats_dt, ("grad_bias",), "dz summed over a chunk's rows")
    out += _in_fp32_buffers(plan, stage, steps, rows)
    return out


def _in_fp32_buffers(plan: Plan, stage: Stage, steps: tuple[Step, ...], rows: int) -> list[Buffer]:
    """The fp32 temporaries of the GEMMs :mod:`lce.passes.gemm` computes on fp32 copies of their operands' blocks."""
    d, c = plan.in_features, plan.class_chunk_size
    out: list[Buffer] = []

    def add(name: str, shape: tuple[int, ...], step: Step, purpose: str) -> None:
        out.append(Buffer(name, shape, torch.float32, stage, "chunk",
                          purpose + " (this CPU has no fast GEMM in the input dtype)", (step,)))

    def product(step: Step, m: int, k: int, n: int, names: tuple[str, str, str], b_is_weight_t: bool) -> None:
        """(m, k) @ (k, n) cut as lce.planning.blocks.in_fp32_blocks cuts it; ``names``: the operands and the result.
        Shapes in memory order: a block of columns of ``W.T`` (the logits' ``b``) is a block of rows of W."""
        a, b, result = names
        blocks = in_fp32_blocks(m, k, n)
        if blocks.axis == "n":
            add(f"{a}_fp32", (m, k), step, f"fp32 copy of {a}")
            add(f"{b}_block_fp32", (blocks.size, k) if b_is_weight_t else (k, blocks.size), step,
                f"fp32 copy of a block of {b}")
            add(f"{result}_block_fp32", (m, blocks.size), step, f"one block of {result} in fp32")
        else:
            add(f"{result}_sum_fp32", (m, n), step, f"{result} summed over the blocks in fp32")
            add(f"{a}_block_fp32", (m, blocks.size), step, f"fp32 copy of a block of {a}")
            add(f"{b}_block_fp32", (blocks.size, n), step, f"fp32 copy of a block of {b}")

    if "logits" in steps and _in_fp32(plan, "logits"):
        product("logits", rows, d, c, ("input_chunk", "weight", "logits"), b_is_weight_t=True)
    if "grad_input" in steps and _in_fp32(plan, "grad_input"):
        product("grad_input", rows, c, d, ("grad_logits", "weight", "grad_input"), b_is_weight_t=False)
    if "grad_weight" in steps and _in_fp32(plan, "grad_weight"):
        block = min(rows_per_block(d), c)
        add("input_chunk_fp32", (rows, d), "grad_weight", "fp32 copy of the input chunk")
        add("weight_grad_block_fp32", (block, d), "grad_weight", "a block of the weight gradient in fp32")
        add("grad_logits_block_fp32", (rows, block), "grad_weight", "the matching columns of dz in fp32")
    return out
