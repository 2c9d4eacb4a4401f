"""The RL log-probabilities study (analysis.studies.rl_logprobs, issue 32): its fp64 reference is the materialized
fp64 formula where that is exact and stays exact on confident rows where it is not, its recipes compute what their
formulas say, its metrics are what they claim, and it writes and resumes; the worked GRPO example agrees in fp64."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

import lce
from analysis.core.families import confident_rows
from analysis.core.problem import Shape
from analysis.core.results_io import read_table
from analysis.core.token_reference import sample_targets, token_reference
from analysis.paths import ROOT
from analysis.studies import rl_logprobs as study
from helpers import own_cpu_gemms
from lce.unfused import unfused_linear_log_probs


@pytest.fixture(autouse=True)
def _native_cpu_gemms():
    """Replaces the suite's pin: this CPU's own verdict (helpers.own_cpu_gemms); what is checked here holds under
    any verdict (the recipes' errors and costs)."""
    with own_cpu_gemms():
        yield


def _fp64_problem(n=40, d=16, c=300, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=torch.float64)
    w = torch.randn(c, d, generator=g, dtype=torch.float64) * 0.5
    b = torch.randn(c, generator=g, dtype=torch.float64)
    target = torch.randint(0, c, (n,), generator=g)
    advantages = torch.randn(n, generator=g, dtype=torch.float64)
    return x, w, b, target, advantages


@pytest.mark.parametrize("temperature", [0.6, 1.0, "per row"])
def test_the_reference_is_the_materialized_fp64_formula_on_ordinary_rows(temperature):
    x, w, b, target, advantages = _fp64_problem()
    t = torch.linspace(0.6, 1.2, x.shape[0], dtype=torch.float64) if temperature == "per row" else temperature
    exact = token_reference(x, w, b, target, t, advantages, block_elements=7 * 300)  # 6 row chunks
    leaves = [v.clone().requires_grad_() for v in (x, w)]
    log_probs, entropy = unfused_linear_log_probs(leaves[0], leaves[1], target, linear_bias=b, temperature=t,
                                                  return_entropy=True)
    (-(advantages * log_probs).sum() / x.shape[0]).backward()
    torch.testing.assert_close(exact.log_probs, log_probs.detach(), rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(exact.entropy, entropy.detach(), rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(exact.grad_input, leaves[0].grad, rtol=1e-11, atol=1e-14)
    torch.testing.assert_close(exact.grad_weight, leaves[1].grad, rtol=1e-11, atol=1e-14)
    logits = (x @ w.T + b) / (t[:, None] if isinstance(t, torch.Tensor) else t)
    assert torch.equal(exact.rank, (logits > logits.gather(1, target[:, None])).sum(1))


def test_on_confident_rows_the_reference_keeps_what_fp64_log_softmax_loses():
    """At a 40-nat lead fp64's log_softmax returns log p = 0; the reference and lce's fp64 op agree to 1e-12."""
    drawn, lead = confident_rows(40.0, Shape(32, 64, 512), torch.float64, seed=0)
    assert lead > 39
    advantages = torch.ones(32, dtype=torch.float64)
    exact = token_reference(drawn.x, drawn.weight, None, drawn.target, 1.0, advantages)
    naive = unfused_linear_log_probs(drawn.x, drawn.weight, drawn.target)
    assert (naive == 0).all() and (exact.log_probs < 0).all() and (exact.other_prob > 0).all()
    mine, entropy = lce.linear_log_probs(drawn.x, drawn.weight, drawn.target, return_entropy=True)
    assert float(((mine - exact.log_probs) / exact.log_probs).abs().max()) < 1e-12
    assert float(((entropy - exact.entropy) / exact.entropy).abs().max()) < 1e-12


def test_targets_are_sampled_from_the_tempered_softmax():
    x, w, b, *_ = _fp64_problem(n=2000, c=5)
    first = sample_targets(x, w, b, 0.8, seed=3, block_elements=5 * 64)
    assert torch.equal(first, sample_targets(x, w, b, 0.8, seed=3))  # seeded, whatever the row chunks
    probs = torch.softmax((x @ w.T + b) / 0.8, 1)
    expected = probs.mean(0)
    observed = torch.bincount(first, minlength=5).double() / 2000
    assert float((observed - expected).abs().max()) < 0.03
    cold = sample_targets(x, w, b, 1e-3, seed=0)  # near-greedy: the top class but where two nearly tie
    assert float((cold == (x @ w.T + b).argmax(1)).double().mean()) > 0.99


def test_ratio_summary_is_what_it_says():
    delta = torch.tensor([0.0, 1e-4, -2e-3, 0.3], dtype=torch.float64)
    summary = study.ratio_summary(delta)
    assert summary["ratio_err_max"] == pytest.approx(math.expm1(0.3))
    assert summary["ratio_share_over_1e-3"] == 0.5 and summary["ratio_share_over_clip"] == 0.25
    k3 = [math.expm1(d) - d for d in delta.tolist()]
    assert summary["kl_k3"] == pytest.approx(sum(k3) / 4, rel=1e-12)


def test_each_recipe_computes_its_formula():
    """On fp64 inputs every recipe computes the exact formula, to fp64's rounding where it computes in the input
    dtype and to fp32's where its statistics are fp32 by construction; in bf16 the materialized and cast-back
    recipes return bf16, the fp32 head and lce fp32."""
    x, w, b, target, _ = _fp64_problem(n=12, c=50)
    want, want_h = unfused_linear_log_probs(x, w, target, linear_bias=b, temperature=0.7, return_entropy=True)
    in_fp32 = {"fp32 statistics, cast back", "fp32 head", "trl", "trl cast_lm_head_to_fp32"}
    for recipe in study.RECIPES:
        got, got_h = recipe.run(x, w, b, target, 0.7)
        tolerance = 1e-5 if recipe.label in in_fp32 or recipe.acc_dtype == "float32" else 1e-10
        torch.testing.assert_close(got.double(), want, rtol=tolerance, atol=tolerance, msg=recipe.label)
        torch.testing.assert_close(got_h.double(), want_h, rtol=tolerance, atol=tolerance, msg=recipe.label)
    expected = {"materialized": torch.bfloat16, "fp32 statistics, cast back": torch.bfloat16,
                "fp32 head": torch.float32}
    for recipe in study.RECIPES:
        with study.input_dtype_gemms(recipe, torch.bfloat16):
            got, _ = recipe.run(x.bfloat16(), w.bfloat16(), b.bfloat16(), target, 0.7)
        assert got.dtype == expected.get(recipe.label, torch.float32), recipe.label


def test_the_trl_recipes_call_the_head_trls_trainers_install():
    """The recipe's kernel is the very object TRL's fused forward calls, with the tile width it passes; by default
    it rounds each tile's logits to the input dtype (bf16-size errors), with cast_lm_head_to_fp32 it does not."""
    from trl.trainer import utils as trl_utils

    kernel, classes_per_tile = study._trl_kernel()
    assert kernel is trl_utils._ChunkedLogProbFunction and classes_per_tile == trl_utils._CHUNKED_LOGPROB_CHUNK_SIZE
    x, w, b, target, _ = _fp64_problem(n=64, d=32, c=2000, seed=1)
    exact = unfused_linear_log_probs(x, w * 8, target, linear_bias=b)  # logits of a few nats' spread
    errors = {}
    for recipe in study.RECIPES[:2]:
        with study.input_dtype_gemms(recipe, torch.bfloat16):
            got, _ = recipe.run(x.bfloat16(), (w * 8).bfloat16(), b.bfloat16(), target, 1.0)
        assert got.dtype == torch.float32
        exact_rounded = unfused_linear_log_probs(x.bfloat16().double(), (w * 8).bfloat16().double(), target,
                                                 linear_bias=b.bfloat16().double())
        errors[recipe.label] = float((got.double() - exact_rounded).abs().max())
    assert errors["trl"] > 1e-2 > 1e-4 > errors["trl cast_lm_head_to_fp32"]
    assert float((exact - exact_rounded).abs().max()) > 0  # the inputs were rounded; both recipes see the same


def test_a_small_study_writes_one_row_per_recipe_and_resumes(tmp_path):
    problems = (study.Problem("calibrated", Shape(64, 32, 2048)), study.Problem("confident:30", Shape(16, 32, 256)))
    settings = dict(problems=problems, dtypes=("bfloat16",), temperatures=(0.8,), seeds=(0,), progress=False)
    path, _ = study.record(tmp_path, **settings)
    table = read_table(path)
    assert len(table) == 2 * len(study.RECIPES)
    assert table["git_revision"].notna().all() and table["cpu_model"].notna().all()
    by = table.set_index(["family", "recipe"])
    calibrated = by.loc["calibrated"]
    assert calibrated.loc["lce auto cuda", "ratio_err_max"] < 1e-4 < calibrated.loc["materialized", "ratio_err_max"]
    confident = by.loc["confident:30"]
    assert confident.loc["lce auto cpu", "entropy_rel_err_max"] < 1e-4
    assert confident.loc["materialized", "logp_rel_err_max"] > 0.5
    study.record(tmp_path, **settings)  # nothing left to do: no new rows
    assert len(read_table(path)) == len(table)
    assert calibrated.loc["trl cast_lm_head_to_fp32", "ratio_err_max"] < 1e-4 < calibrated.loc["trl", "ratio_err_max"]


def test_a_recipe_added_later_is_measured_alone(tmp_path):
    problem = study.Problem("calibrated", Shape(32, 16, 512))
    settings = dict(problems=(problem,), dtypes=("bfloat16",), temperatures=(1.0,), seeds=(0, 1), progress=False)
    path, _ = study.record(tmp_path, recipes=study.RECIPES[2:4], **settings)
    first = read_table(path)
    study.record(tmp_path, recipes=study.RECIPES[:4], **settings)
    table = read_table(path)
    assert len(table) == 2 * 4 and table.groupby("seed")["recipe"].nunique().eq(4).all()
    pd.testing.assert_frame_equal(table.iloc[:len(first)], first)  # the earlier rows stay as they were


def test_the_qwen_head_items_join_the_grid_in_bf16_only():
    items = study.all_problems(study.PROBLEMS[:1], ("bfloat16", "float16"), (1.0,), (0,), qwen_head=True)
    qwen = [item for item in items if item[0] == study.QWEN_PROBLEM]
    assert study.QWEN_PROBLEM.shape.C == 151936 and study.QWEN_PROBLEM.shape.D == 896
    assert {(d, t) for _, d, t, _ in qwen} == {("bfloat16", t) for t in study.QWEN_TEMPERATURES}
    assert len(items) == 2 + len(qwen)

@pytest.mark.slow  # times every recipe

def test_costs_measure_every_cpu_recipe_at_two_batches(tmp_path, monkeypatch):
    monkeypatch.setattr(study, "COST_SHAPES", (Shape(512, 32, 8192), Shape(1024, 32, 8192)))  # 2 and 4 chunks
    table = study.measure_costs(study.COST_SHAPES, repeats=1)
    assert set(table["recipe"]) == {r.label for r in study.RECIPES if r.layout != "cuda"}
    assert (table["peak_bytes"] > 0).all() and (table["time_median_s"] > 0).all()
    stood_in = table["gemms"] == "fp32 stand-in"
    assert set(table.loc[stood_in, "recipe"]) == ({"trl", "materialized", "fp32 statistics, cast back"}
                                                  if study.emulates(torch.bfloat16) else set())
    assert (table.loc[stood_in, "note"] == study.STAND_IN_NOTE).all()
    lce_rows = table[table["op"] == "lce"]
    assert lce_rows["predicted_peak_bytes"].notna().all()
    big = table[table["N"] == 1024].set_index("recipe")
    assert big.loc["lce auto cpu", "peak_bytes"] < big.loc["materialized", "peak_bytes"]


# ---- the worked example ---------------------------------------------------------------------------------------

def _example():
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import grpo_update
    finally:
        sys.path.pop(0)
    return grpo_update


def test_the_grpo_example_agrees_with_materialized_logits_in_fp64():
    example = _example()
    agreement = example.fp64_agreement(vocab=512, settings=example.GrpoSettings(prompts=2, group=3, new_tokens=6))
    assert agreement["loss_rel_diff"] < 1e-12 and agreement["grad_rel_diff"] < 1e-10
    assert agreement["loss_step1"] != agreement["loss_step2"]


@pytest.mark.slow
def test_the_grpo_example_runs(tmp_path):
    out = tmp_path / "example.csv"
    result = subprocess.run([sys.executable, str(ROOT / "examples" / "grpo_update.py"), "--vocab", "32768",
                             "--parity-vocab", "1024", "--csv", str(out)], capture_output=True, text=True,
                            cwd=ROOT, timeout=600, check=True)
    assert "lce against materialized logits" in result.stdout and "peak extra memory lce" in result.stdout
    row = pd.read_csv(out).iloc[0]
    assert row["loss_rel_diff"] < 1e-12 and row["grad_rel_diff"] < 1e-10
    assert row["lce_peak_bytes"] < row["materialized_peak_bytes"]
    assert Path(out).read_text().startswith("kind,")
