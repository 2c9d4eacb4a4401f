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

from .families import CALIBRATION, RANDOM_LOGIT_SCALE, parse_family
from .pareto import (
    ERROR,
    INTERVAL,
    MEMORY,
    TIE_RULE,
    TIME,
    VERDICT_TOLERANCE,
    VS_UNFUSED,
    recommend_choices,
    same_numbers,
    seed_interval,
    unfused_words,
)
from .tables import NA

__all__ = ["MARKER", "count_range", "random_family", "family_description", "spread", "gradcheck", "parity",
           "policy_errors", "chunk_growth", "loss_drift", "all_ignored", "memory_model", "buffer_breakdown",
           "memory_trace", "auto_table", "verdicts", "fronts", "fp32_choice"]

MARKER = "**Conclusion.**"
"""How every conclusion starts (tests/test_notebooks.py requires one at the end of each section)."""

MODEL_BAND = 0.15
"""A memory prediction within this fraction of the measured peak counts as matching it."""

GROWTH_EXPONENT = 0.2
"""A fitted exponent above this counts as growth with the chunk count (0.5: independent per-chunk rounding)."""


# --- wording shared by every conclusion ------------------------------------------------------------------------


def random_family(*, bias: bool = True) -> str:
    """The ``random`` input family of :func:`analysis.inputs.make_inputs`, in words (its variance from the code)."""
    scale = RANDOM_LOGIT_SCALE
    parts = ["x ~ N(0, 1)", f"W ~ N(0, {scale**2:g}/D)"] + (["b ~ N(0, 1)"] if bias else []) + ["uniform targets"]
    return "`random` inputs (" + ", ".join(parts) + ")"


def family_description(name: str, *, bias: bool = True) -> str:
    """An input family (``random``, ``calibrated[:LOSS]``, ``trained[:CHECKPOINT]``) in words, its knobs read from
    :mod:`analysis.families`."""
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
    seeds the :data:`analysis.pareto.INTERVAL` in brackets (lowest 5th to highest 95th percentile over the shapes):
    ``"1.10 [1.00–1.30]"``; :data:`analysis.tables.NA` without rows."""
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
"""How a :data:`analysis.pareto.VS_UNFUSED` ratio is written (``1.2x``)."""


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


def gradcheck(table: pd.DataFrame, *, cpu: str) -> str:
    """01: did ``torch.autograd.gradcheck`` pass on every path (a ``fp64_checks.gradcheck_table``)?"""
    from .studies.fp64_checks import INPUTS_DESCRIPTION

    failed = table[~table["gradcheck"].astype(bool)]
    if failed.empty:
        finding = (f"lce's analytic gradients are the derivatives of its loss on all {len(table)} chunked paths: "
                   "`torch.autograd.gradcheck` (fp64 finite differences) passed on every one.")
        bullets = []
    else:
        finding = f"gradcheck **failed** on {len(failed)} of {len(table)} paths:"
        bullets = [f"{r.policy}, {r.chunking}, {r.reduction}, {r.features} ({r.device_kind} layouts)"
                   for r in failed.itertuples()]
    quick = "" if "cuda" in set(table["device_kind"]) else (
        "the CUDA layout table is not in this quick run (`LCE_QUICK=0` adds it); ")
    return _conclusion(
        finding, bullets,
        inputs=(f"{_paths(table)}, paths with features: {_features(table)}; {INPUTS_DESCRIPTION}; "
                f"{_shapes(table)}, float64; run on {cpu} when the notebook executed."),
        limits=(f"{quick}one tiny shape and one seed; gradcheck shows that the gradients are those of lce's own "
                "loss, not that the loss is right: the next section compares it with the reference."))


def parity(table: pd.DataFrame, *, cpu: str, tolerance: float | None = None) -> str:
    """01: does every chunked path equal the reference path in fp64, lce's and torch's (a ``parity_table``)?"""
    from .studies.fp64_checks import INPUTS_DESCRIPTION, PARITY_TOLERANCE, parity_summary

    tolerance = PARITY_TOLERANCE if tolerance is None else tolerance
    summary = parity_summary(table, tolerance)
    worst = summary["lce_worst"].max()
    per_output = ", ".join(f"{r.output} {r.lce_worst:.1e}" for r in summary.itertuples())
    if summary["lce_ok"].all():
        finding = (f"In fp64 every chunked lce path agrees with the reference path to within {worst:.1e} of each "
                   f"output's largest entry (worst per output: {per_output}), below the {tolerance:.0e} bound: "
                   "chunking adds nothing beyond rounding.")
    else:
        bad = summary[~summary["lce_ok"].astype(bool)]["output"]
        finding = (f"lce **disagrees** with the reference path beyond the {tolerance:.0e} bound on "
                   f"{_join(list(bad))} (worst {worst:.1e}; per output: {per_output}).")
    chunked = table[table["torch_path"] == "chunked"]
    fallback = len(table) - len(chunked)
    if chunked.empty:
        torch_text = f"torch 2.13's op fell back to its reference path on all {len(table)} paths."
    else:
        torch_worst = summary["torch_worst"].max()
        verdict = "within" if torch_worst < tolerance else "**beyond**"
        fell_back = table[table["torch_path"] != "chunked"]["features"].str.contains("smoothing", regex=False)
        chunked_smoothing = chunked["features"].str.contains("smoothing", regex=False).any()
        why = " (the paths with label smoothing)" if fell_back.all() and not chunked_smoothing else ""
        torch_text = (f"torch 2.13's chunked op ran on {len(chunked)} of {len(table)} paths and is {verdict} the "
                      f"same bound there (worst {torch_worst:.1e}); on the other {fallback}{why} it fell back to "
                      "its reference path, so those say nothing about its chunking.")
    return _conclusion(
        finding, [torch_text],
        inputs=(f"{_paths(table)}; {INPUTS_DESCRIPTION}; {_shapes(table)}, float64; error = "
                f"max |value − ref| / max |ref| per output; run on {cpu} when the notebook executed."),
        limits=("one shape and one seed; fp64 only, where rounding is negligible: this shows the algebra is "
                "right, not how accurate low precision is (notebook 02)."))


# --- 02 · accuracy ---------------------------------------------------------------------------------------------


def _seed_medians(rows: pd.DataFrame, column: str) -> list[float]:
    """``column``'s seed median per shape of ``rows``."""
    if rows.empty:
        return []
    return list(seed_interval(_with_seeds(rows), column, by=["N", "D", "C"])[column])


def policy_errors(table: pd.DataFrame) -> str:
    """02: errors in floors of lce's and torch's defaults and explicit policies, per input family and dtype
    (prepared sweep table).

    Uses the CPU rows with default ("auto") chunking; seed medians (ranges over shapes) with their interval.
    """
    data = table[(table["device"] == "cpu") & table["op"].isin(["lce", "torch"]) & (table["chunking"] == "auto")]
    if data.empty:
        return _conclusion("The results hold no CPU runs of lce or torch with default chunking.",
                           inputs="the committed sweep results.", limits="nothing to conclude from.")
    data = _with_seeds(data)
    bullets, low_precision = [], {}
    for (family, dtype), rows in data.groupby(["family", "dtype"], sort=True):
        default = rows[(rows["policy"] == "auto") & (rows["acc_dtype"] == "default")]
        parts = []
        for op in ("lce", "torch"):
            mine = default[default["op"] == op]
            parts.append(f"{op} {spread(mine, ERROR)} on its worst gradient{_unfused(mine, dtype)} and "
                         f"{spread(mine, 'loss_fro_in_floors')} on the loss")
            if dtype != "float32":
                found = low_precision.setdefault(family, {})
                found.setdefault(op, []).extend(_seed_medians(mine, ERROR))
                found.setdefault(f"{op}_loss", []).extend(_seed_medians(mine, "loss_fro_in_floors"))
        explicit = rows[(rows["policy"] != "auto") & (rows["acc_dtype"] == "default")]
        spans = []
        for op in ("lce", "torch"):
            medians = [median for _, mine in explicit[explicit["op"] == op].groupby("policy")
                       for median in _seed_medians(mine, ERROR)]
            if medians:
                spans.append(f"{op} {_range(medians)}")
        wide = rows[(rows["op"] == "lce") & (rows["policy"] != "auto") & (rows["acc_dtype"] == "float32")]
        wide_text = ""
        if dtype != "float32" and len(wide):
            wide_text = ("; with `acc_dtype=float32`, lce " + ", ".join(
                f"{policy} {spread(mine, ERROR)}" for policy, mine in wide.groupby("policy")))
        bullets.append(f"**{family}, {dtype}**, default options: " + "; ".join(parts)
                       + (f". Explicit policies without acc_dtype (computing in {dtype}): " + ", ".join(spans)
                          if spans else "") + wide_text + ".")
    finding = ("Worst-gradient and loss errors in rounding floors (1 = the exact answer rounded once), seed medians "
               "per input family.")
    if low_precision:
        per_family = [f"{'' if len(low_precision) == 1 else f'on {family} inputs, '}lce is at "
                      f"{_range(found.get('lce', []))} rounding floors on its worst gradient and "
                      f"{_range(found.get('lce_loss', []))} on the loss, torch 2.13 at "
                      f"{_range(found.get('torch', []))} and {_range(found.get('torch_loss', []))}"
                      for family, found in low_precision.items()]
        finding = ("With default options in bf16 and fp16, " + "; ".join(per_family) + " (seed medians, ranges "
                   "over shapes and dtypes; 1 = the exact answer rounded once).")
    return _conclusion(
        finding, bullets,
        inputs=(f"{_families(data)}; {_shapes(data)}; {_dtypes(data)}; {_devices(data)}; default (\"auto\") "
                f"chunking; {_seeds(data)}, medians over seeds with the {INTERVAL} in brackets; fp32 errors also as "
                "multiples of the unfused fp32 computation's on the same inputs; the committed sweep results."),
        limits=(f"{_one_seed(data)}{_shape_count(data)}, so a median hides the spread over shapes (the figures show "
                f"every run); {_one_cpu(data)}; CPU layouts only here (the CUDA layouts are in notebook 04)."))


def chunk_growth(runs: pd.DataFrame, fits: pd.DataFrame, *, cpu: str) -> str:
    """02: which policies' weight-gradient error grows with the chunk count (``growth.chunk_growth`` rows, their
    ``fit_power_law`` fits with a ``layouts`` column)."""
    counts = sorted(runs["chunks"].unique())
    growing = fits[fits["exponent"] > GROWTH_EXPONENT].sort_values("exponent", ascending=False)
    flat = fits[fits["exponent"] <= GROWTH_EXPONENT]
    bullets = [f"{r.impl} {r.policy} ({r.layouts} layouts): error ∝ chunks^{_format(r.exponent, '.2f')}, "
               f"{r.at_max_chunks:.2f} floors at {counts[-1]} chunks" for r in growing.itertuples()]
    accurate = fits[(fits["impl"] == "lce") & (fits["policy"] == "accurate")]
    if growing.empty:
        finding = ("No policy's weight-gradient error grows with the chunk count (every fitted exponent ≤ "
                   f"{GROWTH_EXPONENT}).")
    else:
        finding = (f"Rounding the weight gradient once per chunk makes its error grow with the chunk count: "
                   f"{len(growing)} of {len(fits)} series have a fitted exponent above {GROWTH_EXPONENT} "
                   f"({_range(growing['exponent'])}).")
    if len(accurate):
        finding += (f" lce's accurate policy, which sums in fp32 and rounds once, stays at "
                    f"{_range(accurate['at_max_chunks'])} floors at {counts[-1]} chunks "
                    f"(exponent {_range(accurate['exponent'])}).")
    if len(flat):
        bullets.append("flat (exponent ≤ " + f"{GROWTH_EXPONENT}): " + ", ".join(
            f"{r.impl} {r.policy} ({r.layouts}, {_format(r.exponent, '.2f')})" for r in flat.itertuples()))
    acc = _join(_values(runs, "acc_dtype"))
    return _conclusion(
        finding, bullets,
        inputs=(f"{random_family()}; {_shapes(runs)}; {_dtypes(runs)} with acc_dtype={acc}; chunk counts "
                f"{_join([str(c) for c in counts])} (explicit rows per chunk); "
                f"{_devices(runs, f'{cpu}, when the notebook executed')}; {_seeds(runs)}."),
        limits=(f"{_one_seed(runs)}one shape: the exponents are least-squares fits to {len(counts)} points, a "
                f"description of this run rather than a law; {_emulation_limit(runs)}torch's op runs on the CPU "
                "only."))


def loss_drift(drift: pd.DataFrame, *, cpu: str) -> str:
    """02: how far the default-options loss is from the exact one, in ulps, per chunk count (``defects.loss_drift``
    rows for one or more seeds)."""
    worst = drift.groupby(["impl", "chunks"])["ulps_from_exact"].max()
    counts = sorted(drift["chunks"].unique())
    first, last = counts[0], counts[-1]
    impls = set(worst.index.get_level_values(0))
    seeds = drift["seed"].nunique()
    finding = ""
    if "torch" in impls:
        torch = worst["torch"]
        finding += (f"torch's loss is up to {torch[first]:.2f} ulps from the exact loss at {first} chunk"
                    f"{'s' if first != 1 else ''} and up to {torch[last]:.2f} at {last} (worst over {seeds} "
                    f"seed{'s' if seeds != 1 else ''}). ")
    if "lce" in impls:
        lce_max = float(worst["lce"].max())
        rounding = ("correctly rounded (≤ 0.5 ulp)" if lce_max <= 0.5 else "within 1 ulp" if lce_max <= 1
                    else f"**{lce_max:.2f} ulps** off")
        finding += (f"lce's loss is {rounding} at every chunk count, at most {lce_max:.2f} ulps from the exact loss: "
                    "it sums across chunks in fp64 and rounds once.")
    return _conclusion(
        finding,
        inputs=(f"{random_family()}; {_shapes(drift)}; {_dtypes(drift)}; default options with explicit chunk "
                f"counts {_join([str(c) for c in counts])}; CPU ({cpu}, when the notebook executed); "
                f"{_seeds(drift)}; ulps of {_dtypes(drift)} at the exact (fp64) loss."),
        limits=("one shape and few seeds; the CPU path of torch's op (its CUDA path may sum differently); "
                "one ulp of a loss near 10 is 0.06 in bf16, small for training, large for a reference."))


def all_ignored(table: pd.DataFrame, *, cpu: str) -> str:
    """02: what each op returns when every target is ignored (``defects.all_ignored_gradients``)."""
    nan_columns = [c for c in table.columns if c.endswith("_nan_entries")]
    bullets = []
    for row in table.itertuples():
        nans = int(sum(getattr(row, c) for c in nan_columns))
        loss = "NaN" if not np.isfinite(row.loss) else f"{row.loss:.3g}"
        grads = (f"**{nans:,} NaN gradient entries**" if nans else
                 f"finite gradients, largest |entry| {row.max_abs_finite_grad:.3g}"
                 + (" (all zero)" if row.max_abs_finite_grad == 0 else ""))
        bullets.append(f"{row.impl}: {row.reduction} loss {loss}, {grads}")
    nan_impls = [r.impl for r in table.itertuples() if sum(getattr(r, c) for c in nan_columns)]
    lce = table[table["impl"] == "lce"]
    lce_clean = len(lce) and not sum(int(lce[c].iloc[0]) for c in nan_columns)
    finding = ("With every target ignored, " + ("lce returns zero gradients, as the reference does"
                                                 if lce_clean else "lce returns NaN gradients")
               + ("; " + _join(nan_impls) + " returns NaN gradients, which would poison an optimizer step."
                  if nan_impls else "; no op returns NaN gradients."))
    chunks = table["chunk_rows"].dropna().unique() if "chunk_rows" in table else []
    chunk_text = f"; chunked ops with default options and {int(chunks[0])}-row chunks" if len(chunks) else ""
    return _conclusion(
        finding, bullets,
        inputs=(f"{random_family()} with every target set to ignore_index; {_shapes(table)}; {_dtypes(table)}"
                f"{chunk_text}; CPU ({cpu}, when the notebook executed); {_seeds(table)}."),
        limits="one shape, one dtype and one reduction; the CPU path of torch's op.")


# --- 03 · memory -----------------------------------------------------------------------------------------------


def memory_model(table: pd.DataFrame) -> str:
    """03: how close lce's predicted peak is to the measured one over the lce CPU runs of a prepared sweep table."""
    data = table[(table["op"] == "lce") & (table["device"] == "cpu")].dropna(
        subset=["peak_bytes_measured", "peak_bytes_modeled"])
    if data.empty:
        return _conclusion("The results hold no measured lce CPU runs.", inputs="the committed sweep results.",
                           limits="nothing to conclude from.")
    ratio = data["peak_bytes_measured"].astype(float) / data["peak_bytes_modeled"].astype(float)
    within = int(((ratio - 1).abs() <= MODEL_BAND).sum())
    finding = (f"lce's memory model predicts the measured peak within ±{MODEL_BAND:.0%} on {within} of {len(ratio)} "
               f"runs (measured/modeled {ratio.min():.2f}–{ratio.max():.2f}, median {ratio.median():.2f}).")
    off = data.assign(ratio=ratio)[(ratio - 1).abs() > MODEL_BAND]
    bullets = []
    if len(off):
        worst = off.groupby(["dtype", "policy", "acc_dtype"])["ratio"].agg(["min", "max", "size"])
        worst = worst.reindex(worst["max"].sub(1).abs().sort_values(ascending=False).index).head(4)
        bullets = [f"{dtype} {policy} acc={acc}: {int(row['size'])} runs outside, measured/modeled "
                   f"{_range([row['min'], row['max']])}" for (dtype, policy, acc), row in worst.iterrows()]
        above = int((off["ratio"] > 1).sum())
        share = f"all {above}" if above == len(off) else f"{above} of the {len(off)}"
        finding += f" Outside it, {share} measure more than predicted" + (":" if bullets else ".")
    methods = _join(_values(data, "memory_method"))
    return _conclusion(
        finding, bullets,
        inputs=(f"every lce run of the committed sweep on the CPU: {_families(data)}; {_shapes(data)}; "
                f"{_dtypes(data)}; {_cpus(data)}; {_seeds(data)}; measured: peak live tensor bytes of one "
                f"forward+backward ({methods}); modeled: lce.plan's peak_extra_bytes."),
        limits=(f"{_one_seed(data)}small shapes, where fixed overheads weigh more than at LLM sizes; the CPU "
                f"allocator only (no GPU data committed); {_one_cpu(data)}."))


def _mib(nbytes: float) -> str:
    return f"{nbytes / 2**20:.1f} MiB"


def buffer_breakdown(breakdown: pd.DataFrame) -> str:
    """03: what lce's plan allocates per configuration and what separates the largest from the smallest peak
    (a ``memory_breakdown`` results table)."""
    peaks = breakdown.groupby("config", sort=False)["predicted_peak_bytes"].first()
    largest, smallest = peaks.idxmax(), peaks.idxmin()
    bullets = []
    for config, peak in peaks.items():
        buffers = breakdown[breakdown["config"] == config].sort_values("nbytes", ascending=False)
        top = buffers.head(2)
        bullets.append(f"{config}: predicted peak {_mib(peak)}, {len(buffers)} buffers; largest "
                       + _join([f"{b.buffer} ({b.buffer_dtype}, {b.span}, {_mib(b.nbytes)})"
                                for b in top.itertuples()]))
    finding = (f"lce's plans predict peaks from {_mib(peaks.min())} ({smallest}) to {_mib(peaks.max())} "
               f"({largest}), {peaks.max() / peaks.min():.1f}x apart.")
    missing = set(breakdown[breakdown["config"] == largest]["buffer"]) - set(
        breakdown[breakdown["config"] == smallest]["buffer"])
    if missing:
        rows = breakdown[(breakdown["config"] == largest) & breakdown["buffer"].isin(missing)]
        finding += (f" {smallest} has no " + _join([f"{b.buffer} ({b.buffer_dtype}, {_mib(b.nbytes)})"
                                                   for b in rows.itertuples()]) + ".")
    return _conclusion(
        finding, bullets,
        inputs=(f"lce.plan for {_shapes(breakdown)}, {_dtypes(breakdown)} input, no bias; configurations "
                f"{_join(list(peaks.index))}; recorded by `python -m analysis memory-study` (revision "
                f"{_join(_values(breakdown, 'git_revision'))})."),
        limits=("a plan, not a measurement (the next section measures); one shape and one input dtype; the sum of "
                "the buffers exceeds the peak because chunk buffers and the final rounding never coexist."))


def memory_trace(peaks: pd.DataFrame, trace: pd.DataFrame) -> str:
    """03: measured peaks of one forward+backward against lce's predictions and the unfused reference
    (``memory_study.peaks`` of a ``memory_trace`` table, and that table for its provenance)."""
    bullets = []
    for row in peaks.itertuples():
        text = f"{row.config}: {row.measured_mib:.1f} MiB"
        if np.isfinite(row.predicted_mib):
            text += f" (predicted {row.predicted_mib:.1f}, measured/predicted {row.measured_over_predicted:.2f})"
        if np.isfinite(row.over_reference) and row.config != "reference":
            text += f", {row.over_reference:.2f}x the reference"
        bullets.append(text)
    lce = peaks[peaks["config"].str.startswith("lce")]
    others = peaks[~peaks["config"].str.startswith("lce")]
    finding = (f"Measured over one forward+backward, lce's configurations peak at "
               f"{_range(lce['measured_mib'], '.1f')} MiB, within {_range(lce['measured_over_predicted'])}x of "
               f"their predicted peaks")
    if len(others):
        finding += "; " + _join([f"{r.config} peaks at {r.measured_mib:.1f} MiB" for r in others.itertuples()])
    finding += "."
    return _conclusion(
        finding, bullets,
        inputs=(f"{random_family(bias=False)}; {_shapes(trace)}; {_dtypes(trace)}; CPU ({_cpus(trace)}); one call "
                "per configuration after a warm-up call, live tensor bytes after each allocator event "
                "(memory does not depend on the input values)."),
        limits=("the CPU allocator only (CUDA needs a GPU); one shape and one dtype; live tensor bytes, not the "
                "process's resident memory."))


# --- 04 · Pareto and the auto table ----------------------------------------------------------------------------


def auto_table(entries: pd.DataFrame, verdicts_table: pd.DataFrame, drawn: Iterable[str]) -> str:
    """04: what the "auto" table claims and what can test it.

    ``entries`` has one row per entry (``device``, ``dtype``, ``evidence``: a tuple of figure stems; the
    fallback's ``device`` is ``"other"``); ``drawn`` holds the stems of the figures the committed results draw.
    """
    drawn = set(drawn)
    listed = entries[entries["device"] != "other"]
    stems = sorted({stem for evidence in entries["evidence"] for stem in evidence})
    missing = [stem for stem in stems if stem not in drawn]
    finding = (f"lce's \"auto\" table has {len(listed)} entries and a fallback; each names the figures that carry "
               f"its evidence, {len(stems)} in all, ")
    finding += ("every one drawn from the committed results." if not missing else
                f"of which {len(stems) - len(missing)} {'is' if len(stems) - len(missing) == 1 else 'are'} drawn "
                "from the committed results; "
                f"{_join([f'`{stem}`' for stem in missing])} {'has' if len(missing) == 1 else 'have'} no data yet.")
    bullets = []
    if len(verdicts_table):
        shapes = verdicts_table.groupby(["device", "dtype"]).size()
        per_device = [f"{device}: {_join(list(rows.index.get_level_values('dtype')))}"
                      for device, rows in shapes.groupby(level="device")]
        entries_word = "entry" if len(shapes) == 1 else "entries"
        seeds = verdicts_table["seeds"] if "seeds" in verdicts_table else pd.Series([1])
        seeds_text = f"{_range(seeds, '.0f')} seed{'' if seeds.max() == 1 else 's'}"
        bullets.append(f"the verdicts below judge {len(shapes)} {entries_word} on {_range(shapes, '.0f')} problems "
                       f"(input family × shape) each, {seeds_text} a problem (" + "; ".join(per_device) + ")")
    if "cuda" not in set(verdicts_table.get("device", [])):
        bullets.append("no real-GPU results are committed: the cuda entries are judged on the emulated CUDA layouts")
    return _conclusion(
        finding, bullets,
        inputs="the table in `lce/policies.py` at this revision; the results files in `analysis/results/`.",
        limits="a reason is a claim; only the verdicts and figures test it, on the shapes and machines they cover.")


def _off_front(off: pd.DataFrame, everything: pd.DataFrame, axis: str) -> list[str]:
    """One line per (family, device, dtype) with picks off the ``axis`` ("memory" or "time") front: on which
    shapes, in how many seeds, the rivals, their error next to the pick's, and what they save (seed medians)."""
    lines = []
    for (family, device, dtype), rows in off.groupby(["family", "device", "dtype"], sort=True):
        total = len(everything[(everything["family"] == family) & (everything["device"] == device)
                               & (everything["dtype"] == dtype)])
        names = list(dict.fromkeys(rows[f"{axis}_dominator"]))
        rivals = _join([f"`{name}`" for name in names]) + (" reaches" if len(names) == 1 else " reach")
        if axis == "memory":
            saving = rows["peak_mib"] / rows["memory_dominator_peak_mib"]
            gain = f"with {_range(saving, '.1f')}x less memory"
        else:
            saving = rows["time_ms"] / rows["time_dominator_ms"]
            gain = f"in {_range(1 / saving, '.2f')}x the time"
        seeds = f"off in {_range(rows[f'{axis}_off_seeds'], '.0f')} of {_range(rows['seeds'], '.0f')} seeds"
        text = (f"{family} {device} {dtype}, {len(rows)} of {total} shapes ({', '.join(rows['shape'])}), {seeds}: "
                f"{rivals} {_range(rows[f'{axis}_dominator_error'])} floors (the pick: {_range(rows['error'])}) "
                f"{gain}")
        if axis == "memory" and device != "cuda-emulated" and rows["on_time_front"].all():
            text += "; the pick is on the time front there"
        lines.append(text)
    return lines


def _sweep_inputs(data: pd.DataFrame) -> str:
    repeats = sorted(int(r) for r in data["time_repeats"].dropna().unique()) if "time_repeats" in data else []
    time = ("not timed" if not repeats else
            f"time: median of {_join([str(r) for r in repeats])} repeats (measured on the first seed: memory and "
            "time do not depend on the values)")
    return (f"{_families(data)}; {_shapes(data)}; {_dtypes(data)}; {_devices(data)}; {_seeds(data)}, errors are "
            f"medians over seeds with the {INTERVAL} in brackets; {time}; the committed sweep results.")


def _shape_count(data: pd.DataFrame) -> str:
    """``one small shape per family`` / ``3 small shapes per family`` (the most any family has)."""
    counts = _with_seeds(data).groupby("family")[["N", "D", "C"]].apply(lambda rows: len(rows.drop_duplicates()))
    most = int(counts.max()) if len(counts) else 0
    return f"{'one small shape' if most == 1 else f'{most} small shapes'} per family"


def _pick_errors(verdicts_table: pd.DataFrame) -> list[str]:
    """Per (family, dtype): the auto picks' seed-median worst-gradient error with its interval (fp32: against the
    unfused computation too)."""
    lines = []
    for (family, dtype), rows in verdicts_table.groupby(["family", "dtype"], sort=True):
        text = (f"{family} {dtype}: the auto picks' worst gradient at {_range(rows['error'])} floors "
                f"[{_number(rows['error_low'].min(), '.2f')}–{_number(rows['error_high'].max(), '.2f')}] over "
                f"{_range(rows['seeds'], '.0f')} seed{'' if rows['seeds'].max() == 1 else 's'}")
        if dtype == "float32" and np.isfinite(rows["vs_unfused"]).any():
            text += f", {_range(rows['vs_unfused'], RATIO)}x {unfused_words(dtype)}"
        lines.append(text)
    return lines


def verdicts(verdicts_table: pd.DataFrame, table: pd.DataFrame) -> str:
    """04: how many auto picks are on each front in every seed, and who beats the others
    (``pareto.verdicts`` of ``table``)."""
    if verdicts_table.empty:
        return _conclusion("The results hold no run of an \"auto\" pick to judge.",
                           inputs="the committed sweep results.", limits="nothing to conclude from.")
    timed = verdicts_table[verdicts_table["device"] != "cuda-emulated"]
    memory_on = int(verdicts_table["on_memory_front"].sum())
    time_on = int(timed["on_time_front"].sum())
    finding = (f"{memory_on} of {len(verdicts_table)} auto picks (entries × input families × shapes) are on the "
               "error–memory front in every seed")
    finding += (f", and {time_on} of the {len(timed)} measured on the CPU on the error–time front "
                "(emulated CUDA picks are not timed)." if len(timed) else ".")
    off_memory = verdicts_table[~verdicts_table["on_memory_front"].astype(bool)]
    off_time = timed[~timed["on_time_front"].astype(bool)]
    bullets = [f"off the memory front — {line}" for line in _off_front(off_memory, verdicts_table, "memory")]
    bullets += [f"off the time front — {line}" for line in _off_front(off_time, verdicts_table, "time")]
    bullets += _pick_errors(verdicts_table)
    judged = _with_seeds(table)
    judged = judged[judged["device"].isin(set(verdicts_table["device"]))
                    & judged["dtype"].isin(set(verdicts_table["dtype"]))
                    & judged["family"].isin(set(verdicts_table["family"]))]
    return _conclusion(
        finding, bullets,
        inputs=_sweep_inputs(judged) + " A rival must be no worse on both axes and more than "
                                       f"{VERDICT_TOLERANCE:.0%} better on one, in one seed, to knock a pick off.",
        limits=(f"{_one_seed(judged)}{_shape_count(judged)}; {_emulation_limit(judged)}"
                f"{_one_cpu(judged)}; times of one thread on a shared machine."))


def fronts(table: pd.DataFrame, device: str) -> str:
    """04: per input family and dtype on ``device``, where the auto pick, the best lce run and torch's best run
    sit (prepared table; seed medians)."""
    from .pareto import verdicts as judge

    data = _with_seeds(table[table["device"] == device])
    if data.empty:
        return _conclusion(f"The results hold no {device} runs.", inputs="the committed sweep results.",
                           limits="nothing to conclude from.")
    picks = judge(_with_seeds(table))
    picks = picks[picks["device"] == device]
    configs = seed_interval(data, [ERROR, MEMORY])
    bullets = []
    for (family, dtype), rows in configs.groupby(["family", "dtype"], sort=True):
        shapes = ["N", "D", "C"]
        text = f"**{family}, {dtype}**: lowest error of any run {_range(rows.groupby(shapes)[ERROR].min())} floors"
        mine = picks[(picks["family"] == family) & (picks["dtype"] == dtype)]
        if len(mine):
            unfused = ""
            if dtype == "float32" and np.isfinite(mine["vs_unfused"]).any():
                unfused = f", {_range(mine['vs_unfused'], RATIO)}x {unfused_words(dtype)}"
            text += (f"; the auto pick {_range(mine['error'])} floors [{_number(mine['error_low'].min(), '.2f')}–"
                     f"{_number(mine['error_high'].max(), '.2f')}]{unfused} at {_range(mine['peak_mib'])} MiB")
        torch = rows[rows["op"] == "torch"]
        if len(torch):
            text += f"; torch's best run {_range(torch.groupby(shapes)[ERROR].min())} floors"
        cheapest = rows.loc[rows.groupby(shapes)[MEMORY].idxmin()]
        text += (f"; the least memory any run needs {_range(cheapest[MEMORY])} MiB, at "
                 f"{_range(cheapest[ERROR])} floors")
        bullets.append(text + ".")
    memory_kind = "lce's modeled memory" if device == "cuda-emulated" else "measured peak memory"
    finding = (f"On {device}, per input family and dtype ({memory_kind}; seed medians, ranges over shapes, the "
               f"pick's {INTERVAL} in brackets; 1 floor = the exact answer rounded once):")
    return _conclusion(
        finding, bullets,
        inputs=_sweep_inputs(data),
        limits=f"{_one_seed(data)}{_shape_count(data)}; {_emulation_limit(data)}{_one_cpu(data)}.")


def _members(members: Sequence[str]) -> str:
    return _join([f"`{m}`" for m in members])


def fp32_choice(table: pd.DataFrame) -> str:
    """04: what fp32 should use, per input family, device and cost, with ties named as ties
    (:data:`analysis.pareto.TIE_RULE`); errors are compared across every seed."""
    table = _with_seeds(table)
    fp32 = table[(table["dtype"] == "float32") & (table["op"] == "lce")]
    devices = [d for d in ("cpu", "cuda", "cuda-emulated") if len(fp32[fp32["device"] == d])]
    if not devices:
        return _conclusion("The results hold no fp32 lce runs.", inputs="the committed sweep results.",
                           limits="nothing to conclude from.")
    families = sorted(set(fp32["family"]))
    bullets, answers, policy_free, judged = [], [], [], []
    for family in families:
        for device in devices:
            rows = fp32[(fp32["device"] == device) & (fp32["family"] == family)]
            if rows.empty:
                continue
            judged.append((family, device))
            where = device if len(families) == 1 else f"{family}, {device}"
            costs = [(MEMORY, "memory", "MiB", ".2f")]
            if device != "cuda-emulated":  # its times are the CPU stand-in's, as in the verdicts
                costs.append((TIME, "time", "ms", ".1f"))
            chunking_of = dict(zip(rows["label"], rows["chunking"], strict=False))
            for cost, word, unit, spec in costs:
                choices = recommend_choices(table, device, "float32", cost=cost, family=family)
                if choices.empty:
                    continue
                top = choices.iloc[0]
                mine = rows[rows["label"] == top["choice"]]
                interval = (f" [{top[f'{ERROR}_low']:.2f}–{top[f'{ERROR}_high']:.2f}]"
                            if mine["seed"].nunique() > 1 else "")
                unfused = _unfused(mine, "float32", brackets=False)
                text = (f"**{where}, {word} × error**: `{top['choice']}` (score {top['score']:.2f}, "
                        f"{top[ERROR]:.2f} floors{interval}{unfused}, {format(top[cost], spec)} {unit})")
                if len(top["members"]) > 1:
                    spread = "" if cost == MEMORY else (f"; their scores differ only by timing noise, "
                                                        f"{top['score_low']:.2f}–{top['score_high']:.2f}")
                    text += (f" — a tie of {len(top['members'])} spellings that compute the same numbers: "
                             f"{_members(top['members'])}{spread}")
                if len(choices) > 1:
                    runner = choices.iloc[1]
                    text += f"; next: `{runner['choice']}` ({runner['score']:.2f})"
                pick = choices[choices["members"].map(lambda members: "lce auto auto" in members)]
                if len(pick):
                    rank = int(pick.index[0]) + 1
                    text += (". The current default (`lce auto auto`) is " + ("this choice" if rank == 1 else
                             f"choice {rank} of {len(choices)} (score {pick['score'].iloc[0]:.2f})"))
                bullets.append(text + ".")
                chunking = chunking_of.get(top["choice"], "")
                answers.append((family, device, word, "the default chunking" if chunking == "auto" else
                                f"`{chunking}`"))
            names = same_numbers(table, device, "float32", family=family)
            per_chunking = rows.assign(choice=rows["label"].map(names)).groupby("chunking")["choice"].nunique()
            if rows["policy"].nunique() > 1 and len(per_chunking) and (per_chunking == 1).all():
                policy_free.append((family, device))
    per_device = []
    for family, device in judged:
        mine = [f"{chunking} for {word} × error" for f, where, word, chunking in answers
                if (f, where) == (family, device)]
        if mine:
            place = f"on {device}" if len(families) == 1 else f"for {family} inputs on {device}"
            per_device.append(f"{place}, {_join(mine)}")
    if set(policy_free) == set(judged):
        finding = ("What should fp32 use? The policy does not matter: for a given chunking every policy gives "
                   "bit-identical errors on every shape and seed. The chunking does: " + "; ".join(per_device) + ".")
    else:
        finding = "What should fp32 use? By the data: " + "; ".join(per_device) + "."
        bullets += [f"on {device}{'' if len(families) == 1 else f' ({family} inputs)'} the policy makes no "
                    "difference: for each chunking every policy gives bit-identical errors on every shape and seed"
                    for family, device in policy_free]
    data = fp32[fp32["device"].isin(devices)]
    return _conclusion(
        finding, bullets,
        inputs=(_sweep_inputs(data) + " Score: mean over shapes and seeds of log(cost / best cost) + log(error / "
                f"best error), lower is better; ties: {TIE_RULE}."),
        limits=(f"{_one_seed(data)}{_shape_count(data)}, and the score weighs a factor in cost like the same factor "
                f"in error; {_emulation_limit(data)}{_one_cpu(data)}."))
