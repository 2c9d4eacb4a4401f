"""Confident rows: gradient and loss error against the target's lead, from 0 to 40 nats.

When a row's target leads every other class by ``m`` nats, ``1 - p_y`` is
about ``(C - 1) e^-m``: below fp32's epsilon from about 17 nats, below fp64's
from about 37. An implementation that forms ``p_y - 1`` or ``lse - z_y`` as a
difference loses every digit of the target's gradient entry and of the loss
there; lce sums the other classes' share instead (:mod:`lce.passes`), and so
does the fp64 reference (:mod:`analysis.core.fp64`).

Inputs: :func:`analysis.core.families.confident_rows` (every row confident, at
one margin), rounded to bf16 or fp16, several seeds. Contenders
(:data:`CONTENDERS`): lce per policy on the CPU and the (emulated) CUDA
layouts, with the default ``acc_dtype`` and fp32; torch 2.13's native op
("accurate" and "compact", ``acc_dtype`` fp32); the unfused formula in fp32
on the upcast inputs, its gradients rounded back. Each run is one row of a
``margins`` results file (``analysis/results/margins.csv.gz``): the floors of
grad_input and grad_weight (:func:`analysis.core.metrics.report`), the loss in
ulps of the dtype, the realized margin.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd
import torch

from analysis.core.families import confident_rows
from analysis.core.fp64 import reference_outputs
from analysis.core.implementations import ImplSpec
from analysis.core.inputs import Inputs
from analysis.core.metrics import report, ulps
from analysis.core.problem import DTYPES, Shape
from analysis.core.results_io import MARGINS
from analysis.studies.peers import Contender, lce_contenders, record_study, run_contenders

__all__ = ["MARGINS_SHAPE", "MARGIN_VALUES", "SEEDS", "CONTENDERS", "MARGINS_FILE", "confident_inputs",
           "measure", "record"]

MARGINS_SHAPE = Shape(64, 128, 4096)
"""Rows x features x classes (N <= D: the construction needs orthogonal rows)."""
MARGIN_VALUES: tuple[float, ...] = tuple(float(m) for m in range(0, 45, 5))
SEEDS: tuple[int, ...] = (0, 1, 2, 3, 4)
STUDY_DTYPES: tuple[str, ...] = ("bfloat16", "float16")
MARGINS_FILE = "margins.csv.gz"

CONTENDERS: tuple[Contender, ...] = (
    *lce_contenders(("accurate", "balanced", "compact", "auto"), ("cpu", "cuda-emulated"), ("default", "float32")),
    Contender("torch accurate acc=fp32", ImplSpec("torch", "accurate", "auto", "float32")),
    Contender("torch compact acc=fp32", ImplSpec("torch", "compact", "auto", "float32")),
    Contender("unfused fp32", ImplSpec("reference"), upcast=True),
)
"""Every implementation the study runs, by label."""


def confident_inputs(margin: float, shape: Shape, dtype: torch.dtype, seed: int) -> tuple[Inputs, float]:
    """:func:`~analysis.core.families.confident_rows` as the op's inputs ("mean" reduction), and the realized margin."""
    drawn, lead = confident_rows(margin, shape, dtype, seed=seed)
    return Inputs(drawn.x.requires_grad_(True), drawn.weight.requires_grad_(True), None, drawn.target), lead


def measure(shape: Shape = MARGINS_SHAPE, dtypes: Sequence[str] = STUDY_DTYPES,
            margins: Sequence[float] = MARGIN_VALUES, seeds: Sequence[int] = SEEDS,
            contenders: Sequence[Contender] = CONTENDERS) -> pd.DataFrame:
    """One row per (contender, dtype, margin, seed): floors of both gradients, loss ulps, realized margin."""
    rows = []
    for dtype_text in dtypes:
        dtype = DTYPES[dtype_text]
        for margin in margins:
            for seed in seeds:
                inputs, lead = confident_inputs(margin, shape, dtype, seed)
                exact = reference_outputs(inputs)
                results = run_contenders(contenders, inputs)
                for contender in contenders:
                    result = results[contender.label]
                    out = result.outputs
                    rows.append({
                        "impl": contender.label, "op": contender.spec.op, "policy": contender.spec.policy,
                        "layout": contender.layout, "acc_dtype": contender.spec.acc_dtype,
                        "resolved_policy": result.resolved_policy, "resolved_acc_dtype": result.resolved_acc_dtype,
                        "num_chunks": result.num_chunks, "dtype": dtype_text, "N": shape.N, "D": shape.D,
                        "C": shape.C, "seed": seed, "margin": margin, "realized_margin": lead,
                        "grad_input_floors": report(out.grad_input, exact.grad_input, dtype).fro_in_floors,
                        "grad_weight_floors": report(out.grad_weight, exact.grad_weight, dtype).fro_in_floors,
                        "loss_ulps": ulps(out.loss, exact.loss, dtype),
                    })
    return pd.DataFrame(rows)


def record(folder: Path, **settings) -> tuple[Path, float]:
    """Measure (``settings``: :func:`measure`'s) and write ``folder/margins.csv.gz`` with provenance, an earlier
    one moved to ``.previous``; return the path and the wall time in seconds."""
    return record_study(folder / MARGINS_FILE, MARGINS, measure, **settings)


# ---- python -m analysis margins ------------------------------------------------------------------------------

DESCRIPTION = ("Every row's target leads the other classes by 0, 5, ..., 40 nats (bf16 and fp16, one input per "
               "seed); lce per policy and layout, torch's op and the unfused fp32 formula; writes margins.csv.gz "
               "(the floors of both gradients, the loss in ulps), moving an earlier one to .previous. About 2 "
               "minutes here.")


def margin_values(text: str) -> tuple[float, ...]:
    """``0,20,40`` -> margins in nats, each non-negative."""
    values = tuple(float(part) for part in text.split(",") if part.strip())
    if not values or any(value < 0 for value in values):
        raise ValueError(f"--margins needs non-negative numbers of nats, e.g. 0,20,40; got {text!r}")
    return values


def add_arguments(parser) -> None:
    from analysis.core.arguments import argument, study_options

    study_options(parser, MARGINS_SHAPE, ["bfloat16", "float16"], ", N <= D")
    parser.add_argument("--margins", type=argument(margin_values), default=MARGIN_VALUES, metavar="M[,M]",
                        help="margins in nats (default: 0,5,...,40)")


def run(args) -> None:
    from analysis.core.arguments import print_study

    print_study(*record(args.results, shape=args.shape, dtypes=tuple(args.dtypes), margins=args.margins,
                        seeds=tuple(range(args.seeds))))
