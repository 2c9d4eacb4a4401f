"""Rare classes' weight-gradient rows in fp16 and bf16: error per row, binned by how often the class is a target.

Under a Zipfian prior most of a large vocabulary is never a target in a batch:
such a class's weight-gradient row is ``sum_i p_ic x_i / N``, entries far
below the frequent classes' rows. The Frobenius error of the whole gradient is
dominated by the frequent rows and says little about these; a layout that
rounds the gradient once per chunk ("compact" on CUDA, the fp16 and bf16
"auto" pick there) adds each chunk's tiny contribution to a running sum in the
input dtype, where it can fall below half an ulp of the sum and be lost.

Inputs: the ``calibrated`` family (Zipfian targets sampled from the model's
softmax, :mod:`analysis.core.families`), drawn once per seed in fp32 and rounded to
each dtype. Contenders (:func:`contenders`): lce per policy ("auto" included)
on the CPU and the (emulated) CUDA layouts, ``acc_dtype`` default and fp32,
chunking "auto" and "aspect_ratio:2"; torch 2.13's native op (default
options); the unfused reference in the input dtype. For every run,
:func:`analysis.core.metrics.row_floors` of grad_weight is summarised per bin of
:data:`BINS` (median, 99th percentile, max, and the row count), with the
Frobenius floors of both gradients; each (run, bin) is one row of a
``rare_rows`` results file (``analysis/results/rare_rows.csv.gz``), bin ``all``
for every row together.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd
import torch

from analysis.core.families import draw
from analysis.core.fp64 import reference_outputs
from analysis.core.implementations import ImplSpec
from analysis.core.inputs import rounded_inputs
from analysis.core.metrics import report, row_floors, row_summary
from analysis.core.problem import DTYPES, Shape
from analysis.core.results_io import RARE_ROWS
from analysis.studies.peers import Contender, lce_contenders, record_study, run_contenders

__all__ = ["RARE_ROWS_SHAPE", "BINS", "SEEDS", "RARE_ROWS_FILE", "contenders", "bin_of", "bin_summaries",
           "measure", "record"]

RARE_ROWS_SHAPE = Shape(2048, 256, 16384)
"""The issue's N and D at half its C: the emulated CUDA layouts upcast the weight once per chunk, and
"aspect_ratio:2" makes 2C/D chunks, so their cost grows as C**2 (one seed at C=32768 cost more than
four CPU-minutes here; five seeds at C=16384 fit in about six)."""
SEEDS: tuple[int, ...] = (0, 1, 2, 3, 4)
STUDY_DTYPES: tuple[str, ...] = ("float16", "bfloat16")
RARE_ROWS_FILE = "rare_rows.csv.gz"

BINS: dict[str, tuple[int, int]] = {"never": (0, 0), "1-2": (1, 2), "3-15": (3, 15), "16+": (16, 2**62)}
"""Bin name -> the inclusive range of a class's target count in the batch."""


POLICIES: tuple[str, ...] = ("accurate", "balanced", "compact", "auto")
CHUNKINGS: tuple[str, ...] = ("auto", "aspect_ratio:2")


def contenders(policies: Sequence[str] = POLICIES, chunkings: Sequence[str] = CHUNKINGS) -> list[Contender]:
    """lce per policy, layout, ``acc_dtype`` and chunking; torch's native op with default options; the unfused
    reference in the input dtype."""
    return [*lce_contenders(policies, ("cpu", "cuda-emulated"), ("default", "float32"), chunkings, name_chunking=True),
            Contender("torch default", ImplSpec("torch", "auto", "auto")),
            Contender("unfused", ImplSpec("reference"))]


def bin_of(counts: torch.Tensor) -> list[str]:
    """The :data:`BINS` name of each class's target count."""
    names = []
    for count in counts.tolist():
        names.append(next(name for name, (low, high) in BINS.items() if low <= count <= high))
    return names


def bin_summaries(value: torch.Tensor, exact: torch.Tensor, counts: torch.Tensor,
                  dtype: torch.dtype) -> list[dict[str, object]]:
    """Per bin (and ``all``): rows, and median / p99 / max of :func:`row_floors` of a weight gradient.

    Rows whose exact value is zero (which :func:`row_floors` drops) are left out of their bin too.
    """
    per_row = row_floors(value, exact, dtype)
    counts = counts[torch.linalg.vector_norm(exact.double(), dim=1) > 0]
    names = bin_of(counts)
    summaries = []
    for name in [*BINS, "all"]:
        mask = torch.tensor([name in ("all", row) for row in names], dtype=torch.bool)
        rows = per_row[mask]
        summaries.append({"bin": name, "rows": int(mask.sum()), **row_summary(rows)})
    return summaries


def measure(shape: Shape = RARE_ROWS_SHAPE, dtypes: Sequence[str] = STUDY_DTYPES, seeds: Sequence[int] = SEEDS,
            runs: Sequence[Contender] | None = None, family: str = "calibrated") -> pd.DataFrame:
    """One row per (contender, dtype, seed, bin); see the module docstring."""
    runs = contenders() if runs is None else runs
    rows = []
    for seed in seeds:
        drawn = draw(family, shape, seed=seed, bias=True)  # fp32, shared by both dtypes
        counts = torch.bincount(drawn.target, minlength=shape.C)
        for dtype_text in dtypes:
            dtype = DTYPES[dtype_text]
            inputs = rounded_inputs(drawn, dtype)
            exact = reference_outputs(inputs)
            results = run_contenders(runs, inputs)
            for contender in runs:
                result = results[contender.label]
                out = result.outputs
                weight = report(out.grad_weight, exact.grad_weight, dtype)
                common = {
                    "impl": contender.label, "op": contender.spec.op, "policy": contender.spec.policy,
                    "layout": contender.layout, "acc_dtype": contender.spec.acc_dtype,
                    "chunking": contender.spec.chunking, "resolved_policy": result.resolved_policy,
                    "resolved_acc_dtype": result.resolved_acc_dtype, "num_chunks": result.num_chunks,
                    "dtype": dtype_text, "family": family, "N": shape.N, "D": shape.D, "C": shape.C, "seed": seed,
                    "grad_weight_floors": weight.fro_in_floors, "grad_weight_bias_in_floors": weight.bias_in_floors,
                    "grad_input_floors": report(out.grad_input, exact.grad_input, dtype).fro_in_floors,
                }
                for summary in bin_summaries(out.grad_weight, exact.grad_weight, counts, dtype):
                    rows.append({**common, **summary})
    return pd.DataFrame(rows)


def record(folder: Path, file_name: str = RARE_ROWS_FILE, **settings) -> tuple[Path, float]:
    """Measure (``settings``: :func:`measure`'s) and write ``folder/<file_name>`` with provenance, an earlier
    one moved to ``.previous``; return the path and the wall time in seconds."""
    return record_study(folder / file_name, RARE_ROWS, measure, **settings)


# ---- python -m analysis rare-rows ----------------------------------------------------------------------------

DESCRIPTION = ("Calibrated inputs (Zipfian targets), fp16 and bf16; lce per policy, layout, acc_dtype and "
               "chunking, torch's op and the unfused reference; writes rare_rows.csv.gz (row error median/p99/max per "
               "bin of target count, Frobenius floors), moving an earlier one to .previous. About 6 CPU-minutes.")


def add_arguments(parser) -> None:
    from analysis.core.arguments import argument, names_of, study_options

    study_options(parser, RARE_ROWS_SHAPE, ["float16", "bfloat16"])
    parser.add_argument("--policies", type=argument(names_of(POLICIES)), default=POLICIES, metavar="P[,P]",
                        help=f"lce policies (default: {','.join(POLICIES)})")
    parser.add_argument("--chunkings", type=argument(names_of(CHUNKINGS)), default=CHUNKINGS, metavar="M[,M]",
                        help=f"lce chunking methods (default: {','.join(CHUNKINGS)})")
    parser.add_argument("--file", default="rare_rows.csv.gz", metavar="NAME",
                        help="results file name in the results folder (default: rare_rows.csv.gz; a spot check at "
                             "another shape goes in a file of its own)")


def run(args) -> None:
    from analysis.core.arguments import print_study

    print_study(*record(args.results, args.file, shape=args.shape, dtypes=tuple(args.dtypes),
                        seeds=tuple(range(args.seeds)), runs=contenders(args.policies, args.chunkings)))
