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


@pytest.fixture(scope="module")
def full_run(tmp_path_factory) -> tuple[Path, list[Path]]:
    """``make_figures`` from the fixture into a fresh folder, once per module (measuring made to fail)."""
    def no_measuring(*args, **kwargs):
        raise AssertionError("figures are drawn from results files only")

    out = tmp_path_factory.mktemp("figures")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(memory, "allocation_trace", no_measuring)
        patch.setattr(memory, "measure_peak", no_measuring)
        return out, make_figures(TESTDATA, out, command="python -m analysis figures")

@pytest.mark.slow  # draws every figure

def test_every_figure_builds_from_the_fixture_without_measuring(full_run):
    tmp_path, written = full_run
    names = {path.name for path in written}
    for stem in STEMS:
        assert f"{stem}.png" in names
    assert not [name for name in names if not name.endswith(".png") and name != "README.md"]  # one file per figure
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
def test_importing_the_plots_leaves_the_backend_alone():
    """Notebooks display figures inline: no analysis module may switch matplotlib to a file-only backend (the style
    module, and every figure module through analysis.report.figures, in one fresh process)."""
    code = "import analysis.report.style, analysis.report.figures, matplotlib; print(matplotlib.get_backend())"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": "svg"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().lower() == "svg"


def test_figures_are_made_outside_pyplot_so_notebooks_show_only_what_they_display():
    import matplotlib.pyplot as plt

    before = plt.get_fignums()
    table = prepare(load_results([FIXTURE]))
    assert draw_all(table) and plt.get_fignums() == before


def test_a_figure_is_saved_once_as_an_opaque_png_with_the_same_bytes_every_time(tmp_path):
    """One RGB PNG per figure at PNG_DPI, no SVG beside it; the same figure gives the same bytes (no timestamp)."""
    from PIL import Image

    from analysis.report.figures import PNG_DPI, save
    from analysis.report.style import CaptionedFigure, new_figure

    def drawn() -> CaptionedFigure:
        fig = new_figure(4.0, 3.0)
        fig.subplots().plot([1, 2, 3], [3, 1, 2], label="line")
        return CaptionedFigure(fig, "example", "caption")

    first = save(drawn(), tmp_path / "a")
    second = save(drawn(), tmp_path / "b")
    assert first.read_bytes() == second.read_bytes() and [p.name for p in first.parent.iterdir()] == ["example.png"]
    with Image.open(first) as image:
        assert image.mode == "RGB" and round(image.info["dpi"][0]) == PNG_DPI
        assert image.width == pytest.approx(4.0 * PNG_DPI, rel=0.2)  # bbox "tight" trims the margins a little


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

@pytest.mark.slow  # draws every figure

def test_only_saves_the_named_figures_leaves_the_others_and_writes_the_whole_index(full_run, tmp_path, capsys):
    """``figures --only A,B --only C``: A, B and C redrawn, every other file untouched, README.md as a full run's."""
    import shutil

    from analysis.cli import main

    shutil.copytree(full_run[0], tmp_path, dirs_exist_ok=True, copy_function=shutil.copy2)
    full = full_run[1]
    before = {path.name: (path.read_bytes(), path.stat().st_mtime_ns) for path in tmp_path.iterdir()}
    index = (tmp_path / "README.md").read_text()
    chosen = ["time_vs_shape", "gradient_bias", "memory_trace"]
    for stem in chosen:
        (tmp_path / f"{stem}.png").unlink()
    assert main(["figures", "--results", str(TESTDATA), "--out", str(tmp_path),
                 "--only", "time_vs_shape,gradient_bias", "--only", "memory_trace"]) == 0
    printed = {Path(line).name for line in capsys.readouterr().out.split()}
    assert printed == {f"{stem}.png" for stem in chosen} | {"README.md"}
    assert (tmp_path / "README.md").read_text() == index
    assert {path.name for path in tmp_path.iterdir()} == {path.name for path in full}
    for name, (content, mtime) in before.items():
        if name.rsplit(".", 1)[0] not in chosen and name != "README.md":
            path = tmp_path / name
            assert path.read_bytes() == content and path.stat().st_mtime_ns == mtime, name


def test_only_splits_commas_and_an_unknown_name_lists_the_valid_ones():
    from analysis.report.figures import chosen_figures, only_stems
    from analysis.report.style import CaptionedFigure

    assert only_stems(None) is None and only_stems([]) is None
    assert only_stems(["a, b", "c", "a"]) == ["a", "b", "c"]
    figures = [CaptionedFigure(None, stem, "") for stem in ("rare_rows", "chunk_sweep")]
    assert [figure.stem for figure in chosen_figures(figures, ["chunk_sweep"])] == ["chunk_sweep"]
    assert chosen_figures(figures, None) == figures
    with pytest.raises(SystemExit, match=r"unknown figure name\(s\): rare_row\b.*rare_rows, chunk_sweep"):
        chosen_figures(figures, ["rare_row"])


def _three_shapes() -> pd.DataFrame:
    """The fixture's CPU rows (random family, N=16) also as the calibrated family, at a smaller shape (N=8, random
    only) and a larger one (N=64, calibrated only)."""
    table = prepare(load_results([FIXTURE]))
    cpu = table[table["device"] == "cpu"]
    return pd.concat([cpu, cpu.assign(family="calibrated"), cpu.assign(N=8),
                      cpu.assign(N=64, family="calibrated")], ignore_index=True)


def test_error_vs_memory_has_a_panel_per_dtype_at_the_largest_shape_of_every_family():
    from matplotlib.collections import PathCollection

    from analysis.report.nb04_pareto import main_shape, plot_error_vs_memory

    table = _three_shapes()
    assert main_shape(table) == (16, 8, 64)  # N=64 is larger but measured on one family only
    figure = plot_error_vs_memory(table, "cpu")
    panels = [ax for ax in figure.figure.axes if ax.get_visible()]
    assert [ax.get_title() for ax in panels] == ["bfloat16", "float32"] and len(figure.figure.axes) == 2
    assert "N=16 D=8 C=64" in figure.figure._suptitle.get_text() and "N=16 D=8 C=64" in figure.caption
    assert "error_vs_memory_cpu_all_shapes" in figure.caption
    for ax in panels:
        fronts = {line.get_label() for line in ax.get_lines() if line.get_label().startswith("Pareto front")}
        assert fronts == {"Pareto front (calibrated)", "Pareto front (random)"}
        markers = [c for c in ax.collections if isinstance(c, PathCollection)]
        assert min(size for c in markers for size in c.get_sizes()) >= 20  # readable, not dots
        assert any(text.get_text().startswith("auto") for text in ax.texts), "the auto pick is labelled"
    legend = [text.get_text() for text in figure.figure.legends[0].get_texts() if text.get_text().strip()]
    assert {"calibrated and its front", "random and its front", "lce: filled", "torch: open"} <= set(legend)
    assert len(legend) <= 12


def test_the_other_shapes_go_to_an_appendix_without_empty_slots():
    from analysis.report.nb04_pareto import plot_error_vs_memory_all_shapes

    figure = plot_error_vs_memory_all_shapes(_three_shapes(), "cpu")
    assert figure.stem == "error_vs_memory_cpu_all_shapes"
    titles = [ax.get_title() for ax in figure.figure.axes]
    assert titles == ["bfloat16, N=8 D=8 C=64 (random)", "float32, N=8 D=8 C=64 (random)",
                      "bfloat16, N=64 D=8 C=64 (calibrated)", "float32, N=64 D=8 C=64 (calibrated)"]
    assert all(ax.get_visible() for ax in figure.figure.axes)
    single = prepare(load_results([FIXTURE]))
    assert plot_error_vs_memory_all_shapes(single, "cpu") is None  # one shape: nothing for an appendix


def test_rare_rows_ticks_are_short_and_the_caption_names_what_each_row_stands_for():
    from analysis.report.nb05_realistic_inputs import plot_rare_rows

    values = {"lce auto cpu acc=default auto": 1.0, "lce accurate cpu acc=fp32 auto": 1.0,
              "lce compact cuda acc=fp32 aspect_ratio:2": 30.0, "torch default": 8.0}
    rows = [dict(impl=impl, dtype=dtype, N=64, D=8, C=256, seed=seed, bin=name, row_p99=value * (1 + seed),
                 row_max=2 * value, grad_weight_floors=value, date="2026-01-01")
            for impl, value in values.items() for dtype in ("float16", "bfloat16") for seed in (0, 1)
            for name in ("never", "1-2", "3-15", "16+", "all")]
    figure = plot_rare_rows(pd.DataFrame(rows))
    ticks = [tick.get_text() for tick in figure.figure.axes[0].get_yticklabels()]
    assert ticks == ["lce auto (cpu) [+1]", "lce compact (cuda, acc=fp32, ar:2)", "torch default"]
    assert "lce auto (cpu) [+1] = lce auto cpu acc=default auto = lce accurate cpu acc=fp32 auto" in figure.caption


def _head_rows() -> pd.DataFrame:
    """Head training rows: the fp32 arm's seeds 2 millinats apart; compact@256's rare gap 10 millinats (beyond
    that spread, every seed), balanced's gaps zero on average."""
    from analysis.core.buckets import BUCKETS

    rows = []
    common = dict(optimizer="adamw", D=16, C=256, batch_rows=32, pool_rows=4096, setting="full")
    for seed in (0, 1, 2):
        for step in (0, 100, 1000):
            for bucket in ("all", *BUCKETS):
                fp32 = 1.0 + 0.001 * seed
                gap = {"fp32": 0.0, "bf16 balanced@64": 1e-4 * (seed - 1),
                       "bf16 compact@256": (0.01 + 1e-5 * seed) if bucket == "rare" and step else 0.0}
                for arm, extra in gap.items():
                    rule = "lce auto" if arm == "bf16 balanced@64" else ""
                    rows.append(dict(common, arm=arm, rule=rule, dtype="float32" if arm == "fp32" else "bfloat16",
                                     seed=seed, step=step, bucket=bucket, metric="heldout_loss", value=fp32 + extra))
                    if arm != "fp32" and bucket == "all":
                        for metric in ("bias_over_noise", "error_over_noise"):
                            rows.append(dict(common, arm=arm, rule=rule, dtype="bfloat16", seed=seed, step=step,
                                             bucket=bucket, metric=metric, value=0.1))
    return pd.DataFrame(rows)


def test_gap_vs_step_draws_the_fp32_seed_spread_and_says_which_arms_leave_it():
    from analysis.report.nb10_long_horizon import plot_gap_vs_step

    figure = plot_gap_vs_step(_head_rows(), "adamw")
    title = figure.figure._suptitle.get_text()
    assert "bf16 compact@256 (rare) leaves the fp32 head's seed-spread band" in title
    assert "the other arm stays inside it" in title
    axes = figure.figure.axes
    assert len(axes) == 4 and "> 0: worse than fp32" in axes[0].get_ylabel()
    for ax in axes:
        band = next(c for c in ax.collections if "seed spread" in c.get_label())
        heights = band.get_paths()[0].vertices[:, 1]
        assert heights.max() == pytest.approx(2.0) and heights.min() == pytest.approx(-2.0)  # ±2 millinats
    assert "positive = worse than fp32" in figure.caption and "seed" in figure.caption
