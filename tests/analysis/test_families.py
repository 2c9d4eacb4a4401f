"""Each input family has the statistics its docstring promises (analysis.core.families, studies.family_stats)."""

from __future__ import annotations

import pytest
import torch

from analysis.core.families import CALIBRATION, draw, family_kind, parse_family
from analysis.core.inputs import make_inputs
from analysis.core.problem import Shape
from analysis.studies.family_stats import family_statistics, row_statistics

SHAPE = Shape(1024, 64, 4096)


def _stats(family: str, **kwargs) -> dict[str, float]:
    return family_statistics(family, SHAPE, **kwargs).set_index("statistic")["value"].to_dict()


def test_random_is_confidently_wrong_with_uniform_targets():
    stats = _stats("random")
    assert 10 < stats["mean_loss"] < 16
    assert stats["share_p_target_above_0.999"] == 0 and stats["max_margin"] < 0
    assert stats["feature_rms_max_over_median"] < 1.2
    assert abs(stats["zipf_slope"]) < 0.3 and stats["distinct_targets"] > 0.85 * SHAPE.N


@pytest.mark.parametrize("mean_loss", [0.5, 3.0, 6.0])
def test_calibrated_mean_loss_is_set_by_its_parameter(mean_loss):
    stats = _stats(f"calibrated:{mean_loss}")
    assert stats["mean_loss"] == pytest.approx(mean_loss, rel=0.2)


def test_calibrated_has_zipf_targets_outlier_features_and_confident_rows():
    stats = _stats("calibrated")
    assert -1.4 < stats["zipf_slope"] < -0.6  # Zipf exponent 1.1 in the prior
    assert stats["feature_rms_max_over_median"] > CALIBRATION.outlier_scale / 2
    share = CALIBRATION.confident_share
    assert share - 0.03 < stats["share_p_target_above_0.999"] < share + 0.06
    assert stats["max_margin"] > CALIBRATION.confident_margin[0]
    assert stats["p_target_q0.5"] > 1e-3  # right more often than a uniform guess by far


def test_calibrated_without_bias_carries_the_prior_on_a_constant_feature():
    with_bias, without = draw("calibrated", SHAPE, seed=2), draw("calibrated", SHAPE, seed=2, bias=False)
    assert without.bias is None and torch.all(without.x[:, 0] == 1.0)  # the confident push leaves it alone
    loss_with = row_statistics(with_bias.x, with_bias.weight, with_bias.bias, with_bias.target)["loss"].mean()
    loss_without = row_statistics(without.x, without.weight, None, without.target)["loss"].mean()
    assert loss_without == pytest.approx(loss_with, rel=0.15)


def test_draws_are_seeded_and_rounded_once():
    a = make_inputs(SHAPE, torch.bfloat16, family="calibrated", seed=3)
    b = make_inputs(SHAPE, torch.bfloat16, family="calibrated", seed=3)
    c = make_inputs(SHAPE, torch.bfloat16, family="calibrated", seed=4)
    assert torch.equal(a.input, b.input) and torch.equal(a.target, b.target)
    assert not torch.equal(a.input, c.input)
    exact = draw("calibrated", SHAPE, seed=3)
    assert torch.equal(a.weight.detach(), exact.weight.to(torch.bfloat16))


def test_family_names_are_checked():
    assert parse_family("calibrated:0.5") == ("calibrated", "0.5") and family_kind("trained:early") == "trained"
    for bad in ("uniform", "random:2", "calibrated:-1", "calibrated:abc"):
        with pytest.raises(ValueError, match="family|calibrated"):
            parse_family(bad)
    with pytest.raises(TypeError, match="family"):
        parse_family(3)


def test_trained_seeds_sample_distinct_rows_of_the_dump():
    shape = Shape(256, 128, 16384)
    first, again, other = (draw("trained", shape, seed=s, bias=False) for s in (0, 0, 3))
    whole = draw("trained", Shape(2048, 128, 16384), seed=0, bias=False)
    assert torch.equal(first.x, whole.x[:256]) and torch.equal(first.target, whole.target[:256])
    assert torch.equal(first.x, again.x)
    assert not torch.equal(first.x, other.x)
    # every row of another seed is a row of the dump, with its own target
    matches = (other.x[:, None, :] == whole.x[None, :, :]).all(-1)
    assert matches.any(1).all()
    assert torch.equal(other.target, whole.target[matches.float().argmax(1)])
