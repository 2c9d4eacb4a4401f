"""The :class:`Plan`: what one call will run, as :func:`lce.planning.resolve.make_plan` resolved it.

The plan fixes the chunk size and count, ``acc_dtype``, the precision layout (a row of
:mod:`lce.planning.policies`' table), the backend of the elementwise passes, and answers every dtype question the
chunk loop (:mod:`lce.passes`) asks: each GEMM's operand and result dtype, the dtype of the softmax statistics and
of the gradient sums, which operands are upcast. It carries the buffers those choices allocate
(:mod:`lce.planning.memory_model` lists them) and so knows its predicted peak.
"""

from __future__ import annotations

import contextvars
import dataclasses
from collections.abc import Iterator
from typing import Literal, NamedTuple

import torch

from . import buffers as memory
from .buffers import Buffer
from .cpu_gemms import GemmSupport
from .options import dtype_name
from .policies import Gemm, Layout, Role

__all__ = ["Plan", "GradsNeeded", "GemmDtypes", "GemmName", "Op", "LOSS_SUM_DTYPE", "HEADROOM_OFF",
           "aspect_ratio_chunk_size"]

GemmName = Literal["logits", "grad_input", "grad_weight"]
Op = Literal["cross_entropy", "log_probs"]
"""What a plan computes: the loss of :func:`lce.linear_cross_entropy`, or the per-token log-probabilities (and
entropy) of :func:`lce.linear_log_probs`, which run as reduction "none" does (a forward of row statistics, a
backward that recomputes the logits chunk by chunk)."""


INVARIANT_ROW_MULTIPLE = 64
"""A batch-invariant chunk's rows are a multiple of this. PyTorch's CPU elementwise loops run whole vectors (up to
64 bf16 elements per step) and finish a contiguous tensor's last elements in scalar code, whose exp and log can differ
from the vector lanes' in the last bit; a chunk's (rows, classes) tensors and (rows,) vectors of a multiple of 64
rows have no such remainder, so a row's position in its chunk cannot change its bits."""

HEADROOM_OFF: contextvars.ContextVar[bool] = contextvars.ContextVar("lce_headroom_off", default=False)
"""Set by :func:`lce.testing.without_headroom`: plans made while it is true form fp16 gradients at their true size
(:attr:`Plan.gradient_headroom` False; :mod:`lce.passes.headroom` says what the headroom does), for studies that
measure what it changes."""

LOSS_SUM_DTYPE = torch.float64
"""The cross-chunk loss total: fp64, so the loss never drifts with the chunk count."""

WORKSPACE_ELEMENTS = 1 << 20
"""Soft-capped logits (and, for the per-token log-probabilities, every block of logits) are turned into
probabilities and dz this many elements at a time (see :attr:`Plan.workspace_columns`): the workspace beside a
chunk's logits stays small at any C."""


class GradsNeeded(NamedTuple):
    """Which gradients a call must produce (those of the tensors that require grad, under grad mode)."""

    input: bool
    weight: bool
    bias: bool


class GemmDtypes(NamedTuple):
    """The concrete precision of one GEMM in a plan."""

    operands: torch.dtype
    result: torch.dtype


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
    class_chunk_size: int
    num_rows: int
    in_features: int
    num_classes: int
    reduction: str
    layout: Layout
    needs_grad: GradsNeeded
    allow_retain_graph: bool
    notes: tuple[str, ...] = ()
    softcap: float | None = None
    z_loss: float = 0.0
    return_lse: bool = False
    loss_dtype: torch.dtype | None = None
    """The returned loss's dtype (lce only); None: the input dtype, as torch's op."""
    cpu_gemms: GemmSupport | None = None
    """How the CPU the call runs on does GEMMs in the input dtype (:mod:`lce.planning.cpu_gemms`); None off the CPU
    and for fp32/fp64 input. Recorded when the plan is made, so the loop and the memory model agree with it."""
    op: Op = "cross_entropy"
    returns_entropy: bool = False
    """For ``op="log_probs"``: whether the entropy is computed (and its gradient formed in backward)."""
    gradient_headroom: bool = False
    """Whether the gradients are formed scaled by powers of two that keep them in fp16's normal range
    (:mod:`lce.passes.headroom`): fp16 input, unless the plan was made under :func:`lce.testing.without_headroom`.
    Recorded when the plan is made, so forward and a recomputing backward agree."""
    fused_passes: bool = False
    """Whether a chunk's elementwise passes (row statistics, then dz in place) run as :mod:`lce.kernels`' Triton
    kernels, two passes over the logits, rather than a sequence of PyTorch ops: on CUDA with Triton, for the loss's
    passes with fp32 statistics and no soft-cap (:func:`lce.kernels.covers`); the same arithmetic either way."""
    passes_reason: str = ""
    """Which backend runs the elementwise passes and why, in words (printed by ``str(plan)``): the kernels with
    their triton, or the PyTorch ops and what keeps the kernels out (:func:`lce.kernels.unavailable_reason`)."""
    mixed_addmm: bool = False
    """Whether a low-precision weight-gradient product is summed into its fp32 accumulator by one GEMM per chunk
    (``torch.addmm`` with ``out_dtype``, where this CUDA build has it:
    :func:`lce.planning.device.mixed_addmm_supported`);
    otherwise its product is formed a block of classes at a time and added (:func:`lce.passes.gemm.add_mm_`)."""
    cuda_gemms: str = ""
    """On CUDA, how the mixed-precision GEMMs run, in words: probed on the device
    (:func:`lce.planning.device.mixed_mm_supported`,
    :func:`lce.planning.device.mixed_addmm_supported`) or assumed without a GPU; empty off CUDA."""
    autocast: torch.dtype | None = None
    """The dtype of the ``torch.autocast`` enabled when the plan was made (None: none), in which the head's
    fp32/bf16/fp16 tensors are taken (:mod:`lce.autocasting`); the plan's own dtypes then hold with autocast off."""
    batch_invariant: bool = False
    """Whether each row's outputs are a bitwise function of that row, the head, the options, the dtype and the
    device kind (:attr:`lce.planning.options.LinearCrossEntropyOptions.batch_invariant`): every chunk runs
    ``batch_chunk_size`` rows, the call padded to :attr:`padded_rows`."""
    padded_rows: int = 0
    """Rows the chunk loop runs: :attr:`num_rows` rounded up to whole chunks where :attr:`batch_invariant` (the
    padding rows are ignored), else :attr:`num_rows`."""
    buffers: tuple[Buffer, ...] = dataclasses.field(default=(), repr=False, compare=False)
    """Every allocation of one forward + backward, in the order the loop makes them (:mod:`lce.planning.memory_model`
    lists them when the plan is resolved)."""

    # ---- what the chunk loop asks ------------------------------------------
    @property
    def output_loss_dtype(self) -> torch.dtype:
        """The dtype the loss is returned in: :attr:`loss_dtype`, else the input dtype."""
        return self.input_dtype if self.loss_dtype is None else self.loss_dtype

    def dtype(self, role: Role) -> torch.dtype:
        """The dtype a layout role ("input" or "acc") stands for in this plan."""
        return self.input_dtype if role == "input" else self.acc_dtype

    def gemm_dtypes(self, name: GemmName) -> GemmDtypes:
        """Operand and result dtype of the named GEMM ("logits", "grad_input" or "grad_weight")."""
        gemm: Gemm = getattr(self.layout, name)
        return GemmDtypes(self.dtype(gemm.operands), self.dtype(gemm.result))

    @property
    def stats_dtype(self) -> torch.dtype:
        """Softmax statistics, per-row losses, dz and the bias-gradient sum: at least fp32 and at least
        the logits' dtype."""
        return torch.promote_types(self.gemm_dtypes("logits").result, torch.float32)

    @property
    def weight_grad_sum_dtype(self) -> torch.dtype:
        """Where the weight gradient is summed over chunks (the gradient itself when it is the input dtype). With
        one chunk of rows there is no sum over chunks: each class's product is complete once formed, and is
        rounded straight into the gradient, so no (C, D) accumulator is made (the layout's sum, rounded once,
        would give the same numbers) -- except in fp16 under :mod:`lce.passes.headroom`, whose power-of-two scale is
        chosen from the finished sum."""
        if self.num_chunks == 1 and not (self.input_dtype == torch.float16 and self.gradient_headroom):
            return self.input_dtype
        return self.dtype(self.layout.weight_grad_sum)

    @property
    def target_residual_to_weight(self) -> bool:
        """Whether the rounding residual of each row's target entry of dz goes to that target's weight-gradient row
        (:class:`lce.passes.gradients.TargetResidual`): where dz is rounded for the weight-gradient GEMM and the
        gradient
        is
        summed wider than that rounding (an accumulator), or formed in one chunk of rows from a product wider than
        it; never into fp16 running sums (:mod:`lce.passes.headroom`), nor into a sum of the operands' own width."""
        operands, product = self.gemm_dtypes("grad_weight")
        if operands == self.stats_dtype or (self.weight_grad_sum_dtype == torch.float16 and self.gradient_headroom):
            return False
        wider_sum = self.weight_grad_sum_dtype.itemsize > operands.itemsize
        wider_product = self.num_chunks == 1 and product.itemsize > operands.itemsize
        return wider_sum or wider_product

    @property
    def sums_input_blocks_in_place(self) -> bool:
        """Whether a class block's input-gradient product is summed into the chunk's fp32 input sum by the GEMM
        itself (:attr:`mixed_addmm`, low-precision operands, a result of the sum's dtype), with no product of its
        own (class tiling)."""
        operands, result = self.gemm_dtypes("grad_input")
        return (self.mixed_addmm and self.tiles_classes and operands != result == self.stats_dtype
                and not self.upcasts_weight_for("grad_input"))

    @property
    def loop_rows(self) -> int:
        """Rows the chunk loop walks: the padded rows of a batch-invariant call, else every row."""
        return max(self.padded_rows, self.num_rows)

    @property
    def num_chunks(self) -> int:
        return -(-self.loop_rows // self.batch_chunk_size)

    @property
    def num_class_chunks(self) -> int:
        return -(-self.num_classes // self.class_chunk_size)

    @property
    def tiles_classes(self) -> bool:
        """Whether the vocabulary is cut into blocks (the options' lce-only ``class_chunk_size``)."""
        return self.class_chunk_size < self.num_classes

    @property
    def workspace_columns(self) -> int:
        """Columns of the workspace in which soft-capped logits become probabilities and dz, a block at a time
        (the logits buffer keeps ``tanh(z / softcap)`` until each block's dz replaces it); the per-token
        log-probabilities (:mod:`lce.logprobs`) form every block's exponentials in it."""
        return max(1, min(self.class_chunk_size, WORKSPACE_ELEMENTS // self.batch_chunk_size))

    @property
    def saves_other_prob(self) -> bool:
        """Whether reduction="none" saves ``1 - p_y`` per row for backward: when backward never holds a whole
        row's softmax at once (class tiling, or soft-capped logits turned into dz a block at a time)."""
        return self.tiles_classes or self.softcap is not None

    def class_chunks(self) -> Iterator[slice]:
        """The classes of each block, in loop order (one block of all C classes without tiling)."""
        size = self.class_chunk_size
        return (slice(start, min(start + size, self.num_classes)) for start in range(0, self.num_classes, size))

    def row_chunks(self) -> Iterator[slice]:
        """The rows of each chunk, in loop order; every chunk but the last has ``batch_chunk_size`` rows."""
        size, rows = self.batch_chunk_size, self.loop_rows
        return (slice(start, min(start + size, rows)) for start in range(0, rows, size))

    @property
    def narrow_gemms_in_fp32(self) -> bool:
        """Whether GEMMs on input-dtype operands are computed on fp32 copies of them (a block at a time) and
        rounded once, by :mod:`lce.passes.gemm`, instead of by the CPU's own kernel: the same arithmetic (fp32 sums,
        one rounding), at fp32's speed. On CPU tensors for fp16 always (no CPU measured runs fp16 GEMMs faster
        than fp32: emulated, or about fp32's rate with AVX512-FP16) and for bf16 where its kernel is slower than
        fp32's (slow or emulated)."""
        support = self.cpu_gemms
        return support is not None and (support.slower_than_fp32 or support.dtype == torch.float16)

    def gemm_in_fp32(self, name: GemmName) -> bool:
        """Whether the named GEMM goes through fp32 copies of its operands' blocks (:mod:`lce.passes.gemm`): every GEMM
        on input-dtype operands where :attr:`narrow_gemms_in_fp32`, and, on the CPU layouts, the weight gradient's
        GEMM when it adds into a sum of the input dtype (compact without a wider ``acc_dtype``): a CPU without
        native bf16 accumulation (no AVX512-BF16 or AMX) makes an fp32 copy of the whole (C, D) target inside its
        own ``addmm_``, once per chunk; a block at a time, the copy is one block, and the arithmetic the same. (With
        one chunk of rows the product is written into the gradient, not added: no such copy.)"""
        if self.cpu_gemms is None:
            return False
        operands, result = self.gemm_dtypes(name)
        if self.narrow_gemms_in_fp32:
            return operands == self.input_dtype
        return (self.device_kind == "cpu" and name == "grad_weight" and self.num_chunks > 1
                and operands == result == self.weight_grad_sum_dtype == self.input_dtype)

    def upcasts_weight_for(self, gemm_name: Literal["logits", "grad_input"]) -> bool:
        """Whether the named GEMM reads the weight upcast to acc_dtype.

        The upcast happens a block of rows at a time (:func:`lce.planning.blocks.rows_per_block`),
        so no ``(C, D)`` acc_dtype copy of the weight ever exists.
        """
        if gemm_name == "grad_input" and not self.needs_grad.input:
            return False
        return self.gemm_dtypes(gemm_name).operands != self.input_dtype

    @property
    def input_chunk_in_acc(self) -> bool:
        """Whether each chunk of the input is upcast to acc_dtype (for the logits or the weight-gradient GEMM)."""
        if self.acc_dtype == self.input_dtype:
            return False
        if self.layout.logits.operands == "acc":
            return True
        return self.needs_grad.weight and self.layout.grad_weight.operands == "acc"

    @property
    def rescales_grad_logits(self) -> bool:
        """Whether dz is rounded to fp16 for a backward GEMM, and so needs a power-of-two rescale to stay in
        fp16's normal range (see lce.passes.grad_logits.grad_logits_rescale).

        Decided by the dtype dz is rounded to, whichever layout role ("input" or "acc") names it: fp16
        input under an explicit policy without ``acc_dtype`` rounds dz to an fp16 "acc" operand too.
        """
        wanted = (("grad_input", self.needs_grad.input), ("grad_weight", self.needs_grad.weight))
        operand_dtypes = {self.gemm_dtypes(name).operands for name, needed in wanted if needed}
        return any(torch.finfo(dtype).max < 1e6 for dtype in operand_dtypes - {self.stats_dtype})

    # ---- memory ---------------------------------------------------------------
    @property
    def peak_extra_bytes(self) -> int:
        """Predicted peak of bytes allocated by one forward + backward, beyond the inputs."""
        return memory.peak_extra_bytes(self.buffers,
                                       backward_copies_kept=self.reduction != "none" and self.allow_retain_graph)

    def __str__(self) -> str:
        lines = [
            f"lce plan on {self.device_kind}: input {dtype_name(self.input_dtype)}, acc {dtype_name(self.acc_dtype)}, "
            f"policy {self.acc_policy}",
            f"  shape      N={self.num_rows} D={self.in_features} C={self.num_classes}, " + self._computes_text(),
            f"  chunking   {self._chunking_label()}: {self.num_chunks} chunk(s) of {self.batch_chunk_size} rows"
            + (f" x {self.num_class_chunks} block(s) of {self.class_chunk_size} classes (logits computed twice)"
               if self.tiles_classes else ""),
            f"  batch      {self._batch_text()}",
            *([f"  features   {self._features_text()}"] if self._features_text() else []),
            f"  GEMMs      logits {self._gemm_text('logits')}, grad_input {self._gemm_text('grad_input')}, "
            f"grad_weight {self._gemm_text('grad_weight')}",
            f"  sums       softmax/loss {dtype_name(self.stats_dtype)}, loss total {dtype_name(LOSS_SUM_DTYPE)}, "
            f"weight grad {dtype_name(self.weight_grad_sum_dtype)}",
            *([f"  cpu gemms  {self._cpu_gemms_text()}"] if self.cpu_gemms is not None else []),
            f"  passes     {self.passes_reason or ('Triton kernels' if self.fused_passes else 'PyTorch ops')}",
            *([f"  cuda gemms {self.cuda_gemms}"] if self.cuda_gemms else []),
            "  buffers",
        ]
        for b in self.buffers:
            lines.append(f"    {b.name:<24} {str(b.shape):<16} {dtype_name(b.dtype):<9} {b.stage:<8} {b.span:<5} "
                         f"{b.nbytes / 2**20:10.2f} MiB  {' '.join(b.steps)}".rstrip())
        stages = dict.fromkeys(b.stage for b in self.buffers)
        chunk_peaks = ", ".join(f"{stage} {memory.chunk_peak_bytes(self.buffers, stage) / 2**20:.2f} MiB"
                                for stage in stages)
        lines.append(f"  chunk peak {chunk_peaks} (its largest step)")
        lines.append(f"  predicted peak extra memory: {self.peak_extra_bytes / 2**20:.2f} MiB")
        lines.extend(f"  note: {note}" for note in self.notes)
        if self.autocast is not None:
            lines.append(f"  note: under torch.autocast({dtype_name(self.autocast)}): the head's tensors are taken in "
                         f"{dtype_name(self.input_dtype)} (cast copies where they were wider, as linear's), the loss "
                         f"returned in {dtype_name(self.output_loss_dtype)}, and every GEMM and sum above runs with "
                         "autocast off")
        return "\n".join(lines)

    def _chunking_label(self) -> str:
        if self.batch_invariant:
            return "batch-invariant"
        return self.chunking_method or "explicit"

    def _batch_text(self) -> str:
        if not self.batch_invariant:
            return "not invariant: a row's outputs may change in the last bits with the batch it arrives in"
        padding = self.loop_rows - self.num_rows
        return ("invariant: a row's outputs do not depend on the rest of the batch"
                + (f" ({padding} ignored rows pad the last chunk)" if padding else ""))

    def _computes_text(self) -> str:
        if self.op == "log_probs":
            return ("per-token log-probabilities" + (" and entropy" if self.returns_entropy else "")
                    + " under a temperature (lce.linear_log_probs)")
        return f"reduction={self.reduction!r}"

    def _features_text(self) -> str:
        parts = ([f"softcap {self.softcap:g} (tanh in {dtype_name(self.stats_dtype)}, in place)"]
                 if self.softcap is not None else [])
        parts += [f"z_loss {self.z_loss:g}"] if self.z_loss else []
        parts += ["returns the per-row log-sum-exp (fp32)"] if self.return_lse else []
        return ", ".join(parts)

    def _cpu_gemms_text(self) -> str:
        support = self.cpu_gemms
        text = f"{dtype_name(support.dtype)} {support.support} on this CPU ({support.source})"
        in_fp32 = [name for name in ("logits", "grad_input", "grad_weight") if self.gemm_in_fp32(name)]
        if in_fp32:
            which = "GEMMs" if len(in_fp32) == 3 else "/".join(in_fp32) + " GEMM" + ("s" if len(in_fp32) > 1 else "")
            text += f"; lce runs the {dtype_name(support.dtype)} {which} on fp32 copies, rounding once"
        return text

    def _gemm_text(self, name: GemmName) -> str:
        operands, result = (dtype_name(dtype) for dtype in self.gemm_dtypes(name))
        return operands if operands == result else f"{operands}->{result}"
