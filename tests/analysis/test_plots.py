"""Every figure builds from small fixture results files (analysis/testdata), and drawing never measures or saves."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from matplotlib.figure import Figure

from analysis.core import memory
from analysis.core.results_io import COLUMNS, MEMORY_BREAKDOWN, MEMORY_TRACE, load_kind, load_results
from analysis.judge.pareto import prepare
from analysis.report.figures import draw_all, make_figures
from analysis.report.nb03_memory import plot_buffer_breakdown, plot_memory_model, plot_memory_trace

TESTDATA = Path(__file__).resolve().parents[2] / "analysis" / "testdata"
FIXTURE = TESTDATA / "tiny_results.csv"
ROOT = TESTDATA.parent.parent
STEMS = ("error_vs_memory_cpu", "error_vs_memory_cuda-emulated", "error_vs_chunks_cpu", "row_errors_cpu",
         "gradient_bias", "memory_measured_vs_modeled", "time_vs_shape", "memory_breakdown", "memory_trace")


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


@pytest.mark.slow
@pytest.mark.parametrize("module", ["analysis.report.style", "analysis.report.figures"])
def test_importing_the_plots_leaves_the_backend_alone(module):
    """Notebooks display figures inline: no analysis module may switch matplotlib to a file-only backend."""
    code = f"import {module}, matplotlib; print(matplotlib.get_backend())"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": "svg"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().lower() == "svg"


def test_figures_are_made_outside_pyplot_so_notebooks_show_only_what_they_display():
    import matplotlib.pyplot as plt

    before = plt.get_fignums()
    table = prepare(load_results([FIXTURE]))
    assert draw_all(table) and plt.get_fignums() == before


def test_a_flat_result_looks_flat():
    """Errors all near 67 floors: the error axis reaches down to the floor (1) and the memory axis spans 4x."""
    from analysis.report.nb04_pareto import plot_error_vs_memory
    from analysis.report.style import COST_SPAN, ERROR_SPAN

    table = prepare(load_results([FIXTURE]))
    flat = table[(table["device"] == "cpu") & (table["dtype"] == table["dtype"].iloc[0])].copy()
    flat = flat[(flat["N"] == flat["N"].iloc[0]) & (flat["C"] == flat["C"].iloc[0])]
    flat["grad_input_fro_in_floors"] = 67.4 + 0.01 * (flat.index % 5)
    flat["grad_weight_fro_in_floors"] = flat["grad_input_fro_in_floors"]
    flat["grad_bias_fro_in_floors"] = flat["grad_input_fro_in_floors"]
    flat["peak_bytes_measured"] = 2.13 * 2**20 + 1000 * (flat.index % 3)
    ax = plot_error_vs_memory(prepare(flat), "cpu").figure.axes[0]
    low, high = ax.get_ylim()
    assert low <= 1.0 and high / low >= ERROR_SPAN and high >= 67.5
    left, right = ax.get_xlim()
    assert right / left >= COST_SPAN * 0.999 and left < 2.13 < right


def test_breakdown_labels_fit_inside_their_segments():
    _, breakdown = load_kind(TESTDATA, MEMORY_BREAKDOWN.name)
    figure = plot_buffer_breakdown(breakdown).figure
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    ax = figure.axes[0]
    bars = [patch.get_window_extent(renderer) for patch in ax.patches]
    labels = [text for text in ax.texts if text.get_text()]
    assert labels, "the widest segments carry their buffer's name"
    for text in labels:
        box = text.get_window_extent(renderer)
        centre = ((box.x0 + box.x1) / 2, (box.y0 + box.y1) / 2)
        holder = next(bar for bar in bars if bar.contains(*centre))
        assert box.width <= holder.width and box.height <= holder.height, text.get_text()


def test_captions_read_as_markdown():
    from analysis.report.style import CaptionedFigure

    figure = CaptionedFigure(None, "x", "time vs N*D*C for lce_auto")
    assert figure.markdown == r"*time vs N\*D\*C for lce\_auto*"


def test_error_figures_draw_seed_medians_and_state_the_interval():
    """The fixture has 2 seeds on the CPU: each line point is the median of its seeds, the band their percentiles."""
    import numpy as np

    from analysis.judge.pareto import INTERVAL
    from analysis.report.nb02_accuracy import plot_error_vs_chunks
    from analysis.report.nb05_realistic_inputs import plot_gradient_bias

    table = prepare(load_results([FIXTURE]))
    figure = plot_error_vs_chunks(table, "cpu")
    assert "one row of panels per input family" in figure.caption and INTERVAL in figure.caption
    assert "random: 2 seeds" in figure.caption
    ax = figure.figure.axes[0]
    line = next(line for line in ax.get_lines() if line.get_label() == "lce auto")
    rows = table[(table["device"] == "cpu") & (table["dtype"] == "bfloat16") & (table["op"] == "lce")
                 & (table["policy"] == "auto") & (table["acc_dtype"] == "default")]
    expected = rows.groupby("num_chunks")["grad_weight_fro_in_floors"].median().sort_index()
    assert list(line.get_xdata()) == list(expected.index) and np.allclose(line.get_ydata(), expected.to_numpy())
    bias = plot_gradient_bias(table)
    low, high = bias.figure.axes[0].get_ylim()
    assert low == -high and high >= 2.0  # symmetric, at least ±2 floors


def test_row_errors_show_the_rows_next_to_the_frobenius_error():
    from analysis.report.nb05_realistic_inputs import ROW_METRICS, plot_row_errors

    table = prepare(load_results([FIXTURE]))
    figure = plot_row_errors(table, "cpu")
    assert [ax.get_title() for ax in figure.figure.axes] == ["random: bfloat16, N=16 D=8 C=64",
                                                             "random: float32, N=16 D=8 C=64"]
    ticks = [tick.get_text() for tick in figure.figure.axes[0].get_xticklabels()]
    assert ticks[0] == "lce\nauto" and "reference" in ticks
    legend = {text.get_text() for text in figure.figure.legends[0].get_texts()}
    assert {text for text, _ in ROW_METRICS.values()} <= legend
    assert plot_row_errors(table, "cuda") is None


def test_untimed_rows_are_left_out_of_the_time_figure():
    from analysis.report.nb04_pareto import plot_time_vs_shape

    table = prepare(load_results([FIXTURE]))
    assert plot_time_vs_shape(table[table["device"] == "cuda-emulated"]) is None
    titles = [ax.get_title() for ax in plot_time_vs_shape(table).figure.axes]
    assert not any("cuda-emulated" in title for title in titles)
