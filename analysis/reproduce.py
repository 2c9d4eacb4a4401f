"""``python -m analysis reproduce [--quick]``: the README's main command. Sweeps a grid, records the memory study,
draws every figure, and records its own time (``reproduce.csv``, which the README quotes)."""

from __future__ import annotations

import argparse
import time

from analysis.core.arguments import results_option, set_aside_announced, workers_option
from analysis.paths import FIGURES_DIR
from analysis.sweep.grids import GRIDS

__all__ = ["add_arguments", "run"]

DESCRIPTION = ("`reproduce --quick` re-measures the quick grid and the memory study, redraws every figure, and "
               "records its own time in analysis/results/reproduce.csv (the README quotes it).")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from pathlib import Path

    parser.add_argument("--quick", action="store_true", help="use the quick grid (the default grid anyway)")
    parser.add_argument("--grid", default=None, choices=sorted(GRIDS), help="grid to sweep (default: quick)")
    results_option(parser)
    parser.add_argument("--out", type=Path, default=FIGURES_DIR, help="figures folder (default: figures)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    workers_option(parser)
    parser.add_argument("--resume", action="store_true",
                        help="keep the grid's existing rows and run only the missing ones (default: start "
                             "fresh, moving the old CSV to <grid>.csv.previous)")


def run(args: argparse.Namespace) -> None:
    from analysis.core.provenance import provenance
    from analysis.core.results_io import REPRODUCE, append_row
    from analysis.report.figures import draw_and_report
    from analysis.studies.memory_study import BREAKDOWN_FILE, STUDY_DTYPE, STUDY_SHAPE, TRACE_FILE, record_and_report
    from analysis.sweep.run import sweep_and_report

    started = time.perf_counter()
    grid = args.grid or "quick"
    if not args.resume:
        set_aside_announced(args.results / f"{grid}.csv")
    summary, workers = sweep_and_report(grid, (1, 1), args.results, not args.no_progress, args.workers)
    swept = time.perf_counter()
    if not args.resume or not all((args.results / name).exists() for name in (BREAKDOWN_FILE, TRACE_FILE)):
        record_and_report(args.results, STUDY_SHAPE, STUDY_DTYPE)
    studied = time.perf_counter()
    command = "python -m analysis reproduce " + ("--quick" if grid == "quick" else f"--grid {grid}")
    draw_and_report(args.results, args.out, command)
    finished = time.perf_counter()
    if not args.resume and summary.errors == 0:  # a whole, clean reproduction: its time is worth quoting
        append_row(args.results / "reproduce.csv", REPRODUCE.row(
            grid=grid, runs=summary.ran, workers=workers, sweep_s=swept - started, memory_study_s=studied - swept,
            figures_s=finished - studied, total_s=finished - started, **provenance("cpu")))
    print(f"reproduce: {finished - started:.0f} s in all (sweep {swept - started:.0f} s, memory study "
          f"{studied - swept:.0f} s, figures {finished - studied:.0f} s)")
