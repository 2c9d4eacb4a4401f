"""Every figure builds from small fixture results files (analysis/testdata), and drawing never measures or saves."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from matplotlib.figure import Figure

from analysis import memory
from analysis.figures import make_figures
from analysis.pareto import prepare
from analysis.plots import draw_all, plot_buffer_breakdown, plot_memory_model, plot_memory_trace
from analysis.results_io import COLUMNS, MEMORY_BREAKDOWN, MEMORY_TRACE, load_kind, load_results

TESTDATA = Path(__file__).resolve().parent.parent / "analysis" / "testdata"
FIXTURE = TESTDATA / "tiny_results.csv"
ROOT = TESTDATA.parent.parent
STEMS = ("error_vs_memory_cpu", "error_vs_memory_cuda-emulated", "error_vs_chunks_cpu", "memory_measured_vs_modeled",
         "time_vs_shape", "memory_breakdown", "memory_trace")


def test_fixture_has_the_current_columns():
    assert list(pd.read_csv(FIXTURE).columns) == list(COLUMNS)
    for kind in (MEMORY_BREAKDOWN, MEMORY_TRACE):
        paths, table = load_kind(TESTDATA, kind.name)
        assert len(paths) == 1 and list(table.columns) == list(kind.columns) and len(table)


def test_every_figure_builds_from_the_fixture_without_measuring(tmp_path, monkeypatch):
    def no_measuring(*args, **kwargs):
        raise AssertionError("figures are drawn from results files only")

    monkeypatch.setattr(memory, "allocation_trace", no_measuring)
    monkeypatch.setattr(memory, "measure_peak", no_measuring)
    written = make_figures(TESTDATA, tmp_path, command="python -m analysis figures")
    names = {path.name for path in written}
    for stem in STEMS:
        assert f"{stem}.png" in names and f"{stem}.svg" in names
    for path in written:
        assert path.stat().st_size > 0
    index = (tmp_path / "README.md").read_text()
    for data in ("tiny_results.csv", "memory_breakdown.csv", "memory_trace.csv"):
        assert f"analysis/testdata/{data}" in index
    assert "## Verdicts" in index and "N=64 D=64 C=128, bfloat16" in index


def test_plot_functions_return_figures_and_write_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    table = prepare(load_results([FIXTURE]))
    _, breakdown = load_kind(TESTDATA, MEMORY_BREAKDOWN.name)
    _, trace = load_kind(TESTDATA, MEMORY_TRACE.name)
    drawn = draw_all(table, memory_breakdown=breakdown, memory_trace=trace)
    assert [figure.stem for figure in drawn if figure.stem in STEMS] == list(STEMS)
    for figure in drawn:
        assert isinstance(figure.figure, Figure) and figure.figure.axes and figure.caption
    assert list(tmp_path.iterdir()) == []
    assert plot_buffer_breakdown(breakdown.iloc[0:0]) is None and plot_memory_trace(trace.iloc[0:0], breakdown) is None


def test_figures_without_data_are_skipped():
    table = prepare(load_results([FIXTURE]))
    assert plot_memory_model(table[table["op"] == "reference"]) is None
    assert draw_all(table.iloc[0:0]) == []


@pytest.mark.parametrize("module", ["analysis.plots", "analysis.figures"])
def test_importing_the_plots_leaves_the_backend_alone(module):
    """Notebooks display figures inline: no analysis module may switch matplotlib to a file-only backend."""
    code = f"import {module}, matplotlib; print(matplotlib.get_backend())"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": "svg"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().lower() == "svg"
