"""LinearCrossEntropyOptions validation and lce.plan's resolution of "auto".

torch's ``LinearCrossEntropyOptions`` (construction, and ``_adjust`` for the
call-time resolution on a CPU device) is the oracle, except where lce documents a
difference: "auto" chunking on CPU (lce.planning.policies.CPU_MIN_ROWS, and a CPU fp32 entry).
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

import lce
from helpers import F64, TORCH_HAS_OP, needs_torch_op
from lce.planning.policies import AUTO_TABLE

TorchOptions = getattr(torch.nn, "LinearCrossEntropyOptions", None)  # torch >= 2.13
POLICIES = ("auto", "accurate", "balanced", "compact")
RESOLVED_POLICIES = {"accurate", "balanced", "compact"}
CPU = torch.device("cpu")

# ------------------------------------------------------------------ construction


@needs_torch_op
def test_defaults_match_torch():
    ours, theirs = lce.LinearCrossEntropyOptions(), TorchOptions()
    names = [f.name for f in dataclasses.fields(TorchOptions)]
    # torch's fields first, in torch's order; lce's own fields after them, at their defaults
    assert [f.name for f in dataclasses.fields(lce.LinearCrossEntropyOptions)] == [*names, "class_chunk_size",
                                                                                  "batch_invariant"]
    assert ours.class_chunk_size is None and ours.batch_invariant is None
    for name in names:
        assert getattr(ours, name) == getattr(theirs, name), name


def test_is_frozen_dataclass():
    opts = lce.LinearCrossEntropyOptions(batch_chunk_size=4)
    assert dataclasses.is_dataclass(opts)
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.batch_chunk_size = 8  # type: ignore[misc]
    assert dataclasses.replace(opts, batch_chunk_size=8).batch_chunk_size == 8
    assert lce.LinearCrossEntropyOptions(batch_chunk_size=4) == opts


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_name_is_accepted(policy):
    opts = lce.LinearCrossEntropyOptions(acc_policy=policy)
    assert opts.acc_policy == policy
    x = torch.randn(6, 4, dtype=F64)
    W = torch.randn(9, 4, dtype=F64)
    p = lce.plan(x, W, options=opts)
    assert p.acc_policy in RESOLVED_POLICIES
    if policy != "auto":
        assert p.acc_policy == policy
    out = lce.linear_cross_entropy(x, W, torch.arange(6), options=opts)
    assert torch.isfinite(out)


VALID_KWARGS = [
    dict(),
    dict(acc_policy="compact", acc_dtype=torch.float32),
    dict(chunking_method=None),
    dict(chunking_method="aspect_ratio"),
    dict(chunking_method="aspect_ratio:1"),
    dict(chunking_method="aspect_ratio:3"),
    dict(chunking_method="aspect_ratio:16"),
    dict(batch_chunk_size=1),
    dict(batch_chunk_size=10**9, chunking_method=None),
    dict(acc_dtype=torch.float16),
    dict(acc_dtype=torch.bfloat16),
    dict(acc_dtype=torch.float64),
    dict(allow_retain_graph=True),
]

INVALID_KWARGS = [
    dict(acc_policy="fast"),
    dict(acc_policy="AUTO"),
    dict(acc_policy=None),
    dict(acc_policy=""),
    dict(chunking_method="aspect_ratio:0"),
    dict(chunking_method="aspect_ratio:-1"),
    dict(chunking_method="aspect_ratio:x"),
    dict(chunking_method="aspect_ratio:"),
    dict(chunking_method="aspect_ratio:1.5"),
    dict(chunking_method="aspect"),
    dict(chunking_method="sqrt"),
    dict(chunking_method=""),
    dict(batch_chunk_size=0),
    dict(batch_chunk_size=-3),
    dict(batch_chunk_size=2.0),
    dict(batch_chunk_size="4"),
    dict(acc_dtype=torch.int32),
    dict(acc_dtype=torch.complex64),
    dict(acc_dtype="float32"),
    dict(acc_dtype=torch.float8_e4m3fn),
]


@pytest.mark.parametrize("kwargs", VALID_KWARGS, ids=repr)
def test_valid_options_construct(kwargs):
    if TORCH_HAS_OP:
        TorchOptions(**kwargs)  # the oracle agrees it is valid
    opts = lce.LinearCrossEntropyOptions(**kwargs)
    for key, value in kwargs.items():
        assert getattr(opts, key) == value


@pytest.mark.parametrize("kwargs", INVALID_KWARGS, ids=repr)
def test_invalid_options_raise_value_error(kwargs):
    if TORCH_HAS_OP:
        with pytest.raises(ValueError):
            TorchOptions(**kwargs)  # the oracle rejects it too
    (field,) = kwargs
    with pytest.raises(ValueError, match=field):
        lce.LinearCrossEntropyOptions(**kwargs)


# ------------------------------------------------------------------ resolution

SHAPES = [  # (N, D, V)
    (64, 16, 40),
    (5, 16, 512),  # N < V / D
    (1, 8, 100),
    (256, 64, 512),
    (1000, 64, 50000),
    (33, 7, 7),  # V == D
    (100, 32, 8),  # V < D
]

OPTION_CASES = [
    dict(),
    dict(chunking_method="aspect_ratio"),
    dict(chunking_method="aspect_ratio:2"),
    dict(chunking_method="aspect_ratio:3"),
    dict(chunking_method=None),
    dict(chunking_method=None, batch_chunk_size=1),
    dict(chunking_method=None, batch_chunk_size=7),
    dict(chunking_method=None, batch_chunk_size=10**6),
    dict(batch_chunk_size=7),  # explicit size switches "auto" chunking off
    dict(batch_chunk_size=10**6),
    dict(acc_policy="accurate"),
    dict(acc_policy="balanced", chunking_method="aspect_ratio:2"),
    dict(acc_policy="compact", batch_chunk_size=3),
    dict(acc_policy="balanced", acc_dtype=torch.float32),
    dict(acc_dtype=torch.float32),
    dict(acc_policy="accurate", acc_dtype=torch.float64, chunking_method=None),
    dict(acc_dtype=torch.bfloat16, chunking_method="aspect_ratio:3"),
]

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64]


def _torch_resolution(kwargs, N, D, V, dtype):
    return TorchOptions(**kwargs)._adjust(num_batches=N, in_features=D, num_classes=V, dtype=dtype, device=CPU)


def _lce_resolution(kwargs, N, D, V, dtype):
    """torch's resolution with lce's documented CPU differences: the "auto" policy is lce's CPU entry (the
    decision procedure's, lce.decide), and "auto" chunking follows that entry (its method, and at least
    ``min_rows`` rows per chunk, never above N)."""
    expected = _torch_resolution(kwargs, N, D, V, dtype)
    pick = AUTO_TABLE.get(("cpu", dtype))
    if pick is None:
        return expected
    if kwargs.get("acc_policy", "auto") == "auto":
        expected = dataclasses.replace(expected, acc_policy=pick.acc_policy)
    auto_chunking = kwargs.get("chunking_method", "auto") == "auto" and kwargs.get("batch_chunk_size") is None
    if not auto_chunking:
        return expected
    if pick.batch_invariant:  # fixed rows per chunk, the last one padded (LinearCrossEntropyOptions.batch_invariant)
        return dataclasses.replace(expected, chunking_method=None, batch_chunk_size=pick.invariant_rows)
    method_size = _torch_resolution(dict(kwargs, chunking_method=pick.chunking_method), N, D, V, dtype)
    return dataclasses.replace(expected, chunking_method=pick.chunking_method,
                               batch_chunk_size=min(N, max(method_size.batch_chunk_size, pick.min_rows)))


def _check_plan(plan, expected, N, D, V, dtype):
    assert isinstance(plan, lce.Plan)
    assert plan.acc_policy == expected.acc_policy
    assert plan.chunking_method == expected.chunking_method
    assert plan.batch_chunk_size == expected.batch_chunk_size
    assert plan.acc_dtype == expected.acc_dtype
    assert plan.num_chunks == math.ceil(N / plan.batch_chunk_size)
    assert plan.input_dtype == dtype
    assert plan.device_kind == "cpu"
    assert isinstance(plan.peak_extra_bytes, int) and plan.peak_extra_bytes > 0


@needs_torch_op  # torch's own resolution is the oracle
@pytest.mark.parametrize("kwargs", OPTION_CASES, ids=repr)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_plan_resolution_matches_torch(dtype, kwargs):
    for N, D, V in SHAPES:
        x = torch.empty(N, D, dtype=dtype)
        W = torch.empty(V, D, dtype=dtype)
        expected = _lce_resolution(kwargs, N, D, V, dtype)
        for opts in (lce.LinearCrossEntropyOptions(**kwargs), TorchOptions(**kwargs)):
            _check_plan(lce.plan(x, W, options=opts), expected, N, D, V, dtype)


@needs_torch_op
@pytest.mark.parametrize("kwargs", OPTION_CASES[:10], ids=repr)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_plan_resolution_1d_input(dtype, kwargs):
    """A 1-D input is one row."""
    D, V = 16, 40
    x = torch.empty(D, dtype=dtype)
    W = torch.empty(V, D, dtype=dtype)
    expected = _lce_resolution(kwargs, 1, D, V, dtype)
    _check_plan(lce.plan(x, W, options=lce.LinearCrossEntropyOptions(**kwargs)), expected, 1, D, V, dtype)


def test_auto_acc_dtype_rules_on_cpu():
    x16 = torch.empty(64, 16, dtype=torch.bfloat16)
    W16 = torch.empty(40, 16, dtype=torch.bfloat16)
    assert lce.plan(x16, W16, options=lce.LinearCrossEntropyOptions()).acc_dtype == torch.float32
    for policy in ("accurate", "balanced", "compact"):
        assert lce.plan(x16, W16, options=lce.LinearCrossEntropyOptions(acc_policy=policy)).acc_dtype == torch.bfloat16
    x64 = torch.empty(64, 16, dtype=F64)
    W64 = torch.empty(40, 16, dtype=F64)
    assert lce.plan(x64, W64, options=lce.LinearCrossEntropyOptions()).acc_dtype == F64


@needs_torch_op
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("method", ["aspect_ratio", "aspect_ratio:2", "aspect_ratio:3"])
def test_explicit_size_and_method(method, dtype):
    """An explicit size that agrees with an explicit method is fine; one that disagrees is a ValueError."""
    N, D, V = 100, 16, 200
    x = torch.randn(N, D).to(dtype)
    W = torch.randn(V, D).to(dtype)
    target = torch.randint(0, V, (N,))
    agreed = _torch_resolution(dict(chunking_method=method), N, D, V, dtype).batch_chunk_size
    plan = lce.plan(x, W, options=lce.LinearCrossEntropyOptions(chunking_method=method, batch_chunk_size=agreed))
    assert plan.batch_chunk_size == agreed and plan.chunking_method == method

    bad = dict(chunking_method=method, batch_chunk_size=agreed + 1)
    with pytest.raises(ValueError):
        _torch_resolution(bad, N, D, V, dtype)  # oracle
    with pytest.raises(ValueError, match="batch_chunk_size"):
        lce.plan(x, W, options=lce.LinearCrossEntropyOptions(**bad))
    with pytest.raises(ValueError, match="batch_chunk_size"):
        lce.linear_cross_entropy(x, W, target, options=lce.LinearCrossEntropyOptions(**bad))
    with pytest.raises(ValueError, match="batch_chunk_size"):
        lce.linear_cross_entropy(x, W, target, options=TorchOptions(**bad))


def test_plan_str_is_a_readable_table():
    x = torch.empty(100, 16, dtype=torch.bfloat16)
    W = torch.empty(200, 16, dtype=torch.bfloat16)
    plan = lce.plan(x, W, options=lce.LinearCrossEntropyOptions(batch_chunk_size=7))
    text = str(plan)
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) >= 3, text
    assert plan.acc_policy in text
    assert "7" in text  # the chunk size
    assert str(plan.num_chunks) in text  # 15 chunks


def test_plan_is_what_runs():
    """Changing only the chunking in the plan never changes the fp64 result beyond rounding."""
    N, D, V = 50, 8, 30
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, D, generator=g, dtype=F64)
    W = torch.randn(V, D, generator=g, dtype=F64)
    t = torch.randint(0, V, (N,), generator=g)
    losses = []
    for size in (1, 7, N):
        opts = lce.LinearCrossEntropyOptions(batch_chunk_size=size)
        assert lce.plan(x, W, options=opts).num_chunks == math.ceil(N / size)
        losses.append(lce.linear_cross_entropy(x, W, t, options=opts))
    assert all(torch.allclose(loss, losses[0], rtol=1e-13, atol=0) for loss in losses)


# ------------------------------------------------------------------ class_chunk_size (lce only)

@pytest.mark.parametrize("size", [0, -1, 2.0, "8", True])
def test_bad_class_chunk_size_is_rejected(size):
    with pytest.raises(ValueError, match="class_chunk_size"):
        lce.LinearCrossEntropyOptions(class_chunk_size=size)


@needs_torch_op
def test_torch_options_coerce_to_untiled_lce_options():
    theirs = TorchOptions(acc_policy="balanced", batch_chunk_size=16, chunking_method=None)
    ours = lce.LinearCrossEntropyOptions.coerce(theirs)
    assert (ours.acc_policy, ours.batch_chunk_size, ours.class_chunk_size) == ("balanced", 16, None)
    assert ours.to_torch() == theirs


def test_class_tiling_cannot_be_handed_to_torch():
    with pytest.raises(ValueError, match="class_chunk_size"):
        lce.LinearCrossEntropyOptions(class_chunk_size=64).to_torch()


@pytest.mark.parametrize(("size", "blocks"), [(None, 1), (10**6, 1), (512, 1), (100, 6), (1, 512)])
def test_plan_cuts_the_classes_into_blocks(size, blocks):
    x, w = torch.randn(6, 4, dtype=F64), torch.randn(512, 4, dtype=F64)
    plan = lce.plan(x, w, options=lce.LinearCrossEntropyOptions(class_chunk_size=size))
    assert plan.num_class_chunks == blocks
    assert plan.tiles_classes == (blocks > 1)
    covered = [c for cols in plan.class_chunks() for c in range(512)[cols]]
    assert covered == list(range(512))
