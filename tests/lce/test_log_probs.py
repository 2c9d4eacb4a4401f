"""lce.linear_log_probs (issue 32): per-token log-probabilities and entropy under a temperature, with gradients.

* fp64 parity (1e-12 relative) of both outputs and the gradients of input, weight and bias with the materialized
  formula (lce.unfused.unfused_linear_log_probs) across policies, device layouts, chunkings (rows, aspect ratio,
  class tiling), temperatures (scalar, per row, 0-dim tensor), soft-capping, ignore_index and a bias; the same
  when only one output receives a gradient;
* fp64 gradcheck of a mixed RL loss (clipped policy-gradient term with advantages, an entropy bonus, a k3 KL
  term against reference log-probabilities);
* confident rows (margins to 40 nats): fp32 relative precision of log p, 1 - p and the entropy against fp64, where
  the materialized fp32 formula rounds the entropy to 0;
* low precision: bf16 and fp16 inputs within a few fp32 roundings of fp64 on the same rounded inputs;
* ignored tokens give 0 and no gradient; (B, T, D) and 1-D inputs; bad input raises naming the argument.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

import lce
from lce.testing import emulate_device_kind
from lce.unfused import unfused_linear_log_probs

N, D, C = 29, 8, 37
IGNORE = 3


def _problem(dtype=torch.float64, seed=0, n=N, d=D, c=C):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=torch.float64)
    w = torch.randn(c, d, generator=g, dtype=torch.float64) * (2 / d**0.5)
    b = torch.randn(c, generator=g, dtype=torch.float64) * 0.5
    target = torch.randint(0, c, (n,), generator=g)
    target[1::5] = IGNORE
    grad_logp = torch.randn(n, generator=g, dtype=torch.float64)
    grad_entropy = torch.randn(n, generator=g, dtype=torch.float64)
    return [t.to(dtype) for t in (x, w, b)] + [target, grad_logp, grad_entropy]


def _run(fn, x, w, b, target, grad_logp, grad_entropy, *, return_entropy=True, **kw):
    """Outputs and the gradients of input, weight and bias (None when b is None) of
    ``sum(grad_logp * logp + grad_entropy * H)`` on fresh leaves (a None incoming gradient: that output unused)."""
    leaves = [None if t is None else t.detach().clone().requires_grad_() for t in (x, w, b)]
    out = fn(leaves[0], leaves[1], target, linear_bias=leaves[2], return_entropy=return_entropy, **kw)
    log_probs, entropy = out if return_entropy else (out, None)
    total = 0.0
    if grad_logp is not None:
        total = total + (grad_logp * log_probs).sum()
    if grad_entropy is not None:
        total = total + (grad_entropy * entropy).sum()
    total.backward()
    return [log_probs.detach(), None if entropy is None else entropy.detach(),
            *[None if t is None else t.grad for t in leaves]]


def _worst_relative(got, want) -> float:
    worst = 0.0
    for a, b in zip(got, want, strict=True):
        if a is None and b is None:
            continue
        scale = float(b.abs().max())
        worst = max(worst, float((a - b).abs().max()) / (scale if scale > 0 else 1.0))
    return worst


TEMPERATURES = {"T=1": 1.0, "T=0.6": 0.6, "T=1.2": 1.2, "per row": "per row", "0-dim": "0-dim"}
CHUNKINGS = {
    "one chunk": dict(chunking_method=None),
    "rows of 7": dict(batch_chunk_size=7, chunking_method=None),
    "aspect_ratio": dict(chunking_method="aspect_ratio"),
    "auto": {},
    "rows of 5, tiled by 4": dict(batch_chunk_size=5, chunking_method=None, class_chunk_size=4),
    "auto, tiled by 11": dict(class_chunk_size=11),
}


def _temperature(label, n=N):
    value = TEMPERATURES[label]
    if value == "per row":
        return torch.linspace(0.6, 1.2, n, dtype=torch.float64)
    if value == "0-dim":
        return torch.tensor(0.8, dtype=torch.float64)
    return value


@pytest.mark.parametrize("kind", ["cpu", "cuda"])
@pytest.mark.parametrize("policy", ["accurate", "balanced", "compact", "auto"])
def test_fp64_parity_with_the_materialized_formula(kind, policy):
    x, w, b, target, grad_logp, grad_entropy = _problem()
    for chunking, temperature, softcap in itertools.product(CHUNKINGS, TEMPERATURES, (None, 2.0)):
        options = lce.LinearCrossEntropyOptions(acc_policy=policy, **CHUNKINGS[chunking])
        kw = dict(temperature=_temperature(temperature), softcap=softcap, ignore_index=IGNORE)
        want = _run(unfused_linear_log_probs, x, w, b, target, grad_logp, grad_entropy, **kw)
        with emulate_device_kind(kind):
            got = _run(lce.linear_log_probs, x, w, b, target, grad_logp, grad_entropy, options=options, **kw)
        worst = _worst_relative(got, want)
        assert worst <= 1e-12, f"{kind} {policy} {chunking} {temperature} softcap={softcap}: {worst:.3g}"


@pytest.mark.parametrize("uses", ["log_probs only", "entropy only", "no entropy asked"])
def test_fp64_parity_when_one_output_carries_the_gradient(uses):
    x, w, b, target, grad_logp, grad_entropy = _problem(seed=1)
    if uses == "log_probs only":
        grad_entropy = None
    elif uses == "entropy only":
        grad_logp = None
    for chunking in ("rows of 7", "rows of 5, tiled by 4"):
        options = lce.LinearCrossEntropyOptions(**CHUNKINGS[chunking])
        kw = dict(temperature=0.7, softcap=3.0, ignore_index=IGNORE,
                  return_entropy=uses != "no entropy asked")
        entropy_grad = None if uses == "no entropy asked" else grad_entropy
        want = _run(unfused_linear_log_probs, x, w, b, target, grad_logp, entropy_grad, **kw)
        got = _run(lce.linear_log_probs, x, w, b, target, grad_logp, entropy_grad, options=options, **kw)
        assert _worst_relative(got, want) <= 1e-12, (uses, chunking)


def test_no_bias_and_no_ignored_rows():
    x, w, _, target, grad_logp, grad_entropy = _problem(seed=2)
    target = target.clamp_max(C - 1)
    want = _run(unfused_linear_log_probs, x, w, None, target, grad_logp, grad_entropy)
    got = _run(lce.linear_log_probs, x, w, None, target, grad_logp, grad_entropy,
               options=lce.LinearCrossEntropyOptions(batch_chunk_size=4, chunking_method=None))
    assert _worst_relative(got, want) <= 1e-12


def test_gradcheck_of_a_mixed_rl_loss():
    """A GRPO/PPO-style objective in fp64: the clipped importance-weighted advantage, an entropy bonus and a k3 KL
    term against a reference policy's log-probabilities, through lce's chunked, class-tiled op."""
    g = torch.Generator().manual_seed(3)
    n, d, c = 11, 5, 13
    x = torch.randn(n, d, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(c, d, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(c, generator=g, dtype=torch.float64, requires_grad=True)
    target = torch.randint(0, c, (n,), generator=g)
    target[4] = -100
    advantages = torch.randn(n, generator=g, dtype=torch.float64)
    old_log_probs = -torch.rand(n, generator=g, dtype=torch.float64) * 3
    ref_log_probs = -torch.rand(n, generator=g, dtype=torch.float64) * 3
    temperature = torch.linspace(0.7, 1.1, n, dtype=torch.float64)
    options = lce.LinearCrossEntropyOptions(batch_chunk_size=4, chunking_method=None, class_chunk_size=5)

    def objective(x, w, b):
        log_probs, entropy = lce.linear_log_probs(x, w, target, linear_bias=b, temperature=temperature,
                                                  return_entropy=True, softcap=4.0, options=options)
        ratio = torch.exp(log_probs - old_log_probs)
        policy_gradient = -torch.minimum(ratio * advantages, ratio.clamp(0.8, 1.2) * advantages)
        log_ratio = ref_log_probs - log_probs
        kl = torch.exp(log_ratio) - log_ratio - 1
        return (policy_gradient - 0.01 * entropy + 0.04 * kl).sum()

    assert torch.autograd.gradcheck(objective, (x, w, b), eps=1e-6, atol=1e-8)


@pytest.mark.parametrize("margin", [10.0, 20.0, 40.0])
def test_confident_rows_keep_fp32_relative_precision(margin):
    """Rows whose target leads every other class by ``margin`` nats: log p, 1 - p and H are e^-margin-sized. lce's
    fp32 results stay within a few fp32 roundings of fp64 on the same inputs, relative to those tiny values; the
    materialized fp32 formula returns log p = 0 and an entropy that has lost every digit."""
    g = torch.Generator().manual_seed(4)
    n, c = 64, 96
    target = torch.randint(0, c, (n,), generator=g)
    w = margin * torch.eye(c) + 0.3 * torch.randn(c, c, generator=g)  # class c reads feature c
    x = torch.nn.functional.one_hot(target, c).float() + 0.02 * torch.randn(n, c, generator=g)
    b = torch.zeros(c)
    logits = (x.double() @ w.double().T)
    leads = logits.gather(1, target[:, None]).squeeze(1) - logits.scatter(1, target[:, None], -math.inf).amax(1)
    confident = leads > margin - 2
    assert confident.sum() >= n // 2
    exact_lp, exact_h = _target_relative_fp64(x, w, b, target)
    lp, h = lce.linear_log_probs(x, w, target, linear_bias=b, return_entropy=True)
    rel_lp = ((lp.double() - exact_lp) / exact_lp)[confident].abs().max()
    rel_h = ((h.double() - exact_h) / exact_h)[confident].abs().max()
    # the fp32 logits' own rounding (about 3e-6 nats at 40) is the error of e^-margin-sized values, relatively
    assert rel_lp < 1e-4 and rel_h < 1e-4, (float(rel_lp), float(rel_h))
    naive_lp, naive_h = unfused_linear_log_probs(x, w, target, linear_bias=b, return_entropy=True)
    if margin >= 20:  # fp32 p_y rounds to 1: log p_y is rounding noise and the entropy loses the target's own term
        assert float(((naive_lp.double() - exact_lp) / exact_lp)[confident].abs().max()) >= 0.99
        assert float(((naive_h.double() - exact_h) / exact_h)[confident].abs().max()) > 1 / (margin + 2)
    # in fp64 lce is exact where fp64's log_softmax is not (log(1 + 4e-18) rounds to 0 at 40 nats)
    lp64, h64 = lce.linear_log_probs(x.double(), w.double(), target, linear_bias=b.double(), return_entropy=True)
    assert float(((lp64 - exact_lp) / exact_lp)[confident].abs().max()) < 1e-12
    assert float(((h64 - exact_h) / exact_h)[confident].abs().max()) < 1e-12


def _target_relative_fp64(x, w, b, target):
    """log p_y and H in fp64 from ``v = u - u_y`` (the logits relative to the target's): ``-log p_y =
    softplus(logsumexp over c != y of v_c)`` and ``H = -log p_y - sum over c != y of p_c v_c``, which keep fp64's
    relative precision for a confident row, where fp64's ``log_softmax`` rounds ``log(1 + 4e-18)`` to 0."""
    logits = x.double() @ w.double().T + b.double()
    v = logits - logits.gather(1, target[:, None])
    others = v.scatter(1, target[:, None], -math.inf)
    nll = torch.nn.functional.softplus(torch.logsumexp(others, 1))
    probs = torch.exp(others - nll[:, None])
    return -nll, nll - (probs * others.nan_to_num(neginf=0.0)).sum(1)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("kind", ["cpu", "cuda"])
@pytest.mark.parametrize("policy", ["accurate", "balanced", "compact"])
def test_low_precision_inputs_stay_near_fp64_on_the_same_inputs(dtype, kind, policy):
    """With fp32 accumulation, fp32 statistics of the rounded inputs: outputs within 1e-5 nats of fp64 on the same
    rounded inputs, and gradients within a few of their dtype's rounding floors (large incoming gradients in fp16
    stay finite). Without it the logits GEMM rounds to the input dtype, as the loss's does: the study measures
    what that costs."""
    g = torch.Generator().manual_seed(5)
    n, d, c = 96, 32, 600
    x = torch.randn(n, d, generator=g).to(dtype)
    w = (torch.randn(c, d, generator=g) / 4).to(dtype)
    target = torch.randint(0, c, (n,), generator=g)
    grad_logp = torch.randn(n, generator=g) * 1e3
    grad_entropy = torch.randn(n, generator=g)
    want = _run(unfused_linear_log_probs, x.double(), w.double(), None, target, grad_logp.double(),
                grad_entropy.double(), temperature=0.8)
    options = lce.LinearCrossEntropyOptions(acc_policy=policy, acc_dtype=torch.float32, batch_chunk_size=32,
                                            chunking_method=None, class_chunk_size=256)
    with emulate_device_kind(kind):
        got = _run(lce.linear_log_probs, x, w, None, target, grad_logp, grad_entropy, temperature=0.8,
                   options=options)
    assert got[0].dtype == torch.float32 and got[1].dtype == torch.float32
    assert float((got[0].double() - want[0]).abs().max()) < 1e-5
    assert float((got[1].double() - want[1]).abs().max()) < 1e-5
    for have, exact in zip(got[2:4], want[2:4], strict=True):
        assert have.dtype == dtype and torch.isfinite(have).all()
        floor = float((exact.to(dtype).double() - exact).norm() / exact.norm())
        error = float((have.double() - exact).norm() / exact.norm())
        assert error <= 8 * floor, (error, floor)


def test_ignored_tokens_give_zero_and_no_gradient():
    x, w, b, target, grad_logp, grad_entropy = _problem()
    log_probs, entropy, grad_x, *_ = _run(lce.linear_log_probs, x, w, b, target, grad_logp, grad_entropy,
                                          ignore_index=IGNORE)
    ignored = target == IGNORE
    assert ignored.any()
    assert (log_probs[ignored] == 0).all() and (entropy[ignored] == 0).all()
    assert (grad_x[ignored] == 0).all() and (grad_x[~ignored].abs().sum(1) > 0).all()
    assert (log_probs[~ignored] < 0).all() and (entropy[~ignored] > 0).all()


def test_every_token_ignored_gives_zeros_and_zero_gradients():
    x, w, b, target, grad_logp, grad_entropy = _problem()
    outs = _run(lce.linear_log_probs, x, w, b, torch.full_like(target, -100), grad_logp, grad_entropy)
    assert all(float(t.abs().max()) == 0.0 for t in outs)


def test_leading_dimensions_and_one_token():
    x, w, b, target, grad_logp, grad_entropy = _problem()
    batched = lce.linear_log_probs(x[:28].reshape(4, 7, D), w, target[:28].reshape(4, 7), linear_bias=b,
                                   temperature=_temperature("per row", 28).reshape(4, 7), return_entropy=True,
                                   ignore_index=IGNORE)
    flat = lce.linear_log_probs(x[:28], w, target[:28], linear_bias=b, temperature=_temperature("per row", 28),
                                return_entropy=True, ignore_index=IGNORE)
    assert batched[0].shape == (4, 7) and torch.equal(batched[0].reshape(-1), flat[0])
    assert torch.equal(batched[1].reshape(-1), flat[1])
    one = lce.linear_log_probs(x[0], w, target[0], linear_bias=b, temperature=0.6)
    assert one.shape == () and float(one) == float(flat[0][0])
    empty = lce.linear_log_probs(x[:0], w, target[:0])
    assert empty.shape == (0,)


def test_backward_can_run_twice():
    x, w, b, target, grad_logp, grad_entropy = _problem()
    x = x.clone().requires_grad_()
    log_probs, entropy = lce.linear_log_probs(x, w, target, linear_bias=b, return_entropy=True, ignore_index=IGNORE,
                                              options=lce.LinearCrossEntropyOptions(batch_chunk_size=8))
    total = (grad_logp * log_probs + grad_entropy * entropy).sum()
    first, = torch.autograd.grad(total, x, retain_graph=True)
    second, = torch.autograd.grad(total, x)
    assert torch.equal(first, second)


def test_the_plan_says_what_it_computes():
    x, w, b, *_ = _problem(torch.bfloat16)
    plan = lce.logprobs.log_probs_plan(x.requires_grad_(), w, return_entropy=True, softcap=30.0)
    text = str(plan)
    assert plan.op == "log_probs" and plan.returns_entropy
    assert "per-token log-probabilities and entropy" in text and "token_exp_workspace" in text
    assert plan.peak_extra_bytes > 0


BAD = [
    (dict(temperature=0.0), ValueError, r"temperature must be a finite float > 0, got 0.0"),
    (dict(temperature=-1.0), ValueError, r"temperature must be a finite float > 0"),
    (dict(temperature=math.nan), ValueError, r"temperature must be a finite float > 0, got nan"),
    (dict(temperature=math.inf), ValueError, r"temperature must be a finite float > 0, got inf"),
    (dict(temperature=True), TypeError, r"temperature must be a float > 0 or a tensor, got bool"),
    (dict(temperature="1"), TypeError, r"temperature must be a float > 0 or a tensor, got str"),
    (dict(temperature=torch.ones(3)), ValueError, r"0-dim or have target's shape \(29,\)"),
    (dict(temperature=torch.ones(29, dtype=torch.int64)), TypeError, r"floating-point tensor"),
    (dict(temperature=torch.ones(29, requires_grad=True)), ValueError, r"temperature receives no gradient"),
    (dict(temperature=torch.linspace(-1, 1, 29)), ValueError, r"temperature must hold finite values > 0, found -1"),
    (dict(temperature=torch.full((29,), math.nan)), ValueError, r"temperature must hold finite values > 0"),
    (dict(return_entropy=1), TypeError, r"return_entropy must be a bool, got int"),
    (dict(softcap=0.0), ValueError, r"softcap must be a finite float > 0"),
    (dict(ignore_index=None), TypeError, r"ignore_index must be an int, got None"),
    (dict(target=torch.zeros(29, dtype=torch.int32)), TypeError, r"target must hold int64 class indices"),
    (dict(target=torch.zeros(28, dtype=torch.int64)), ValueError, r"target must have shape \(29,\)"),
    (dict(target=torch.full((29,), C)), ValueError, r"target values must lie in \[0, 37\) or equal ignore_index"),
    (dict(linear_weight=torch.zeros(C, D + 1)), ValueError, r"linear_weight must have shape \(C, 8\)"),
    (dict(linear_weight=torch.zeros(C, D, dtype=torch.float32)), TypeError, r"linear_weight must have input's dtype"),
    (dict(linear_bias=torch.zeros(C + 1, dtype=torch.float64)), ValueError, r"linear_bias must have shape \(37,\)"),
    (dict(input=torch.zeros(N, D, dtype=torch.int64)), TypeError, r"input must be a floating-point tensor"),
    (dict(options="fast"), TypeError, r"options must be None or a LinearCrossEntropyOptions"),
]


@pytest.mark.parametrize(("change", "error", "message"), BAD, ids=[m[:40] for _, _, m in BAD])
def test_bad_input_raises_naming_the_argument(change, error, message):
    x, w, b, target, *_ = _problem()
    call = dict(input=x, linear_weight=w, target=target, linear_bias=b) | change
    with pytest.raises(error, match=message):
        lce.linear_log_probs(call.pop("input"), call.pop("linear_weight"), call.pop("target"), **call)


@pytest.mark.parametrize("where", ["input", "linear_weight", "linear_bias"])
@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_non_finite_inputs_raise_naming_the_row(where, value):
    x, w, b, target, *_ = _problem()
    tensors = dict(input=x.clone(), linear_weight=w.clone(), linear_bias=b.clone())
    tensors[where][5] = value
    with pytest.raises(ValueError, match=r"the logits of row \d+ .* are not finite"):
        lce.linear_log_probs(tensors["input"], tensors["linear_weight"], target, linear_bias=tensors["linear_bias"],
                             return_entropy=True)
