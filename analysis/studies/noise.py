"""Numerical error against sampling noise: can a policy's gradient error be told apart from SGD's own noise?

A minibatch gradient already differs from the full-data gradient by sampling noise. For the mean
loss over N rows, the weight gradient is ``G = mean_i g_i`` with per-example gradients
``g_i = r_i x_i^T`` (``r_i`` = softmax - onehot of row i), so its standard error is

* ``weight_noise = sqrt(tr Cov(g_i) / N)`` (Frobenius; ``tr Cov`` from ``sum ||g_i||^2 - N ||G||^2``,
  with ``||g_i||^2 = ||r_i||^2 ||x_i||^2``), the typical distance between the gradients of two
  independent batches of N rows divided by sqrt(2);
* ``weight_noise_along = std_i <g_i, u> / sqrt(N)``, the same along the exact gradient's direction
  ``u = G / ||G||``.

A policy's numerical error ``E = G_policy - G`` is compared with them twice:

* ``weight_error_over_noise = ||E|| / weight_noise``: below 1 the error hides in the noise of one step;
* ``weight_bias_over_noise = |<E, u>| / weight_noise_along``: a *systematic* error does not average out
  as steps go by while the noise does (as 1/sqrt(steps)), so the error becomes visible after about
  ``steps_to_matter = weight_bias_over_noise ** -2`` steps of averaging (Adam's moment windows are
  10-20 steps; a training run is 1e4-1e6).

The input gradient's rows are per-example (``dx_i = r_i W / N``); what training sees of them is
their sum through the layers below, in which independent per-row errors and the per-row spread
both grow as sqrt(N). ``input_error_over_noise = ||E_x|| / ||dX - mean row||`` compares the two
(an approximation that treats the layers below as the identity; stated in notebook 06).

``floor_over_noise`` is the ratio of a perfect answer rounded once to the output dtype: no policy
can go below it.

The contenders are lce's policies with ``acc_dtype=float32`` (what "auto" resolves to; an explicit
policy would keep the input dtype) on the **CUDA** layouts (emulated on CPU tensors, or a real GPU
with ``device="cuda"``) at chunk counts :data:`CHUNK_COUNTS` (explicit chunk sizes), and the unfused
computation in the input dtype. :func:`chunk_rules` gives the chunk counts of the rules that pick
chunk sizes: lce's "auto", torch 2.13's CUDA default (compact, ``aspect_ratio:2``), and the rule of
torch's later pull request 187838 (compact, factor-1 aspect ratio capped at ``N*C/(4*D)`` rows).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import pandas as pd
import torch

import lce
from analysis.core.families import draw
from analysis.core.fp64 import reference_outputs, residual_blocks
from analysis.core.implementations import ImplSpec
from analysis.core.inputs import Inputs, Outputs, rounded_inputs
from analysis.core.metrics import report, rounding_floor
from analysis.core.problem import DTYPES, Shape
from analysis.core.results_io import NOISE
from analysis.studies.peers import Contender, Result, record_study, run_contenders
from lce.planning.plan import aspect_ratio_chunk_size
from lce.testing import emulate_device_kind

__all__ = ["NOISE_SHAPE", "FAMILIES", "STUDY_DTYPES", "POLICIES", "CHUNK_COUNTS", "SEEDS", "NOISE_FILE",
           "SamplingNoise", "sampling_noise", "ExactBatch", "exact_batch", "contender_rows", "contenders",
           "chunk_rules", "measure_inputs", "measure", "record",
           "refresh_auto_cpu", "study_rows"]

NOISE_SHAPE = Shape(1024, 128, 16384)
"""The trained model's head (D=128, C=16384) at half its dump's rows, so seeds draw distinct row samples."""
FAMILIES: tuple[str, ...] = ("random", "calibrated", "trained:early", "trained:final")
STUDY_DTYPES: tuple[str, ...] = ("bfloat16", "float16", "float32")
POLICIES: tuple[str, ...] = ("accurate", "balanced", "compact")
CHUNK_COUNTS: tuple[int, ...] = (1, 4, 16, 64, 128, 256)
SEEDS: tuple[int, ...] = (0, 1, 2, 3, 4)
NOISE_FILE = "noise.csv"
AUTO_CPU = "lce auto cpu"
"""The label of the CPU table's "auto" pick (its own chunking) in a CPU run."""


@dataclasses.dataclass(frozen=True)
class SamplingNoise:
    """The sampling noise of one batch's exact gradients (see the module docstring)."""

    weight: float
    weight_along: float
    input: float


def sampling_noise(exact_inputs: Inputs, exact: Outputs) -> SamplingNoise:
    """Sampling noise of the mean-reduced, unweighted loss of ``exact_inputs`` (fp64) with exact gradients ``exact``."""
    if exact_inputs.dtype != torch.float64:
        raise ValueError(f"sampling_noise needs the fp64 inputs, got {exact_inputs.dtype}")
    if (exact_inputs.reduction != "mean" or exact_inputs.class_weight is not None or exact_inputs.label_smoothing
            or bool((exact_inputs.target == exact_inputs.ignore_index).any())):
        raise ValueError("sampling_noise needs reduction='mean' without class weights, ignored rows or smoothing")
    x, w = exact_inputs.input.detach(), exact_inputs.weight.detach()
    b = None if exact_inputs.bias is None else exact_inputs.bias.detach()
    n = x.shape[0]
    gradient = exact.grad_weight.double()
    direction = gradient / torch.linalg.vector_norm(gradient)
    squared_norms = torch.zeros((), dtype=torch.float64, device=x.device)
    along = []
    for block, residual, _ in residual_blocks(x, w, b, exact_inputs.target):
        rows = x[block]
        squared_norms += (residual.square().sum(1) * rows.square().sum(1)).sum()
        along.append((residual * (rows @ direction.T)).sum(1))
    spread = (squared_norms - n * gradient.square().sum()).clamp_min(0.0) / (n - 1)
    grad_input = exact.grad_input.double()
    return SamplingNoise(weight=math.sqrt(spread.item() / n),
                         weight_along=(torch.cat(along).std() / math.sqrt(n)).item(),
                         input=torch.linalg.vector_norm(grad_input - grad_input.mean(0)).item())


def contenders(device: str, policies: Sequence[str] = POLICIES, chunk_counts: Sequence[int] = CHUNK_COUNTS,
               num_rows: int = NOISE_SHAPE.N) -> list[Contender]:
    """lce per policy and chunk count on ``device`` ("cuda-emulated" or "cuda"), and the unfused op in the
    input dtype; chunk counts above ``num_rows`` are dropped."""
    runs = [Contender(f"lce {policy} chunks={count}",
                      ImplSpec("lce", policy, f"rows:{-(-num_rows // count)}", "float32"), device)
            for policy in policies for count in chunk_counts if count <= num_rows]
    unfused_device = "cpu" if device == "cuda-emulated" else device
    runs.append(Contender("unfused", ImplSpec("reference"), unfused_device))
    if device == "cuda-emulated":  # a CPU run also measures the CPU table's "auto" pick
        runs.append(Contender(AUTO_CPU, ImplSpec("lce", "auto", "auto"), "cpu"))
    return runs


def dtype_contenders(runs: Sequence[Contender], dtype: str) -> list[Contender]:
    """fp32 inputs leave every CUDA-layout policy with the same arithmetic: only "auto" and the unfused op run."""
    if dtype != "float32":
        return list(runs)
    return [run for run in runs if run.label in (AUTO_CPU, "unfused")]


def chunk_rules(shape: Shape, dtype: torch.dtype) -> dict[str, tuple[str, int]]:
    """``rule -> (policy, number of chunks)`` of the rules that choose chunks on CUDA at ``shape``.

    ``lce auto`` is lce's plan; ``torch 2.13 auto`` is compact with ``aspect_ratio:2`` (torch 2.13's
    CUDA default, from its documentation); ``torch #187838`` is compact with rows
    ``min(aspect_ratio factor 1, largest power of two <= N*C/(4*D))`` (from that pull request's text).
    """
    n, d, c = shape.N, shape.D, shape.C
    with emulate_device_kind("cuda"):
        x = torch.empty(n, d, dtype=dtype, device="meta")
        w = torch.empty(c, d, dtype=dtype, device="meta")
        auto = lce.plan(x, w, options=lce.LinearCrossEntropyOptions())
    cap = max(1, n * c // (4 * d))
    rows_next = min(aspect_ratio_chunk_size(n, d, c, 1), 1 << (cap.bit_length() - 1))
    rows_213 = aspect_ratio_chunk_size(n, d, c, 2)
    return {"lce auto": (auto.acc_policy, auto.num_chunks),
            "torch 2.13 auto": ("compact", -(-n // rows_213)),
            "torch #187838": ("compact", -(-n // rows_next))}


@dataclasses.dataclass(frozen=True)
class ExactBatch:
    """One batch's exact answer and its sampling noise: what every contender's errors are measured against.

    ``outputs`` are fp64 (:func:`analysis.core.fp64.reference_outputs` of the rounded inputs); ``dtype`` is the
    inputs' own dtype, whose rounding floor the ``*_floors`` columns count in."""

    dtype: torch.dtype
    outputs: Outputs
    noise: SamplingNoise

    @property
    def gradient_norm(self) -> float:
        """The Frobenius norm of the exact weight gradient."""
        return torch.linalg.vector_norm(self.outputs.grad_weight).item()


def exact_batch(inputs: Inputs) -> ExactBatch:
    """The fp64 answer and sampling noise of ``inputs`` (mean-reduced, unweighted: :func:`sampling_noise`)."""
    exact_inputs = inputs.to(torch.float64)
    exact = reference_outputs(exact_inputs)
    return ExactBatch(inputs.dtype, exact, sampling_noise(exact_inputs, exact))


def contender_rows(batch: ExactBatch, runs: Sequence[Contender], results: Mapping[str, Result]
                   ) -> list[dict[str, object]]:
    """One row per contender of ``runs`` (its outputs in ``results``, by label): errors in floors and against the
    sampling noise of ``batch`` (the columns of :data:`analysis.core.results_io.NOISE` a study measures)."""
    dtype, exact, noise = batch.dtype, batch.outputs, batch.noise
    direction = exact.grad_weight / torch.linalg.vector_norm(exact.grad_weight)
    floors = {name: rounding_floor(gradient, dtype) * torch.linalg.vector_norm(gradient).item()
              for name, gradient in (("weight", exact.grad_weight), ("input", exact.grad_input))}
    rows = []
    for contender in runs:
        result = results[contender.label]
        out = result.outputs
        weight_error = out.grad_weight.double() - exact.grad_weight
        input_error = out.grad_input.double() - exact.grad_input
        bias = abs(float((weight_error * direction).sum()))
        bias_ratio = bias / noise.weight_along
        weight = report(out.grad_weight, exact.grad_weight, dtype)
        rows.append({
            "impl": contender.label, "op": contender.spec.op,
            "policy": result.resolved_policy or contender.spec.policy or "unfused",
            "chunking": contender.spec.chunking, "num_chunks": result.num_chunks or 1, "layout": contender.layout,
            "grad_weight_floors": weight.fro_in_floors, "grad_weight_bias_in_floors": weight.bias_in_floors,
            "grad_input_floors": report(out.grad_input, exact.grad_input, dtype).fro_in_floors,
            "weight_noise": noise.weight, "weight_noise_along": noise.weight_along, "input_noise": noise.input,
            "weight_error_over_noise": torch.linalg.vector_norm(weight_error).item() / noise.weight,
            "weight_bias_over_noise": bias_ratio,
            "steps_to_matter": math.inf if bias_ratio == 0 else bias_ratio ** -2,
            "input_error_over_noise": torch.linalg.vector_norm(input_error).item() / noise.input,
            "weight_floor_over_noise": floors["weight"] / noise.weight,
            "input_floor_over_noise": floors["input"] / noise.input,
        })
    return rows


def measure_inputs(inputs: Inputs, runs: Sequence[Contender]) -> list[dict[str, object]]:
    """One row per contender: errors in floors and against the sampling noise of ``inputs``
    (:func:`exact_batch`, then :func:`contender_rows`)."""
    return contender_rows(exact_batch(inputs), runs, run_contenders(runs, inputs))


def measure(shape: Shape = NOISE_SHAPE, families: Sequence[str] = FAMILIES, dtypes: Sequence[str] = STUDY_DTYPES,
            seeds: Sequence[int] = SEEDS, device: str = "cuda-emulated", policies: Sequence[str] = POLICIES,
            chunk_counts: Sequence[int] = CHUNK_COUNTS, progress: bool = True) -> pd.DataFrame:
    """One row per (family, dtype, seed, contender); ``device`` "cuda-emulated" (CPU) or "cuda"."""
    from tqdm import tqdm  # the plain bar: no ipywidgets warning inside a notebook

    runs = contenders(device, policies, chunk_counts, shape.N)
    tensor_device = "cpu" if device == "cuda-emulated" else device
    rows = []
    cases = [(family, seed) for family in families for seed in seeds]
    for family, seed in tqdm(cases, desc="noise", unit="draw", disable=not progress, dynamic_ncols=True):
        drawn = draw(family, shape, seed=seed, bias=False)
        for dtype_text in dtypes:
            inputs = rounded_inputs(drawn, DTYPES[dtype_text], device=tensor_device)
            common = {"family": family, "dtype": dtype_text, "seed": seed, "N": shape.N, "D": shape.D, "C": shape.C,
                      "device": device}
            rows.extend({**common, **row} for row in measure_inputs(inputs, dtype_contenders(runs, dtype_text)))
    return pd.DataFrame(rows)


def refresh_auto_cpu(folder: Path, file_name: str = NOISE_FILE, progress: bool = True) -> tuple[Path, int]:
    """Measure the CPU table's "auto" pick again (:data:`AUTO_CPU`) for every (family, dtype, seed) of the study's
    rows in ``folder/<file_name>``, and replace its rows there (fresh provenance on those rows only): what changing
    a CPU "auto" entry needs, without the whole study. Returns the path and the rows replaced."""
    from tqdm import tqdm

    from analysis.core.provenance import provenance
    from analysis.core.results_io import read_table, write_csv_atomically

    path = folder / file_name
    table = read_table(path)
    study = study_rows(table)
    cases = study[["family", "seed"]].drop_duplicates().itertuples(index=False)
    dtypes = sorted(study["dtype"].unique())
    run = [Contender(AUTO_CPU, ImplSpec("lce", "auto", "auto"), "cpu")]
    rows = []
    started = time.perf_counter()
    for family, seed in tqdm(list(cases), desc="noise: lce auto cpu", disable=not progress, dynamic_ncols=True):
        drawn = draw(family, NOISE_SHAPE, seed=int(seed), bias=False)
        for dtype_text in dtypes:
            inputs = rounded_inputs(drawn, DTYPES[dtype_text], device="cpu")
            common = {"family": family, "dtype": dtype_text, "seed": int(seed), "N": NOISE_SHAPE.N,
                      "D": NOISE_SHAPE.D, "C": NOISE_SHAPE.C, "device": "cuda-emulated"}
            rows.extend({**common, **row} for row in measure_inputs(inputs, run))
    fresh = pd.DataFrame(rows).assign(wall_s=time.perf_counter() - started, cpu_s=math.nan, **provenance("cpu"))
    replaced = (table["impl"] == AUTO_CPU) & table["step"].isna()
    write_csv_atomically(path, NOISE.rows(table[~replaced]) + NOISE.rows(fresh), NOISE.columns)
    return path, int(replaced.sum())


def study_rows(noise: pd.DataFrame) -> pd.DataFrame:
    """The noise study's own rows (not the training checkpoints'), at its shape."""
    rows = noise[noise["step"].isna()] if "step" in noise else noise
    return rows[(rows["N"] == NOISE_SHAPE.N) & (rows["D"] == NOISE_SHAPE.D) & (rows["C"] == NOISE_SHAPE.C)]


def record(folder: Path, file_name: str = NOISE_FILE, **settings) -> tuple[Path, float]:
    """Measure (``settings``: :func:`measure`'s) and write ``folder/<file_name>`` with provenance."""
    device = settings.get("device", "cuda-emulated")
    return record_study(folder / file_name, NOISE, measure, provenance_device=device, **settings)


# ---- python -m analysis noise --------------------------------------------------------------------------------

DESCRIPTION = ("Per input family, dtype (bf16, fp16) and seed: lce's CUDA-layout policies (fp32 acc_dtype) at "
               "chunk counts 1 to 256 and the unfused op; writes noise.csv (floors, error/noise and bias/noise "
               "ratios, steps until a bias matters). Emulated CUDA layouts on CPU tensors unless --device cuda. "
               "About 10 CPU-minutes.")


def add_arguments(parser) -> None:
    from analysis.core.arguments import argument, family_names, progress_option, study_options

    study_options(parser, NOISE_SHAPE, list(STUDY_DTYPES), allowed=STUDY_DTYPES)
    parser.add_argument("--families", type=argument(family_names), default=FAMILIES, metavar="NAME[,NAME]",
                        help=f"input families (default: {','.join(FAMILIES)})")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cpu: the CUDA layouts emulated on CPU tensors (default); cuda: a real GPU")
    parser.add_argument("--file", default=None, metavar="NAME",
                        help="results file name (default: noise.csv, noise_cuda.csv with --device cuda)")
    parser.add_argument("--refresh-auto-cpu", action="store_true",
                        help="only measure the CPU table's auto pick again and replace its rows (after a CPU auto "
                             "entry changed)")
    progress_option(parser)


def run(args) -> None:
    from analysis.core.arguments import print_study

    if args.refresh_auto_cpu:
        path, replaced = refresh_auto_cpu(args.results, args.file or NOISE_FILE, progress=not args.no_progress)
        print(f"{path}: {replaced} rows of {AUTO_CPU!r} measured again")
        return
    device = "cuda" if args.device == "cuda" else "cuda-emulated"
    file_name = args.file or ("noise_cuda.csv" if device == "cuda" else NOISE_FILE)
    print_study(*record(args.results, file_name, shape=args.shape, families=args.families,
                        dtypes=tuple(args.dtypes), seeds=tuple(range(args.seeds)), device=device,
                        progress=not args.no_progress))
