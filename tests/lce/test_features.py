"""lce's features beyond torch's op: ``softcap``, ``z_loss`` and ``return_lse``.

fp64 parity of the chunked path (every policy, both layout tables, row and
class chunking, every reduction, with bias, class weights, ignore_index,
label smoothing and 1-D input) with the formula written here from torch's
public functions; gradcheck of each feature and of their combination; the
z-loss's reduction rules; the returned log-sum-exp; argument errors; the
module's keywords; and that the features, when off, change nothing.
"""

from __future__ import annotations

import functools
import itertools
import math

import pytest
import torch
import torch.nn.functional as F

import lce
from helpers import GRAD_NAMES, Case, assert_parity, make_options, make_problem, needs_torch_op, run
from lce.planning.options import EXPLICIT_POLICIES
from lce.testing import emulate_device_kind

F64 = torch.float64
TOL = 1e-12
FEATURES = {"softcap": dict(softcap=2.5), "z_loss": dict(z_loss=0.05), "both": dict(softcap=2.5, z_loss=0.05)}


def formula(input, linear_weight, target, *, linear_bias=None, weight=None, reduction="mean", ignore_index=None,
            label_smoothing=0.0, softcap=None, z_loss=0.0, return_lse=False):
    """The features' definition, from torch's public functions: cap, cross-entropy, then the z-loss per row that
    is not ignored ("mean": divided by their count, 0 without any)."""
    ignored = -100 if ignore_index is None else ignore_index
    logits = F.linear(input, linear_weight, linear_bias)
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    loss = F.cross_entropy(logits, target, weight=weight, reduction=reduction, ignore_index=ignored,
                           label_smoothing=label_smoothing)
    lse = torch.logsumexp(logits, dim=-1)
    kept = target != ignored
    z_rows = torch.where(kept, z_loss * lse**2, torch.zeros_like(lse))
    if reduction == "none":
        loss = loss + z_rows
    elif reduction == "sum":
        loss = loss + z_rows.sum()
    else:
        count = int(kept.sum())
        loss = loss + (z_rows.sum() / count if count else z_rows.sum() * 0)
    return (loss, lse.detach().float()) if return_lse else loss


def _lse_of(problem, options=None, **features):
    """The log-sum-exp lce returns for ``problem`` (no grad), and the formula's."""
    with torch.no_grad():
        got = lce.linear_cross_entropy(problem.input, problem.linear_weight, problem.target, return_lse=True,
                                       options=options, **problem.kwargs(), **features)[1]
        want = formula(problem.input, problem.linear_weight, problem.target, return_lse=True, **problem.kwargs(),
                       **features)[1]
    return got, want


CASES = [
    Case(reduction=reduction, bias=True, class_weight=True, ignore="in_range", label_smoothing=0.1)
    for reduction in ("mean", "sum", "none")
] + [Case(reduction="mean", ignore="default"), Case(reduction="none", one_d=True, bias=True)]
GRID = list(itertools.product(EXPLICIT_POLICIES, ("cpu", "cuda"), range(len(CASES)), ("rows", "classes")))


@pytest.mark.parametrize("feature", list(FEATURES))
@pytest.mark.parametrize(("policy", "kind", "case_index", "tiling"), GRID,
                         ids=[f"{p}-{k}-{CASES[i].short()}-{t}" for p, k, i, t in GRID])
def test_chunked_features_match_the_formula_in_fp64(feature, policy, kind, case_index, tiling):
    case = CASES[case_index]
    problem = make_problem(case, seed=case_index)
    options = make_options(policy, "bcs7", case.N, class_chunk_size=16 if tiling == "classes" else None)
    features = FEATURES[feature]
    with emulate_device_kind(kind):
        got = run(functools.partial(lce.linear_cross_entropy, **features), problem, options=options)
        lse, want_lse = _lse_of(problem, options=options, **features)
    want = run(functools.partial(formula, **features), problem)
    assert_parity(got, want, TOL, f"{feature} {policy} {kind} {case.short()} {tiling}")
    assert lse.dtype == torch.float32 and lse.shape == want_lse.shape
    torch.testing.assert_close(lse, want_lse, rtol=1.2e-7, atol=1e-7)  # fp64 sums, each rounded once to fp32


@pytest.mark.parametrize("chunking", ["auto", "aspect_ratio", "aspect_ratio:2", "single", "bcs1"])
def test_every_chunking_method_runs_the_features(chunking):
    case = Case(reduction="mean", bias=True, class_weight=True, ignore="negative", label_smoothing=0.2)
    problem = make_problem(case, seed=3)
    features = FEATURES["both"]
    got = run(functools.partial(lce.linear_cross_entropy, **features), problem,
              options=make_options("auto", chunking, case.N))
    want = run(functools.partial(formula, **features), problem)
    assert_parity(got, want, TOL, chunking)


def test_the_reference_path_computes_the_same_formula():
    case = Case(reduction="none", bias=True, class_weight=True, ignore="in_range", label_smoothing=0.1)
    problem = make_problem(case, seed=5)
    features = FEATURES["both"]
    got = run(functools.partial(lce.linear_cross_entropy, **features), problem)
    assert_parity(got, run(functools.partial(formula, **features), problem), TOL, "options=None")


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("feature", list(FEATURES))
@pytest.mark.parametrize("class_chunk_size", [None, 5])
def test_gradcheck(feature, reduction, class_chunk_size):
    """Finite differences agree with the analytic gradients, through the tanh and the z-loss."""
    g = torch.Generator().manual_seed(11)
    x = torch.randn(6, 4, generator=g, dtype=F64, requires_grad=True)
    w = torch.randn(9, 4, generator=g, dtype=F64, requires_grad=True)
    b = torch.randn(9, generator=g, dtype=F64, requires_grad=True)
    target = torch.tensor([1, 8, -100, 0, 4, 4])
    options = lce.LinearCrossEntropyOptions(batch_chunk_size=4, class_chunk_size=class_chunk_size,
                                            allow_retain_graph=True)  # gradcheck backpropagates repeatedly

    def loss(x, w, b):
        out = lce.linear_cross_entropy(x, w, target, linear_bias=b, reduction=reduction, options=options,
                                       label_smoothing=0.1, **FEATURES[feature])
        return out if reduction != "none" else out * torch.arange(1, 7, dtype=F64)

    assert torch.autograd.gradcheck(loss, (x, w, b), eps=1e-6, atol=1e-8, rtol=1e-6)


def test_softcap_bounds_the_logits_and_its_gradient_vanishes_when_saturated():
    """A row whose logits all saturate the cap has a loss of about log(C) at most 2 * cap away, and the cap's
    derivative 1 - tanh**2 leaves almost no gradient for its input."""
    x = torch.full((1, 2), 50.0, dtype=F64, requires_grad=True)
    w = torch.tensor([[1.0, 1.0], [-1.0, -1.0], [1.0, 0.5]], dtype=F64, requires_grad=True)
    target = torch.tensor([1])
    options = lce.LinearCrossEntropyOptions()
    loss = lce.linear_cross_entropy(x, w, target, options=options, softcap=1.0)
    assert 0 < float(loss.detach()) < 2.0 + math.log(3)
    (grad,) = torch.autograd.grad(loss, (x,))
    assert float(grad.abs().max()) < 1e-30


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_z_loss_of_an_all_ignored_batch(reduction):
    """The z-term adds 0 (no NaN of its own); "mean" keeps torch's NaN from the cross-entropy term; gradients 0."""
    problem = make_problem(Case(reduction=reduction), seed=2)
    problem = problem.replace(target=torch.full_like(problem.target, -100))
    loss, grads = run(functools.partial(lce.linear_cross_entropy, z_loss=0.5), problem,
                      options=lce.LinearCrossEntropyOptions(batch_chunk_size=8))
    if reduction == "mean":
        assert torch.isnan(loss)
    else:
        assert torch.equal(loss, torch.zeros_like(loss))
    for name in ("input", "linear_weight"):
        assert torch.equal(grads[name], torch.zeros_like(grads[name]))


def test_z_loss_ignores_the_class_weights_and_mean_counts_rows():
    """With class weights, "mean" divides the cross-entropy by sum(w_y) but the z-term by the count of rows."""
    problem = make_problem(Case(reduction="mean", class_weight=True, ignore="in_range"), seed=4)
    options = lce.LinearCrossEntropyOptions(batch_chunk_size=8)
    plain = lce.linear_cross_entropy(problem.input, problem.linear_weight, problem.target, options=options,
                                     **problem.kwargs())
    with_z = lce.linear_cross_entropy(problem.input, problem.linear_weight, problem.target, options=options,
                                      z_loss=0.25, **problem.kwargs())
    lse = torch.logsumexp(problem.input @ problem.linear_weight.T, dim=1)
    kept = problem.target != problem.ignore_index
    assert float(with_z - plain) == pytest.approx(0.25 * float((lse[kept] ** 2).mean()), rel=1e-12)


def test_returned_lse_is_fp32_detached_and_shaped_like_the_rows():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(10, 8, generator=g).bfloat16().requires_grad_()
    w = torch.randn(30, 8, generator=g).bfloat16().requires_grad_()
    target = torch.randint(0, 30, (10,), generator=g)
    for reduction in ("mean", "none"):
        loss, lse = lce.linear_cross_entropy(x, w, target, reduction=reduction, return_lse=True,
                                             options=lce.LinearCrossEntropyOptions(batch_chunk_size=4))
        assert loss.dtype == torch.bfloat16 and loss.requires_grad
        assert lse.shape == (10,) and lse.dtype == torch.float32 and not lse.requires_grad
        exact = torch.logsumexp(x.double() @ w.double().T, dim=1)
        assert float((lse.double() - exact).abs().max()) < 1e-5  # fp32 logits of exact bf16 products
        (loss.sum() if reduction == "none" else loss).backward()
    one_loss, one_lse = lce.linear_cross_entropy(x[0], w, target[0], return_lse=True,
                                                 options=lce.LinearCrossEntropyOptions())
    assert one_loss.shape == () and one_lse.shape == ()


def test_editing_the_returned_lse_does_not_change_the_gradients():
    problem = make_problem(Case(reduction="none"), seed=6)
    options = lce.LinearCrossEntropyOptions(batch_chunk_size=8)
    x = problem.input.detach().clone().requires_grad_()
    loss, lse = lce.linear_cross_entropy(x, problem.linear_weight, problem.target, reduction="none",
                                         options=options, return_lse=True)
    lse.mul_(0)
    (grad,) = torch.autograd.grad(loss, (x,), problem.grad_output)
    want = run(lce.linear_cross_entropy, problem, options=options)[1]["input"]
    assert torch.equal(grad, want)


def test_features_off_change_nothing():
    """The defaults spelled out are the plain op, bit for bit, on the chunked and the reference path."""
    problem = make_problem(Case(reduction="mean", bias=True, class_weight=True, label_smoothing=0.1), seed=7)
    problem = problem.replace(input=problem.input.float(), linear_weight=problem.linear_weight.float(),
                              linear_bias=problem.linear_bias.float(), weight=problem.weight.float())
    for options in (None, lce.LinearCrossEntropyOptions(batch_chunk_size=8)):
        plain = run(lce.linear_cross_entropy, problem, options=options)
        spelled = run(functools.partial(lce.linear_cross_entropy, softcap=None, z_loss=0.0, return_lse=False),
                      problem, options=options)
        assert torch.equal(plain[0], spelled[0])
        assert all(torch.equal(plain[1][name], spelled[1][name]) for name in GRAD_NAMES)


@needs_torch_op
def test_torch_built_options_run_the_features():
    problem = make_problem(Case(reduction="sum", bias=True), seed=8)
    features = FEATURES["both"]
    got = run(functools.partial(lce.linear_cross_entropy, **features), problem,
              options=torch.nn.LinearCrossEntropyOptions(batch_chunk_size=5))
    assert_parity(got, run(functools.partial(formula, **features), problem), TOL, "torch options")


BAD = [
    (dict(softcap=0.0), ValueError, "softcap"), (dict(softcap=-1.0), ValueError, "softcap"),
    (dict(softcap=math.nan), ValueError, "softcap"), (dict(softcap=math.inf), ValueError, "softcap"),
    (dict(softcap="30"), TypeError, "softcap"), (dict(softcap=True), TypeError, "softcap"),
    (dict(z_loss=-1e-4), ValueError, "z_loss"), (dict(z_loss=math.nan), ValueError, "z_loss"),
    (dict(z_loss=math.inf), ValueError, "z_loss"), (dict(z_loss=None), TypeError, "z_loss"),
    (dict(z_loss=True), TypeError, "z_loss"), (dict(return_lse=1), TypeError, "return_lse"),
    (dict(return_lse="yes"), TypeError, "return_lse"),
]


@pytest.mark.parametrize(("features", "error", "name"), BAD, ids=[str(b[0]) for b in BAD])
@pytest.mark.parametrize("path", ["reference", "chunked", "module", "plan"])
def test_bad_feature_values_are_rejected_by_name(features, error, name, path):
    problem = make_problem(Case(), seed=0)
    with pytest.raises(error, match=name):
        if path == "module":
            lce.LinearCrossEntropyLoss(problem.input.shape[1], problem.linear_weight.shape[0], **features)
        elif path == "plan":
            lce.plan(problem.input, problem.linear_weight, options=lce.LinearCrossEntropyOptions(), **features)
        else:
            options = lce.LinearCrossEntropyOptions() if path == "chunked" else None
            lce.linear_cross_entropy(problem.input, problem.linear_weight, problem.target, options=options,
                                     **features)


def test_module_forwards_the_features():
    torch.manual_seed(0)
    module = lce.LinearCrossEntropyLoss(8, 20, bias=True, dtype=F64, options=lce.LinearCrossEntropyOptions(),
                                        softcap=3.0, z_loss=1e-2, return_lse=True)
    assert "softcap=3" in repr(module) and "z_loss=0.01" in repr(module) and "return_lse=True" in repr(module)
    x, target = torch.randn(12, 8, dtype=F64), torch.randint(0, 20, (12,))
    loss, lse = module(x, target)
    want, want_lse = formula(x, module.linear.weight, target, linear_bias=module.linear.bias, softcap=3.0,
                             z_loss=1e-2, return_lse=True)
    assert float(loss) == pytest.approx(float(want), rel=1e-12)
    assert torch.equal(lse, want_lse)


def test_plan_shows_the_features_and_the_workspace():
    x = torch.empty(4096, 512, dtype=torch.bfloat16, device="meta", requires_grad=True)
    w = torch.empty(32768, 512, dtype=torch.bfloat16, device="meta", requires_grad=True)
    options = lce.LinearCrossEntropyOptions(batch_chunk_size=256)
    plain = lce.plan(x, w, options=options)
    capped = lce.plan(x, w, options=options, softcap=30.0, z_loss=1e-4, return_lse=True)
    text = str(capped)
    assert "softcap 30" in text and "z_loss 0.0001" in text and "softcap_workspace" in text
    workspace = next(b for b in capped.buffers if b.name == "softcap_workspace")
    assert workspace.shape == (256, 4096)  # 2**20 elements: small beside a (256, 32768) chunk of logits
    assert capped.peak_extra_bytes - plain.peak_extra_bytes <= workspace.nbytes + 4096 * 4
