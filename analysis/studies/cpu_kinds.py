"""This CPU's kind, measured: its GEMM rates per dtype, and whether lce.recommend's picks are the fast ones here.

**GEMM rates** (:func:`gemm_rates`, ``cpu_gemm_rates.csv``): GFLOP/s of a 512x512x8192 product in fp32, bf16 and
fp16 (best of :data:`RATE_REPEATS` after a warm-up), beside what :mod:`lce.planning.cpu_gemms` concludes for each dtype
(its probe's slowdown and "native"/"emulated").

**recommend on this CPU** (:func:`recommend_check`, ``recommend_check.csv``): for each shape of
:data:`CHECK_SHAPES` and each budget (lce auto's peak, 1.5x and 1.1x the bf16 gradients' bytes),
``lce.recommend`` picks from its models alone; then, in one process and interleaved rounds so a busy spell hits
all alike, the pick is timed beside the feasible alternatives (within the budget and the error limit) the time
model ranks best for each policy (:data:`ALTERNATIVES_PER_POLICY` each), the pick of ``measure=True``, and the
pick a capability-blind model would make (recommend with bf16 GEMMs assumed native). ``time_over_fastest`` is a
row's median over the fastest measured row of its (shape, budget): the pick's says how far its model is from the
best of what was tried. ``role`` lists every role an option set plays ("pick + pick measure=True + alternative").

The AVX2 stand-in (``--avx2-stand-in``): the same measurements in a child process whose oneDNN, MKL and ATen
are limited to AVX2 (:data:`AVX2_STAND_IN`), which makes a CPU with native bf16 emulate its bf16 and fp16
GEMMs as an AVX2-only CPU does (the provenance column ``cpu_gemms`` names the caps). A stand-in, not an AVX2
part: fp32 runs on the same cores at AVX2 width.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence

import pandas as pd
import torch
from tqdm import tqdm

import lce
from analysis.core.inputs import make_inputs
from analysis.core.problem import DTYPES, Shape
from analysis.core.provenance import ISA_CAPS
from analysis.paths import ROOT
from analysis.studies.budgets import auto_peak
from lce.decide.recommendation import Candidate, candidates
from lce.planning.cpu_gemms import LOW_PRECISION, gemm_support
from lce.planning.options import EXPLICIT_POLICIES, dtype_name
from lce.testing import cpu_gemms

__all__ = ["AVX2_STAND_IN", "AVX512F_STAND_IN", "RATE_SHAPE", "CHECK_SHAPES", "CHECK_BUDGETS",
           "ALTERNATIVES_PER_POLICY", "gemm_rates",
           "recommend_check", "isa_caps"]

AVX2_STAND_IN: dict[str, str] = {"ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
                                 "ATEN_CPU_CAPABILITY": "avx2"}
"""The environment that limits torch's CPU back ends to AVX2 (see the module docstring)."""

AVX512F_STAND_IN: dict[str, str] = {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE", "ATEN_CPU_CAPABILITY": "avx512"}
"""The environment that limits oneDNN to AVX512 without its bf16 and AMX kernels: a CPU with native bf16 then runs
bf16 GEMMs with the converting kernel of an AVX512F Xeon (4.5-4.8x fp32's time on one thread, an AMX Xeon) and
emulates fp16."""

RATE_SHAPE = (512, 512, 8192)
RATE_REPEATS = 3
CHECK_SHAPES: tuple[Shape, ...] = (Shape(1024, 128, 8192), Shape(2048, 256, 16384), Shape(4096, 512, 32768))
CHECK_BUDGETS: tuple[tuple[str, float | None], ...] = (("auto", None), ("1.5x gradients", 1.5),
                                                       ("1.1x gradients", 1.1))
ALTERNATIVES_PER_POLICY = 2
STUDY_DTYPE = "bfloat16"


def isa_caps() -> str:
    """The ISA caps in this process's environment (empty when none; provenance's ``cpu_gemms`` names them too)."""
    return " ".join(f"{name}={os.environ[name]}" for name in ISA_CAPS if name in os.environ)


def gemm_rates(shape: tuple[int, int, int] = RATE_SHAPE, repeats: int = RATE_REPEATS) -> pd.DataFrame:
    """GFLOP/s per dtype at ``shape`` (m, k, n), with lce.planning.cpu_gemms' verdict for the low-precision ones."""
    m, k, n = shape
    generator = torch.Generator().manual_seed(0)
    a, b = torch.randn(m, k, generator=generator), torch.randn(k, n, generator=generator)
    rows = []
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        left, right = a.to(dtype), b.to(dtype)
        left @ right  # warm-up
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            left @ right
            best = min(best, time.perf_counter() - start)
        support = gemm_support(dtype)
        rows.append(dict(dtype=dtype_name(dtype), m=m, k=k, n=n, seconds=best, gflops=2 * m * k * n / best / 1e9,
                         support=support.support, probe_slowdown=support.slowdown,
                         probe_cost_s=_probe_cost_s(dtype) if dtype in LOW_PRECISION else float("nan")))
    fp32 = rows[0]["gflops"]
    return pd.DataFrame(rows).assign(rate_over_fp32=lambda table: table["gflops"] / fp32)


def _probe_cost_s(dtype: torch.dtype) -> float:
    """What lce.planning.cpu_gemms' probe costs, timed in a fresh interpreter (the probe is cached per process)."""
    code = (f"import time, torch, lce.planning.cpu_gemms as c; torch.set_num_threads({torch.get_num_threads()}); "
            f"s = time.perf_counter(); c.probe(torch.{dtype_name(dtype)}); print(time.perf_counter() - s)")
    env = {key: value for key, value in os.environ.items() if key != "LCE_CPU_GEMMS"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT,
                          env=env, timeout=600)
    return float(done.stdout.strip().splitlines()[-1])


def _label(candidate: Candidate) -> str:
    options = candidate.options
    acc = dtype_name(options.acc_dtype) if options.acc_dtype is not None else "input"
    return f"{candidate.label()}, acc {acc}"


BLIND_TIMING_CAP_S = 20.0
"""A capability-blind pick whose estimated time per call (from the measured GEMM rates) exceeds this is reported as
that estimate, not timed: on an emulating CPU its bf16 GEMMs take minutes per call at the bench shape."""


def recommend_check(shapes: Sequence[Shape] = CHECK_SHAPES, dtype: str = STUDY_DTYPE, *, repeats: int = 3,
                    progress: bool = True, rates: dict[str, float] | None = None) -> pd.DataFrame:
    """One row per timed option set and (shape, budget): its role, the models' predictions, the measured median.

    Where this CPU emulates ``dtype``'s GEMMs, the capability-blind pick's time is also estimated from ``rates``
    (GFLOP/s per dtype, :func:`gemm_rates`): its options' time on lce's route (every GEMM in fp32, timed here) with
    each bf16 GEMM's FLOPs moved from fp32's rate to the emulated one (``blind_estimate_s``); it is timed as well
    where that estimate is below :data:`BLIND_TIMING_CAP_S`, else its row reports the estimate (``timing``)."""
    torch_dtype = DTYPES[dtype]
    emulated = gemm_support(torch_dtype).emulated
    if emulated and rates is None:
        raise ValueError("rates (GFLOP/s per dtype) are needed to estimate the blind picks where GEMMs are emulated")
    rows = []
    for shape in tqdm(shapes, desc="recommend check", disable=not progress, unit="shape"):
        inputs = make_inputs(shape, torch_dtype, bias=False)
        considered = candidates(shape.N, shape.D, shape.C, torch_dtype, torch.device("cpu"))
        gradients = (shape.N + shape.C) * shape.D * torch_dtype.itemsize
        for budget_label, multiple in CHECK_BUDGETS:
            budget = auto_peak(shape, torch_dtype) if multiple is None else int(multiple * gradients)
            chosen = lce.recommend(shape.N, shape.D, shape.C, torch_dtype, "cpu", memory_budget=budget)
            measured = lce.recommend(shape.N, shape.D, shape.C, torch_dtype, "cpu", memory_budget=budget,
                                     measure=True)
            feasible = [c for c in considered if c.peak_bytes <= chosen.memory_budget
                        and (c.error <= chosen.max_error or not chosen.limit_met)]
            timed: dict[str, tuple[list[str], Candidate, bool]] = {}
            _add(timed, "pick", chosen.chosen)
            _add(timed, "pick measure=True", measured.chosen)
            for policy in EXPLICIT_POLICIES:
                ranked = sorted((c for c in feasible if c.plan.acc_policy == policy), key=lambda c: c.seconds)
                for candidate in ranked[:ALTERNATIVES_PER_POLICY]:
                    _add(timed, "alternative", candidate)
            blind = None
            if emulated:  # elsewhere the blind model is the model
                with cpu_gemms("native"):
                    blind = lce.recommend(shape.N, shape.D, shape.C, torch_dtype, "cpu", memory_budget=budget).chosen
                _add(timed, "capability-blind options on lce's route", blind)
            samples = _interleaved(inputs, timed, repeats)
            estimate = None
            if blind is not None:
                route = statistics.median(samples[_label(blind)])
                estimate = route + _low_precision_flops(blind) * (1 / rates[dtype] - 1 / rates["float32"]) / 1e9
                if estimate <= BLIND_TIMING_CAP_S:
                    label = "blind: " + _label(blind)
                    samples[label] = _interleaved(inputs, {label: (["capability-blind pick"], blind, True)},
                                                  repeats)[label]
                    timed[label] = (["capability-blind pick"], blind, True)
            fastest = min(statistics.median(values) for values in samples.values())
            for label, (roles, candidate, as_native) in timed.items():
                rows.append(_row(shape, dtype, budget_label, chosen.memory_budget, label, roles, candidate, as_native,
                                 samples[label], fastest, estimate if as_native else None))
            if blind is not None and estimate > BLIND_TIMING_CAP_S:
                rows.append(_row(shape, dtype, budget_label, chosen.memory_budget, "blind: " + _label(blind),
                                 ["capability-blind pick"], blind, True, [], fastest, estimate))
    return pd.DataFrame(rows)


def _low_precision_flops(candidate: Candidate) -> float:
    """FLOPs of the GEMMs ``candidate``'s plan runs on input-dtype operands, as planned on a CPU with native ones."""
    plan = candidate.plan
    gemms = ["logits"] * (2 if plan.tiles_classes else 1) + ["grad_input", "grad_weight"]
    narrow = [name for name in gemms if plan.gemm_dtypes(name).operands == plan.input_dtype]
    return 2.0 * plan.num_rows * plan.in_features * plan.num_classes * len(narrow)


def _row(shape: Shape, dtype: str, budget_label: str, budget_bytes: int, label: str, roles: list[str],
         candidate: Candidate, as_native: bool, values: list[float], fastest: float,
         blind_estimate: float | None) -> dict[str, object]:
    """One results row: an option set's roles, predictions and median time (the estimate where it was not timed)."""
    plan = candidate.plan
    median = statistics.median(values) if values else blind_estimate
    return dict(
        dtype=dtype, N=shape.N, D=shape.D, C=shape.C, budget=budget_label, budget_bytes=budget_bytes,
        role=" + ".join(roles), label=label.removeprefix("blind: "), policy=plan.acc_policy,
        acc_dtype=dtype_name(candidate.options.acc_dtype or plan.input_dtype),
        batch_chunk_size=plan.batch_chunk_size, class_chunk_size=plan.class_chunk_size,
        bf16_gemms_assumed="native" if as_native else gemm_support(DTYPES[dtype]).support,
        predicted_peak_bytes=candidate.peak_bytes, predicted_error=candidate.error, estimated_s=candidate.seconds,
        timing="measured" if values else "estimated from the GEMM rates", time_median_s=median,
        time_spread_s=max(values) - min(values) if values else float("nan"), repeats=len(values),
        time_over_fastest=median / fastest, blind_estimate_s=blind_estimate, isa_caps=isa_caps())


def _add(timed: dict[str, tuple[list[str], Candidate, bool]], role: str, candidate: Candidate,
         as_native: bool = False) -> None:
    """Note that ``candidate`` plays ``role``: ``timed`` maps a label to (its roles, the candidate, whether it runs as
    a capability-blind model assumed, bf16 GEMMs native), so an option set in several roles is timed once."""
    label = ("blind: " if as_native else "") + _label(candidate)
    timed.setdefault(label, ([], candidate, as_native))[0].append(role)


def _interleaved(inputs, timed: dict[str, tuple[list[str], Candidate, bool]], repeats: int) -> dict[str, list[float]]:
    """Seconds of one forward + backward per option set: a warm-up round, then ``repeats`` rounds of each in turn.
    A capability-blind pick runs as its model assumed (bf16 GEMMs on the CPU's own kernel)."""
    samples: dict[str, list[float]] = {label: [] for label in timed}
    for round_index in range(repeats + 1):
        for label, (_, candidate, as_native) in timed.items():
            with cpu_gemms("native") if as_native else contextlib.nullcontext():
                start = time.perf_counter()
                loss = lce.linear_cross_entropy(inputs.input, inputs.weight, inputs.target, options=candidate.options)
                loss.backward()
                seconds = time.perf_counter() - start
            inputs.input.grad = inputs.weight.grad = None
            if round_index:
                samples[label].append(seconds)
    return samples


# ---- python -m analysis cpu-kinds ----------------------------------------------------------------------------

DESCRIPTION = ("This CPU's GEMM rates per dtype and lce.planning.cpu_gemms' verdict (cpu_gemm_rates.csv), and "
               "lce.recommend's "
               "picks timed beside the fastest feasible alternatives for three shapes and three budgets "
               "(recommend_check.csv), appended; --avx2-stand-in repeats both with torch limited to AVX2. One "
               "intra-op thread by default. About 10 minutes natively, 30 under the stand-in.")


def add_arguments(parser) -> None:
    from analysis.core.arguments import results_option

    parser.add_argument("--avx2-stand-in", action="store_true",
                        help="run in a child process with oneDNN, MKL and ATen limited to AVX2")
    parser.add_argument("--avx512f-stand-in", action="store_true",
                        help="run in a child process with oneDNN limited to AVX512 without bf16/AMX kernels (the "
                             "AVX512F Xeon's slow converting bf16 kernel)")
    parser.add_argument("--skip-recommend", action="store_true", help="only the GEMM rates")
    parser.add_argument("--skip-rates", action="store_true",
                        help="only the recommend check (GEMM rates from this CPU kind's latest rows)")
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds after a warm-up round")
    parser.add_argument("--threads", type=int, default=1,
                        help="intra-op threads (default 1: on a shared 2-core machine two threads wait on each other "
                             "whenever the other core is busy, and small chunks' many parallel regions suffer most)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    results_option(parser)


def run(args) -> int:
    from analysis.core.provenance import cpu_gemms as provenance_cpu_gemms
    from analysis.core.provenance import cpu_model, provenance
    from analysis.core.results_io import CPU_GEMM_RATES, RECOMMEND_CHECK, append_rows, read_table
    from analysis.paths import display_path

    if args.avx2_stand_in or args.avx512f_stand_in:
        stand_in = AVX2_STAND_IN if args.avx2_stand_in else AVX512F_STAND_IN
        command = [sys.executable, "-m", "analysis", "cpu-kinds", "--results", str(args.results),
                   "--repeats", str(args.repeats), "--threads", str(args.threads),
                   *(["--skip-recommend"] if args.skip_recommend else []),
                   *(["--skip-rates"] if args.skip_rates else []),
                   *(["--quiet"] if args.quiet else [])]
        return subprocess.run(command, cwd=ROOT, env={**os.environ, **stand_in}, check=False).returncode
    torch.set_num_threads(args.threads)
    path = args.results / "cpu_gemm_rates.csv"
    if args.skip_rates:
        rates = read_table(path)
        rates = rates[(rates["cpu_model"] == cpu_model()) & (rates["cpu_gemms"] == provenance_cpu_gemms())]
        rates = rates[rates["date"] == rates["date"].max()]
    else:
        rates = gemm_rates()
        append_rows(path, CPU_GEMM_RATES.rows(rates.assign(isa_caps=isa_caps(), **provenance("cpu"))))
        print(rates[["dtype", "gflops", "rate_over_fp32", "support", "probe_slowdown", "probe_cost_s"]].to_string(
            index=False, float_format="%.3g"))
        print(display_path(path))
    if not args.skip_recommend:
        table = recommend_check(repeats=args.repeats, progress=not args.quiet,
                                rates=dict(zip(rates["dtype"], rates["gflops"], strict=True)))
        path = args.results / "recommend_check.csv"
        append_rows(path, RECOMMEND_CHECK.rows(table.assign(**provenance("cpu"))))
        print(table[["N", "budget", "role", "label", "timing", "time_median_s", "time_over_fastest"]].to_string(
            index=False, float_format="%.3g"))
        print(display_path(path))
    return 0
