"""analysis.core.fp64: fp64 answers from the same rounded inputs, and gradcheck of lce paths."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from analysis.core.fp64 import fp64_loss, gradcheck, reference_outputs
from analysis.core.implementations import ImplSpec
from analysis.core.inputs import OUTPUT_NAMES, Inputs, make_inputs, outputs_of
from analysis.core.problem import Shape
from lce.planning.options import EXPLICIT_POLICIES


def test_reference_uses_the_rounded_inputs_exactly():
    inputs = make_inputs(Shape(8, 4, 16), torch.bfloat16, seed=3)
    ref = reference_outputs(inputs)
    assert ref.loss.dtype == torch.float64 and ref.grad_weight.dtype == torch.float64
    logits = inputs.input.double() @ inputs.weight.double().T + inputs.bias.double()
    expected = F.cross_entropy(logits, inputs.target)
    assert ref.loss.item() == pytest.approx(expected.item(), rel=1e-14)
    # Gradient of the mean loss w.r.t. the bias is mean(softmax - onehot).
    probs = logits.softmax(1)
    probs[torch.arange(8), inputs.target] -= 1
    torch.testing.assert_close(ref.grad_bias, probs.mean(0), rtol=1e-12, atol=1e-14)


def _autograd_reference(inputs):
    exact = inputs.to(torch.float64)
    return outputs_of(fp64_loss(exact), exact)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("bias", [True, False])
def test_closed_form_blocks_match_autograd_with_every_argument(reduction, bias):
    """Class weights, ignored rows and a grad_output, in blocks of 3 rows (a ragged last block)."""
    inputs = make_inputs(Shape(11, 5, 13), torch.bfloat16, seed=4, bias=bias, reduction=reduction)
    inputs.target[::4] = 7
    inputs.ignore_index = 7
    inputs.class_weight = torch.linspace(0.25, 2.0, 13).to(torch.bfloat16)
    inputs.grad_output = (torch.linspace(-1.0, 2.0, 11) if reduction == "none" else torch.tensor(0.75)).to(
        torch.bfloat16)
    closed, autograd = reference_outputs(inputs, block_elements=3 * 13), _autograd_reference(inputs)
    for name in OUTPUT_NAMES:
        if getattr(autograd, name) is not None:
            torch.testing.assert_close(getattr(closed, name), getattr(autograd, name), rtol=1e-13, atol=1e-15)


def test_label_smoothing_and_all_ignored_mean_fall_back_to_autograd():
    inputs = make_inputs(Shape(6, 4, 10), torch.float32, seed=5)
    inputs.label_smoothing = 0.1
    torch.testing.assert_close(reference_outputs(inputs).grad_weight, _autograd_reference(inputs).grad_weight,
                               rtol=0, atol=0)
    inputs = make_inputs(Shape(6, 4, 10), torch.float32, seed=5)
    inputs.target[:] = inputs.ignore_index
    assert reference_outputs(inputs).loss.isnan()


@pytest.mark.parametrize("margin", [0.0, 20.0, 36.0, 60.0])
def test_confident_rows_keep_every_digit(margin):
    """Rows whose target leads by ``margin`` nats: the loss ``log1p(sum_c exp(z_c - z_y))`` and the
    target's gradient entry ``-(1 - p_y)`` to fp64's last digits, checked against math.fsum/log1p on
    Python floats; the unfused fp64 formula loses them (at 36 nats it is 7% off, at 60 nats it returns 0)."""
    c = 6
    x = torch.eye(c, dtype=torch.float64)  # the logits are the weight's columns, exactly
    w = torch.randn(c, c, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    target = torch.arange(c)
    w[target, target] = w.amax(0) + margin
    inputs = Inputs(x.requires_grad_(), w.requires_grad_(), None, target, reduction="sum")
    ref = reference_outputs(inputs)
    logits = w.T.tolist()
    for row, y in enumerate(target.tolist()):
        others = [math.exp(z - logits[row][y]) for col, z in enumerate(logits[row]) if col != y]
        other = math.fsum(others)
        dz_target = ref.grad_weight[y, row].item()  # x = I: grad_weight[:, row] is row's dz
        assert dz_target == pytest.approx(-other / (1 + other), rel=1e-14)
        assert ref.grad_weight[:, row].sum().item() == pytest.approx(0.0, abs=1e-15)
    expected = math.fsum(math.log1p(math.fsum(math.exp(z - logits[r][y]) for col, z in enumerate(logits[r])
                                                 if col != y)) for r, y in enumerate(target.tolist()))
    assert ref.loss.item() == pytest.approx(expected, rel=1e-14)
    if margin >= 36:
        unfused = _autograd_reference(inputs)
        assert abs(unfused.grad_weight[0, 0].item() - ref.grad_weight[0, 0].item()) > 0.05 * abs(
            ref.grad_weight[0, 0].item())


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
