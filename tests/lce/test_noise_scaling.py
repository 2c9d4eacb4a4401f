"""lce.decide.noise_scaling: a ratio at the head's own N, measured inside the data's range and predicted beyond."""

from __future__ import annotations

import pytest
import torch

from lce.decide import noise_scaling

DATA = {"entries": [{
    "candidate": "torch 2.13 auto", "dtype": "bfloat16", "ratio": "weight_bias_over_noise",
    "measured": [{"N": 1024, "ratio": 0.01, "low": 0.008, "high": 0.012},
                 {"N": 4096, "ratio": 0.04, "low": 0.03, "high": 0.05}],
    "fit": {"band": [{"N": 1024, "ratio": 0.011, "low": 0.009, "high": 0.013},
                     {"N": 4096, "ratio": 0.044, "low": 0.03, "high": 0.06},
                     {"N": 16384, "ratio": 0.176, "low": 0.1, "high": 0.3}]},
}]}


@pytest.fixture
def data(monkeypatch):
    monkeypatch.setattr(noise_scaling, "scaling_data", lambda: DATA)


def test_inside_the_data_the_ratio_is_the_measurement(data):
    at = noise_scaling.ratio_at("torch 2.13 auto", torch.bfloat16, 4096)
    assert (at.value, at.low, at.high, at.predicted) == (0.04, 0.03, 0.05, False)
    between = noise_scaling.ratio_at("torch 2.13 auto", "bfloat16", 2048)  # halfway in log-log
    assert between.value == pytest.approx(0.02) and not between.predicted
    assert "measured" in str(between)


def test_beyond_the_data_the_fitted_band_is_a_prediction(data):
    at = noise_scaling.ratio_at("torch 2.13 auto", torch.bfloat16, 8192)
    assert at.predicted and at.value == pytest.approx((0.044 * 0.176) ** 0.5)
    far = noise_scaling.ratio_at("torch 2.13 auto", torch.bfloat16, 65536)  # along the last segment's slope
    assert far.value == pytest.approx(0.176 * 4) and far.high == pytest.approx(0.3 * 5 ** 1)
    assert far.low < far.value < far.high and "predicted" in str(far)
    below = noise_scaling.ratio_at("torch 2.13 auto", torch.bfloat16, 512)
    assert below.predicted and below.value == pytest.approx(0.011 / 2)


def test_unknown_names_say_what_the_data_hold(data):
    with pytest.raises(ValueError, match="torch 2.13 auto"):
        noise_scaling.ratio_at("lce fastest", torch.bfloat16, 1024)
    with pytest.raises(ValueError, match="ratio must be one of"):
        noise_scaling.ratio_at("torch 2.13 auto", torch.bfloat16, 1024, ratio="loss")
    with pytest.raises(ValueError, match="num_rows"):
        noise_scaling.ratio_at("torch 2.13 auto", torch.bfloat16, 0)
    assert noise_scaling.candidates() == ("torch 2.13 auto",)


def _plan(policy, rows_per_chunk, num_rows=16384, dtype=torch.bfloat16, weight_grad=True):
    import lce
    from lce.testing import emulate_device_kind

    options = lce.LinearCrossEntropyOptions(acc_policy=policy, acc_dtype=torch.float32, chunking_method=None,
                                            batch_chunk_size=rows_per_chunk)
    with emulate_device_kind("cuda"):
        return lce.plan(torch.empty(num_rows, 64, dtype=dtype, device="meta", requires_grad=True),
                        torch.empty(1024, 64, dtype=dtype, device="meta", requires_grad=weight_grad), options=options)


def test_a_plan_reads_the_measured_candidates_of_its_arithmetic():
    floor = noise_scaling.FLOOR_CANDIDATES
    assert noise_scaling.scaling_candidates(_plan("balanced", 256)) == floor["balanced"]
    assert noise_scaling.scaling_candidates(_plan("accurate", 256)) == floor["accurate"]
    assert noise_scaling.scaling_candidates(_plan("compact", 16384)) == floor["balanced"]  # one chunk: rounded once
    # compact at 8 chunks of a 16384-row call: 2048 rows per chunk, the rows=2048 candidate's count there
    assert noise_scaling.scaling_candidates(_plan("compact", 2048)) == ("lce compact rows=2048",)
    assert noise_scaling.scaling_candidates(_plan("compact", 1024)) == ("lce compact chunks=16",)
    assert noise_scaling.scaling_candidates(_plan("compact", 8)) == ("torch 2.13 auto",)
    assert noise_scaling.scaling_candidates(_plan("compact", 256, dtype=torch.float32)) == ()
    assert noise_scaling.scaling_candidates(_plan("compact", 256, weight_grad=False)) == ()


def test_bias_at_is_the_larger_of_the_equivalent_measurements_at_the_plans_own_n():
    plan = _plan("balanced", 2048)
    names = noise_scaling.FLOOR_CANDIDATES["balanced"]
    ratios = [noise_scaling.ratio_at(name, torch.bfloat16, 16384) for name in names]
    at = noise_scaling.bias_at(plan)
    assert at.num_rows == 16384 and not at.predicted and at.value == max(ratio.value for ratio in ratios)
    beyond = noise_scaling.bias_at(_plan("balanced", 2048, num_rows=2**18))
    assert beyond.predicted and beyond.low <= beyond.value <= beyond.high
    assert noise_scaling.bias_at(_plan("compact", 256, dtype=torch.float32)) is None
