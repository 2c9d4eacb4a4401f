"""Class tiling (lce's ``class_chunk_size``): the vocabulary cut into blocks as well as the rows.

A tiled chunk gathers each row's log-sum-exp a block of classes at a time and
computes every block's logits again for the gradients, so its results must be
the untiled results: equal to the fp64 reference to 1e-12 in fp64 for every
policy, chunking, reduction and feature, and as accurate as untiled lce in
bf16/fp16 (in floors of each output's dtype, against the fp64 reference).
"""

from __future__ import annotations

import pytest
import torch

import lce
from helpers import (
    CALL_FACTORS,
    Case,
    assert_parity,
    case_of,
    lce_run,
    make_options,
    make_problem,
    pairwise_design,
    ref_run,
    rel_err,
    round_trip,
)
from lce.testing import emulate_device_kind

TOL = 1e-12
BLOCKS = (1, 7, 16, 39)  # Case().V = 40: one class per block, uneven blocks, and a last block of one class

_DESIGN = pairwise_design({"class_block": BLOCKS, **CALL_FACTORS}, seed=2)
ROWS = [(r["class_block"], r["policy"], r["chunking"], case_of(r)) for r in _DESIGN]


@pytest.mark.parametrize("kind", ["cpu", "cuda"])
@pytest.mark.parametrize(("block", "policy", "chunking", "case"), ROWS,
                         ids=[f"{i:02d}-b{b}-{p}-{c}-{case.short()}" for i, (b, p, c, case) in enumerate(ROWS)])
def test_tiled_matches_reference_fp64(kind, block, policy, chunking, case):
    problem = make_problem(case, seed=block + len(case.short()))
    options = make_options(policy, chunking, case.N, class_chunk_size=block)
    with emulate_device_kind(kind):
        plan = lce.plan(problem.input, problem.linear_weight, options=options)
        assert plan.num_class_chunks == -(-case.V // block)
        got = lce_run(problem, options)
    assert_parity(got, ref_run(problem), TOL, label=f"[{kind} {policy}/{chunking} classes/{block}]")


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_all_ignored_batch_gives_zero_gradients(reduction):
    case = Case(reduction=reduction, ignore="in_range", bias=True)
    problem = make_problem(case, seed=5)
    problem = problem.replace(target=torch.full_like(problem.target, case.ignore_value))
    options = lce.LinearCrossEntropyOptions(class_chunk_size=6, batch_chunk_size=4)
    loss, grads = lce_run(problem, options)
    reference_loss, _ = ref_run(problem)
    assert torch.equal(loss.isnan(), reference_loss.isnan())
    for name, grad in grads.items():
        assert grad is not None and torch.count_nonzero(grad) == 0, name


def test_second_backward_of_per_row_losses():
    """reduction="none" saves 1 - p_y for backward; the graph can be walked twice."""
    problem = make_problem(Case(reduction="none", bias=True, label_smoothing=0.1), seed=8)
    x = problem.input.detach().requires_grad_()
    losses = lce.linear_cross_entropy(x, problem.linear_weight, problem.target, linear_bias=problem.linear_bias,
                                      reduction="none", label_smoothing=0.1,
                                      options=lce.LinearCrossEntropyOptions(class_chunk_size=9))
    (first,) = torch.autograd.grad(losses.sum(), x, retain_graph=True)
    (second,) = torch.autograd.grad(losses.sum(), x)
    assert torch.equal(first, second)


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_gradcheck(reduction):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(6, 5, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(11, 5, dtype=torch.float64, generator=g, requires_grad=True)
    b = torch.randn(11, dtype=torch.float64, generator=g, requires_grad=True)
    target = torch.tensor([0, 10, 3, -100, 7, 4])
    options = lce.LinearCrossEntropyOptions(class_chunk_size=4, batch_chunk_size=4, allow_retain_graph=True)

    def loss(x, w, b):
        return lce.linear_cross_entropy(x, w, target, linear_bias=b, reduction=reduction, label_smoothing=0.2,
                                        options=options)

    assert torch.autograd.gradcheck(loss, (x, w, b))


@pytest.mark.parametrize("kind", ["cpu", "cuda"])
@pytest.mark.parametrize("policy", ["accurate", "balanced", "compact"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_tiled_is_as_accurate_as_untiled(kind, policy, dtype):
    """In floors against fp64, tiling changes no output's error by more than a tenth of a floor (plus 10%),
    except where the layout's grad_input GEMM has a narrow result (CPU balanced and compact, i.e. balanced
    with fp32 acc): each class block's product is rounded to the input dtype before the blocks are summed
    (the CPU has no GEMM with bf16/fp16 operands and an fp32 result), which costs up to half as much again."""
    case = Case(N=96, D=48, V=1000, reduction="mean", bias=True, ignore_every=11)
    exact = make_problem(case, seed=21)
    low = exact.replace(input=exact.input.to(dtype), linear_weight=exact.linear_weight.to(dtype),
                        linear_bias=exact.linear_bias.to(dtype))
    exact = low.replace(input=low.input.double(), linear_weight=low.linear_weight.double(),
                        linear_bias=low.linear_bias.double())
    ref_loss, ref_grads = ref_run(exact)

    def floors(options) -> dict[str, float]:
        with emulate_device_kind(kind):
            loss, grads = lce_run(low, options)
        out = {"loss": rel_err(loss, ref_loss) / max(rel_err(round_trip(ref_loss, dtype), ref_loss), 1e-300)}
        for name, grad in grads.items():
            ref = ref_grads[name]
            out[name] = rel_err(grad, ref) / rel_err(round_trip(ref, dtype), ref)
        return out

    common = dict(acc_policy=policy, acc_dtype=torch.float32, chunking_method=None, batch_chunk_size=16)
    untiled = floors(lce.LinearCrossEntropyOptions(**common))
    tiled = floors(lce.LinearCrossEntropyOptions(**common, class_chunk_size=128))
    narrow_grad_input = kind == "cpu" and policy != "accurate" and dtype == torch.bfloat16
    for name in ("input", "linear_weight", "linear_bias"):
        slack = 1.5 if name == "input" and narrow_grad_input else 1.1
        assert tiled[name] <= slack * untiled[name] + 0.1, (name, tiled, untiled)
    assert tiled["loss"] <= untiled["loss"] + 1.0, (tiled, untiled)  # one rounding of a scalar is noisy


def test_tiled_peak_is_below_untiled_and_the_plan_says_why():
    x, w = torch.randn(4096, 64), torch.randn(32768, 64, requires_grad=True)
    untiled = lce.plan(x, w, options=lce.LinearCrossEntropyOptions(acc_policy="compact", chunking_method=None))
    tiled = lce.plan(x, w, options=lce.LinearCrossEntropyOptions(acc_policy="compact", chunking_method=None,
                                                   class_chunk_size=1024))
    logits = 4096 * 32768 * 4
    assert untiled.peak_extra_bytes > logits
    assert tiled.peak_extra_bytes < logits / 8
    assert "block(s) of 1024 classes" in str(tiled)


def test_error_model_predicts_the_cost_of_tiling_a_narrow_grad_input():
    """CPU balanced rounds each class block's grad_input product to bf16; lce.decide.error_model counts it."""
    from lce.decide.error_model import predict_errors

    case = Case(N=96, D=48, V=1000, reduction="mean", bias=True, ignore_every=11)
    exact = make_problem(case, seed=21)
    low = exact.replace(input=exact.input.bfloat16(), linear_weight=exact.linear_weight.bfloat16(),
                        linear_bias=exact.linear_bias.bfloat16())
    exact = low.replace(input=low.input.double(), linear_weight=low.linear_weight.double(),
                        linear_bias=low.linear_bias.double())
    reference = ref_run(exact)[1]["input"]
    options = lce.LinearCrossEntropyOptions(acc_policy="balanced", acc_dtype=torch.float32, chunking_method=None,
                                            batch_chunk_size=16, class_chunk_size=128)
    grad_input = lce_run(low, options)[1]["input"]
    measured = rel_err(grad_input, reference) / rel_err(round_trip(reference, torch.bfloat16), reference)
    predicted = predict_errors(lce.plan(low.input, low.linear_weight, options=options))["grad_input"]
    assert predicted == pytest.approx(measured, rel=0.25)
