"""analysis.core.memory sees real allocations, and lce's memory model agrees with it."""

from __future__ import annotations

import dataclasses
import importlib.util

import pytest
import torch

from analysis.core.implementations import ImplSpec, make_implementation
from analysis.core.inputs import make_inputs
from analysis.core.memory import measure_peak
from analysis.core.problem import Shape
from helpers import own_cpu_gemms

MiB = 2**20


@pytest.fixture(autouse=True)
def _native_cpu_gemms():
    """Replaces the suite's pin: this CPU's own verdict (helpers.own_cpu_gemms); what is checked here holds under
    any verdict (the plan's own prediction against its own run)."""
    with own_cpu_gemms():
        yield


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Peak memory does not depend on threads, but on a shared 2-core machine two threads can
    run 10x slower than one (every parallel region waits for the busy core)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _allocate_and_free_64_mib() -> int:
    block = torch.empty(16 * MiB, dtype=torch.float32)  # 64 MiB
    block.fill_(1.0)
    total = int(block[0].item())
    del block
    return total


METHODS = ["profiler"] + (["memray"] if importlib.util.find_spec("memray") else [])


@pytest.mark.parametrize("method", METHODS)
def test_a_known_allocation_is_measured(method):
    result, measured = measure_peak(_allocate_and_free_64_mib, method=method)
    assert result == 1
    assert measured.peak_bytes == pytest.approx(64 * MiB, rel=0.03)
    assert abs(measured.end_bytes) < 1 * MiB  # freed before returning


def test_returned_tensors_count_as_still_allocated():
    _, measured = measure_peak(lambda: torch.zeros(4 * MiB // 4))
    assert measured.peak_bytes == 4 * MiB and measured.end_bytes == 4 * MiB
    assert measured.live_at_peak[0] == 4 * MiB


def test_unknown_method_is_rejected():
    with pytest.raises(ValueError, match="method"):
        measure_peak(lambda: None, method="rss")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_allocator_peak():
    def work():
        block = torch.empty(16 * MiB, dtype=torch.float32, device="cuda")
        del block

    _, measured = measure_peak(work, method="cuda")
    assert measured.peak_bytes == 64 * MiB


@pytest.mark.slow  # the allocator's peak of real runs; tests/lce/test_memory_model.py checks the model in the fast tier
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_lce_memory_model_matches_measurement(dtype):
    """Buffers dominate at this size: (C, D) gradients/accumulators and (rows, C) logits chunks."""
    inputs = make_inputs(Shape(4096, 512, 16384), dtype, bias=False)
    implementation = make_implementation(ImplSpec("lce"))
    modeled = implementation.plan(inputs).peak_extra_bytes
    outputs, measured = measure_peak(lambda: implementation.run(inputs))
    assert torch.isfinite(outputs.loss)
    assert measured.peak_bytes == pytest.approx(modeled, rel=0.15), (
        f"modeled {modeled / MiB:.2f} MiB, measured {measured.peak_bytes / MiB:.2f} MiB; live at peak (MiB): "
        f"{[round(size / MiB, 3) for size in measured.live_at_peak if size >= 2**16]}"
    )



@pytest.mark.slow  # the allocator's peak of real runs; tests/lce/test_memory_model.py checks the model in the fast tier
@pytest.mark.parametrize(("dtype", "policy", "acc_dtype"), [
    ("bfloat16", "accurate", "float32"),
    ("float16", "balanced", "float32"),
    ("bfloat16", "compact", "default"),
    ("bfloat16", "balanced", "float32"),
    ("bfloat16", "compact", "float32"),
    ("float16", "accurate", "default"),
    ("float16", "compact", "default"),
])
def test_lce_memory_model_per_policy(dtype, policy, acc_dtype):
    inputs = make_inputs(Shape(1024, 256, 16384), getattr(torch, dtype), bias=False)
    implementation = make_implementation(ImplSpec("lce", policy, "aspect_ratio:2", acc_dtype))
    modeled = implementation.plan(inputs).peak_extra_bytes
    _, measured = measure_peak(lambda: implementation.run(inputs))
    assert measured.peak_bytes == pytest.approx(modeled, rel=0.15), (
        f"modeled {modeled / MiB:.2f} MiB, measured {measured.peak_bytes / MiB:.2f} MiB; live at peak (MiB): "
        f"{[round(size / MiB, 3) for size in measured.live_at_peak if size >= 2**16]}"
    )


@pytest.mark.slow  # the allocator's peak of real runs; tests/lce/test_memory_model.py checks the model in the fast tier
@pytest.mark.parametrize(("dtype", "policy", "reduction"), [("bfloat16", "compact", "mean"),
                                                            ("bfloat16", "balanced", "none"),
                                                            ("float32", "accurate", "sum")])
def test_lce_memory_model_with_softcap_and_z_loss(dtype, policy, reduction):
    """Soft-capping adds one small workspace beside the chunk's logits; the allocator agrees with the model."""
    inputs = dataclasses.replace(make_inputs(Shape(1024, 256, 16384), getattr(torch, dtype), bias=False,
                                             reduction=reduction), softcap=30.0, z_loss=1e-4)
    implementation = make_implementation(ImplSpec("lce", policy, "aspect_ratio:2", "default"))
    plan = implementation.plan(inputs)
    assert plan.softcap == 30.0 and any(b.name == "softcap_workspace" for b in plan.buffers)
    _, measured = measure_peak(lambda: implementation.run(inputs))
    assert measured.peak_bytes == pytest.approx(plan.peak_extra_bytes, rel=0.15), (
        f"modeled {plan.peak_extra_bytes / MiB:.2f} MiB, measured {measured.peak_bytes / MiB:.2f} MiB; live at peak "
        f"(MiB): {[round(size / MiB, 3) for size in measured.live_at_peak if size >= 2**16]}"
    )


@pytest.mark.parametrize(("dtype", "policy", "acc_dtype", "bias"), [
    ("bfloat16", "accurate", "float32", True),
    ("bfloat16", "balanced", "float32", False),
    ("float16", "accurate", "float32", False),
    ("bfloat16", "compact", "default", True),
    ("float32", "accurate", "default", False),
])
def test_one_chunk_of_rows_peaks_where_the_model_says(dtype, policy, acc_dtype, bias):
    """One chunk of all the rows needs no (C, D) accumulator: the weight gradient's product is written straight into
    the gradient a block at a time. Writing an fp32 block into a bf16 gradient by an add made a CPU hold a wide copy
    of the block besides (18.1 MiB measured against 11.1 MiB modeled at 32x128x16384 before the fix); the write is a
    copy now, and the allocator agrees with the model."""
    inputs = make_inputs(Shape(32, 128, 16384), getattr(torch, dtype), bias=bias)
    implementation = make_implementation(ImplSpec("lce", policy, "rows:32", acc_dtype))
    plan = implementation.plan(inputs)
    assert plan.num_chunks == 1
    implementation.run(inputs)  # first-call setup stays out of the measurement
    _, measured = measure_peak(lambda: implementation.run(inputs))
    assert measured.peak_bytes == pytest.approx(plan.peak_extra_bytes, rel=0.02), (
        f"modeled {plan.peak_extra_bytes / MiB:.2f} MiB, measured {measured.peak_bytes / MiB:.2f} MiB; live at peak "
        f"(MiB): {[round(size / MiB, 3) for size in measured.live_at_peak if size >= 2**16]}"
    )
