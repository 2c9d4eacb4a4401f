"""``python -m analysis``: sweep a grid, draw the figures, or both (``reproduce``)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from .grids import GRIDS, get_grid
from .paths import FIGURES_DIR, RESULTS_DIR, ROOT

__all__ = ["main", "build_parser", "make_figures"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m analysis",
        description="Measure what each lce precision policy costs (memory, time) and buys (accuracy vs fp64).",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    sweep = commands.add_parser("sweep", help="run a named grid into analysis/results/<grid>.csv (resumable)")
    sweep.add_argument("--grid", default="quick", choices=sorted(GRIDS), help="which grid (default: quick)")
    sweep.add_argument("--shard", default="1/1", metavar="K/N",
                       help="run only shard K of N (1-based); each shard writes <grid>.shard-K-of-N.csv")
    sweep.add_argument("--results", type=Path, default=RESULTS_DIR, help="results folder")
    sweep.add_argument("--no-progress", action="store_true", help="no progress bar")

    figures = commands.add_parser("figures", help="draw every figure from the committed CSVs (seconds)")
    figures.add_argument("--results", type=Path, default=RESULTS_DIR, help="folder of result CSVs")
    figures.add_argument("--out", type=Path, default=FIGURES_DIR, help="figures folder")

    reproduce = commands.add_parser("reproduce", help="sweep a grid, then draw every figure")
    reproduce.add_argument("--quick", action="store_true", help="use the quick grid (the default grid anyway)")
    reproduce.add_argument("--grid", default=None, choices=sorted(GRIDS), help="grid to sweep (default: quick)")
    reproduce.add_argument("--results", type=Path, default=RESULTS_DIR, help="results folder")
    reproduce.add_argument("--out", type=Path, default=FIGURES_DIR, help="figures folder")
    reproduce.add_argument("--no-progress", action="store_true", help="no progress bar")
    reproduce.add_argument("--resume", action="store_true",
                           help="keep the grid's existing rows and run only the missing ones (default: start "
                                "fresh, moving the old CSV to <grid>.csv.previous)")

    bench = commands.add_parser("bench", help="time and peak memory of lce, torch, unfused and compiled at one "
                                              "problem, with the 3-GEMM floor (analysis/results/bench.csv)")
    bench.add_argument("--shape", default="4096x512x32768", help="NxDxC (default: 4096x512x32768)")
    bench.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], help="input dtypes")
    bench.add_argument("--repeats", type=int, default=3, help="timed rounds after one warm-up round")
    bench.add_argument("--chunk-sweep", action="store_true",
                       help="instead: time lce's default policy per chunk size (bench_chunks.csv)")
    bench.add_argument("--scaling", action="store_true",
                       help="instead: lce, torch and unfused with N and C divided by 1, 2 and 4 (bench.csv)")
    bench.add_argument("--results", type=Path, default=RESULTS_DIR, help="results folder")

    notebooks = commands.add_parser("notebooks", help="execute every notebook from its source and write the .ipynb")
    notebooks.add_argument("--full", action="store_true", help="QUICK=False: the larger settings (slow)")

    commands.add_parser("grids", help="list the named grids and their sizes")
    verdict = commands.add_parser("verdicts", help="print the Pareto verdict of every \"auto\" entry")
    verdict.add_argument("--results", type=Path, default=RESULTS_DIR, help="folder of result CSVs")
    return parser


def _relative(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def _load(results: Path):
    from .pareto import load_table

    return load_table(results)


def make_figures(results: Path, out: Path, command: str = "python -m analysis figures") -> list[Path]:
    """Draw every figure from the CSVs in ``results`` into ``out``; return the files written."""
    from .pareto import verdict_lines
    from .plots import draw_all, write_index

    paths, table = _load(results)
    if table.empty:
        raise SystemExit(f"no results in {results}: run `python -m analysis sweep` first")
    figures = draw_all(table, out)
    bench_csv = results / "bench.csv"
    if bench_csv.exists():
        import pandas as pd

        from .plots import plot_bench_scaling

        figures += [f for f in [plot_bench_scaling(pd.read_csv(bench_csv), out)] if f is not None]
        paths = [*paths, bench_csv]
    index = write_index(figures, out, [_relative(p) for p in paths], command, verdict_lines(table))
    written = [out / f"{f.stem}.{ext}" for f in figures for ext in ("png", "svg")]
    return [*written, index]


def _set_aside(path: Path) -> None:
    """Rename ``path`` to ``<name>.previous`` (which ``figures`` ignores) so a reproduction starts fresh."""
    if path.exists():
        path.replace(path.with_name(path.name + ".previous"))
        print(f"moved the existing {_relative(path)} to {_relative(path)}.previous")


def _sweep(grid_name: str, shard_text: str, results: Path, progress: bool) -> None:
    from .sweep import parse_shard, run_grid

    shard = parse_shard(shard_text)
    summary = run_grid(get_grid(grid_name), shard=shard, folder=results, progress=progress)
    print(f"{_relative(summary.path)}: {summary.ran} run(s) in {summary.seconds:.0f} s, "
          f"{summary.skipped_done} already done, {summary.errors} error(s)")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the process exit status."""
    args = build_parser().parse_args(argv)
    if args.command == "grids":
        for grid in GRIDS.values():
            print(f"{grid.name:<6} {len(grid.configs):>5} runs  {grid.description}")
    elif args.command == "sweep":
        try:
            _sweep(args.grid, args.shard, args.results, not args.no_progress)
        except ValueError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
    elif args.command == "figures":
        for path in make_figures(args.results, args.out):
            print(_relative(path))
    elif args.command == "reproduce":
        grid = args.grid or "quick"
        if not args.resume:
            _set_aside(args.results / f"{grid}.csv")
        _sweep(grid, "1/1", args.results, not args.no_progress)
        command = "python -m analysis reproduce " + ("--quick" if grid == "quick" else f"--grid {grid}")
        for path in make_figures(args.results, args.out, command):
            print(_relative(path))
    elif args.command == "bench":
        from . import bench
        from .inputs import parse_shape

        shape = parse_shape(args.shape)
        if args.chunk_sweep:
            table = bench.chunk_sweep(shape, tuple(args.dtypes), repeats=args.repeats)
            path = bench.append_csv(table, args.results / "bench_chunks.csv")
            print(table[["dtype", "chunk_size", "num_chunks", "value", "modeled_peak_bytes"]].to_string(index=False))
        elif args.scaling:
            table = bench.run_scaling(shape, tuple(args.dtypes), repeats=args.repeats)
            path = bench.append_csv(table, args.results / "bench.csv")
        else:
            table = bench.run_bench(shape, tuple(args.dtypes), repeats=args.repeats)
            path = bench.append_csv(table, args.results / "bench.csv")
            print(bench.ratios(table).to_string(index=False, float_format="%.3f"))
        print(_relative(path))
    elif args.command == "notebooks":
        from .notebooks import build_all

        for path in build_all(quick=not args.full):
            print(_relative(path))
    elif args.command == "verdicts":
        from .pareto import verdict_lines

        _, table = _load(args.results)
        print("\n".join(verdict_lines(table)))
    return 0
