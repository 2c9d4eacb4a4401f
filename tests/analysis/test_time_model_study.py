"""The time model's fit (analysis.studies.time_model): it recovers known constants from runs they generated, counts
each run with the plan and the code that ran it, and reports a held-out fit; the committed rows give samples."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

from analysis.studies import time_model as study
from lce.decide.time_model import TimeConstants

TRUE = {"half_rows": 128.0, "half_features": 48.0, "bandwidth": 2e12, "elementwise_passes": 12.0,
        "launch_overhead": 3e-5, "step_overhead": 8e-4}
RATES = {"gpu": {"bfloat16": 5e14, "float32": 6e13}}


def _samples(shapes=((4096, 2048, 65536), (8192, 4096, 128256), (2048, 1024, 32768), (16384, 2048, 50000))):
    """Runs whose times the TRUE constants give exactly, over several shapes and chunkings."""
    out = []
    for n, d, c in shapes:
        for rows in (64, 256, 1024, n):
            chunks = -(-n // rows)
            gemms = tuple((2.0 * n * c * d, dtype, rows, d) for dtype in ("bfloat16", "bfloat16", "float32"))
            terms = (3.0 * chunks * c * d * 2, float(n * c * 4), 3.0 * chunks + 2 * chunks, float(chunks))
            sample = study.Sample("cuda", "gpu", f"{n}x{d}x{c}", gemms, terms, 1.0, "synthetic")
            seconds = study.Fit(TRUE, RATES).predict(sample)
            out.append(study.Sample("cuda", "gpu", sample.shape, gemms, terms, seconds, "synthetic"))
    return out


def test_the_fit_recovers_the_constants_that_made_the_times():
    data = _samples()
    fitted = study.fit(data, RATES)
    worst = max(abs(fitted.predict(s) / s.seconds - 1) for s in data)
    assert worst < 0.02
    assert fitted.shared["step_overhead"] == pytest.approx(TRUE["step_overhead"], rel=0.1)


def test_held_out_predicts_each_shape_from_the_others():
    report = study.held_out(_samples(), RATES)
    assert report["shapes"] == 4 and report["samples"] == 16 and report["within"] == 1.0
    assert math.isclose(report["median_ratio"], 1.0, rel_tol=0.05)


def _grid_row(**changes) -> pd.Series:
    row = {"N": 2048, "D": 128, "C": 16384, "dtype": "bfloat16", "bias": "False", "policy": "auto",
           "chunking": "auto", "acc_dtype": "default", "resolved_policy": "balanced", "resolved_acc_dtype": "float32",
           "chunk_size": 16.0, "date": "2026-12-04T18:00:00+00:00"}
    return pd.Series({**row, **changes})


def test_a_row_is_planned_with_the_rows_per_chunk_it_ran_not_what_its_rule_gives_today():
    """The H200's grid ran "auto" at 16 rows a chunk; today the CUDA auto rule floors chunks at 2048 rows."""
    options = study.as_run_options(_grid_row())
    assert (options.acc_policy, options.acc_dtype, options.batch_chunk_size) == ("balanced", torch.float32, 16)
    assert options.chunking_method is None


def test_a_cuda_row_from_before_the_cut_is_costed_with_the_million_element_blocks_it_ran():
    shape = {"N": 8192, "D": 2304, "C": 256000, "chunk_size": 512.0}
    before = study.predicted_seconds_as_run(_grid_row(**shape), "cuda")
    after = study.predicted_seconds_as_run(_grid_row(**shape, date=f"{study.BLOCKED_SUM_UNTIL}T12:00:00+00:00"),
                                           "cuda")
    assert before > 2 * after  # 16 chunks x ~560 blocked GEMMs against 16 x 9


def test_the_committed_rows_give_samples_of_each_kind_with_rates():
    cuda = study.samples("cuda")
    assert len(cuda) > 100 and {s.machine for s in cuda} <= set(study.machine_rates("cuda"))
    cpu = study.samples("cpu")
    assert len(cpu) > 20 and all(s.seconds > 0 for s in cpu)
    assert all(s.machine in study.machine_rates("cpu") for s in cpu)


def test_constants_round_trip_through_json():
    constants = TimeConstants({torch.float32: 1e12, torch.bfloat16: 4e12}, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, "x")
    assert TimeConstants.from_json(constants.to_json()) == constants
