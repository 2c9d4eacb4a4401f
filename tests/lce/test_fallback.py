"""Configurations the chunked path does not handle fall back to the reference with one warning.

K-dimensional linear weights and probability targets are computed by the
reference formula when ``options`` is given, with exactly one
``UserWarning`` that says why. Everything else the contract lists as
supported (label smoothing included, unlike torch) runs chunked, silently.
"""

from __future__ import annotations

import re
import warnings

import pytest
import torch

import lce
from helpers import F64, TORCH_HAS_OP, CallArgs, assert_parity, needs_torch_op, ref_run, reference_loss, run

KDIM_REASON = r"k-dim|out_features|multi-?dim"
PROBS_REASON = r"probabilit"  # matched case-insensitively
N, D, C = 12, 6, 9


def _kdim_problem(out_features, reduction, bias, g_seed=0):
    g = torch.Generator().manual_seed(g_seed)
    W = torch.randn(C, *out_features, D, generator=g, dtype=F64)
    b = torch.randn(C, *out_features, generator=g, dtype=F64) if bias else None
    target = torch.randint(0, C, (N, *out_features), generator=g)
    target[0] = -100
    loss_shape = (N, *out_features) if reduction == "none" else ()
    return CallArgs(
        input=torch.randn(N, D, generator=g, dtype=F64), linear_weight=W, target=target, linear_bias=b,
        weight=torch.rand(C, generator=g, dtype=F64) + 0.5, reduction=reduction, ignore_index=None,
        label_smoothing=0.0, grad_output=torch.randn(loss_shape, generator=g, dtype=F64),
    )


def _probs_problem(one_d, reduction, bias, label_smoothing, out_features=(), g_seed=1):
    g = torch.Generator().manual_seed(g_seed)
    batch = () if one_d else (N,)
    W = torch.randn(C, *out_features, D, generator=g, dtype=F64)
    b = torch.randn(C, *out_features, generator=g, dtype=F64) if bias else None
    target = torch.softmax(torch.randn(*batch, C, *out_features, generator=g, dtype=F64), dim=len(batch))
    loss_shape = (*batch, *out_features) if reduction == "none" else ()
    return CallArgs(
        input=torch.randn(*batch, D, generator=g, dtype=F64), linear_weight=W, target=target, linear_bias=b,
        weight=torch.rand(C, generator=g, dtype=F64) + 0.5, reduction=reduction, ignore_index=None,
        label_smoothing=label_smoothing, grad_output=torch.randn(loss_shape, generator=g, dtype=F64),
    )


def _run_recording(problem, options):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = run(lce.linear_cross_entropy, problem, options=options)
    return result, [w for w in caught]


def _check_fallback(problem, reason):
    ref = ref_run(problem)
    torch_built = [torch.nn.LinearCrossEntropyOptions(acc_policy="compact")] if TORCH_HAS_OP else []
    for options in (lce.LinearCrossEntropyOptions(), lce.LinearCrossEntropyOptions(batch_chunk_size=5), *torch_built):
        got, caught = _run_recording(problem, options)
        assert len(caught) == 1, f"expected exactly one warning, got {[str(w.message) for w in caught]}"
        assert issubclass(caught[0].category, UserWarning)
        msg = str(caught[0].message)
        assert re.search(reason, msg, re.IGNORECASE), f"warning does not name the reason ({reason}): {msg!r}"
        assert_parity(got, ref, 1e-12, label=f"[fallback {options}]")
    # options=None: the same numbers and no warning at all
    got, caught = _run_recording(problem, None)
    assert not caught, [str(w.message) for w in caught]
    assert_parity(got, ref, 1e-12, label="[options=None]")


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("out_features", [(3,), (2, 3)], ids=str)
def test_kdim_weight_falls_back(out_features, reduction, bias):
    _check_fallback(_kdim_problem(out_features, reduction, bias), KDIM_REASON)


@pytest.mark.parametrize("label_smoothing", [0.0, 0.2])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("one_d", [False, True], ids=["2d", "1d"])
def test_probability_targets_fall_back(one_d, reduction, label_smoothing):
    _check_fallback(_probs_problem(one_d, reduction, bias=True, label_smoothing=label_smoothing), PROBS_REASON)


def test_kdim_probability_targets_fall_back():
    problem = _probs_problem(False, "mean", bias=True, label_smoothing=0.1, out_features=(3,))
    _check_fallback(problem, f"{KDIM_REASON}|{PROBS_REASON}")


@needs_torch_op
def test_reference_handles_kdim_like_torch():
    """The helper's K-dim reference is torch's own options=None result (sanity of the oracle)."""
    p = _kdim_problem((2, 3), "none", bias=True)
    ours = reference_loss(p.input, p.linear_weight, p.target, **p.kwargs())
    theirs = torch.nn.functional.linear_cross_entropy(p.input, p.linear_weight, p.target, **p.kwargs())
    torch.testing.assert_close(ours, theirs, rtol=1e-14, atol=0)


@pytest.mark.parametrize(
    "changes",
    [
        dict(label_smoothing=0.1),
        dict(label_smoothing=1.0),
        dict(ignore_index=1000),
        dict(ignore_index=3),
        dict(reduction="none"),
        dict(reduction="sum", weight=None, linear_bias=None),
        dict(one_d=True),
    ],
    ids=repr,
)
def test_supported_configs_do_not_warn(changes):
    changes = dict(changes)
    one_d = changes.pop("one_d", False)
    g = torch.Generator().manual_seed(2)
    problem = CallArgs(
        input=torch.randn(N, D, generator=g, dtype=F64), linear_weight=torch.randn(C, D, generator=g, dtype=F64),
        target=torch.randint(0, C, (N,), generator=g), linear_bias=torch.randn(C, generator=g, dtype=F64),
        weight=torch.rand(C, generator=g, dtype=F64) + 0.5, reduction="mean", ignore_index=None,
        label_smoothing=0.0, grad_output=torch.randn(N, generator=g, dtype=F64),
    ).replace(**changes)
    if one_d:
        problem = problem.replace(input=problem.input[0], target=problem.target[0], grad_output=problem.grad_output[0])
    got, caught = _run_recording(problem, lce.LinearCrossEntropyOptions(batch_chunk_size=5))
    assert not caught, [str(w.message) for w in caught]
    assert_parity(got, ref_run(problem), 1e-12)
