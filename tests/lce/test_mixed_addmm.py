"""The paths a CUDA build with a mixed-precision ``addmm`` takes (lce.planning.device.mixed_addmm_supported): the weight
gradient summed into its fp32 accumulator, and a class-tiled chunk's input-gradient blocks into their fp32 sum, each
by one GEMM with no product of its own. Run here on CPU tensors planned as CUDA, with ``torch.addmm``'s
``out_dtype`` stood in by an exact upcast (CPUs have no such kernel), against the blocked path; the memory model
lists no product buffer for them. tests/lce/test_cuda.py runs the real kernel on a GPU."""

from __future__ import annotations

import pytest
import torch

import lce
import lce.planning.resolve
from helpers import loss_and_grads
from lce.testing import emulate_device_kind

_ADDMM = torch.addmm


def _addmm_with_out_dtype(input, a, b, *, out_dtype=None, alpha=1.0, beta=1.0, out=None):
    """``torch.addmm`` as CUDA's mixed-precision kernel computes it: products of bf16/fp16 operands summed in fp32."""
    if out_dtype is None:
        return _ADDMM(input, a, b, alpha=alpha, beta=beta, out=out)
    return _ADDMM(input, a.to(out_dtype), b.to(out_dtype), alpha=alpha, beta=beta, out=out)


@pytest.fixture
def mixed_addmm(monkeypatch):
    monkeypatch.setattr(lce.planning.resolve, "mixed_addmm_supported", lambda device: True)
    monkeypatch.setattr(torch, "addmm", _addmm_with_out_dtype)


@pytest.mark.parametrize("policy", ["accurate", "balanced", "compact"])
@pytest.mark.parametrize("classes", [None, 128])
def test_the_in_place_sums_give_the_blocked_paths_numbers(mixed_addmm, policy, classes):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(48, 32, generator=g).bfloat16()
    w = (torch.randn(500, 32, generator=g) * 0.5).bfloat16()
    y = torch.randint(0, 500, (48,), generator=g)
    options = lce.LinearCrossEntropyOptions(acc_policy=policy, acc_dtype=torch.float32, batch_chunk_size=16,
                                            class_chunk_size=classes)
    with emulate_device_kind("cuda"):
        plan = lce.plan(x.requires_grad_(), w.requires_grad_(), options=options)
        assert plan.mixed_addmm
        names = {buffer.name for buffer in plan.buffers}
        if plan.weight_grad_sum_dtype == torch.float32 and policy != "accurate":
            assert "weight_grad_chunk" not in names  # summed in place: no product block
        if classes is not None and policy != "accurate":
            assert plan.sums_input_blocks_in_place and "grad_input_chunk" not in names
        fused = loss_and_grads(options, x, w, y)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(lce.planning.resolve, "mixed_addmm_supported", lambda device: False)
            assert not lce.plan(x, w, options=options).mixed_addmm
            blocked = loss_and_grads(options, x, w, y)
    for got, expected in zip(fused, blocked, strict=True):
        assert float((got - expected).norm() / expected.norm()) < 2 ** -8  # a bf16 rounding at most
