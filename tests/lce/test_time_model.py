"""lce.decide.time_model: the terms it counts for a plan are the GEMMs, bytes, launches and steps the chunk loop makes,
counted independently here; the seconds are those terms weighed by the constants; the shipped constants say what
they were fitted to and how well they predicted runs held out."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

import lce
from lce.decide.time_model import (
    CONSTANTS,
    FIT,
    TIME_SOURCE,
    TimeConstants,
    estimated_seconds,
    gemm_flops,
    gemm_names,
    time_terms,
)
from lce.planning import blocks as planning_blocks
from lce.planning.resolve import make_plan
from lce.testing import cpu_gemms, emulate_device_kind

N, D, C = 4096, 4096, 128256


def _cuda_plan(rows: int, policy: str = "balanced", *, n: int = N, classes: int | None = None):
    options = lce.LinearCrossEntropyOptions(acc_policy=policy, acc_dtype=torch.float32, batch_chunk_size=rows,
                                            chunking_method=None, class_chunk_size=classes)
    with emulate_device_kind("cuda"):
        return make_plan(options, num_rows=n, in_features=D, num_classes=C, dtype=torch.bfloat16,
                         device=torch.device("meta"))


UNIT = TimeConstants({dtype: 1.0 for dtype in (torch.float64, torch.float32, torch.bfloat16, torch.float16)}, 0.0,
                     0.0, 1.0, 0.0, 0.0, 0.0, "unit")


def test_a_balanced_cuda_plan_counts_its_gemms_traffic_launches_and_steps():
    """4 chunks of 1024 rows, bf16 operands into fp32 results, no mixed addmm (as on CPU tensors): three GEMMs a chunk,
    the weight read by each; the fp32 accumulator read and written once a chunk; the fp32 product formed in blocks of
    2^26 elements (8 blocks of 16384 weight rows at D=4096), each block a GEMM, written and read again."""
    plan = _cuda_plan(1024)
    assert (plan.num_chunks, plan.num_class_chunks, plan.mixed_addmm) == (4, 1, False)
    assert gemm_names(plan) == ["logits", "grad_input", "grad_weight"]
    blocks = math.ceil(C / (2**26 // D))
    assert blocks == 8 and planning_blocks.rows_per_block(D, "cuda") == 2**26 // D
    terms = time_terms(plan, UNIT)
    weight = C * D * 2
    assert terms.gemm_seconds == pytest.approx(3 * 2.0 * N * C * D)  # unit rates, no row or feature stretch
    assert terms.bytes == 3 * 4 * weight + 2 * 4 * C * D * 4 + 2 * 4 * C * D * 4
    assert terms.launches == 3 * 4 + 4 * (blocks - 1)
    assert terms.logit_bytes == N * C * 4 and terms.steps == 4


def test_a_mixed_addmm_sums_in_place_and_one_chunk_needs_no_accumulator():
    plan = _cuda_plan(1024)
    fused = time_terms(dataclasses.replace(plan, mixed_addmm=True), UNIT)
    blocked = time_terms(plan, UNIT)
    assert fused.launches == 3 * 4 and blocked.bytes - fused.bytes == 2 * 4 * C * D * 4
    one = _cuda_plan(N)
    assert one.num_chunks == 1 and one.weight_grad_sum_dtype == torch.bfloat16  # rounded straight into the gradient
    terms = time_terms(one, UNIT)
    assert terms.bytes == 3 * C * D * 2 + 2 * C * D * 4  # the weights, and the fp32 product written and read


def test_class_blocks_compute_the_logits_twice_and_count_every_step():
    plan = _cuda_plan(1024, classes=C // 4 + 1)
    assert plan.num_class_chunks == 4 and gemm_names(plan) == ["logits", "logits", "grad_input", "grad_weight"]
    terms = time_terms(plan, UNIT)
    assert terms.steps == 16 and terms.logit_bytes == 2 * N * C * 4
    assert terms.gemm_seconds == pytest.approx(4 * 2.0 * N * C * D)


def test_the_seconds_weigh_each_term_by_its_constant():
    constants = TimeConstants({torch.bfloat16: 2e14, torch.float32: 5e13, torch.float16: 2e14, torch.float64: 1e13},
                              half_rows=256.0, half_features=64.0, bandwidth=2e12, elementwise_passes=10.0,
                              launch_overhead=2e-5, step_overhead=1e-3, source="test")
    plan = _cuda_plan(1024)
    terms = time_terms(plan, constants)
    stretch = 1 + 256.0 / 1024 + 64.0 / D
    assert terms.gemm_seconds == pytest.approx(3 * 2.0 * N * C * D / 2e14 * stretch)
    expected = (terms.gemm_seconds + (terms.bytes + 10.0 * terms.logit_bytes) / 2e12 + terms.launches * 2e-5
                + terms.steps * 1e-3)
    assert terms.seconds(constants) == pytest.approx(expected)


def test_on_cuda_more_steps_cost_more_at_the_shipped_constants():
    times = [estimated_seconds(_cuda_plan(rows)) for rows in (4096, 2048, 512, 64)]
    assert times == sorted(times) and times[-1] > 2 * times[0]


def test_a_cpu_gemm_in_a_narrow_dtype_runs_at_this_cpus_rate_for_it():
    options = lce.LinearCrossEntropyOptions(acc_policy="balanced", acc_dtype=torch.float32, batch_chunk_size=256,
                                            chunking_method=None)
    with cpu_gemms("native"):
        plan = make_plan(options, num_rows=1024, in_features=512, num_classes=8192, dtype=torch.bfloat16,
                         device=torch.device("cpu"))
    fp32 = CONSTANTS["cpu"].flops[torch.float32]
    assert gemm_flops(plan, "grad_input", cpu_rate=0.5) == pytest.approx(0.5 * fp32)
    assert gemm_flops(plan, "logits") == pytest.approx(fp32)  # the logits GEMM is fp32 in balanced on the CPU


def test_the_shipped_constants_say_what_they_were_fitted_to_and_how_well_they_predicted_held_out_runs():
    assert set(CONSTANTS) >= {"cpu", "cuda"}
    for kind, constants in CONSTANTS.items():
        assert all(rate > 0 for rate in constants.flops.values()) and constants.bandwidth > 0
        assert TIME_SOURCE[kind] == constants.source and "held out by shape" in constants.source
        report = FIT[kind]["held_out"]
        assert 0 < report["within"] <= 1 and report["samples"] > 0
        assert f"{report['within']:.0%} within" in constants.source
    # the H200 with TF32 off (torch's default) is the CUDA reference: fp32 GEMMs at its datasheet rate
    assert CONSTANTS["cuda"].flops[torch.float32] == 67e12
