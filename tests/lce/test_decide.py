"""lce.decide: the one procedure behind "auto", lce.recommend and the decision tables.

The auto table must be the procedure's output; the training condition must follow its evidence; the objective
must pick what it says it picks.
"""

from __future__ import annotations

import pytest
import torch

import lce
from lce import decide
from lce.decide import (
    DEFAULT_MAX_ERROR,
    MEMORY_TIE,
    REFERENCE_HEADS,
    TIME_FACTOR,
    Candidate,
    choose,
    derive_auto,
    training_fault,
)
from lce.decide.invariance import INVARIANCE_COST, derive_invariance
from lce.planning.policies import AUTO_TABLE
from lce.testing import emulate_device_kind


@pytest.mark.parametrize(("kind", "dtype"), list(AUTO_TABLE), ids=lambda v: str(v).removeprefix("torch."))
def test_the_auto_table_is_the_procedures_output_at_the_reference_heads(kind, dtype):
    derived = derive_auto(kind, dtype)
    entry = AUTO_TABLE[(kind, dtype)]
    assert (*derived.pick, derived.min_rows) == (entry.acc_policy, entry.chunking_method, entry.min_rows), (
        f"lce.decide picks {derived.pick} with at least {derived.min_rows} rows for {kind} {dtype}; the auto table "
        f"says {(entry.acc_policy, entry.chunking_method, entry.min_rows)}: change the table (and its reason) or the "
        "procedure")
    assert not derived.rule_faults[derived.rule]


def test_auto_resolves_at_every_reference_head_to_the_rule_the_procedure_judged():
    """What auto plans at a reference head is the candidate derive_auto weighed for it (same rows, policy, peak)."""
    for kind, dtype in (("cuda", torch.bfloat16), ("cpu", torch.bfloat16)):
        derived = derive_auto(kind, dtype)
        for head in REFERENCE_HEADS:
            x = torch.empty(head.N, head.D, dtype=dtype, device="meta", requires_grad=True)
            w = torch.empty(head.C, head.D, dtype=dtype, device="meta", requires_grad=True)
            with emulate_device_kind(kind):
                plan = lce.plan(x, w, options=lce.LinearCrossEntropyOptions())
            judged = next(c for name, c in derived.table[derived.rule].items() if name.startswith(str(head)))
            assert (plan.acc_policy, plan.batch_chunk_size) == (judged.plan.acc_policy, judged.plan.batch_chunk_size)
            assert plan.acc_dtype == judged.plan.acc_dtype == torch.float32


def test_compact_at_the_aspect_ratio_chunk_counts_fails_on_cuda_and_says_why():
    derived = derive_auto("cuda", torch.bfloat16)
    reasons = " ".join(derived.rule_faults[("compact", "aspect_ratio:2", 1)])  # torch's default, no row floor
    assert "over the limit of 2" in reasons
    fp16 = " ".join(derive_auto("cuda", torch.float16).rule_faults[("compact", "aspect_ratio", 1)])
    assert "training moved the loss beyond the seed spread at 64 chunks" in fp16
    # at the floor auto keeps compact meets the error limit, and fails only the accurate-default condition
    floored = " ".join(derived.rule_faults[("compact", "aspect_ratio", derived.min_rows)])
    assert "over a default's limit of 1.25" in floored and "over the limit of 2" not in floored


def _plan(policy, chunks, dtype=torch.bfloat16, rows=4096, kind="cuda"):
    options = lce.LinearCrossEntropyOptions(acc_policy=policy, acc_dtype=torch.float32, chunking_method=None,
                                            batch_chunk_size=rows // chunks)
    with emulate_device_kind(kind):
        return lce.plan(torch.empty(rows, 64, dtype=dtype, device="meta", requires_grad=True),
                        torch.empty(1024, 64, dtype=dtype, device="meta", requires_grad=True), options=options)


@pytest.mark.parametrize(("dtype", "chunks", "verdict"), [
    (torch.bfloat16, 1, None), (torch.bfloat16, 8, None), (torch.bfloat16, 64, None),
    (torch.bfloat16, 128, "trained only up to 64 chunks"),
    (torch.bfloat16, 256, "beyond the seed spread at 256 chunks"),
    (torch.float16, 8, None), (torch.float16, 16, "trained only up to 8 chunks"),
    (torch.float16, 64, "beyond the seed spread at 64 chunks"),
], ids=str)
def test_the_training_condition_follows_its_evidence(dtype, chunks, verdict):
    fault = training_fault(_plan("compact", chunks, dtype))
    assert (fault is None) if verdict is None else (verdict in fault)
    assert training_fault(_plan("balanced", chunks, dtype)) is None  # an fp32 sum: chunk-independent


def test_a_weight_without_gradient_has_no_training_condition():
    options = lce.LinearCrossEntropyOptions(acc_policy="compact", acc_dtype=torch.float32, chunking_method=None,
                                            batch_chunk_size=16)
    with emulate_device_kind("cuda"):
        plan = lce.plan(torch.empty(4096, 64, dtype=torch.bfloat16, device="meta", requires_grad=True),
                        torch.empty(1024, 64, dtype=torch.bfloat16, device="meta"), options=options)
    assert plan.num_chunks == 256 and training_fault(plan) is None


def _candidate(peak, seconds, error, policy="balanced", chunks=1):
    return Candidate(lce.LinearCrossEntropyOptions(), _plan(policy, chunks), peak, {"grad_weight": error}, seconds)


def test_the_objective_is_least_memory_within_the_time_factor_then_the_faster():
    fast = _candidate(1000, 1.0, 1.1)
    lean = _candidate(600, TIME_FACTOR * 0.99, 1.2)
    leaner_slow = _candidate(400, TIME_FACTOR * 1.01, 1.0)
    tied = _candidate(int(600 * (1 + MEMORY_TIE / 2)), 1.1, 1.3)
    inaccurate = _candidate(100, 1.0, 5.0)
    choice = choose([fast, lean, leaner_slow, tied, inaccurate], DEFAULT_MAX_ERROR[torch.bfloat16])
    assert choice.chosen is tied and choice.limit_met
    assert inaccurate not in choice.feasible
    assert choose([fast, lean], 2.0, budget=700).chosen is lean
    with pytest.raises(ValueError, match="smallest feasible budget is 600 bytes"):
        choose([fast, lean], 2.0, budget=500)


def test_the_limit_yields_only_among_candidates_that_meet_the_training_condition():
    untrained = _candidate(100, 1.0, 3.0, policy="compact", chunks=256)
    trained = _candidate(200, 1.0, 4.0, policy="compact", chunks=8)
    choice = choose([untrained, trained], 2.0)
    assert choice.chosen is trained and not choice.limit_met
    with pytest.raises(ValueError, match="smallest feasible budget is 200 bytes"):
        choose([untrained, trained], 2.0, budget=150)
    with pytest.raises(ValueError, match="every candidate fails the training condition"):
        choose([untrained], 2.0)
    with pytest.raises(ValueError, match="least error there is 4 floors"):
        choose([untrained, trained], 2.0, limit_is_default=False)


def test_recommend_never_offers_a_candidate_that_fails_a_condition():
    for device in ("cuda", "cpu"):
        for budget in (None, 1_400_000_000, 1_250_000_000):
            chosen = lce.recommend(16384, 4096, 128256, torch.bfloat16, device, memory_budget=budget)
            assert training_fault(chosen.plan) is None, chosen.explain()
            if chosen.bias_met:
                assert decide.bias_fault(chosen.chosen) is None, chosen.explain()
            if chosen.limit_met:
                assert chosen.error <= DEFAULT_MAX_ERROR[torch.bfloat16]


def test_the_conditions_and_limits_are_stated_once():
    import sys

    from analysis.judge import rule

    assert rule.BIAS_LIMIT is decide.BIAS_LIMIT and rule.ERROR_LIMIT is decide.NOISE_ERROR_LIMIT
    assert sys.modules["lce.decide.recommendation"].DEFAULT_MAX_ERROR is decide.DEFAULT_MAX_ERROR


@pytest.mark.parametrize(("kind", "dtype"), list(AUTO_TABLE), ids=lambda v: str(v).removeprefix("torch."))
def test_the_auto_tables_batch_invariance_is_the_derivations(kind, dtype):
    """Each entry's fixed rows and loss default are lce.decide.invariance's answer at the reference heads."""
    derived = derive_invariance(kind, dtype)
    entry = AUTO_TABLE[(kind, dtype)]
    assert (entry.invariant_rows, entry.batch_invariant) == (derived.rows, derived.by_default), (
        f"lce.decide.invariance derives {derived.rows} fixed rows, default {derived.by_default} ({derived.reason}) "
        f"for {kind} {dtype}; the auto table says {entry.invariant_rows}, {entry.batch_invariant}")
    worst_time, worst_memory = derived.worst()
    if derived.by_default:  # the contract's price, as the default pays it
        assert dtype != torch.float16 and worst_time <= 1 + INVARIANCE_COST and worst_memory <= 1 + INVARIANCE_COST


# ---- the bias condition at the head's own N (issue 52) ---------------------------------------------------------

def _ratio(value, predicted=False, num_rows=16384):
    from lce.decide.noise_scaling import RatioAtBatch

    return RatioAtBatch("x", "bfloat16", "weight_bias_over_noise", num_rows, value, value / 2, value * 2, predicted)


def _biased(peak, seconds, error, bias, policy="compact", chunks=8):
    import dataclasses

    return dataclasses.replace(_candidate(peak, seconds, error, policy, chunks), bias=_ratio(bias))


def test_the_bias_condition_fails_an_input_dtype_sum_over_the_limit_and_reads_the_floor_as_no_fault():
    from lce.decide import BIAS_LIMIT, bias_fault, faults

    over = _biased(100, 1.0, 1.5, BIAS_LIMIT * 3)
    reason = bias_fault(over)
    assert reason is not None and "N=16384" in reason and "measured" in reason and f"{BIAS_LIMIT:g}" in reason
    assert any("bias" in fault for fault in faults(over, 2.0))
    assert bias_fault(_biased(100, 1.0, 1.5, BIAS_LIMIT / 3)) is None
    at_floor = _biased(100, 1.0, 1.0, BIAS_LIMIT * 3, policy="balanced", chunks=8)  # an fp32 sum, rounded once
    assert bias_fault(at_floor) is None
    assert bias_fault(_candidate(100, 1.0, 1.0)) is None  # no data (bias None): no fault


def test_choose_drops_a_biased_candidate_and_yields_only_when_every_one_is_biased():
    from lce.decide import BIAS_LIMIT

    lean_biased = _biased(100, 1.0, 1.5, BIAS_LIMIT * 4)
    less_biased = _biased(150, 1.0, 1.5, BIAS_LIMIT * 2, chunks=4)
    clean = _biased(300, 1.0, 1.2, BIAS_LIMIT / 2, chunks=2)
    choice = choose([lean_biased, clean], 2.0)
    assert choice.chosen is clean and choice.bias_met and lean_biased not in choice.feasible
    yielded = choose([lean_biased, less_biased], 2.0)
    assert yielded.chosen is less_biased and not yielded.bias_met and yielded.limit_met


@pytest.mark.parametrize(("kind", "dtype"), list(AUTO_TABLE), ids=lambda v: str(v).removeprefix("torch."))
def test_every_auto_entry_meets_the_bias_condition_at_every_reference_head(kind, dtype):
    from lce.decide import bias_fault, default_candidate

    for head in REFERENCE_HEADS:
        candidate = default_candidate(head, dtype, kind)
        assert bias_fault(candidate) is None, (head, candidate.bias)
        if dtype in (torch.bfloat16, torch.float16):
            assert candidate.bias is not None and candidate.bias.num_rows == head.N and not candidate.bias.predicted


def test_recommend_explains_the_bias_at_the_heads_n_and_warns_when_it_must_yield():
    chosen = lce.recommend(16384, 4096, 128256, torch.bfloat16, "cuda")
    assert "at N       weight-gradient bias" in chosen.explain() and "N=16384" in chosen.explain()
    assert chosen.bias_met and chosen.chosen.bias.value <= decide.BIAS_LIMIT
