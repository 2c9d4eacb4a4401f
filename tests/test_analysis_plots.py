"""Every figure builds from a tiny fixture CSV (made by the ``tiny`` grid, committed under analysis/testdata)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from analysis.cli import make_figures
from analysis.pareto import prepare
from analysis.plots import draw_all, plot_memory_model
from analysis.results_io import COLUMNS, load_results

FIXTURE = Path(__file__).resolve().parent.parent / "analysis" / "testdata" / "tiny_results.csv"


def test_fixture_has_the_current_columns():
    assert list(pd.read_csv(FIXTURE).columns) == list(COLUMNS)


def test_every_figure_builds_from_the_fixture(tmp_path):
    written = make_figures(FIXTURE.parent, tmp_path, command="python -m analysis figures")
    names = {path.name for path in written}
    for stem in ("error_vs_memory_cpu", "error_vs_memory_cuda-emulated", "error_vs_chunks_cpu",
                 "memory_measured_vs_modeled", "time_vs_shape", "memory_breakdown", "memory_trace"):
        assert f"{stem}.png" in names and f"{stem}.svg" in names
    for path in written:
        assert path.stat().st_size > 0
    index = (tmp_path / "README.md").read_text()
    assert "analysis/testdata/tiny_results.csv" in index and "## Verdicts" in index


def test_figures_without_data_are_skipped(tmp_path):
    table = prepare(load_results([FIXTURE]))
    assert plot_memory_model(table[table["op"] == "reference"], tmp_path) is None
    assert draw_all(table.iloc[0:0], tmp_path) == []
