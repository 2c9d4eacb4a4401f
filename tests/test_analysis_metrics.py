"""analysis.metrics on hand-made cases whose answers are known exactly."""

from __future__ import annotations

import math

import pytest
import torch

from analysis.inputs import Outputs
from analysis.metrics import compare, in_floors, max_rel, rel_fro, report, rounding_floor

F64 = torch.float64


def test_rel_fro_and_max_rel_known_values():
    reference = torch.tensor([1.0, 2.0], dtype=F64)
    value = torch.tensor([1.0, 2.0 + 2**-7], dtype=F64)
    assert rel_fro(value, reference) == pytest.approx(2**-7 / math.sqrt(5), rel=1e-15)
    assert max_rel(value, reference) == pytest.approx(2**-8, rel=1e-15)


def test_exact_value_has_zero_error_and_zero_reference_is_handled():
    x = torch.randn(5, 3, dtype=F64)
    assert rel_fro(x, x) == 0.0 and max_rel(x, x) == 0.0
    zero = torch.zeros(3, dtype=F64)
    assert rel_fro(zero, zero) == 0.0
    assert rel_fro(torch.ones(3, dtype=F64), zero) == math.inf


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_a_rounded_tensor_has_error_equal_to_its_floor(dtype):
    reference = torch.randn(64, 32, dtype=F64, generator=torch.Generator().manual_seed(1))
    rounded = reference.to(dtype)
    result = report(rounded, reference)
    assert result.rel_fro == result.floor_fro > 0
    assert result.max_rel == result.floor_max > 0
    assert result.fro_in_floors == 1.0 and result.max_in_floors == 1.0
    unit_roundoff = torch.finfo(dtype).eps / 2
    assert result.floor_max <= unit_roundoff  # round-to-nearest: at most half an ulp
    assert result.floor_fro <= unit_roundoff


def test_floor_of_representable_values_is_zero():
    reference = torch.tensor([1.0, 0.5, -3.0], dtype=F64)  # exact in bf16
    assert rounding_floor(reference, torch.bfloat16) == (0.0, 0.0)
    assert in_floors(0.0, 0.0) == 1.0
    assert in_floors(1e-3, 0.0) == math.inf
    assert in_floors(4e-3, 2e-3) == 2.0


def test_max_rel_clamps_denominators_at_the_smallest_normal():
    reference = torch.tensor([1.0, 0.0], dtype=F64)
    value = torch.tensor([1.0, 1e-40], dtype=torch.float32)  # a subnormal where 0 was exact
    tiny = torch.finfo(torch.float32).tiny
    assert max_rel(value, reference) == pytest.approx(float(torch.tensor(1e-40)) / tiny)


def test_doubling_the_rounding_error_doubles_error_in_floors():
    reference = torch.randn(1000, dtype=F64, generator=torch.Generator().manual_seed(2))
    rounded = reference.to(torch.bfloat16).double()
    doubled = reference + 2 * (rounded - reference)
    assert report(doubled, reference, torch.bfloat16).fro_in_floors == pytest.approx(2.0, rel=1e-12)


def test_compare_skips_missing_bias_and_rejects_shape_mismatch():
    ref = Outputs(torch.tensor(1.0, dtype=F64), torch.ones(2, 3, dtype=F64), torch.ones(4, 3, dtype=F64))
    out = Outputs(torch.tensor(1.0), torch.ones(2, 3), torch.ones(4, 3))
    reports = compare(out, ref)
    assert set(reports) == {"loss", "grad_input", "grad_weight"}
    with pytest.raises(ValueError, match="shape"):
        rel_fro(torch.ones(2), torch.ones(3, dtype=F64))
