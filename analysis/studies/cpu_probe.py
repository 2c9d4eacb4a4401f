"""lce.planning.cpu_gemms' verdict under the conditions a user's process meets: 1, 2 and all threads, the other cores
idle or
every core busy, each in fresh processes, beside the earlier probe's verdict in the same process.

Why: on an AVX2-only EPYC under ``pytest -n auto`` the earlier probe (a 64x256x256 product timed at torch's thread
count, best of three, emulated above 8x fp32's time; lce before issue 29) called emulated bf16 GEMMs native, since
its 2-thread fp32 product waited for a busy core. This study measures whether the verdict still depends on the
thread count or the load: natively, and under the AVX2 stand-in (``--avx2-stand-in``; oneDNN, MKL and ATen capped
at AVX2, so this CPU emulates as an AVX2-only one does, see :mod:`analysis.studies.cpu_kinds`).

Each (load, thread count) runs :data:`PROCESSES` fresh interpreters; each runs the earlier probe first (as it ran,
first thing in a fresh process) and then :func:`lce.planning.cpu_gemms.measure`, for bf16 then fp16, and reports both
verdicts, their slowdowns and their cost. "Every core busy" is one spinning process per core for the duration, so
the measuring process never has a core to itself. Output: ``cpu_gemm_probe.csv``, one row per (process, method,
dtype).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pandas as pd
import torch

import lce.planning.cpu_gemms
from analysis.paths import ROOT
from analysis.studies.cpu_kinds import AVX2_STAND_IN, isa_caps
from lce.planning.options import dtype_name

__all__ = ["LOADS", "PROCESSES", "EARLIER_THRESHOLD", "THIS_METHOD", "EARLIER_METHOD", "earlier_probe", "thread_counts",
           "every_core_busy", "probe_rows"]

LOADS = ("idle", "every core busy")
PROCESSES = 3
EARLIER_THRESHOLD = 8.0
"""The earlier probe's threshold: emulated above this many times fp32's time."""
THIS_METHOD = "lce.cpu_gemms (flags, else one thread)"  # as the committed rows name it (its module then)
EARLIER_METHOD = "earlier probe (torch's threads)"
_EARLIER_SHAPE = (64, 256, 256)


def earlier_probe(dtype: torch.dtype) -> tuple[float, str]:
    """The probe lce used before issue 29, re-run for comparison: fp32 then ``dtype`` at the process's thread count,
    each the best of three after a warm-up; (slowdown, verdict)."""
    m, k, n = _EARLIER_SHAPE
    generator = torch.Generator().manual_seed(0)
    a, b = torch.randn(m, k, generator=generator), torch.randn(k, n, generator=generator)
    slowdown = _best_seconds(a.to(dtype), b.to(dtype)) / _best_seconds(a, b)
    return slowdown, "emulated" if slowdown > EARLIER_THRESHOLD else "native"


def _best_seconds(a: torch.Tensor, b: torch.Tensor, repeats: int = 3) -> float:
    with torch.no_grad():
        a @ b
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            a @ b
            best = min(best, time.perf_counter() - start)
    return max(best, 1e-9)


def thread_counts() -> list[int]:
    """1, 2 and all of this machine's cores (each once)."""
    return sorted({1, 2, os.cpu_count() or 1})


def _child(threads: int) -> list[dict[str, object]]:
    """In a fresh interpreter: both methods at ``threads`` threads, the earlier probe first."""
    torch.set_num_threads(threads)
    rows = []
    for dtype in lce.planning.cpu_gemms.LOW_PRECISION:
        start = time.perf_counter()
        slowdown, support = earlier_probe(dtype)
        rows.append(dict(method=EARLIER_METHOD, dtype=dtype_name(dtype), support=support, source="measured",
                         slowdown=slowdown, probe_s=time.perf_counter() - start))
    for dtype in lce.planning.cpu_gemms.LOW_PRECISION:
        start = time.perf_counter()
        decided = lce.planning.cpu_gemms.measure(dtype)
        rows.append(dict(method=THIS_METHOD, dtype=dtype_name(dtype), support=decided.support, source=decided.source,
                         slowdown=decided.slowdown, probe_s=time.perf_counter() - start))
    return rows


@contextlib.contextmanager
def every_core_busy() -> Iterator[None]:
    """One spinning process per core for the duration: a process measured inside has no core to itself."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 1)]
    try:
        time.sleep(0.2)  # let the spinners take their cores
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
        for spinner in spinners:
            spinner.wait()


def probe_rows(processes: int = PROCESSES, progress: bool = True) -> pd.DataFrame:
    """Every (load, thread count, fresh process) of this environment: one row per method and dtype."""
    from tqdm import tqdm

    environment = {key: value for key, value in os.environ.items() if key != lce.planning.cpu_gemms.ENV_VAR}
    plan = [(load, threads, index) for load in LOADS for threads in thread_counts() for index in range(processes)]
    rows = []
    for load, threads, index in tqdm(plan, desc="cpu probe", unit="process", disable=not progress):
        with every_core_busy() if load == "every core busy" else contextlib.nullcontext():
            done = subprocess.run([sys.executable, "-m", "analysis.studies.cpu_probe", str(threads)], cwd=ROOT,
                                  env=environment, capture_output=True, text=True, check=True, timeout=600)
        for row in json.loads(done.stdout.strip().splitlines()[-1]):
            rows.append(dict(load=load, threads=threads, process=index, **row))
    return pd.DataFrame(rows)


# ---- python -m analysis cpu-probe ----------------------------------------------------------------------------

DESCRIPTION = ("lce.planning.cpu_gemms' verdict and the earlier probe's at 1, 2 and all threads, idle and with every "
               "core "
               "busy, in fresh processes (cpu_gemm_probe.csv, appended); --avx2-stand-in repeats it with torch "
               "limited to AVX2. About 2 minutes each.")


def add_arguments(parser) -> None:
    from analysis.core.arguments import results_option

    parser.add_argument("--avx2-stand-in", action="store_true",
                        help="run with oneDNN, MKL and ATen limited to AVX2 (this CPU then emulates bf16 and fp16)")
    parser.add_argument("--processes", type=int, default=PROCESSES, help="fresh processes per load and thread count")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    results_option(parser)


def run(args) -> int:
    from analysis.core.provenance import provenance
    from analysis.core.results_io import CPU_GEMM_PROBE, append_rows
    from analysis.paths import display_path

    if args.processes < 1:
        raise SystemExit(f"--processes must be at least 1; got {args.processes}")
    if args.avx2_stand_in:
        command = [sys.executable, "-m", "analysis", "cpu-probe", "--results", str(args.results),
                   "--processes", str(args.processes), *(["--quiet"] if args.quiet else [])]
        return subprocess.run(command, cwd=ROOT, env={**os.environ, **AVX2_STAND_IN}, check=False).returncode
    table = probe_rows(args.processes, progress=not args.quiet)
    path = args.results / "cpu_gemm_probe.csv"
    append_rows(path, CPU_GEMM_PROBE.rows(table.assign(isa_caps=isa_caps(), **provenance("cpu"))))
    summary = table.groupby(["method", "dtype", "load", "threads"]).agg(
        native=("support", lambda s: int((s == "native").sum())),
        emulated=("support", lambda s: int((s == "emulated").sum())),
        slowdown_min=("slowdown", "min"), slowdown_max=("slowdown", "max"))
    print(summary.to_string(float_format="%.3g"))
    print(display_path(path))
    return 0


if __name__ == "__main__":  # a child of probe_rows: python -m analysis.studies.cpu_probe THREADS
    print(json.dumps(_child(int(sys.argv[1]))))
