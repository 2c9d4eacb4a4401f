"""The head-only study: its restated arithmetic is lce's, its buckets, its lockstep runs and their resumption."""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest
import torch

from analysis.core.buckets import BUCKETS, bucket_edges, bucket_losses, class_buckets
from analysis.core.families import draw
from analysis.core.problem import Shape
from analysis.studies import head_arithmetic as arithmetic
from analysis.studies import head_training as study

TINY = study.Setting("tiny", steps=20, batch_rows=256, pool_rows=2048, heldout_rows=128, D=8, C=64, seeds=(0,),
                     eval_every=10, bias_steps=(0, 20))


def _head(n: int = 128, d: int = 16, c: int = 256, seed: int = 0):
    drawn = draw("calibrated", Shape(n, d, c), seed=seed, bias=False)
    return drawn.x, drawn.weight * 0.5, drawn.target


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("policy", ["accurate", "balanced", "compact"])
@pytest.mark.parametrize("num_chunks", [1, 7, 64])
def test_restated_arithmetic_is_lces_own(dtype, policy, num_chunks):
    """The restatement's gradient differs from lce's (its CUDA layout, emulated) only by fp32 summation order:
    on under 1% of the elements, by under 5% of the gradient's own rounding error against fp64."""
    x, w, y = _head()
    check = arithmetic.check_against_lce(x, w, y, dtype, policy, num_chunks)
    assert check["elements_differing"] < 0.01, check
    assert check["mismatch_over_error"] < 0.05, check


def test_restated_arithmetic_with_rows_not_a_power_of_two_and_a_loss_scale():
    x, w, y = _head(n=100)
    check = arithmetic.check_against_lce(x, w, y, torch.float16, "compact", 9, loss_scale=1024.0)
    assert check["elements_differing"] < 0.01 and check["mismatch_over_error"] < 0.05, check


def test_a_loss_scale_now_decides_the_rounding_of_lces_fp16_gradient_and_the_restatement_follows():
    """lce keeps fp16 gradients scaled by powers of two and multiplies the loss scale in before their last
    rounding (lce.passes.headroom): under 2**12 the entries fp16 cannot hold at their true size keep their digits, so
    the
    scaled step's gradient is closer to fp64 than the unscaled one; the restatement without the headroom (lce
    before it) loses them, and the restatement with it is lce's arithmetic."""
    x, w, y = _head()
    unscaled = arithmetic.lce_weight_gradient(x, w, y, torch.float16, "accurate", 4)
    scaled = arithmetic.lce_weight_gradient(x, w, y, torch.float16, "accurate", 4, loss_scale=2.0**12)
    before = arithmetic.head_step(x, w, y, torch.float16, "accurate", 4, 2.0**12, headroom=False).grad_weight
    after = arithmetic.head_step(x, w, y, torch.float16, "accurate", 4, 2.0**12).grad_weight
    x64, w64 = x.half().double(), w.half().double()
    p = torch.softmax(x64 @ w64.T, dim=1)
    p[torch.arange(x.shape[0]), y] -= 1.0
    exact = p.T @ x64 / x.shape[0]

    def error(grad):
        return float(torch.linalg.vector_norm(grad.double() - exact))

    assert bool((exact.abs() < 2.0**-14).any())  # entries below fp16's normal range at their true size
    assert error(scaled) < error(unscaled) and error(after) < error(before)
    assert float((after != scaled).double().mean()) < 0.01  # fp32 summation order only
    check = arithmetic.check_against_lce(x, w, y, torch.float16, "compact", 16, loss_scale=2.0**12)
    assert check["elements_differing"] < 0.01 and check["mismatch_over_error"] < 0.05, check


def test_compact_error_grows_with_chunks_against_fp64():
    """A check against fp64, not against itself: compact's weight-gradient error grows with the chunk count,
    balanced's does not."""
    x, w, y = _head(n=256)
    x64, w64 = x.bfloat16().double(), w.bfloat16().double()
    p = torch.softmax(x64 @ w64.T, 1)
    p[torch.arange(256), y] -= 1
    exact = p.T @ x64 / 256

    def error(policy, chunks):
        return float(torch.linalg.vector_norm(arithmetic.head_step(x, w, y, torch.bfloat16, policy, chunks).grad_weight
                                              .double() - exact))

    assert error("compact", 256) > 3 * error("compact", 1)
    assert error("balanced", 256) == pytest.approx(error("balanced", 1), rel=0.05)
    assert error("accurate", 64) < error("balanced", 64)


def test_head_step_rejects_bad_arguments():
    x, w, y = _head(n=16)
    with pytest.raises(ValueError, match="policy must be one of"):
        arithmetic.head_step(x, w, y, torch.bfloat16, "fast", 1)
    with pytest.raises(TypeError, match="dtype must be"):
        arithmetic.head_step(x, w, y, torch.float32, "compact", 1)
    with pytest.raises(ValueError, match="num_chunks must lie in 1..16"):
        arithmetic.chunk_rows(16, 17)
    assert arithmetic.chunk_rows(100, 9) == 12
    assert arithmetic.grad_logits_scale(256, torch.bfloat16) == (1 / 256, 1.0)
    row_scale, rescale = arithmetic.grad_logits_scale(256, torch.float16)
    assert row_scale / rescale == 2.0**13


def test_a_loss_scale_that_overflows_fp16_is_reported_not_finite():
    x, w, y = _head(n=16)
    assert arithmetic.head_step(x, w, y, torch.float16, "balanced", 1, loss_scale=1.0).finite
    assert not arithmetic.head_step(x, w, y, torch.float16, "balanced", 1, loss_scale=2.0**40).finite


def test_buckets_split_the_targets_by_share_of_occurrences():
    counts = torch.tensor([100.0, 1, 50, 0, 30, 5, 5])
    buckets = class_buckets(counts)
    assert buckets.tolist() == [0, 2, 1, 2, 1, 2, 2]
    edges = bucket_edges(counts, buckets)
    assert edges["frequent"]["classes"] == 1 and edges["rare"]["max_count"] == 5.0
    assert sum(edge["target_share"] for edge in edges.values()) == pytest.approx(1.0)
    losses = torch.tensor([1.0, 2.0, 3.0, 4.0])
    means = bucket_losses(losses, torch.tensor([0, 2, 1, 6]), buckets)
    assert means == {"all": 2.5, "frequent": 1.0, "middle": 2.0, "rare": 3.5}
    with pytest.raises(ValueError, match="non-negative"):
        class_buckets(torch.tensor([-1.0, 2.0]))
    with pytest.raises(ValueError, match="1-D"):
        class_buckets(torch.ones(2, 2))


def test_arm_gradient_of_the_fp32_arm_is_the_fp64_gradient_to_fp32_precision():
    x, w, y = _head(n=64)
    loss, grad, finite = study.arm_gradient(study.FP32, x, w, y)
    x64, w64 = x.double(), w.double()
    p = torch.softmax(x64 @ w64.T, 1)
    p[torch.arange(64), y] -= 1
    exact = p.T @ x64 / 64
    assert finite
    assert float(torch.linalg.vector_norm(grad.double() - exact) / torch.linalg.vector_norm(exact)) < 1e-5
    assert float(loss) == pytest.approx(float(torch.nn.functional.cross_entropy(x64 @ w64.T, y)), rel=1e-5)


@pytest.mark.slow
def test_a_group_trains_every_arm_in_lockstep_and_writes_its_metrics(tmp_path):
    pool = study.make_pool(TINY)
    study.run_group(TINY, "sgd", 0, pool, tmp_path)
    table = study.collect(tmp_path, TINY)
    assert set(table["arm"]) == {arm.name for arm in study.SGD_ARMS}
    assert sorted(table["step"].unique()) == [0, 10, 20]
    held = table[(table["metric"] == "heldout_loss") & (table["bucket"] == "all")]
    start, end = held[held["step"] == 0]["value"], held[held["step"] == 20]["value"]
    assert start.nunique() == 1 and float(end.max()) < float(start.iloc[0])  # same start, every arm learns
    assert set(table[table["metric"] == "heldout_loss"]["bucket"]) == {"all", *BUCKETS}
    assert table[(table["metric"] == "w_distance") & (table["arm"] == "fp32")].empty
    bias = table[table["metric"] == "bias_over_noise"]
    assert sorted(bias["step"].unique()) == [0, 20]
    assert set(bias["bucket"]) == {"all", *BUCKETS}
    lce_bias = table[table["metric"] == "bias_over_noise_lce"].set_index(["step", "arm", "bucket"])["value"]
    own = bias.set_index(["step", "arm", "bucket"])["value"]
    assert ((own - lce_bias).abs() / lce_bias).max() < 0.05  # the restatement agrees with lce along the run


@pytest.mark.slow
def test_an_interrupted_group_resumes_to_the_same_numbers(tmp_path):
    pool = study.make_pool(TINY)
    study.run_group(TINY, "sgd", 0, pool, tmp_path / "whole")
    study.run_group(TINY, "sgd", 0, pool, tmp_path / "parts", stop_after=10)
    assert study._done_steps(tmp_path / "parts", TINY, "sgd", 0) == 10
    study.run_group(TINY, "sgd", 0, pool, tmp_path / "parts")
    whole, parts = (study.collect(tmp_path / name, TINY) for name in ("whole", "parts"))
    pd.testing.assert_frame_equal(whole, parts)


@pytest.mark.slow
def test_fp16_arms_keep_a_dynamic_loss_scale(tmp_path):
    setting = dataclasses.replace(TINY, steps=10, eval_every=10, bias_steps=())
    pool = study.make_pool(setting)
    study.run_group(setting, "adamw", 0, pool, tmp_path)
    table = study.collect(tmp_path, setting)
    scales = table[(table["metric"] == "loss_scale") & (table["step"] == 10)].set_index("arm")["value"]
    assert scales["fp32"] == 1.0 and scales["fp16 balanced@64"] <= 2.0**16


def test_the_study_rules_name_lce_and_torch_chunk_counts_at_the_first_llm_shape():
    """The arms' chunk counts are those the rules give at 16384x4096x128256 in bf16 (analysis.studies.noise); lce
    auto's arm keeps the 64 chunks of the aspect_ratio:2 it had when the study ran (auto now gives 8: chunks of at
    least 2048 rows on CUDA): balanced's weight gradient does not depend on the chunk count (its arms at 4 and 64
    chunks train identically, a claims test of notebook 10)."""
    from analysis.core.problem import LLM_SHAPES
    from analysis.studies.noise import chunk_rules

    rules = chunk_rules(LLM_SHAPES[0], torch.bfloat16)
    by_rule = {arm.rule: arm for arm in study.ADAMW_ARMS if arm.rule and arm.dtype == "bfloat16"}
    assert by_rule["lce auto"].policy == rules["lce auto"][0] and rules["lce auto"][1] == 8
    assert (by_rule["torch 2.13 auto"].policy, by_rule["torch 2.13 auto"].num_chunks) == rules["torch 2.13 auto"]
    assert (by_rule["torch 2.14 rule"].policy, by_rule["torch 2.14 rule"].num_chunks) == rules["torch #187838"]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("policy", ["accurate", "balanced", "compact"])
def test_restated_loss_gives_lces_input_and_weight_gradients(dtype, policy):
    """The differentiable restatement the language model's long run trains with: both gradients within a tenth of
    their own error against fp64 of lce's (fp16 accurate's error is its rounding floor, where fp32 summation
    order alone flips the last bit of a few elements), returned in fp32 as autocast's upcast would."""
    import lce
    from lce.testing import emulate_device_kind

    x, w, y = _head(n=128, d=16, c=256)
    ours = [x.clone().requires_grad_(True), w.clone().requires_grad_(True)]
    arithmetic.restated_loss(*ours, y, dtype, policy, 64).backward()
    theirs = [x.clone().requires_grad_(True), w.clone().requires_grad_(True)]
    options = lce.LinearCrossEntropyOptions(acc_policy=policy, chunking_method=None, batch_chunk_size=2,
                                            acc_dtype=torch.float32)
    with emulate_device_kind("cuda"):
        lce.linear_cross_entropy(theirs[0].to(dtype), theirs[1].to(dtype), y, options=options).backward()
    x64, w64 = x.to(dtype).double(), w.to(dtype).double()
    p = torch.softmax(x64 @ w64.T, 1)
    p[torch.arange(128), y] -= 1
    exact = (p @ w64 / 128, p.T @ x64 / 128)
    for mine, lces, fp64 in zip((t.grad for t in ours), (t.grad for t in theirs), exact, strict=True):
        error = torch.linalg.vector_norm(lces.double() - fp64)
        assert float(torch.linalg.vector_norm(mine.double() - lces.double()) / error) < 0.1
        assert mine.dtype == torch.float32


def test_the_long_lm_setting_trains_its_lce_arms_on_the_restated_arithmetic():
    from analysis.studies import training

    long = training.SETTINGS["long"]
    lce_arms = [arm for arm in long.arms if arm.op == "lce"]
    assert lce_arms and all(arm.restated for arm in lce_arms)
    assert all(training.head_loss_of(arm).__qualname__.startswith("restated_head_loss") for arm in lce_arms)


def test_the_whole_gradient_ratios_are_the_noise_studys():
    """Bucket "all" of the head-only study's ratios is the noise study's computation (analysis.studies.noise)."""
    from analysis.core.fp64 import reference_outputs
    from analysis.core.inputs import Inputs
    from analysis.studies.noise import sampling_noise

    x, w, y = _head(n=128, d=16, c=256)
    arm = study.ADAMW_ARMS[6]  # bf16 compact@256 ... at 128 rows: 128 chunks of one row
    arm = dataclasses.replace(arm, num_chunks=128)
    rows = study.bias_rows([arm], w, x, y, class_buckets(torch.bincount(y, minlength=256)), with_lce=False)
    got = {(row["metric"], row["bucket"]): row["value"] for row in rows}
    exact_inputs = Inputs(x.bfloat16().double(), w.bfloat16().double(), None, y)
    exact = reference_outputs(exact_inputs)
    noise = sampling_noise(exact_inputs, exact)
    error = study.arm_gradient(arm, x, w, y)[1].double() - exact.grad_weight
    direction = exact.grad_weight / torch.linalg.vector_norm(exact.grad_weight)
    assert got[("bias_over_noise", "all")] == pytest.approx(abs(float((error * direction).sum())) / noise.weight_along,
                                                            rel=1e-6)
    assert got[("error_over_noise", "all")] == pytest.approx(float(torch.linalg.vector_norm(error)) / noise.weight,
                                                             rel=1e-6)
    assert {bucket for _, bucket in got} == {"all", *BUCKETS}
