"""lce's ops under ``torch.autocast`` (lce.autocasting): autocast decides the dtype the head's tensors are taken in
and nothing else.

Every chunked op, under CPU autocast in bf16 and fp16, must give bit for bit what the same call gives outside
autocast on the tensors cast to autocast's dtype with ``loss_dtype=torch.float32``: the loss (or log-probabilities
and entropy) and every gradient, reaching fp32 leaves through the cast (fp32 parameters under autocast, the
mixed-precision training setup) -- for each policy, each layout (the CPU's with native or emulated low-precision
GEMMs, CUDA's emulated), row chunking and class tiling, every extra, and backward run inside the autocast block too
(reduction "none" and the log-probabilities recompute their logits there). Before lce switched autocast off inside
its ops, autocast recast lce's fp32 products to bf16 one op at a time: the log-probabilities' worst error against
fp64 went from 3e-6 to 5.6e-2 nats (issue 42), which :func:`test_log_probs_under_autocast_keep_fp32_accuracy` pins.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

import lce
from helpers import TORCH_HAS_OP, assert_bitwise, autocast_problem, autocast_run, needs_torch_op
from lce.planning.options import ACC_POLICIES
from lce.testing import cpu_gemms, emulate_device_kind

AUTOCAST_DTYPES = [torch.bfloat16, torch.float16]
LAYOUTS = ["cpu native", "cpu emulated", "cuda"]
N, D, C = 24, 16, 40  # autocast_problem's shape


def _layout(name: str):
    """The context a layout's plans are made in: this CPU with native or emulated low-precision GEMMs, or CUDA's
    layout table run on CPU tensors."""
    if name == "cuda":
        return emulate_device_kind("cuda")
    return cpu_gemms(name.split()[1])


def _loss_op(target: torch.Tensor, options, reduction: str, **features):
    """lce's loss as a function of the head's tensors (and keywords a run adds)."""
    def op(x, w, b, **extra):
        return lce.linear_cross_entropy(x, w, target, linear_bias=b, reduction=reduction, options=options,
                                        **features, **extra)
    return op

VARIANTS = {
    "plain": (dict(), dict()),
    "tiled": (dict(batch_chunk_size=5, class_chunk_size=16), dict()),
    "everything": (dict(batch_chunk_size=7), dict(softcap=4.0, z_loss=1e-3, label_smoothing=0.1, return_lse=True)),
}


@pytest.mark.parametrize("autocast", AUTOCAST_DTYPES, ids=str)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("policy", ACC_POLICIES)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_loss_under_autocast_equals_the_call_on_cast_tensors(autocast, layout, policy, reduction, variant):
    problem = autocast_problem(torch.float32)
    chunking, features = VARIANTS[variant]
    options = lce.LinearCrossEntropyOptions(acc_policy=policy, **chunking)
    extra = dict(features)
    if variant == "everything":
        extra["weight"] = problem["class_weight"]  # fp32 beside autocast's dtype: read in the fp32 statistics
    op = _loss_op(problem["target"], options, reduction, **extra)
    with _layout(layout):
        under = autocast_run(op, problem, autocast=autocast, cast=None, backward_inside=reduction == "none")
        outside = autocast_run(op, problem, autocast=None, cast=autocast, backward_inside=False,
                               loss_dtype=torch.float32)
    assert under[0][0].dtype == torch.float32  # the loss in fp32, as cross_entropy returns it under autocast
    assert_bitwise(under, outside, f"{policy} {layout} {reduction} {variant}")


@pytest.mark.parametrize("autocast", AUTOCAST_DTYPES, ids=str)
@pytest.mark.parametrize("leaves", [torch.float32, "autocast"], ids=["fp32 leaves", "leaves in autocast's dtype"])
def test_an_explicit_loss_dtype_and_inputs_already_in_autocasts_dtype(autocast, leaves):
    problem = autocast_problem(autocast if leaves == "autocast" else leaves)
    op = _loss_op(problem["target"], lce.LinearCrossEntropyOptions(batch_chunk_size=8), "mean", loss_dtype=autocast)
    under = autocast_run(op, problem, autocast=autocast, cast=None, backward_inside=True)
    outside = autocast_run(op, problem, autocast=None, cast=autocast, backward_inside=False)
    assert under[0][0].dtype == autocast
    assert_bitwise(under, outside, "loss_dtype given")


@pytest.mark.parametrize("autocast", AUTOCAST_DTYPES, ids=str)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("policy", ACC_POLICIES)
def test_module_with_fp32_parameters_under_autocast(autocast, layout, policy):
    """The module owns an fp32 head (its default): under autocast it trains as the function on the cast head does."""
    problem = autocast_problem(torch.float32)
    options = lce.LinearCrossEntropyOptions(acc_policy=policy, batch_chunk_size=5, class_chunk_size=16)
    module = lce.LinearCrossEntropyLoss(D, C, bias=True, reduction="none", options=options, z_loss=1e-4)
    with torch.no_grad():
        module.linear.weight.copy_(problem["w"])
        module.linear.bias.copy_(problem["b"])

    def op(x, w, b, **extra):
        if not extra:  # under autocast: the module's own fp32 head (w and b are its copies, for the comparison)
            module.zero_grad()
            return module(x, problem["target"])
        return lce.linear_cross_entropy(x, w, problem["target"], linear_bias=b, reduction="none", options=options,
                                        z_loss=1e-4, **extra)

    with _layout(layout):
        outputs, (grad_x, _, _) = autocast_run(op, problem, autocast=autocast, cast=None, backward_inside=True)
        under = outputs, [grad_x, module.linear.weight.grad, module.linear.bias.grad]
        outside = autocast_run(op, problem, autocast=None, cast=autocast, backward_inside=False,
                               loss_dtype=torch.float32)
    assert_bitwise(under, outside, f"module {policy} {layout}")


@pytest.mark.parametrize("autocast", AUTOCAST_DTYPES, ids=str)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("policy", ACC_POLICIES)
@pytest.mark.parametrize("variant", ["plain", "tiled, capped, per-token temperature"])
def test_log_probs_under_autocast_equal_the_call_on_cast_tensors(autocast, layout, policy, variant):
    problem = autocast_problem(torch.float32)
    tiled = variant != "plain"
    options = lce.LinearCrossEntropyOptions(acc_policy=policy, batch_chunk_size=5 if tiled else None,
                                            class_chunk_size=16 if tiled else None)
    temperature = (torch.rand(N, generator=torch.Generator().manual_seed(1)) + 0.5) if tiled else 0.7

    def op(x, w, b):
        return lce.linear_log_probs(x.reshape(4, N // 4, D), w, problem["target"].reshape(4, N // 4), linear_bias=b,
                                    temperature=temperature if not tiled else temperature.reshape(4, N // 4),
                                    return_entropy=True, softcap=5.0 if tiled else None, options=options)

    with _layout(layout):
        under = autocast_run(op, problem, autocast=autocast, cast=None, backward_inside=True)
        outside = autocast_run(op, problem, autocast=None, cast=autocast, backward_inside=False)
    assert_bitwise(under, outside, f"log_probs {policy} {layout} {variant}")


def test_log_probs_under_autocast_keep_fp32_accuracy():
    """Issue 42's case: bf16 tensors, 512 x 128 x 8192, under CPU bf16 autocast: the worst per-token error against
    fp64 is what it is without autocast (3e-6 nats; 5.6e-2 when autocast recast lce's fp32 products)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, 128, generator=g).to(torch.bfloat16)
    w = (0.3 * torch.randn(8192, 128, generator=g)).to(torch.bfloat16)
    y = torch.randint(0, 8192, (512,), generator=g)
    exact = torch.log_softmax(x.double() @ w.double().T, -1).gather(1, y[:, None]).squeeze(1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.mm(x.float(), w.float().T).dtype == torch.bfloat16  # autocast would recast an fp32 product
        under = lce.linear_log_probs(x, w, y)
    outside = lce.linear_log_probs(x, w, y)
    assert torch.equal(under, outside)
    assert float((under.double() - exact).abs().max()) < 1e-5


@pytest.mark.parametrize("autocast", AUTOCAST_DTYPES, ids=str)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_plan_under_autocast_is_the_plan_of_the_call_under_it(autocast, layout):
    problem = autocast_problem(torch.float32)
    x, w = problem["x"].requires_grad_(), problem["w"].requires_grad_()
    options = lce.LinearCrossEntropyOptions(batch_chunk_size=8)
    with _layout(layout):
        with torch.autocast("cpu", dtype=autocast):
            planned = lce.plan(x, w, options=options)
            planned_log_probs = lce.logprobs.log_probs_plan(x, w, options=options)
        outside = lce.plan(x.to(autocast), w.to(autocast), options=options, loss_dtype=torch.float32)
    assert planned.input_dtype == autocast and planned.output_loss_dtype == torch.float32
    assert planned.autocast == autocast and outside.autocast is None
    assert planned_log_probs.input_dtype == autocast
    assert planned.layout == outside.layout and planned.acc_dtype == outside.acc_dtype
    assert planned.buffers == outside.buffers and planned.notes == outside.notes
    assert f"under torch.autocast({lce.planning.options.dtype_name(autocast)})" in str(planned)


def test_fp64_tensors_are_left_alone_and_a_mix_is_refused_by_name():
    problem = autocast_problem(torch.float64)
    op = _loss_op(problem["target"], lce.LinearCrossEntropyOptions(batch_chunk_size=8), "mean")
    under = autocast_run(op, problem, autocast=torch.bfloat16, cast=None, backward_inside=True)
    outside = autocast_run(op, problem, autocast=None, cast=None, backward_inside=False)
    assert under[0][0].dtype == torch.float64
    assert_bitwise(under, outside, "fp64")
    with torch.autocast("cpu", dtype=torch.bfloat16), pytest.raises(TypeError, match="linear_weight float32"):
        lce.linear_cross_entropy(problem["x"], problem["w"].float(), problem["target"],
                                 options=lce.LinearCrossEntropyOptions())


def test_autocast_for_another_device_type_changes_nothing():
    problem = autocast_problem(torch.float32)
    op = _loss_op(problem["target"], lce.LinearCrossEntropyOptions(batch_chunk_size=8), "mean")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # CUDA autocast without CUDA warns that it is disabled
        context = torch.autocast("cuda", dtype=torch.float16)
    with context:
        under = op(problem["x"], problem["w"], problem["b"])
    assert under.dtype == torch.float32
    assert torch.equal(under, op(problem["x"], problem["w"], problem["b"]))


@needs_torch_op
@pytest.mark.parametrize("autocast", AUTOCAST_DTYPES, ids=str)
def test_the_materialized_formula_runs_under_autocast_as_torchs_reference_does(autocast):
    """``options=None`` is ``linear`` then ``cross_entropy``, which autocast treats as any code: the logits in
    autocast's dtype, the loss in fp32; torch 2.13's reference path gives the same bits."""
    assert TORCH_HAS_OP
    problem = autocast_problem(torch.float32)
    x, w, b, y, cw = (problem[k] for k in ("x", "w", "b", "target", "class_weight"))
    with torch.autocast("cpu", dtype=autocast):
        ours = lce.linear_cross_entropy(x, w, y, linear_bias=b, weight=cw)
        theirs = F.linear_cross_entropy(x, w, y, linear_bias=b, weight=cw)
    assert ours.dtype == theirs.dtype == torch.float32
    assert torch.equal(ours, theirs)


@pytest.mark.parametrize("autocast", AUTOCAST_DTYPES, ids=str)
def test_fp32_weights_under_autocast_run_the_gemms_in_autocasts_dtype(autocast):
    """The mixed-precision setup (fp32 parameters, autocast): the op receives the head in autocast's dtype, so a
    policy whose GEMMs take input-dtype operands (CUDA's default, balanced) runs them in that dtype, as the unfused
    op's ``linear`` does -- not on fp32 operands, slower for lack of a cast -- while its sums stay fp32."""
    problem = autocast_problem(torch.float32)
    with torch.autocast("cpu", dtype=autocast), emulate_device_kind("cuda"):
        planned = lce.plan(problem["x"], problem["w"], options=lce.LinearCrossEntropyOptions())
    assert planned.input_dtype == autocast and planned.acc_policy == "balanced"
    assert planned.gemm_dtypes("logits") == (autocast, torch.float32)
    assert planned.stats_dtype == torch.float32
    assert planned.num_chunks == 1 or planned.weight_grad_sum_dtype == torch.float32


@pytest.mark.slow
def test_the_example_prints_equal_errors_with_autocast_on_and_off():
    """examples/autocast.py, as docs/using-lce.md runs it (smaller): it exits 0 only when autocast changes no bit."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "examples/autocast.py", "--rows", "64", "--classes", "1024", "--seeds", "1"],
                          cwd=root, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "autocast on and off give the same bits" in done.stdout
