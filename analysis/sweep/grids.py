"""The named grids: every run a sweep makes is declared here.

A grid is a list of :class:`RunConfig` (one CSV row each) plus how each run is
measured (:class:`Measurement`). Grids:

* ``quick`` -- every policy x chunking method x fp32/bf16/fp16 on small CPU
  shapes, lce next to torch's native op, the unfused reference and its
  torch.compile, plus lce's CUDA layouts emulated on CPU tensors (errors of
  the CUDA path); sized to finish in <= 10 minutes on 2 CPU cores.
* ``full`` -- the publication CPU grid: larger shapes up to LLM-like aspect
  ratios (C/D >= 32), torch.compile of the reference, and lce's CUDA layouts
  emulated on CPU tensors (their errors; memory and time are CPU's).
* ``cuda`` -- what ``python -m analysis gpu-check`` runs on one lent H200 in
  its grid share (about 3 minutes), most telling first: every family at the
  trained head's shape (``medium``'s, whose emulated rows are the stand-in's
  numbers on the very same inputs), the LLM heads 16384x4096x128256 and
  8192x2304x256000 in bf16, TF32 allowed (``cuda-tf32``), then more seeds.

``tiny`` is a seconds-long grid for tests and CI.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable, Sequence

from analysis.core.problem import LLM_SHAPES, Shape
from analysis.core.run_config import RunConfig
from lce.planning.options import ACC_POLICIES, parse_chunking_method
from lce.planning.plan import aspect_ratio_chunk_size

__all__ = ["RunConfig", "Measurement", "Grid", "GRIDS", "get_grid", "CHUNKINGS", "LOW_PRECISION", "chunked_configs",
           "family_grid", "SEEDS", "FAMILIES_IN_GRIDS", "CUDA_FAMILY_SHAPE", "CUDA_HEADLINE_SHAPES", "CUDA_SEEDS"]

CHUNKINGS: tuple[str, ...] = ("auto", "aspect_ratio", "aspect_ratio:2", "aspect_ratio:4", "aspect_ratio:8")
LOW_PRECISION: tuple[str, ...] = ("bfloat16", "float16")


@dataclasses.dataclass(frozen=True)
class Measurement:
    """How each run is measured: untimed warm-up calls, timed repeats (median kept), CPU threads, workers.

    Memory and time do not depend on the values drawn, only errors do: runs
    with ``seed < timed_seeds`` are measured in full, the others (and every
    :attr:`RunConfig.errors_only` run) make one call for their errors.

    ``threads=1`` on shared CPU machines: with 2 intra-op threads on 2 busy
    cores every parallel region waits for a time slice, and a 1 ms op took
    7 ms (measured while another process held one core). ``0`` keeps torch's
    default. ``parallel``: the sweep may run in one worker process per
    available core, each with ``threads`` intra-op threads (every run then
    shares the machine with as many others as there are cores, the same for
    all runs of a problem); False for a GPU grid, whose timings need the
    device alone.
    """

    warmup: int = 1
    repeats: int = 3
    threads: int = 1
    parallel: bool = True
    timed_seeds: int = 1

    def measures_costs(self, config: RunConfig) -> bool:
        """Whether ``config``'s memory and time are measured (else only its errors)."""
        return config.seed < self.timed_seeds and not config.errors_only


@dataclasses.dataclass(frozen=True)
class Grid:
    """A named list of runs and how to measure them."""

    name: str
    description: str
    configs: tuple[RunConfig, ...]
    measurement: Measurement = Measurement()

    def __post_init__(self) -> None:
        keys = [c.key for c in self.configs]
        if len(set(keys)) != len(keys):
            raise ValueError(f"grid {self.name!r} lists a run twice")

    def shard(self, index: int, count: int) -> tuple[RunConfig, ...]:
        """Shard ``index`` of ``count`` (1-based): every ``count``-th run, so shards take equal work."""
        if count < 1 or not 1 <= index <= count:
            raise ValueError(f"shard must be K/N with 1 <= K <= N, got {index}/{count}")
        return self.configs[index - 1::count]


def distinct_chunkings(shape: Shape, chunkings: Sequence[str]) -> list[str]:
    """``chunkings`` without the explicit methods that resolve to an earlier one's rows per chunk at ``shape``.

    "auto" is always kept: it is the configuration a verdict judges.
    """
    kept, seen_rows = [], set()
    for chunking in chunkings:
        if chunking != "auto":
            rows = aspect_ratio_chunk_size(shape.N, shape.D, shape.C, parse_chunking_method(chunking))
            if rows in seen_rows:
                continue
            seen_rows.add(rows)
        kept.append(chunking)
    return kept


def chunked_configs(shapes: Iterable[Shape], dtypes: Sequence[str], *, ops: Sequence[str] = ("lce", "torch"),
                    policies: Sequence[str] = ACC_POLICIES, chunkings: Sequence[str] = CHUNKINGS,
                    device: str = "cpu", bias: bool = True, family: str = "random",
                    seeds: Sequence[int] = (0,)) -> list[RunConfig]:
    """Every op x policy x chunking x acc_dtype for each shape, dtype and seed, grouped by problem.

    Explicit policies run twice on fp16/bf16: with ``acc_dtype`` left to the
    options contract (which gives the input dtype for an explicit policy) and
    with ``acc_dtype=float32`` (the mixed-precision layouts). ``"auto"`` runs
    once: it resolves ``acc_dtype`` itself. Of the explicit chunking methods
    that give a shape the same rows per chunk (at 256x64x8192, aspect_ratio:2,
    :4 and :8 all give one row) only the first runs: the others would repeat
    its computation.
    """
    out: list[RunConfig] = []
    for shape, dtype, seed in itertools.product(shapes, dtypes, seeds):
        for op, policy, chunking in itertools.product(ops, policies, distinct_chunkings(shape, chunkings)):
            accs = ["default"]
            if dtype in LOW_PRECISION and policy != "auto":
                accs.append("float32")
            for acc in accs:
                out.append(RunConfig(op, dtype, shape.N, shape.D, shape.C, policy, chunking, acc, bias, device,
                                     family, seed))
    return out


COSTS_ONLY_OPS = ("compiled",)
"""Unchunked ops run on the first seed only: torch.compile's numbers are the unfused reference's, and
compiling it again for each seed's inputs costs 10-20 s of CPU time per problem."""


def _with_unchunked(configs: list[RunConfig], ops: Sequence[str]) -> tuple[RunConfig, ...]:
    """``configs`` plus one run of each unchunked op per problem, kept next to its problem's runs
    (:data:`COSTS_ONLY_OPS` on the first seed only)."""
    by_problem: dict[tuple, list[RunConfig]] = {}
    for config in configs:
        by_problem.setdefault(config.inputs_key(), []).append(config)
    out: list[RunConfig] = []
    for runs in by_problem.values():
        first = runs[0]
        out.extend(RunConfig(op, first.dtype, first.N, first.D, first.C, bias=first.bias, device=first.device,
                             family=first.family, seed=first.seed) for op in ops
                   if op not in COSTS_ONLY_OPS or first.seed == 0)
        out.extend(runs)
    return tuple(out)


def family_grid(problems: Sequence[tuple[str, Shape]], dtypes: Sequence[str], seeds: Sequence[int], *,
                ops: Sequence[str] = ("lce", "torch"), chunkings: Sequence[str] = CHUNKINGS,
                unchunked: Sequence[str] = ("reference",), emulate_cuda: bool = True) -> tuple[RunConfig, ...]:
    """Per (family, shape) problem, dtype and seed: the chunked ``ops`` on the CPU with every policy x chunking,
    the ``unchunked`` ops, and (``emulate_cuda``) lce's CUDA layouts emulated on CPU tensors."""
    configs: list[RunConfig] = []
    for family, shape in problems:
        configs += _with_unchunked(chunked_configs([shape], dtypes, ops=ops, chunkings=chunkings, family=family,
                                                   seeds=seeds), unchunked)
        if emulate_cuda:
            configs += chunked_configs([shape], dtypes, ops=("lce",), chunkings=chunkings, device="cuda-emulated",
                                       family=family, seeds=seeds)
    return tuple(configs)


_DTYPES = ("float32", "bfloat16", "float16")
SEEDS: tuple[int, ...] = (0, 1, 2, 3, 4)
"""The seeds of every committed grid: figures show their median and 90% interval."""

# The trained model's head (analysis.lm: D=128, C=16384) fixes its shape; random and calibrated run at the
# same D and C so that a difference between families is the inputs', not the shape's.
TRAINED_D, TRAINED_C = 128, 16384
FAMILIES_IN_GRIDS: tuple[str, ...] = ("random", "calibrated", "trained")

# quick: few rows (CPU "auto" does not chunk at 32 rows: its floor is 256-512), so the explicit chunking
# methods span 1 to 32 chunks; 32 rows keep `make reproduce` within 5 minutes with 5 seeds of 3 families.
_QUICK_SHAPE = Shape(32, TRAINED_D, TRAINED_C)
_FULL_SHAPES = (Shape(256, 128, 4096), Shape(512, 64, 1024), Shape(1024, 256, 8192), Shape(2048, 256, 16384),
                Shape(2048, 128, 32768))
# medium: N above the CPU minimum rows, so CPU "auto" really chunks: every family at the trained head's D and C,
# with the explicit chunkings up to aspect_ratio:2 (8 rows at 2048x128x16384: finer ones cost seconds per call
# at these shapes); calibrated also at D=1024 and at C=65536, where every policy runs with "auto" chunking
# alone (explicit aspect-ratio chunks of 4 rows take 20-100 s per call at C=65536 on one core), and without
# torch's op: its "auto" chunking follows the aspect-ratio rule on CPU too, and took 26 s per call at
# 1024x256x65536 in bf16. At C=65536 the CUDA layouts are not emulated either: their aspect_ratio:2 chunks of a
# few rows each upcast the whole weight on CPU. About 45 minutes on 2 free cores.
_MEDIUM_PROBLEMS = tuple((family, Shape(2048, TRAINED_D, TRAINED_C)) for family in FAMILIES_IN_GRIDS)
_MEDIUM_WIDE = (("calibrated", Shape(1024, 1024, 8192)), ("calibrated", Shape(1024, 256, 65536)))
_MEDIUM_CHUNKINGS = ("auto", "aspect_ratio", "aspect_ratio:2")
CUDA_FAMILY_SHAPE = Shape(2048, TRAINED_D, TRAINED_C)
CUDA_HEADLINE_SHAPES: tuple[Shape, ...] = LLM_SHAPES[:2]
"""LLM heads (Llama 3 8B's vocabulary at 16k tokens; Gemma 2 2B's, the Cut Cross-Entropy paper's bench shape)."""
CUDA_SEEDS: tuple[int, ...] = (0, 1, 2)


def _cuda_configs() -> tuple[RunConfig, ...]:
    """The ``cuda`` grid in the order a time budget should cut it: what is only learnt on a GPU comes first.

    1. every family at :data:`CUDA_FAMILY_SHAPE`, every dtype, seed 0, with ``medium``'s chunkings (its
       ``cuda-emulated`` rows hold the stand-in's errors on the same inputs: emulated vs real per layout), the
       unfused reference, Liger and CCE (milliseconds each here);
    2. the LLM heads in bf16, seed 0, "auto" chunking only (one run is a second or more, and a fp64 reference
       of several GiB); lce's policies with fp32 accumulation, the unfused reference;
    3. TF32 allowed (``cuda-tf32``): lce at the family shape in fp32 and bf16 and at the first LLM head;
    4. seeds 1 and 2 of step 1.
    """
    def families(seeds: Sequence[int], dtypes: Sequence[str], device: str, unchunked: Sequence[str]) -> list:
        out: list[RunConfig] = []
        for family in FAMILIES_IN_GRIDS:
            chunked = chunked_configs([CUDA_FAMILY_SHAPE], dtypes, chunkings=_MEDIUM_CHUNKINGS, device=device,
                                      family=family, seeds=seeds, ops=("lce", "torch") if unchunked else ("lce",))
            out += _with_unchunked(chunked, unchunked)
        return out

    configs = families((0,), _DTYPES, "cuda", ("reference", "liger", "cce"))
    configs += _with_unchunked(chunked_configs(CUDA_HEADLINE_SHAPES, ("bfloat16",), chunkings=("auto",),
                                               device="cuda"), ("reference",))
    configs += families((0,), ("float32", "bfloat16"), "cuda-tf32", ())
    configs += chunked_configs(CUDA_HEADLINE_SHAPES[:1], ("bfloat16",), ops=("lce",), chunkings=("auto",),
                               device="cuda-tf32")
    configs += families(CUDA_SEEDS[1:], _DTYPES, "cuda", ("reference", "liger", "cce"))
    return tuple(configs)


GRIDS: dict[str, Grid] = {
    "tiny": Grid(
        "tiny", "seconds-long smoke grid for tests and CI",
        _with_unchunked(chunked_configs([Shape(16, 8, 64)], ("float32", "bfloat16"),
                                        policies=("auto", "compact"), chunkings=("auto", "aspect_ratio:2"),
                                        seeds=(0, 1)),
                        ("reference",))
        + tuple(chunked_configs([Shape(16, 8, 64)], ("bfloat16",), ops=("lce",), policies=("auto", "compact"),
                                chunkings=("auto", "aspect_ratio:2"), device="cuda-emulated",
                                family="calibrated")),
        Measurement(warmup=0, repeats=1),
    ),
    "quick": Grid(
        "quick", f"every policy x chunking method x fp32/bf16/fp16 at {_QUICK_SHAPE} (the trained head's D and C) "
                 f"for each family ({', '.join(FAMILIES_IN_GRIDS)}), {len(SEEDS)} seeds; lce and torch, the unfused "
                 "reference; lce's CUDA layouts emulated",
        family_grid([(family, _QUICK_SHAPE) for family in FAMILIES_IN_GRIDS], _DTYPES, SEEDS),
        # No separate warm-up: the memory-measured call is each run's first and warms up the timed ones
        # (its peak equalled a second call's in 40 of 40 sampled runs).
        Measurement(warmup=0, repeats=3),
    ),
    "medium": Grid(
        "medium", "CPU 'auto' really chunks (N >= 1024): each family at the trained head's shape, calibrated "
                  f"also at D=1024 and at C=65536 ('auto' chunking, lce on CPU only); {len(SEEDS)} seeds; lce and "
                  "torch, the reference, torch.compile; lce's CUDA layouts emulated",
        family_grid(_MEDIUM_PROBLEMS, _DTYPES, SEEDS, chunkings=_MEDIUM_CHUNKINGS,
                    unchunked=("reference", "compiled"))
        + family_grid(_MEDIUM_WIDE[:1], _DTYPES, SEEDS, ops=("lce",), chunkings=("auto",), unchunked=("reference",))
        + family_grid(_MEDIUM_WIDE[1:], _DTYPES, SEEDS, ops=("lce",), chunkings=("auto",), unchunked=("reference",),
                      emulate_cuda=False),
        Measurement(warmup=0, repeats=3),
    ),
    "full": Grid(
        "full", "publication CPU grid: shapes up to C/D = 256, torch.compile, lce's CUDA layouts emulated",
        _with_unchunked(chunked_configs(_FULL_SHAPES, _DTYPES), ("reference", "compiled"))
        + tuple(chunked_configs(_FULL_SHAPES, _DTYPES, ops=("lce",), device="cuda-emulated")),
        Measurement(warmup=1, repeats=5),
    ),
    "cuda": Grid(
        "cuda", f"one lent GPU (python -m analysis gpu-check): each family at {CUDA_FAMILY_SHAPE}, every dtype; "
                f"the LLM heads {' and '.join(map(str, CUDA_HEADLINE_SHAPES))} in bf16; TF32 allowed; "
                f"{len(CUDA_SEEDS)} seeds; lce, torch (where present), the reference, Liger and CCE (when installed)",
        _cuda_configs(),
        Measurement(warmup=1, repeats=3, threads=0, parallel=False),
    ),
}


def get_grid(name: str) -> Grid:
    """The grid called ``name``; ``ValueError`` listing the known names otherwise."""
    if name not in GRIDS:
        raise ValueError(f"grid must be one of {sorted(GRIDS)}, got {name!r}")
    return GRIDS[name]


# ---- python -m analysis grids --------------------------------------------------------------------------------

DESCRIPTION = "Measures nothing."


def add_arguments(parser) -> None:
    """No options."""


def run(args) -> None:
    for grid in GRIDS.values():
        print(f"{grid.name:<6} {len(grid.configs):>5} runs  {grid.description}")
