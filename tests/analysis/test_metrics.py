"""analysis.core.metrics on hand-made cases whose answers are known exactly."""

from __future__ import annotations

import math

import pytest
import torch

from analysis.core.inputs import Outputs
from analysis.core.metrics import (
    ERROR_SUFFIXES,
    bias_in_floors,
    compare,
    in_floors,
    rel_fro,
    report,
    rounding_floor,
    row_floors,
    ulp,
    ulps,
)

F64 = torch.float64


def test_rel_fro_known_value():
    reference = torch.tensor([1.0, 2.0], dtype=F64)
    value = torch.tensor([1.0, 2.0 + 2**-7], dtype=F64)
    assert rel_fro(value, reference) == pytest.approx(2**-7 / math.sqrt(5), rel=1e-15)


def test_exact_value_has_zero_error_and_zero_reference_is_handled():
    x = torch.randn(5, 3, dtype=F64)
    assert rel_fro(x, x) == 0.0
    zero = torch.zeros(3, dtype=F64)
    assert rel_fro(zero, zero) == 0.0
    assert rel_fro(torch.ones(3, dtype=F64), zero) == math.inf


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_a_rounded_tensor_is_at_the_floor_on_every_metric(dtype):
    reference = torch.randn(64, 32, dtype=F64, generator=torch.Generator().manual_seed(1))
    rounded = reference.to(dtype)
    result = report(rounded, reference)
    assert result.rel_fro == result.floor_fro > 0
    assert result.fro_in_floors == 1.0
    assert result.row_median == result.row_p99 == result.row_max == 1.0
    assert abs(result.bias_in_floors) < 0.5  # rounding errors barely line up with the tensor
    assert result.floor_fro <= torch.finfo(dtype).eps / 2  # round-to-nearest: at most half an ulp
    assert math.isnan(result.ulps)


def test_floor_of_representable_values_is_zero():
    reference = torch.tensor([1.0, 0.5, -3.0], dtype=F64)  # exact in bf16
    assert rounding_floor(reference, torch.bfloat16) == 0.0
    assert in_floors(0.0, 0.0) == 1.0
    assert in_floors(1e-3, 0.0) == math.inf
    assert in_floors(4e-3, 2e-3) == 2.0


def test_doubling_the_rounding_error_doubles_error_in_floors():
    reference = torch.randn(1000, dtype=F64, generator=torch.Generator().manual_seed(2))
    rounded = reference.to(torch.bfloat16).double()
    doubled = reference + 2 * (rounded - reference)
    assert report(doubled, reference, torch.bfloat16).fro_in_floors == pytest.approx(2.0, rel=1e-12)


def test_rows_show_what_the_frobenius_average_hides():
    """One small row (a rarely targeted class) 50x off its own floor barely moves the tensor's error."""
    g = torch.Generator().manual_seed(3)
    reference = torch.randn(100, 16, dtype=F64, generator=g)
    reference[7] *= 1e-4
    value = reference.to(torch.bfloat16).double()
    value[7] = reference[7] + 50 * (value[7] - reference[7])
    result = report(value, reference, torch.bfloat16)
    assert result.fro_in_floors < 1.01
    assert result.row_median == 1.0
    assert result.row_max == pytest.approx(50.0, rel=1e-12)
    per_row = row_floors(value, reference, torch.bfloat16)
    assert per_row.argmax().item() == 7 and len(per_row) == 100


def test_rows_with_a_zero_exact_value_are_left_out_and_representable_rows_read_one_or_inf():
    reference = torch.tensor([[0.0, 0.0], [1.0, 0.5], [0.1, 0.2]], dtype=F64)
    value = torch.tensor([[0.0, 0.0], [1.0, 0.5], [0.1, 0.2]], dtype=F64).to(torch.bfloat16)
    assert row_floors(value, reference).tolist() == [1.0, 1.0]
    value = value.double()
    value[1, 0] = 1.0 + 2**-7
    assert row_floors(value, reference, torch.bfloat16)[0].item() == math.inf
    with pytest.raises(ValueError, match="2-D"):
        row_floors(torch.ones(3), torch.ones(3, dtype=F64))


def test_bias_is_the_signed_component_along_the_exact_tensor():
    g = torch.Generator().manual_seed(4)
    reference = torch.randn(4000, dtype=F64, generator=g)
    floor = rounding_floor(reference, torch.bfloat16)
    shrunk = reference * (1 - 3 * floor)  # 3 floors too small, all along the exact direction
    assert bias_in_floors(shrunk, reference, torch.bfloat16) == pytest.approx(-3.0, rel=1e-9)
    assert report(shrunk, reference, torch.bfloat16).fro_in_floors == pytest.approx(3.0, rel=1e-9)
    noise = reference.to(torch.bfloat16).double()  # unbiased: about 1/sqrt(4000) of its size along r
    assert abs(bias_in_floors(noise, reference, torch.bfloat16)) < 0.1


def test_ulps_of_the_loss():
    exact = torch.tensor(3.0, dtype=F64)  # bf16 spacing at 3 is 2**-6
    assert ulp(exact, torch.bfloat16).item() == 2**-6
    assert ulps(torch.tensor(3.0 + 2**-6, dtype=torch.bfloat16), exact) == pytest.approx(1.0)
    assert ulps(torch.tensor(3.0, dtype=torch.bfloat16), exact) == 0.0
    tiny = torch.finfo(torch.float32).tiny
    assert ulp(torch.tensor(0.0, dtype=F64), torch.float32).item() == tiny * torch.finfo(torch.float32).eps
    rounded = torch.tensor(math.pi, dtype=F64).to(torch.float16)
    assert ulps(rounded, torch.tensor(math.pi, dtype=F64)) <= 0.5


def test_compare_skips_missing_bias_gives_the_loss_ulps_and_rejects_shape_mismatch():
    ref = Outputs(torch.tensor(1.0, dtype=F64), torch.ones(2, 3, dtype=F64), torch.ones(4, 3, dtype=F64))
    out = Outputs(torch.tensor(1.0), torch.ones(2, 3), torch.ones(4, 3))
    reports = compare(out, ref)
    assert set(reports) == {"loss", "grad_input", "grad_weight"}
    assert reports["loss"].ulps == 0.0 and math.isnan(reports["grad_weight"].ulps)
    assert list(reports["grad_input"].columns("grad_input")) == [f"grad_input_{s}" for s in ERROR_SUFFIXES]
    with pytest.raises(ValueError, match="shape"):
        rel_fro(torch.ones(2), torch.ones(3, dtype=F64))
