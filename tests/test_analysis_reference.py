"""analysis.reference: fp64 answers from the same rounded inputs, and gradcheck of lce paths."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import lce
from analysis.inputs import Shape, make_inputs
from analysis.reference import gradcheck_lce, reference_outputs


def test_reference_uses_the_rounded_inputs_exactly():
    inputs = make_inputs(Shape(8, 4, 16), torch.bfloat16, seed=3)
    ref = reference_outputs(inputs)
    assert ref.loss.dtype == torch.float64 and ref.grad_weight.dtype == torch.float64
    logits = inputs.input.double() @ inputs.weight.double().T + inputs.bias.double()
    expected = F.cross_entropy(logits, inputs.target)
    assert ref.loss.item() == expected.item()
    # Gradient of the mean loss w.r.t. the bias is mean(softmax - onehot).
    probs = logits.softmax(1)
    probs[torch.arange(8), inputs.target] -= 1
    torch.testing.assert_close(ref.grad_bias, probs.mean(0), rtol=1e-12, atol=1e-14)


def test_inputs_are_seeded():
    a = make_inputs(Shape(4, 3, 5), torch.float32, seed=7)
    b = make_inputs(Shape(4, 3, 5), torch.float32, seed=7)
    assert torch.equal(a.input, b.input) and torch.equal(a.target, b.target)
    with pytest.raises(ValueError, match="Shape.N"):
        Shape(0, 3, 5)


@pytest.mark.parametrize("policy", ["accurate", "balanced", "compact"])
@pytest.mark.parametrize("device_kind", ["cpu", "cuda"])
def test_gradcheck_every_lce_layout(policy, device_kind):
    options = lce.LinearCrossEntropyOptions(acc_policy=policy, batch_chunk_size=2, chunking_method=None)
    assert gradcheck_lce(options, device_kind=device_kind)


@pytest.mark.parametrize("reduction", ["sum", "none"])
def test_gradcheck_other_reductions_without_bias(reduction):
    options = lce.LinearCrossEntropyOptions(acc_policy="compact", chunking_method="aspect_ratio:2")
    assert gradcheck_lce(options, bias=False, reduction=reduction)
