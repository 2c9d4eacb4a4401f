"""``python -m analysis``: one subcommand per step (sweep, studies, figures, notebooks), and ``reproduce``.

Each subcommand is one small handler (``_<name>_command``) registered with its
parser through ``set_defaults(handler=...)``; pandas, matplotlib and the
studies are imported inside the handlers that need them.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from analysis.core.problem import Shape, parse_shape
from analysis.paths import FIGURES_DIR, LM_CACHE_DIR, LM_DATA_DIR, RESULTS_DIR, display_path
from analysis.sweep.grids import GRIDS, get_grid

__all__ = ["main", "build_parser"]

Handler = Callable[[argparse.Namespace], None]


def _argument(parse: Callable[[str], object]) -> Callable[[str], object]:
    """An argparse ``type`` that reports ``parse``'s ValueError message as a usage error."""

    def convert(text: str) -> object:
        try:
            return parse(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    convert.__name__ = parse.__name__
    return convert


def _set_aside(path: Path) -> None:
    from analysis.core.results_io import set_aside

    if set_aside(path) is not None:
        print(f"moved the existing {display_path(path)} to {display_path(path)}.previous")


def _draw_figures(results: Path, out: Path, command: str) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only: no window, whatever the environment's default backend
    from analysis.report.figures import make_figures

    for path in make_figures(results, out, command):
        print(display_path(path))


def _record_memory_study(results: Path, shape: Shape, dtype: str) -> None:
    from analysis.studies.memory_study import record

    for path in record(results, shape, dtype):
        print(f"{display_path(path)} (an earlier one, if any, is now {path.name}.previous)")


def _run_sweep(grid_name: str, shard: tuple[int, int], results: Path, progress: bool, workers: int | None,
               families: Sequence[str] | None = None):
    from analysis.sweep.run import default_workers, run_grid

    grid = get_grid(grid_name)
    workers = default_workers(grid) if workers is None else workers
    configs = None if families is None else [c for c in grid.shard(*shard) if c.family in families]
    summary = run_grid(grid, shard=shard, folder=results, progress=progress, workers=workers, configs=configs)
    print(f"{display_path(summary.path)}: {summary.ran} run(s) in {summary.seconds:.0f} s with {workers} "
          f"worker(s), {summary.skipped_done} already done, {summary.errors} error(s)")
    return summary, workers


def _families(text: str) -> tuple[str, ...]:
    from analysis.core.families import parse_family

    names = tuple(name.strip() for name in text.split(",") if name.strip())
    for name in names:
        parse_family(name)
    if not names:
        raise ValueError("--family needs at least one family name")
    return names


def _margins(text: str) -> tuple[float, ...]:
    values = tuple(float(part) for part in text.split(",") if part.strip())
    if not values or any(value < 0 for value in values):
        raise ValueError(f"--margins needs non-negative numbers of nats, e.g. 0,20,40; got {text!r}")
    return values


def _names(allowed: Sequence[str]) -> Callable[[str], tuple[str, ...]]:
    """A parser of comma-separated names, each one of ``allowed``."""

    def names(text: str) -> tuple[str, ...]:
        chosen = tuple(part.strip() for part in text.split(",") if part.strip())
        if not chosen or any(name not in allowed for name in chosen):
            raise ValueError(f"expected names from {list(allowed)}, comma-separated; got {text!r}")
        return chosen

    return names


def _seed_list(text: str) -> tuple[int, ...]:
    seeds = tuple(int(part) for part in text.split(",") if part.strip())
    if not seeds or min(seeds) < 0:
        raise ValueError(f"expected non-negative seeds, comma-separated; got {text!r}")
    return seeds


def _arms(text: str) -> tuple:
    from analysis.studies.training import ARM_NAMES

    return tuple(ARM_NAMES[name] for name in _names(tuple(ARM_NAMES))(text))


def _grids_command(args: argparse.Namespace) -> None:
    for grid in GRIDS.values():
        print(f"{grid.name:<6} {len(grid.configs):>5} runs  {grid.description}")


def _sweep_command(args: argparse.Namespace) -> None:
    _run_sweep(args.grid, args.shard, args.results, not args.no_progress, args.workers, args.family)


def _figures_command(args: argparse.Namespace) -> None:
    _draw_figures(args.results, args.out, "python -m analysis figures")


def _reproduce_command(args: argparse.Namespace) -> None:
    from analysis.core.provenance import provenance
    from analysis.core.results_io import REPRODUCE, append_row
    from analysis.studies.memory_study import BREAKDOWN_FILE, STUDY_DTYPE, STUDY_SHAPE, TRACE_FILE

    started = time.perf_counter()
    grid = args.grid or "quick"
    if not args.resume:
        _set_aside(args.results / f"{grid}.csv")
    summary, workers = _run_sweep(grid, (1, 1), args.results, not args.no_progress, args.workers)
    swept = time.perf_counter()
    if not args.resume or not all((args.results / name).exists() for name in (BREAKDOWN_FILE, TRACE_FILE)):
        _record_memory_study(args.results, STUDY_SHAPE, STUDY_DTYPE)
    studied = time.perf_counter()
    command = "python -m analysis reproduce " + ("--quick" if grid == "quick" else f"--grid {grid}")
    _draw_figures(args.results, args.out, command)
    finished = time.perf_counter()
    if not args.resume and summary.errors == 0:  # a whole, clean reproduction: its time is worth quoting
        append_row(args.results / "reproduce.csv", REPRODUCE.row(
            grid=grid, runs=summary.ran, workers=workers, sweep_s=swept - started, memory_study_s=studied - swept,
            figures_s=finished - studied, total_s=finished - started, **provenance("cpu")))
    print(f"reproduce: {finished - started:.0f} s in all (sweep {swept - started:.0f} s, memory study "
          f"{studied - swept:.0f} s, figures {finished - studied:.0f} s)")


def _memory_study_command(args: argparse.Namespace) -> None:
    _record_memory_study(args.results, args.shape, args.dtype)


def _bench_command(args: argparse.Namespace) -> None:
    from analysis.core.results_io import BENCH, CHUNK_SWEEP, append_rows
    from analysis.studies import bench

    dtypes = tuple(args.dtypes)
    if args.baseline:
        table = bench.against_baseline(args.shape, dtypes, args.baseline, rounds=args.repeats)
        path = args.results / "bench_baseline.csv"
        append_rows(path, BENCH.rows(table))
        times = table.set_index(["dtype", "impl"])["value"].unstack("impl")
        times["ratio"] = times["lce now"] / times[f"lce@{args.baseline}"]
        print(times.to_string(float_format="%.3f"))
    elif args.chunk_sweep:
        table = bench.chunk_sweep(args.shape, dtypes, repeats=args.repeats, policies=bench.CHUNK_SWEEP_POLICIES)
        path = args.results / "bench_chunks.csv"
        append_rows(path, CHUNK_SWEEP.rows(table))
        print(table[["dtype", "impl", "chunk_size", "num_chunks", "value", "spread_s"]].to_string(index=False))
    else:
        measure = bench.run_scaling if args.scaling else bench.run_bench
        table = measure(args.shape, dtypes, repeats=args.repeats)
        path = args.results / "bench.csv"
        append_rows(path, BENCH.rows(table))
        if not args.scaling:
            print(bench.ratios(table).to_string(index=False, float_format="%.3f"))
    print(display_path(path))


def _family_stats_command(args: argparse.Namespace) -> None:
    from analysis.core.provenance import provenance
    from analysis.core.results_io import FAMILY_STATS, append_rows
    from analysis.studies.family_stats import STUDY_FAMILIES, study

    table = study(args.family or STUDY_FAMILIES, seed=args.seed)
    path = args.results / "family_stats.csv"
    _set_aside(path)
    append_rows(path, FAMILY_STATS.rows(table.assign(**provenance("cpu"))))
    summary = table[table["statistic"] != "target_count"].pivot(index="statistic", columns="family", values="value")
    print(summary.to_string(float_format="%.4g"))
    print(display_path(path))


def _print_study(path: Path, seconds: float) -> None:
    print(f"{display_path(path)}: {seconds:.0f} s (an earlier one, if any, is now {path.name}.previous)")


def _margins_command(args: argparse.Namespace) -> None:
    from analysis.studies import margins

    _print_study(*margins.record(args.results, shape=args.shape, dtypes=tuple(args.dtypes), margins=args.margins,
                                 seeds=tuple(range(args.seeds))))


def _rare_rows_command(args: argparse.Namespace) -> None:
    from analysis.studies import rare_rows

    runs = rare_rows.contenders(args.policies, args.chunkings)
    _print_study(*rare_rows.record(args.results, args.file, shape=args.shape, dtypes=tuple(args.dtypes),
                                   seeds=tuple(range(args.seeds)), runs=runs))


def _budgets_command(args: argparse.Namespace) -> None:
    from analysis.core.results_io import BUDGETS, CLASS_TILING
    from analysis.studies import budgets
    from analysis.studies.peers import record_study

    if not args.skip_budgets:
        _print_study(*record_study(args.results / "budgets.csv", BUDGETS, budgets.measure_budgets,
                                   progress=not args.quiet))
    _print_study(*record_study(args.results / "class_tiling.csv", CLASS_TILING, budgets.measure_tiling,
                               progress=not args.quiet))


def _features_command(args: argparse.Namespace) -> None:
    from analysis.studies import features

    if not args.cost_only:
        _print_study(*features.record(args.results, seeds=tuple(range(args.seeds)), progress=not args.quiet))
    if args.cost or args.cost_only:
        _print_study(*features.record_cost(args.results, rounds=args.repeats))


def _vocab_parallel_command(args: argparse.Namespace) -> None:
    from analysis.studies import vocab_parallel

    _print_study(*vocab_parallel.record(args.results, worlds=tuple(args.ranks), seeds=tuple(range(args.seeds)),
                                        progress=not args.quiet))


def _remeasure_memory_command(args: argparse.Namespace) -> None:
    from analysis.sweep import remeasure as remeasure_memory

    for name in args.grids:
        path = args.results / f"{name}.csv"
        print(f"{display_path(path)}: {remeasure_memory.remeasure(path, progress=not args.quiet)} row(s) brought up "
              "to date")


def _error_model_command(args: argparse.Namespace) -> int:
    from analysis.studies import error_model as error_model_fit

    if args.check:
        problems = error_model_fit.check(args.results)
        for problem in problems:
            print(f"lce/error_model.json is out of date: {problem}")
        return 1 if problems else 0
    result, paths = error_model_fit.run(args.results, remeasure_stats=args.remeasure_stats)
    summary = error_model_fit.summary(result.rows)
    print(result.constants["accuracy"])
    for line in summary["worst"]:
        print(f"  worst held-out miss: {line}")
    for path in paths:
        print(display_path(path))
    return 0


def _noise_command(args: argparse.Namespace) -> None:
    from analysis.studies import noise

    device = "cuda" if args.device == "cuda" else "cuda-emulated"
    file_name = args.file or ("noise_cuda.csv" if device == "cuda" else noise.NOISE_FILE)
    _print_study(*noise.record(args.results, file_name, shape=args.shape, families=args.families,
                               dtypes=tuple(args.dtypes), seeds=tuple(range(args.seeds)), device=device,
                               progress=not args.no_progress))


def _train_command(args: argparse.Namespace) -> None:
    import torch

    from analysis.core.provenance import provenance
    from analysis.core.results_io import NOISE, TRAINING, append_rows, set_aside
    from analysis.lm.model import ModelConfig
    from analysis.lm.pipeline import DEFAULT_VOCAB
    from analysis.studies import training

    started = time.monotonic()
    setting = training.SETTINGS["quick" if args.quick else args.setting]
    if args.seeds is not None:
        setting = dataclasses.replace(setting, seeds=tuple(range(args.seeds)))
    if args.seed_list is not None:
        setting = dataclasses.replace(setting, seeds=args.seed_list)
    torch.set_num_threads(args.threads)
    suffix = "" if args.device == "cpu" else f"_{args.device}"
    path = args.results / (args.file or f"training{'_quick' if args.quick else ''}{suffix}.csv")
    args.results.mkdir(parents=True, exist_ok=True)
    cache = args.cache / "study"
    model_config = ModelConfig(DEFAULT_VOCAB)
    set_aside(path)

    def write(table) -> None:
        partial = path.with_name(path.name + ".partial")
        partial.unlink(missing_ok=True)
        append_rows(partial, TRAINING.rows(table.assign(device=args.device, **provenance(args.device))))
        partial.replace(path)

    deadline = None if args.budget_s is None else started + args.budget_s
    workers = args.workers or (len(os.sched_getaffinity(0)) if args.device == "cpu" else 1)
    table = training.run_study(setting, model_config, cache, arms=args.arms, device=args.device, workers=workers,
                               token_cache=args.cache, tokens_file=args.tokens, progress=not args.no_progress,
                               on_run_done=write, deadline=deadline)
    if not table.empty:
        write(table)
        print(training.summary(table).to_string(float_format="%.4f"))
    print(f"{display_path(path)}: {len(table)} rows, {time.monotonic() - started:.0f} s")
    if setting.snapshot_steps and not args.no_checkpoint_errors:
        errors = training.checkpoint_errors(cache, setting, training.load_streams(args.cache, args.tokens),
                                            model_config, device=args.device)
        if not errors.empty:
            errors_path = args.results / f"noise_checkpoints{suffix}.csv"
            set_aside(errors_path)
            noise_device = "cuda" if args.device == "cuda" else "cuda-emulated"
            append_rows(errors_path, NOISE.rows(errors.assign(**provenance(noise_device))))
            print(f"{display_path(errors_path)}: {len(errors)} rows")


def _docs_command(args: argparse.Namespace) -> int:
    from analysis.report.readme import update

    changed = update(results=args.results, check=args.check)
    for path in changed:
        print(f"{display_path(path)}: {'out of date' if args.check else 'rewritten'}")
    return 1 if args.check and changed else 0


def _demo_command(args: argparse.Namespace) -> None:
    from analysis.studies.demo import run_demo

    run_demo(Shape(args.rows, args.features, args.classes), tuple(args.dtypes))


def _notebooks_command(args: argparse.Namespace) -> None:
    from analysis.report.notebooks import build_all

    for path in build_all(quick=not args.full, only=tuple(args.only)):
        print(display_path(path))


def _verdicts_command(args: argparse.Namespace) -> None:
    from analysis.core.results_io import NOISE, load_kind
    from analysis.judge.pareto import load_table, verdict_lines
    from analysis.judge.rule import rule_lines

    _, table = load_table(args.results)
    print("\n".join(verdict_lines(table)))
    _, noise = load_kind(args.results, NOISE.name)
    if not noise.empty:
        print("\n".join(f"error/noise rule: {line}" for line in rule_lines(noise)))


def _lm_command(args: argparse.Namespace) -> None:
    import torch

    from analysis.lm.pipeline import run_pipeline

    started = time.perf_counter()
    torch.set_num_threads(args.threads)
    result = run_pipeline(steps=args.steps, seed=args.seed, out=args.out, cache=args.cache,
                          progress=not args.no_progress)
    for name, paths in result.dumps.items():
        print(f"{name}: held-out loss {result.heldout_losses[name]:.3f} nats -> "
              + ", ".join(f"{display_path(path)} ({path.stat().st_size / 2**20:.1f} MiB)" for path in paths))
    print(f"unigram entropy of the training tokens: {result.unigram_entropy:.3f} nats")
    print(f"lm: {time.perf_counter() - started:.0f} s in all (training {result.train_wall_s:.0f} s over all "
          f"sessions, {torch.get_num_threads()} thread(s); checkpoints in {display_path(result.run_dir)})")


def _gpu_check_command(args: argparse.Namespace) -> int:
    from analysis.gpu import check

    if args.step:
        return check.run_step(args.step, args.out or check.DEFAULT_OUT, args.step_seconds,
                                  dry_run=args.dry_run)
    if args.out is None and args.dry_run:
        import tempfile

        args.out = Path(tempfile.mkdtemp(prefix="gpu-check-dry-run-"))
    results = check.run_check(args.out or check.DEFAULT_OUT, budget_s=args.budget_s, dry_run=args.dry_run,
                                  wheels=args.wheels)
    failed = [name for name, (code, _) in results.items() if code != 0]
    return 1 if failed else 0


def _gpu_wheels_command(args: argparse.Namespace) -> int:
    from analysis.gpu.wheels import download_wheels

    try:
        lines = download_wheels(args.dest)
    except RuntimeError as error:
        print(f"gpu-wheels: {error}")
        return 1
    print("\n".join(lines))
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The ``python -m analysis`` parser: every subcommand with its flags and handler."""
    from analysis.lm.pipeline import DEFAULT_STEPS
    from analysis.studies.margins import MARGIN_VALUES, MARGINS_SHAPE
    from analysis.studies.memory_study import STUDY_DTYPE, STUDY_SHAPE
    from analysis.studies.noise import FAMILIES as NOISE_FAMILIES
    from analysis.studies.noise import NOISE_SHAPE
    from analysis.studies.noise import STUDY_DTYPES as NOISE_DTYPES
    from analysis.studies.rare_rows import CHUNKINGS, POLICIES, RARE_ROWS_SHAPE
    from analysis.studies.training import ARMS as TRAIN_ARMS
    from analysis.studies.training import SETTINGS as TRAIN_SETTINGS
    from analysis.sweep.run import parse_shard

    parser = argparse.ArgumentParser(
        prog="python -m analysis",
        description="Measure what each lce precision policy costs (memory, time) and buys (accuracy vs fp64).",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, handler: Handler, summary: str, description: str) -> argparse.ArgumentParser:
        command = commands.add_parser(name, help=summary, description=f"{summary}. {description}")
        command.set_defaults(handler=handler)
        return command

    def workers_option(command: argparse.ArgumentParser) -> None:
        command.add_argument("--workers", type=int, default=None, metavar="N",
                             help="worker processes, one intra-op thread each (default: one per available core; "
                                  "1 for a GPU grid)")

    def results_folder(command: argparse.ArgumentParser, what: str = "results folder") -> None:
        command.add_argument("--results", type=Path, default=RESULTS_DIR,
                             help=f"{what} (default: {display_path(RESULTS_DIR)})")

    sweep = add("sweep", _sweep_command, "run a named grid into analysis/results/<grid>.csv (resumable)",
                "Each run appends one row (errors vs fp64, peak memory, time, provenance); a rerun skips the runs "
                "the file already holds.")
    sweep.add_argument("--grid", default="quick", choices=sorted(GRIDS), help="which grid (default: quick)")
    sweep.add_argument("--shard", default=(1, 1), type=_argument(parse_shard), metavar="K/N",
                       help="run only shard K of N (1-based); each shard writes <grid>.shard-K-of-N.csv")
    sweep.add_argument("--family", type=_argument(_families), default=None, metavar="NAME[,NAME]",
                       help="run only the runs of these input families (e.g. random,calibrated); the rest "
                            "stay pending for a later call")
    results_folder(sweep)
    sweep.add_argument("--no-progress", action="store_true", help="no progress bar")
    workers_option(sweep)

    figures = add("figures", _figures_command, "draw every figure from the committed results files (seconds)",
                  "Writes PNG and SVG per figure and figures/README.md (captions, data files, command, verdicts); "
                  "measures nothing.")
    results_folder(figures, "folder of results files")
    figures.add_argument("--out", type=Path, default=FIGURES_DIR, help="figures folder (default: figures)")

    reproduce = add("reproduce", _reproduce_command, "sweep a grid, record the memory study, draw every figure",
                    "The README's main command: `reproduce --quick` re-measures the quick grid and the memory "
                    "study, redraws every figure, and records its own time in analysis/results/reproduce.csv "
                    "(the README quotes it).")
    reproduce.add_argument("--quick", action="store_true", help="use the quick grid (the default grid anyway)")
    reproduce.add_argument("--grid", default=None, choices=sorted(GRIDS), help="grid to sweep (default: quick)")
    results_folder(reproduce)
    reproduce.add_argument("--out", type=Path, default=FIGURES_DIR, help="figures folder (default: figures)")
    reproduce.add_argument("--no-progress", action="store_true", help="no progress bar")
    workers_option(reproduce)
    reproduce.add_argument("--resume", action="store_true",
                           help="keep the grid's existing rows and run only the missing ones (default: start "
                                "fresh, moving the old CSV to <grid>.csv.previous)")

    bench = add("bench", _bench_command, "time and peak memory of lce, torch, unfused and compiled at one problem",
                "Interleaved timing rounds, peak memory in a fresh process per implementation and the 3-GEMM "
                "floor, appended to analysis/results/bench.csv (about 10 minutes at the default shape here).")
    bench.add_argument("--shape", default=parse_shape("4096x512x32768"), type=_argument(parse_shape),
                       metavar="NxDxC", help="problem size (default: 4096x512x32768)")
    bench.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], help="input dtypes")
    bench.add_argument("--repeats", type=int, default=3, help="timed rounds after one warm-up round")
    mode = bench.add_mutually_exclusive_group()
    mode.add_argument("--chunk-sweep", action="store_true",
                      help="instead: time lce per policy (default options, balanced and compact on low "
                           "precision) and chunk size (bench_chunks.csv)")
    mode.add_argument("--scaling", action="store_true",
                      help="instead: lce, torch and unfused with N and C divided by 1, 2 and 4 (bench.csv)")
    mode.add_argument("--baseline", metavar="REV",
                      help="instead: lce's default options here against git revision REV, one fresh process per "
                           "version, alternating (bench_baseline.csv)")
    results_folder(bench)

    docs = add("docs", _docs_command, "rewrite the generated passages of the READMEs from the results files",
               "Every number a README quotes from data sits between <!-- BEGIN generated:NAME --> and "
               "<!-- END generated:NAME --> comments; this rewrites them (analysis/report/readme.py). --check only "
               "reports the files that are out of date and exits with 1 if any is.")
    docs.add_argument("--check", action="store_true", help="change nothing; exit 1 if a README is out of date")
    results_folder(docs, "folder of results files")

    model = add("error-model", _error_model_command, "fit lce's gradient error model and validate it on held-out data",
                "Reads the sweep grids and the noise study, fits lce/error_model.json's constants on random and "
                "trained inputs at N <= 1024, and writes analysis/results/error_model/validation.csv (prediction, "
                "measurement and split of every point; calibrated inputs and larger shapes are held out). "
                "Seconds. --check "
                "refits without writing and exits with 1 if the committed constants differ.")
    model.add_argument("--check", action="store_true", help="change nothing; exit 1 if the constants are out of date")
    model.add_argument("--remeasure-stats", action="store_true",
                       help="measure each family's input statistics again (error_model/stats.csv; about 20 s)")
    results_folder(model)

    budget_study = add("budgets", _budgets_command, "lce.recommend per memory budget, measured; class tiling's cost",
                       "For three shapes (bf16, calibrated inputs) and budgets from lce auto's peak down to 1.05x "
                       "the gradients' bytes: recommend's options, then a fresh process per budget measures their "
                       "peak, errors against fp64 and time (budgets.csv). Then, at the bench shape, each policy "
                       "with the vocabulary whole and in 4/16/64 blocks, timed in one process (class_tiling.csv). "
                       "About 15 minutes on 2 cores.")
    budget_study.add_argument("--skip-budgets", action="store_true", help="only the class-tiling measurement")
    budget_study.add_argument("--quiet", action="store_true", help="no progress bars")
    results_folder(budget_study)

    feature_study = add("features", _features_command, "error, time and memory of soft-capping, z-loss and lse",
                        "lce's features beyond torch's op against fp64, next to the plain op: bf16 and fp16, random "
                        "and calibrated inputs at 2048x256x8192 and the trained head, per policy and layout, with the "
                        "fp64 softmax statistics of each feature set (features.csv, about 10 minutes here). With "
                        "--cost, also the time and peak of lce's defaults per feature set at the bench shape "
                        "(feature_cost.csv).")
    feature_study.add_argument("--seeds", type=int, default=3, help="seeds per problem (default 3)")
    feature_study.add_argument("--cost", action="store_true", help="also measure time and peak at the bench shape")
    feature_study.add_argument("--cost-only", action="store_true", help="only the time and peak measurement")
    feature_study.add_argument("--repeats", type=int, default=5, help="alternating timed rounds (default 5)")
    feature_study.add_argument("--quiet", action="store_true", help="no progress bars")
    results_folder(feature_study)

    vocab = add("vocab-parallel", _vocab_parallel_command, "vocab-parallel lce on 1-4 CPU processes: errors, peaks",
                "lce.distributed over gloo with the classes split evenly across 2, 3 and 4 processes, against "
                "single-process lce (1), per policy, random and calibrated inputs at 2048x256x16384 bf16: floors "
                "against fp64 and the peak extra memory of every rank (vocab_parallel.csv). About 10 minutes here.")
    vocab.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 3, 4], help="process counts (1: one process)")
    vocab.add_argument("--seeds", type=int, default=2, help="seeds per problem (default 2)")
    vocab.add_argument("--quiet", action="store_true", help="no progress bars")
    results_folder(vocab)

    remeasure = add("remeasure-memory", _remeasure_memory_command,
                    "bring committed sweep rows' peak memory up to date after lce's memory use changed",
                    "For every lce row whose modeled peak differs from lce's current memory model: rewrites the "
                    "modeled peak, measures the peak again on CPU rows (same inputs, same profiler), and notes the "
                    "revision and date in the row's note column. Errors and times are left as measured.")
    remeasure.add_argument("--grids", type=_names(["quick", "medium"]), default=("quick", "medium"),
                           help="comma-separated grid results to update (default: quick,medium)")
    remeasure.add_argument("--quiet", action="store_true", help="no progress bar")
    results_folder(remeasure)

    demo = add("demo", _demo_command, "a one-minute tour: lce's plan, then lce's and torch's errors vs fp64",
               "Prints the resolved plan of lce's default options, then every output's error against fp64 "
               "(and as a multiple of its rounding floor) for lce and torch, per policy. Writes nothing.")
    demo.add_argument("--rows", type=int, default=2048, help="N (default: 2048)")
    demo.add_argument("--features", type=int, default=256, help="D (default: 256)")
    demo.add_argument("--classes", type=int, default=8192, help="C (default: 8192)")
    demo.add_argument("--dtypes", nargs="+", default=["bfloat16", "float16"], help="input dtypes")

    memory = add("memory-study", _memory_study_command, "measure where lce's bytes go and live memory over one step",
                 "Writes memory_breakdown.csv (every buffer of lce's plan per configuration, no measurement) and "
                 "memory_trace.csv (live extra bytes after each allocator event of one forward+backward, lce next "
                 "to torch and the unfused reference), moving earlier ones to .previous; about 20 s at the default "
                 "problem. `figures` draws them.")
    memory.add_argument("--shape", default=STUDY_SHAPE, type=_argument(parse_shape), metavar="NxDxC",
                        help=f"study problem (default: {STUDY_SHAPE})")
    memory.add_argument("--dtype", default=STUDY_DTYPE, choices=("float32", "bfloat16", "float16"),
                        help=f"input dtype (default: {STUDY_DTYPE})")
    results_folder(memory)

    stats = add("family-stats", _family_stats_command, "describe each input family (loss, p_target, margins, ...)",
                "Draws every family of analysis.studies.family_stats at the trained head's shape and writes "
                "family_stats.csv (an earlier one becomes .previous); about a minute. `figures` draws it.")
    stats.add_argument("--family", type=_argument(_families), default=None, metavar="NAME[,NAME]",
                       help="these families only (default: random, calibrated at 0.5/3/6 nats, trained early/final)")
    stats.add_argument("--seed", type=int, default=0, help="seed of the draw (default: 0)")
    results_folder(stats)

    def study_options(command: argparse.ArgumentParser, shape: Shape, dtypes: list[str], note: str = "",
                      allowed: tuple[str, ...] = ("bfloat16", "float16")) -> None:
        command.add_argument("--shape", default=shape, type=_argument(parse_shape), metavar="NxDxC",
                             help=f"problem size{note} (default: {shape})")
        command.add_argument("--seeds", type=int, default=5, help="seeds 0..K-1 (default: 5)")
        command.add_argument("--dtypes", nargs="+", default=dtypes, choices=allowed,
                             help=f"input dtypes (default: {' '.join(dtypes)})")
        results_folder(command)

    margins = add("margins", _margins_command, "error vs fp64 on confident rows, margins 0 to 40 nats",
                  "Every row's target leads the other classes by 0, 5, ..., 40 nats (bf16 and fp16, one input per "
                  "seed); lce per policy and layout, torch's op and the unfused fp32 formula; writes margins.csv "
                  "(the floors of both gradients, the loss in ulps), moving an earlier one to .previous. About 2 "
                  "minutes here.")
    study_options(margins, MARGINS_SHAPE, ["bfloat16", "float16"], ", N <= D")
    margins.add_argument("--margins", type=_argument(_margins), default=MARGIN_VALUES, metavar="M[,M]",
                         help="margins in nats (default: 0,5,...,40)")

    rare = add("rare-rows", _rare_rows_command, "grad_weight's per-row error binned by class target count",
               "Calibrated inputs (Zipfian targets), fp16 and bf16; lce per policy, layout, acc_dtype and chunking, "
               "torch's op and the unfused reference; writes rare_rows.csv (row error median/p99/max per bin of "
               "target count, Frobenius floors), moving an earlier one to .previous. About 6 CPU-minutes.")
    study_options(rare, RARE_ROWS_SHAPE, ["float16", "bfloat16"])
    rare.add_argument("--policies", type=_argument(_names(POLICIES)), default=POLICIES, metavar="P[,P]",
                      help=f"lce policies (default: {','.join(POLICIES)})")
    rare.add_argument("--chunkings", type=_argument(_names(CHUNKINGS)), default=CHUNKINGS, metavar="M[,M]",
                      help=f"lce chunking methods (default: {','.join(CHUNKINGS)})")
    rare.add_argument("--file", default="rare_rows.csv", metavar="NAME",
                      help="results file name in the results folder (default: rare_rows.csv; a spot check at "
                           "another shape goes in a file of its own)")

    notebooks = add("notebooks", _notebooks_command, "execute every notebook from its source and write the .ipynb",
                    "Runs notebooks/NN_*.py top to bottom in a fresh kernel each (quick settings unless --full).")
    notebooks.add_argument("--full", action="store_true", help="QUICK=False: the larger settings (slow)")
    notebooks.add_argument("--only", nargs="+", default=[], metavar="NN",
                           help="only the notebooks with these numbers, e.g. --only 01 06")

    lm = add("lm", _lm_command, "train the small language model and dump its head's (x, W, y)",
             "Corpus (this Python's standard library source) -> byte-level BPE tokenizer -> a small transformer "
             "trained on one core (about 10 minutes; resumes from its last checkpoint in analysis/cache/lm) -> "
             "head dumps of the early and final checkpoints on held-out text (analysis/data/lm; load them with "
             "analysis.core.head_dumps.load_head_dump).")
    lm.add_argument("--steps", type=int, default=DEFAULT_STEPS, metavar="N",
                    help=f"training steps (default: {DEFAULT_STEPS})")
    lm.add_argument("--seed", type=int, default=0, help="training seed (default: 0)")
    lm.add_argument("--out", type=Path, default=LM_DATA_DIR, help=f"dump folder (default: {display_path(LM_DATA_DIR)})")
    lm.add_argument("--cache", type=Path, default=LM_CACHE_DIR,
                    help=f"tokenizer, tokens and checkpoints (default: {display_path(LM_CACHE_DIR)})")
    lm.add_argument("--threads", type=int, default=1,
                    help="intra-op threads; the result is bitwise reproducible for a fixed count (default: 1, "
                         "which the committed dumps used: with 2, a second busy process on a 2-core machine made "
                         "each step 4x slower, with 1 it cost nothing)")
    lm.add_argument("--no-progress", action="store_true", help="no progress bar")

    noise = add("noise", _noise_command, "gradient error against the sampling noise of the same batch",
                "Per input family, dtype (bf16, fp16) and seed: lce's CUDA-layout policies (fp32 acc_dtype) at chunk "
                "counts 1 to 256 and the unfused op; writes noise.csv (floors, error/noise and bias/noise ratios, "
                "steps until a bias matters). Emulated CUDA layouts on CPU tensors unless --device cuda. About 10 "
                "CPU-minutes.")
    study_options(noise, NOISE_SHAPE, list(NOISE_DTYPES), allowed=NOISE_DTYPES)
    noise.add_argument("--families", type=_argument(_families), default=NOISE_FAMILIES, metavar="NAME[,NAME]",
                       help=f"input families (default: {','.join(NOISE_FAMILIES)})")
    noise.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                       help="cpu: the CUDA layouts emulated on CPU tensors (default); cuda: a real GPU")
    noise.add_argument("--file", default=None, metavar="NAME",
                       help="results file name (default: noise.csv, noise_cuda.csv with --device cuda)")
    noise.add_argument("--no-progress", action="store_true", help="no progress bar")

    train_study = add("train", _train_command, "train the small language model with each head arm, several seeds",
                      "Arms: the fp32 head, the unfused bf16 head, lce accurate/balanced/compact in bf16 and fp16 "
                      "(loss-scaled) on the CUDA layouts (emulated on a CPU), aspect_ratio:2 chunks. Same "
                      "initialisation and batches per seed. Writes training.csv (train and held-out loss per step) "
                      "as runs finish, and noise_checkpoints.csv (gradient error vs noise on the fp32 arm's "
                      "snapshots). "
                      "Resumable (checkpoints in analysis/cache/lm/study). --quick: about 2 minutes (CI, notebook); "
                      "full: about 100 minutes on 2 cores.")
    train_study.add_argument("--quick", action="store_true", help="the quick setting (writes training_quick.csv)")
    train_study.add_argument("--setting", choices=sorted(TRAIN_SETTINGS), default="full",
                             help="which setting without --quick (default: full)")
    train_study.add_argument("--seeds", type=int, default=None, metavar="K",
                             help="seeds 0..K-1 (default: the setting's)")
    train_study.add_argument("--seed-list", type=_argument(_seed_list), default=None, metavar="S[,S]",
                             help="exactly these seeds (e.g. 1,2 to add seeds to a study whose seed 0 is done)")
    train_study.add_argument("--arms", type=_argument(_arms), default=TRAIN_ARMS, metavar="NAME[,NAME]",
                             help="arms to train (default: all): " + ",".join(arm.name for arm in TRAIN_ARMS))
    train_study.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where to train (default: cpu)")
    workers_option(train_study)
    train_study.add_argument("--threads", type=int, default=1,
                             help="intra-op threads of the main process (default: 1)")
    train_study.add_argument("--budget-s", type=float, default=None, metavar="S",
                             help="start no run after S seconds (the runs done are written; a rerun resumes)")
    train_study.add_argument("--tokens", type=Path, default=None, metavar="FILE",
                             help="token streams file ({'train','heldout'}), e.g. carried to a GPU machine")
    train_study.add_argument("--file", default=None, metavar="NAME", help="results file name")
    train_study.add_argument("--cache", type=Path, default=LM_CACHE_DIR,
                             help=f"token streams and run folders (default: {display_path(LM_CACHE_DIR)})")
    train_study.add_argument("--no-checkpoint-errors", action="store_true",
                             help="skip the gradient errors on the fp32 arm's snapshots")
    results_folder(train_study)
    train_study.add_argument("--no-progress", action="store_true", help="no progress bar")

    from analysis.gpu.check import DEFAULT_BUDGET_S, DEFAULT_OUT, STEPS, step_seconds
    from analysis.gpu.wheels import WHEELS_DIR

    gpu = add("gpu-check", _gpu_check_command, "everything a lent GPU should measure, in one budgeted call",
              "Steps, each in its own process with its share of the budget ("
              + ", ".join(f"{step.name} {step.share:.0%}" for step in STEPS) + "): "
              + "; ".join(step.summary for step in STEPS) + ". Writes cuda.csv, gpu_memory.csv, gpu_bench.csv and "
              "gpu_check.log (provenance) to --out; a step cut short keeps its rows. --dry-run: every step's plan, "
              "the wheels folder, the grid on tiny shapes with the CUDA layouts emulated (CPU, under a minute).")
    gpu.add_argument("--budget-s", type=_argument(lambda text: step_seconds(float(text)) and float(text)),
                     default=DEFAULT_BUDGET_S, metavar="S",
                     help=f"wall-clock budget of all steps in seconds (default: {DEFAULT_BUDGET_S:.0f})")
    gpu.add_argument("--out", type=Path, default=None,
                     help=f"output folder (default: {display_path(DEFAULT_OUT)}; a fresh temporary folder with "
                          "--dry-run)")
    gpu.add_argument("--dry-run", action="store_true", help="on a CPU: plans, wheels, tiny emulated grid")
    gpu.add_argument("--wheels", type=Path, default=WHEELS_DIR,
                     help=f"folder of Liger-Kernel / Cut Cross-Entropy wheels (default: {display_path(WHEELS_DIR)})")
    gpu.add_argument("--step", choices=[step.name for step in STEPS], default=None, help=argparse.SUPPRESS)
    gpu.add_argument("--step-seconds", type=float, default=60.0, help=argparse.SUPPRESS)

    wheels = add("gpu-wheels", _gpu_wheels_command, "download the GPU check's wheels for the GPU machine's Python",
                 "liger-kernel and cut-cross-entropy, pure-Python wheels for Python 3.12 without their dependencies "
                 "(torch and Triton are on the GPU machine); fails when one has no wheel or they weigh 60 MiB or "
                 "more (make gpu-wheels).")
    wheels.add_argument("--dest", type=Path, default=WHEELS_DIR,
                        help=f"folder (default: {display_path(WHEELS_DIR)}, ignored by git)")

    add("grids", _grids_command, "list the named grids and their sizes", "Measures nothing.")

    verdicts = add("verdicts", _verdicts_command, "print the Pareto verdict of every \"auto\" entry",
                   "Reads the sweep results; measures nothing.")
    results_folder(verdicts, "folder of results files")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the process exit status (argparse exits with 2 on a usage error)."""
    args = build_parser().parse_args(argv)
    status = args.handler(args)
    return status or 0
