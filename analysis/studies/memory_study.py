"""Where the bytes go: lce's planned buffers per policy, and live memory over one forward+backward.

Both are computed on the spot (seconds) at one study problem, bf16 input:
the breakdown from :func:`lce.plan` (no measurement), the trace from the
allocator's event stream (:func:`analysis.memory.allocation_trace`), next to
torch's native op and the unfused reference on the same inputs.
"""

from __future__ import annotations

import functools

import pandas as pd

from lce.options import dtype_name

from ..implementations import ImplSpec, make_implementation
from ..inputs import DTYPES, Shape, make_inputs
from ..memory import allocation_trace

__all__ = ["STUDY_SHAPE", "STUDY_DTYPE", "STUDY_SPECS", "buffer_breakdown", "memory_traces"]

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


def buffer_breakdown(shape: Shape = STUDY_SHAPE, dtype: str = STUDY_DTYPE) -> pd.DataFrame:
    """One row per planned buffer of every lce configuration: size, stage, span, and the plan's peak."""
    inputs = make_inputs(shape, DTYPES[dtype], bias=False)
    rows = []
    for name, spec in STUDY_SPECS.items():
        if spec.op != "lce":
            continue
        plan = make_implementation(spec).plan(inputs)
        for buffer in plan.buffers:
            rows.append({"config": name, "buffer": buffer.name, "MiB": buffer.nbytes / 2**20,
                         "stage": buffer.stage, "span": buffer.span, "dtype": dtype_name(buffer.dtype),
                         "predicted_peak_MiB": plan.peak_extra_bytes / 2**20})
    return pd.DataFrame(rows)


def memory_traces(shape: Shape = STUDY_SHAPE, dtype: str = STUDY_DTYPE) -> pd.DataFrame:
    """Live extra MiB after each allocator event of one forward+backward, per configuration.

    ``progress`` is the event index scaled to [0, 1] so calls with different
    numbers of allocations share an axis.
    """
    inputs = make_inputs(shape, DTYPES[dtype], bias=False)
    frames = []
    for name, spec in STUDY_SPECS.items():
        implementation = make_implementation(spec)
        implementation.run(inputs)  # warm-up: first-call allocations (kernels, caches) are not the op's
        _, trace = allocation_trace(functools.partial(implementation.run, inputs))
        count = max(len(trace) - 1, 1)
        frames.append(pd.DataFrame({"config": name, "event": range(len(trace)),
                                    "progress": [i / count for i in range(len(trace))],
                                    "live_MiB": [b / 2**20 for b in trace]}))
    return pd.concat(frames, ignore_index=True)
