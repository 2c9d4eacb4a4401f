"""lce.checks (issue 33): value checks read the values on the CPU and raise ValueError; on CUDA they are device-side
asserts (no host synchronisation) unless eager_checks() asks for the ValueError. Off a GPU the device path is
exercised by treating CPU tensors as if they were on CUDA: torch._assert_async then raises at once, with lce's
message."""

from __future__ import annotations

import pytest
import torch

import lce
import lce.checks


@pytest.fixture
def device_side(monkeypatch):
    """CPU tensors checked as CUDA tensors are: by torch._assert_async (which raises at once on the CPU)."""
    monkeypatch.setattr(lce.checks, "checks_eagerly", lambda tensor: lce.checks._EAGER.get())


def _problem():
    g = torch.Generator().manual_seed(0)
    return torch.randn(8, 4, generator=g), torch.randn(10, 4, generator=g), torch.randint(0, 10, (8,), generator=g)


def test_on_the_cpu_a_bad_target_is_a_value_error_naming_it():
    x, w, y = _problem()
    y[3] = 10
    with pytest.raises(ValueError, match=r"target values must lie in \[0, 10\) or equal ignore_index=-100, found 10"):
        lce.linear_cross_entropy(x, w, y, options=lce.LinearCrossEntropyOptions())


def test_the_device_side_check_carries_lces_message(device_side):
    x, w, y = _problem()
    y[3] = 10
    with pytest.raises(RuntimeError, match=r"lce: target values must lie in \[0, 10\)"):
        lce.linear_cross_entropy(x, w, y, options=lce.LinearCrossEntropyOptions())
    with pytest.raises(RuntimeError, match=r"run under lce.checks.eager_checks\(\) for which"):
        lce.linear_log_probs(x, w, y)


def test_eager_checks_bring_the_value_error_back(device_side):
    x, w, y = _problem()
    y[3] = -5
    with lce.checks.eager_checks(), pytest.raises(ValueError, match=r"found -5"):
        lce.linear_cross_entropy(x, w, y, options=lce.LinearCrossEntropyOptions())
    with lce.checks.eager_checks(), pytest.raises(ValueError, match=r"target values must lie in \[0, 10\)"):
        lce.linear_log_probs(x, w, y)


def test_good_input_passes_the_device_side_check(device_side):
    x, w, y = _problem()
    y[2] = -100
    loss = lce.linear_cross_entropy(x, w, y, options=lce.LinearCrossEntropyOptions())
    assert torch.isfinite(loss)
    assert torch.isfinite(lce.linear_log_probs(x, w, y, temperature=torch.full((8,), 0.7))).all()


def test_eager_checks_takes_a_bool():
    with pytest.raises(TypeError, match="enabled must be a bool, got str"), lce.checks.eager_checks("yes"):
        pass
