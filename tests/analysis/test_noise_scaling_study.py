"""The noise study over batch sizes: its candidates, its grid's cases, and a resumable run that appends per case."""

from __future__ import annotations

import pytest
import torch

from analysis.core.inputs import make_inputs
from analysis.core.problem import Shape
from analysis.core.results_io import NOISE_SCALING, file_kind, read_table
from analysis.studies import noise, noise_scaling

TINY = Shape(256, 16, 512)


def test_candidates_follow_each_rule_at_the_shape():
    runs = {run.label: run for run in noise_scaling.candidates(Shape(65536, 128, 16384), torch.bfloat16)}
    assert list(runs) == list(noise_scaling.CANDIDATES)
    # lce's CUDA auto: balanced at its 2048-row floor; torch 2.13: compact, aspect_ratio:2 = 256 chunks here
    assert runs["lce auto cuda"].spec.policy == "balanced" and runs["lce auto cuda"].spec.chunking == "rows:2048"
    assert runs["torch 2.13 auto"].spec.policy == "compact" and runs["torch 2.13 auto"].spec.chunking == "rows:256"
    assert runs["lce compact chunks=16"].spec.chunking == "rows:4096"
    assert runs["lce auto cpu"].device == "cpu" and runs["lce auto cpu"].spec.chunking == "auto"
    assert runs["unfused"].spec.op == "reference" and runs["lce balanced chunks=256"].layout == "cuda"
    # below auto's floor every row is in one chunk; torch's aspect ratio: 128 / ceil(512 / 16) / 2 = 2 rows
    small = {run.label: run for run in noise_scaling.candidates(Shape(128, 16, 512), torch.float16)}
    assert small["lce auto cuda"].spec.chunking == "rows:128" and small["torch 2.13 auto"].spec.chunking == "rows:2"
    assert small["lce compact rows=2048"].spec.chunking == "rows:128"
    with pytest.raises(ValueError, match="unknown candidates"):
        noise_scaling.candidates(TINY, torch.bfloat16, ("lce fastest",))
    assert "lce auto cpu" not in {run.label for run in noise_scaling.candidates(TINY, torch.bfloat16,
                                                                                 ("unfused",), device="cuda")}


def test_cases_are_seed_major_and_the_trained_family_stops_at_its_dump():
    grid = (noise_scaling.Axis(128, (1024, 2048, 4096), ("random", "trained:final"), seeds=(0, 1)),)
    planned = noise_scaling.cases(grid)
    assert noise_scaling.family_rows("trained:final", 128, 16384) == 2048
    assert noise_scaling.family_rows("trained:final", 512, 16384) == 0
    assert noise_scaling.family_rows("random", 128, 16384) is None
    trained = [(case.seed, case.shape.N) for case in planned if case.family == "trained:final"]
    # all 2048 rows at seed 0 only (every seed would draw the same rows), none beyond
    assert sorted(set(trained)) == [(0, 1024), (0, 2048), (1, 1024)]
    assert [case.seed for case in planned] == sorted(case.seed for case in planned)
    assert len(planned) == 2 * (3 + 2) + 2 * (3 + 1)  # dtypes x (random's N + trained's), seeds 0 and 1
    assert all(case.keys()[0][-1] == "lce auto cuda" for case in planned)


def test_a_case_measures_what_the_noise_study_measures():
    case = noise_scaling.Case("calibrated", "bfloat16", 1, TINY, ("lce compact chunks=16", "unfused"))
    table = noise_scaling.measure_case(case).set_index("candidate")
    inputs = make_inputs(TINY, torch.bfloat16, family="calibrated", seed=1, bias=False)
    runs = noise_scaling.candidates(TINY, torch.bfloat16, case.candidates)
    expected = {row["impl"]: row for row in noise.measure_inputs(inputs, runs)}
    for name in case.candidates:
        for column in ("weight_bias_over_noise", "weight_error_over_noise", "input_error_over_noise"):
            assert table.loc[name, column] == pytest.approx(expected[name][column], rel=1e-12)
    assert table.loc["lce compact chunks=16", "num_chunks"] == 16
    # the calibrated family's expected gradient is zero: the batch gradient is about its own noise
    assert 0.7 < table["gradient_over_noise"].iloc[0] < 1.3


def test_the_run_appends_each_case_and_resumes_where_it_stopped(tmp_path):
    path = tmp_path / noise_scaling.SCALING_FILE
    planned = noise_scaling.cases((noise_scaling.Axis(16, (64, 128), ("random",), dtypes=("bfloat16",),
                                                      seeds=(0,), candidates=("lce auto cuda", "unfused"),
                                                      classes=256),))
    assert noise_scaling.run_cases(path, planned[:1], progress=False, log=lambda _: None) == 2
    assert noise_scaling.run_cases(path, planned, progress=False, log=lambda _: None) == 2  # only N=128's
    assert noise_scaling.run_cases(path, planned, progress=False, log=lambda _: None) == 0
    table = read_table(path)
    assert file_kind(path) == NOISE_SCALING.name and list(table.columns) == list(NOISE_SCALING.columns)
    assert sorted(table["N"]) == [64, 64, 128, 128] and (table["wall_s"] > 0).all()
    assert noise_scaling.done_keys(path) == {key for case in planned for key in case.keys()}
