"""The public surface has no traps (issue 33): no function shadows a submodule, lce.plan takes the op's tensors first
(the older order is refused, naming the call to make), documented constants are where the docs say, the package is
typed,
and an fp32 loss is one keyword away."""

from __future__ import annotations

import importlib
import importlib.util
import types
from pathlib import Path

import pytest
import torch

import lce


@pytest.mark.parametrize("name", lce.__all__)
def test_no_public_name_shadows_a_submodule(name):
    value = getattr(lce, name)
    if importlib.util.find_spec(f"lce.{name}") is not None:
        assert isinstance(value, types.ModuleType), f"lce.{name} is a {type(value).__name__} hiding module lce.{name}"


def test_the_documented_constants_are_where_the_docs_say():
    assert lce.decide.DEFAULT_MAX_ERROR[torch.bfloat16] >= 1
    assert importlib.import_module("lce.decide.recommendation").Recommendation is lce.Recommendation
    assert importlib.import_module("lce.planning.plan").Plan is lce.Plan


def _tensors():
    return torch.randn(64, 8, requires_grad=True), torch.randn(100, 8, requires_grad=True)


def test_plan_takes_the_tensors_first_and_default_options():
    x, w = _tensors()
    plan = lce.plan(x, w)
    assert plan.num_rows == 64 and plan.num_classes == 100 and plan.acc_policy == "compact"  # CPU fp32's auto
    assert lce.plan(x, w, options=lce.LinearCrossEntropyOptions(acc_policy="accurate")).acc_policy == "accurate"


@pytest.mark.parametrize("options", [None, lce.LinearCrossEntropyOptions(batch_chunk_size=16)])
def test_the_older_order_is_refused_naming_the_call_to_make(options):
    """``lce.plan(options, x, W)`` (the order of the first releases, deprecated since) is an error that says how to
    call it, not a plan of other tensors."""
    x, w = _tensors()
    with pytest.raises(TypeError, match=r"lce.plan takes \(input, linear_weight\) and keywords: lce.plan\(x, W, "
                                         r"options=\.\.\."):
        lce.plan(options, x, w)


@pytest.mark.parametrize(("args", "message"), [
    (("fast", "x", "w"), r"lce.plan takes \(input, linear_weight\) and keywords"),
    (("x", "w", "w"), r"lce.plan takes \(input, linear_weight\) and keywords"),
    ((None, "w"), r"lce.plan: input must be a torch.Tensor, got NoneType \(lce.plan takes the op's tensors first"),
])
def test_plan_says_what_it_takes(args, message):
    x, w = _tensors()
    values = [x if a == "x" else w if a == "w" else a for a in args]
    with pytest.raises(TypeError, match=message):
        lce.plan(*values)


def test_the_package_is_typed():
    assert (Path(lce.__file__).parent / "py.typed").exists()


def test_an_fp32_loss_is_one_keyword_away():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 32, generator=g).bfloat16()
    w = torch.randn(500, 32, generator=g).bfloat16()
    y = torch.randint(0, 500, (256,), generator=g)
    options = lce.LinearCrossEntropyOptions()
    narrow = lce.linear_cross_entropy(x, w, y, options=options)
    wide = lce.linear_cross_entropy(x, w, y, options=options, loss_dtype=torch.float32)
    exact = torch.nn.functional.cross_entropy(x.double() @ w.double().T, y)
    assert narrow.dtype == torch.bfloat16 and wide.dtype == torch.float32
    assert abs(float(wide) - float(exact)) < 1e-5 < abs(float(narrow) - float(exact)) + 1e-5
