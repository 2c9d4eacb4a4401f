"""Bad arguments raise a clear error; all-ignored batches and NaN/inf behave like the reference."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

import lce
from helpers import F64, Case, lce_run, make_problem, ref_run, reference_loss, same_nonfinite
from lce.planning.options import ACC_POLICIES

N, D, V = 6, 4, 5
PATHS = {"reference": None, "chunked": lce.LinearCrossEntropyOptions(batch_chunk_size=4)}


def _good(**changes):
    """A valid fp64 call's arguments with ``changes`` applied."""
    g = torch.Generator().manual_seed(0)
    args = dict(
        input=torch.randn(N, D, generator=g, dtype=F64),
        linear_weight=torch.randn(V, D, generator=g, dtype=F64),
        target=torch.randint(0, V, (N,), generator=g),
        linear_bias=torch.randn(V, generator=g, dtype=F64),
        weight=torch.rand(V, generator=g, dtype=F64) + 0.5,
        reduction="mean",
        ignore_index=None,
        label_smoothing=0.0,
    )
    args.update(changes)
    return args


def _call(args, options):
    args = dict(args)
    return lce.linear_cross_entropy(args.pop("input"), args.pop("linear_weight"), args.pop("target"),
                                    options=options, **args)


def _probs(*shape):
    g = torch.Generator().manual_seed(len(shape))
    return torch.softmax(torch.randn(*shape, generator=g, dtype=F64), dim=-1)


CLASS_WEIGHT = r"(?<!linear_)weight"  # the class-weight argument, not linear_weight


BAD_CALLS = [
    # (id, changes, exception, match)
    ("input-rank0", dict(input=torch.tensor(1.0, dtype=F64)), ValueError, "input"),
    ("input-rank3", dict(input=torch.zeros(2, N, D, dtype=F64)), ValueError, "input"),
    ("in_features", dict(input=torch.zeros(N, D + 1, dtype=F64)), ValueError, "in_features|linear_weight"),
    ("weight-rank1", dict(linear_weight=torch.zeros(D, dtype=F64), linear_bias=None, weight=None),
     ValueError, "linear_weight"),
    ("target-longer", dict(target=torch.zeros(N + 1, dtype=torch.int64)), ValueError, "target"),
    ("target-2d", dict(target=torch.zeros(N, 2, dtype=torch.int64)), ValueError, "target"),
    ("target-0d", dict(target=torch.tensor(1)), ValueError, "target"),
    ("target-1d-input", dict(input=torch.zeros(D, dtype=F64), target=torch.tensor([1])), ValueError, "target"),
    ("kdim-target-shape", dict(linear_weight=torch.zeros(V, 2, D, dtype=F64), linear_bias=None,
                               target=torch.zeros(N, dtype=torch.int64)), ValueError, "target"),
    ("kdim-1d-input", dict(input=torch.zeros(D, dtype=F64), linear_weight=torch.zeros(V, 2, D, dtype=F64),
                           linear_bias=None, target=torch.zeros(2, dtype=torch.int64)), ValueError, "input"),
    ("target-int32", dict(target=torch.zeros(N, dtype=torch.int32)), TypeError, "target"),
    ("target-int16", dict(target=torch.zeros(N, dtype=torch.int16)), TypeError, "target"),
    ("target-uint8", dict(target=torch.zeros(N, dtype=torch.uint8)), TypeError, "target"),
    ("target-float-batch-shape", dict(target=torch.zeros(N, dtype=F64)), TypeError, "target"),
    ("target-float-wrong-classes", dict(target=_probs(N, V + 1)), TypeError, "target"),
    ("target-too-big", dict(target=torch.tensor([0, 1, V, 2, 3, 4])), ValueError, "target"),
    ("target-negative", dict(target=torch.tensor([0, 1, -1, 2, 3, 4])), ValueError, "target"),
    ("target-not-the-ignore", dict(target=torch.tensor([0, 1, 999, 2, 3, 4]), ignore_index=1000),
     ValueError, "target"),
    ("kdim-target-too-big", dict(linear_weight=torch.zeros(V, 2, D, dtype=F64), linear_bias=None,
                                 target=torch.full((N, 2), V)), ValueError, "target"),
    ("bias-long", dict(linear_bias=torch.zeros(V + 1, dtype=F64)), ValueError, "linear_bias"),
    ("bias-2d", dict(linear_bias=torch.zeros(1, V, dtype=F64)), ValueError, "linear_bias"),
    ("kdim-bias-shape", dict(linear_weight=torch.zeros(V, 2, D, dtype=F64), linear_bias=torch.zeros(V, dtype=F64),
                             target=torch.zeros(N, 2, dtype=torch.int64)), ValueError, "linear_bias"),
    ("class-weight-short", dict(weight=torch.ones(V - 1, dtype=F64)), ValueError, CLASS_WEIGHT),
    ("class-weight-2d", dict(weight=torch.ones(V, 1, dtype=F64)), ValueError, CLASS_WEIGHT),
    ("weight-dtype", dict(linear_weight=torch.zeros(V, D, dtype=torch.float32)), TypeError, "linear_weight|dtype"),
    ("bias-dtype", dict(linear_bias=torch.zeros(V, dtype=torch.float32)), TypeError, "linear_bias"),
    ("class-weight-int", dict(weight=torch.ones(V, dtype=torch.int64)), TypeError, CLASS_WEIGHT),
    ("reduction", dict(reduction="avg"), ValueError, "reduction"),
    ("reduction-None", dict(reduction=None), ValueError, "reduction"),
    ("label_smoothing-neg", dict(label_smoothing=-0.1), ValueError, "label_smoothing"),
    ("label_smoothing-nan", dict(label_smoothing=float("nan")), ValueError, "label_smoothing"),
    ("label_smoothing-big", dict(label_smoothing=1.5), ValueError, "label_smoothing"),
    ("ignore_index-with-probs", dict(target=_probs(N, V), ignore_index=0), ValueError, "ignore_index"),
    ("ignore_index-with-probs-1d", dict(input=torch.zeros(D, dtype=F64), target=_probs(V), ignore_index=-100),
     ValueError, "ignore_index"),
]


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("changes, exc, match", [c[1:] for c in BAD_CALLS], ids=[c[0] for c in BAD_CALLS])
def test_bad_arguments_raise(path, changes, exc, match):
    args = _good(**changes)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a fallback warning may precede the error
        with pytest.raises(exc, match=match):
            _call(args, PATHS[path])


def test_a_class_weight_of_another_dtype_is_refused_by_the_materialized_formula_only():
    """The materialized formula's cross_entropy takes the class weight in the logits' dtype (torch's reference raises
    too); the chunked passes read it in their fp32 statistics whatever its dtype, as torch 2.13's chunked op does."""
    args = _good(weight=torch.tensor([0.75, 1.5, 1.0, 0.5, 1.25], dtype=torch.float32))
    with pytest.raises(TypeError, match=CLASS_WEIGHT):
        _call(args, PATHS["reference"])
    chunked = _call(args, PATHS["chunked"])
    assert abs(float(chunked) - float(_call(dict(args, weight=args["weight"].double()), None))) < 1e-12


@pytest.mark.parametrize("options", ["auto", {"batch_chunk_size": 4}, 3, True], ids=repr)
def test_options_of_wrong_type(options):
    with pytest.raises(TypeError, match="options"):
        _call(_good(), options)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("moved", ["linear_weight", "target", "linear_bias", "weight"])
def test_tensors_on_different_devices(path, moved):
    args = _good()
    args[moved] = args[moved].cuda()
    with pytest.raises(ValueError, match=moved if moved != "weight" else CLASS_WEIGHT):
        _call(args, PATHS[path])


# ------------------------------------------------------------------ all ignored

ALL_IGNORED_POLICIES = ACC_POLICIES


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
@pytest.mark.parametrize("class_weight", [False, True])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("policy", ALL_IGNORED_POLICIES)
def test_all_ignored_batch(policy, reduction, class_weight, label_smoothing):
    case = Case(N=9, D=4, V=7, reduction=reduction, bias=True, class_weight=class_weight,
                ignore="in_range", label_smoothing=label_smoothing)
    problem = make_problem(case, seed=2)
    problem = problem.replace(target=torch.full((case.N,), case.ignore_value, dtype=torch.int64))
    opts = lce.LinearCrossEntropyOptions(acc_policy=policy, batch_chunk_size=4)
    loss, grads = lce_run(problem, opts)
    ref_loss = ref_run(problem, requires_grad=())[0]
    if reduction == "mean":
        assert torch.isnan(loss) and torch.isnan(ref_loss)
    elif reduction == "sum":
        assert loss.item() == 0.0 and ref_loss.item() == 0.0
    else:
        assert torch.equal(loss, torch.zeros(case.N, dtype=F64))
    for name, g in grads.items():
        assert g is not None, name
        exactly_zero = bool((g == 0).all())
        assert exactly_zero, f"grad of {name} is not exactly zero: {g}"


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_all_ignored_1d_input(reduction):
    case = Case(N=1, D=4, V=7, reduction=reduction, bias=True, one_d=True)
    problem = make_problem(case, seed=3)
    problem = problem.replace(target=torch.tensor(-100))
    loss, grads = lce_run(problem, lce.LinearCrossEntropyOptions())
    assert loss.shape == ()
    if reduction == "mean":
        assert torch.isnan(loss)
    else:
        assert loss.item() == 0.0
    for name, g in grads.items():
        exactly_zero = bool((g == 0).all())
        assert exactly_zero, f"grad of {name} is not exactly zero: {g}"


# ------------------------------------------------------------------ NaN / inf

NONFINITE = [
    ("input-nan", "input", (2, 1), math.nan),
    ("input-posinf", "input", (2, 1), math.inf),
    ("input-neginf", "input", (3, 0), -math.inf),
    ("input-nan-in-ignored-row", "input", (1, 2), math.nan),  # row 1 is ignored
    ("input-inf-in-ignored-row", "input", (1, 2), math.inf),
    ("weight-nan", "linear_weight", (4, 1), math.nan),
    ("bias-inf", "linear_bias", (4,), math.inf),
]


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("where, index, value", [n[1:] for n in NONFINITE], ids=[n[0] for n in NONFINITE])
def test_nonfinite_input_propagates_like_reference(where, index, value, reduction, label_smoothing):
    case = Case(N=10, D=4, V=6, reduction=reduction, bias=True, ignore="default", label_smoothing=label_smoothing)
    problem = make_problem(case, seed=4)
    assert problem.target[1].item() == -100
    poisoned = getattr(problem, where).clone()
    poisoned[index] = value
    problem = problem.replace(**{where: poisoned})
    ref = reference_loss(problem.input, problem.linear_weight, problem.target, **problem.kwargs())
    for options in (None, lce.LinearCrossEntropyOptions(batch_chunk_size=3),
                    lce.LinearCrossEntropyOptions(acc_policy="compact", batch_chunk_size=1)):
        got = lce.linear_cross_entropy(problem.input, problem.linear_weight, problem.target,
                                       options=options, **problem.kwargs())
        assert got.shape == ref.shape
        ok = same_nonfinite(got, ref)
        assert ok, f"options={options}: got {got}, reference {ref}"
