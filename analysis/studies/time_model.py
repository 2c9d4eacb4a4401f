"""``python -m analysis time-model``: fit :mod:`lce.decide.time_model`'s constants to the committed measurements of each
device kind, and report how well they predict the measurements they were not fitted to.

**Samples** (:func:`samples`): every timed run of lce whose options and machine the results record --

* CPU: :data:`CPU_KINDS` -- the budgets and class-tiling studies and ``recommend_check`` (CPU kinds with native
  bf16, the AVX2 stand-in that emulates it, the AVX512F stand-in whose bf16 kernel is slow, and each CPU that ran
  ``python -m analysis cpu-kinds``); each with the bf16 capability it planned with;
* CUDA: the GPU check's ``gpu_bench`` rows and the ``cuda`` grid's lce rows (TF32 off and on, an H200).

Each sample's plan is made again (:func:`lce.make_plan`, on meta or CPU tensors under the recorded capability), and its
cost is counted as the plan's :func:`lce.decide.time_model.time_terms`, with the code of the revision that measured it:
CUDA rows from before the accumulator sum became one GEMM per chunk (:data:`BLOCKED_SUM_UNTIL`) added their
weight-gradient products in blocks of a million elements, as they ran.

**The fit** (:func:`fit`): each machine's GEMM rates are measured, not fitted (:func:`machine_rates`: a CPU's from
``python -m analysis cpu-kinds``, an H200's from its datasheet); the shared constants of a device kind
(``half_rows``, ``half_features``, ``bandwidth``, ``elementwise_passes``, ``launch_overhead``, ``step_overhead``)
minimise the squared
error of the log of the predicted time, by L-BFGS on their logarithms. The constants lce ships take the median
machine's rates as the reference (on CUDA the H200 with TF32 off, :data:`REFERENCE_MACHINE`); a CPU's own
low-precision rate comes from :mod:`lce.planning.cpu_gemms` at run time.

**Held out** (:func:`held_out`): each shape's samples predicted by a fit to the other shapes: the share within
+-30% and the median and worst ratio of predicted over measured time.

Writes ``lce/decide/time_model.json`` (the constants and the fit report), which :mod:`lce.decide.time_model` reads.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import statistics
from collections.abc import Iterator, Sequence
from pathlib import Path

import pandas as pd
import torch

import lce
from analysis.core.problem import DTYPES
from analysis.core.results_io import load_kind
from analysis.paths import RESULTS_DIR
from analysis.sweep.remeasure import _config
from lce.decide.time_model import (
    CONSTANTS_FILE,
    TimeConstants,
    estimated_seconds,
    gemm_compute_dtype,
    gemm_names,
    time_terms,
)
from lce.planning import blocks
from lce.planning.resolve import make_plan
from lce.testing import cpu_gemms, emulate_device_kind

__all__ = ["Sample", "BLOCKED_SUM_UNTIL", "TOLERANCE", "REFERENCE_MACHINE", "as_run_options",
           "predicted_seconds_as_run", "samples", "fit", "held_out", "record"]

BLOCKED_SUM_UNTIL = "2026-12-06"
"""CUDA rows dated before this day ran the weight-gradient sum in blocks of 2^20 elements (lce.passes.gemm before its
CUDA
block size): their costs are counted that way."""

TOLERANCE = 0.30
"""The held-out report's band: a prediction within +-30% of the measured time counts as a hit."""

CPU_KINDS: tuple[str, ...] = ("budgets", "class_tiling", "recommend_check")
"""The results kinds whose timed CPU runs the fit uses: each times one configuration at a time in one process; runs
count only where the same session measured the machine's GEMM rates (:func:`machine_rates`). The sweeps' CPU times
are left out: their grids run two worker processes at once, and the same configuration's time varies up to 6x
between input families there."""


@dataclasses.dataclass(frozen=True)
class Sample:
    """One measured run: its device kind, the machine it ran on (``machine``: CPU model and capability, or the GPU),
    its shape (``shape``, the held-out groups), the plan's cost terms at unit rates (``gemms``: per GEMM its FLOPs,
    the compute dtype's name and its rows; ``terms``: :class:`lce.decide.time_model.TimeTerms` with ``gemm_seconds`` 0),
    and the measured ``seconds``."""

    kind: str
    machine: str
    shape: str
    gemms: tuple[tuple[float, str, int, int], ...]
    terms: tuple[float, float, float, float]
    seconds: float
    source: str


def _support(text: str) -> str | None:
    """The bf16 capability a row's ``cpu_gemms`` column records ("native", "slow", "emulated"), None if not."""
    for word in ("native", "slow", "emulated"):
        if f"bfloat16 {word}" in str(text):
            return word
    return None


def _machine(row) -> str:
    """A CPU and the session it ran in: its model, any ISA caps of a stand-in, the day (machines are lent per
    session, and two sessions' "Intel Xeon" measured fp32 GEMMs 120 and 97 GFLOP/s) and the threads it used."""
    caps = str(row.get("cpu_gemms", "")).partition("ISA capped: ")[2]
    return (f"{row['cpu_model']}" + (f" [{caps}]" if caps else "")
            + f" on {str(row['date'])[:10]}, {int(row['num_threads'])} thread(s)")


@contextlib.contextmanager
def _era(kind: str, date: str) -> Iterator[None]:
    """Count a CUDA row's cost with the block size of the code that measured it."""
    if kind != "cuda" or str(date) >= BLOCKED_SUM_UNTIL:
        yield
        return
    saved = blocks._CUDA_BLOCK_ELEMENTS
    blocks._CUDA_BLOCK_ELEMENTS = blocks._BLOCK_ELEMENTS
    try:
        yield
    finally:
        blocks._CUDA_BLOCK_ELEMENTS = saved


def _sample(kind: str, machine: str, options: lce.LinearCrossEntropyOptions, n: int, d: int, c: int, dtype: str,
            seconds: float, date: str, source: str, support: str | None = None, bias: bool = False) -> Sample:
    device = torch.device("meta")
    context = emulate_device_kind("cuda") if kind == "cuda" else contextlib.nullcontext()
    if kind == "cpu" and support is not None and DTYPES[dtype] in (torch.bfloat16, torch.float16):
        device = torch.device("cpu")
        context = cpu_gemms({torch.bfloat16: support, torch.float16: "emulated"})
    with context, _era(kind, date):
        plan = make_plan(options, num_rows=n, in_features=d, num_classes=c, dtype=DTYPES[dtype], device=device,
                         needs_grad=(True, True, bias))
        unit = TimeConstants({dt: 1.0 for dt in DTYPES.values()}, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, "unit")
        terms = time_terms(plan, unit)
    rows = min(plan.batch_chunk_size, n)
    gemms = tuple((2.0 * n * c * d, str(gemm_compute_dtype(plan, name)).removeprefix("torch."), rows, d)
                  for name in gemm_names(plan))
    return Sample(kind, machine, f"{n}x{d}x{c} {dtype}", gemms, (terms.bytes, terms.logit_bytes, terms.launches,
                                                                   terms.steps), float(seconds), source)


def _options(policy, acc_dtype, rows, classes=None) -> lce.LinearCrossEntropyOptions:
    acc = None if str(acc_dtype) in ("", "nan", "None", "default") else DTYPES[str(acc_dtype)]
    return lce.LinearCrossEntropyOptions(acc_policy=str(policy), acc_dtype=acc, chunking_method=None,
                                         batch_chunk_size=int(rows),
                                         class_chunk_size=None if classes is None or pd.isna(classes) else int(classes))


def as_run_options(row) -> lce.LinearCrossEntropyOptions:
    """The options that give the plan a sweep row ran: its resolved policy and acc_dtype and its recorded rows per
    chunk. Its configured chunking (``auto``, an aspect ratio) resolves to other rows once lce's rules change (the
    CUDA auto floor of 2048 rows came after the H200's grid ran)."""
    return _options(row["resolved_policy"], row["resolved_acc_dtype"], int(float(row["chunk_size"])))


def predicted_seconds_as_run(row, device: str) -> float:
    """lce's time model for the plan a sweep row of ``device`` (``cuda``, ``cuda-tf32``, ``cpu``) ran, counted as the
    code of its date ran it (:data:`BLOCKED_SUM_UNTIL`), under today's constants."""
    kind = "cuda" if device.startswith("cuda") else "cpu"
    context = emulate_device_kind("cuda") if kind == "cuda" else contextlib.nullcontext()
    with context, _era(kind, row["date"]):
        plan = make_plan(as_run_options(row), num_rows=int(row["N"]), in_features=int(row["D"]),
                         num_classes=int(row["C"]), dtype=DTYPES[row["dtype"]], device=torch.device("meta"),
                         needs_grad=(True, True, str(row["bias"]) == "True"))
        return estimated_seconds(plan)


def cpu_samples(folder: Path = RESULTS_DIR) -> list[Sample]:
    """The CPU's timed lce runs (see the module docstring)."""
    out: list[Sample] = []
    for kind in CPU_KINDS:
        _, table = load_kind(folder, kind)
        for _, row in table[table["time_median_s"].notna()].iterrows():
            options = _options(row["policy"], row["acc_dtype"], row["batch_chunk_size"], row["class_chunk_size"])
            # the capability the run planned with (recommend_check's capability-blind rows assumed native bf16 on a
            # CPU that emulates it: their bf16 GEMMs ran on the emulated kernel, at that machine's bf16 rate)
            assumed = str(row.get("bf16_gemms_assumed", ""))
            support = assumed if assumed in ("native", "slow", "emulated") else _support(row["cpu_gemms"]) or "native"
            machine = _machine(row)
            if support == "native" and _support(row["cpu_gemms"]) in ("emulated", "slow"):
                machine += " [its own bf16 kernel]"
            out.append(_sample("cpu", machine, options, int(row["N"]), int(row["D"]), int(row["C"]),
                               row["dtype"], row["time_median_s"], row["date"], kind, support))
    rated = set(machine_rates("cpu", folder))
    return [sample for sample in out if sample.machine in rated]


def cuda_samples(folder: Path = RESULTS_DIR) -> list[Sample]:
    """The GPU's timed lce runs (see the module docstring); TF32 runs on a machine of their own (their fp32 GEMMs
    run at the TF32 rate)."""
    out: list[Sample] = []
    _, grid = load_kind(folder, "sweep")
    rows = grid[(grid["op"] == "lce") & grid["device"].isin(["cuda", "cuda-tf32"]) & grid["time_median_s"].notna()]
    for _, row in rows.iterrows():
        config = _config(row)
        machine = f"{row['device_name']}" + (" TF32" if row["device"] == "cuda-tf32" else "")
        out.append(_sample("cuda", machine, as_run_options(row), config.N, config.D, config.C, config.dtype,
                           row["time_median_s"], row["date"], "cuda grid", bias=config.bias))
    _, bench = load_kind(folder, "gpu_bench")
    for _, row in bench[(bench["op"] == "lce") & (bench["status"] == "ok")].iterrows():
        chunking = str(row["impl"]).split(",")[1]
        rows_per_chunk = int(row["N"]) // int(row["num_chunks"]) if chunking == "auto" else int(chunking.split(":")[1])
        options = _options(row["policy"] if row["policy"] != "auto" else row["resolved_policy"],
                           row["acc_dtype"] if row["acc_dtype"] != "default" else "float32", rows_per_chunk)
        out.append(_sample("cuda", str(row["device_name"]), options, int(row["N"]), int(row["D"]), int(row["C"]),
                           row["dtype"], row["time_median_s"], row["date"], "gpu bench"))
    return out


def samples(kind: str, folder: Path = RESULTS_DIR) -> list[Sample]:
    return cpu_samples(folder) if kind == "cpu" else cuda_samples(folder)


REFERENCE_MACHINE: dict[str, str] = {"cuda": "NVIDIA H200"}
"""The machine whose GEMM rates lce ships for a device kind, where not the median machine's: on CUDA the H200 with
TF32 off, torch's default for fp32 matmuls (the TF32 runs are a setting a user turns on, not another GPU)."""

H200_FLOPS: dict[str, float] = {"bfloat16": 989e12, "float16": 989e12, "float32": 67e12, "float64": 67e12}
"""An H200's dense GEMM rates from its datasheet (FLOP/s); with TF32 on, fp32 GEMMs run at 494e12."""
H200_TF32_FLOPS = 494e12


def machine_rates(kind: str, folder: Path = RESULTS_DIR) -> dict[str, dict[str, float]]:
    """Each machine's GEMM rates (FLOP/s by compute dtype name): on a CPU the 512x512x8192 products of
    ``python -m analysis cpu-kinds`` (``cpu_gemm_rates``: the median per machine, session and thread count, and
    dtype); on CUDA the datasheet's (:data:`H200_FLOPS`). A CPU's bf16 GEMMs that its plans run on fp32
    copies are costed at its fp32 rate (the plan says which); the capability-blind runs' emulated kernel at the
    emulated rate."""
    if kind == "cuda":
        return {"NVIDIA H200": dict(H200_FLOPS), "NVIDIA H200 TF32": {**H200_FLOPS, "float32": H200_TF32_FLOPS}}
    _, table = load_kind(folder, "cpu_gemm_rates")
    rates: dict[str, dict[str, float]] = {}
    for machine, group in table.groupby(table.apply(_machine, axis=1)):
        per_dtype = group.groupby("dtype")["gflops"].median() * 1e9
        rates[machine] = {str(dtype): float(rate) for dtype, rate in per_dtype.items()}
        rates[machine + " [its own bf16 kernel]"] = rates[machine]
    return rates



_SHARED = ("half_rows", "half_features", "bandwidth", "elementwise_passes", "launch_overhead", "step_overhead")
_START = {"cpu": {"half_rows": 32.0, "half_features": 32.0, "bandwidth": 1e10, "elementwise_passes": 6.0,
                  "launch_overhead": 1e-5, "step_overhead": 1e-4},
          "cuda": {"half_rows": 32.0, "half_features": 32.0, "bandwidth": 4e12, "elementwise_passes": 6.0,
                   "launch_overhead": 1e-5, "step_overhead": 1e-4}}


@dataclasses.dataclass(frozen=True)
class Fit:
    """Fitted shared constants, and the machines' GEMM rates they were fitted with (FLOP/s, by compute dtype)."""

    shared: dict[str, float]
    rates: dict[str, dict[str, float]]

    def predict(self, sample: Sample) -> float:
        rates = self.rates.get(sample.machine) or _reference_rates(self.rates)
        gemm_seconds = sum(flops / rates[dtype] * (1 + self.shared["half_rows"] / rows
                                                   + self.shared["half_features"] / d)
                           for flops, dtype, rows, d in sample.gemms)
        traffic, logit_bytes, launches, steps = sample.terms
        return (gemm_seconds + (traffic + self.shared["elementwise_passes"] * logit_bytes) / self.shared["bandwidth"]
                + launches * self.shared["launch_overhead"] + steps * self.shared["step_overhead"])


def _reference_rates(rates: dict[str, dict[str, float]]) -> dict[str, float]:
    """The median machine's rates (for a machine without measured rates)."""
    names = sorted({dtype for machine in rates.values() for dtype in machine})
    return {dtype: statistics.median(machine[dtype] for machine in rates.values() if dtype in machine)
            for dtype in names}


def fit(data: Sequence[Sample], rates: dict[str, dict[str, float]], iterations: int = 200) -> Fit:
    """The shared constants minimising the squared log error over ``data``, the GEMM rates given (see the module
    docstring)."""
    kind = data[0].kind
    log_shared = {name: torch.tensor(math.log(_START[kind][name]), dtype=torch.float64, requires_grad=True)
                  for name in _SHARED}
    reference = _reference_rates(rates)
    gemm_rows = [[(flops / (rates.get(s.machine) or reference)[dtype], rows, d) for flops, dtype, rows, d in s.gemms]
                 for s in data]
    terms = torch.tensor([s.terms for s in data], dtype=torch.float64)
    measured = torch.tensor([s.seconds for s in data], dtype=torch.float64).log()

    def predicted() -> torch.Tensor:
        shared = {name: value.exp() for name, value in log_shared.items()}
        gemm_seconds = torch.stack([sum(seconds * (1 + shared["half_rows"] / rows + shared["half_features"] / d)
                                        for seconds, rows, d in gemms) for gemms in gemm_rows])
        return (gemm_seconds + (terms[:, 0] + shared["elementwise_passes"] * terms[:, 1]) / shared["bandwidth"]
                + terms[:, 2] * shared["launch_overhead"] + terms[:, 3] * shared["step_overhead"])

    optimiser = torch.optim.LBFGS(list(log_shared.values()), max_iter=iterations, line_search_fn="strong_wolfe")

    def closure():
        optimiser.zero_grad()
        loss = (predicted().log() - measured).square().mean()
        loss.backward()
        return loss

    optimiser.step(closure)
    return Fit({name: float(value.detach().exp()) for name, value in log_shared.items()}, rates)


def _report(fitted: Fit, data: Sequence[Sample]) -> dict:
    ratios = [fitted.predict(s) / s.seconds for s in data]
    return {"samples": len(data), "within": sum(abs(r - 1) <= TOLERANCE for r in ratios) / len(ratios),
            "median_ratio": statistics.median(ratios), "worst_ratio": max(ratios, key=lambda r: abs(math.log(r)))}


def held_out(data: Sequence[Sample], rates: dict[str, dict[str, float]]) -> dict:
    """Each shape's samples predicted by a fit to the others (see the module docstring)."""
    ratios = []
    for shape in sorted({s.shape for s in data}):
        train = [s for s in data if s.shape != shape]
        if not train or len({s.shape for s in train}) < 2:
            continue
        fitted = fit(train, rates, iterations=100)
        ratios += [fitted.predict(s) / s.seconds for s in data if s.shape == shape]
    return {"samples": len(ratios), "shapes": len({s.shape for s in data}),
            "within": sum(abs(r - 1) <= TOLERANCE for r in ratios) / len(ratios) if ratios else math.nan,
            "median_ratio": statistics.median(ratios) if ratios else math.nan,
            "worst_ratio": max(ratios, key=lambda r: abs(math.log(r))) if ratios else math.nan}


def _source(kind: str, data: Sequence[Sample], report: dict) -> str:
    machines = sorted({s.machine for s in data})
    return (f"predicted by a model fitted to {len(data)} measured runs on {len(machines)} "
            f"{'CPU kinds' if kind == 'cpu' else 'GPU settings'} ({', '.join(machines)}); held out by shape, "
            f"{report['within']:.0%} within +-{TOLERANCE:.0%} (lce.decide.time_model.FIT)")


def record(folder: Path = RESULTS_DIR, out: Path = CONSTANTS_FILE, kinds: Sequence[str] = ("cpu", "cuda"),
           echo=print) -> dict:
    """Fit each device kind's constants, report the held-out fit, and write ``out`` (lce/decide/time_model.json)."""
    existing = json.loads(out.read_text()) if out.exists() else {"constants": {}, "fit": {}}
    for kind in kinds:
        data = samples(kind, folder)
        echo(f"{kind}: {len(data)} samples on {len({s.machine for s in data})} machines")
        rates = machine_rates(kind, folder)
        fitted = fit(data, rates)
        report = {"fit": _report(fitted, data), "held_out": held_out(data, rates),
                  "machines": sorted({s.machine for s in data})}
        reference = rates[REFERENCE_MACHINE[kind]] if kind in REFERENCE_MACHINE else _reference_rates(
            {m: r for m, r in rates.items() if m in report["machines"]})
        flops = {"float64": reference["float32"] / 2, "float32": reference["float32"],
                 "bfloat16": reference.get("bfloat16", reference["float32"]),
                 "float16": reference.get("float16", reference.get("bfloat16", reference["float32"]))}
        constants = TimeConstants({DTYPES[name]: rate for name, rate in flops.items()}, **fitted.shared,
                                  source=_source(kind, data, report["held_out"]))
        existing["constants"][kind] = constants.to_json()
        existing["fit"][kind] = report
        echo(f"  shared {json.dumps({k: float(f'{v:.3g}') for k, v in fitted.shared.items()})}")
        echo(f"  fit {report['fit']}; held out {report['held_out']}")
    out.write_text(json.dumps(existing, indent=1, sort_keys=True) + "\n")
    return existing


# ---- python -m analysis time-model -------------------------------------------------------------------------------

DESCRIPTION = ("Fits lce.decide.time_model's constants (GEMM rates, row efficiency, bandwidth, elementwise passes, "
               "launch "
               "and step overheads) to the committed timed runs of each device kind and writes "
               "lce/decide/time_model.json "
               "with the fit's held-out report (each shape predicted by a fit to the others). About a minute.")


def add_arguments(parser) -> None:
    parser.add_argument("--kinds", default="cpu,cuda", help="device kinds to fit (default: cpu,cuda)")
    parser.add_argument("--results", type=Path, default=RESULTS_DIR, help="results folder (default: analysis/results)")
    parser.add_argument("--out", type=Path, default=CONSTANTS_FILE,
                        help="where to write (default: lce/decide/time_model.json)")


def run(args) -> None:
    record(args.results, args.out, tuple(kind for kind in args.kinds.split(",") if kind))
