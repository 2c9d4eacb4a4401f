"""The pieces of the chunk loop (lce.passes), each against the fp64 reference formula.

The public-API parity tests check the assembled loop; these check each piece
on its own -- targets, one chunk's logits, losses and softmax, dz, the fp16
rescale, the gradient sums -- so a failure names the piece that is wrong.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

import lce
from helpers import F64, Case, make_problem, ref_run, rel_err
from lce.passes.chunk import HeadTensors, Targets, chunk_logits
from lce.passes.grad_logits import DzScale, chunk_grad_logits_, grad_logits_rescale
from lce.passes.gradients import GradientSums
from lce.passes.loop import ChunkLoop
from lce.passes.statistics import chunk_loss_and_softmax_
from lce.planning.options import EXPLICIT_POLICIES
from lce.testing import emulate_device_kind

POLICIES = EXPLICIT_POLICIES
CASES = {
    "plain": Case(N=29, D=16, V=40),
    "everything": Case(N=29, D=16, V=40, bias=True, class_weight=True, label_smoothing=0.1, ignore="in_range"),
    "smoothing_no_class_weight": Case(N=29, D=16, V=40, bias=True, label_smoothing=0.2, ignore="negative"),
}


def _setup(case: Case, policy: str = "balanced", kind: str = "cpu", dtype=F64, reduction: str = "mean",
           chunk: int = 6):
    """A plan, the head tensors and the targets of ``case`` (in ``dtype``), and the fp64 call arguments."""
    args = make_problem(dataclasses.replace(case, reduction=reduction))
    x, w = args.input.to(dtype), args.linear_weight.to(dtype)
    b = None if args.linear_bias is None else args.linear_bias.to(dtype)
    options = lce.LinearCrossEntropyOptions(acc_policy=policy, batch_chunk_size=chunk, chunking_method=None)
    with emulate_device_kind(kind):
        plan = lce.plan(x.detach().requires_grad_(), w.detach().requires_grad_(), options=options,
                        linear_bias=None if b is None else b.detach().requires_grad_(), reduction=reduction)
    targets = Targets.build(args.target, class_weight=None if args.weight is None else args.weight.to(dtype),
                            ignore_index=case.ignore_value, label_smoothing=case.label_smoothing,
                            num_classes=case.V, stats_dtype=plan.stats_dtype)
    return plan, HeadTensors(x, w, b), targets, args


def _reference_logits(args) -> torch.Tensor:
    return F.linear(args.input, args.linear_weight, args.linear_bias)


def _reference_loss(args, logits, reduction):
    return F.cross_entropy(logits, args.target, weight=args.weight, reduction=reduction,
                           ignore_index=-100 if args.ignore_index is None else args.ignore_index,
                           label_smoothing=args.label_smoothing)


@pytest.mark.parametrize("name", CASES)
def test_targets_weigh_rows_as_the_mean_reduction_does(name):
    plan, _, targets, args = _setup(CASES[name])
    per_row = _reference_loss(args, _reference_logits(args), "none")
    mean = _reference_loss(args, _reference_logits(args), "mean")
    assert torch.equal(targets.valid, args.target != CASES[name].ignore_value)
    assert (targets.safe_target >= 0).all() and (targets.safe_target < CASES[name].V).all()
    assert rel_err(per_row.sum() / targets.row_weight.sum(), mean) <= 1e-14
    assert (targets.row_weight[~targets.valid] == 0).all()


def _other_prob(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``1 - p_y`` per row: the softmax mass of the classes other than the target, summed directly."""
    return torch.softmax(logits, 1).scatter(1, target[:, None], 0.0).sum(1)


@pytest.mark.parametrize("kind", ["cpu", "cuda"])
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("name", CASES)
def test_one_chunk_of_logits_losses_and_softmax(name, policy, kind):
    plan, head, targets, args = _setup(CASES[name], policy, kind)
    logits = _reference_logits(args)
    per_row = _reference_loss(args, logits, "none")
    loop = ChunkLoop.of(plan, head, targets)
    for rows in plan.row_chunks():
        chunk = loop.chunk(rows)
        z = chunk_logits(chunk)
        assert chunk.x_in_acc is None  # fp64 input: acc_dtype is the input dtype
        assert rel_err(z, logits[rows]) <= 1e-15
        losses, lse, other_prob = chunk_loss_and_softmax_(z, chunk)
        assert rel_err(lse, torch.logsumexp(logits[rows], 1)) <= 1e-15
        assert rel_err(z, torch.softmax(logits[rows], 1)) <= 1e-14
        assert rel_err(losses, per_row[rows]) <= 1e-14
        assert rel_err(other_prob, _other_prob(logits[rows], targets.safe_target[rows])) <= 1e-14


@pytest.mark.parametrize("rescale", [1.0, 2.0**-7])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("name", CASES)
def test_one_chunk_of_grad_logits(name, reduction, rescale):
    plan, head, targets, args = _setup(CASES[name], reduction=reduction)
    logits = _reference_logits(args).requires_grad_()
    loss = _reference_loss(args, logits, reduction)
    if reduction == "none":
        loss.backward(args.grad_output)
        row_scale = args.grad_output
    else:
        loss.backward()
        row_scale = torch.full_like(targets.row_weight, 1.0 / float(targets.row_weight.sum())
                                    if reduction == "mean" else 1.0)
    loop = ChunkLoop.of(plan, head, targets)
    for rows in plan.row_chunks():
        probs = torch.softmax(logits[rows].detach(), 1)
        other_prob = _other_prob(logits[rows].detach(), targets.safe_target[rows])
        dz = chunk_grad_logits_(probs, loop.chunk(rows), other_prob, DzScale(row_scale[rows], rescale))
        assert rel_err(dz * rescale, logits.grad[rows]) <= 1e-14


def test_fp16_rescale_keeps_grad_logits_normal():
    # "mean" over 512 rows and 4096 classes: softmax entries / N sit far below fp16's normal range.
    case = Case(N=512, D=8, V=4096, class_weight=True)
    plan, _, targets, args = _setup(case, policy="balanced", kind="cuda", dtype=torch.float16, chunk=64)
    assert plan.rescales_grad_logits
    logits = _reference_logits(args).requires_grad_()
    _reference_loss(args, logits, "mean").backward()
    exact = logits.grad
    row_scale = 1.0 / float(targets.row_weight.sum())
    rescale = grad_logits_rescale(plan, targets, row_scale)
    bound = 2 * row_scale * float(args.weight.max())
    assert rescale == 2.0 ** round(torch.log2(torch.tensor(rescale)).item())
    assert 2**13 < bound / rescale <= 2**14
    # The rescale puts the bound on |dz| just under 2**14, leaving 28 binades of fp16's normal range
    # below it: here that covers nearly every entry, while unscaled most of them are subnormal.
    normal = (exact / rescale).abs() >= 2**-14
    assert normal.sum() >= 0.99 * (exact != 0).sum()
    rescaled = (exact / rescale).to(torch.float16).to(F64) * rescale
    assert ((rescaled - exact).abs()[normal] / exact.abs()[normal]).max() <= 2**-11
    assert (exact.abs()[normal] < 2**-14).float().mean() >= 0.5


@pytest.mark.parametrize("dtype", [F64, torch.float32, torch.bfloat16])
def test_rescale_is_one_where_dz_is_not_rounded_to_fp16(dtype):
    plan, _, targets, _ = _setup(CASES["everything"], dtype=dtype)
    assert not plan.rescales_grad_logits
    assert grad_logits_rescale(plan, targets, 1e-9) == 1.0


def test_rescale_is_one_for_a_zero_or_infinite_bound():
    plan, _, targets, _ = _setup(CASES["plain"], kind="cuda", dtype=torch.float16)
    assert plan.rescales_grad_logits
    assert grad_logits_rescale(plan, targets, 0.0) == 1.0
    assert grad_logits_rescale(plan, targets, float("inf")) == 1.0


@pytest.mark.parametrize("rescale", [1.0, 2.0**-5])
@pytest.mark.parametrize("kind", ["cpu", "cuda"])
@pytest.mark.parametrize("policy", POLICIES)
def test_gradient_sums_of_reference_dz_give_the_reference_gradients(policy, kind, rescale):
    plan, head, targets, args = _setup(CASES["everything"], policy, kind)
    logits = _reference_logits(args).requires_grad_()
    _reference_loss(args, logits, "mean").backward()
    sums, loop = GradientSums(plan, head), ChunkLoop.of(plan, head, targets)
    for rows in plan.row_chunks():
        sums.add_chunk(loop.chunk(rows), logits.grad[rows] / rescale, rescale)
    grads = sums.finish()
    _, expected = ref_run(args)
    for name, got in (("input", grads.input), ("linear_weight", grads.weight), ("linear_bias", grads.bias)):
        assert rel_err(got, expected[name]) <= 1e-14, name


@pytest.mark.parametrize("kind", ["cpu", "cuda"])
def test_gradient_sums_round_the_weight_gradient_once(kind):
    # bf16 head, fp32 products summed in an fp32 accumulator ("accurate"): the returned weight gradient
    # is one bf16 rounding away from the exact sum of the chunk products, however many chunks there
    # are. "compact" on CUDA adds each product straight into the bf16 gradient, a rounding per chunk.
    case = Case(N=256, D=16, V=64)
    args = make_problem(case)
    x, w = args.input.to(torch.bfloat16), args.linear_weight.to(torch.bfloat16)
    logits = F.linear(x.double(), w.double()).requires_grad_()
    F.cross_entropy(logits, args.target).backward()
    exact = logits.grad.T @ x.double()
    floor = rel_err(exact.to(torch.bfloat16), exact)
    errors = {}
    for policy in ("accurate", "compact"):
        options = lce.LinearCrossEntropyOptions(acc_policy=policy, acc_dtype=torch.float32, batch_chunk_size=4)
        with emulate_device_kind(kind):
            plan = lce.plan(x.detach().requires_grad_(), w.detach().requires_grad_(), options=options)
        head = HeadTensors(x, w, None)
        targets = Targets.build(args.target, class_weight=None, ignore_index=-100, label_smoothing=0.0,
                                num_classes=case.V, stats_dtype=plan.stats_dtype)
        sums, loop = GradientSums(plan, head), ChunkLoop.of(plan, head, targets)
        for rows in plan.row_chunks():
            chunk = loop.chunk(rows)  # its input in fp32 where the plan upcasts it
            assert (chunk.x_in_acc is not None) == plan.input_chunk_in_acc
            sums.add_chunk(chunk, logits.grad[rows].float(), 1.0)
        got = sums.finish().weight
        assert got.dtype == torch.bfloat16
        errors[policy, plan.weight_grad_sum_dtype] = rel_err(got, exact) / floor
    assert errors["accurate", torch.float32] <= 1.05, errors
    if kind == "cuda":
        assert errors["compact", torch.bfloat16] >= 1.5, errors
