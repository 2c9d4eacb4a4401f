"""What the batch-invariance contract costs on this CPU (issue 51): one forward and backward of lce with
``batch_invariant=False`` (chunks sized from N by "auto") and ``True`` (fixed rows per chunk, the last one padded),
timed in interleaved rounds so that both arms see the same machine state.

Problems (:data:`COST_PROBLEMS`): the bench shape (4096 x 512 x 32768, a whole number of any power-of-two chunk),
the same head at 4000 rows (the last chunk padded), and 300 rows (fewer than one fixed chunk: the padding is most of
the call). Ops: the loss (reduction "mean", as training calls it) and the per-token log-probabilities with their
entropy (what RL calls), in fp32 and bf16. Per (problem, op, dtype, arm) one row of kind ``invariance_cost``: the
median of the rounds' times, every round's time, the plan's rows per chunk, loop rows and chunks, its predicted peak
and time (:mod:`lce.decide.time_model`), and provenance (CPU model, how it runs bf16 GEMMs). Where an arm's plan is the
same as the other's (the loss's default is invariant already there) both arms are still timed: their ratio is the
timing noise. Results append as each problem finishes; a rerun measures only what is missing.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from pathlib import Path

import torch

import lce
from analysis.core.problem import BENCH_SHAPE, Shape
from analysis.core.provenance import provenance
from analysis.core.results_io import INVARIANCE_COST, append_rows, read_table, set_aside
from lce.decide.time_model import estimated_seconds
from lce.logprobs import log_probs_plan

__all__ = ["COST_PROBLEMS", "OPS", "DTYPES", "ARMS", "INVARIANCE_COST_FILE", "measure_problem", "record"]

INVARIANCE_COST_FILE = "invariance_cost.csv"
COST_PROBLEMS: tuple[Shape, ...] = (BENCH_SHAPE, Shape(4000, BENCH_SHAPE.D, BENCH_SHAPE.C),
                                    Shape(300, BENCH_SHAPE.D, BENCH_SHAPE.C))
OPS: tuple[str, ...] = ("loss", "log_probs")
DTYPES: tuple[str, ...] = ("float32", "bfloat16")
ARMS: dict[str, bool] = {"follows N": False, "batch-invariant": True}
ROUNDS = 5


def _inputs(shape: Shape, dtype: torch.dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(shape.N, shape.D, generator=g).to(dtype)
    w = (torch.randn(shape.C, shape.D, generator=g) / shape.D**0.5).to(dtype)
    target = torch.randint(0, shape.C, (shape.N,), generator=g)
    return x, w, target


def _step(op: str, x, w, target, options):
    """One forward and backward; the gradients of both the input and the weight."""
    xg, wg = x.detach().requires_grad_(), w.detach().requires_grad_()
    if op == "loss":
        lce.linear_cross_entropy(xg, wg, target, options=options).backward()
    else:
        log_probs, entropy = lce.linear_log_probs(xg, wg, target, temperature=0.8, return_entropy=True,
                                                  options=options)
        (log_probs.sum() + 0.01 * entropy.sum()).backward()


def _plan(op: str, x, w, options):
    xg, wg = x.detach().requires_grad_(), w.detach().requires_grad_()
    if op == "loss":
        return lce.plan(xg, wg, options=options)
    return log_probs_plan(xg, wg, return_entropy=True, options=options)


def measure_problem(shape: Shape, op: str, dtype_text: str, rounds: int = ROUNDS) -> list[dict]:
    """Both arms of one (shape, op, dtype), timed in ``rounds`` interleaved rounds after one warm-up each."""
    dtype = getattr(torch, dtype_text)
    x, w, target = _inputs(shape, dtype)
    options = {arm: lce.LinearCrossEntropyOptions(batch_invariant=value) for arm, value in ARMS.items()}
    for arm in ARMS:  # warm-up: first-call allocations and the CPU probe
        _step(op, x, w, target, options[arm])
    samples: dict[str, list[float]] = {arm: [] for arm in ARMS}
    for round_index in range(rounds):
        order = list(ARMS) if round_index % 2 == 0 else list(reversed(ARMS))
        for arm in order:
            begin = time.perf_counter()
            _step(op, x, w, target, options[arm])
            samples[arm].append(time.perf_counter() - begin)
    rows = []
    for arm, value in ARMS.items():
        plan = _plan(op, x, w, options[arm])
        rows.append({"kind": INVARIANCE_COST.name, "op": op, "dtype": dtype_text, "N": shape.N, "D": shape.D,
                     "C": shape.C, "arm": arm, "batch_invariant": plan.batch_invariant,
                     "batch_chunk_size": plan.batch_chunk_size, "loop_rows": plan.loop_rows,
                     "num_chunks": plan.num_chunks, "time_s": statistics.median(samples[arm]),
                     "time_samples": " ".join(f"{t:.4f}" for t in samples[arm]),
                     "predicted_time_s": estimated_seconds(plan), "peak_bytes": plan.peak_extra_bytes,
                     "rounds": rounds, **provenance("cpu")})
        if plan.batch_invariant != value:
            raise RuntimeError(f"{op} {dtype_text} {shape}: the {arm!r} arm planned batch_invariant="
                               f"{plan.batch_invariant} ({plan.notes})")
    return rows


def _done(path: Path) -> set[tuple]:
    if not path.exists():
        return set()
    table = read_table(path)
    return {(int(r.N), r.op, r.dtype) for r in table.itertuples()}


def record(folder: Path, *, problems: Sequence[Shape] = COST_PROBLEMS, ops: Sequence[str] = OPS,
           dtypes: Sequence[str] = DTYPES, rounds: int = ROUNDS, restart: bool = False,
           progress: bool = True) -> tuple[Path, float]:
    """Measure every (problem, op, dtype) not yet in ``folder``/invariance_cost.csv and append its rows."""
    from tqdm import tqdm

    path = folder / INVARIANCE_COST_FILE
    if restart:
        set_aside(path)
    done = _done(path)
    cases = [(shape, op, dtype) for shape in problems for op in ops for dtype in dtypes
             if (shape.N, op, dtype) not in done]
    begin = time.perf_counter()
    bar = tqdm(cases, desc="invariance-cost", unit="case", disable=not progress)
    for shape, op, dtype in bar:
        bar.set_postfix_str(f"{op} {dtype} {shape}")
        append_rows(path, measure_problem(shape, op, dtype, rounds))
    return path, time.perf_counter() - begin


DESCRIPTION = ("The time cost of lce's batch-invariance contract on this CPU: one forward and backward with "
               "batch_invariant False and True in interleaved rounds, the loss and the per-token log-probabilities, "
               "fp32 and bf16, at the bench shape, at 4000 rows (a padded last chunk) and at 300 rows "
               f"({INVARIANCE_COST_FILE}, resumable; about 10 minutes on 2 cores).")


def add_arguments(parser) -> None:
    from analysis.core.arguments import progress_option, results_option

    parser.add_argument("--rounds", type=int, default=ROUNDS, help=f"timed rounds per arm (default {ROUNDS})")
    parser.add_argument("--quick", action="store_true", help="300 rows only, 2 rounds (a smoke run)")
    parser.add_argument("--restart", action="store_true", help="set an earlier file aside instead of resuming it")
    results_option(parser)
    progress_option(parser)


def run(args) -> None:
    from analysis.core.arguments import print_study

    settings = dict(problems=COST_PROBLEMS[-1:], rounds=2) if args.quick else dict(rounds=args.rounds)
    print_study(*record(args.results, restart=args.restart, progress=not args.no_progress, **settings))
