"""The fit of the error/noise ratios over the batch size: a known power law is recovered, with honest intervals."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from analysis.judge import noise_scaling as fit

LEVELS = {"random": -12.0, "trained:final": -11.0, "calibrated": -6.0}
GROWING = {"random": 0.5, "trained:final": 0.5, "calibrated": -0.2}
ROWS = tuple(2**k for k in range(10, 17))


def _table(scatter: float = 0.2, seed: int = 0) -> pd.DataFrame:
    """Ratios 2**(level[family] + slope * log2 N + noise): torch's default grows as sqrt(N) on the families with an
    expected gradient, lce's auto pick stays flat; 3 seeds, bf16."""
    rng = np.random.default_rng(seed)
    rows = []
    for family, level in LEVELS.items():
        for draw_seed in range(3):
            for n in ROWS:
                for candidate, slope in (("torch 2.13 auto", GROWING[family]), ("lce auto cuda", 0.0)):
                    value = 2 ** (level + slope * math.log2(n) + rng.normal(0, scatter))
                    rows.append({"candidate": candidate, "dtype": "bfloat16", "family": family, "seed": draw_seed,
                                 "N": n, "D": 128, "C": 16384, "weight_bias_over_noise": value,
                                 "weight_error_over_noise": 3 * value, "input_error_over_noise": value / 3,
                                 "git_revision": "abc"})
    return pd.DataFrame(rows)


def test_the_rule_fits_only_families_with_a_nonzero_expected_gradient():
    assert fit.rule_families(_table()) == ["random", "trained:final"]


def test_a_noiseless_power_law_is_fitted_exactly():
    table = _table(scatter=0.0)
    line = fit.fit_line(fit.points(table, "torch 2.13 auto", "bfloat16", "weight_bias_over_noise",
                                   families=["random", "trained:final"]))
    assert line.slope == pytest.approx(0.5, abs=1e-12) and line.spread == pytest.approx(0.0, abs=1e-9)
    assert line.levels == pytest.approx({"random": -12.0, "trained:final": -11.0}, abs=1e-9)
    assert line.at(2**20) == pytest.approx(-11.0 + 10.0)  # the worst family's line
    with pytest.raises(ValueError, match="two batch sizes"):
        fit.fit_line(fit.points(table[table["N"] == 1024], "torch 2.13 auto", "bfloat16", "weight_bias_over_noise"))


def test_the_exponent_and_the_prediction_cover_the_truth():
    scaling = fit.fit_scaling(_table(), "torch 2.13 auto", "bfloat16", "weight_bias_over_noise", resamples=500)
    assert scaling.families == ("random", "trained:final")
    assert scaling.exponent_low < 0.5 < scaling.exponent_high and scaling.exponent_high - scaling.exponent_low < 0.2
    ratio, low, high = scaling.band(2**20)
    assert low < 2 ** (-11 + 10) < high and low < ratio < high  # the worst family (trained) at 2^20: 0.5
    flat = fit.fit_scaling(_table(), "lce auto cuda", "bfloat16", "weight_bias_over_noise", resamples=500)
    assert abs(flat.exponent) < 0.05 and flat.band(2**20)[2] < 2 ** -10


def test_the_bootstrap_is_seeded_and_keeps_every_family_level():
    data = fit.points(_table(), "torch 2.13 auto", "bfloat16", "weight_bias_over_noise",
                      families=["random", "trained:final"])
    first, second = fit.bootstrap_lines(data, 200), fit.bootstrap_lines(data, 200)
    assert np.array_equal(first[0], second[0]) and first[2] == ["random", "trained:final"]
    assert not np.isnan(first[1]).any()  # every refit has a line per family


def test_the_heldout_check_predicts_odd_powers_from_even_ones():
    check = fit.heldout_check(_table(), "torch 2.13 auto", "bfloat16", resamples=500)
    assert sorted(check["N"].unique()) == [2**11, 2**13, 2**15] and set(check["family"]) == {"random",
                                                                                           "trained:final"}
    assert check["error_log2"].abs().max() < 0.6
    # the prediction interval is a 95% one: over 30 such tables it held 95% of the held-out means (171 of 180);
    # over these 5, at least 80%
    covered = pd.concat([fit.heldout_check(_table(seed=seed), "torch 2.13 auto", "bfloat16", resamples=200)
                         for seed in range(5)])["covered"]
    assert covered.mean() >= 0.8
    assert fit.heldout_check(_table(scatter=0.0), "torch 2.13 auto", "bfloat16", resamples=50)[
        "error_log2"].abs().max() < 1e-9


def test_the_json_holds_measurements_and_the_band_beyond(tmp_path):
    path = tmp_path / "noise_scaling.csv"
    _table().to_csv(path, index=False)
    written = fit.write_scaling_json(path, tmp_path / "scaling.json", resamples=100)
    data = json.loads(written.read_text())
    assert data["families"] == ["random", "trained:final"] and data["D"] == 128
    entry = next(e for e in data["entries"] if e["candidate"] == "torch 2.13 auto"
                 and e["ratio"] == "weight_bias_over_noise")
    assert [point["N"] for point in entry["measured"]] == list(ROWS)
    assert all(point["family"] == "trained:final" for point in entry["measured"])  # the worst family
    assert [point["N"] for point in entry["fit"]["band"]] == [2**k for k in range(10, 21)]
    assert entry["fit"]["exponent_interval"][0] < 0.5 < entry["fit"]["exponent_interval"][1]
    assert entry["heldout"]["points"] == 6 and data["provenance"]["rows"] == str(len(_table()))


def test_each_familys_own_exponent_recovers_its_growth():
    table = fit.family_exponents(_table(), resamples=300).set_index(["candidate", "family"])
    for family, slope in GROWING.items():
        row = table.loc[("torch 2.13 auto", family)]
        assert row["exponent_low"] < slope < row["exponent_high"] and abs(row["exponent"] - slope) < 0.1
        flat = table.loc[("lce auto cuda", family)]
        assert flat["exponent_low"] < 0 < flat["exponent_high"]
    assert fit.family_exponents(_table()[lambda t: t["N"] <= 2048]).empty  # two batch sizes: no exponent


def test_the_bootstrap_resamples_each_familys_points_not_the_families():
    """A family measured over one octave cannot set the slope: its refits keep the wide family's."""
    table = _table()
    narrow = table[(table["family"] != "trained:final") | (table["N"] <= 2048)]
    scaling = fit.fit_scaling(narrow, "torch 2.13 auto", "bfloat16", "weight_bias_over_noise", resamples=500)
    assert scaling.exponent_high - scaling.exponent_low < 0.2
