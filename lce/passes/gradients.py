"""The gradients of one call while the chunks add to them, and their rounding at the end.

:class:`GradientSums` receives each chunk's three products -- ``grad_input[rows] = dz @ W``, ``grad_weight +=
dz.T @ x``, ``grad_bias += dz.sum(0)`` -- in the plan's precision, with the rounding residual of each row's target
entry carried past dz's rounding (:class:`TargetResidual`) and fp16's power-of-two headroom
(:mod:`lce.passes.headroom`), and rounds each sum once (:meth:`GradientSums.finish`) into :class:`Gradients`.
"""

from __future__ import annotations

import dataclasses

import torch

from ..planning.blocks import TARGET_ROWS_PER_GEMM
from ..planning.plan import Plan
from .chunk import Chunk, HeadTensors, block_target_index
from .gemm import add_mm_, mm, mm_upcast_weight
from .headroom import STORE_LIMIT, RunningSum, largest_entry, power_of_two_under, scale_to_fit

__all__ = ["Gradients", "GradientScales", "GradientSums", "TargetResidual"]


@dataclasses.dataclass
class Gradients:
    """The gradients a pass hands out, in the input dtype (None where not requested), and the powers of two they
    are stored scaled by (``scales``; None: none)."""

    input: torch.Tensor | None = None
    weight: torch.Tensor | None = None
    bias: torch.Tensor | None = None
    scales: GradientScales | None = None


@dataclasses.dataclass(frozen=True)
class GradientScales:
    """The powers of two a scalar reduction's fp16 gradients are stored scaled by (:mod:`lce.passes.headroom`):
    ``input`` as runs of rows ``(rows, scale)``, ``weight`` and ``bias`` one each. Backward divides them out."""

    input: tuple[tuple[slice, float], ...] = ()
    weight: float = 1.0
    bias: float = 1.0

    def unscale_(self, grads: tuple[torch.Tensor | None, ...], incoming: torch.Tensor | float, *, in_place: bool
                 ) -> tuple[torch.Tensor | None, ...]:
        """``(input, weight, bias)`` times ``incoming`` over their scales, each computed in fp32 and rounded once
        (in place, or into new tensors)."""
        incoming = float(incoming)  # one host synchronisation per backward; a Python float keeps the multiply fp32
        out = []
        for grad, scale in zip(grads, (None, self.weight, self.bias), strict=True):
            if grad is None:
                out.append(None)
                continue
            target = grad if in_place else torch.empty_like(grad)
            runs = self.input if scale is None and self.input else ((slice(None), scale or 1.0),)
            for rows, run_scale in runs:
                torch.mul(grad[rows], incoming / run_scale, out=target[rows])
            out.append(target)
        return tuple(out)


class GradientSums:
    """The requested gradients of one call while the chunks add to them, and their rounding at the end.

    ``input`` (N, D) in the input dtype receives each chunk's rows; ``weight``
    (C, D) and ``bias`` (C,) are sums over chunks in the plan's
    ``weight_grad_sum_dtype`` and stats dtype. Each is None when not requested.
    ``wide_input_partials``: a block's input-gradient product is formed in the
    dtype of the sum it is added to (the stats dtype), not rounded to the
    plan's GEMM result first, for sums that another process completes
    (a :class:`GroupReduction`).
    """

    def __init__(self, plan: Plan, head: HeadTensors, *, wide_input_partials: bool = False,
                 scaled_output: bool = False):
        self.plan = plan
        self.wide_input_partials = wide_input_partials
        n, d = head.input.shape
        c, device = plan.num_classes, head.input.device
        wanted = plan.needs_grad
        self.input = torch.empty(n, d, dtype=plan.input_dtype, device=device) if wanted.input else None
        self.weight = torch.zeros(c, d, dtype=plan.weight_grad_sum_dtype, device=device) if wanted.weight else None
        self.bias = torch.zeros(c, dtype=plan.stats_dtype, device=device) if wanted.bias else None
        # fp16 headroom (lce.passes.headroom): running fp16 sums always; scaled outputs where backward unscales them
        self.headroom = plan.gradient_headroom
        self.scaled_output = scaled_output and self.headroom
        narrow_sum = self.weight is not None and self.weight.dtype == torch.float16 and self.headroom
        self._weight_sum = RunningSum(self.weight) if narrow_sum else None
        self._input_scales: list[tuple[slice, float]] = []
        self._weight_max: float | None = None

    def add_chunk(self, chunk: Chunk, dz: torch.Tensor, rescale: float, cols: slice = slice(None),
                  input_sum: torch.Tensor | None = None) -> None:
        """Add the chunk's products: ``grad_input[rows] = dz @ W``, ``grad_weight += dz.T @ x``,
        ``grad_bias += dz.sum(0)``, each GEMM in the plan's precision.

        ``dz`` is the chunk's ``dz / rescale`` (stats dtype); every product is
        multiplied by ``rescale`` before it is rounded or added. For a block
        of classes ``cols`` (class tiling), ``dz`` holds those columns, the
        weight and bias gradients get their rows ``cols``, and the input
        gradient's product is added to ``input_sum`` (rows, D) in the stats
        dtype, which the caller rounds into ``grad_input[rows]`` after the last block.
        """
        plan, rows, weight = self.plan, chunk.rows, chunk.head.weight[cols]
        rounded: dict[torch.dtype, torch.Tensor] = {dz.dtype: dz}

        def dz_as(dtype: torch.dtype) -> torch.Tensor:
            """dz rounded to a GEMM's operand dtype, at most once per dtype and chunk."""
            if dtype not in rounded:
                rounded[dtype] = dz.to(dtype)
            return rounded[dtype]

        if self.input is not None:
            operands, result = plan.gemm_dtypes("grad_input")
            correction = TargetResidual.of(chunk, dz, dz_as(operands), cols).input_correction(weight)
            if input_sum is not None and plan.sums_input_blocks_in_place:  # one GEMM into the fp32 sum
                torch.addmm(input_sum, dz_as(operands), weight, out_dtype=input_sum.dtype, alpha=rescale,
                            out=input_sum)
                if correction is not None:
                    input_sum.add_(correction, alpha=rescale)
            elif input_sum is not None and self.wide_input_partials:
                input_sum.add_(self._grad_input_product(dz_as(operands), weight, rescale, input_sum.dtype,
                                                        addend=correction))
            elif input_sum is not None:
                input_sum.add_(self._grad_input_product(dz_as(operands), weight, rescale,
                                                        addend=correction).to(input_sum.dtype))
            else:
                scale = self._input_rows_scale(dz, weight, rescale)
                self._input_scales.append((rows, scale))
                if plan.upcasts_weight_for("grad_input") or result != plan.input_dtype:
                    self._store_input_rows(rows, self._grad_input_product(dz_as(operands), weight, rescale * scale,
                                                                          addend=correction))
                else:
                    out = self._input_rows_out(rows)
                    mm(dz_as(operands), weight, result, out=out, alpha=rescale * scale,
                       in_fp32=plan.gemm_in_fp32("grad_input"), addend=correction)
                    self._store_input_rows(rows, out)
                    del out  # a padded chunk's buffer goes before the weight gradient's step
            del correction  # freed before the weight gradient's step, as lce.planning.memory_model says
        if self.weight is not None:
            operands, product = plan.gemm_dtypes("grad_weight")
            x = chunk.x if operands == plan.input_dtype else chunk.x_in_acc
            alpha, product_scale = rescale, 1.0
            if self.headroom and (self._weight_sum is not None or product == torch.float16):
                # a bound on the product's entries: max over classes of sum_i |dz_ic|, times max |x|
                bound = rescale * largest_entry(torch.linalg.vector_norm(dz, ord=1, dim=0)) * largest_entry(x)
                if self._weight_sum is not None:
                    alpha = rescale * self._weight_sum.scale_for(bound)
                else:  # a narrow product added to a wide sum: scaled for its rounding, unscaled in the add
                    product_scale = power_of_two_under(STORE_LIMIT, bound)
                    alpha = rescale * product_scale
            corrected = False
            if plan.target_residual_to_weight:  # added before the product, which then rounds the sum once
                target = TargetResidual.of(chunk, dz, dz_as(operands), cols)
                corrected = target.add_to_weight_rows_(self.weight[cols], chunk.x, rescale)
            add_mm_(self.weight[cols], dz_as(operands).T, x, product, alpha=alpha,
                    in_fp32=plan.gemm_in_fp32("grad_weight"), product_scale=product_scale,
                    device_kind=plan.device_kind, mixed_addmm=plan.mixed_addmm,
                    fresh=plan.num_chunks == 1 and not corrected)
        if self.bias is not None:
            self.bias[cols].add_(dz.sum(0), alpha=rescale)

    def _grad_input_product(self, dz: torch.Tensor, weight: torch.Tensor, rescale: float,
                            result: torch.dtype | None = None, addend: torch.Tensor | None = None) -> torch.Tensor:
        """``rescale * (dz @ weight + addend)`` in the plan's grad_input precision (or with the wider ``result``),
        as a new (rows, D) tensor."""
        if self.plan.upcasts_weight_for("grad_input"):
            product = mm_upcast_weight(dz, weight, alpha=rescale, device_kind=self.plan.device_kind)
            product = product if addend is None else product.add_(addend, alpha=rescale)
            return product if result is None or product.dtype == result else product.to(result)
        return mm(dz, weight, result or self.plan.gemm_dtypes("grad_input").result, alpha=rescale,
                  in_fp32=self.plan.gemm_in_fp32("grad_input"), addend=addend)

    def _input_rows_scale(self, dz: torch.Tensor, weight: torch.Tensor, rescale: float) -> float:
        """The power of two a chunk's input-gradient rows are stored scaled by (1.0 unless scaled output): from
        the bound ``max_i sum_c |dz_ic| * max |W|``."""
        if not self.scaled_output:
            return 1.0
        if self._weight_max is None:
            self._weight_max = largest_entry(weight)
        row_sums = torch.linalg.vector_norm(dz, ord=1, dim=1)
        return power_of_two_under(STORE_LIMIT, rescale * largest_entry(row_sums) * self._weight_max)

    def round_input_rows(self, rows: slice, input_sum: torch.Tensor) -> None:
        """Round a chunk's input-gradient rows, summed over class blocks in ``input_sum`` (stats dtype), into the
        input gradient (scaled by its largest entry under scaled output; ``input_sum`` is consumed)."""
        scale = 1.0
        if self.scaled_output:
            scale = power_of_two_under(STORE_LIMIT, largest_entry(input_sum))
            input_sum.mul_(scale)
        self._input_scales.append((rows, scale))
        self._store_input_rows(rows, input_sum)

    def _input_rows_out(self, rows: slice) -> torch.Tensor:
        """Where a chunk's input-gradient GEMM writes: its rows of the input gradient, or, for a padded last chunk
        (rows past N), a chunk-sized buffer, so that the GEMM runs at the chunk's full size."""
        out = self.input[rows]
        size = rows.stop - rows.start
        return out if out.shape[0] == size else out.new_empty(size, out.shape[1])

    def _store_input_rows(self, rows: slice, values: torch.Tensor) -> None:
        """Copy a chunk's input-gradient rows into the input gradient, the padding rows past N left out (nothing
        where ``values`` already are those rows)."""
        target = self.input[rows]
        if values.data_ptr() != target.data_ptr() or values.dtype != target.dtype:
            target.copy_(values[:target.shape[0]])

    def finish(self) -> Gradients:
        """Round the sums to the input dtype, once, and hand out the gradients (the sum itself where it already
        has that dtype): under scaled output with the powers of two they are stored scaled by
        (:class:`GradientScales`); otherwise at their size."""
        dtype = self.plan.input_dtype
        grads = Gradients(input=self.input)
        weight_scale = bias_scale = 1.0
        if self.weight is not None:
            if self._weight_sum is not None:
                grads.weight, weight_scale = self.weight, self._weight_sum.scale or 1.0
            elif self.scaled_output:
                grads.weight, weight_scale = scale_to_fit(self.weight, dtype)
            else:
                grads.weight = self.weight.to(dtype)
            self.weight = None  # a separate accumulator is freed now, not when the sums object goes
            if not self.scaled_output and weight_scale != 1.0:  # the running sum's scale, divided out here
                grads.weight.mul_(1.0 / weight_scale)
                weight_scale = 1.0
        if self.bias is not None:
            if self.scaled_output:
                grads.bias, bias_scale = scale_to_fit(self.bias, dtype)
            else:
                grads.bias = self.bias.to(dtype)
        if self.scaled_output:
            grads.scales = GradientScales(_runs(self._input_scales), weight_scale, bias_scale)
        return grads


@dataclasses.dataclass(frozen=True)
class TargetResidual:
    """What rounding dz for a backward GEMM lost at each row's target entry, carried past the rounding.

    A row's target entry is its largest in magnitude (``s (p_y - 1)`` against ``s p_c`` elsewhere), so rounding it
    to a GEMM's bf16/fp16 operand costs the most: where the row's products cancel (few classes, or logits that
    nearly agree) that one rounding can dominate the gradient's error. The residual ``dz_y - round(dz_y)`` is exact
    in the stats dtype and at most half an ulp of the entry, so its product with the target's weight row (the
    input gradient's correction) costs only a rounding of that small term in the input dtype, and is added in the
    GEMM's own sum before its one rounding; its product with the row's input (the target's weight-gradient row)
    goes into the accumulator where that is wider than the operands. The target entry then counts at about twice
    the operand dtype's precision, the other entries as rounded. ``index`` (rows,) is each row's target within the
    block ``cols``, ``residual`` (rows,) 0 where the target lies outside it; both None where dz was not rounded."""

    index: torch.Tensor | None
    residual: torch.Tensor | None

    @classmethod
    def of(cls, chunk: Chunk, dz: torch.Tensor, rounded: torch.Tensor, cols: slice) -> TargetResidual:
        if rounded.dtype == dz.dtype:
            return cls(None, None)
        index, in_block = block_target_index(chunk, cols)
        lost = dz.gather(1, index).squeeze(1) - rounded.gather(1, index).squeeze(1).to(dz.dtype)
        return cls(index.squeeze(1), torch.where(in_block, lost, 0))

    def input_correction(self, weight: torch.Tensor) -> torch.Tensor | None:
        """``residual * weight[target]`` (rows, D) in the weight's dtype, in dz's units; None where nothing was
        lost."""
        if self.residual is None:
            return None
        return weight[self.index].mul_(self.residual[:, None].to(weight.dtype))

    def add_to_weight_rows_(self, weight_sum: torch.Tensor, x: torch.Tensor, alpha: float) -> bool:
        """Add ``alpha * residual_i * x_i`` to the weight-gradient row of each row's target, in ``weight_sum``
        (the block's (classes, D) rows of the sum), with no atomic accumulation; False where nothing was lost.

        Rows are taken :data:`TARGET_ROWS_PER_GEMM` at a time. Within such a block, the rows that share a target
        are summed by one fp32 GEMM against their indicator matrix (``members[i, j] = 1`` where rows ``i`` and
        ``j`` share a target), and every row of a class writes that class's sum taken from its first row in the
        block: a class row is written with the same bits by each of its rows, so the order of the writes cannot
        matter (``index_copy_`` with repeated indices, repeated values). Each product ``residual_i * x_i`` and
        each sum is fp32, added to the sum's row and rounded once to its dtype. Cost: ``2 b^2 D`` flops per block
        of ``b`` rows (``b / 1.5 C`` of the chunk's three GEMMs at C classes), and an fp32 ``(b, b)`` matrix and
        two ``(b, D)`` ones besides (:mod:`lce.planning.memory_model`'s ``grad_weight_target`` step)."""
        if self.residual is None:
            return False
        for start in range(0, x.shape[0], TARGET_ROWS_PER_GEMM):
            rows = slice(start, start + TARGET_ROWS_PER_GEMM)
            index, products = self.index[rows], torch.mul(x[rows], self.residual[rows, None].to(torch.float32))
            members = torch.empty(index.shape[0], index.shape[0], dtype=torch.float32, device=x.device)
            torch.eq(index[:, None], index[None, :], out=members)
            first = members.argmax(dim=1)  # each row's first row with the same target (argmax: the first maximum)
            class_sums = members @ products
            del members, products
            written = class_sums[first].mul_(alpha)  # the same bits for every row of a class
            del class_sums
            written.add_(weight_sum.index_select(0, index))
            weight_sum.index_copy_(0, index, written if written.dtype == weight_sum.dtype
                                   else written.to(weight_sum.dtype))
        return True


def _runs(scales: list[tuple[slice, float]]) -> tuple[tuple[slice, float], ...]:
    """Consecutive row ranges with the same scale, merged."""
    runs: list[tuple[slice, float]] = []
    for rows, scale in sorted(scales, key=lambda item: item[0].start):
        if runs and runs[-1][1] == scale and runs[-1][0].stop == rows.start:
            runs[-1] = (slice(runs[-1][0].start, rows.stop), scale)
        else:
            runs.append((rows, scale))
    return tuple(runs)
