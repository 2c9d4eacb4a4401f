"""``python -m analysis gpu-check``: what a lent GPU should measure, as one command inside a time budget.

A GPU is lent now and then for about 15 minutes in all, on a machine that reaches no package registry
(torch 2.11, Triton 3.6, Python 3.12; Liger-Kernel and Cut Cross-Entropy travel as wheels in the
ignored ``.gpu/wheels``, see :func:`download_wheels`). One call runs, in order, each step in a process
of its own with its share of ``--budget-s`` (:data:`STEPS`):

1. ``bench``: at the three LLM heads of :data:`BENCH_SHAPES` in bf16, without a bias and with one, lce's default
   options and its low-memory option (:func:`low_memory_spec`), the unfused op eager and under ``torch.compile``,
   Liger-Kernel and Cut Cross-Entropy when importable: CUDA-event time (median after warm-up), allocator peaks,
   errors against fp64, and whether lce's default repeats itself to the bit (``gpu_bench.csv``);
2. ``memory``: the CUDA allocator's peaks (allocated and reserved) against lce's model,
   ``lce.plan(...).peak_extra_bytes``, per policy (``gpu_memory.csv``);
3. ``tests``: ``pytest -m cuda`` on :data:`CUDA_TEST_FILES` (fp64 parity of every policy on CUDA
   tensors, bf16/fp16 errors at the floor, the memory model against the allocator, no host synchronisation in
   the default path, each row's outputs the same bits in other batches), then lce's public-API suites
   (:data:`API_TEST_FILES`) on the machine's own torch (2.11 there: their comparisons with torch's op skip);
4. ``grid``: the ``cuda`` grid (:mod:`analysis.sweep.grids`: every input family, the LLM heads, TF32 off and
   on, three seeds) into ``cuda.csv``, starting from the committed one (:func:`resume_from_committed`), with the
   fp64 reference computed on the GPU in blocks of rows (:func:`analysis.sweep.run.reference_block_elements`),
   so its memory is bounded at 128256 or 256000 classes;
5. the log (``gpu_check.log``): provenance (GPU, driver, torch, CUDA, Triton, git revision: from
   ``$LCE_LAB_REVISION`` when the copy sent has no usable ``.git``), every step's output, and what each
   step did in how long.

Every step stops by itself before its share runs out (it skips what its estimate says cannot finish)
and is killed :data:`GRACE_S` after it; each row is written as soon as it is measured, so a step cut
short keeps what it did, and a second call with the same ``--out`` resumes the grid.

``--dry-run`` (CPU, CI): resolves every step's plan (the test files collected, every grid problem and
lce's plan at the LLM heads under the CUDA layouts, the memory and bench plans), checks the wheels
folder (reports what is missing, fails on nothing), and runs the grid on tiny shapes with the CUDA
layouts emulated (:func:`dry_run_configs`), and the memory and bench steps on a tiny shape on the CPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib.metadata
import importlib.util
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import torch

import lce
from analysis.core.implementations import ImplSpec, make_implementation, meta_plan, unavailable_reason
from analysis.core.inputs import OUTPUT_NAMES, make_inputs
from analysis.core.memory import measure_peak
from analysis.core.metrics import compare
from analysis.core.problem import CCE_SHAPE, DTYPES, Shape
from analysis.core.provenance import git_revision, provenance
from analysis.core.results_io import GPU_BENCH, GPU_MEMORY, append_row
from analysis.core.run_config import RunConfig
from analysis.core.timing import time_call
from analysis.gpu.wheels import GPU_PACKAGES, WHEELS_DIR, unpack_wheels, wheel_status
from analysis.paths import RESULTS_DIR, ROOT, display_path
from analysis.sweep.grids import CUDA_HEADLINE_SHAPES, Grid, Measurement, get_grid
from analysis.sweep.run import reference_block_elements, results_path, run_grid
from lce import decide

__all__ = ["Step", "STEPS", "DEFAULT_STEPS", "DEFAULT_BUDGET_S", "GRACE_S", "TOKENS_FILE", "step_seconds", "Deadline",
           "dry_run_configs", "estimate_seconds", "run_grid_step", "run_memory_step", "run_bench_step",
           "run_tests_step", "run_noise_step", "run_train_step", "run_hf_step", "run_step", "run_check",
           "gpu_provenance", "CUDA_TEST_FILES", "MEMORY_SHAPES", "BENCH_SPECS", "MEMORY_SPECS",
           "low_memory_spec", "bench_specs", "BENCH_SHAPES", "run_smoke_step", "SMOKE_SHAPE"]


@dataclasses.dataclass(frozen=True)
class Step:
    """One step of the check: its name (``--step NAME``), its share of the budget, and what it does."""

    name: str
    share: float
    summary: str


STEPS: tuple[Step, ...] = (
    Step("smoke", 0.10, "every Triton kernel variant compiled for this GPU, the mixed-precision GEMM probes, lce's "
                        "default call on tiny tensors with its kernels; stops the check if any fails"),
    Step("bench", 0.70, "lce's default and low-memory options, unfused eager and compiled, Liger, CCE at three LLM "
                        "heads in bf16, without a bias and with one (gpu_bench.csv)"),
    Step("head", 0.30, "the head-only study at D=2048, C=131072 on real cuBLAS (head_training_cuda.csv.gz)"),
    Step("memory", 0.10, "measured CUDA peaks against lce's memory model, per policy (gpu_memory.csv)"),
    Step("tests", 0.25, "pytest -m cuda: lce on CUDA tensors, its Triton kernels compiled"),
    Step("grid", 0.20, "the cuda grid: families, LLM heads, TF32 off and on (cuda.csv)"),
    Step("noise", 0.30, "error against the sampling noise on real cuBLAS kernels (noise_cuda.csv)"),
    Step("train", 0.65, "the training study's arms on the GPU (training_cuda.csv.gz; carry .gpu/tokens.pt)"),
    Step("hf", 0.25, "one training step of a transformers Llama: unpatched, lce's patch, Liger's (hf_step_cuda.csv)"),
)
"""Every step, in the order they run. ``--steps`` picks some (:data:`DEFAULT_STEPS` otherwise) and their
shares are scaled to add up to :data:`BUDGET_SHARE` of the budget."""

DEFAULT_STEPS: tuple[str, ...] = ("smoke", "bench", "tests")
"""What a plain ``gpu-check`` runs, ordered by what only the hardware can tell, after the smoke step (a kernel that
does not compile, or a GEMM path that is missing, stops the check there rather than being timed as lce's): the
time and memory bench beside
Liger-Kernel and Cut Cross-Entropy at the three LLM heads (its peaks are the allocator's, beside lce's model), then
the CUDA tests with the Triton kernels compiled. ``memory`` (the allocator against the model per policy) and
``grid`` (the error grid: the CPU emulation of the layouts predicts the H200's errors, notebook 04, and the grid
is committed) run when ``--steps`` names them. ``head`` (the head-only training study on real
kernels) is opt-in: its gpu setting evaluates every 250 steps of all its arms, so a 7-minute call ends before its
first evaluation after step 0 (the H200 call of 2026-12-04 stopped it at its 135 s share with step 0 only);
``noise`` and ``train`` (the does-it-matter study on real kernels) and ``hf`` (the transformers integration's
training step) run, like it, when ``--steps`` names them."""

BUDGET_SHARE = 0.95
"""The steps' shares of the budget; the rest pays for starting each step's process (torch's import, CUDA's
context) and writing the log."""

TOKENS_FILE = ROOT / ".gpu" / "tokens.pt"
"""The training study's token streams, carried to the GPU (its Python's standard library differs from the one
the tokenizer was trained on): ``torch.save({"train": ..., "heldout": ...})``."""

DEFAULT_BUDGET_S = 420.0
"""Seven minutes: one device call of at most ten, with room to start the machine and bring the files home."""

GRACE_S = 20.0
"""A step's process is killed this long after its share ends; it stops itself at the share."""

CUDA_TEST_FILES: tuple[str, ...] = ("tests/lce/test_cuda.py", "tests/lce/test_kernels.py",
                                     "tests/lce/test_batch_invariance.py")
"""The test files step 1 runs with ``-m cuda``."""
API_TEST_FILES: tuple[str, ...] = tuple(f"tests/lce/{name}" for name in (
    "test_options.py", "test_module.py", "test_fallback.py", "test_parity_fp64.py", "test_features.py",
    "test_low_precision.py", "test_errors.py"))
"""lce's public-API suites, which step 1 runs after the CUDA tests: they pass on a torch without
``linear_cross_entropy`` (2.11), their comparisons with it skipping (tests/repo/test_torch_range.py checks that
here)."""

BENCH_DTYPE = "bfloat16"
BENCH_WARMUP, BENCH_REPEATS = 2, 5
BENCH_SHAPES: tuple[Shape, ...] = (CCE_SHAPE, Shape(16384, 4096, 128256), Shape(8192, 4096, 128256))
"""The heads the bench measures, each without a bias (Cut Cross-Entropy takes none) and with one: Gemma 2's
(Cut Cross-Entropy's table), Llama 3's at 16k tokens, and Llama 3's at 8k (Liger-Kernel's)."""
LOW_MEMORY_BUDGET = 1.25
"""lce's low-memory option at a head: what :func:`lce.recommend` picks within this multiple of the bf16 gradients'
bytes under the accurate default's error limit (:data:`lce.decide.DEFAULT_MAX_ERROR_FOR_AUTO`): one chunk of rows
and blocks of classes, no (C, D) accumulator (:func:`low_memory_spec`)."""
MEMORY_SHAPES: tuple[Shape, ...] = (Shape(8192, 1024, 32768), *CUDA_HEADLINE_SHAPES)
"""test_cuda.py's allocator check, then the LLM heads."""

_LCE_SPECS = (ImplSpec("lce", "auto", "auto"),
              *(ImplSpec("lce", policy, "auto", "float32") for policy in ("accurate", "balanced", "compact")))
MEMORY_SPECS: tuple[ImplSpec, ...] = _LCE_SPECS
"""lce's defaults, then each policy with fp32 accumulation (in bf16, an explicit policy's default
``acc_dtype`` is bf16, where every policy computes the same thing)."""
BENCH_SPECS: tuple[ImplSpec, ...] = (ImplSpec("lce", "auto", "auto"), ImplSpec("reference"), ImplSpec("liger"),
                                     ImplSpec("cce"), ImplSpec("compiled"))
"""The bench's fixed contenders at every head: lce's default options, the unfused op, Liger-Kernel, Cut
Cross-Entropy and the unfused op under ``torch.compile`` (last: compiling takes tens of seconds, the others
fractions of one). :func:`bench_specs` adds lce's low-memory option."""


def low_memory_spec(shape: Shape, dtype: torch.dtype = torch.bfloat16) -> ImplSpec:
    """lce's low-memory option at ``shape`` (see :data:`LOW_MEMORY_BUDGET`) as a bench contender."""
    budget = int(LOW_MEMORY_BUDGET * (shape.N + shape.C) * shape.D * dtype.itemsize)
    try:
        picked = lce.recommend(shape.N, shape.D, shape.C, dtype, "cuda", memory_budget=budget,
                               max_error=decide.DEFAULT_MAX_ERROR_FOR_AUTO[dtype]).chosen.plan
    except ValueError:  # a head so small that no blocked candidate fits (the dry run's): the same form, by hand
        return ImplSpec("lce", "balanced", f"rows:{shape.N}", "float32", classes=max(1, shape.C // 4))
    return ImplSpec("lce", picked.acc_policy, f"rows:{picked.batch_chunk_size}", "float32",
                    classes=picked.class_chunk_size if picked.tiles_classes else None)


def bench_specs(shape: Shape, bias: bool = False) -> tuple[ImplSpec, ...]:
    """:data:`BENCH_SPECS` with lce's low-memory option after lce's default (Cut Cross-Entropy left out with a
    bias: it takes none)."""
    specs = (BENCH_SPECS[0], low_memory_spec(shape), *BENCH_SPECS[1:])
    return tuple(spec for spec in specs if not (bias and spec.op == "cce"))


DRY_SHAPES: dict[str, Shape] = {"random": Shape(64, 32, 512), "calibrated": Shape(64, 32, 512),
                                "trained": Shape(8, 128, 16384)}
"""The dry run's grid shape per family (``trained`` is fixed at its dump's D and C)."""
DRY_MEASUREMENT = Measurement(warmup=0, repeats=1)
DRY_BENCH_SHAPE = Shape(64, 32, 512)

DEFAULT_OUT = ROOT / ".gpu" / "out"
"""Where a real run writes without ``--out`` (ignored by git; on the device tool, pass ``--out "$OUT"``)."""
LOG_NAME = "gpu_check.log"
CUDA_FILE, BENCH_FILE, MEMORY_FILE = "cuda.csv", "gpu_bench.csv", "gpu_memory.csv"


def step_seconds(budget_s: float, steps: Sequence[str] = DEFAULT_STEPS) -> dict[str, float]:
    """The seconds of each of ``steps`` (names of :data:`STEPS`, in run order) out of ``budget_s``; ``ValueError``
    for a budget that is not positive or a name that is not a step."""
    if not budget_s > 0 or math.isinf(budget_s):
        raise ValueError(f"budget_s must be a positive number of seconds, got {budget_s!r}")
    known = {step.name: step for step in STEPS}
    unknown = [name for name in steps if name not in known]
    if unknown or not steps:
        raise ValueError(f"steps must name some of {tuple(known)}, got {tuple(steps)}")
    chosen = [step for step in STEPS if step.name in steps]
    total = sum(step.share for step in chosen)
    return {step.name: step.share / total * BUDGET_SHARE * budget_s for step in chosen}


@dataclasses.dataclass
class Deadline:
    """When a step must be done, on the monotonic clock."""

    end: float

    @classmethod
    def after(cls, seconds: float) -> Deadline:
        return cls(time.monotonic() + seconds)

    def left(self) -> float:
        return self.end - time.monotonic()

    def allows(self, seconds: float) -> bool:
        """Whether work estimated at ``seconds`` would end before the deadline."""
        return seconds <= self.left()


# --------------------------------------------------------------------------------------- provenance


def _nvidia_smi(query: str) -> str:
    try:
        result = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"], capture_output=True,
                                text=True, timeout=20, check=True)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return result.stdout.strip().splitlines()[0] if result.stdout.strip() else "unknown"


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def gpu_provenance() -> dict[str, str]:
    """Where the check ran: GPU, driver, torch, CUDA, Triton, the compared packages, git revision, date."""
    cuda = torch.cuda.is_available()
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "git_revision": git_revision(),
        "gpu": torch.cuda.get_device_name() if cuda else "none (CPU)",
        "driver": _nvidia_smi("driver_version") if cuda else "none",
        "gpu_memory": _nvidia_smi("memory.total") if cuda else "none",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": str(torch.version.cuda),
        "triton": _version("triton"),
        "lce": lce.__version__,
        "lce_kernels": _kernels_status(),
        "mixed_precision_gemms": _mixed_gemms_status(),
        **{package.name: _version(package.name) for package in GPU_PACKAGES},
        "torch_native_linear_cross_entropy": str(hasattr(torch.nn.functional, "linear_cross_entropy")),
    }


def _kernels_status() -> str:
    """Whether lce's Triton kernels load on this machine's GPU, and why not (imports triton only on CUDA)."""
    from lce import kernels

    if not torch.cuda.is_available():
        return "not on CUDA (no GPU)"
    reason = kernels.unavailable_reason(torch.device("cuda"))
    return f"available (triton {kernels.triton_version()})" if reason is None else f"unavailable: {reason}"


def _mixed_gemms_status() -> str:
    """The probes of lce.passes.gemm on this machine's GPU: torch.mm(out_dtype) and torch.addmm(out_dtype, out=)."""
    from lce.planning.device import mixed_addmm_supported, mixed_mm_supported

    if not torch.cuda.is_available():
        return "not probed (no GPU)"
    device = torch.device("cuda", torch.cuda.current_device())
    return f"mm(out_dtype) {mixed_mm_supported(device)}, addmm(out_dtype, out=) {mixed_addmm_supported(device)}"


# -------------------------------------------------------------------------------------------- step 2


def dry_run_configs(configs: Iterable[RunConfig]) -> tuple[RunConfig, ...]:
    """The grid's seed-0 lce runs with "auto" chunking shrunk for a CPU: each family at :data:`DRY_SHAPES`, the
    CUDA layouts emulated (``cuda`` -> ``cuda-emulated``), TF32 runs left out (they change nothing off a GPU).
    Every policy and acc_dtype of every family and dtype runs; finer chunkings would only repeat the loop (and
    the emulation upcasts the whole weight once per chunk: 20-60 s at the trained head's C on 2 cores)."""
    out: dict[str, RunConfig] = {}
    for config in configs:
        if config.device != "cuda" or config.op != "lce" or config.seed != 0 or config.chunking != "auto":
            continue
        shape = DRY_SHAPES[config.family.split(":")[0]]
        small = dataclasses.replace(config, device="cuda-emulated", N=shape.N, D=shape.D, C=shape.C)
        out.setdefault(small.key, small)
    return tuple(out.values())


def _groups(configs: Sequence[RunConfig]) -> list[list[RunConfig]]:
    """The runs in grid order, grouped by shared inputs (the sweep builds inputs and reference once per group)."""
    groups: dict[tuple, list[RunConfig]] = {}
    for config in configs:
        groups.setdefault(config.inputs_key(), []).append(config)
    return list(groups.values())


_ASSUMED_FLOPS = {"float32": 40e12, "fp64": 40e12, "low": 300e12}
"""Rates an estimate assumes on one H200 (FLOP/s): fp32 without TF32 and fp64 run on ~50-60 TFLOP/s units,
bf16/fp16 GEMMs reach several hundred; lce's "accurate" runs its GEMMs in fp32 whatever the input dtype, so
every run is costed at the fp32 rate (an overestimate for the rest). Measured groups correct it."""
_DRAW_PER_S = 1e8
"""Elements per second the families draw on the CPU (torch.randn with a generator runs on one thread)."""


def estimate_seconds(group: Sequence[RunConfig], *, timed_seeds: int = 1, calls: int = 5) -> float:
    """A generous guess at one group's time on one H200: the inputs' draw, the fp64 reference (3 GEMMs), and
    ``calls`` forward+backward calls (3 GEMMs each) per run measured in full (one for errors-only seeds)."""
    first = group[0]
    gemms = 2.0 * first.N * first.D * first.C
    runs = sum((calls if config.seed < timed_seeds else 1) for config in group
               if unavailable_reason(config.op, config.device) is None)
    draw = (first.N + first.C) * first.D / _DRAW_PER_S
    return 1.0 + draw + 3 * gemms / _ASSUMED_FLOPS["fp64"] + runs * 3 * gemms / _ASSUMED_FLOPS["float32"]


def run_grid_step(out: Path, deadline: Deadline, *, dry_run: bool = False, echo: Callable[[str], None] = print,
                  grid: Grid | None = None) -> dict[str, int]:
    """Step 2: the ``cuda`` grid (or :func:`dry_run_configs` of it) into ``out/cuda.csv``, one group of runs
    sharing inputs at a time, skipping a group whose estimate (scaled by how far the estimates of the
    groups done so far fell short) would outlast the deadline. Returns counts of groups and runs."""
    grid = grid or get_grid("cuda")
    configs = grid.configs
    if not dry_run:
        for line in resume_from_committed(out, grid.name):
            echo(line)
    if dry_run:  # the plan a GPU would follow, then the tiny stand-in
        calls = grid.measurement.warmup + 1 + grid.measurement.repeats
        estimates = [(group[0], len(group), estimate_seconds(group, calls=calls)) for group in _groups(configs)]
        for first, runs, seconds in estimates:
            echo(f"  planned {first.device} {first.family} {first.dtype} {first.shape} seed {first.seed}: "
                 f"{runs} runs, estimated {seconds:.0f} s on one H200")
        echo(f"  planned: {len(configs)} runs, estimated {sum(e[2] for e in estimates):.0f} s in all")
        configs, grid = dry_run_configs(configs), dataclasses.replace(grid, measurement=DRY_MEASUREMENT)
    groups = _groups(configs)
    echo(f"grid {grid.name}: {len(configs)} runs in {len(groups)} problems"
         + (" (dry run: tiny shapes, CUDA layouts emulated)" if dry_run else ""))
    shortfall, counts = 1.0, {"groups_run": 0, "groups_skipped": 0, "runs": 0, "errors": 0}
    for group in groups:
        first = group[0]
        estimate = estimate_seconds(group, timed_seeds=grid.measurement.timed_seeds,
                                    calls=grid.measurement.warmup + 1 + grid.measurement.repeats)
        label = f"{first.device} {first.family} {first.dtype} {first.shape} seed {first.seed} ({len(group)} runs)"
        if not deadline.allows(estimate * shortfall):
            counts["groups_skipped"] += 1
            echo(f"  skipped {label}: estimated {estimate * shortfall:.0f} s, {deadline.left():.0f} s left")
            continue
        started = time.monotonic()
        summary = run_grid(grid, configs=group, folder=out, progress=False)
        seconds = time.monotonic() - started
        if estimate >= 2.0:  # short groups are dominated by fixed costs the estimate does not model
            shortfall = max(shortfall, seconds / estimate)
        counts["groups_run"] += 1
        counts["runs"] += summary.ran
        counts["errors"] += summary.errors
        echo(f"  {label}: {summary.ran} new, {summary.errors} errors, {seconds:.1f} s (estimated {estimate:.1f} s)")
    echo(f"grid: {counts} -> {results_path(grid.name, folder=out)}")
    return counts


def resume_from_committed(out: Path, grid_name: str, committed: Path = RESULTS_DIR) -> list[str]:
    """Start ``out``'s results of ``grid_name`` from the committed ones when ``out`` has none, so a new call runs
    only the problems no earlier GPU call finished (the sweep resumes by run key; every row keeps its own
    provenance). Returns what it did, as log lines; nothing when ``out`` already has results or nothing is
    committed (remove the copy from ``out`` before the step to measure everything again)."""
    target = results_path(grid_name, folder=out)
    source = results_path(grid_name, folder=committed)
    if target.exists() or not source.exists():
        return []
    shutil.copyfile(source, target)
    rows = sum(1 for _ in source.open(encoding="utf-8")) - 1
    return [f"grid: resuming from the committed {display_path(source)} ({rows} rows): only missing problems run"]


# ------------------------------------------------------------------------------------ steps 3 and 4


def _peaks(call: Callable[[], object], device: str) -> tuple[object, int, int | None]:
    """``call()``'s result and its peak extra bytes: allocated and reserved from the CUDA allocator (its cache
    emptied first, so that reserved counts what the call made the allocator hold), or the CPU profiler's
    allocated (reserved None)."""
    if device != "cuda":
        result, memory = measure_peak(call, method="profiler")
        return result, memory.peak_bytes, None
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    reserved_before = torch.cuda.memory_reserved()
    result, memory = measure_peak(call, method="cuda")
    return result, memory.peak_bytes, torch.cuda.max_memory_reserved() - reserved_before


def _device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def run_memory_step(out: Path, deadline: Deadline, *, dry_run: bool = False,
                    echo: Callable[[str], None] = print) -> Counter[str]:
    """Step 3: per shape of :data:`MEMORY_SHAPES` and spec of :data:`MEMORY_SPECS`, lce's modeled peak
    against the allocator's (``out/gpu_memory.csv``). The dry run prints the plans at those shapes and measures
    a tiny shape on the CPU (profiler; reserved empty). Returns the rows' statuses, counted."""
    device = _device()
    for shape in MEMORY_SHAPES:
        for spec in MEMORY_SPECS:
            plan = meta_plan(spec, shape, BENCH_DTYPE, "cuda")
            echo(f"  plan {spec} {shape} bf16: {plan.acc_policy}, {plan.num_chunks} chunks, "
                 f"modeled peak {plan.peak_extra_bytes / 2**30:.2f} GiB")
    shapes = (DRY_BENCH_SHAPE,) if dry_run or device != "cuda" else MEMORY_SHAPES
    statuses: Counter[str] = Counter()
    for shape in shapes:
        inputs = make_inputs(shape, DTYPES[BENCH_DTYPE], seed=0, bias=False, device=device)
        for spec in MEMORY_SPECS:
            row: dict[str, object] = dict(policy=spec.policy, acc_dtype=spec.acc_dtype, dtype=BENCH_DTYPE, N=shape.N,
                                          D=shape.D, C=shape.C)
            seconds = 2.0 + 6 * 2.0 * shape.N * shape.D * shape.C / _ASSUMED_FLOPS["float32"]
            if not deadline.allows(seconds):
                row.update(status="not run", note=f"budget: {deadline.left():.0f} s left, about {seconds:.0f} s needed")
            else:
                try:
                    row.update(_memory_one(spec, inputs, device), status="ok")
                except Exception as error:  # recorded, not fatal: the other policies still run
                    row.update(status="error", note=f"{type(error).__name__}: {error}"[:500])
            append_row(out / MEMORY_FILE, GPU_MEMORY.row(row, **provenance(device)))
            statuses[str(row["status"])] += 1
            echo(f"  memory {spec} {shape}: {row['status']} measured/modeled {row.get('measured_over_modeled')}")
        del inputs
    echo(f"{dict(statuses)}")
    return statuses


def _memory_one(spec: ImplSpec, inputs, device: str) -> dict[str, object]:
    implementation = make_implementation(spec, device)
    plan = implementation.plan(inputs)
    implementation.run(inputs)  # warm-up: cuBLAS's workspaces and handles are not the op's memory
    outputs, allocated, reserved = _peaks(lambda: implementation.run(inputs), device)
    del outputs
    return dict(resolved_policy=plan.acc_policy, num_chunks=plan.num_chunks, modeled_peak_bytes=plan.peak_extra_bytes,
                peak_allocated_bytes=allocated, peak_reserved_bytes=reserved,
                measured_over_modeled=allocated / plan.peak_extra_bytes)


_BENCH_ERRORS = ("loss_ulps", "grad_input_fro_in_floors", "grad_weight_fro_in_floors", "grad_bias_fro_in_floors")
"""The error columns a bench row keeps (of :func:`analysis.core.metrics.compare`'s): the gradients in floors, the loss
in ulps."""


def _bench_estimate(spec: ImplSpec, shape: Shape) -> float:
    compile_s = 60.0 if spec.op == "compiled" else 0.0
    calls = BENCH_WARMUP + 1 + BENCH_REPEATS
    return 2.0 + compile_s + calls * 6.0 * shape.N * shape.D * shape.C / _ASSUMED_FLOPS["float32"]


def run_bench_step(out: Path, deadline: Deadline, *, dry_run: bool = False,
                   echo: Callable[[str], None] = print) -> Counter[str]:
    """Step ``bench``: at each of :data:`BENCH_SHAPES` in bf16, ``random`` inputs, without a bias and with one, each
    of :func:`bench_specs`, into ``out/gpu_bench.csv``: errors vs fp64 and allocator peaks from one call after
    :data:`BENCH_WARMUP`, then the median of :data:`BENCH_REPEATS` CUDA-event timings, and for lce's default two
    calls compared bit for bit (``note``: "bitwise repeatable" or not). The dry run runs a tiny shape on the CPU
    (``compiled`` left out: it compiles for tens of seconds there). Returns the rows' statuses, counted."""
    device = _device()
    shapes = (DRY_BENCH_SHAPE,) if dry_run or device != "cuda" else BENCH_SHAPES
    statuses: Counter[str] = Counter()
    for compiled_round in (False, True):  # torch.compile last, at every head: ~60 s a head, what the budget leaves
        for shape in shapes:
            for bias in (False, True):
                specs = [spec for spec in bench_specs(shape, bias) if (spec.op == "compiled") == compiled_round]
                if compiled_round and not any(deadline.allows(_bench_estimate(spec, shape)) for spec in specs):
                    for spec in specs:
                        row = _bench_row(spec, shape, None, None, device, deadline, dry_run, bias)
                        append_row(out / BENCH_FILE, GPU_BENCH.row(row, **provenance(device)))
                        statuses[str(row["status"])] += 1
                    continue
                started = time.monotonic()
                inputs = make_inputs(shape, DTYPES[BENCH_DTYPE], seed=0, bias=bias, device=device)
                reference = _reference(inputs)
                echo(f"bench {shape} {BENCH_DTYPE}{' with bias' if bias else ''} on {device}: inputs and fp64 "
                     f"reference in {time.monotonic() - started:.1f} s")
                for spec in specs:
                    row = _bench_row(spec, shape, inputs, reference, device, deadline, dry_run, bias)
                    append_row(out / BENCH_FILE, GPU_BENCH.row(row, **provenance(device)))
                    statuses[str(row["status"])] += 1
                    echo(f"  bench {spec}: {row['status']} {row.get('time_median_s') or ''} {row.get('note') or ''}")
                del inputs, reference
    echo(f"{dict(statuses)}")
    return statuses


def _bench_row(spec: ImplSpec, shape: Shape, inputs, reference, device: str, deadline: Deadline, dry_run: bool,
               bias: bool) -> dict[str, object]:
    row: dict[str, object] = dict(impl=str(spec), op=spec.op, policy=spec.policy, acc_dtype=spec.acc_dtype,
                                  dtype=BENCH_DTYPE, family="random-bias" if bias else "random", N=shape.N, D=shape.D,
                                  C=shape.C)
    reason = unavailable_reason(spec.op, device)
    estimate = _bench_estimate(spec, shape)
    if reason is not None:
        row.update(status="skipped", note=reason)
    elif dry_run and spec.op == "compiled":
        row.update(status="not run", note="dry run: torch.compile takes tens of seconds on a CPU")
    elif not deadline.allows(estimate):
        row.update(status="not run", note=f"budget: {deadline.left():.0f} s left, about {estimate:.0f} s needed")
    else:
        try:
            row.update(_bench_one(spec, inputs, reference, device))
            row["status"] = "ok"
        except Exception as error:  # recorded, not fatal: the next contender still runs
            row.update(status="error", note=f"{type(error).__name__}: {error}"[:500])
    return row


def _reference(inputs):
    from analysis.core.fp64 import reference_outputs

    return reference_outputs(inputs, block_elements=reference_block_elements(inputs.input.device))


def _bench_one(spec: ImplSpec, inputs, reference, device: str) -> dict[str, object]:
    implementation = make_implementation(spec, device)
    plan = implementation.plan(inputs)

    def call():
        return implementation.run(inputs)

    for _ in range(BENCH_WARMUP):
        call()
    outputs, allocated, reserved = _peaks(call, device)
    errors = {}
    for name, report in compare(outputs, reference).items():
        errors.update(report.columns(name))
    del outputs
    timing = time_call(call, warmup=0, repeats=BENCH_REPEATS, device=device)
    note = None
    if spec == BENCH_SPECS[0]:  # lce's default: deterministic, two calls to the bit
        first, second = call(), call()
        same = all((a is None and b is None) or torch.equal(a, b)
                   for a, b in ((first.get(name), second.get(name)) for name in OUTPUT_NAMES))
        note = "bitwise repeatable" if same else "NOT bitwise repeatable"
        del first, second
    if plan is not None:  # which backend and GEMM paths ran: a fallback is never timed as lce's kernels unseen
        note = "; ".join(filter(None, [note, f"passes: {plan.passes_reason}", plan.cuda_gemms]))
    return dict(resolved_policy=plan.acc_policy if plan else None, num_chunks=plan.num_chunks if plan else 1, note=note,
                modeled_peak_bytes=plan.peak_extra_bytes if plan and spec.op == "lce" else None,
                time_median_s=timing.median_s, time_spread_s=timing.spread_s, repeats=BENCH_REPEATS,
                peak_allocated_bytes=allocated, peak_reserved_bytes=reserved,
                **{column: errors.get(column) for column in _BENCH_ERRORS})


# ------------------------------------------------------------------------------------------ smoke step

SMOKE_ARCH_WITHOUT_GPU = 90
"""The compute capability the dry run compiles the kernels for (an H100's or H200's)."""
SMOKE_SHAPE = Shape(96, 64, 3000)
"""lce's default call in the smoke step: a few chunks of rows (CUDA's chunks are at least 2048 rows: set smaller
here), class blocks through the tiled passes too."""


def run_smoke_step(out: Path, deadline: Deadline, *, dry_run: bool = False,
                   echo: Callable[[str], None] = print) -> dict[str, int]:
    """Step ``smoke``: (1) every variant of lce's Triton kernels (:mod:`lce.kernels.variants`) compiled for this
    GPU's compute capability (sm_90 without one) by :mod:`lce.kernels.cross_compile` in a process of its own;
    (2) the mixed-precision GEMM probes of :mod:`lce.passes.gemm`; (3) lce's default options and a class-tiled call on
    :data:`SMOKE_SHAPE` bf16 tensors with the kernels (CUDA, or the CPU with CUDA's layouts and Triton's
    interpreter in the dry run), errors against fp64 at most 2 floors, no fallback warning. Returns the number of
    ``failures``: the orchestrator stops the check after a step that had any."""
    import warnings

    from lce import kernels

    failures = 0
    cuda = torch.cuda.is_available() and not dry_run
    if not cuda:  # the kernels through Triton's interpreter, which it reads when it is first imported
        os.environ.setdefault("TRITON_INTERPRET", "1")
    arch = SMOKE_ARCH_WITHOUT_GPU
    if cuda:
        major, minor = torch.cuda.get_device_capability()
        arch = 10 * major + minor
    started = time.monotonic()
    compiled, failed = _cross_compile(arch, max(deadline.left() * 0.7, 5.0), echo)
    failures += len(failed) + (compiled == 0)
    echo(f"smoke: {compiled} kernel variants compiled for sm_{arch} in {time.monotonic() - started:.1f} s"
         + (f", {len(failed)} FAILED: {', '.join(failed)}" if failed else ""))
    echo(f"smoke: mixed-precision GEMMs: {_mixed_gemms_status()}; kernels: {_kernels_status()}")
    device = "cuda" if cuda else "cpu"
    for classes in (None, SMOKE_SHAPE.C // 3):
        with warnings.catch_warnings():
            warnings.simplefilter("error", kernels.KernelsFallbackWarning)
            try:
                line = _smoke_call(device, classes)
            except Exception as error:  # the message says what failed; the check stops after this step
                failures += 1
                line = f"FAILED: {type(error).__name__}: {error}"[:2000]
        echo(f"smoke: lce {'default' if classes is None else f'class-tiled ({classes} classes)'} on {device}: {line}")
    echo(f"smoke: {failures} failure(s)")
    return {"failures": failures}


def _cross_compile(arch: int, timeout: float, echo: Callable[[str], None]) -> tuple[int, list[str]]:
    """Every kernel variant compiled for ``arch`` by fresh processes, one shard each per core up to 8 (triton
    imported compiled, not interpreted): how many compiled, and what failed (each failure's error echoed; a shard
    that did not finish within ``timeout`` seconds counts as one failure)."""
    import json

    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    shards = max(1, min(os.cpu_count() or 1, 8))
    processes = [subprocess.Popen([sys.executable, "-m", "lce.kernels.cross_compile", "--arch", str(arch),
                                   "--shard", f"{index}/{shards}"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for index in range(shards)]
    deadline, compiled, failed = Deadline.after(timeout), 0, []
    for index, process in enumerate(processes):
        try:
            stdout, stderr = process.communicate(timeout=max(deadline.left(), 0.1))
        except subprocess.TimeoutExpired:
            process.kill()
            stdout, stderr = process.communicate()
            failed.append(f"shard {index}/{shards} did not finish within {timeout:.0f} s")
        for line in stdout.splitlines():
            record = json.loads(line)
            if "failed" in record:
                failed.append(record["failed"])
                echo(f"smoke: {record['failed']} sm_{arch}: {record['error']}\n{record.get('traceback', '')}")
            else:
                compiled += 1
        if process.returncode and not any("failed" in line for line in stdout.splitlines()) and stderr.strip():
            failed.append(f"shard {index}/{shards} (exit {process.returncode}): {stderr.strip()[-1500:]}")
    return compiled, failed


def _smoke_call(device: str, classes: int | None) -> str:
    """lce's default options (class blocks of ``classes`` where given) at :data:`SMOKE_SHAPE`, with the kernels:
    its plan's backend and its worst gradient error in floors; raises where the kernels do not run or the error is
    over 2 floors."""
    import contextlib

    from analysis.core.fp64 import reference_outputs
    from lce.testing import emulate_device_kind, interpreted_kernels

    inputs = make_inputs(SMOKE_SHAPE, torch.bfloat16, seed=0, bias=True, device=device)
    spec = ImplSpec("lce", "auto", f"rows:{SMOKE_SHAPE.N // 3}", classes=classes)
    options = spec.options()
    with contextlib.ExitStack() as stack:
        if device == "cpu":  # the dry run: CUDA's layouts, the kernels through Triton's interpreter
            stack.enter_context(emulate_device_kind("cuda"))
            stack.enter_context(interpreted_kernels())
        plan = lce.plan(inputs.input, inputs.weight, options=options, linear_bias=inputs.bias)
        if not plan.fused_passes:
            raise RuntimeError(f"the kernels do not run: {plan.passes_reason}")
        outputs = make_implementation(spec, device).run(inputs)
    reports = compare(outputs, reference_outputs(inputs))
    worst = max(report.columns(name).get(f"{name}_fro_in_floors") or 0.0 for name, report in reports.items())
    if not worst <= 2.0:
        raise RuntimeError(f"gradient error {worst:.3g} floors, over 2")
    return f"ok, worst gradient {worst:.3f} floors; passes: {plan.passes_reason}; {plan.cuda_gemms}"


# -------------------------------------------------------------------------------------------- step 1


def run_tests_step(out: Path, deadline: Deadline, *, dry_run: bool = False,
                   echo: Callable[[str], None] = print) -> int:
    """Step 1: ``pytest -m cuda`` on :data:`CUDA_TEST_FILES`, then the suites of :data:`API_TEST_FILES` (the dry run
    only collects them); returns the worse pytest exit status (5, no test collected, counts as 0: off a GPU
    every CUDA test is skipped or deselected)."""
    runs = (("cuda", ["-m", "cuda", *CUDA_TEST_FILES]), ("api", list(API_TEST_FILES)))
    worst = 0
    for name, arguments in runs:
        command = [sys.executable, "-m", "pytest", "-v", "-rfEs", "--durations=10", "-p", "no:cacheprovider",
                   *arguments]
        command += ["--collect-only"] if dry_run else [f"--junitxml={out / f'{name}_tests.xml'}"]
        echo("$ " + " ".join(command[1:]))
        code = _streamed(command, max(deadline.left(), 1), echo)
        if code is None:
            echo(f"tests: stopped at the step's limit ({deadline.left():.0f} s left); the lines above are what ran")
            return 124
        worst = max(worst, 0 if code == 5 else code)
    return worst


def _streamed(command: list[str], timeout: float, echo: Callable[[str], None]) -> int | None:
    """Run ``command``, echoing each line of its output as it comes (so a run cut short keeps what it printed);
    its exit status, or None where it was killed at ``timeout`` seconds."""
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               bufsize=1)
    timer = threading.Timer(timeout, process.kill)
    timer.start()
    try:
        for line in process.stdout:
            echo(line.rstrip("\n"))
        code = process.wait()
    finally:
        expired = not timer.is_alive()
        timer.cancel()
    return None if expired and code < 0 else code


def _study_command(module, arguments: list[str]) -> int | None:
    """Run a study's own command (``python -m analysis NAME ...``) in this process."""
    parser = argparse.ArgumentParser(prog=f"gpu-check {module.__name__}")
    module.add_arguments(parser)
    return module.run(parser.parse_args(arguments))


def run_noise_step(out: Path, deadline: Deadline, *, dry_run: bool = False,
                   echo: Callable[[str], None] = print) -> dict:
    """Step ``noise``: ``python -m analysis noise --device cuda`` into ``out/noise_cuda.csv`` (the dry run: one
    family and seed at a tiny shape, the CUDA layouts emulated)."""
    from analysis.studies import noise

    tiny = ["--device", "cpu", "--shape", "64x16x512", "--seeds", "1", "--families", "random"] if dry_run else [
        "--device", "cuda"]
    echo("noise: " + " ".join(tiny))
    _study_command(noise, [*tiny, "--results", str(out), "--file", "noise_cuda.csv", "--no-progress"])
    return {}


def run_train_step(out: Path, deadline: Deadline, *, dry_run: bool = False,
                   echo: Callable[[str], None] = print) -> dict:
    """Step ``train``: ``python -m analysis train --device cuda`` (every arm, seed 0) into
    ``out/training_cuda.csv.gz``, starting no run after the step's share; the dry run only checks the tokens file."""
    from analysis.studies import training

    if dry_run or not TOKENS_FILE.exists():
        echo(f"train: tokens {display_path(TOKENS_FILE)} {'present' if TOKENS_FILE.exists() else 'MISSING'}; "
             + ("dry run: planned only" if dry_run else "nothing to train on"))
        return {} if dry_run else {"error": "no tokens file"}
    cache = Path(tempfile.mkdtemp(prefix="lce-train-"))
    _study_command(training, ["--device", "cuda", "--tokens", str(TOKENS_FILE), "--cache", str(cache),
                              "--results", str(out), "--file", "training_cuda.csv.gz", "--seed-list", "0",
                              "--budget-s", f"{max(deadline.left() - 60, 1):.0f}", "--no-progress"])
    return {}


def run_head_step(out: Path, deadline: Deadline, *, dry_run: bool = False,
                  echo: Callable[[str], None] = print) -> dict:
    """Step ``head``: ``python -m analysis head-train --setting gpu --device cuda`` (AdamW, seed 0, as many steps as
    the share allows) into ``out/head_training_cuda.csv.gz``; the dry run: the quick setting on the CPU, SGD only."""
    from analysis.studies import head_training

    cache = Path(tempfile.mkdtemp(prefix="lce-head-"))
    arguments = (["--quick", "--optimizers", "sgd", "--workers", "1"] if dry_run else
                 ["--setting", "gpu", "--device", "cuda", "--optimizers", "adamw",
                  "--budget-s", f"{max(deadline.left() - 90, 1):.0f}"])
    echo("head: " + " ".join(arguments))
    _study_command(head_training, [*arguments, "--cache", str(cache), "--results", str(out), "--file",
                                   "head_training_cuda.csv.gz", "--no-progress"])
    return {}


def run_hf_step(out: Path, deadline: Deadline, *, dry_run: bool = False,
                echo: Callable[[str], None] = print) -> dict:
    """Step ``hf``: ``python -m analysis hf-step --device cuda`` -- one training step of a transformers Llama with a
    128256-class head, unpatched, patched by lce.integrations.transformers, and patched by Liger-Kernel's own
    ``apply_liger_kernel_to_llama`` (its fused linear cross-entropy) -- into ``out/hf_step_cuda.csv``, with
    device_name the GPU's (the dry run: the tiny setting on the CPU, one round)."""
    from analysis.studies import hf_step

    arguments = ["--device", "cpu", "--dry-run"] if dry_run else ["--device", "cuda", "--rounds", "3"]
    echo("hf: " + " ".join(arguments))
    _study_command(hf_step, [*arguments, "--results", str(out), "--file", "hf_step_cuda.csv", "--no-progress"])
    return {}


_STEP_RUNNERS = {"smoke": run_smoke_step, "bench": run_bench_step, "head": run_head_step, "memory": run_memory_step,
                 "tests": run_tests_step, "grid": run_grid_step, "noise": run_noise_step, "train": run_train_step,
                 "hf": run_hf_step}


def run_step(name: str, out: Path, seconds: float, *, dry_run: bool = False) -> int:
    """Run step ``name`` in this process with ``seconds`` to do it (what ``--step NAME`` calls); exit status:
    pytest's for the tests, 1 for a step that recorded an error row (it still wrote every other row), else 0."""
    if name not in _STEP_RUNNERS:
        raise ValueError(f"step must be one of {tuple(_STEP_RUNNERS)}, got {name!r}")
    out.mkdir(parents=True, exist_ok=True)
    result = _STEP_RUNNERS[name](out, Deadline.after(seconds), dry_run=dry_run, echo=lambda line: print(line,
                                                                                                        flush=True))
    if name == "tests":
        return result
    return 1 if result.get("errors") or result.get("error") or result.get("failures") else 0


# ------------------------------------------------------------------------------------- orchestrator


def _run_logged(command: list[str], timeout: float, log, env: dict[str, str]) -> tuple[int, float]:
    """Run ``command``, copying its output line by line to ``log`` and stdout; kill it after ``timeout``."""
    started = time.monotonic()
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, bufsize=1)
    timer = threading.Timer(timeout, process.kill)
    timer.start()
    try:
        for line in process.stdout:
            log.write(line)
            log.flush()
            sys.stdout.write(line)
        code = process.wait()
    finally:
        timer.cancel()
    return code, time.monotonic() - started


def run_check(out: Path, *, budget_s: float = DEFAULT_BUDGET_S, dry_run: bool = False,
              wheels: Path = WHEELS_DIR, steps: Sequence[str] = DEFAULT_STEPS) -> dict[str, tuple[int, float]]:
    """The whole check: provenance, the wheels, then each of ``steps`` in a process of its own with its share
    of ``budget_s`` (killed :data:`GRACE_S` after it), everything logged to ``out/gpu_check.log``.

    Returns each step's (exit status, seconds); -9 is a step killed at its limit.
    """
    shares = step_seconds(budget_s, steps)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1", MPLBACKEND="Agg")
    env.setdefault("LCE_LAB_REVISION", git_revision())
    results: dict[str, tuple[int, float]] = {}
    with open(out / LOG_NAME, "a", encoding="utf-8") as log:
        def echo(line: str) -> None:
            log.write(line + "\n")
            log.flush()
            print(line, flush=True)

        mode = "dry run (CPU)" if dry_run else "run"
        echo(f"== gpu-check {mode}, budget {budget_s:.0f} s, out {out}")
        for key, value in gpu_provenance().items():
            echo(f"{key}: {value}")
        for name, wheel in wheel_status(wheels).items():
            echo(f"wheel {name}: {wheel.name if wheel else f'MISSING from {wheels} (make gpu-wheels)'}")
        if not dry_run:
            site = Path(tempfile.mkdtemp(prefix="lce-gpu-site-"))
            for line in unpack_wheels(wheels, site):
                echo(line)
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), str(ROOT), env.get("PYTHONPATH")]))
        for step in (step for step in STEPS if step.name in shares):
            seconds = shares[step.name]
            echo(f"== step {step.name} (limit {seconds:.0f} s): {step.summary}")
            command = [sys.executable, "-m", "analysis", "gpu-check", "--step", step.name, "--step-seconds",
                       f"{seconds:.1f}", "--out", str(out)] + (["--dry-run"] if dry_run else [])
            code, took = _run_logged(command, seconds + GRACE_S, log, env)
            results[step.name] = (code, took)
            echo(f"== step {step.name}: exit {code} after {took:.1f} s")
            if step.name == "smoke" and code != 0:
                echo("== the smoke step failed (see above): the check stops here, so that no fallback is measured "
                     "as lce's kernels")
                break
        echo("== summary: " + ", ".join(f"{name} exit {code} in {took:.0f} s"
                                        for name, (code, took) in results.items()))
        written = [name for name in (CUDA_FILE, BENCH_FILE, MEMORY_FILE) if (out / name).exists()]
        echo(f"== files in {out}: {', '.join(written) or 'none'}, {LOG_NAME}")
    return results


# ---- python -m analysis gpu-check ----------------------------------------------------------------------------

DESCRIPTION = ("Steps, each in its own process with its share of the budget (by default "
               + ", ".join(f"{name} {share / DEFAULT_BUDGET_S:.0%}"
                           for name, share in step_seconds(DEFAULT_BUDGET_S).items()) + "): "
               + "; ".join(step.summary for step in STEPS) + ". Writes cuda.csv, gpu_memory.csv, gpu_bench.csv "
               "and gpu_check.log (provenance) to --out; a step cut short keeps its rows. --dry-run: every step's "
               "plan, the wheels folder, the grid on tiny shapes with the CUDA layouts emulated (CPU, under a "
               "minute).")


def _budget(text: str) -> float:
    step_seconds(float(text))  # ValueError for a budget that is not a positive number of seconds
    return float(text)


def _steps(text: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    step_seconds(1.0, names)  # ValueError naming the steps there are
    return names


def add_arguments(parser) -> None:
    import argparse

    from analysis.core.arguments import argument
    from analysis.gpu.wheels import WHEELS_DIR
    from analysis.paths import display_path

    parser.add_argument("--budget-s", type=argument(_budget), default=DEFAULT_BUDGET_S, metavar="S",
                        help=f"wall-clock budget of all steps in seconds (default: {DEFAULT_BUDGET_S:.0f})")
    parser.add_argument("--out", type=Path, default=None,
                        help=f"output folder (default: {display_path(DEFAULT_OUT)}; a fresh temporary folder with "
                             "--dry-run)")
    parser.add_argument("--dry-run", action="store_true", help="on a CPU: plans, wheels, tiny emulated grid")
    parser.add_argument("--steps", type=argument(_steps), default=DEFAULT_STEPS, metavar="NAME[,NAME]",
                        help=f"steps to run, in their fixed order (default: {','.join(DEFAULT_STEPS)}; all: "
                             f"{','.join(step.name for step in STEPS)})")
    parser.add_argument("--wheels", type=Path, default=WHEELS_DIR,
                        help=f"folder of Liger-Kernel / Cut Cross-Entropy wheels (default: {display_path(WHEELS_DIR)})")
    parser.add_argument("--step", choices=[step.name for step in STEPS], default=None, help=argparse.SUPPRESS)
    parser.add_argument("--step-seconds", type=float, default=60.0, help=argparse.SUPPRESS)


def run(args) -> int:
    if args.step:
        return run_step(args.step, args.out or DEFAULT_OUT, args.step_seconds, dry_run=args.dry_run)
    if args.out is None and args.dry_run:
        args.out = Path(tempfile.mkdtemp(prefix="gpu-check-dry-run-"))
    results = run_check(args.out or DEFAULT_OUT, budget_s=args.budget_s, dry_run=args.dry_run, wheels=args.wheels,
                        steps=args.steps)
    return 1 if any(code != 0 for code, _ in results.values()) else 0
