"""The plan: policy tables, resolution rules lce adds to torch's, the memory model's bookkeeping,
and the CUDA layouts run on CPU tensors through the exact mixed-precision stand-in."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import lce
from helpers import Case, assert_parity, lce_run, make_problem, ref_run, rel_err
from lce.planning.options import dtype_name
from lce.planning.policies import (
    AUTO_FALLBACK,
    AUTO_TABLE,
    CPU_LAYOUTS,
    CPU_MIN_ROWS,
    CUDA_LAYOUTS,
    CUDA_MIN_ROWS,
    LAYOUTS,
    format_layout_table,
)
from lce.testing import emulate_device_kind

DOCUMENTED_POLICIES = ("accurate", "balanced", "compact")


def _tensors(n, d, c, dtype, requires_grad=True):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, d, generator=g).to(dtype).requires_grad_(requires_grad)
    w = (torch.randn(c, d, generator=g) / d**0.5).to(dtype).requires_grad_(requires_grad)
    return x, w


def test_every_documented_policy_has_a_layout_on_every_device():
    for kind, table in LAYOUTS.items():
        assert set(table) == set(DOCUMENTED_POLICIES), kind
        text = format_layout_table(kind)
        for policy in DOCUMENTED_POLICIES:
            assert policy in text


def test_auto_table_names_only_real_policies_and_says_why():
    for (kind, dtype), pick in [*AUTO_TABLE.items(), (("other", None), AUTO_FALLBACK)]:
        assert kind in (*LAYOUTS, "other") and pick.acc_policy in DOCUMENTED_POLICIES, (kind, dtype)
        assert pick.reason, (kind, dtype)
        # a row floor is part of the pick only if the reason says so
        floor_name = "CUDA_MIN_ROWS" if kind == "cuda" else "CPU_MIN_ROWS"
        assert (floor_name in pick.reason) == (pick.min_rows > 1), (kind, dtype)
        if pick.min_rows > 1:
            assert pick.min_rows == (CUDA_MIN_ROWS if kind == "cuda" else CPU_MIN_ROWS[dtype])


def test_cpu_bf16_auto_runs_every_gemm_in_fp32_with_an_accumulator():
    x, w = _tensors(512, 64, 4096, torch.bfloat16)
    plan = lce.plan(x, w, options=lce.LinearCrossEntropyOptions())
    assert (plan.acc_policy, plan.acc_dtype, plan.device_kind) == ("accurate", torch.float32, "cpu")
    names = {b.name: b for b in plan.buffers}
    assert names["weight_grad_accumulator"].dtype == torch.float32
    assert "weight_in_acc" not in names and names["weight_block_in_acc"].dtype == torch.float32
    assert names["grad_weight"].dtype == torch.bfloat16
    assert plan.num_chunks == 512 // plan.batch_chunk_size


def test_compact_with_wider_acc_runs_balanced_on_cpu_but_not_on_cuda():
    x, w = _tensors(64, 16, 256, torch.bfloat16)
    # chunks that follow N on both (a batch-invariant CUDA plan would pad 64 rows to its 2048)
    options = lce.LinearCrossEntropyOptions(acc_policy="compact", acc_dtype=torch.float32, batch_invariant=False)
    cpu = lce.plan(x, w, options=options)
    assert cpu.layout == CPU_LAYOUTS["balanced"] and cpu.notes
    with emulate_device_kind("cuda"):
        cuda = lce.plan(x, w, options=options)
    assert cuda.layout == CUDA_LAYOUTS["compact"]
    assert "weight_grad_accumulator" not in {b.name for b in cuda.buffers}
    assert cuda.peak_extra_bytes < cpu.peak_extra_bytes


@pytest.mark.parametrize("policy", DOCUMENTED_POLICIES)
def test_no_accumulator_when_it_would_have_the_gradients_dtype(policy):
    x, w = _tensors(64, 16, 256, torch.float32)
    plan = lce.plan(x, w, options=lce.LinearCrossEntropyOptions(acc_policy=policy))
    names = {b.name for b in plan.buffers}
    assert "weight_grad_accumulator" not in names and "weight_block_in_acc" not in names


def test_peak_is_dominated_by_one_chunk_not_by_the_batch():
    sixty_four = lce.LinearCrossEntropyOptions(batch_chunk_size=64)
    small_n = lce.plan(*_tensors(1024, 32, 8192, torch.float32), options=sixty_four)
    big_n = lce.plan(*_tensors(4096, 32, 8192, torch.float32), options=sixty_four)
    logits_chunk = 64 * 8192 * 4
    grad_input_growth = (4096 - 1024) * 32 * 4
    assert big_n.peak_extra_bytes - small_n.peak_extra_bytes <= grad_input_growth + 4096 * 8
    assert small_n.peak_extra_bytes >= logits_chunk
    assert big_n.peak_extra_bytes < 4096 * 8192 * 4 / 4  # far below the (N, C) logits


def test_plan_prints_every_buffer_and_the_peak():
    x, w = _tensors(256, 32, 1024, torch.bfloat16)
    plan = lce.plan(x, w, options=lce.LinearCrossEntropyOptions())
    text = str(plan)
    for buffer in plan.buffers:
        assert buffer.name in text
    assert f"{plan.num_chunks} chunk(s) of {plan.batch_chunk_size} rows" in text
    assert "chunk peak forward" in text and "predicted peak extra memory" in text


def test_retain_graph_peak_counts_the_returned_copies():
    x, w = _tensors(256, 64, 4096, torch.float32)
    kept = lce.plan(x, w, options=lce.LinearCrossEntropyOptions(batch_chunk_size=256))
    retained = lce.plan(x, w, options=lce.LinearCrossEntropyOptions(batch_chunk_size=256, allow_retain_graph=True))
    assert retained.peak_extra_bytes >= kept.peak_extra_bytes
    grads = (256 * 64 + 4096 * 64) * 4
    assert retained.peak_extra_bytes >= 2 * grads


# ---- CUDA layouts on CPU tensors ---------------------------------------------------------------

@pytest.mark.parametrize("policy", DOCUMENTED_POLICIES)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cuda_layouts_fp64_parity(policy, reduction):
    problem = make_problem(Case(N=29, D=16, V=40, reduction=reduction, bias=True, class_weight=True,
                                label_smoothing=0.1))
    options = lce.LinearCrossEntropyOptions(acc_policy=policy, batch_chunk_size=6)
    with emulate_device_kind("cuda"):
        got = lce_run(problem, options)
    assert_parity(got, ref_run(problem), tol=1e-12, label=f"cuda-emulated {policy}")


def _errors_in_floors(dtype, options, n=512, d=64, c=2048, kind="cuda"):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, d, generator=g).to(dtype)
    w = (torch.randn(c, d, generator=g) / d**0.5).to(dtype)
    target = torch.randint(0, c, (n,), generator=g)

    def run(x, w, options):
        x, w = x.clone().requires_grad_(), w.clone().requires_grad_()
        loss = lce.linear_cross_entropy(x, w, target, options=options)
        loss.backward()
        return loss.detach(), x.grad, w.grad

    exact = run(x.double(), w.double(), None)
    with emulate_device_kind(kind):
        got = run(x, w, options)
    return [rel_err(a.double(), e) / max(rel_err(e.to(dtype).double(), e), 1e-30)
            for a, e in zip(got, exact, strict=True)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("policy", ["accurate", "balanced"])
def test_cuda_layouts_with_fp32_accumulation_stay_near_the_rounding_floor(dtype, policy):
    options = lce.LinearCrossEntropyOptions(acc_policy=policy, acc_dtype=torch.float32, batch_chunk_size=16)
    loss, grad_input, grad_weight = _errors_in_floors(dtype, options)
    assert loss <= 1.01 and grad_input <= 1.5 and grad_weight <= 1.5, (loss, grad_input, grad_weight)


def test_fp16_grad_logits_are_rescaled_before_rounding():
    # Without the power-of-two rescale, 1/C-sized softmax entries times 1/N fall below fp16's
    # normal range and grad_input lands near 5x its floor at this shape.
    options = lce.LinearCrossEntropyOptions(acc_policy="balanced", acc_dtype=torch.float32, batch_chunk_size=16)
    _, grad_input, _ = _errors_in_floors(torch.float16, options, n=1024, c=4096)
    assert grad_input <= 1.3


def test_compact_weight_gradient_error_grows_with_the_chunk_count():
    errors = []
    for chunk in (256, 8):
        options = lce.LinearCrossEntropyOptions(acc_policy="compact", acc_dtype=torch.float32,
                                                batch_chunk_size=chunk)
        errors.append(_errors_in_floors(torch.bfloat16, options)[2])
    few_chunks, many_chunks = errors
    assert many_chunks > 1.5 * few_chunks, errors


def test_the_policies_page_shows_the_layout_tables_and_auto_picks_from_the_code():

    page = (Path(__file__).resolve().parents[2] / "docs" / "policies.md").read_text()
    for kind in LAYOUTS:
        assert format_layout_table(kind) in page, f"docs/policies.md's {kind} policy table is out of date"
    assert format_layout_table("cpu", narrow_gemms_fast=False) in page, "the slow-GEMM CPU table is out of date"
    for (kind, dtype), pick in AUTO_TABLE.items():
        row = f"| {kind} | {dtype_name(dtype)} | {pick.acc_policy} | {pick.chunking_method} |"
        assert row in page, f"docs/policies.md lacks the auto row {row}"


def test_chunking_classes_sizes_the_row_chunks_and_nothing_else():
    """lce.distributed sizes every rank's rows per chunk for the largest shard (issue 24): a 1-class shard
    planned with chunking_classes=36 walks the rows of a 36-class head, and keeps its own class count."""
    kw = dict(num_rows=29, in_features=8, dtype=torch.float64, device=torch.device("cpu"))
    options = lce.LinearCrossEntropyOptions(class_chunk_size=3)
    from lce.planning.resolve import make_plan

    big = make_plan(options, num_classes=36, **kw)
    small_alone = make_plan(options, num_classes=1, **kw)
    small_in_group = make_plan(options, num_classes=1, chunking_classes=36, **kw)
    assert small_alone.batch_chunk_size != big.batch_chunk_size  # the bug's cause: 16 rows against 4
    assert small_in_group.batch_chunk_size == big.batch_chunk_size == 4  # fp64 auto: aspect_ratio:2
    assert small_in_group.num_classes == 1 and small_in_group.class_chunk_size == 1
    assert big.class_chunk_size == 3
    with pytest.raises(ValueError, match="C=36"):
        make_plan(lce.LinearCrossEntropyOptions(chunking_method="aspect_ratio", batch_chunk_size=3),
                  num_classes=1, chunking_classes=36, **kw)
