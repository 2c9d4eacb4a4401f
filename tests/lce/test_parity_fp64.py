"""fp64 parity of the chunked path (and of options=None) with the reference formula.

The configurations form a deterministic pairwise covering design over
acc_policy x chunking x reduction x bias x class weight x ignore_index mode x
1-D input x label smoothing, plus "everything on" rows. Loss and gradients
must agree with ``F.cross_entropy(F.linear(...))`` to a relative Frobenius
error of 1e-12.
"""

from __future__ import annotations

import pytest
import torch

import lce
from helpers import (
    CALL_FACTORS,
    CHUNKINGS,
    IGNORE_MODES,
    Case,
    assert_parity,
    case_of,
    lce_run,
    make_options,
    make_problem,
    needs_torch_op,
    pairwise_design,
    ref_run,
    torch_options,
)
from lce.planning.options import ACC_POLICIES

POLICIES = ACC_POLICIES
TOL = 1e-12

_DESIGN = pairwise_design(CALL_FACTORS, seed=1)


def _rows():
    rows = [(r["policy"], r["chunking"], case_of(r)) for r in _DESIGN]
    # "Everything on": bias, class weights, in-range ignore_index, smoothing.
    for policy in POLICIES:
        for reduction in ("mean", "sum", "none"):
            for chunking in ("bcs7", "aspect_ratio:2"):
                rows.append((policy, chunking, Case(reduction=reduction, bias=True, class_weight=True,
                                                    ignore="in_range", label_smoothing=0.1)))
    for reduction in ("mean", "sum", "none"):
        rows.append(("auto", "bcs1", Case(reduction=reduction, bias=True, class_weight=True,
                                          ignore="out_of_range", label_smoothing=0.1, one_d=True)))
        rows.append(("compact", "bcs1", Case(reduction=reduction, bias=True, class_weight=True,
                                             ignore="negative", label_smoothing=0.1)))
    return rows


ROWS = _rows()


def test_design_is_pairwise_covering():
    """Sanity of the design itself: every level of every factor appears."""
    assert len(_DESIGN) <= 80
    for factor, levels in (("chunking", CHUNKINGS), ("policy", POLICIES), ("ignore", IGNORE_MODES)):
        assert {r[factor] for r in _DESIGN} == set(levels)


@pytest.mark.parametrize(
    "policy, chunking, case",
    ROWS,
    ids=[f"{i:02d}-{p}-{c}-{case.short()}" for i, (p, c, case) in enumerate(ROWS)],
)
def test_chunked_matches_reference_fp64(policy, chunking, case):
    problem = make_problem(case, seed=len(case.short()) + POLICIES.index(policy))
    opts = make_options(policy, chunking, case.N)
    if not case.one_d and chunking not in ("bcsN", "bcs2N", "single"):
        # the design really exercises several chunks
        assert lce.plan(problem.input, problem.linear_weight, options=opts).num_chunks > 1
    got = lce_run(problem, opts)
    ref = ref_run(problem)
    expected_shape = () if (case.reduction != "none" or case.one_d) else (case.N,)
    assert tuple(got[0].shape) == expected_shape
    assert_parity(got, ref, TOL, label=f"[{policy}/{chunking}]")


@pytest.mark.parametrize(
    "case",
    [
        Case(),
        Case(reduction="none", bias=True, class_weight=True, ignore="in_range", label_smoothing=0.1),
        Case(reduction="sum", one_d=True, ignore="out_of_range", bias=True),
    ],
    ids=lambda c: c.short(),
)
def test_reference_path_matches_reference_fp64(case):
    """options=None is the reference formula."""
    problem = make_problem(case, seed=3)
    assert_parity(lce_run(problem, None), ref_run(problem), TOL, label="[options=None]")


@needs_torch_op
@pytest.mark.parametrize("chunking", ["auto", "bcs7", "aspect_ratio:2"])
@pytest.mark.parametrize("policy", POLICIES)
def test_accepts_torch_options_instance(policy, chunking):
    case = Case(reduction="mean", bias=True, class_weight=True, ignore="default")
    problem = make_problem(case, seed=11)
    opts = torch_options(make_options(policy, chunking, case.N))
    assert isinstance(opts, torch.nn.LinearCrossEntropyOptions)
    assert_parity(lce_run(problem, opts), ref_run(problem), TOL, label="[torch options]")


SUBSETS = [
    ("input",),
    ("linear_weight",),
    ("linear_bias",),
    ("input", "linear_bias"),
    ("linear_weight", "linear_bias"),
    (),
]


@pytest.mark.parametrize("reduction", ["mean", "none"])
@pytest.mark.parametrize("subset", SUBSETS, ids=lambda s: "+".join(s) or "nothing")
def test_requires_grad_subsets(subset, reduction):
    """Only the requested gradients are produced, and they match the reference."""
    case = Case(reduction=reduction, bias=True, class_weight=True, label_smoothing=0.1)
    problem = make_problem(case, seed=5)
    opts = make_options("auto", "bcs7", case.N)
    loss, grads = lce_run(problem, opts, requires_grad=subset)
    rloss, rgrads = ref_run(problem, requires_grad=subset)
    for name, g in grads.items():
        if name not in subset:
            assert g is None, f"grad of {name} was not requested but is not None"
    assert_parity((loss, grads), (rloss, rgrads), TOL)


def test_no_grad_requested_gives_constant_loss():
    case = Case(bias=True)
    problem = make_problem(case, seed=6)
    out = lce.linear_cross_entropy(
        problem.input, problem.linear_weight, problem.target, linear_bias=problem.linear_bias,
        options=lce.LinearCrossEntropyOptions(batch_chunk_size=7),
    )
    assert not out.requires_grad
    ref = ref_run(problem, requires_grad=())[0]
    assert_parity((out, {n: None for n in ("input", "linear_weight", "linear_bias")}),
                  (ref, {n: None for n in ("input", "linear_weight", "linear_bias")}), TOL)
