"""fp16 gradients under a loss scale: how many entries each implementation loses to fp16's subnormal range, and
its error in floors, before and after :mod:`lce.passes.headroom` (issue 31).

A loss scale (``torch.amp.GradScaler``, the Hugging Face Trainer's ``fp16=True``) multiplies the loss by ``S`` so
that gradient entries below fp16's normal range (6.1e-5) are lifted into it. An entry is *lost* when the exact
gradient times ``S`` is a normal fp16 number but the returned (scaled) gradient is zero or subnormal there.

Inputs: the ``calibrated`` family (:mod:`analysis.core.families`: a Zipfian class prior in the bias, so most
classes are rare and their weight-gradient entries are about ``p / N``), fp16, ``reduction="mean"``, at
:data:`SHAPES` (N up to 16384, C up to 131072) and the scales :data:`SCALES` (2^12 to 2^16, GradScaler's
default initial scale). The backward starts from ``S`` times the loss taken in fp32 (as GradScaler's product of a
0-dim loss and its fp32 scale), so an fp16 loss receives ``S`` rounded to fp16 (inf at 2^16).

Contenders (:data:`LCE_ARMS`, :func:`contenders`):

* ``unfused autocast``: the unfused op as fp16 autocast runs it, the baseline the issue names: logits from an
  fp16 GEMM (fp16 operands, fp32 accumulation, rounded to fp16), ``cross_entropy`` in fp32, its gradient times
  ``S / N`` rounded to fp16, then the two backward GEMMs the same way (:func:`autocast_gradients`, a row-chunked
  restatement so that the (N, C) logits need not exist; ``tests/analysis/test_loss_scale_study.py`` checks it against
  ``torch.autocast``);
* ``lce <policy> <layout> [acc=...]``: lce's default options, each explicit policy with fp32 accumulation and
  one with the default ``acc_dtype`` (:data:`LCE_ARMS`), on the CPU and the (emulated) CUDA layouts, with
  ``loss_dtype=torch.float32`` (the incoming gradient carries ``S``), *before* the headroom
  (:func:`lce.testing.without_headroom`: lce's arithmetic at 8376aef, bit for bit) and *after* it;
* ``torch default``: torch 2.13's own op with its default options (fp16 loss).

Each forward runs once per (problem, contender), lce contenders whose plans compute the same numbers sharing
one (:func:`analysis.studies.peers.plan_arithmetic`: "auto" is one of the explicit policies, compact with fp32
accumulation runs balanced's layout on CPU); lce's and torch's scalar reductions form their gradients in
forward, so every scale is one more backward of the same graph. Rows (kind ``loss_scale``, one per contender,
scale and gradient): the eligible entries (exact times ``S`` a normal fp16 number), the lost ones, the Frobenius
error in floors of fp16 (against the exact gradient times ``S``; empty when the gradient is not finite), the same
over the rows of the classes no row of the batch targets (``untargeted_floors``, weight and bias: the rare
classes, whose entries a loss scale is for) and whether it is finite. The study writes each problem's rows as it
finishes and resumes where it stopped.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pandas as pd
import torch
import torch.nn.functional as F

import lce
from analysis.core.families import draw
from analysis.core.fp64 import reference_outputs
from analysis.core.inputs import Inputs, rounded_inputs
from analysis.core.metrics import in_floors, rel_fro, rounding_floor
from analysis.core.problem import Shape
from analysis.core.provenance import provenance
from analysis.core.results_io import LOSS_SCALE, append_rows, read_table, set_aside, write_csv_atomically
from analysis.studies.peers import plan_arithmetic
from lce.planning.options import dtype_name
from lce.testing import emulate_device_kind, without_headroom

__all__ = ["SHAPES", "SEEDS", "SCALES", "LCE_ARMS", "LOSS_SCALE_FILE", "GRADIENTS", "Contender", "contenders",
           "autocast_gradients", "lost_entries", "measure_problem", "record"]

SHAPES: tuple[Shape, ...] = (Shape(4096, 128, 32768), Shape(16384, 128, 32768), Shape(16384, 128, 131072))
"""The problems: N up to 16384 and C up to 131072 at D=128 (one forward of the largest costs about 40 s of these
2 cores per contender)."""
SEEDS: dict[Shape, tuple[int, ...]] = {SHAPES[0]: (0, 1, 2), SHAPES[1]: (0, 1), SHAPES[2]: (0,)}
"""Seeds per problem: three at the smallest, two and one where a problem costs a quarter and half an hour here (a
limit the notebook states)."""
SCALES: tuple[float, ...] = (2.0 ** 12, 2.0 ** 14, 2.0 ** 16)
FAMILY = "calibrated"
LOSS_SCALE_FILE = "loss_scale.csv.gz"
GRADIENTS: tuple[str, ...] = ("input", "weight", "bias")
TINY = torch.finfo(torch.float16).tiny
REFERENCE_BLOCK = 2 ** 26
"""Logit entries per row chunk of :func:`autocast_gradients` (256 MiB of fp32)."""

LCE_ARMS: tuple[tuple[str, str, str], ...] = tuple(
    (layout, policy, acc) for layout in ("cpu", "cuda")
    for policy, acc in (("auto", "default"), ("accurate", "float32"), ("balanced", "float32"),
                        ("compact", "float32"), ("compact", "default")))
"""lce's (layout, policy, ``acc_dtype``) contenders: the default options ("auto"), each policy with fp32
accumulation, and an explicit policy with the default ``acc_dtype`` (the input dtype), where every policy computes
the same numbers (compact stands for the three)."""


@dataclasses.dataclass(frozen=True)
class Contender:
    """One implementation: ``op`` "unfused", "lce" or "torch"; for lce its layout, policy, ``acc_dtype`` ("default"
    or "float32") and whether it runs ``before`` or ``after`` the headroom."""

    op: str
    layout: str = ""
    policy: str = ""
    acc_dtype: str = ""
    headroom: str = ""

    @property
    def label(self) -> str:
        if self.op != "lce":
            return {"unfused": "unfused autocast", "torch": "torch default"}[self.op]
        acc = "" if self.policy == "auto" else " acc=" + ("fp32" if self.acc_dtype == "float32" else "fp16")
        return f"lce {self.policy} {self.layout}{acc} {self.headroom}"

    def options(self) -> lce.LinearCrossEntropyOptions:
        acc = torch.float32 if self.acc_dtype == "float32" else None
        return lce.LinearCrossEntropyOptions(acc_policy=self.policy, acc_dtype=acc, allow_retain_graph=True)

    @contextlib.contextmanager
    def context(self) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            if self.layout:
                stack.enter_context(emulate_device_kind(self.layout))
            if self.headroom == "before":
                stack.enter_context(without_headroom())
            yield


def contenders(arms: Sequence[tuple[str, str, str]] = LCE_ARMS, torch_op: bool = True) -> list[Contender]:
    """The unfused autocast baseline, lce's ``arms`` before and after the headroom, and torch's op (where this
    torch has one: 2.13 and later)."""
    out = [Contender("unfused")]
    for layout, policy, acc in arms:
        out.extend(Contender("lce", layout, policy, acc, when) for when in ("before", "after"))
    if torch_op and hasattr(F, "linear_cross_entropy"):
        out.append(Contender("torch"))
    return out


def autocast_gradients(inputs: Inputs, scales: Sequence[float],
                       block: int = REFERENCE_BLOCK) -> dict[float, tuple[torch.Tensor, ...]]:
    """The unfused op's fp16 gradients (input, weight, bias) as fp16 autocast computes them, per loss scale, row
    chunk by row chunk: each GEMM takes fp16 operands, accumulates in fp32 and rounds its result to fp16 once
    (the weight and bias gradients sum every row in fp32 before their one rounding), and ``cross_entropy``'s
    gradient, in fp32, is rounded to fp16 after the loss scale and the mean's ``1 / N`` multiply it."""
    x, w = inputs.input.detach(), inputs.weight.detach()
    n, c = x.shape[0], w.shape[0]
    wide_w = w.float()
    wide_b = inputs.bias.detach().float() if inputs.bias is not None else torch.zeros(c)
    grad_x = {s: torch.empty_like(x) for s in scales}
    grad_w = {s: torch.zeros(w.shape) for s in scales}
    grad_b = {s: torch.zeros(c) for s in scales}
    rows = max(1, block // c)
    for start in range(0, n, rows):
        chunk = x[start:start + rows].float()
        p = torch.softmax(torch.addmm(wide_b, chunk, wide_w.T).half().float(), dim=1)
        p[torch.arange(len(chunk)), inputs.target[start:start + rows]] -= 1.0
        for s in scales:
            dz = (p * (s / n)).half().float()
            grad_x[s][start:start + rows] = (dz @ wide_w).half()
            grad_w[s].addmm_(dz.T, chunk)
            grad_b[s] += dz.sum(0)
    return {s: (grad_x[s], grad_w[s].half(), grad_b[s].half()) for s in scales}


def _plan(contender: Contender, inputs: Inputs) -> lce.Plan | None:
    if contender.op != "lce":
        return None
    with contender.context():
        return lce.plan(inputs.input, inputs.weight, options=contender.options(), linear_bias=inputs.bias,
                        loss_dtype=torch.float32)


def _chunked_gradients(contender: Contender, inputs: Inputs,
                       scales: Sequence[float]) -> dict[float, tuple[torch.Tensor, ...]]:
    """One forward of lce or torch's op, then one backward per scale from ``S`` times the loss in fp32."""
    arguments = dict(linear_bias=inputs.bias, reduction="mean")
    with contender.context():
        if contender.op == "lce":
            loss = lce.linear_cross_entropy(inputs.input, inputs.weight, inputs.target, options=contender.options(),
                                            loss_dtype=torch.float32, **arguments)
        else:
            loss = F.linear_cross_entropy(inputs.input, inputs.weight, inputs.target, **arguments)
        out = {}
        for i, s in enumerate(scales):
            out[s] = torch.autograd.grad(loss.float() * s, inputs.leaves(), retain_graph=i + 1 < len(scales))
    return out


def lost_entries(grad: torch.Tensor, exact_scaled: torch.Tensor) -> tuple[int, int]:
    """(eligible, lost): entries where ``exact_scaled`` is a normal fp16 number, and those among them where
    ``grad`` is zero or subnormal."""
    eligible = exact_scaled.abs() >= TINY
    lost = eligible & (grad.double().abs() < TINY)
    return int(eligible.sum()), int(lost.sum())


def _floors(grad: torch.Tensor, exact_scaled: torch.Tensor) -> float:
    return in_floors(rel_fro(grad, exact_scaled), rounding_floor(exact_scaled, torch.float16))


def _rows(grads: tuple[torch.Tensor, ...], exact: tuple[torch.Tensor, ...], scale: float,
          untargeted: torch.Tensor) -> list[dict]:
    rows = []
    for name, grad, truth in zip(GRADIENTS, grads, exact, strict=True):
        scaled = truth * scale
        eligible, lost = lost_entries(grad, scaled)
        finite = bool(torch.isfinite(grad).all())
        floors = _floors(grad, scaled) if finite else math.nan
        rare = _floors(grad[untargeted], scaled[untargeted]) if finite and name != "input" else math.nan
        rows.append({"gradient": name, "eligible": eligible, "lost": lost,
                     "lost_fraction": lost / eligible if eligible else 0.0, "floors": floors,
                     "untargeted_floors": rare, "finite": finite})
    return rows


def measure_problem(shape: Shape, seed: int, runs: Sequence[Contender], scales: Sequence[float] = SCALES,
                    on_contender=None) -> pd.DataFrame:
    """Every contender's rows at one problem (see the module docstring)."""
    inputs = rounded_inputs(draw(FAMILY, shape, seed=seed, bias=True), torch.float16)
    exact_outputs = reference_outputs(inputs)
    exact = (exact_outputs.grad_input, exact_outputs.grad_weight, exact_outputs.grad_bias)
    untargeted = torch.bincount(inputs.target, minlength=shape.C) == 0
    rows = []
    done: dict[tuple, dict] = {}  # lce contenders whose plans compute the same numbers share one run
    for contender in runs:
        plan = _plan(contender, inputs)
        key = (contender.op, contender.layout, *plan_arithmetic(plan)) if plan is not None else (contender.op,)
        if key not in done:
            done[key] = (autocast_gradients(inputs, scales) if contender.op == "unfused"
                         else _chunked_gradients(contender, inputs, scales))
        grads = done[key]
        common = {"impl": contender.label, "op": contender.op, "layout": contender.layout,
                  "policy": contender.policy, "acc_dtype": contender.acc_dtype,
                  "headroom": contender.headroom,
                  "resolved_policy": plan.acc_policy if plan else "",
                  "resolved_acc_dtype": dtype_name(plan.acc_dtype) if plan else "",
                  "num_chunks": plan.num_chunks if plan else None, "family": FAMILY, "dtype": "float16",
                  "N": shape.N, "D": shape.D, "C": shape.C, "seed": seed}
        for s in scales:
            for row in _rows(grads[s], exact, s, untargeted):
                rows.append({**common, "scale_log2": int(math.log2(s)), **row})
        if on_contender is not None:
            on_contender()
    return pd.DataFrame(rows)


def _problems(shapes: Sequence[Shape], seeds: dict[Shape, Sequence[int]] | None) -> list[tuple[Shape, int]]:
    return [(shape, seed) for shape in shapes for seed in (seeds or SEEDS).get(shape, (0,))]


def _done(path: Path) -> set[tuple[int, int, int, int]]:
    if not path.exists():
        return set()
    table = read_table(path)
    return {(int(r.N), int(r.D), int(r.C), int(r.seed)) for r in table.itertuples()}


def record(folder: Path, file_name: str = LOSS_SCALE_FILE, *, shapes: Sequence[Shape] = SHAPES,
           seeds: dict[Shape, Sequence[int]] | None = None, runs: Sequence[Contender] | None = None,
           scales: Sequence[float] = SCALES, restart: bool = False, progress: bool = True) -> tuple[Path, float]:
    """Measure every (shape, seed) problem not yet in ``folder/<file_name>`` and append its rows with their wall
    time and provenance as it finishes (``restart``: move an earlier file to ``.previous`` first). Returns the
    path and the wall time in seconds."""
    from tqdm import tqdm

    path = folder / file_name
    if restart:
        set_aside(path)
    runs = contenders() if runs is None else list(runs)
    done = _done(path)
    pending = [(shape, seed) for shape, seed in _problems(shapes, seeds)
               if (shape.N, shape.D, shape.C, seed) not in done]
    weights = {shape: shape.N * shape.C for shape, _ in pending}
    total = sum(weights[shape] for shape, _ in pending) * len(runs)
    started = time.perf_counter()
    with tqdm(total=total, desc="loss-scale", unit="logit", unit_scale=True, disable=not progress,
              dynamic_ncols=True) as bar:
        for shape, seed in pending:
            bar.set_postfix_str(f"{shape} seed {seed}")
            wall, cpu = time.perf_counter(), time.process_time()
            advance = functools.partial(bar.update, weights[shape])
            table = measure_problem(shape, seed, runs, scales, on_contender=advance)
            table = table.assign(wall_s=time.perf_counter() - wall, cpu_s=time.process_time() - cpu,
                                 **provenance("cpu"))
            append_rows(path, LOSS_SCALE.rows(table))
    return path, time.perf_counter() - started


def remeasure(folder: Path, labels: Sequence[str], file_name: str = LOSS_SCALE_FILE, *,
              scales: Sequence[float] = SCALES, progress: bool = True) -> tuple[Path, float]:
    """Measure the contenders named by ``labels`` (:attr:`Contender.label`) again at every problem of
    ``folder/<file_name>`` and replace their rows, as each problem finishes (for an arm whose plan changed, such
    as "auto" after a change to the auto table). Returns the path and the wall time in seconds."""
    from tqdm import tqdm

    path = folder / file_name
    known = {contender.label: contender for contender in contenders()}
    unknown = [label for label in labels if label not in known]
    if unknown:
        raise ValueError(f"labels must name contenders of the study ({sorted(known)}), got {unknown}")
    runs = [known[label] for label in labels]
    problems = sorted(_done(path))
    started = time.perf_counter()
    for n, d, c, seed in tqdm(problems, desc="loss-scale remeasure", disable=not progress, dynamic_ncols=True):
        wall, cpu = time.perf_counter(), time.process_time()
        fresh = measure_problem(Shape(n, d, c), seed, runs, scales)
        fresh = fresh.assign(wall_s=time.perf_counter() - wall, cpu_s=time.process_time() - cpu,
                             **provenance("cpu"))
        table = read_table(path)
        here = (table["N"] == n) & (table["D"] == d) & (table["C"] == c) & (table["seed"] == seed)
        kept = table[~(here & table["impl"].isin(labels))]
        rows = pd.concat([kept, pd.DataFrame(LOSS_SCALE.rows(fresh))], ignore_index=True)
        write_csv_atomically(path, LOSS_SCALE.rows(rows), LOSS_SCALE.columns)
    return path, time.perf_counter() - started


# ---- python -m analysis loss-scale ---------------------------------------------------------------------------

DESCRIPTION = ("fp16 gradients under loss scales of 2^12 to 2^16 on the calibrated family: lost entries and floors "
               "of lce (before and after lce.passes.headroom) per policy and layout, torch's op and the unfused op "
               "as fp16 "
               "autocast runs it; appends to loss_scale.csv.gz problem by problem and resumes. About 35 CPU-minutes.")


def add_arguments(parser) -> None:
    from analysis.core.arguments import argument, progress_option, results_option
    from analysis.core.problem import parse_shape

    def shapes(text: str) -> tuple[Shape, ...]:
        return tuple(parse_shape(part) for part in text.split(",") if part.strip())

    parser.add_argument("--shapes", type=argument(shapes), default=SHAPES, metavar="NxDxC[,NxDxC]",
                        help="problems (default: " + ",".join(map(str, SHAPES)) + ")")
    parser.add_argument("--seeds", type=int, default=None, metavar="K",
                        help="seeds 0..K-1 at every shape (default: three, one at the largest)")
    parser.add_argument("--file", default=LOSS_SCALE_FILE, metavar="NAME",
                        help=f"results file name in the results folder (default: {LOSS_SCALE_FILE})")
    parser.add_argument("--restart", action="store_true", help="set an earlier file aside instead of resuming it")
    parser.add_argument("--remeasure", action="append", default=[], metavar="LABEL",
                        help="measure this contender again at every recorded problem and replace its rows (for an "
                             "arm whose plan changed, such as 'lce auto cuda after'); repeatable")
    results_option(parser)
    progress_option(parser)


def run(args) -> None:
    from analysis.core.arguments import print_study

    if args.remeasure:
        print_study(*remeasure(args.results, args.remeasure, args.file, progress=not args.no_progress))
        return
    seeds = None if args.seeds is None else {shape: tuple(range(args.seeds)) for shape in args.shapes}
    print_study(*record(args.results, args.file, shapes=args.shapes, seeds=seeds, restart=args.restart,
                        progress=not args.no_progress))
