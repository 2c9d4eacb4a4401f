"""analysis.studies.bench: shape parsing, a tiny real bench run (with a fresh-process memory figure), ratios, figure."""

from __future__ import annotations

import pandas as pd
import pytest

from analysis.core.problem import Shape, parse_shape
from analysis.core.results_io import BENCH
from analysis.report.figures import save
from analysis.report.nb04_pareto import plot_bench_scaling, plot_chunk_sweep
from analysis.studies import bench


def test_parse_shape():
    assert parse_shape("64x8x256") == Shape(64, 8, 256)
    with pytest.raises(ValueError, match="NxDxC"):
        parse_shape("64x8")


@pytest.mark.slow
def test_against_a_baseline_revision_times_both_in_fresh_processes_and_cleans_up():
    import subprocess

    from analysis.paths import ROOT

    worktrees = subprocess.run(["git", "worktree", "list"], cwd=ROOT, capture_output=True, text=True).stdout
    table = bench.against_baseline(Shape(32, 8, 64), ("float32",), "HEAD", rounds=2, calls=1)
    assert sorted(table["impl"]) == ["lce now", "lce@HEAD"]
    assert (table["metric"] == "time_s").all() and (table["value"] > 0).all() and (table["repeats"] == 2).all()
    assert len(BENCH.rows(table)) == len(table)
    assert subprocess.run(["git", "worktree", "list"], cwd=ROOT, capture_output=True, text=True).stdout == worktrees


@pytest.mark.slow
def test_tiny_bench_measures_time_memory_and_floor():
    # 1024 rows: two of the fp32 default's fixed 512-row chunks (a batch-invariant call pads fewer rows to 512)
    n = 1024
    table = bench.run_bench(Shape(n, 16, 512), ("float32",), repeats=1, impls=("lce", "torch", "unfused"))
    value = {(row.impl, row.metric): row.value for row in table.itertuples()}
    assert {("lce", "time_s"), ("torch", "peak_bytes"), ("3-GEMM floor", "time_s")} <= set(value)
    # The unfused reference materializes (n, 512) fp32 logits and their gradient: at least 2 x 2 MiB.
    assert value[("unfused", "peak_bytes")] >= 2 * n * 512 * 4
    assert 0 < value[("lce", "peak_bytes")] < value[("unfused", "peak_bytes")] + n * 16 * 4 + 512 * 16 * 4
    assert table["git_revision"].notna().all() and (table["torch_version"] != "").all()
    assert len(BENCH.rows(table)) == len(table)  # every column is a column of the bench results file
    ratios = bench.ratios(table)
    assert ratios.loc[0, "lce/torch time"] == pytest.approx(value[("lce", "time_s")] / value[("torch", "time_s")])


def _synthetic():
    rows = []
    for impl, speed in (("lce", 1.0), ("torch", 2.0), ("unfused", 1.5), ("3-GEMM floor", 0.8)):
        for n in (256, 512):
            for c in (1024, 2048):
                if n != 512 and c != 2048:
                    continue
                rows.append(dict(impl=impl, dtype="float32", N=n, D=8, C=c, metric="time_s",
                                 value=speed * n * c * 1e-6, date="2026-01-01", cpu_model="CPU A",
                                 cpu_gemms=NATIVE))
                if impl != "3-GEMM floor":
                    rows.append(dict(impl=impl, dtype="float32", N=n, D=8, C=c, metric="peak_bytes",
                                     value=speed * c * 1e3, date="2026-01-01", cpu_model="CPU A",
                                     cpu_gemms=NATIVE))
    # A second CPU, and CPU A under an AVX2 stand-in (another CPU kind), measured at the base shape only, and later:
    # neither must join CPU A's lines.
    rows.append(dict(impl="lce", dtype="float32", N=512, D=8, C=2048, metric="time_s", value=99.0,
                     date="2026-02-01", cpu_model="CPU B", cpu_gemms=NATIVE))
    rows.append(dict(impl="lce", dtype="float32", N=512, D=8, C=2048, metric="time_s", value=98.0,
                     date="2026-02-01", cpu_model="CPU A", cpu_gemms=STAND_IN))
    return pd.DataFrame(rows)


NATIVE = "bfloat16 native, float16 native"
STAND_IN = "bfloat16 emulated, float16 emulated; ISA capped: ONEDNN_MAX_CPU_ISA=AVX2"


def test_bench_figure_builds(tmp_path):
    figure = plot_bench_scaling(_synthetic())
    assert figure is not None and len(figure.figure.axes) == 4
    assert "CPU A" in figure.caption and "CPU B" not in figure.caption
    plotted = [value for ax in figure.figure.axes for line in ax.get_lines() for value in line.get_ydata()]
    assert 99.0 not in plotted and 98.0 not in plotted, "a time from another CPU kind was drawn"
    png = save(figure, tmp_path)
    assert png.stat().st_size > 0 and [path.name for path in tmp_path.iterdir()] == ["bench_scaling.png"]
    assert plot_bench_scaling(pd.DataFrame()) is None


def test_chunk_sweep_figure_has_a_panel_per_dtype_and_cpu_kind_and_marks_the_row_floor():
    rows = [dict(impl=impl, dtype=dtype, N=64, D=8, C=256, metric="time_s", value=value, spread_s=0.0,
                 chunk_size=size, date="2026-01-01", cpu_model=cpu, cpu_gemms=gemms, num_threads=1)
            for cpu, gemms in (("CPU A", NATIVE), ("CPU B", NATIVE), ("CPU A", STAND_IN))
            for dtype in ("float32", "bfloat16") for impl in ("lce", "lce balanced")
            for size, value in ((32, 3.0), (256, 1.0), (512, 1.1))]
    figure = plot_chunk_sweep(pd.DataFrame(rows))
    panels = [ax for ax in figure.figure.axes if ax.get_visible()]
    titles = [ax.get_title() for ax in panels]
    assert len(panels) == 6 and sum("CPU B" in t for t in titles) == 2
    assert sum("CPU A (bf16 GEMMs native)" in t for t in titles) == 2
    assert sum("CPU A, AVX2 stand-in (bf16 GEMMs emulated)" in t for t in titles) == 2
    floors = {ax.get_title().split(",")[0]: [line.get_xdata()[0] for line in ax.get_lines()
                                            if line.get_linestyle() == "--"] for ax in panels}
    assert floors == {"float32": [512], "bfloat16": [256]}
    assert plot_chunk_sweep(pd.DataFrame()) is None
