"""lce.decide.error_model: its committed validation, the shape of its predictions, its statistics and its errors."""

from __future__ import annotations

import re

import pandas as pd
import pytest
import torch

from analysis.cli import main
from analysis.paths import RESULTS_DIR
from analysis.studies import error_model as error_model_fit
from lce.decide import error_model
from lce.decide.error_model import InputStats, measure_input_stats, predict_errors
from lce.planning.options import LinearCrossEntropyOptions
from lce.planning.resolve import make_plan
from lce.testing import cpu_gemms, emulate_device_kind


def _plan(policy: str, chunks: int, *, kind: str = "cuda", dtype=torch.bfloat16, acc=torch.float32, rows: int = 1024):
    options = LinearCrossEntropyOptions(acc_policy=policy, acc_dtype=acc, chunking_method=None,
                                        batch_chunk_size=rows // chunks)
    with emulate_device_kind(kind):
        return make_plan(options, num_rows=rows, in_features=128, num_classes=16384, dtype=dtype,
                         device=torch.device("cpu"))


def test_held_out_predictions_reproduce_the_stated_accuracy():
    rows = error_model_fit.load_measurements(RESULTS_DIR)
    rows["split"] = [error_model_fit.split_of(r.family, error_model_fit.Shape(r.N, r.D, r.C))
                     for r in rows.itertuples()]
    held_out = rows[rows["split"] != "fit"].copy()
    held_out["predicted"] = error_model_fit.predict_rows(held_out, error_model_fit.load_stats(RESULTS_DIR))
    held_out["relative_miss"] = held_out["predicted"] / held_out["measured"] - 1
    stated = re.search(r"held-out data for (\d+)% of (\d+) points", error_model.ACCURACY)
    assert stated, error_model.ACCURACY
    assert len(held_out) == int(stated[2])
    assert round(100 * error_model_fit.hit_share(held_out)) == int(stated[1])
    committed = pd.read_csv(RESULTS_DIR / error_model_fit.VALIDATION_FILE)
    assert sorted(committed.loc[committed["split"] != "fit", "predicted"].round(4)) == pytest.approx(
        sorted(held_out["predicted"].round(4)), rel=1e-3)


def test_check_passes_on_the_committed_constants():
    assert main(["error-model", "--check"]) == 0


def test_the_fit_is_the_same_on_a_cpu_that_emulates_bf16():
    """The rows are rebuilt as the grids ran them (native GEMMs): refitted where the CPU's verdict is "emulated" (an
    AVX2-only EPYC's), the constants are the committed ones, not that CPU's."""
    with cpu_gemms("emulated"):
        assert main(["error-model", "--check"]) == 0


def test_per_chunk_rounding_never_predicts_less_with_more_chunks():
    errors = [predict_errors(_plan("compact", k))["grad_weight"] for k in (1, 4, 16, 64, 256)]
    assert errors == sorted(errors)
    assert errors[-1] > 3 * errors[0]


def test_accumulator_layouts_do_not_grow_with_chunks_and_accurate_is_one_floor():
    for kind in ("cuda", "cpu"):
        balanced = {k: predict_errors(_plan("balanced", k, kind=kind))["grad_weight"] for k in (1, 16, 256)}
        assert max(balanced.values()) <= 1.5
        accurate = [predict_errors(_plan("accurate", k, kind=kind)) for k in (1, 256)]
        assert all(value == pytest.approx(1.0, abs=0.01) for errors in accurate for value in errors.values())
    cuda_balanced = [predict_errors(_plan("balanced", k))["grad_weight"] for k in (1, 16, 256)]
    assert max(cuda_balanced) == pytest.approx(min(cuda_balanced))


def test_default_statistics_are_the_conservative_ones():
    benign = InputStats(0.0, 0.05, 9.0, 0.05, 9.0, 0.95)
    plan = _plan("compact", 64)
    assert predict_errors(plan)["grad_weight"] >= predict_errors(plan, benign)["grad_weight"]
    assert predict_errors(plan) == predict_errors(plan, error_model.WORST_COMMITTED_STATS)


def test_measure_input_stats_matches_a_direct_fp64_computation():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(12, 5, generator=generator, dtype=torch.float64)
    w = torch.randn(7, 5, generator=generator, dtype=torch.float64)
    y = torch.randint(0, 7, (12,), generator=generator)
    stats = measure_input_stats(x, w, y, sample_rows=12, block_rows=5)
    z = x @ w.T
    p = torch.softmax(z, 1)
    dz = p - torch.nn.functional.one_hot(y, 7).double()
    g = dz[:, :, None] * x[:, None, :]  # (N, C, D) per-row contributions
    per_row = g.square().sum((1, 2))
    mean = g.mean(0)
    unbiased_mean_square = (g.sum(0).square().sum() - per_row.sum()) / (12 * 11)
    expected_rho = (unbiased_mean_square / per_row.mean()).clamp(0, 1).item()
    assert stats.weight_signal_fraction == pytest.approx(expected_rho, rel=1e-9, abs=1e-12)
    assert mean.square().sum().item() > 0
    inexact = dz.square().clone()
    rows = torch.arange(12)
    inexact[rows, y] *= (p[rows, y] / 2 ** -8).clamp(max=1).square()
    gx = dz @ w
    w_norms = w.square().sum(1)
    assert stats.weight_dz_share == pytest.approx(((inexact.sum(1) * x.square().sum(1)).sum() / per_row.sum()).item())
    assert stats.input_dz_share == pytest.approx(((inexact @ w_norms).sum() / gx.square().sum()).item())
    assert stats.input_logit_share == pytest.approx((((p * z).square() @ w_norms).sum() / gx.square().sum()).item())
    assert stats.input_cancellation == pytest.approx(((dz.square() @ w_norms).sum() / gx.square().sum()).item())


def test_bad_arguments_raise_clear_errors():
    with pytest.raises(TypeError, match="plan must be an lce.Plan"):
        predict_errors("compact")
    with pytest.raises(TypeError, match="stats must be an InputStats"):
        predict_errors(_plan("compact", 4), {"weight_signal_fraction": 0.1})
    with pytest.raises(ValueError, match="weight_signal_fraction"):
        InputStats(1.5, 0.1, 1.0, 0.1, 1.0, 1.0)
    with pytest.raises(ValueError, match="input_cancellation"):
        InputStats(0.1, 0.1, 1.0, 0.1, 1.0, float("nan"))
    x, w, y = torch.zeros(4, 3), torch.zeros(5, 3), torch.zeros(4, dtype=torch.long)
    with pytest.raises(ValueError, match="sample_rows"):
        measure_input_stats(x, w, y, sample_rows=1)
    with pytest.raises(ValueError, match="target must have shape"):
        measure_input_stats(x, w, y[:2])
    with pytest.raises(ValueError, match=r"input must be \(N, D\)"):
        measure_input_stats(x, torch.zeros(5, 2), y)


def test_llm_predictions_are_marked_as_extrapolations():
    table = error_model_fit.llm_predictions(shapes=error_model_fit.LLM_SHAPES[:1], dtypes=("bfloat16",))
    assert set(table["status"]) == {"prediction (extrapolation)"}
    assert set(table["kind"]) == {"cpu", "cuda"}


def _detail_points():
    committed = pd.read_csv(RESULTS_DIR / error_model_fit.DETAIL_VALIDATION_FILE)
    stats = error_model_fit.load_stats(RESULTS_DIR)
    predicted = []
    for row in committed.itertuples():
        shape = error_model_fit.Shape(int(row.N), int(row.D), int(row.C))
        plan = error_model_fit.plan_for(row.kind, row.dtype, row.acc_dtype, row.policy, shape, int(row.chunk_size))
        family = "trained:final" if row.family == "trained" else row.family
        predicted.append(error_model.predict_weight_details(plan, stats[(family, shape)])[row.output])
    return committed.assign(recomputed=predicted)


def test_weight_details_reproduce_their_stated_held_out_accuracy():
    points = _detail_points()
    assert points["recomputed"].to_numpy() == pytest.approx(points["predicted"].to_numpy(), rel=2e-3)
    held_out = points[points["split"] != "fit"]
    bias = held_out[held_out["output"] == "weight_bias"]
    stated = re.search(r"for (\d+)% of (\d+) held-out points", error_model.DETAIL_ACCURACY["weight_bias"])
    assert stated and len(bias) == int(stated[2])
    assert round(100 * (bias["recomputed"] >= bias["measured"]).mean()) == int(stated[1])
    worst = held_out[held_out["output"] == "worst_row"].assign(
        relative_miss=lambda t: t["recomputed"] / t["measured"] - 1)
    stated = re.search(r"held-out data for (\d+)% of (\d+) points", error_model.DETAIL_ACCURACY["worst_row"])
    assert stated and len(worst) == int(stated[2])
    assert round(100 * error_model_fit.hit_share(worst)) == int(stated[1])


def test_the_bias_bound_grows_with_compacts_chunks_and_is_the_rounding_constant_at_one_floor():
    bounds = [error_model.predict_weight_details(_plan("compact", k))["weight_bias"] for k in (1, 16, 256)]
    assert bounds == sorted(bounds) and bounds[-1] > 5 * bounds[0]
    accurate = error_model.predict_weight_details(_plan("accurate", 64))
    rounding = error_model.load_constants().details["weight_bias"]["rounding"]
    assert accurate["weight_bias"] == pytest.approx(rounding, rel=0.05)
    assert accurate["worst_row"] >= 1.0


def test_weight_details_refuse_what_is_not_a_plan():
    with pytest.raises(TypeError, match="plan must be an lce.Plan"):
        error_model.predict_weight_details("compact")
