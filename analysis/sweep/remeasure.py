"""Bring the committed sweep rows' memory up to date after lce's memory use changed.

The errors and times of a sweep row stay valid when a change to lce only
moves memory (issue 11: the weight-gradient product is formed a block of
classes at a time, never (C, D) at once), but its peak columns do not. For
every lce row whose modeled peak differs from the current memory model's,
:func:`remeasure` rewrites ``peak_bytes_modeled`` and, for rows measured on
CPU, measures ``peak_bytes_measured`` again (the same profiler as the sweep,
same inputs); the row's ``note`` says what was re-measured, at which revision
and when, so its provenance stays honest. The CUDA-layout rows ("cuda-emulated")
are judged by their modeled peak, as in :mod:`analysis.judge.pareto`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import functools
from pathlib import Path

import pandas as pd
import torch
from tqdm import tqdm

from analysis.core.emulated_gemms import Fp32LowPrecisionGemms
from analysis.core.implementations import make_implementation
from analysis.core.inputs import make_inputs
from analysis.core.memory import measure_peak
from analysis.core.problem import DTYPES
from analysis.core.provenance import git_revision
from analysis.core.results_io import write_csv_atomically
from analysis.core.run_config import RunConfig
from lce.planning.resolve import make_plan
from lce.testing import emulate_device_kind

__all__ = ["modeled_peak", "measured_peak", "stale_rows", "remeasure", "current_plan", "changed_plan_rows",
           "drop_changed_plans"]

_CONFIG_FIELDS = [field.name for field in dataclasses.fields(RunConfig)]


def _config(row: pd.Series) -> RunConfig:
    values = {name: row[name] for name in _CONFIG_FIELDS}
    values["bias"] = str(values["bias"]) == "True"
    for name in ("N", "D", "C", "seed"):
        values[name] = int(values[name])
    return RunConfig(**values)


def current_plan(config: RunConfig):
    """The plan lce makes today for a sweep run (gradients of input, weight and bias if any)."""
    context = emulate_device_kind("cuda") if config.device == "cuda-emulated" else contextlib.nullcontext()
    with context:
        return make_plan(config.spec.options(), num_rows=config.N, in_features=config.D, num_classes=config.C,
                         dtype=DTYPES[config.dtype], device=torch.device("cpu"), needs_grad=(True, True, config.bias))


def modeled_peak(config: RunConfig) -> int:
    """The current memory model's peak for a sweep run (gradients of input, weight and bias if any)."""
    return current_plan(config).peak_extra_bytes


def changed_plan_rows(table: pd.DataFrame) -> pd.Index:
    """The lce rows whose run would resolve differently today (policy, acc_dtype or chunk size): an "auto" entry
    changed, so their errors, times and peaks describe another plan and must be measured again."""
    from lce.planning.options import dtype_name

    changed = []
    for index, row in table[table["op"] == "lce"].iterrows():
        plan = current_plan(_config(row))
        now = (plan.acc_policy, dtype_name(plan.acc_dtype), plan.batch_chunk_size)
        if now != (row["resolved_policy"], row["resolved_acc_dtype"], int(float(row["chunk_size"]))):
            changed.append(index)
    return pd.Index(changed)


def drop_changed_plans(path: Path) -> int:
    """Remove :func:`changed_plan_rows` from the sweep file at ``path`` (the sweep, resumable by key, then measures
    them again under today's plans); returns how many were removed."""
    table = pd.read_csv(path, dtype=str, keep_default_na=False)
    changed = changed_plan_rows(table)
    if len(changed):
        table.drop(index=changed).to_csv(path, index=False)
    return len(changed)


def stale_rows(table: pd.DataFrame) -> pd.Series:
    """The current modeled peak of every lce row whose recorded one differs (indexed like ``table``)."""
    lce_rows = table[(table["op"] == "lce") & table["peak_bytes_modeled"].notna()]
    current = pd.Series({index: modeled_peak(_config(row)) for index, row in lce_rows.iterrows()}, dtype="int64")
    recorded = lce_rows["peak_bytes_modeled"].astype("int64")
    return current[current != recorded]


def measured_peak(config: RunConfig, inputs) -> int:
    """The peak extra bytes of one CPU run of ``config`` on ``inputs`` (the sweep's profiler). A bf16/fp16 run's GEMMs
    go to the fp32 stand-in with its scratch kept from a warm-up call
    (:class:`analysis.core.emulated_gemms.Fp32LowPrecisionGemms`): the bytes are lce's own (what its memory model
    counts), as on a CPU whose native kernel allocates only its result, and the run takes fp32's time, not an
    emulated kernel's (80x slower on AVX2-only CPUs). Where a CPU's own kernel also takes packing scratch from
    torch's allocator (an AVX512-BF16 EPYC), its native run peaks higher by at most one GEMM's scratch
    (:func:`analysis.core.emulated_gemms.native_gemm_scratch`)."""
    implementation = make_implementation(config.spec, config.device)
    call = functools.partial(implementation.run, inputs)
    if DTYPES[config.dtype] not in (torch.bfloat16, torch.float16):
        return measure_peak(call, method="profiler")[1].peak_bytes
    with Fp32LowPrecisionGemms(keep_scratch=True):
        call()
        return measure_peak(call, method="profiler")[1].peak_bytes


def remeasure(path: Path, *, progress: bool = True) -> int:
    """Rewrite ``path``'s stale rows (see the module docstring), the file written again after each input's runs so
    that an interrupted call keeps its work (a rerun finds fewer stale rows); return how many changed."""
    table = pd.read_csv(path, dtype=str, keep_default_na=False)
    numeric = table.assign(peak_bytes_modeled=pd.to_numeric(table["peak_bytes_modeled"], errors="coerce"))
    stale = stale_rows(numeric)
    revision, now = git_revision(), datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    by_inputs: dict[tuple, list[int]] = {}
    for index in stale.index:
        by_inputs.setdefault(_config(table.loc[index]).inputs_key(), []).append(index)
    bar = tqdm(total=len(stale), desc=f"re-measure {path.name}", disable=not progress, unit="run")
    for indices in by_inputs.values():
        config = _config(table.loc[indices[0]])
        inputs = None
        for index in indices:
            config = _config(table.loc[index])
            table.loc[index, "peak_bytes_modeled"] = str(int(stale[index]))
            note = f"peak modeled again at {revision} {now}"
            if config.device == "cpu":
                if inputs is None:
                    inputs = make_inputs(config.shape, DTYPES[config.dtype], family=config.family, seed=config.seed,
                                         bias=config.bias)
                table.loc[index, "peak_bytes_measured"] = str(measured_peak(config, inputs))
                note = f"peak re-measured at {revision} {now}"
            old = table.loc[index, "note"]
            table.loc[index, "note"] = f"{old}; {note}" if old else note
            bar.update()
        write_csv_atomically(path, table.to_dict("records"), table.columns)
    bar.close()
    return len(stale)


# ---- python -m analysis remeasure-memory ---------------------------------------------------------------------

DESCRIPTION = ("For every lce row whose modeled peak differs from lce's current memory model: rewrites the "
               "modeled peak, measures the peak again on CPU rows (same inputs, same profiler), and notes the "
               "revision and date in the row's note column. Errors and times are left as measured.")


def add_arguments(parser) -> None:
    from analysis.core.arguments import argument, names_of, results_option

    parser.add_argument("--grids", type=argument(names_of(["quick", "medium"])), default=("quick", "medium"),
                        help="comma-separated grid results to update (default: quick,medium)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--drop-changed-plans", action="store_true",
                        help="instead: remove the lce rows whose plan resolves differently today (an auto entry "
                             "changed); `python -m analysis sweep --grid NAME` then measures them again")
    results_option(parser)


def run(args) -> None:
    from analysis.paths import display_path

    for name in args.grids:
        path = args.results / f"{name}.csv"
        if args.drop_changed_plans:
            print(f"{display_path(path)}: {drop_changed_plans(path)} row(s) whose plan changed removed")
            continue
        print(f"{display_path(path)}: {remeasure(path, progress=not args.quiet)} row(s) brought up to date")
