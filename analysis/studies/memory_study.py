"""Where the bytes go: lce's planned buffers per policy, and live memory over one forward+backward.

Both are taken at one study problem (bf16 input by default), in seconds: the
breakdown from :func:`lce.plan` (no measurement), the trace from the
allocator's event stream (:func:`analysis.core.memory.allocation_trace`), for lce
next to torch's native op and the unfused reference on the same inputs.
:func:`record` writes them as the ``memory_breakdown`` and ``memory_trace``
results files (``python -m analysis memory-study``), which the figures read.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pandas as pd

from analysis.core.emulated_gemms import emulated_peer_note
from analysis.core.implementations import ImplSpec, make_implementation
from analysis.core.inputs import make_inputs
from analysis.core.memory import allocation_trace
from analysis.core.problem import DTYPES, Shape
from analysis.core.provenance import provenance
from analysis.core.results_io import MEMORY_BREAKDOWN, MEMORY_TRACE, append_rows, set_aside
from analysis.paths import display_path
from lce.planning.options import dtype_name

__all__ = ["STUDY_SHAPE", "STUDY_DTYPE", "STUDY_SPECS", "BREAKDOWN_FILE", "TRACE_FILE", "buffer_breakdown",
           "memory_traces", "peaks", "record"]

STUDY_SHAPE = Shape(2048, 256, 16384)
STUDY_DTYPE = "bfloat16"
STUDY_SPECS: dict[str, ImplSpec] = {
    "lce auto": ImplSpec("lce", "auto", "auto"),
    "lce balanced acc=fp32": ImplSpec("lce", "balanced", "aspect_ratio", "float32"),
    "lce compact acc=bf16": ImplSpec("lce", "compact", "aspect_ratio"),
    "torch auto": ImplSpec("torch", "auto", "auto"),
    "reference": ImplSpec("reference"),
}
"""The configurations compared, by display name (chunked lce ones get a breakdown)."""

BREAKDOWN_FILE = "memory_breakdown.csv"
TRACE_FILE = "memory_trace.csv.gz"


def _problem(name: str, shape: Shape, dtype: str) -> dict[str, object]:
    return {"config": name, "dtype": dtype, "N": shape.N, "D": shape.D, "C": shape.C}


def buffer_breakdown(shape: Shape = STUDY_SHAPE, dtype: str = STUDY_DTYPE) -> pd.DataFrame:
    """One row per planned buffer of every lce configuration: bytes, dtype, stage, span, and the plan's peak."""
    inputs = make_inputs(shape, DTYPES[dtype], bias=False)
    rows = []
    for name, spec in STUDY_SPECS.items():
        if spec.op != "lce":
            continue
        plan = make_implementation(spec).plan(inputs)
        for buffer in plan.buffers:
            rows.append({**_problem(name, shape, dtype), "buffer": buffer.name,
                         "buffer_dtype": dtype_name(buffer.dtype), "stage": buffer.stage, "span": buffer.span,
                         "nbytes": buffer.nbytes, "predicted_peak_bytes": plan.peak_extra_bytes})
    return pd.DataFrame(rows)


def memory_traces(shape: Shape = STUDY_SHAPE, dtype: str = STUDY_DTYPE) -> pd.DataFrame:
    """Live extra bytes after each allocator event (``event`` 0, 1, ...) of one forward+backward, per configuration
    (torch's op and the reference only where this CPU runs their GEMMs natively, see
    :mod:`analysis.core.emulated_gemms`)."""
    inputs = make_inputs(shape, DTYPES[dtype], bias=False)
    frames = []
    for name, spec in STUDY_SPECS.items():
        note = emulated_peer_note(spec.op, dtype, "cpu")
        if note is not None:  # a peer's memory would be the stand-in's, and its emulated GEMMs take minutes here
            print(f"memory study: {name} not traced: {note}")
            continue
        implementation = make_implementation(spec)
        implementation.run(inputs)  # warm-up: first-call allocations (kernels, caches) are not the op's
        _, trace = allocation_trace(functools.partial(implementation.run, inputs))
        frames.append(pd.DataFrame({**_problem(name, shape, dtype), "event": range(len(trace)), "live_bytes": trace}))
    return pd.concat(frames, ignore_index=True)


def peaks(trace: pd.DataFrame, breakdown: pd.DataFrame) -> pd.DataFrame:
    """Per configuration of a ``memory_trace`` table, in trace order: the measured peak, lce's predicted peak
    from the ``memory_breakdown`` table (NaN for ops without a plan), and the peak over the reference's.

    Columns ``config``, ``measured_mib``, ``predicted_mib``, ``measured_over_predicted``, ``over_reference``
    (NaN without a ``reference`` configuration).
    """
    measured = trace.groupby("config", sort=False)["live_bytes"].max() / 2**20
    predicted = breakdown.groupby("config")["predicted_peak_bytes"].first() / 2**20
    table = pd.DataFrame({"config": measured.index, "measured_mib": measured.to_numpy()})
    table["predicted_mib"] = table["config"].map(predicted).astype(float)
    table["measured_over_predicted"] = table["measured_mib"] / table["predicted_mib"]
    reference = measured.get("reference", float("nan"))
    table["over_reference"] = table["measured_mib"] / reference
    return table


def record(folder: Path, shape: Shape = STUDY_SHAPE, dtype: str = STUDY_DTYPE) -> list[Path]:
    """Measure both and write them, with provenance, as ``folder``'s memory study files; return their paths.

    Earlier files of the study are moved aside to ``<name>.previous`` first: a
    study's files always hold one measurement.
    """
    written = []
    for kind, file_name, table in ((MEMORY_BREAKDOWN, BREAKDOWN_FILE, buffer_breakdown(shape, dtype)),
                                   (MEMORY_TRACE, TRACE_FILE, memory_traces(shape, dtype))):
        path = folder / file_name
        set_aside(path)
        append_rows(path, kind.rows(table.assign(**provenance("cpu"))))
        written.append(path)
    return written


# ---- python -m analysis memory-study -------------------------------------------------------------------------

DESCRIPTION = ("Writes memory_breakdown.csv (every buffer of lce's plan per configuration, no measurement) and "
               "memory_trace.csv.gz (live extra bytes after each allocator event of one forward+backward, lce next "
               "to torch and the unfused reference), moving earlier ones to .previous; about 20 s at the default "
               "problem. `figures` draws them.")


def record_and_report(results: Path, shape: Shape, dtype: str) -> None:
    for path in record(results, shape, dtype):
        print(f"{display_path(path)} (an earlier one, if any, is now {path.name}.previous)")


def add_arguments(parser) -> None:
    from analysis.core.arguments import results_option, shape_option

    shape_option(parser, STUDY_SHAPE, "study problem")
    parser.add_argument("--dtype", default=STUDY_DTYPE, choices=("float32", "bfloat16", "float16"),
                        help=f"input dtype (default: {STUDY_DTYPE})")
    results_option(parser)


def run(args) -> None:
    record_and_report(args.results, args.shape, args.dtype)
