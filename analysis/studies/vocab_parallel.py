"""Vocab-parallel lce (:mod:`lce.distributed`) against one process: error per policy and peak memory per rank.

For each number of ranks (1 = single-process ``lce.linear_cross_entropy`` on the whole weight; 2, 3, 4 = a gloo
group of that many CPU processes, each holding an equal slice of the classes), each policy and input family, every
rank runs one forward + backward under the allocator profiler (its peak extra bytes) and the full weight gradient
is gathered on rank 0, which measures both gradients' floors and the loss's ulps against the fp64 reference. One
row per (ranks, policy, family, dtype, seed), with the largest and the smallest per-rank peak and lce's memory
model of one rank's shard (``lce.plan`` of the shard; the distributed loop adds a row chunk of the input gradient
in fp32 and computes its logits twice, as class tiling does). The ranks share this machine's cores, so wall times
are recorded but say nothing about speed.
"""

from __future__ import annotations

import datetime
import itertools
import tempfile
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
import torch

from analysis.core.inputs import make_inputs
from analysis.core.problem import DTYPES, Shape
from analysis.core.results_io import VOCAB_PARALLEL
from analysis.studies.peers import record_study

__all__ = ["VOCAB_PARALLEL_FILE", "SHAPE", "WORLDS", "POLICIES", "FAMILIES", "SEEDS", "DTYPES_STUDIED", "measure",
           "record"]

VOCAB_PARALLEL_FILE = "vocab_parallel.csv"
SHAPE = Shape(2048, 256, 16384)
WORLDS: tuple[int, ...] = (1, 2, 3, 4)
POLICIES: tuple[str, ...] = ("accurate", "balanced", "compact")
FAMILIES: tuple[str, ...] = ("random", "calibrated")
SEEDS: tuple[int, ...] = (0, 1)
DTYPES_STUDIED: tuple[str, ...] = ("bfloat16", "float16", "float64")


def _shard(classes: int, world: int, rank: int) -> slice:
    from lce.distributed import even_shard_sizes, shard_bounds

    return slice(*shard_bounds(even_shard_sizes(classes, world))[rank])


def _one_call(rank: int, world: int, case: dict) -> dict:
    """Inputs of ``case``, this rank's shard, one forward + backward measured; gradients for the reference."""
    import lce
    from analysis.core.memory import measure_peak
    from lce.distributed import vocab_parallel_linear_cross_entropy

    shape = Shape(*case["shape"])
    inputs = make_inputs(shape, DTYPES[case["dtype"]], family=case["family"], seed=case["seed"], bias=False)
    wide = torch.float32 if DTYPES[case["dtype"]].itemsize == 2 else None  # fp64 keeps its own acc_dtype
    options = lce.LinearCrossEntropyOptions(acc_policy=case["policy"], acc_dtype=wide)
    shard = _shard(shape.C, world, rank)
    x = inputs.input.detach().requires_grad_()
    weight = inputs.weight.detach()[shard].clone().requires_grad_()

    def call():
        if world == 1:
            loss = lce.linear_cross_entropy(x, weight, inputs.target, options=options)
        else:
            loss = vocab_parallel_linear_cross_entropy(x, weight, inputs.target, options=options)
        return (loss.detach(), *torch.autograd.grad(loss, (x, weight)))

    started = datetime.datetime.now()
    (loss, grad_input, grad_weight), memory = measure_peak(call)
    seconds = (datetime.datetime.now() - started).total_seconds()
    planned = lce.plan(x, weight, options=options).peak_extra_bytes
    return dict(loss=loss, grad_input=grad_input, grad_weight=grad_weight, peak=memory.peak_bytes, planned=planned,
                seconds=seconds)


def _worker(rank: int, world: int, rendezvous: str, cases: list[dict], out: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(minutes=5))
    try:
        results = []
        for case in cases:
            result = _one_call(rank, world, case)
            pieces: list[torch.Tensor | None] = [None] * world
            dist.all_gather_object(pieces, result["grad_weight"])
            peaks: list[int | None] = [None] * world
            dist.all_gather_object(peaks, result["peak"])
            if rank == 0:
                results.append({**result, "grad_weight": torch.cat(pieces), "peaks": peaks})
        if rank == 0:
            torch.save(results, Path(out) / "results.pt")
    finally:
        dist.destroy_process_group()


def _run_world(world: int, cases: list[dict]) -> list[dict]:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as folder:
        if world == 1:
            torch.set_num_threads(1)
            results = []
            for case in cases:
                result = _one_call(0, 1, case)
                results.append({**result, "peaks": [result["peak"]]})
            return results
        mp.spawn(_worker, args=(world, f"{folder}/rendezvous", cases, folder), nprocs=world, join=True)
        return torch.load(Path(folder) / "results.pt", weights_only=False)


def _errors(result: dict, exact, dtype: torch.dtype) -> dict[str, float]:
    """Floors of both gradients and the loss's ulps against fp64 (for fp16/bf16 runs: fp64 has no floor to
    measure in; its runs are judged by their difference to one process)."""
    from analysis.core.metrics import report, ulps

    return dict(grad_input_floors=report(result["grad_input"], exact.grad_input, dtype).fro_in_floors,
                grad_weight_floors=report(result["grad_weight"], exact.grad_weight, dtype).fro_in_floors,
                loss_ulps=ulps(result["loss"], exact.loss, dtype))


def _relative(value: torch.Tensor, single: torch.Tensor) -> float:
    """Largest difference to single-process lce, relative to its largest magnitude."""
    scale = float(single.double().abs().max())
    return float((value.double() - single.double()).abs().max()) / (scale or 1.0)


def measure(shape: Shape = SHAPE, worlds: Sequence[int] = WORLDS, policies: Sequence[str] = POLICIES,
            families: Sequence[str] = FAMILIES, dtypes: Sequence[str] = DTYPES_STUDIED, seeds: Sequence[int] = SEEDS,
            progress: bool = True) -> pd.DataFrame:
    """One row per (ranks, policy, family, dtype, seed): floors and ulps against fp64, peaks per rank."""
    from tqdm import tqdm

    from analysis.core.fp64 import reference_outputs

    cases = [dict(shape=(shape.N, shape.D, shape.C), policy=p, family=f, dtype=d, seed=s)
             for f, d, s, p in itertools.product(families, dtypes, seeds, policies)]
    threads = torch.get_num_threads()
    by_world = {}
    for world in tqdm(worlds, desc="ranks", disable=not progress):
        by_world[world] = _run_world(world, cases)
    torch.set_num_threads(threads)
    rows = []
    references: dict[tuple, object] = {}
    for world, results in by_world.items():
        for case, result in zip(cases, results, strict=True):
            key = (case["family"], case["dtype"], case["seed"])
            if key not in references:
                inputs = make_inputs(shape, DTYPES[case["dtype"]], family=case["family"], seed=case["seed"],
                                     bias=False)
                references[key] = reference_outputs(inputs)
            exact, dtype = references[key], DTYPES[case["dtype"]]
            single = by_world[min(by_world)][cases.index(case)] if min(by_world) == 1 else None
            rows.append(dict(
                ranks=world, impl="lce" if world == 1 else "lce.distributed", policy=case["policy"],
                family=case["family"], dtype=case["dtype"], N=shape.N, D=shape.D, C=shape.C, seed=case["seed"],
                **(_errors(result, exact, dtype) if dtype.itemsize == 2 else {}),
                peak_bytes_max=max(result["peaks"]), peak_bytes_min=min(result["peaks"]),
                planned_shard_peak_bytes=result["planned"], rank0_seconds=result["seconds"],
                **{f"{name}_diff_to_single": _relative(result[name], single[name]) if single else None
                   for name in ("loss", "grad_input", "grad_weight")}))
    return pd.DataFrame(rows)


def record(folder: Path, **settings) -> tuple[Path, float]:
    """Measure (``settings``: :func:`measure`'s) and write ``folder/vocab_parallel.csv`` with provenance."""
    return record_study(folder / VOCAB_PARALLEL_FILE, VOCAB_PARALLEL, measure, **settings)


# ---- python -m analysis vocab-parallel -----------------------------------------------------------------------

DESCRIPTION = ("lce.distributed over gloo with the classes split evenly across 2, 3 and 4 processes, against "
               "single-process lce (1), per policy, random and calibrated inputs at 2048x256x16384 bf16: floors "
               "against fp64 and the peak extra memory of every rank (vocab_parallel.csv). About 10 minutes here.")


def add_arguments(parser) -> None:
    from analysis.core.arguments import results_option

    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 3, 4], help="process counts (1: one process)")
    parser.add_argument("--seeds", type=int, default=2, help="seeds per problem (default 2)")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    results_option(parser)


def run(args) -> None:
    from analysis.core.arguments import print_study

    print_study(*record(args.results, worlds=tuple(args.ranks), seeds=tuple(range(args.seeds)),
                        progress=not args.quiet))
