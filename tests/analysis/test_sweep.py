"""analysis.sweep.run: resumable after a crash (between rows or inside one), shards that partition a grid, the CLI."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from analysis.cli import main
from analysis.core.results_io import COLUMNS, read_rows
from analysis.core.run_config import RunConfig
from analysis.sweep.grids import GRIDS, get_grid
from analysis.sweep.run import measure_run, parse_shard, results_path, run_grid

ROOT = Path(__file__).resolve().parents[2]


class InjectedCrash(BaseException):
    """Stands for a killed process: not an Exception, so the sweep does not record it."""


def _crashing_measurer(crash_on: int):
    calls = {"n": 0}

    def measure(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == crash_on:
            raise InjectedCrash
        return measure_run(*args, **kwargs)

    return measure


def test_resume_after_crash_neither_duplicates_nor_loses_rows(tmp_path):
    grid = get_grid("tiny")
    with pytest.raises(InjectedCrash):
        run_grid(grid, folder=tmp_path, progress=False, measure=_crashing_measurer(crash_on=5))
    path = results_path("tiny", folder=tmp_path)
    before = read_rows(path)
    assert [row["key"] for row in before] == [c.key for c in grid.configs[:4]]  # only the run in flight is lost

    summary = run_grid(grid, folder=tmp_path, progress=False)
    after = read_rows(path)
    assert summary.skipped_done == 4 and summary.ran == len(grid.configs) - 4 and summary.errors == 0
    assert sorted(row["key"] for row in after) == sorted(c.key for c in grid.configs)
    assert after[:4] == before  # finished rows are kept as they were
    assert all(row["status"] == "ok" for row in after)
    assert run_grid(grid, folder=tmp_path, progress=False).ran == 0  # a third run has nothing left


def test_resume_after_an_unfinished_last_row(tmp_path):
    """A crash in the middle of writing a row leaves a line without newline: resuming reruns that run only."""
    grid = get_grid("tiny")
    path = results_path("tiny", folder=tmp_path)
    run_grid(grid, folder=tmp_path, progress=False, configs=grid.configs[:2])
    complete = path.read_bytes()
    path.write_bytes(complete + f"sweep,{grid.configs[2].key},tiny,reference,flo".encode())
    assert [row["key"] for row in read_rows(path)] == [c.key for c in grid.configs[:2]]
    summary = run_grid(grid, folder=tmp_path, progress=False, configs=grid.configs[:3])
    assert summary.skipped_done == 2 and summary.ran == 1
    assert path.read_bytes().startswith(complete)
    assert [row["key"] for row in read_rows(path)] == [c.key for c in grid.configs[:3]]
    assert len(pd.read_csv(path)) == 3


def test_an_exception_in_one_run_is_recorded_and_the_sweep_goes_on(tmp_path):
    grid = get_grid("tiny")
    configs = list(grid.configs[:3])
    configs[1] = dataclasses.replace(configs[1], policy="no-such-policy")
    summary = run_grid(grid, folder=tmp_path, progress=False, configs=configs)
    rows = read_rows(summary.path)
    assert [row["status"] for row in rows] == ["ok", "error", "ok"]
    assert "acc_policy" in rows[1]["note"] and summary.errors == 1


@pytest.mark.parametrize("name", sorted(GRIDS))
@pytest.mark.parametrize("count", [1, 2, 3, 7])
def test_shards_partition_every_grid(name, count):
    grid = get_grid(name)
    shards = [grid.shard(index, count) for index in range(1, count + 1)]
    keys = [config.key for shard in shards for config in shard]
    assert len(keys) == len(set(keys)) == len(grid.configs)
    assert set(keys) == {config.key for config in grid.configs}


def test_shard_parsing_and_paths(tmp_path):
    assert parse_shard("2/4") == (2, 4)
    for bad in ("0/4", "5/4", "2", "a/b"):
        with pytest.raises(ValueError, match="shard"):
            parse_shard(bad)
    assert results_path("quick", (2, 4), tmp_path).name == "quick.shard-2-of-4.csv"
    with pytest.raises(ValueError, match="grid"):
        get_grid("nope")


def test_rows_carry_config_and_provenance_columns(tmp_path):
    grid = get_grid("tiny")
    summary = run_grid(grid, folder=tmp_path, progress=False, configs=grid.configs[:2])
    table = pd.read_csv(summary.path)
    assert list(table.columns) == list(COLUMNS)
    for column in ("lce_version", "torch_version", "device_name", "cpu_model", "git_revision", "date"):
        assert table[column].notna().all(), column
    lce_row = table[table["op"] == "lce"].iloc[0]
    assert lce_row["num_chunks"] >= 1 and lce_row["peak_bytes_modeled"] > 0 and lce_row["peak_bytes_measured"] > 0
    assert RunConfig(**{f.name: lce_row[f.name] for f in dataclasses.fields(RunConfig)
                        if f.name not in ("policy", "chunking")}, policy=lce_row["policy"],
                     chunking=lce_row["chunking"]).key == lce_row["key"]


@pytest.mark.slow
def test_cli_help():
    result = subprocess.run([sys.executable, "-m", "analysis", "--help"], cwd=ROOT, capture_output=True, text=True,
                            timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0 and "reproduce" in result.stdout and "sweep" in result.stdout


@pytest.mark.slow
def test_tiny_reproduce_end_to_end(tmp_path, capsys):
    results, figures = tmp_path / "results", tmp_path / "figures"
    assert main(["reproduce", "--grid", "tiny", "--results", str(results), "--out", str(figures),
                 "--no-progress"]) == 0
    assert len(pd.read_csv(results / "tiny.csv")) == len(get_grid("tiny").configs)
    index = (figures / "README.md").read_text()
    assert {path.name for path in results.iterdir()} == {"tiny.csv", "memory_breakdown.csv", "memory_trace.csv",
                                                         "reproduce.csv"}
    timed = pd.read_csv(results / "reproduce.csv")
    assert list(timed["grid"]) == ["tiny"] and list(timed["runs"]) == [len(get_grid("tiny").configs)]
    assert (timed["total_s"] >= timed["sweep_s"] + timed["figures_s"]).all()
    for stem in ("error_vs_memory_cpu", "error_vs_chunks_cpu", "memory_measured_vs_modeled", "time_vs_shape",
                 "error_vs_memory_cuda-emulated", "memory_breakdown", "memory_trace"):
        assert (figures / f"{stem}.png").stat().st_size > 0 and (figures / f"{stem}.svg").exists()
        assert f"## {stem}" in index
    assert "python -m analysis reproduce --grid tiny" in index and "auto = " in index
    assert main(["sweep", "--grid", "tiny", "--results", str(results), "--no-progress"]) == 0
    assert "0 run(s)" in capsys.readouterr().out  # resumed: nothing left to run
    assert main(["reproduce", "--grid", "tiny", "--resume", "--results", str(results), "--out", str(figures),
                 "--no-progress"]) == 0
    assert "0 run(s)" in capsys.readouterr().out


@pytest.mark.slow
def test_workers_write_the_same_rows_as_one_process(tmp_path):
    """Two worker processes (spawned) fill one file: every run once, the same errors as a serial sweep."""
    grid = get_grid("tiny")
    serial = run_grid(grid, folder=tmp_path / "serial", progress=False, workers=1)
    parallel = run_grid(grid, folder=tmp_path / "parallel", progress=False, workers=2)
    assert serial.ran == parallel.ran == len(grid.configs) and parallel.errors == 0
    one, two = (pd.read_csv(summary.path).set_index("key").sort_index() for summary in (serial, parallel))
    assert sorted(two.index) == sorted(c.key for c in grid.configs)
    error_columns = [c for c in one.columns if c.endswith("_fro_in_floors")]
    pd.testing.assert_frame_equal(one[error_columns], two[error_columns])
    again = run_grid(grid, folder=tmp_path / "parallel", progress=False, workers=2)
    assert again.ran == 0 and again.skipped_done == len(grid.configs)


def test_a_custom_measure_cannot_be_sent_to_workers(tmp_path):
    with pytest.raises(ValueError, match="workers=1"):
        run_grid(get_grid("tiny"), folder=tmp_path, progress=False, workers=2, measure=lambda *a, **k: {})
