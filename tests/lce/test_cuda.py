"""Checks that need a real GPU; skipped cleanly elsewhere (CI has none)."""

from __future__ import annotations

import pytest
import torch

import lce
from helpers import (
    Case,
    assert_bitwise,
    assert_parity,
    autocast_problem,
    autocast_run,
    lce_run,
    loss_and_grads,
    make_problem,
    ref_run,
    rel_err,
)
from lce.planning.options import ACC_POLICIES, EXPLICIT_POLICIES

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def _to_cuda(problem):
    def move(t):
        return None if t is None else t.cuda()

    return problem.replace(input=move(problem.input), linear_weight=move(problem.linear_weight),
                           target=move(problem.target), linear_bias=move(problem.linear_bias),
                           weight=move(problem.weight), grad_output=move(problem.grad_output))


@pytest.mark.parametrize("policy", EXPLICIT_POLICIES)
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_fp64_parity_on_cuda(policy, reduction):
    problem = _to_cuda(make_problem(Case(N=64, D=16, V=50, reduction=reduction, bias=True, class_weight=True)))
    options = lce.LinearCrossEntropyOptions(acc_policy=policy, batch_chunk_size=9)
    assert_parity(lce_run(problem, options), ref_run(problem), tol=1e-12, label=f"cuda {policy}")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_auto_policy_errors_near_floor_on_cuda(dtype):
    g = torch.Generator().manual_seed(0)
    n, d, c = 2048, 256, 8192
    x = torch.randn(n, d, generator=g).to(dtype).cuda()
    w = (torch.randn(c, d, generator=g) / d**0.5).to(dtype).cuda()
    target = torch.randint(0, c, (n,), generator=g).cuda()

    def run(x, w, options):
        x, w = x.clone().requires_grad_(), w.clone().requires_grad_()
        loss = lce.linear_cross_entropy(x, w, target, options=options)
        loss.backward()
        return loss.detach(), x.grad

    exact = run(x.double(), w.double(), None)
    got = run(x, w, lce.LinearCrossEntropyOptions())
    for a, e in zip(got, exact, strict=False):
        floor = rel_err(e.to(dtype).double(), e)
        assert rel_err(a.double(), e) <= 1.5 * floor + 1e-7


def test_predicted_peak_matches_the_allocator_on_cuda():
    n, d, c = 8192, 1024, 32768
    x = torch.randn(n, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(c, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    target = torch.randint(0, c, (n,), device="cuda")
    options = lce.LinearCrossEntropyOptions()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    lce.linear_cross_entropy(x, w, target, options=options).backward()
    torch.cuda.synchronize()
    measured = torch.cuda.max_memory_allocated() - base
    predicted = lce.plan(x, w, options=options).peak_extra_bytes
    assert abs(measured - predicted) <= 0.15 * predicted, (measured, predicted)


@pytest.mark.parametrize("policy", EXPLICIT_POLICIES)
@pytest.mark.parametrize("class_chunk_size", [None, 16])
def test_softcap_and_z_loss_fp64_parity_on_cuda(policy, class_chunk_size):
    """lce's features on the real CUDA layouts, against the reference path on the same device."""
    import functools

    from helpers import run

    problem = _to_cuda(make_problem(Case(N=64, D=16, V=50, reduction="none", bias=True, class_weight=True,
                                         label_smoothing=0.1)))
    options = lce.LinearCrossEntropyOptions(acc_policy=policy, batch_chunk_size=9, class_chunk_size=class_chunk_size)
    features = dict(softcap=2.5, z_loss=0.05)
    got = run(functools.partial(lce.linear_cross_entropy, **features), problem, options=options)
    want = run(functools.partial(lce.linear_cross_entropy, **features), problem)
    assert_parity(got, want, tol=1e-12, label=f"cuda {policy} features")


@pytest.mark.parametrize("policy", EXPLICIT_POLICIES)
@pytest.mark.parametrize("class_chunk_size", [None, 16])
def test_log_probs_and_entropy_fp64_parity_on_cuda(policy, class_chunk_size):
    """lce.linear_log_probs (issue 32) on CUDA tensors against the materialized fp64 formula: per-row temperature,
    soft cap, ignore_index, both gradients."""
    from lce.unfused import unfused_linear_log_probs

    g = torch.Generator().manual_seed(0)
    n, d, c = 64, 16, 50
    x = torch.randn(n, d, generator=g, dtype=torch.float64).cuda()
    w = torch.randn(c, d, generator=g, dtype=torch.float64).cuda()
    b = torch.randn(c, generator=g, dtype=torch.float64).cuda()
    target = torch.randint(0, c, (n,), generator=g).cuda()
    target[::7] = -100
    temperature = torch.linspace(0.6, 1.2, n, dtype=torch.float64).cuda()
    grad_logp, grad_entropy = torch.randn(2, n, generator=g, dtype=torch.float64).cuda()
    options = lce.LinearCrossEntropyOptions(acc_policy=policy, batch_chunk_size=9, class_chunk_size=class_chunk_size)

    def run(fn, **kw):
        leaves = [t.clone().requires_grad_() for t in (x, w, b)]
        log_probs, entropy = fn(leaves[0], leaves[1], target, linear_bias=leaves[2], temperature=temperature,
                                return_entropy=True, softcap=3.0, **kw)
        (grad_logp * log_probs + grad_entropy * entropy).sum().backward()
        return [log_probs.detach(), entropy.detach(), *(t.grad for t in leaves)]

    for got, want in zip(run(lce.linear_log_probs, options=options), run(unfused_linear_log_probs), strict=True):
        assert got.is_cuda and rel_err(got, want) <= 1e-12


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_default_path_never_synchronises_with_the_host(dtype):
    """Issue 33: with lce's default options a forward and backward of the loss, and of the per-token
    log-probabilities and entropy, run under torch.cuda.set_sync_debug_mode("error"): no value is read on the host
    (targets and temperatures are checked by device-side asserts, lce.checks)."""
    g = torch.Generator().manual_seed(0)
    n, d, c = 1024, 128, 8192
    x = torch.randn(n, d, generator=g).to(dtype).cuda().requires_grad_()
    w = (torch.randn(c, d, generator=g) / d**0.5).to(dtype).cuda().requires_grad_()
    target = torch.randint(0, c, (n,), generator=g).cuda()
    temperature = torch.full((n,), 0.8, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        lce.linear_cross_entropy(x, w, target, options=lce.LinearCrossEntropyOptions()).backward()
        log_probs, entropy = lce.linear_log_probs(x, w, target, temperature=temperature, return_entropy=True)
        (log_probs.sum() + entropy.sum()).backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    assert torch.isfinite(x.grad).all() and torch.isfinite(w.grad).all()


@pytest.mark.parametrize("autocast", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("policy", ACC_POLICIES)
@pytest.mark.parametrize("op_name", ["loss mean", "loss none, tiled", "log_probs"])
def test_ops_under_cuda_autocast_equal_the_calls_on_cast_tensors(autocast, policy, op_name):
    """Issue 42 on CUDA: under ``torch.autocast("cuda")`` (whose fp32 list also recasts exp, log, sum and softmax)
    lce's ops on fp32 leaves give, bit for bit, the calls outside autocast on the leaves cast to autocast's dtype."""
    problem = autocast_problem(torch.float32, device="cuda")
    tiled = "tiled" in op_name
    options = lce.LinearCrossEntropyOptions(acc_policy=policy, batch_chunk_size=5,
                                            class_chunk_size=16 if tiled else None)

    def op(x, w, b, **extra):
        if op_name == "log_probs":
            return lce.linear_log_probs(x, w, problem["target"], linear_bias=b, temperature=0.7, return_entropy=True,
                                        options=options)
        return lce.linear_cross_entropy(x, w, problem["target"], linear_bias=b, options=options, z_loss=1e-3,
                                        reduction=op_name.split()[1].rstrip(","), weight=problem["class_weight"],
                                        **extra)

    off = {} if op_name == "log_probs" else dict(loss_dtype=torch.float32)
    under = autocast_run(op, problem, autocast=autocast, cast=None, backward_inside=True)
    outside = autocast_run(op, problem, autocast=None, cast=autocast, backward_inside=False, **off)
    assert_bitwise(under, outside, f"cuda {op_name} {policy}")


@pytest.mark.parametrize("policy", ["balanced", "compact"])
def test_the_mixed_precision_addmm_path_on_cuda_gives_the_blocked_paths_numbers(policy):
    """Where this CUDA build sums bf16 products into fp32 by one ``addmm`` (lce.planning.device.mixed_addmm_supported),
    the
    weight gradient's accumulator and a class-tiled chunk's input sum take it; the numbers are the blocked path's
    to fp32 summation order."""
    from lce.planning import resolve as lce_planning
    from lce.planning.device import mixed_addmm_supported

    if not mixed_addmm_supported(torch.device("cuda")):
        pytest.skip("this torch build has no mixed-precision addmm with out=")
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(96, 64, device="cuda", generator=g).bfloat16()
    w = torch.randn(700, 64, device="cuda", generator=g).bfloat16()
    y = torch.randint(0, 700, (96,), device="cuda", generator=g)
    options = lce.LinearCrossEntropyOptions(acc_policy=policy, acc_dtype=torch.float32, batch_chunk_size=32,
                                            class_chunk_size=256)

    assert lce.plan(x.requires_grad_(), w.requires_grad_(), options=options).mixed_addmm
    fused = loss_and_grads(options, x, w, y)[1:]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(lce_planning, "mixed_addmm_supported", lambda device: False)
        blocked = loss_and_grads(options, x, w, y)[1:]
    for a, b in zip(fused, blocked, strict=True):
        assert float((a - b).norm() / b.norm()) < 1e-2  # bf16 outputs: at most a rounding of either
