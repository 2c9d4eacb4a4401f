"""The error-against-noise study: the closed-form sampling noise, the ratios, the chunking rules."""

from __future__ import annotations

import math

import pytest
import torch

from analysis.core.fp64 import reference_outputs
from analysis.core.inputs import Inputs, make_inputs
from analysis.core.problem import Shape
from analysis.studies import noise


def _problem(n=12, d=3, c=7, seed=0) -> Inputs:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=torch.float64)
    w = torch.randn(c, d, generator=g, dtype=torch.float64)
    b = torch.randn(c, generator=g, dtype=torch.float64)
    target = torch.randint(0, c, (n,), generator=g)
    return Inputs(x.requires_grad_(), w.requires_grad_(), b.requires_grad_(), target)


def test_sampling_noise_matches_per_example_gradients():
    inputs = _problem()
    exact = reference_outputs(inputs)
    got = noise.sampling_noise(inputs, exact)
    x, w, b = (t.detach() for t in (inputs.input, inputs.weight, inputs.bias))
    y = inputs.target
    n = x.shape[0]
    residual = torch.softmax(x @ w.T + b, dim=1) - torch.nn.functional.one_hot(y, w.shape[0]).double()
    per_example = residual[:, :, None] * x[:, None, :]  # (N, C, D): g_i = r_i x_i^T
    mean = per_example.mean(0)
    assert torch.allclose(mean, exact.grad_weight, atol=1e-14)
    spread = ((per_example - mean) ** 2).sum() / (n - 1)
    assert got.weight == pytest.approx(math.sqrt(spread.item() / n), rel=1e-10)
    direction = mean / mean.norm()
    along = (per_example * direction).sum((1, 2))
    assert got.weight_along == pytest.approx(along.std().item() / math.sqrt(n), rel=1e-10)
    grad_input = residual @ w / n
    assert got.input == pytest.approx((grad_input - grad_input.mean(0)).norm().item(), rel=1e-10)


def test_sampling_noise_refuses_what_it_does_not_model():
    inputs = _problem()
    exact = reference_outputs(inputs)
    with pytest.raises(ValueError, match="fp64"):
        noise.sampling_noise(inputs.to(torch.float32), exact)
    weighted = Inputs(inputs.input, inputs.weight, inputs.bias, inputs.target, class_weight=torch.ones(7).double())
    with pytest.raises(ValueError, match="class weights"):
        noise.sampling_noise(weighted, exact)


def test_compact_error_grows_with_chunks_and_balanced_stays_flat():
    shape = Shape(256, 16, 4096)
    inputs = make_inputs(shape, torch.bfloat16, family="calibrated", seed=1, bias=False)
    runs = noise.contenders("cuda-emulated", chunk_counts=(1, 64), num_rows=shape.N)
    rows = {row["impl"]: row for row in noise.measure_inputs(inputs, runs)}
    compact, balanced = rows["lce compact chunks=64"], rows["lce balanced chunks=64"]
    assert compact["grad_weight_floors"] > 2 * balanced["grad_weight_floors"]
    assert compact["weight_bias_over_noise"] > 3 * balanced["weight_bias_over_noise"]
    assert balanced["grad_weight_floors"] == pytest.approx(rows["lce balanced chunks=1"]["grad_weight_floors"],
                                                           rel=0.05)
    accurate = rows["lce accurate chunks=64"]
    assert accurate["grad_weight_floors"] == pytest.approx(1.0, abs=0.02)
    # a perfectly rounded answer is the floor of every ratio
    assert accurate["weight_error_over_noise"] == pytest.approx(accurate["weight_floor_over_noise"], rel=0.02)
    assert compact["steps_to_matter"] == pytest.approx(compact["weight_bias_over_noise"] ** -2)
    assert rows[noise.AUTO_CPU]["layout"] == "cpu" and rows["unfused"]["op"] == "reference"


def test_chunk_rules_follow_each_rule():
    rules = noise.chunk_rules(noise.NOISE_SHAPE, torch.bfloat16)
    # lce's CUDA auto keeps chunks of at least 2048 rows: all 1024 rows in one chunk here
    assert rules == {"lce auto": ("balanced", 1), "torch 2.13 auto": ("compact", 256),
                     "torch #187838": ("compact", 128)}
    # where D exceeds C the factor-1 aspect ratio asks for all rows; the N*C/(4D) cap binds (256 rows)
    assert noise.chunk_rules(Shape(4096, 4096, 1024), torch.bfloat16)["torch #187838"] == ("compact", 16)


def test_fp32_inputs_run_only_the_auto_pick_and_the_unfused_op():
    runs = noise.contenders("cuda-emulated", chunk_counts=(1, 4))
    assert [run.label for run in noise.dtype_contenders(runs, "float32")] == ["unfused", noise.AUTO_CPU]
    assert noise.dtype_contenders(runs, "bfloat16") == runs
