"""analysis.reference: fp64 answers from the same rounded inputs, and gradcheck of lce paths."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from analysis.implementations import ImplSpec
from analysis.inputs import Shape, make_inputs
from analysis.reference import gradcheck, reference_outputs
from lce.options import EXPLICIT_POLICIES


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


@pytest.mark.parametrize("policy", EXPLICIT_POLICIES)
@pytest.mark.parametrize("device_kind", ["cpu", "cuda"])
def test_gradcheck_every_lce_layout(policy, device_kind):
    inputs = make_inputs(Shape(6, 4, 10), torch.float64)
    device = "cuda-emulated" if device_kind == "cuda" else "cpu"
    assert gradcheck(ImplSpec("lce", policy, "rows:2"), inputs, device=device)


@pytest.mark.parametrize("reduction", ["sum", "none"])
def test_gradcheck_other_reductions_without_bias(reduction):
    inputs = make_inputs(Shape(6, 4, 10), torch.float64, bias=False, reduction=reduction)
    assert gradcheck(ImplSpec("lce", "compact", "aspect_ratio:2"), inputs)


def test_gradcheck_with_every_call_argument():
    """Class weights, ignore_index, label smoothing and a grad_output reach the op and the check."""
    inputs = make_inputs(Shape(6, 4, 10), torch.float64, reduction="none")
    inputs.target[::3] = 2
    inputs.ignore_index, inputs.label_smoothing = 2, 0.1
    inputs.class_weight = torch.linspace(0.5, 1.5, 10, dtype=torch.float64)
    inputs.grad_output = torch.linspace(-1.0, 1.0, 6, dtype=torch.float64)
    assert gradcheck(ImplSpec("lce", "balanced", "rows:4"), inputs)
    exact = reference_outputs(inputs)
    (grad_x,) = torch.autograd.grad(F.cross_entropy(inputs.input @ inputs.weight.T + inputs.bias, inputs.target,
                                                    weight=inputs.class_weight, ignore_index=2,
                                                    label_smoothing=0.1, reduction="none"),
                                    inputs.input, inputs.grad_output)
    torch.testing.assert_close(exact.grad_input, grad_x, rtol=1e-12, atol=1e-14)
    with pytest.raises(ValueError, match="fp64"):
        gradcheck(ImplSpec("lce"), make_inputs(Shape(6, 4, 10), torch.float32))
