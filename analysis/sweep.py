"""Run a grid: one measured, tidy CSV row per :class:`~analysis.grids.RunConfig`.

For each run: build the inputs (rounded once to the run's dtype) and the fp64
reference (both shared by the runs of one problem), warm the implementation
up, run it once under the memory meter (that call's outputs give the errors),
then time it. The row is appended (one line, flushed to disk) before the next
run starts, so a crash loses at most the run in flight, and rerunning skips
every key the CSV already holds (see :mod:`analysis.results_io`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from tqdm.auto import tqdm

from lce.options import dtype_name

from .grids import Grid, RunConfig
from .implementations import make_implementation, unavailable_reason
from .inputs import DTYPES, Inputs, Outputs, make_inputs
from .memory import default_method, measure_peak
from .metrics import compare
from .paths import RESULTS_DIR
from .provenance import provenance
from .reference import reference_outputs
from .results_io import SWEEP, append_row, done_keys
from .timing import time_call

__all__ = ["results_path", "parse_shard", "measure_run", "run_grid", "SweepSummary"]


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


class _InputsCache:
    """Inputs and fp64 reference of the most recent inputs key (grids keep the runs sharing inputs together)."""

    def __init__(self) -> None:
        self._key: tuple | None = None
        self._value: tuple[Inputs, Outputs] | None = None

    def get(self, config: RunConfig) -> tuple[Inputs, Outputs]:
        if config.inputs_key() != self._key:
            self._value = None  # free the previous inputs before building the next
            device = "cuda" if config.device == "cuda" else "cpu"
            inputs = make_inputs(config.shape, DTYPES[config.dtype], seed=config.seed, bias=config.bias,
                                 device=device)
            self._key, self._value = config.inputs_key(), (inputs, reference_outputs(inputs))
        return self._value


def measure_run(config: RunConfig, inputs: Inputs, reference: Outputs, *, warmup: int, repeats: int
                ) -> dict[str, object]:
    """Every measured column of one run (errors, resolved plan, memory, time)."""
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

    for _ in range(max(warmup, 1 if config.op == "compiled" else 0)):
        call()  # compile / first-call setup stays out of the memory measurement
    method = default_method("cuda" if config.device == "cuda" else "cpu")
    outputs, memory = measure_peak(call, method=method)
    for name, report in compare(outputs, reference).items():
        row.update(report.columns(name))
    del outputs
    timing = time_call(call, warmup=0, repeats=repeats, device="cuda" if config.device == "cuda" else "cpu")
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


def run_grid(grid: Grid, *, shard: tuple[int, int] = (1, 1), folder: Path = RESULTS_DIR, progress: bool = True,
             configs: Sequence[RunConfig] | None = None, measure: RunMeasurer = measure_run) -> SweepSummary:
    """Run every not-yet-recorded config of ``grid`` (or of its shard) into its CSV.

    ``configs`` overrides the grid's list (tests); ``measure`` is the per-run
    measurer (tests inject failures through it). A run that raises an
    ``Exception`` is recorded with ``status="error"`` and its message; anything
    else (``KeyboardInterrupt``, a killed process) stops the sweep, and the
    next call resumes from the first missing key. Error rows count as done;
    delete them from the CSV to retry them.
    """
    threads_before = torch.get_num_threads()
    if grid.measurement.threads:
        torch.set_num_threads(grid.measurement.threads)
    try:
        return _run(grid, shard, folder, progress, configs, measure)
    finally:
        torch.set_num_threads(threads_before)


def _run(grid: Grid, shard: tuple[int, int], folder: Path, progress: bool, configs: Sequence[RunConfig] | None,
         measure: RunMeasurer) -> SweepSummary:
    path = results_path(grid.name, shard, folder)
    selected = tuple(configs) if configs is not None else grid.shard(*shard)
    finished = done_keys(path)
    pending = [c for c in selected if c.key not in finished]
    started = time.perf_counter()
    cache = _InputsCache()
    errors = 0
    bar = tqdm(pending, desc=f"sweep {grid.name}", unit="run", disable=not progress, dynamic_ncols=True)
    for config in bar:
        bar.set_postfix_str(f"{config.op} {config.policy} {config.chunking} {config.dtype} "
                            f"{config.N}x{config.D}x{config.C}", refresh=False)
        row: dict[str, object] = {"key": config.key, "grid": grid.name, **dataclasses.asdict(config)}
        reason = unavailable_reason(config.op, config.device)
        if reason is not None:
            row.update(status="skipped", note=reason)
        else:
            try:
                inputs, reference = cache.get(config)
                row.update(measure(config, inputs, reference, warmup=grid.measurement.warmup,
                                   repeats=grid.measurement.repeats))
                row["status"] = "ok"
            except Exception as error:  # recorded, not fatal: one bad config must not stop a grid
                errors += 1
                row.update(status="error", note=f"{type(error).__name__}: {error}"[:500])
        row.update(provenance(config.device))
        append_row(path, SWEEP.row(row))
    bar.close()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return SweepSummary(path, len(selected), len(selected) - len(pending), len(pending), errors,
                        time.perf_counter() - started)

