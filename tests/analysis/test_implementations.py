"""analysis.core.implementations: one signature for every op, and honest reasons when one cannot run."""

from __future__ import annotations

import time

import pytest
import torch

from analysis.core.fp64 import reference_outputs
from analysis.core.implementations import OPS, ImplSpec, make_implementation, unavailable_reason
from analysis.core.inputs import make_inputs
from analysis.core.problem import Shape
from analysis.core.timing import time_call

RUNNABLE_ON_CPU = [
    ImplSpec("reference"),
    ImplSpec("lce", "auto", "aspect_ratio:2"),
    ImplSpec("lce", "compact", "aspect_ratio", "float32"),
    ImplSpec("torch", "balanced", "aspect_ratio:4", "float32"),
]


@pytest.mark.parametrize(("spec", "device"), [
    *[(spec, "cpu") for spec in RUNNABLE_ON_CPU],
    *[(spec, "cuda-emulated") for spec in RUNNABLE_ON_CPU if spec.op == "lce"],
], ids=str)
def test_every_op_returns_loss_and_all_gradients(spec, device):
    inputs = make_inputs(Shape(24, 8, 96), torch.bfloat16, seed=1)
    outputs = make_implementation(spec, device).run(inputs)
    exact = reference_outputs(inputs)
    assert outputs.loss.dtype == torch.bfloat16 and outputs.grad_weight.shape == (96, 8)
    assert outputs.grad_bias is not None and outputs.grad_bias.shape == (96,)
    for name in ("loss", "grad_input", "grad_weight", "grad_bias"):
        torch.testing.assert_close(outputs.get(name).double(), exact.get(name), rtol=0.05, atol=2e-3)
    assert inputs.input.grad is None  # gradients are returned, never accumulated into the leaves


def test_plans_are_reported_for_chunked_ops_only():
    inputs = make_inputs(Shape(64, 8, 512), torch.float32)
    plan = make_implementation(ImplSpec("lce", "accurate", "aspect_ratio:2")).plan(inputs)
    assert plan is not None and plan.num_chunks > 1 and plan.acc_policy == "accurate"
    assert make_implementation(ImplSpec("reference")).plan(inputs) is None
    with torch.no_grad():
        emulated = make_implementation(ImplSpec("lce", "balanced", "aspect_ratio"), "cuda-emulated")
    assert emulated.plan(make_inputs(Shape(64, 8, 512), torch.bfloat16)).device_kind == "cuda"


def test_unavailable_ops_say_why():
    assert "CUDA" in unavailable_reason("liger", "cpu") and "CUDA" in unavailable_reason("cce", "cpu")
    assert unavailable_reason("torch", "cuda-emulated") is not None
    if not torch.cuda.is_available():
        assert unavailable_reason("lce", "cuda") == "no CUDA device"
    with pytest.raises(RuntimeError, match="cannot run"):
        make_implementation(ImplSpec("liger"), "cpu")
    with pytest.raises(ValueError, match="op must be one of"):
        ImplSpec("nope")
    with pytest.raises(ValueError, match="acc_dtype"):
        ImplSpec("lce", acc_dtype="float8")
    assert set(OPS) == {"lce", "torch", "reference", "compiled", "liger", "cce"}


def test_time_call_takes_the_median_after_warmup():
    calls = []

    def work():
        calls.append(1)
        time.sleep(0.02 if len(calls) == 1 else 0.005)  # the slow first call is the warm-up

    timing = time_call(work, warmup=1, repeats=3)
    assert len(calls) == 4 and len(timing.repeats_s) == 3
    assert 0.004 <= timing.median_s < 0.02
    with pytest.raises(ValueError, match="repeats"):
        time_call(work, repeats=0)


def test_rows_chunking_is_an_explicit_chunk_size():
    spec = ImplSpec("lce", "compact", "rows:16")
    options = spec.options()
    assert options.chunking_method is None and options.batch_chunk_size == 16
    plan = make_implementation(spec).plan(make_inputs(Shape(64, 8, 512), torch.float32))
    assert plan.batch_chunk_size == 16 and plan.num_chunks == 4
    assert ImplSpec("torch", "accurate", "aspect_ratio:2", retain_graph=True).options().allow_retain_graph
    for bad in ("rows:0", "rows:x", "rows:"):
        with pytest.raises(ValueError, match="rows:K"):
            ImplSpec("lce", chunking=bad)


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_every_call_argument_reaches_every_op(reduction):
    """Class weights, ignore_index, label smoothing and grad_output: lce and torch agree with the fp64 reference."""
    inputs = make_inputs(Shape(24, 8, 96), torch.float32, seed=2, reduction=reduction)
    inputs.target[::5] = 7
    inputs.ignore_index, inputs.label_smoothing = 7, 0.05
    inputs.class_weight = torch.linspace(0.5, 1.5, 96)
    if reduction == "none":
        inputs.grad_output = torch.linspace(-1.0, 1.0, 24)
    exact = reference_outputs(inputs)
    for spec in (ImplSpec("reference"), ImplSpec("lce", "accurate", "rows:5"), ImplSpec("torch", "accurate", "rows:8")):
        outputs = make_implementation(spec).run(inputs)
        for name in ("loss", "grad_input", "grad_weight", "grad_bias"):
            torch.testing.assert_close(outputs.get(name).double(), exact.get(name), rtol=1e-4, atol=1e-6)
    with torch.no_grad():
        loss = make_implementation(ImplSpec("lce", "balanced", "rows:5")).loss(inputs)
    assert loss.shape == exact.loss.shape and not loss.requires_grad
