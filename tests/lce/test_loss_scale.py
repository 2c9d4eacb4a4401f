"""A loss scale protects lce's fp16 gradients (lce.passes.headroom): against fp64, under scales of 2**12 and 2**16, lce
loses
no more gradient entries to fp16's subnormal range than the unfused op under fp16 autocast does (logits in fp16,
cross_entropy in fp32, as autocast runs it), on every policy, layout and reduction."""

from __future__ import annotations

import functools

import pytest
import torch

import lce
from lce.testing import emulate_device_kind

N, D, C = 1024, 32, 4096
TINY = torch.finfo(torch.float16).tiny


@functools.cache
def _problem():
    """Zipfian targets through a log-prior bias: most classes are rare, their gradient entries about p / N."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, D, generator=g, dtype=torch.float64)
    w = torch.randn(C, D, generator=g, dtype=torch.float64) * 0.1
    b = -torch.log(torch.arange(1, C + 1, dtype=torch.float64))
    y = torch.multinomial(torch.softmax(x @ w.T + b, 1), 1, generator=g).squeeze(1)
    return x, w, b, y


def _grads(loss_fn, dtype, scale, reduction="mean"):
    x, w, b, y = _problem()
    leaves = [t.to(dtype).detach().requires_grad_() for t in (x, w, b)]
    loss = loss_fn(*leaves, y, reduction)
    total = loss if reduction != "none" else loss.sum()
    (total.to(torch.float64 if dtype == torch.float64 else torch.float32) * scale).backward()
    return [t.grad for t in leaves]


def _reference(scale, reduction="mean"):
    """The unfused op as fp16 autocast runs it: fp16 logits, cross_entropy in fp32."""
    return _grads(lambda x, w, b, y, r: lce.linear_cross_entropy(x, w, y, linear_bias=b, reduction=r,
                                                                 loss_dtype=torch.float32),
                  torch.float16, scale, reduction)


@functools.cache
def _exact(scale, reduction="mean"):
    return _grads(lambda x, w, b, y, r: torch.nn.functional.cross_entropy(x @ w.T + b, y, reduction=r),
                  torch.float64, scale, reduction)


def _lost(grad: torch.Tensor, exact: torch.Tensor) -> int:
    """Entries that are zero or subnormal where the exact (scaled) gradient is a normal fp16 number."""
    return int(((grad.double().abs() < TINY) & (exact.abs() >= TINY)).sum())


def _floors(grad: torch.Tensor, exact: torch.Tensor) -> float:
    return float((grad.double() - exact).norm() / (exact.half().double() - exact).norm())


def _lce(options, loss_dtype=torch.float32):
    return lambda x, w, b, y, r: lce.linear_cross_entropy(x, w, y, linear_bias=b, reduction=r, options=options,
                                                          loss_dtype=loss_dtype)


CASES = [(kind, policy, chunks) for kind in ("cpu", "cuda") for policy in ("accurate", "balanced", "compact")
         for chunks in (4, 64)]


@pytest.mark.parametrize("scale", [2.0 ** 12, 2.0 ** 16])
@pytest.mark.parametrize(("kind", "policy", "chunks"), CASES, ids=[f"{k}-{p}-{c}" for k, p, c in CASES])
def test_a_loss_scale_keeps_the_entries_the_autocast_reference_keeps(kind, policy, chunks, scale):
    options = lce.LinearCrossEntropyOptions(acc_policy=policy, acc_dtype=torch.float32, chunking_method=None,
                                            batch_chunk_size=N // chunks)
    with emulate_device_kind(kind):
        got = _grads(_lce(options), torch.float16, scale)
    reference, exact = _reference(scale), _exact(scale)
    for name, mine, theirs, truth in zip(("input", "weight", "bias"), got, reference, exact, strict=True):
        assert torch.isfinite(mine).all(), name
        assert _lost(mine, truth) <= _lost(theirs, truth) + 0.0001 * truth.numel(), (name, _lost(mine, truth),
                                                                                     _lost(theirs, truth))
        if name == "input" or policy != "compact":  # compact's fp16 sum across chunks costs floors of its own
            assert _floors(mine, truth) <= 1.1 * _floors(theirs, truth), (name, _floors(mine, truth),
                                                                          _floors(theirs, truth))


def test_without_the_headroom_the_default_loses_entries_the_reference_keeps():
    """The defect the headroom mends, measured on the same problem: gradients formed at their true size in fp16
    and multiplied by the scale afterwards (what lce did before) lose entries the reference keeps."""
    scale = 2.0 ** 12
    exact, reference = _exact(scale), _reference(scale)
    got = _grads(_lce(lce.LinearCrossEntropyOptions()), torch.float16, scale)
    unscaled = _grads(_lce(lce.LinearCrossEntropyOptions()), torch.float16, 1.0)
    late = [(g.double() * scale) for g in unscaled]  # rounded at true size first, scaled after
    assert _lost(late[1], exact[1]) > 10 * max(1, _lost(reference[1], exact[1]))
    assert _lost(got[1], exact[1]) <= _lost(reference[1], exact[1])


def test_an_fp16_loss_cannot_carry_a_scale_of_2_16_and_the_gradients_say_so_with_inf():
    """GradScaler's contract: an overflow shows up as inf, so the step is skipped and the scale lowered."""
    got = _grads(_lce(lce.LinearCrossEntropyOptions(), loss_dtype=None), torch.float16, 2.0 ** 16)
    assert all(not torch.isfinite(g).all() for g in got)
    fine = _grads(_lce(lce.LinearCrossEntropyOptions(), loss_dtype=None), torch.float16, 2.0 ** 15)
    assert all(torch.isfinite(g).all() for g in fine)


@pytest.mark.parametrize("policy", ["balanced", "compact"])
def test_reduction_none_keeps_what_the_reference_keeps(policy):
    scale = 2.0 ** 12
    options = lce.LinearCrossEntropyOptions(acc_policy=policy, acc_dtype=torch.float32, chunking_method=None,
                                            batch_chunk_size=N // 64)
    with emulate_device_kind("cuda"):
        got = _grads(_lce(options), torch.float16, scale / N, "none")
    reference, exact = _reference(scale / N, "none"), _exact(scale / N, "none")
    for mine, theirs, truth in zip(got, reference, exact, strict=True):
        assert _lost(mine, truth) <= _lost(theirs, truth) + 0.0001 * truth.numel()


def test_class_tiling_and_a_retained_graph_hand_out_the_same_scaled_gradients():
    x, w, b, y = _problem()
    base = dict(acc_policy="balanced", acc_dtype=torch.float32, chunking_method=None, batch_chunk_size=256)
    results = []
    for extra in ({}, {"class_chunk_size": 1024}, {"allow_retain_graph": True}):
        options = lce.LinearCrossEntropyOptions(**base, **extra)
        leaves = [t.half().detach().requires_grad_() for t in (x, w, b)]
        loss = lce.linear_cross_entropy(leaves[0], leaves[1], y, linear_bias=leaves[2], options=options,
                                        loss_dtype=torch.float32)
        (loss * 2.0 ** 14).backward(retain_graph=bool(extra.get("allow_retain_graph")))
        if extra.get("allow_retain_graph"):
            first = [t.grad.clone() for t in leaves]
            for t in leaves:
                t.grad = None
            (loss * 2.0 ** 14).backward()
            assert all(torch.equal(a, t.grad) for a, t in zip(first, leaves, strict=True))
        results.append([t.grad for t in leaves])
    exact, reference = _exact(2.0 ** 14), _reference(2.0 ** 14)
    for grads in results:
        for mine, theirs, truth in zip(grads, reference, exact, strict=True):
            assert _lost(mine, truth) <= _lost(theirs, truth) + 0.0001 * truth.numel()
            assert _floors(mine, truth) <= 1.1 * _floors(theirs, truth)


def test_loss_dtype_is_checked_and_returned():
    x, w, _, y = _problem()
    half = (x.half(), w.half())
    loss = lce.linear_cross_entropy(*half, y, options=lce.LinearCrossEntropyOptions(), loss_dtype=torch.float32)
    assert loss.dtype == torch.float32
    unfused = lce.linear_cross_entropy(*half, y, loss_dtype=torch.float32)
    assert unfused.dtype == torch.float32 and float(loss) == pytest.approx(float(unfused), rel=1e-4)
    with pytest.raises(ValueError, match="loss_dtype must be None or one of"):
        lce.linear_cross_entropy(*half, y, loss_dtype=torch.int32)


def test_the_module_passes_loss_dtype_and_a_scale_of_2_16_through():
    x, w, b, y = _problem()
    head = lce.LinearCrossEntropyLoss(D, C, bias=True, dtype=torch.float16, options=lce.LinearCrossEntropyOptions(),
                                      loss_dtype=torch.float32)
    with torch.no_grad():
        head.linear.weight.copy_(w.half())
        head.linear.bias.copy_(b.half())
    assert "loss_dtype=torch.float32" in repr(head)
    loss = head(x.half(), y)
    assert loss.dtype == torch.float32
    (loss * 2.0 ** 16).backward()
    exact, reference = _exact(2.0 ** 16), _reference(2.0 ** 16)
    for mine, theirs, truth in zip((head.linear.weight.grad, head.linear.bias.grad), reference[1:], exact[1:],
                                   strict=True):
        assert torch.isfinite(mine).all()
        assert _lost(mine, truth) <= _lost(theirs, truth)
    with pytest.raises(ValueError, match="loss_dtype must be None or one of"):
        lce.LinearCrossEntropyLoss(D, C, loss_dtype=torch.int64)


@pytest.mark.parametrize("kind", ["cpu", "cuda"])
def test_without_a_loss_scale_only_subnormal_entries_are_rounded_twice(kind):
    """The headroom's price, as lce.passes.headroom states it: with an incoming gradient of 1 (no loss scale) the stored
    scaled gradient and the unscaling multiply are two roundings. Where the result is a normal fp16 number they
    agree with one (within half an ulp of fp64 on the same fp16 inputs); below fp16's normal range the second
    rounding can add a quarter of the subnormal step (the stored value carries 11 bits, the subnormal grid at most
    10), so an entry is within 3/4 of a step, not 1/2. Here half or more of every gradient's entries are subnormal
    (mean over 1024 rows), and some do miss."""
    x, w, b, y = (t.half().double() if t.is_floating_point() else t for t in _problem())
    leaves = [t.detach().requires_grad_() for t in (x, w, b)]
    torch.nn.functional.cross_entropy(leaves[0] @ leaves[1].T + leaves[2], y).backward()
    options = lce.LinearCrossEntropyOptions(acc_policy="accurate", acc_dtype=torch.float32, batch_chunk_size=256,
                                            chunking_method=None)
    with emulate_device_kind(kind):
        grads = _grads(_lce(options), torch.float16, 1.0)
    step = 2.0 ** -24  # fp16's subnormal spacing
    missed = 0
    for grad, leaf in zip(grads, leaves, strict=True):
        want = leaf.grad
        normal = want.abs() >= TINY
        assert float((~normal).double().mean()) > 0.4  # the regime this pins: many subnormal entries
        half_ulp = want.abs().log2().floor().exp2() * 2.0 ** -11
        error = (grad.double() - want).abs()
        assert bool((error[normal] <= half_ulp[normal] * 1.002).all())  # fp32 sums: a tie may tip
        assert bool((error[~normal] <= 0.75 * step * 1.002).all())
        missed += int((error[~normal] > 0.5 * step * 1.002).sum())
    assert missed > 0  # the second rounding shows (lce.passes.headroom); without the headroom none would
