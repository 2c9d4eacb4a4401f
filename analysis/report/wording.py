"""The conclusion that closes each notebook section, written by code from the tables the section shows.

One function per conclusion. Each takes tables the notebook already holds and
returns Markdown that starts with :data:`MARKER`, states the finding with its
numbers, then what it rests on (*Inputs*: input family, shapes, dtypes, device
or emulated CUDA layouts, the CPU from the data's provenance, how many seeds)
and where it stops (*Limits*). A notebook displays it with
``IPython.display.Markdown``; re-running the notebook on new data rewrites the
numbers, so prose and data cannot drift apart.

Live-measured tables (notebooks 01 and 02 measure on the spot) carry no
provenance columns: their functions take the CPU's name as ``cpu``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd

from analysis.core.families import CALIBRATION, RANDOM_LOGIT_SCALE, parse_family
from analysis.judge.pareto import (
    VS_UNFUSED,
    seed_interval,
    unfused_words,
)
from analysis.report.notebooks import MARKER
from analysis.report.tables import NA

__all__ = ["MARKER", "count_range", "random_family", "family_description", "spread"]


# --- wording shared by every conclusion ------------------------------------------------------------------------


def random_family(*, bias: bool = True) -> str:
    """The ``random`` input family of :func:`analysis.core.inputs.make_inputs`, in words (its variance from the
    code)."""
    scale = RANDOM_LOGIT_SCALE
    parts = ["x ~ N(0, 1)", f"W ~ N(0, {scale**2:g}/D)"] + (["b ~ N(0, 1)"] if bias else []) + ["uniform targets"]
    return "`random` inputs (" + ", ".join(parts) + ")"


def family_description(name: str, *, bias: bool = True) -> str:
    """An input family (``random``, ``calibrated[:LOSS]``, ``trained[:CHECKPOINT]``) in words, its knobs read from
    :mod:`analysis.core.families`."""
    kind, parameter = parse_family(name)
    if kind == "random":
        return random_family(bias=bias)
    if kind == "calibrated":
        knobs = CALIBRATION
        loss = float(parameter) if parameter else knobs.mean_loss
        low, high = knobs.confident_margin
        return (f"`{name}` inputs (a synthetic head with a trained one's traits: a Zipf class prior of exponent "
                f"{knobs.zipf_exponent:g}, targets drawn from the head's own softmax at a mean loss of {loss:g} "
                f"nats, {knobs.outlier_dims} outlier feature dimensions {knobs.outlier_scale:g}x the rest, "
                f"{knobs.confident_share:.0%} of rows confident by {low:g}–{high:g} nats)")
    return (f"`{name}` inputs (hidden states, head weights and targets of the small LM trained here on the CPython "
            f"standard library, checkpoint {parameter or 'final'})")


def _families(frame: pd.DataFrame, *, bias: bool = True) -> str:
    """Every input family of ``frame`` in words (``random`` when the table has no family column)."""
    names = _values(frame, "family") or ["random"]
    return "; ".join(family_description(name, bias=bias) for name in names)


def _with_seeds(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with ``family`` and ``seed`` columns (``random`` and 0 for tables written before them)."""
    defaults = {column: value for column, value in (("family", "random"), ("seed", 0)) if column not in frame}
    return frame.assign(**defaults) if defaults else frame


def spread(rows: pd.DataFrame, column: str, spec: str = ".2f", unit: str = "") -> str:
    """``column``'s seed median per shape of ``rows`` (a range over shapes) followed by ``unit``, and with several
    seeds the :data:`analysis.judge.pareto.INTERVAL` in brackets (lowest 5th to highest 95th percentile over the
    shapes):
    ``"1.10 [1.00–1.30]"``; :data:`analysis.report.tables.NA` without rows."""
    if rows.empty or column not in rows:
        return NA
    per_shape = seed_interval(_with_seeds(rows), column, by=["N", "D", "C"])
    text = _range(per_shape[column], spec)
    if text != NA:
        text += unit
    if text != NA and per_shape["seeds"].max() > 1:
        text += (f" [{_number(per_shape[f'{column}_low'].min(), spec)}–"
                 f"{_number(per_shape[f'{column}_high'].max(), spec)}]")
    return text


RATIO = ".1f"
"""How a :data:`analysis.judge.pareto.VS_UNFUSED` ratio is written (``1.2x``)."""


def _unfused(rows: pd.DataFrame, dtype: str, *, brackets: bool = True) -> str:
    """`` (1.2x the unfused fp32 computation's own error)`` (seed medians, a range over shapes) for fp32 rows with a
    reference to compare with; ``, 1.2x ...`` without ``brackets``; "" otherwise."""
    if dtype != "float32" or VS_UNFUSED not in rows or not np.isfinite(rows[VS_UNFUSED]).any():
        return ""
    per_shape = seed_interval(_with_seeds(rows), VS_UNFUSED, by=["N", "D", "C"])
    text = f"{_range(per_shape[VS_UNFUSED], RATIO)}x {unfused_words(dtype)}"
    return f" ({text})" if brackets else f", {text}"



def _conclusion(finding: str, bullets: Sequence[str] = (), *, inputs: str, limits: str) -> str:
    lines = [f"{MARKER} {finding}", ""]
    if bullets:
        lines += [f"- {bullet}" for bullet in bullets] + [""]
    lines += [f"*Inputs:* {inputs}", "", f"*Limits:* {limits}"]
    return "\n".join(lines)


def _missing(what: str) -> str:
    """The conclusion of a section whose results are not committed yet: ``what`` says which and how to make them."""
    return _conclusion(what, inputs="the committed results.", limits="nothing to conclude from.")


def _number(value: float, spec: str) -> str:
    return NA if value is None or not np.isfinite(value) else format(value, spec)


def _format(value: float, spec: str) -> str:
    """``format(value, spec)``, without the minus sign of a value that rounds to zero (no "-0.00")."""
    text = format(value, spec)
    return text[1:] if text.startswith("-") and not any(c in "123456789" for c in text) else text


def _range(values: Iterable[float], spec: str = ".2f") -> str:
    """``"1.00"`` when every value formats the same, else ``"1.00–1.48"``; :data:`NA` without values."""
    values = [float(v) for v in values if v is not None and np.isfinite(v)]
    if not values:
        return NA
    low, high = _format(min(values), spec), _format(max(values), spec)
    return low if low == high else f"{low}–{high}"


def count_range(values: Iterable[float]) -> str:
    """``"3"`` when every count is the same, else ``"1–2"`` (e.g. the seeds per arm of a study)."""
    counts = [int(v) for v in values]
    low, high = min(counts), max(counts)
    return str(low) if low == high else f"{low}–{high}"


def _join(items: Sequence[str]) -> str:
    items = list(items)
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]


def _shapes(frame: pd.DataFrame) -> str:
    shapes = sorted({(int(r.N), int(r.D), int(r.C)) for r in frame[["N", "D", "C"]].drop_duplicates().itertuples()})
    words = _join([f"{n}×{d}×{c}" for n, d, c in shapes])
    return f"{'shape' if len(shapes) == 1 else 'shapes'} {words} (N×D×C)"


def _values(frame: pd.DataFrame, column: str) -> list[str]:
    return sorted({str(v) for v in frame[column].dropna()}) if column in frame else []


def _dtypes(frame: pd.DataFrame) -> str:
    return _join(_values(frame, "dtype"))


def _seeds(frame: pd.DataFrame) -> str:
    seeds = sorted({int(s) for s in frame["seed"].dropna()}) if "seed" in frame else []
    if not seeds:
        return "seeds not recorded"
    if len(seeds) == 1:
        return f"one seed ({seeds[0]})"
    return f"{len(seeds)} seeds ({_join([str(s) for s in seeds])})"


def _one_seed(frame: pd.DataFrame) -> str:
    """A limits clause when the data has a single seed (empty otherwise)."""
    seeds = frame["seed"].nunique() if "seed" in frame else 0
    return "one seed, so no error bars; " if seeds <= 1 else ""


def _cpus(frame: pd.DataFrame) -> str:
    """``AMD EPYC, 1 thread``: the CPU(s) and thread counts in the provenance columns."""
    cpus = _values(frame, "cpu_model")
    if not cpus:
        return "CPU not recorded"
    threads = sorted({int(t) for t in frame["num_threads"].dropna()}) if "num_threads" in frame else []
    thread_text = "" if not threads else f", {_join([str(t) for t in threads])} thread{'s' if threads != [1] else ''}"
    return _join(cpus) + thread_text


def _one_cpu(frame: pd.DataFrame, cpu: str | None = None) -> str:
    cpus = _values(frame, "cpu_model") or ([cpu] if cpu else [])
    return f"one CPU ({cpus[0]})" if len(cpus) == 1 else f"{len(cpus)} CPUs pooled ({_join(cpus)})"


def _devices(frame: pd.DataFrame, cpu: str | None = None) -> str:
    """Where the runs ran, in words: the CPU (``cpu``, else the provenance's), lce's CUDA layouts emulated on it,
    a real GPU."""
    parts = []
    devices = set(frame["device"]) if "device" in frame else {"cpu"}
    if "cpu" in devices:
        where = cpu or _cpus(frame[frame["device"] == "cpu"] if "device" in frame else frame)
        parts.append(f"CPU ({where})")
    if "cuda-emulated" in devices:
        parts.append("lce's CUDA layouts emulated on CPU tensors")
    if "cuda" in devices:
        parts.append("a GPU (" + _join(_values(frame[frame["device"] == "cuda"], "device_name")) + ")")
    return _join(parts)


def _emulation_limit(frame: pd.DataFrame) -> str:
    if "device" not in frame or "cuda-emulated" not in set(frame["device"]):
        return ""
    return ("the CUDA rows are lce's CUDA layouts emulated on CPU tensors (an exact upcast stands in for the "
            "mixed-precision GEMM, so only the fp32 summation order differs from cuBLAS; their memory is lce's "
            "model and their time is not a GPU's); ")


# --- 01 · fp64 -------------------------------------------------------------------------------------------------


def _layouts(frame: pd.DataFrame) -> str:
    kinds = _values(frame, "device_kind")
    words = {"cpu": "the CPU layout table", "cuda": "the CUDA layout table (emulated on CPU tensors)"}
    return _join([words.get(kind, kind) for kind in kinds])


def _paths(frame: pd.DataFrame) -> str:
    """``3 policies × 2 chunkings × 3 reductions on the CPU layout table``."""
    counts = [f"{frame[column].nunique()} {word}" for column, word in
              (("policy", "policies"), ("chunking", "chunkings"), ("reduction", "reductions"))]
    return " × ".join(counts) + f" on {_layouts(frame)}"


def _features(frame: pd.DataFrame) -> str:
    names = ("bias", "class weight", "ignore_index", "smoothing")
    counts = {name: int(frame["features"].str.contains(name, regex=False).sum()) for name in names}
    return ", ".join(f"{name} on {count}" for name, count in counts.items())


def _finding(conclusion: str) -> str:
    """The finding of a notebook conclusion: its first paragraph without the marker."""
    return conclusion.split("\n\n", 1)[0].removeprefix(MARKER).strip()
