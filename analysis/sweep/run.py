"""Run a grid: one measured, tidy CSV row per :class:`~analysis.core.run_config.RunConfig`.

For each run: build the inputs (rounded once to the run's dtype) and the fp64
reference (both shared by the runs of one problem), warm the implementation
up, run it once under the memory meter (that call's outputs give the errors),
then time it. The row is appended (one line, flushed to disk) before the next
run starts, so a crash loses at most the run in flight, and rerunning skips
every key the CSV already holds (see :mod:`analysis.core.results_io`).
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing
import os
import queue
import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from tqdm.auto import tqdm

import lce.planning.cpu_gemms
from analysis.core.emulated_gemms import emulated_peer_note, emulated_peer_skip
from analysis.core.fp64 import REFERENCE_BLOCK_ELEMENTS, reference_outputs
from analysis.core.implementations import make_implementation, tensor_device, unavailable_reason
from analysis.core.inputs import Inputs, Outputs, make_inputs
from analysis.core.memory import default_method, measure_peak
from analysis.core.metrics import compare
from analysis.core.problem import DTYPES
from analysis.core.provenance import provenance
from analysis.core.results_io import SWEEP, append_row, done_keys
from analysis.core.run_config import RunConfig
from analysis.core.timing import time_call
from analysis.paths import RESULTS_DIR, display_path
from analysis.sweep.grids import Grid
from lce.planning.options import dtype_name

__all__ = ["results_path", "parse_shard", "measure_run", "run_grid", "default_workers", "SweepSummary",
           "reference_block_elements"]


def results_path(grid: str, shard: tuple[int, int] = (1, 1), folder: Path = RESULTS_DIR) -> Path:
    """``results/<grid>.csv``, or ``results/<grid>.shard-K-of-N.csv`` for a shard."""
    index, count = shard
    suffix = "" if count == 1 else f".shard-{index}-of-{count}"
    return folder / f"{grid}{suffix}.csv"


def parse_shard(text: str) -> tuple[int, int]:
    """``"2/4"`` -> ``(2, 4)``; ``ValueError`` unless ``1 <= K <= N``."""
    try:
        index, count = (int(part) for part in text.split("/"))
    except ValueError:
        raise ValueError(f"shard must look like K/N (e.g. 2/4), got {text!r}") from None
    if count < 1 or not 1 <= index <= count:
        raise ValueError(f"shard must be K/N with 1 <= K <= N, got {text!r}")
    return index, count


GPU_REFERENCE_BLOCK_ELEMENTS = 2**28
"""Logits per block of the fp64 reference on a GPU (2 GiB of fp64): with the CPU's 2**24 an LLM head of 128256
classes gets blocks of 130 rows, and each block's update of the (C, D) fp64 weight gradient rereads all of it."""


def reference_block_elements(device: torch.device) -> int:
    """The fp64 reference's block size on ``device``: :data:`GPU_REFERENCE_BLOCK_ELEMENTS` on a GPU, bounded by an
    eighth of its free memory (a few blocks' buffers are live at once); the CPU's default elsewhere."""
    if device.type != "cuda":
        return REFERENCE_BLOCK_ELEMENTS
    free_bytes, _ = torch.cuda.mem_get_info(device)
    return max(REFERENCE_BLOCK_ELEMENTS, min(GPU_REFERENCE_BLOCK_ELEMENTS, free_bytes // (8 * 8)))


class _InputsCache:
    """Inputs and fp64 reference of the most recent inputs key (grids keep the runs sharing inputs together)."""

    def __init__(self) -> None:
        self._key: tuple | None = None
        self._value: tuple[Inputs, Outputs] | None = None

    def get(self, config: RunConfig) -> tuple[Inputs, Outputs]:
        if config.inputs_key() != self._key:
            self._value = None  # free the previous inputs before building the next
            inputs = make_inputs(config.shape, DTYPES[config.dtype], family=config.family, seed=config.seed,
                                 bias=config.bias, device=tensor_device(config.device))
            reference = reference_outputs(inputs, block_elements=reference_block_elements(inputs.input.device))
            self._key, self._value = config.inputs_key(), (inputs, reference)
        return self._value


def measure_run(config: RunConfig, inputs: Inputs, reference: Outputs, *, warmup: int, repeats: int,
                costs: bool = True) -> dict[str, object]:
    """Every measured column of one run (errors, resolved plan, memory, time); without ``costs`` one call
    gives the errors, and memory and time stay empty (see :meth:`Measurement.measures_costs`)."""
    implementation = make_implementation(config.spec, config.device)
    row: dict[str, object] = {}
    plan = implementation.plan(inputs)
    if plan is not None:
        row.update(resolved_policy=plan.acc_policy, resolved_acc_dtype=dtype_name(plan.acc_dtype),
                   chunk_size=plan.batch_chunk_size, num_chunks=plan.num_chunks)
        if config.op == "lce":
            row["peak_bytes_modeled"] = plan.peak_extra_bytes
    else:
        row.update(chunk_size=config.N, num_chunks=1)

    def call() -> Outputs:
        return implementation.run(inputs)

    if not costs:
        for name, report in compare(call(), reference).items():
            row.update(report.columns(name))
        return row
    for _ in range(max(warmup, 1 if config.op == "compiled" else 0)):
        call()  # compile / first-call setup stays out of the memory measurement
    device = tensor_device(config.device)
    method = default_method(device)
    outputs, memory = measure_peak(call, method=method)
    for name, report in compare(outputs, reference).items():
        row.update(report.columns(name))
    del outputs
    timing = time_call(call, warmup=0, repeats=repeats, device=device)
    row.update(peak_bytes_measured=memory.peak_bytes, memory_method=memory.method, time_median_s=timing.median_s,
               time_spread_s=timing.spread_s, time_repeats=repeats)
    return row


@dataclasses.dataclass
class SweepSummary:
    """What one ``run_grid`` call did."""

    path: Path
    total: int
    skipped_done: int
    ran: int
    errors: int
    seconds: float


RunMeasurer = Callable[..., dict[str, object]]


def default_workers(grid: Grid) -> int:
    """One worker per core this process may use (1 for grids that must not run in parallel)."""
    if not grid.measurement.parallel:
        return 1
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


def run_grid(grid: Grid, *, shard: tuple[int, int] = (1, 1), folder: Path = RESULTS_DIR, progress: bool = True,
             configs: Sequence[RunConfig] | None = None, measure: RunMeasurer = measure_run,
             workers: int = 1) -> SweepSummary:
    """Run every not-yet-recorded config of ``grid`` (or of its shard) into its CSV.

    ``configs`` overrides the grid's list (tests); ``measure`` is the per-run
    measurer (tests inject failures through it). A run that raises an
    ``Exception`` is recorded with ``status="error"`` and its message; anything
    else (``KeyboardInterrupt``, a killed process) stops the sweep, and the
    next call resumes from the first missing key. Error rows count as done;
    delete them from the CSV to retry them.

    ``workers > 1`` runs the pending configs in that many worker processes
    (see :func:`default_workers`), which take whole groups of runs sharing
    inputs from one queue, largest first, and append to the same CSV; the
    progress bar and its ETA count the runs of all of them. Only
    :func:`measure_run` can be sent to a worker.
    """
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if workers > 1 and measure is not measure_run:
        raise ValueError("a custom measure runs in this process only: pass workers=1")
    path = results_path(grid.name, shard, folder)
    selected = tuple(configs) if configs is not None else grid.shard(*shard)
    finished = done_keys(path)
    pending = [c for c in selected if c.key not in finished]
    started = time.perf_counter()
    bar = tqdm(total=len(pending), desc=f"sweep {grid.name}", unit="run", disable=not progress, dynamic_ncols=True)
    try:
        if workers > 1 and len(pending) > 1:
            errors = _run_in_workers(grid, path, pending, workers, bar)
        else:
            errors = _run_here(grid, path, pending, measure, bar)
    finally:
        bar.close()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return SweepSummary(path, len(selected), len(selected) - len(pending), len(pending), errors,
                        time.perf_counter() - started)


def _record(grid: Grid, config: RunConfig, cache: _InputsCache, measure: RunMeasurer, path: Path) -> str:
    """Measure one config and append its row; return its status ("ok", "skipped" or "error")."""
    row: dict[str, object] = {"key": config.key, "grid": grid.name, **dataclasses.asdict(config)}
    reason = unavailable_reason(config.op, config.device) or emulated_peer_skip(config.op, config.dtype, config.device)
    if reason is not None:
        row.update(status="skipped", note=reason)
    else:
        try:
            inputs, reference = cache.get(config)
            # a peer whose GEMMs this CPU emulates runs on a stand-in (Implementation.run): errors only
            emulated = emulated_peer_note(config.op, config.dtype, config.device)
            costs = grid.measurement.measures_costs(config) and emulated is None
            row.update(measure(config, inputs, reference, warmup=grid.measurement.warmup,
                               repeats=grid.measurement.repeats, costs=costs))
            row["status"] = "ok"
            if emulated is not None:
                row["note"] = emulated
        except Exception as error:  # recorded, not fatal: one bad config must not stop a grid
            row.update(status="error", note=f"{type(error).__name__}: {error}"[:500])
    row.update(provenance(config.device))
    append_row(path, SWEEP.row(row))
    return str(row["status"])


def _describe(config: RunConfig) -> str:
    return f"{config.op} {config.policy} {config.chunking} {config.dtype} {config.N}x{config.D}x{config.C}"


def _run_here(grid: Grid, path: Path, pending: Sequence[RunConfig], measure: RunMeasurer, bar: tqdm) -> int:
    threads_before = torch.get_num_threads()
    if grid.measurement.threads:
        torch.set_num_threads(grid.measurement.threads)
    try:
        cache, errors = _InputsCache(), 0
        for config in pending:
            bar.set_postfix_str(_describe(config), refresh=False)
            errors += _record(grid, config, cache, measure, path) == "error"
            bar.update()
        return errors
    finally:
        torch.set_num_threads(threads_before)


def _groups_largest_first(pending: Sequence[RunConfig]) -> list[list[RunConfig]]:
    """The pending runs grouped by shared inputs, in grid order within a group, costliest group first.

    Cost is estimated as runs x N x C (the logits each run computes); the queue
    hands out groups dynamically, so the estimate only orders them.
    """
    groups: dict[tuple, list[RunConfig]] = {}
    for config in pending:
        groups.setdefault(config.inputs_key(), []).append(config)
    return sorted(groups.values(), key=lambda group: len(group) * group[0].N * group[0].C, reverse=True)


def _worker(grid: Grid, path: Path, tasks, done, gemm_verdicts: dict) -> None:
    """Worker process: take groups from ``tasks`` until None, report each finished run on ``done``. It plans with
    its parent's CPU GEMM verdicts (``gemm_verdicts``), so its rows are the ones one process would write."""
    lce.planning.cpu_gemms.adopt(gemm_verdicts)
    if grid.measurement.threads:
        torch.set_num_threads(grid.measurement.threads)
    cache = _InputsCache()
    while (group := tasks.get()) is not None:
        for config in group:
            done.put((_describe(config), _record(grid, config, cache, measure_run, path)))
    done.put(None)


def _exit_on_sigterm(signum, frame) -> None:
    raise SystemExit(128 + signum)  # unwinds through the finally below, which stops the workers


def _run_in_workers(grid: Grid, path: Path, pending: Sequence[RunConfig], workers: int, bar: tqdm) -> int:
    previous_handler = signal.signal(signal.SIGTERM, _exit_on_sigterm)  # `kill` must not orphan the workers
    try:
        return _feed_workers(grid, path, pending, workers, bar)
    finally:
        signal.signal(signal.SIGTERM, previous_handler)


def _feed_workers(grid: Grid, path: Path, pending: Sequence[RunConfig], workers: int, bar: tqdm) -> int:
    context = multiprocessing.get_context("spawn")  # a clean interpreter: no forked torch thread pools
    tasks, done = context.Queue(), context.Queue()
    for group in _groups_largest_first(pending):
        tasks.put(group)
    gemm_verdicts = lce.planning.cpu_gemms.verdicts()  # decided once, here, for every worker
    processes = [context.Process(target=_worker, args=(grid, path, tasks, done, gemm_verdicts), daemon=True)
                 for _ in range(workers)]
    for _ in processes:
        tasks.put(None)
    for process in processes:
        process.start()
    errors, running = 0, len(processes)
    try:
        while running:
            try:
                message = done.get(timeout=5)
            except queue.Empty:
                dead = [p.exitcode for p in processes if p.exitcode not in (None, 0)]
                if dead:
                    raise RuntimeError(f"a sweep worker died (exit codes {dead}); the rows written so far are "
                                       "kept: rerun with --resume to finish the grid") from None
                continue
            if message is None:
                running -= 1
                continue
            description, status = message
            errors += status == "error"
            bar.set_postfix_str(description, refresh=False)
            bar.update()
        for process in processes:
            process.join()
    finally:
        for process in processes:
            if process.is_alive():
                process.terminate()
    return errors


# ---- python -m analysis sweep ------------------------------------------------------------------------------

DESCRIPTION = ("Each run appends one row (errors vs fp64, peak memory, time, provenance); a rerun skips the runs "
               "the file already holds.")


def sweep_and_report(grid_name: str, shard: tuple[int, int], results: Path, progress: bool, workers: int | None,
                     families: Sequence[str] | None = None) -> tuple[SweepSummary, int]:
    """Run a named grid (or its runs of ``families``) and print what was done; returns the summary and workers."""
    from analysis.sweep.grids import get_grid

    grid = get_grid(grid_name)
    workers = default_workers(grid) if workers is None else workers
    configs = None if families is None else [c for c in grid.shard(*shard) if c.family in families]
    summary = run_grid(grid, shard=shard, folder=results, progress=progress, workers=workers, configs=configs)
    print(f"{display_path(summary.path)}: {summary.ran} run(s) in {summary.seconds:.0f} s with {workers} "
          f"worker(s), {summary.skipped_done} already done, {summary.errors} error(s)")
    return summary, workers


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from analysis.core.arguments import argument, family_names, progress_option, results_option, workers_option
    from analysis.sweep.grids import GRIDS

    parser.add_argument("--grid", default="quick", choices=sorted(GRIDS), help="which grid (default: quick)")
    parser.add_argument("--shard", default=(1, 1), type=argument(parse_shard), metavar="K/N",
                        help="run only shard K of N (1-based); each shard writes <grid>.shard-K-of-N.csv")
    parser.add_argument("--family", type=argument(family_names), default=None, metavar="NAME[,NAME]",
                        help="run only the runs of these input families (e.g. random,calibrated); the rest "
                             "stay pending for a later call")
    results_option(parser)
    progress_option(parser)
    workers_option(parser)


def run(args: argparse.Namespace) -> None:
    sweep_and_report(args.grid, args.shard, args.results, not args.no_progress, args.workers, args.family)
