"""lce's features beyond torch's op (soft-capping, z-loss, the per-row log-sum-exp): error, time and memory.

Errors (kind ``features``): for each feature set of :data:`FEATURE_SETS` and
input family, in bf16 and fp16, the floors of both gradients and the loss's
ulps against the fp64 reference of the same formula (:mod:`analysis.core.fp64`
falls back to autograd through the unfused fp64 formula for these features),
next to the plain op on the same inputs; the returned log-sum-exp's largest
error in nats against fp64; and, from the fp64 logits, what the cap does to
the softmax statistics (mean log-sum-exp, mean largest logit, median target
probability, share of rows whose target has p > 0.999). Contenders: lce per
policy on the CPU and the (emulated) CUDA layouts with fp32 ``acc_dtype`` and
with "auto", and the unfused formula in the input dtype and in fp32.

Cost (kind ``feature_cost``): at the bench shape, lce's default options with
each feature set, timed in one process in alternating rounds (median; ratio to
the plain op in the same run), with the measured peak against lce's model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
import torch

import lce
from analysis.core.fp64 import reference_outputs
from analysis.core.implementations import ImplSpec
from analysis.core.inputs import Inputs, make_inputs
from analysis.core.memory import measure_peak
from analysis.core.metrics import report, ulps
from analysis.core.problem import BENCH_SHAPE, DTYPES, Shape
from analysis.core.results_io import FEATURE_COST, FEATURES
from analysis.core.timing import time_call
from analysis.studies.peers import Contender, lce_contenders, record_study, run_contenders
from lce.planning.options import EXPLICIT_POLICIES

__all__ = ["FEATURE_SETS", "FEATURES_PROBLEMS", "SEEDS", "CONTENDERS", "FEATURES_FILE", "FEATURE_COST_FILE",
           "COST_SHAPE", "softmax_statistics", "measure", "measure_cost", "record", "record_cost"]

FEATURE_SETS: dict[str, dict[str, float]] = {
    "plain": {},
    "softcap 30": {"softcap": 30.0},
    "softcap 5": {"softcap": 5.0},
    "z_loss 1e-4": {"z_loss": 1e-4},
    "softcap 30 + z_loss 1e-4": {"softcap": 30.0, "z_loss": 1e-4},
}
"""Gemma 2's final-logit cap (30), a cap that bites on every family (5), PaLM's z-loss factor (1e-4), both."""
FEATURES_PROBLEMS: tuple[tuple[str, Shape], ...] = (
    ("random", Shape(2048, 256, 8192)),
    ("calibrated", Shape(2048, 256, 8192)),
    ("trained:final", Shape(2048, 128, 16384)),  # the small LM's head at its own shape
)
SEEDS: tuple[int, ...] = (0, 1, 2)
STUDY_DTYPES: tuple[str, ...] = ("bfloat16", "float16")
FEATURES_FILE = "features.csv.gz"
FEATURE_COST_FILE = "feature_cost.csv"
COST_SHAPE = BENCH_SHAPE
"""The bench shape (``python -m analysis bench``)."""

CONTENDERS: tuple[Contender, ...] = (
    *lce_contenders(EXPLICIT_POLICIES, ("cpu", "cuda-emulated"), ("float32",)),
    *lce_contenders(("auto",), ("cpu", "cuda-emulated"), ("default",)),
    Contender("unfused", ImplSpec("reference")),
    Contender("unfused fp32", ImplSpec("reference"), upcast=True),
)


def softmax_statistics(inputs: Inputs) -> dict[str, float]:
    """From the fp64 logits of ``inputs`` (capped as they say): what the softmax looks like, per row averaged."""
    exact = inputs.to(torch.float64)
    with torch.no_grad():
        logits = exact.input @ exact.weight.T + (0 if exact.bias is None else exact.bias)
        if exact.softcap is not None:
            logits = exact.softcap * torch.tanh(logits / exact.softcap)
        lse = torch.logsumexp(logits, dim=1)
        target_prob = (logits.gather(1, exact.target[:, None]).squeeze(1) - lse).exp()
    return {"stat_mean_lse": float(lse.mean()), "stat_mean_max_logit": float(logits.amax(1).mean()),
            "stat_median_target_prob": float(target_prob.median()),
            "stat_share_target_prob_above_0.999": float((target_prob > 0.999).double().mean())}


def _lse_error(contender: Contender, inputs: Inputs, exact_lse: torch.Tensor) -> float | None:
    """The largest error (nats) of the log-sum-exp lce returns for ``contender``, or None for other ops."""
    if contender.spec.op != "lce":
        return None
    with torch.no_grad(), _layouts(contender.device):
        _, lse = lce.linear_cross_entropy(inputs.input, inputs.weight, inputs.target, options=contender.spec.options(),
                                          return_lse=True, **inputs.loss_arguments())
    return float((lse.double() - exact_lse).abs().max())


def _layouts(device: str):
    from lce.testing import emulate_device_kind

    return emulate_device_kind("cuda") if device == "cuda-emulated" else emulate_device_kind("cpu")


def measure(problems: Sequence[tuple[str, Shape]] = FEATURES_PROBLEMS, dtypes: Sequence[str] = STUDY_DTYPES,
            feature_sets: Sequence[str] = tuple(FEATURE_SETS), seeds: Sequence[int] = SEEDS,
            contenders: Sequence[Contender] = CONTENDERS, progress: bool = True) -> pd.DataFrame:
    """One row per (contender, problem, dtype, feature set, seed): both gradients' floors, loss ulps, the returned
    log-sum-exp's error and the fp64 softmax statistics."""
    from tqdm import tqdm

    rows = []
    cases = [(family, shape, dtype, name, seed) for family, shape in problems for dtype in dtypes
             for name in feature_sets for seed in seeds]
    for family, shape, dtype_text, name, seed in tqdm(cases, desc="features", disable=not progress):
        dtype = DTYPES[dtype_text]
        inputs = dataclasses.replace(make_inputs(shape, dtype, family=family, seed=seed), **FEATURE_SETS[name])
        exact = reference_outputs(inputs)
        exact_inputs = inputs.to(torch.float64)
        with torch.no_grad():
            exact_lse = lce.linear_cross_entropy(exact_inputs.input, exact_inputs.weight, exact_inputs.target,
                                                 return_lse=True, **exact_inputs.loss_arguments())[1].double()
        statistics = softmax_statistics(inputs)
        results = run_contenders(contenders, inputs)
        lse_errors: dict[int, float | None] = {}  # contenders that ran one call share its outputs and its lse
        for contender in contenders:
            result, out = results[contender.label], results[contender.label].outputs
            if id(out) not in lse_errors:
                lse_errors[id(out)] = _lse_error(contender, inputs, exact_lse)
            rows.append({
                "impl": contender.label, "op": contender.spec.op, "policy": contender.spec.policy,
                "layout": contender.layout, "acc_dtype": contender.spec.acc_dtype,
                "resolved_policy": result.resolved_policy, "resolved_acc_dtype": result.resolved_acc_dtype,
                "num_chunks": result.num_chunks, "dtype": dtype_text, "family": family, "N": shape.N, "D": shape.D,
                "C": shape.C, "seed": seed, "features": name, "softcap": inputs.softcap, "z_loss": inputs.z_loss,
                "grad_input_floors": report(out.grad_input, exact.grad_input, dtype).fro_in_floors,
                "grad_weight_floors": report(out.grad_weight, exact.grad_weight, dtype).fro_in_floors,
                "grad_bias_floors": report(out.grad_bias, exact.grad_bias, dtype).fro_in_floors,
                "loss_ulps": ulps(out.loss, exact.loss, dtype),
                "lse_max_error": lse_errors[id(out)],
                **statistics,
            })
    return pd.DataFrame(rows)


def measure_cost(shape: Shape = COST_SHAPE, dtype_text: str = "bfloat16",
                 feature_sets: Sequence[str] = tuple(FEATURE_SETS), rounds: int = 3) -> pd.DataFrame:
    """lce's default options with each feature set at ``shape``: median time over ``rounds`` alternating rounds
    (each call forward + backward, after one warm-up), its ratio to the plain op of the same run, and the
    measured peak extra bytes (one call) against lce's model."""
    dtype = DTYPES[dtype_text]
    inputs = make_inputs(shape, dtype, bias=False)
    options = lce.LinearCrossEntropyOptions()

    def call(features: dict) -> None:
        loss = lce.linear_cross_entropy(inputs.input, inputs.weight, inputs.target, options=options, **features)
        torch.autograd.grad(loss, (inputs.input, inputs.weight))

    samples: dict[str, list[float]] = {name: [] for name in feature_sets}
    for name in feature_sets:
        call(FEATURE_SETS[name])  # warm-up
    for _ in range(rounds):
        for name in feature_sets:
            samples[name].append(time_call(lambda n=name: call(FEATURE_SETS[n]), warmup=0, repeats=1).median_s)
    rows = []
    plain = pd.Series(samples[feature_sets[0]]).median()
    for name in feature_sets:
        features = FEATURE_SETS[name]
        plan = lce.plan(inputs.input, inputs.weight, options=options, **features)
        _, measured = measure_peak(lambda f=features: call(f))
        median = pd.Series(samples[name]).median()
        rows.append({"features": name, "softcap": features.get("softcap"), "z_loss": features.get("z_loss", 0.0),
                     "dtype": dtype_text, "N": shape.N, "D": shape.D, "C": shape.C, "policy": plan.acc_policy,
                     "acc_dtype": str(plan.acc_dtype).removeprefix("torch."), "num_chunks": plan.num_chunks,
                     "time_median_s": median, "time_spread_s": max(samples[name]) - min(samples[name]),
                     "time_ratio": median / plain, "repeats": rounds, "predicted_peak_bytes": plan.peak_extra_bytes,
                     "measured_peak_bytes": measured.peak_bytes})
    return pd.DataFrame(rows)


def record(folder: Path, **settings) -> tuple[Path, float]:
    """Measure (``settings``: :func:`measure`'s) and write ``folder/features.csv.gz`` with provenance."""
    return record_study(folder / FEATURES_FILE, FEATURES, measure, **settings)


def record_cost(folder: Path, **settings) -> tuple[Path, float]:
    """Measure (``settings``: :func:`measure_cost`'s) and write ``folder/feature_cost.csv`` with provenance."""
    return record_study(folder / FEATURE_COST_FILE, FEATURE_COST, measure_cost, **settings)


# ---- python -m analysis features -----------------------------------------------------------------------------

DESCRIPTION = ("lce's features beyond torch's op against fp64, next to the plain op: bf16 and fp16, random "
               "and calibrated inputs at 2048x256x8192 and the trained head, per policy and layout, with the "
               "fp64 softmax statistics of each feature set (features.csv.gz, about 10 minutes here). With "
               "--cost, also the time and peak of lce's defaults per feature set at the bench shape "
               "(feature_cost.csv).")


def add_arguments(parser) -> None:
    from analysis.core.arguments import results_option

    parser.add_argument("--seeds", type=int, default=3, help="seeds per problem (default 3)")
    parser.add_argument("--cost", action="store_true", help="also measure time and peak at the bench shape")
    parser.add_argument("--cost-only", action="store_true", help="only the time and peak measurement")
    parser.add_argument("--repeats", type=int, default=5, help="alternating timed rounds (default 5)")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    results_option(parser)


def run(args) -> None:
    from analysis.core.arguments import print_study

    if not args.cost_only:
        print_study(*record(args.results, seeds=tuple(range(args.seeds)), progress=not args.quiet))
    if args.cost or args.cost_only:
        print_study(*record_cost(args.results, rounds=args.repeats))
