"""Speed and memory of lce next to torch's native op, the unfused reference and torch.compile of it.

One bench run at one problem (default: the issue's N=4096 D=512 C=32768):

* time: every implementation called in turn, ``repeats`` rounds after one
  warm-up round, so a busy spell on the shared machine hits all of them
  alike; the median per implementation is reported;
* peak extra memory: measured in a fresh process per implementation
  (:func:`analysis.core.memory.measure_peak` on the allocator's event stream), so
  no caching or earlier call leaks into the figure;
* the 3-GEMM floor: ``6 N D C`` flops at the rate of one ``(N, D) x (D, C)``
  GEMM measured in the same dtype -- what the three GEMMs of the op cost
  with nothing else.

On a CPU that emulates the dtype's GEMMs (:mod:`lce.planning.cpu_gemms`: minutes per call at the bench shape on an
AVX2-only CPU) the peers that would call them (torch's op, the unfused reference, torch.compile) and the
floor are not run; the README's table says so for that CPU kind (:mod:`analysis.core.emulated_gemms`).

Each measurement is one row of a ``bench`` results file
(``analysis/results/bench.csv``) with provenance; ``chunk_sweep`` times lce's
policies against the chunk size (a ``chunk_sweep`` file, ``bench_chunks.csv``),
the data behind the CPU entries of lce's "auto" table. The functions return
tables; ``python -m analysis bench`` appends them through
:func:`analysis.core.results_io.append_rows`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import subprocess
import sys
import time

import pandas as pd
import torch

from analysis.core.emulated_gemms import emulated_peer_note, emulated_peer_skip
from analysis.core.implementations import ImplSpec, make_implementation, unavailable_reason
from analysis.core.inputs import make_inputs
from analysis.core.memory import measure_peak
from analysis.core.problem import BENCH_SHAPE, DTYPES, Shape, parse_shape
from analysis.core.provenance import provenance
from analysis.paths import ROOT, display_path
from lce.planning.cpu_gemms import gemm_support
from lce.planning.options import dtype_name

__all__ = ["BENCH_IMPLS", "SCALING_IMPLS", "CHUNK_SWEEP_POLICIES", "gemm_floor_s", "run_bench", "run_scaling",
           "chunk_sweep", "ratios", "against_baseline"]

BENCH_IMPLS: dict[str, ImplSpec] = {
    "lce": ImplSpec("lce", "auto", "auto"),
    "lce accurate": ImplSpec("lce", "accurate", "auto", "float32"),
    "lce balanced": ImplSpec("lce", "balanced", "auto", "float32"),
    "lce compact": ImplSpec("lce", "compact", "auto", "float32"),
    "torch": ImplSpec("torch", "auto", "auto"),
    "unfused": ImplSpec("reference"),
    "compiled": ImplSpec("compiled"),
}
"""Display name -> implementation; "lce" and "torch" use default options (explicit policies
get acc_dtype=float32, which low-precision input needs for a mixed-precision layout)."""


def gemm_floor_s(shape: Shape, dtype: str, repeats: int = 3) -> float:
    """Seconds for the op's three GEMMs at the measured rate of one (N, D) x (D, C) GEMM in ``dtype``."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(shape.N, shape.D, generator=g).to(DTYPES[dtype])
    w = torch.randn(shape.C, shape.D, generator=g).to(DTYPES[dtype])
    x @ w.T  # warm-up
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        x @ w.T
        samples.append(time.perf_counter() - start)
    return 3 * statistics.median(samples)


def _peak_in_fresh_process(name: str, shape: Shape, dtype: str) -> int:
    command = [sys.executable, "-m", "analysis.studies.bench", "--memory-child", name, str(shape), dtype]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True, timeout=1800)
    return int(json.loads(done.stdout.strip().splitlines()[-1])["peak_bytes"])


def _memory_child(name: str, shape_text: str, dtype: str) -> None:
    implementation = make_implementation(BENCH_IMPLS[name])
    inputs = make_inputs(parse_shape(shape_text), DTYPES[dtype], bias=False)
    _, measured = measure_peak(lambda: implementation.run(inputs))
    print(json.dumps({"peak_bytes": measured.peak_bytes}))


def _row(shape: Shape, dtype: str, impl: str, metric: str, value: float, **extra) -> dict[str, object]:
    return {"impl": impl, "dtype": dtype, "N": shape.N, "D": shape.D, "C": shape.C, "metric": metric,
            "value": value, **extra, **provenance("cpu")}


def run_bench(shape: Shape, dtypes: tuple[str, ...] = ("float32", "bfloat16"), *, repeats: int = 3,
              impls: tuple[str, ...] = tuple(BENCH_IMPLS), memory: bool = True) -> pd.DataFrame:
    """Time (interleaved rounds), fresh-process peak memory and the GEMM floor; one row per measurement."""
    rows = []
    for dtype in dtypes:
        inputs = make_inputs(shape, DTYPES[dtype], bias=False)
        runnable = {name: make_implementation(BENCH_IMPLS[name]) for name in impls
                    if unavailable_reason(BENCH_IMPLS[name].op, "cpu") is None
                    and _not_run_here(BENCH_IMPLS[name].op, dtype) is None}
        for name in impls:
            if _not_run_here(BENCH_IMPLS[name].op, dtype):
                print(f"bench: {name} {dtype} not run: {_not_run_here(BENCH_IMPLS[name].op, dtype)}")
        samples: dict[str, list[float]] = {name: [] for name in runnable}
        for round_index in range(repeats + 1):  # round 0 is the warm-up (and compiles)
            for name, implementation in runnable.items():
                start = time.perf_counter()
                implementation.run(inputs)
                if round_index:
                    samples[name].append(time.perf_counter() - start)
        for name, values in samples.items():
            plan = runnable[name].plan(inputs)
            chunking = {} if plan is None else {"chunk_size": plan.batch_chunk_size, "num_chunks": plan.num_chunks,
                                                "modeled_peak_bytes": plan.peak_extra_bytes}
            rows.append(_row(shape, dtype, name, "time_s", statistics.median(values),
                             spread_s=max(values) - min(values), repeats=len(values), **chunking))
            if memory:
                rows.append(_row(shape, dtype, name, "peak_bytes", _peak_in_fresh_process(name, shape, dtype),
                                 **chunking))
        if not gemm_support(DTYPES[dtype]).emulated:
            rows.append(_row(shape, dtype, "3-GEMM floor", "time_s", gemm_floor_s(shape, dtype)))
    return pd.DataFrame(rows)


def _not_run_here(op: str, dtype: str) -> str | None:
    """Why a peer is not timed on this CPU (it emulates the dtype's GEMMs: minutes per call at the bench shape)."""
    if emulated_peer_note(op, dtype, "cpu") is None and emulated_peer_skip(op, dtype, "cpu") is None:
        return None
    return f"this CPU emulates {dtype} GEMMs (lce.planning.cpu_gemms) and {op} would call them: minutes per call here"


SCALING_IMPLS: tuple[str, ...] = ("lce", "torch", "unfused")
"""What the scaling figure compares (the full set at every size would take an hour here)."""


def run_scaling(base: Shape, dtypes: tuple[str, ...] = ("float32", "bfloat16"), factors: tuple[int, ...] = (4, 2, 1),
                repeats: int = 1) -> pd.DataFrame:
    """:func:`run_bench` for ``SCALING_IMPLS`` at ``base`` with N, then C, divided by each factor."""
    shapes = dict.fromkeys([Shape(base.N // f, base.D, base.C) for f in factors]
                           + [Shape(base.N, base.D, base.C // f) for f in factors])
    return pd.concat([run_bench(shape, dtypes, repeats=repeats, impls=SCALING_IMPLS) for shape in shapes],
                     ignore_index=True)


def ratios(table: pd.DataFrame) -> pd.DataFrame:
    """lce's time and memory as ratios of torch's, the unfused reference's and the floor, per dtype (NaN where
    the other was not run: a peer on a CPU that emulates the dtype's GEMMs)."""
    out = []
    for (dtype, shape), group in table.groupby(["dtype", table.N.astype(str) + "x" + table.D.astype(str) + "x"
                                                 + table.C.astype(str)]):
        value = {(r.impl, r.metric): r.value for r in group.itertuples()}
        row = {"dtype": dtype, "shape": shape, "lce_s": value.get(("lce", "time_s"))}
        for name, impl, metric in (("lce/torch time", "torch", "time_s"), ("lce/unfused time", "unfused", "time_s"),
                                   ("lce/floor time", "3-GEMM floor", "time_s"),
                                   ("lce/torch memory", "torch", "peak_bytes"),
                                   ("lce/unfused memory", "unfused", "peak_bytes")):
            mine, theirs = value.get(("lce", metric)), value.get((impl, metric))
            row[name] = mine / theirs if mine and theirs else float("nan")
        out.append(row)
    return pd.DataFrame(out)


CHUNK_SWEEP_SPECS: dict[str, ImplSpec] = {
    "auto": ImplSpec("lce", "auto"),
    "accurate": ImplSpec("lce", "accurate", acc_dtype="float32"),
    "balanced": ImplSpec("lce", "balanced", acc_dtype="float32"),
    "compact": ImplSpec("lce", "compact"),
}
"""Policies the chunk sweep times (the chunking is set per size): the default options, and each explicit
policy as a user would spell it for low-precision input (mixed-precision layouts with acc_dtype=float32;
compact with the input dtype, its accumulator-free layout). On fp32 input they all resolve to the same
arithmetic."""


CHUNK_SWEEP_POLICIES: tuple[str, ...] = ("auto", "balanced", "compact")
"""What ``python -m analysis bench --chunk-sweep`` times: on CPU, "auto" is "accurate" for fp16/bf16."""


def chunk_sweep(shape: Shape, dtypes: tuple[str, ...] = ("float32", "bfloat16"),
                rows_options: tuple[int, ...] = (32, 64, 128, 256, 512, 1024), repeats: int = 2,
                policies: tuple[str, ...] = ("auto",)) -> pd.DataFrame:
    """Time of lce per policy and explicit chunk size (interleaved rounds); one row per (dtype, policy, size).

    fp32 input runs only "auto": every policy computes the same numbers there.
    """
    out = []
    for dtype in dtypes:
        inputs = make_inputs(shape, DTYPES[dtype], bias=False)
        names = ("auto",) if dtype == "float32" else policies
        runnable = {(name, rows): make_implementation(dataclasses.replace(CHUNK_SWEEP_SPECS[name],
                                                                          chunking=f"rows:{rows}"))
                    for name in names for rows in rows_options}
        samples: dict[tuple[str, int], list[float]] = {setting: [] for setting in runnable}
        for round_index in range(repeats + 1):
            for setting, implementation in runnable.items():
                start = time.perf_counter()
                implementation.run(inputs)
                if round_index:
                    samples[setting].append(time.perf_counter() - start)
        for (name, rows), values in samples.items():
            plan = runnable[(name, rows)].plan(inputs)
            out.append(_row(shape, dtype, "lce" if name == "auto" else f"lce {name}", "time_s",
                            statistics.median(values), spread_s=max(values) - min(values), chunk_size=rows,
                            num_chunks=plan.num_chunks, modeled_peak_bytes=plan.peak_extra_bytes,
                            resolved_policy=plan.acc_policy, resolved_acc_dtype=dtype_name(plan.acc_dtype),
                            repeats=len(values)))
    return pd.DataFrame(out)


_TIME_CHILD = """
import statistics, sys, time, torch, lce
n, d, c = (int(v) for v in sys.argv[1].split("x"))
dtype, calls = getattr(torch, sys.argv[2]), int(sys.argv[3])
torch.set_num_threads(int(sys.argv[4]))
g = torch.Generator().manual_seed(0)
x = torch.randn(n, d, generator=g).to(dtype).requires_grad_()
w = (torch.randn(c, d, generator=g) * (3.0 / d**0.5)).to(dtype).requires_grad_()
y = torch.randint(0, c, (n,), generator=g)
options = lce.LinearCrossEntropyOptions()
samples = []
for call in range(calls + 1):
    start = time.perf_counter()
    lce.linear_cross_entropy(x, w, y, options=options).backward()
    if call:
        samples.append(time.perf_counter() - start)
print(statistics.median(samples))
"""


def against_baseline(shape: Shape, dtypes: tuple[str, ...], revision: str, *, rounds: int = 3,
                     calls: int = 2) -> pd.DataFrame:
    """lce's default options here and at git ``revision``, each timed in its own fresh process, alternating.

    ``rounds`` alternations of one process per version (each: one warm-up call, then the median of
    ``calls``), so a busy spell on a shared machine hits both alike; the median over rounds is kept. The
    baseline runs from a temporary ``git worktree`` of ``revision``. Rows: impl ``lce now`` (this checkout)
    and ``lce@<revision>``, metric ``time_s`` (not ``lce``: the bench table's own rows keep that name).
    """
    import os
    import tempfile

    threads = torch.get_num_threads()
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        baseline = f"{folder}/baseline"
        subprocess.run(["git", "worktree", "add", "--detach", baseline, revision], cwd=ROOT, check=True,
                       capture_output=True)
        try:
            for dtype in dtypes:
                samples: dict[str, list[float]] = {"lce now": [], f"lce@{revision}": []}
                for _ in range(rounds):
                    for name, root in (("lce now", str(ROOT)), (f"lce@{revision}", baseline)):
                        command = [sys.executable, "-c", _TIME_CHILD, str(shape), dtype, str(calls), str(threads)]
                        done = subprocess.run(command, capture_output=True, text=True, check=True, timeout=3600,
                                              env={**os.environ, "PYTHONPATH": root}, cwd=folder)
                        samples[name].append(float(done.stdout.strip().splitlines()[-1]))
                for name, values in samples.items():
                    rows.append(_row(shape, dtype, name, "time_s", statistics.median(values),
                                     spread_s=max(values) - min(values), repeats=len(values)))
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", baseline], cwd=ROOT, check=False,
                           capture_output=True)
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m analysis.studies.bench")
    parser.add_argument("--memory-child", nargs=3, metavar=("IMPL", "SHAPE", "DTYPE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.memory_child:
        _memory_child(*args.memory_child)


if __name__ == "__main__":
    main()


# ---- python -m analysis bench --------------------------------------------------------------------------------

DESCRIPTION = ("Interleaved timing rounds, peak memory in a fresh process per implementation and the 3-GEMM "
               "floor, appended to analysis/results/bench.csv (about 10 minutes at the default shape here).")


def add_arguments(parser) -> None:
    from analysis.core.arguments import results_option, shape_option

    shape_option(parser, BENCH_SHAPE)
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], help="input dtypes")
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds after one warm-up round")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--chunk-sweep", action="store_true",
                      help="instead: time lce per policy (default options, balanced and compact on low "
                           "precision) and chunk size (bench_chunks.csv)")
    mode.add_argument("--scaling", action="store_true",
                      help="instead: lce, torch and unfused with N and C divided by 1, 2 and 4 (bench.csv)")
    mode.add_argument("--baseline", metavar="REV",
                      help="instead: lce's default options here against git revision REV, one fresh process per "
                           "version, alternating (bench_baseline.csv)")
    results_option(parser)


def run(args) -> None:
    from analysis.core.results_io import BENCH, CHUNK_SWEEP, append_rows

    dtypes = tuple(args.dtypes)
    if args.baseline:
        table = against_baseline(args.shape, dtypes, args.baseline, rounds=args.repeats)
        path = args.results / "bench_baseline.csv"
        append_rows(path, BENCH.rows(table))
        times = table.set_index(["dtype", "impl"])["value"].unstack("impl")
        times["ratio"] = times["lce now"] / times[f"lce@{args.baseline}"]
        print(times.to_string(float_format="%.3f"))
    elif args.chunk_sweep:
        table = chunk_sweep(args.shape, dtypes, repeats=args.repeats, policies=CHUNK_SWEEP_POLICIES)
        path = args.results / "bench_chunks.csv"
        append_rows(path, CHUNK_SWEEP.rows(table))
        print(table[["dtype", "impl", "chunk_size", "num_chunks", "value", "spread_s"]].to_string(index=False))
    else:
        measure = run_scaling if args.scaling else run_bench
        table = measure(args.shape, dtypes, repeats=args.repeats)
        path = args.results / "bench.csv"
        append_rows(path, BENCH.rows(table))
        if not args.scaling:
            print(ratios(table).to_string(index=False, float_format="%.3f"))
    print(display_path(path))
