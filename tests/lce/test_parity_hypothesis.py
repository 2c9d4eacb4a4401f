"""Randomised fp64 parity: hypothesis draws the shapes and every call option.

How many examples, and whether they are the same every run, is set by the Hypothesis profile
(tests/conftest.py): deterministic in CI, exploring with HYPOTHESIS_PROFILE=explore.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

import lce
from helpers import Case, assert_parity, lce_run, make_problem, ref_run
from lce.planning.options import ACC_POLICIES

TOL = 1e-12


@st.composite
def configs(draw):
    N = draw(st.integers(1, 48))
    D = draw(st.integers(1, 16))
    V = draw(st.integers(2, 40))
    ignore = draw(st.sampled_from(["default", "absent", "out_of_range", "negative"] + (["in_range"] if V > 3 else [])))
    # Row i is ignored when i % k == 1: k=2 ignores about half, large k almost none.
    ignore_every = draw(st.integers(2, 9))
    case = Case(
        N=N, D=D, V=V,
        reduction=draw(st.sampled_from(["mean", "sum", "none"])),
        bias=draw(st.booleans()),
        class_weight=draw(st.booleans()),
        ignore=ignore,
        one_d=draw(st.booleans()),
        label_smoothing=draw(st.sampled_from([0.0, 0.05, 0.1, 0.3, 1.0])),
        ignore_every=ignore_every,
    )
    chunk = draw(
        st.one_of(
            st.integers(1, 2 * N + 1).map(lambda s: dict(chunking_method=None, batch_chunk_size=s)),
            st.sampled_from(["auto", "aspect_ratio", "aspect_ratio:2", "aspect_ratio:3", None]).map(
                lambda m: dict(chunking_method=m)
            ),
        )
    )
    options = lce.LinearCrossEntropyOptions(
        acc_policy=draw(st.sampled_from(ACC_POLICIES)),
        allow_retain_graph=draw(st.booleans()),
        **chunk,
    )
    seed = draw(st.integers(0, 2**16))
    logit_scale = draw(st.sampled_from([0.1, 2.0, 8.0]))
    return case, options, seed, logit_scale


@given(configs())
def test_random_configs_match_reference_fp64(config):
    case, options, seed, logit_scale = config
    problem = make_problem(case, seed=seed, logit_scale=logit_scale)
    got = lce_run(problem, options)
    ref = ref_run(problem)
    assert_parity(got, ref, TOL, label=f"[{case} {options}]")
