"""lce.recommend: options that meet the budget and the error limit, clear errors otherwise."""

from __future__ import annotations

import warnings

import pandas as pd
import pytest
import torch

import lce
from analysis.judge.rule import BIAS_LIMIT, ERROR_LIMIT
from analysis.paths import RESULTS_DIR
from helpers import rel_err, round_trip
from lce.decide import TIME_FACTOR, faults, training_fault
from lce.decide.recommendation import DEFAULT_MAX_ERROR, RecommendationWarning, candidates

MiB = 2**20
LLM_HEADS = [(16384, 4096, 128256), (8192, 2304, 256000), (65536, 8192, 152064)]


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("shape", LLM_HEADS, ids=lambda s: "x".join(map(str, s)))
def test_without_a_budget_the_pick_meets_every_condition_within_autos_memory(shape, device):
    """The objective at LLM heads: no more memory than auto's plan, every condition met, within the time factor."""
    chosen = lce.recommend(*shape, torch.bfloat16, device)
    assert chosen.memory_budget is None and chosen.limit_met
    assert chosen.auto is not None and chosen.peak_bytes <= chosen.auto.peak_bytes
    assert not faults(chosen.chosen, DEFAULT_MAX_ERROR[torch.bfloat16])
    assert chosen.errors.keys() == {"grad_input", "grad_weight"}
    feasible = [c for c in chosen.considered if not faults(c, chosen.max_error)]
    assert chosen.chosen.seconds <= TIME_FACTOR * min(c.seconds for c in feasible)
    text = chosen.explain()
    assert chosen.chosen.label() in text and "vs compact" in text and "no budget" in text
    assert f"auto       {chosen.auto.label()}" in text


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("fraction", [1.02, 1.1, 1.5, 3.0])
def test_budgets_down_to_the_gradients_are_met(device, fraction):
    """Any budget a little above the bf16 gradients themselves is feasible (class tiling, compact)."""
    n, d, c = 8192, 2304, 256000
    gradients = (n * d + c * d) * 2
    chosen = lce.recommend(n, d, c, torch.bfloat16, device, memory_budget=int(fraction * gradients), max_error=100.0)
    assert gradients < chosen.peak_bytes <= fraction * gradients


def test_a_budget_nothing_meets_names_the_smallest_feasible_one():
    n, d, c = 8192, 2304, 256000
    smallest = min(candidate.peak_bytes for candidate in candidates(n, d, c, torch.bfloat16, torch.device("cuda"))
                   if training_fault(candidate.plan) is None)
    with pytest.raises(ValueError, match=f"smallest feasible budget is {smallest:,} bytes"):
        lce.recommend(n, d, c, torch.bfloat16, "cuda", memory_budget=10**9)
    assert lce.recommend(n, d, c, torch.bfloat16, "cuda", memory_budget=smallest, max_error=1e6).peak_bytes == smallest


def test_an_error_limit_nothing_meets_in_the_budget_says_so():
    with pytest.raises(ValueError, match="least error there is"):
        lce.recommend(8192, 2304, 256000, torch.bfloat16, "cuda", memory_budget=1164 * MiB, max_error=1.0)


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    (dict(num_rows=0), ValueError, "num_rows"),
    (dict(in_features=2.5), ValueError, "in_features"),
    (dict(num_classes=True), ValueError, "num_classes"),
    (dict(dtype=torch.int64), TypeError, "dtype"),
    (dict(dtype="bfloat16"), TypeError, "dtype"),
    (dict(device="gpu:x"), TypeError, "device"),
    (dict(memory_budget=-1), ValueError, "memory_budget"),
    (dict(memory_budget=float("nan")), ValueError, "memory_budget"),
    (dict(max_error=0.5), ValueError, "max_error"),
    (dict(max_error=float("nan")), ValueError, "max_error"),
])
def test_bad_arguments_are_named(kwargs, error, match):
    arguments = dict(num_rows=64, in_features=16, num_classes=100, dtype=torch.bfloat16, device="cpu") | kwargs
    with pytest.raises(error, match=match):
        lce.recommend(arguments.pop("num_rows"), arguments.pop("in_features"), arguments.pop("num_classes"),
                      arguments.pop("dtype"), arguments.pop("device"), **arguments)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("budget_mib", [None, 0.6, 2.0])
def test_recommended_options_run_chunked_and_are_accurate(dtype, budget_mib):
    """No fallback to the reference path, and the measured error is no worse than the limit allows."""
    n, d, c = 256, 32, 4096
    budget = None if budget_mib is None else int(budget_mib * MiB)
    # 0.6 MiB leaves no room for an fp32 (C, D) accumulator: on CPU only compact with acc_dtype = input fits
    limit = 100.0 if budget_mib == 0.6 else DEFAULT_MAX_ERROR.get(dtype, 1e3)
    chosen = lce.recommend(n, d, c, dtype, "cpu", memory_budget=budget, max_error=limit)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, d, generator=g).to(dtype).requires_grad_()
    w = (torch.randn(c, d, generator=g) / d**0.5).to(dtype).requires_grad_()
    target = torch.randint(0, c, (n,), generator=g)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the fallback warns
        lce.linear_cross_entropy(x, w, target, options=chosen.options).backward()
    exact = [t.detach().double().requires_grad_() for t in (x, w)]
    torch.nn.functional.cross_entropy(exact[0] @ exact[1].T, target).backward()
    for got, ref in ((x.grad, exact[0].grad), (w.grad, exact[1].grad)):
        floors = rel_err(got, ref) / rel_err(round_trip(ref, dtype), ref)
        assert floors <= 2.0 * chosen.error, (floors, chosen.explain())
    assert chosen.peak_bytes <= (budget or chosen.auto.peak_bytes)


def test_measure_times_the_finalists_on_the_device():
    chosen = lce.recommend(128, 16, 512, torch.bfloat16, "cpu", measure=True)
    assert chosen.measured_seconds and len(chosen.measured_seconds) <= 3
    assert all(seconds > 0 for seconds in chosen.measured_seconds.values())
    assert "measured" in chosen.explain()


def test_default_error_limits_follow_the_decision_rule_on_the_committed_noise_study():
    """Every measured pick at or below DEFAULT_MAX_ERROR met analysis.judge.rule's rule (worst family)."""
    noise = pd.concat([pd.read_csv(RESULTS_DIR / name) for name in ("noise.csv", "noise_cuda.csv")])
    noise = noise[noise["op"] == "lce"]
    medians = noise.groupby(["device", "dtype", "family", "policy", "num_chunks", "layout"])[
        ["grad_weight_floors", "weight_bias_over_noise", "weight_error_over_noise"]].median().reset_index()
    for dtype, limit in DEFAULT_MAX_ERROR.items():
        rows = medians[medians["dtype"] == str(dtype).removeprefix("torch.")]
        within = rows[rows["grad_weight_floors"] <= limit]
        assert len(within) >= 20
        assert (within["weight_bias_over_noise"].abs() <= BIAS_LIMIT).all()
        assert (within["weight_error_over_noise"] <= ERROR_LIMIT).all()
        assert (rows["grad_weight_floors"] > limit).any()  # the limit is not vacuous: larger errors were measured


def test_the_default_limit_yields_to_a_tight_budget_and_says_so():
    n, d, c = 8192, 2304, 256000
    with pytest.warns(RecommendationWarning, match=r"meets the default error limit of 2 floors .* a larger budget"):
        chosen = lce.recommend(n, d, c, torch.bfloat16, "cpu", memory_budget=int(1.05 * (n + c) * d * 2))
    assert "error limit 2 NOT met" in repr(chosen) and "\n" not in repr(chosen)
    within = [x for x in chosen.considered if x.peak_bytes <= chosen.memory_budget]
    assert not chosen.limit_met and chosen.error > DEFAULT_MAX_ERROR[torch.bfloat16]
    assert chosen.error == min(x.error for x in within)
    assert "warning" in chosen.explain()
    assert lce.recommend(n, d, c, torch.bfloat16, "cpu").limit_met


def test_a_recommendation_prints_on_one_line():
    chosen = lce.recommend(16384, 4096, 128256, torch.bfloat16, "cuda")
    text = repr(chosen)
    assert "\n" not in text and len(text) < 200, text
    assert text.startswith("Recommendation(") and "candidates considered" in text and "NOT met" not in text
