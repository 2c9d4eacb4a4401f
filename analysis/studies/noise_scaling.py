"""The error/noise ratios over the batch size: does a policy's gradient error stay below SGD's noise as N grows?

The noise study (:mod:`analysis.studies.noise`) compares each policy's gradient error with the sampling noise of
one batch of N = 1024 rows. The noise shrinks as ``1/sqrt(N)``; an error's *systematic* part need not, so
``weight_bias_over_noise`` may grow with N up to ``sqrt(N)``, and LLM steps see 10^5-10^6 rows. This study
measures the same ratios (:func:`analysis.studies.noise.exact_batch` and
:func:`~analysis.studies.noise.contender_rows`, one row per candidate) over a grid of batch sizes
(:data:`GRID`), for the candidates the error/noise rule weighs (:func:`candidates`):

* the "auto" picks: lce's CUDA one (the plan of :func:`analysis.studies.noise.chunk_rules`, emulated on CPU
  tensors) and the CPU table's own (:data:`~analysis.studies.noise.AUTO_CPU`, lce's chunking);
* torch 2.13's CUDA default (compact, ``aspect_ratio:2``);
* compact at the rows per chunk of lce's CUDA auto (:data:`AUTO_CUDA_ROWS`, the floor that binds at every N here)
  and at a fixed 16 chunks; balanced and accurate at torch's 256 chunks (all fp32 ``acc_dtype``, CUDA layouts);
* the unfused op in the input dtype.

Each row also carries ``gradient_over_noise``, the exact weight gradient's norm over its sampling noise: about 1
at every N where the family's *expected* gradient is zero (the batch gradient is then all noise), growing as
``sqrt(N)`` where it is not (:data:`EXPECTED_GRADIENT`).

A *case* is one (family, dtype, seed, shape); its rows are appended to the results file as soon as it is measured
(:func:`analysis.core.results_io.append_rows`, fsynced), and a rerun measures only the candidates a case lacks
(:func:`done_keys`), so the study resumes where it stopped and ``--shard K/M`` splits the cases among processes
that share the file. Costs grow as N * D: at N = 2^16, D = 128 a case takes about 7 minutes of one core.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

import pandas as pd
import torch

from analysis.core.families import draw, parse_family
from analysis.core.implementations import ImplSpec
from analysis.core.inputs import rounded_inputs
from analysis.core.problem import DTYPES, Shape
from analysis.core.results_io import NOISE_SCALING, append_rows, read_table
from analysis.studies.noise import AUTO_CPU, chunk_rules, contender_rows, exact_batch
from analysis.studies.peers import Contender, run_contenders

__all__ = ["AUTO_CUDA", "AUTO_CPU", "TORCH_DEFAULT", "AUTO_CUDA_ROWS", "CANDIDATES", "RULE_PICKS", "SCALING_FILE",
           "EXPECTED_GRADIENT", "Axis", "GRID", "Case", "CASE_KEY", "candidates", "family_rows", "cases",
           "done_keys", "measure_case", "run_cases"]

AUTO_CUDA = "lce auto cuda"
"""lce's CUDA "auto" pick at the case's shape (policy and chunk count from its plan; fp32 acc_dtype)."""
TORCH_DEFAULT = "torch 2.13 auto"
"""torch 2.13's CUDA default: compact with ``aspect_ratio:2`` (:func:`analysis.studies.noise.chunk_rules`)."""
AUTO_CUDA_ROWS = 2048
"""Rows per chunk of lce's CUDA auto wherever its floor binds (every shape of :data:`GRID`): compact at these rows
is what the auto table would run had it picked compact."""

CANDIDATES: tuple[str, ...] = (AUTO_CUDA, AUTO_CPU, TORCH_DEFAULT, f"lce compact rows={AUTO_CUDA_ROWS}",
                               "lce compact chunks=16", "lce balanced chunks=256", "lce accurate chunks=256",
                               "unfused")
"""Every candidate, in the order figures list them."""
RULE_PICKS: tuple[str, ...] = (AUTO_CUDA, AUTO_CPU, TORCH_DEFAULT, f"lce compact rows={AUTO_CUDA_ROWS}", "unfused")
"""The candidates measured at the larger D (fewer, to fit the budget)."""

SCALING_FILE = "noise_scaling.csv"

EXPECTED_GRADIENT: dict[str, bool] = {"random": True, "calibrated": False, "trained": True}
"""Whether a family kind's *expected* weight gradient (over batches) is nonzero. ``random``: targets uniform and
independent of the logits, a confidently wrong head; ``trained``: held-out text, which the model does not predict
perfectly; ``calibrated``: targets drawn from the model's own softmax, so ``E[onehot | x] = softmax`` and the
expected gradient is zero (its confident rows aside, whose residual is below e^-10): the batch gradient is all
sampling noise, and a bias along it shrinks with the noise, which hides the growth this study looks for."""


@dataclasses.dataclass(frozen=True)
class Axis:
    """One slice of the grid: batch sizes ``rows`` at ``D`` features (C = ``classes``), with the families, dtypes,
    seeds and candidates measured there."""

    D: int
    rows: tuple[int, ...]
    families: tuple[str, ...]
    dtypes: tuple[str, ...] = ("bfloat16", "float16")
    seeds: tuple[int, ...] = (0, 1, 2)
    candidates: tuple[str, ...] = CANDIDATES
    classes: int = 16384


GRID: tuple[Axis, ...] = (
    Axis(128, tuple(2**k for k in range(10, 17)), ("random", "trained:final")),
    Axis(128, tuple(2**k for k in range(10, 17)), ("calibrated",)),
    Axis(512, tuple(2**k for k in range(10, 14)), ("random",), dtypes=("bfloat16",), candidates=RULE_PICKS),
    Axis(2048, tuple(2**k for k in range(10, 13)), ("random",), dtypes=("bfloat16",), candidates=RULE_PICKS),
)
"""The study's grid, in the order it is measured (a run cut short has the rows that matter most): D = 128 (the
trained model's head, C = 16384) from N = 2^10 to 2^16 on the families with a nonzero expected gradient, then the
calibrated family, then D = 512 and 2048 on the random family in bf16 at the rule's picks, so the scaling is not
an artefact of D = 128. The trained family stops at its dump's rows (:func:`family_rows`)."""


@dataclasses.dataclass(frozen=True)
class Case:
    """One batch of inputs: ``family``'s draw at ``seed`` and ``shape``, rounded to ``dtype``, and the candidates
    to measure on it."""

    family: str
    dtype: str
    seed: int
    shape: Shape
    candidates: tuple[str, ...] = CANDIDATES

    def keys(self) -> list[tuple]:
        """The :data:`CASE_KEY` of each of its candidates' rows."""
        s = self.shape
        return [(self.family, self.dtype, self.seed, s.N, s.D, s.C, name) for name in self.candidates]

    @property
    def cost(self) -> float:
        """Relative cost (N * D * (candidates + 3 for the fp64 answer and its noise)), for the progress bar."""
        return self.shape.N * self.shape.D * (len(self.candidates) + 3) / 2**20


CASE_KEY: tuple[str, ...] = ("family", "dtype", "seed", "N", "D", "C", "candidate")
"""The columns that name a row independently of the code revision that measured it (the resume key)."""


def candidates(shape: Shape, dtype: torch.dtype, names: Sequence[str] = CANDIDATES,
               device: str = "cuda-emulated") -> list[Contender]:
    """The contenders of ``names`` at ``shape`` (see the module docstring), labelled by name; ``device``
    "cuda-emulated" (CPU tensors; :data:`AUTO_CPU` then runs the CPU table) or "cuda" (no CPU pick there)."""
    n = shape.N
    rules = chunk_rules(shape, dtype)

    def lce(label: str, policy: str, rows: int) -> Contender:
        return Contender(label, ImplSpec("lce", policy, f"rows:{min(rows, n)}", "float32"), device)

    def chunks_of(label: str, policy: str, count: int) -> Contender:
        return lce(label, policy, -(-n // min(count, n)))

    made = {AUTO_CUDA: lce(AUTO_CUDA, rules["lce auto"][0], -(-n // rules["lce auto"][1])),
            TORCH_DEFAULT: chunks_of(TORCH_DEFAULT, *rules["torch 2.13 auto"]),
            f"lce compact rows={AUTO_CUDA_ROWS}": lce(f"lce compact rows={AUTO_CUDA_ROWS}", "compact", AUTO_CUDA_ROWS),
            "unfused": Contender("unfused", ImplSpec("reference"), "cpu" if device == "cuda-emulated" else device)}
    if device == "cuda-emulated":
        made[AUTO_CPU] = Contender(AUTO_CPU, ImplSpec("lce", "auto", "auto"), "cpu")
    for name in names:
        if name not in made and name.startswith("lce ") and " chunks=" in name:
            policy, _, count = name.removeprefix("lce ").partition(" chunks=")
            made[name] = chunks_of(name, policy, int(count))
    unknown = [name for name in names if name not in made]
    if unknown:
        raise ValueError(f"unknown candidates {unknown} on {device!r}; known: {list(CANDIDATES)}")
    return [made[name] for name in names]


@functools.cache
def family_rows(family: str, features: int, classes: int) -> int | None:
    """The most rows ``family`` can give at ``features`` x ``classes``: None for the synthetic families (any),
    the dump's rows for a trained checkpoint whose head has that shape, 0 for one that does not."""
    kind, checkpoint = parse_family(family)
    if kind != "trained":
        return None
    from analysis.core.head_dumps import load_head_dump

    dump = load_head_dump(checkpoint or "final")
    rows, d = dump.x.shape
    return rows if (d, dump.weight.shape[0]) == (features, classes) else 0


def cases(grid: Iterable[Axis] = GRID) -> list[Case]:
    """Every case of ``grid``, in measuring order: axis by axis, seed-major (each seed spans every N before the next
    seed starts), then N, family and dtype. A trained family is measured at the N its dump can give, and where N
    takes every row of the dump at its first seed only (every seed would draw the same rows)."""
    out = []
    for axis in grid:
        for seed in axis.seeds:
            for n in axis.rows:
                for family in axis.families:
                    most = family_rows(family, axis.D, axis.classes)
                    if most is not None and (n > most or (n == most and seed != axis.seeds[0])):
                        continue
                    out += [Case(family, dtype, seed, Shape(n, axis.D, axis.classes), axis.candidates)
                            for dtype in axis.dtypes]
    return out


def done_keys(path: Path) -> set[tuple]:
    """The :data:`CASE_KEY` of every row ``path`` holds (empty when it does not exist)."""
    if not path.exists():
        return set()
    table = read_table(path)
    if table.empty:
        return set()
    return {(row.family, row.dtype, int(row.seed), int(row.N), int(row.D), int(row.C), row.candidate)
            for row in table[list(CASE_KEY)].itertuples(index=False)}


def measure_case(case: Case, device: str = "cuda-emulated") -> pd.DataFrame:
    """One row per candidate of ``case`` (the :data:`analysis.core.results_io.NOISE_SCALING` columns but its
    timing and provenance)."""
    dtype = DTYPES[case.dtype]
    tensor_device = "cpu" if device == "cuda-emulated" else device
    inputs = rounded_inputs(draw(case.family, case.shape, seed=case.seed, bias=False), dtype, device=tensor_device)
    runs = candidates(case.shape, dtype, case.candidates, device)
    batch = exact_batch(inputs)
    rows = contender_rows(batch, runs, run_contenders(runs, inputs))
    s = case.shape
    common = {"family": case.family, "dtype": case.dtype, "seed": case.seed, "N": s.N, "D": s.D, "C": s.C,
              "device": device, "gradient_over_noise": batch.gradient_norm / batch.noise.weight}
    return pd.DataFrame([{**common, "candidate": row.pop("impl"), **row} for row in rows])


def run_cases(path: Path, planned: Sequence[Case], *, device: str = "cuda-emulated", progress: bool = True,
              log=print) -> int:
    """Measure the candidates of ``planned`` that ``path`` lacks, appending each case's rows (with its wall and CPU
    time and provenance) as soon as it is measured; returns how many rows were written."""
    from tqdm import tqdm

    from analysis.core.provenance import provenance

    done = done_keys(path)
    pending = []
    for case in planned:
        missing = tuple(name for name, key in zip(case.candidates, case.keys(), strict=True) if key not in done)
        if missing:
            pending.append(dataclasses.replace(case, candidates=missing))
    log(f"{path.name}: {len(planned) - len(pending)} of {len(planned)} cases already measured, {len(pending)} to go")
    written = 0
    with tqdm(total=round(sum(case.cost for case in pending), 1), desc="noise-scaling", unit="cost",
              disable=not progress, dynamic_ncols=True, mininterval=5) as bar:
        for case in pending:
            bar.set_postfix_str(f"{case.family} {case.dtype} seed {case.seed} N={case.shape.N} D={case.shape.D}")
            started, cpu_started = time.perf_counter(), time.process_time()
            table = measure_case(case, device)
            table = table.assign(wall_s=time.perf_counter() - started, cpu_s=time.process_time() - cpu_started,
                                 **provenance("cpu" if device == "cuda-emulated" else device))
            written += append_rows(path, NOISE_SCALING.rows(table))
            bar.update(round(case.cost, 1))
    return written


# ---- python -m analysis noise-scaling ------------------------------------------------------------------------

DESCRIPTION = ("The noise study's ratios (error and bias over the sampling noise) over the batch size: N = 2^10 to "
               "2^16 at D = 128 (C = 16384) on the random, trained and calibrated families, and D = 512, 2048 at "
               "smaller N; the rule's candidates (each auto pick, torch 2.13's default, compact at auto's rows and "
               "16 chunks, balanced and accurate at 256, the unfused op); bf16 and fp16; 3 seeds. Appends to "
               "noise_scaling.csv case by case and resumes where it stopped; --shard K/M splits the cases among M "
               "processes. About 4 CPU-hours in all; `python -m analysis noise-scaling-fit` fits and exports the "
               "scaling.")


def add_arguments(parser) -> None:
    from analysis.core.arguments import argument, progress_option, results_option
    from analysis.sweep.run import parse_shard

    results_option(parser)
    parser.add_argument("--file", default=SCALING_FILE, metavar="NAME", help=f"results file (default: {SCALING_FILE})")
    parser.add_argument("--shard", type=argument(parse_shard), default=(1, 1), metavar="K/M",
                        help="measure only the K-th of every M cases, counting from 1 (default: all)")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads (default: 1; run one process per "
                                                               "core with --shard instead)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cpu: the CUDA layouts emulated on CPU tensors (default); cuda: a real GPU")
    progress_option(parser)


def run(args) -> None:
    from analysis.paths import display_path

    path = args.results / args.file
    torch.set_num_threads(args.threads)
    index, total = args.shard
    planned = [case for number, case in enumerate(cases()) if number % total == index - 1]
    device = "cuda" if args.device == "cuda" else "cuda-emulated"
    started = time.perf_counter()
    written = run_cases(path, planned, device=device, progress=not args.no_progress)
    print(f"{display_path(path)}: {written} rows in {time.perf_counter() - started:.0f} s")

