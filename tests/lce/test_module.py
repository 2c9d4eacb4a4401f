"""lce.LinearCrossEntropyLoss against torch.nn.LinearCrossEntropyLoss with the same weights."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from torch import nn

import lce
from helpers import F64, needs_torch_op, rel_err

IN, C = 8, 11

CONFIGS = {
    "default": dict(),
    "bias-sum": dict(bias=True, reduction="sum"),
    "everything": dict(bias=True, reduction="none", weight="cw", ignore_index=3, label_smoothing=0.1),
    "chunked": dict(bias=True, options=dict(batch_chunk_size=5)),
    "chunked-everything": dict(bias=True, reduction="none", weight="cw", ignore_index=1000,
                               label_smoothing=0.1, options=dict(acc_policy="compact", batch_chunk_size=3)),
    "chunked-auto": dict(weight="cw", options=dict()),
    "kdim": dict(out_features=(3,), bias=True),
    "kdim-chunked": dict(out_features=(2, 2), bias=True, reduction="sum", options=dict(batch_chunk_size=4)),
}


def _build(cls, options_cls, cfg, class_weight):
    cfg = dict(cfg)
    if cfg.get("weight") == "cw":
        cfg["weight"] = class_weight.clone()
    if "options" in cfg:
        cfg["options"] = options_cls(**cfg["options"])
    return cls(IN, C, dtype=F64, **cfg)


def _targets(out_features, ignore_index, g, n=13):
    t = torch.randint(0, C, (n, *out_features), generator=g)
    t[2] = -100 if ignore_index is None else ignore_index
    return t


@needs_torch_op
@pytest.mark.parametrize("name", list(CONFIGS))
def test_module_matches_torch(name):
    cfg = CONFIGS[name]
    g = torch.Generator().manual_seed(7)
    class_weight = torch.rand(C, generator=g, dtype=F64) + 0.5
    theirs = _build(nn.LinearCrossEntropyLoss, nn.LinearCrossEntropyOptions, cfg, class_weight)
    ours = _build(lce.LinearCrossEntropyLoss, lce.LinearCrossEntropyOptions, cfg, class_weight)

    assert isinstance(ours, nn.Module)
    assert isinstance(ours.linear, nn.Linear)
    out_features = cfg.get("out_features", ())
    assert ours.linear.in_features == IN
    assert ours.linear.out_features == C * math.prod(out_features)
    assert (ours.linear.bias is not None) == cfg.get("bias", False)
    assert ours.linear.weight.dtype == F64
    with torch.no_grad():
        ours.linear.weight.copy_(theirs.linear.weight)
        if ours.linear.bias is not None:
            ours.linear.bias.copy_(theirs.linear.bias)

    x = torch.randn(13, IN, generator=g, dtype=F64)
    target = _targets(out_features, cfg.get("ignore_index"), g)
    results = []
    for module in (ours, theirs):
        xi = x.clone().requires_grad_()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch falls back (with a warning) on label smoothing / K-dim
            loss = module(xi, target)
        if loss.dim() == 0:
            grad_out = torch.ones_like(loss)
        else:
            grad_out = torch.linspace(-1, 2, loss.numel(), dtype=F64).reshape(loss.shape)
        loss.backward(grad_out)
        grads = [xi.grad, module.linear.weight.grad]
        if module.linear.bias is not None:
            grads.append(module.linear.bias.grad)
        results.append((loss.detach(), grads))
    (l_ours, g_ours), (l_theirs, g_theirs) = results
    assert l_ours.shape == l_theirs.shape
    assert rel_err(l_ours, l_theirs) <= 1e-12
    for a, b in zip(g_ours, g_theirs, strict=True):
        assert a is not None and rel_err(a, b) <= 1e-12


def test_module_kdim_warns_once_with_options():
    module = lce.LinearCrossEntropyLoss(IN, C, out_features=(3,), dtype=F64,
                                        options=lce.LinearCrossEntropyOptions())
    x = torch.randn(5, IN, dtype=F64)
    target = torch.randint(0, C, (5, 3))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module(x, target)
    assert len(caught) == 1 and issubclass(caught[0].category, UserWarning)


@needs_torch_op
def test_module_defaults_and_attributes():
    module = lce.LinearCrossEntropyLoss(IN, C)
    ref = nn.LinearCrossEntropyLoss(IN, C)
    assert module.linear.weight.shape == ref.linear.weight.shape
    assert module.linear.bias is None and ref.linear.bias is None
    assert module.linear.weight.dtype == ref.linear.weight.dtype
    assert module.reduction == "mean"
    assert module.options is None
    assert sorted(n for n, _ in module.named_parameters()) == sorted(n for n, _ in ref.named_parameters())


@needs_torch_op
@pytest.mark.parametrize("with_weight", [False, True])
def test_state_dict_interchangeable_with_torch(with_weight):
    cw = torch.rand(C, dtype=F64) + 0.5 if with_weight else None
    theirs = nn.LinearCrossEntropyLoss(IN, C, bias=True, dtype=F64, weight=cw)
    ours = lce.LinearCrossEntropyLoss(IN, C, bias=True, dtype=F64, weight=cw)
    ours.load_state_dict(theirs.state_dict())
    assert torch.equal(ours.linear.weight, theirs.linear.weight)
    assert torch.equal(ours.linear.bias, theirs.linear.bias)
    theirs.load_state_dict(ours.state_dict())


BAD_SETTINGS = [
    (dict(reduction="avg"), ValueError, "reduction"),
    (dict(label_smoothing=1.5), ValueError, "label_smoothing"),
    (dict(ignore_index="pad"), TypeError, "ignore_index"),
    (dict(weight=torch.ones(C + 1, dtype=F64)), ValueError, r"weight \(per-class\)"),
    (dict(weight=[1.0] * C), TypeError, "weight"),
    (dict(z_loss=-1.0), ValueError, "z_loss"),
]


@pytest.mark.parametrize(("settings", "error", "name"), BAD_SETTINGS, ids=[str(b[0]) for b in BAD_SETTINGS])
def test_module_rejects_bad_settings_with_the_functions_errors(settings, error, name):
    """The module checks its settings at construction with the function's own checks (the same message)."""
    with pytest.raises(error, match=name) as at_construction:
        lce.LinearCrossEntropyLoss(IN, C, dtype=F64, **settings)
    x, target = torch.randn(4, IN, dtype=F64), torch.randint(0, C, (4,))
    with pytest.raises(error) as in_the_function:
        lce.linear_cross_entropy(x, torch.randn(C, IN, dtype=F64), target, **settings)
    assert str(at_construction.value) == str(in_the_function.value)
