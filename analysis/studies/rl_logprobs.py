"""Per-token log-probabilities and entropy for RL fine-tuning: how far each recipe is from fp64, on RL's scale
(issue 32).

PPO and GRPO weigh every sampled token by the importance ratio ``exp(log p_trainer - log p_sampler)`` and clip it at
``1 +- 0.2``; the training/inference mismatch debate (FP16 instead of BF16, fp32 LM heads) is about how far the
trainer's log-probabilities drift from the exact ones. This study measures that drift for each recipe of the
peers, written here from their formulas, and for lce, against the fp64 reference of
:mod:`analysis.core.token_reference` on the same rounded inputs.

Recipes (:data:`RECIPES`), the heads RL stacks run today first:

* ``trl``: TRL 1.16's fused head, the one its GRPO, RLOO, DPO, KTO and SFT trainers install
  (``add_fused_lm_head``), imported from the installed TRL and called as its ``_fused_forward`` calls it: on tensors in
  the compute dtype (under the trainer's bf16/fp16 autocast it rounds hidden states and head to that dtype), tiles
  of 4096 tokens x 32768 classes whose logits a GEMM rounds to that dtype, then fp32 statistics (online
  log-sum-exp, entropy ``lse - sum p u``), fp32 results; its backward recomputes the tiles and sums the gradient
  GEMMs in fp32;
* ``trl cast_lm_head_to_fp32``: the same kernel with TRL's remedy, fp32 hidden states, autocast off (the kernel then
  casts each tile of the head to fp32: fp32 GEMMs);
* ``materialized``: a plain PyTorch loop (and TRL before its fused head): the logits from a GEMM in the input dtype
  (fp32 sums rounded once), divided by T in that dtype, ``log_softmax`` and the entropy ``-sum p log p`` in that
  dtype (torch's kernels sum in fp32 and round their results to it);
* ``fp32 statistics, cast back`` (verl's torch path): the same logits divided by T in the input dtype, then
  ``log_softmax``, ``softmax`` and the entropy ``lse - sum p u`` in fp32, both results rounded to the input dtype;
* ``fp32 head``: hidden states and weight upcast to fp32, logits materialized: every step in fp32;
* ``lce ...``: :func:`lce.linear_log_probs` (fp32 results) with its default options on the CUDA layouts (emulated
  on the CPU: :func:`lce.testing.emulate_device_kind`) and on the CPU's, compact on the CUDA layouts with fp32
  accumulation, and compact on the CUDA layouts without ``acc_dtype`` (its logits GEMM then rounds to the input
  dtype, as the materialized recipe's does). ``lce auto ...`` is also what ``lce.integrations.trl.route`` runs
  inside TRL: the routed head calls :func:`lce.linear_log_probs` with the default options on the tensors TRL hands
  over, under autocast on the autocast dtype's tensors (tests/integrations/test_trl.py pins it bit for bit).

A peer's GEMMs in bf16/fp16 (``Recipe.input_dtype_gemms``) run, where this CPU emulates them, under the fp32 stand-in
(:class:`analysis.core.emulated_gemms.Fp32LowPrecisionGemms`: fp32 copies, one rounding): the arithmetic of a GPU's
low-precision GEMM with fp32 accumulation, at fp32's speed.

Inputs (:data:`PROBLEMS`): the trained LM's head dump (``trained``, 2048 x 128 x 16384), the ``calibrated`` family
(2048 x 256 x 32768: a Zipfian prior, outlier features, a share of confident rows), and ``confident:M`` rows whose
target leads every other class by M = 0..40 nats (:func:`analysis.core.families.confident_rows`). Temperatures
0.6, 0.8, 1.0, 1.2; bf16 and fp16; three seeds. And the Qwen-size head (:data:`QWEN_PROBLEM`: the calibrated family
at 512 x 896 x 151,936) in bf16 at T = 0.6 and 1.0, three seeds. Targets are sampled from the exact tempered softmax
(:func:`~analysis.core.token_reference.sample_targets`), as a rollout samples them; the confident rows keep their
leading target. The advantages ``A`` are standard normal, seeded.

Per (problem, recipe) one row of kind ``rl_logprobs``: the absolute error of log p (median, p99, max over tokens),
the importance-ratio error ``|exp(delta) - 1|`` (median, p99, max; the share of tokens above 1e-3 and above the
0.2 clip), the trainer-vs-sampler KL it implies (the k3 estimate ``mean(exp(delta) - 1 - delta)`` over the sampled
tokens), the entropy's absolute error (median, p99, max), the relative errors of log p and H on confident rows,
the worst token (its exact p_target, entropy and rank), and the policy-gradient loss ``-mean(A log p)``'s
gradients with respect to the input and the weight in floors of the input dtype
(:func:`analysis.core.metrics.report`; fp16 backpropagates the loss times 2^12, :data:`LOSS_SCALES`). The study
appends each problem's rows as it finishes and resumes recipe by recipe (a recipe added later is measured alone).

:func:`measure_costs` (kind ``rl_cost``) measures each recipe's peak extra memory and time for one forward and
backward at a Qwen-size head (D = 896, C = 151,936) on this CPU, at two batch sizes, so that the peak's growth
with N is measured, not assumed; where this CPU emulates bf16 GEMMs a peer's run on the stand-in, its scratch kept
outside the measured call, and the row says that its time is at fp32 GEMM speed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pandas as pd
import torch

import lce
from analysis.core.emulated_gemms import Fp32LowPrecisionGemms
from analysis.core.families import confident_rows, draw
from analysis.core.memory import measure_peak
from analysis.core.metrics import report
from analysis.core.problem import DTYPES, Shape
from analysis.core.provenance import provenance
from analysis.core.results_io import RL_CHUNKING, RL_COST, RL_LOGPROBS, Kind, append_rows, read_table, set_aside
from analysis.core.timing import time_call
from analysis.core.token_reference import sample_targets, token_reference
from lce.planning.cpu_gemms import LOW_PRECISION, gemm_support
from lce.testing import emulate_device_kind

__all__ = ["Recipe", "RECIPES", "CHUNKING_RECIPES", "RL_CHUNKING_FILE", "Problem", "PROBLEMS", "QWEN_HEAD",
           "QWEN_PROBLEM", "QWEN_TEMPERATURES", "TEMPERATURES", "STUDY_DTYPES", "SEEDS", "RL_LOGPROBS_FILE",
           "RL_COST_FILE", "COST_SHAPES", "STAND_IN_NOTE", "emulates", "input_dtype_gemms", "problem_inputs",
           "all_problems", "measure_problem", "record", "measure_costs", "record_costs", "ratio_summary"]

RL_LOGPROBS_FILE = "rl_logprobs.csv.gz"
RL_COST_FILE = "rl_cost.csv"
TEMPERATURES: tuple[float, ...] = (0.6, 0.8, 1.0, 1.2)
STUDY_DTYPES: tuple[str, ...] = ("bfloat16", "float16")
SEEDS: tuple[int, ...] = (0, 1, 2)
RATIO_THRESHOLDS: dict[str, float] = {"ratio_share_over_1e-3": 1e-3, "ratio_share_over_clip": 0.2}
"""The shares of tokens whose importance-ratio error passes 1e-3 and the usual PPO/GRPO clip of 0.2."""
CONFIDENT_SHAPE = Shape(64, 128, 4096)
MARGINS: tuple[float, ...] = (0.0, 10.0, 20.0, 30.0, 40.0)


# ---- recipes ----------------------------------------------------------------------------------------------------

Outputs = tuple[torch.Tensor, torch.Tensor]
"""A recipe's log p(target) and entropy per row."""


@dataclasses.dataclass(frozen=True)
class Recipe:
    """One way to compute the per-token log-probabilities and entropy: ``label``, who uses it (``source``), and
    ``run(x, w, b, target, T) -> (log_probs, entropy)`` on leaves that require grad. ``input_dtype_gemms``: a peer
    whose GEMMs run in the input dtype, computed by the fp32 stand-in where this CPU emulates them
    (:func:`input_dtype_gemms`)."""

    label: str
    source: str
    run: Callable[..., Outputs]
    op: str = "peer"
    policy: str = ""
    layout: str = ""
    acc_dtype: str = ""
    input_dtype_gemms: bool = False


def emulates(dtype: torch.dtype) -> bool:
    """Whether this CPU emulates ``dtype``'s GEMMs (:mod:`lce.planning.cpu_gemms`)."""
    return dtype in LOW_PRECISION and gemm_support(dtype).emulated


def input_dtype_gemms(recipe: Recipe, dtype: torch.dtype,
                      stand_in: Fp32LowPrecisionGemms | None = None) -> contextlib.AbstractContextManager:
    """Where a peer's GEMMs run in ``dtype`` and this CPU emulates them, the fp32 stand-in around its forward and
    backward (``stand_in``, else a fresh one): the arithmetic of a native kernel (fp32 sums, one rounding) at fp32's
    speed (:mod:`analysis.core.emulated_gemms`). Elsewhere nothing."""
    if recipe.input_dtype_gemms and emulates(dtype):
        return Fp32LowPrecisionGemms() if stand_in is None else stand_in
    return contextlib.nullcontext()


def _logits_in_input_dtype(x, w, b, temperature) -> torch.Tensor:
    logits = x @ w.T
    if b is not None:
        logits = logits + b
    return logits / temperature


def _materialized_input_dtype(x, w, b, target, temperature) -> Outputs:
    log_probs = torch.log_softmax(_logits_in_input_dtype(x, w, b, temperature), -1)
    picked = log_probs.gather(1, target[:, None]).squeeze(1)
    return picked, -(log_probs.exp() * log_probs).sum(-1)


def _fp32_statistics_cast_back(x, w, b, target, temperature) -> Outputs:
    logits = _logits_in_input_dtype(x, w, b, temperature)
    wide = logits.float()
    picked = torch.log_softmax(wide, -1).gather(1, target[:, None]).squeeze(1)
    entropy = torch.logsumexp(wide, -1) - (torch.softmax(wide, -1) * wide).sum(-1)
    return picked.to(logits.dtype), entropy.to(logits.dtype)


def _fp32_head(x, w, b, target, temperature) -> Outputs:
    logits = x.float() @ w.float().T
    if b is not None:
        logits = logits + b.float()
    log_probs = torch.log_softmax(logits / temperature, -1)
    return log_probs.gather(1, target[:, None]).squeeze(1), -(log_probs.exp() * log_probs).sum(-1)


def _lce(layout: str, policy: str, acc_dtype: str, **chunking) -> Callable[..., Outputs]:
    """lce.linear_log_probs with ``policy`` on ``layout``'s table; ``chunking``: fields of the options
    (``chunks``: that many row chunks of the call's N)."""
    def run(x, w, b, target, temperature) -> Outputs:
        fields = dict(chunking)
        chunks = fields.pop("chunks", None)
        if chunks is not None:
            fields.update(batch_chunk_size=-(-x.shape[0] // chunks), chunking_method=None)
        options = lce.LinearCrossEntropyOptions(
            acc_policy=policy, acc_dtype=torch.float32 if acc_dtype == "float32" else None, **fields)
        with emulate_device_kind(layout):
            return lce.linear_log_probs(x, w, target, linear_bias=b, temperature=temperature, return_entropy=True,
                                        options=options)
    return run


def _trl_kernel() -> tuple[type, int]:
    """TRL's fused log-probability head (the autograd function its ``add_fused_lm_head`` calls) and the number of
    classes per tile it passes, from the installed TRL (the hf extra)."""
    from trl.kernels import ChunkedLogProbFunction
    from trl.trainer.utils import _CHUNKED_LOGPROB_CHUNK_SIZE

    return ChunkedLogProbFunction, _CHUNKED_LOGPROB_CHUNK_SIZE


TRL_OUTPUTS = ("log_probs", "entropy")


def _trl_head(cast_lm_head_to_fp32: bool) -> Callable[..., Outputs]:
    """TRL's own fused head, as its trainers call it: by default on tensors in the compute dtype (what its
    ``_fused_forward`` hands over under the trainer's bf16/fp16 autocast: each tile's logits in that dtype, fp32
    statistics); with ``cast_lm_head_to_fp32`` on fp32 hidden states, autocast off, so that the kernel casts each
    tile of the head to fp32 (fp32 GEMMs; the head itself stays in its dtype, as TRL leaves it)."""
    def run(x, w, b, target, temperature) -> Outputs:
        function, classes_per_tile = _trl_kernel()
        if cast_lm_head_to_fp32:
            x = x.float()  # what TRL's _fused_forward does to the hidden states
        log_probs, entropy, *_ = function.apply(x, w, b, target, temperature, classes_per_tile, None, 1.0,
                                                TRL_OUTPUTS)
        return log_probs, entropy
    return run


RECIPES: tuple[Recipe, ...] = (
    Recipe("trl", "TRL 1.16's fused head (GRPO, RLOO, DPO, KTO, SFT): input-dtype logits tiles, fp32 statistics",
           _trl_head(cast_lm_head_to_fp32=False), input_dtype_gemms=True),
    Recipe("trl cast_lm_head_to_fp32", "TRL 1.16's fused head with cast_lm_head_to_fp32=True: fp32 GEMMs",
           _trl_head(cast_lm_head_to_fp32=True)),
    Recipe("materialized", "a plain PyTorch loop: logits, log_softmax and entropy in the input dtype",
           _materialized_input_dtype, input_dtype_gemms=True),
    Recipe("fp32 statistics, cast back", "verl's torch path: input-dtype logits, fp32 statistics, results rounded",
           _fp32_statistics_cast_back, input_dtype_gemms=True),
    Recipe("fp32 head", "hidden states and head weight upcast: every step in fp32", _fp32_head),
    Recipe("lce auto cuda", "lce.linear_log_probs, default options, CUDA layouts", _lce("cuda", "auto", "default"),
           "lce", "auto", "cuda", "default"),
    Recipe("lce auto cpu", "lce.linear_log_probs, default options, CPU layouts", _lce("cpu", "auto", "default"),
           "lce", "auto", "cpu", "default"),
    Recipe("lce compact cuda acc=fp32", "lce, compact, fp32 accumulation, CUDA layouts",
           _lce("cuda", "compact", "float32"), "lce", "compact", "cuda", "float32"),
    Recipe("lce compact cuda acc=input", "lce, compact without acc_dtype: input-dtype logits GEMM",
           _lce("cuda", "compact", "default"), "lce", "compact", "cuda", "default"),
)


CHUNKING_RECIPES: tuple[Recipe, ...] = tuple(
    Recipe(f"lce {policy} cuda @{chunks}", f"lce, {policy}, fp32 accumulation, {chunks} row chunks, CUDA layouts",
           _lce("cuda", policy, "float32", chunks=chunks), "lce", policy, "cuda", "float32")
    for policy in ("balanced", "compact") for chunks in (1, 8, 64, 256)
) + (Recipe("lce balanced cuda tiled", "lce, balanced, fp32 accumulation, classes in blocks of 4096",
            _lce("cuda", "balanced", "float32", class_chunk_size=4096), "lce", "balanced", "cuda", "float32"),)
"""lce at fixed row chunk counts and with class tiling (``--chunking``): row chunks change no row's statistics, so
these show what the chunking does to the gradients, and tiling what its blockwise statistics do to the outputs."""
RL_CHUNKING_FILE = "rl_logprobs_chunking.csv"


# ---- problems ---------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Problem:
    """One input: a ``family`` name (``trained``, ``calibrated``, ``confident:M``) at ``shape``."""

    family: str
    shape: Shape

    @property
    def margin(self) -> float | None:
        return float(self.family.partition(":")[2]) if self.family.startswith("confident") else None


PROBLEMS: tuple[Problem, ...] = (
    Problem("trained", Shape(2048, 128, 16384)),
    Problem("calibrated", Shape(2048, 256, 32768)),
    *(Problem(f"confident:{margin:g}", CONFIDENT_SHAPE) for margin in MARGINS),
)


QWEN_HEAD = Shape(512, 896, 151936)
"""Qwen2.5-0.5B's head (D = 896, C = 151,936; the Qwen2/2.5/3 vocabulary) at 512 tokens."""
QWEN_PROBLEM = Problem("calibrated", QWEN_HEAD)
QWEN_TEMPERATURES: tuple[float, ...] = (0.6, 1.0)
"""The Qwen-size head runs in bf16 at two temperatures (three seeds): each item takes minutes on a CPU."""


def problem_inputs(problem: Problem, dtype: torch.dtype, temperature: float, seed: int):
    """``(x, w, b, target, advantages)``: the problem's tensors rounded once to ``dtype``, targets sampled from the
    exact tempered softmax (the confident rows keep their leading target), standard normal advantages."""
    if problem.margin is not None:
        drawn, _ = confident_rows(problem.margin, problem.shape, dtype, seed=seed)
        x, w, b, target = drawn.x, drawn.weight, None, drawn.target
    else:
        drawn = draw(problem.family, problem.shape, seed=seed, bias=problem.family != "trained")
        x, w = drawn.x.to(dtype), drawn.weight.to(dtype)
        b = None if drawn.bias is None else drawn.bias.to(dtype)
        target = sample_targets(x, w, b, temperature, seed=seed)
    advantages = torch.randn(problem.shape.N, generator=torch.Generator().manual_seed(1000 + seed),
                             dtype=torch.float64)
    return x, w, b, target, advantages


def _quantiles(values: torch.Tensor, prefix: str) -> dict[str, float]:
    q = torch.quantile(values, torch.tensor([0.5, 0.99], dtype=values.dtype)).tolist()
    return {f"{prefix}_median": q[0], f"{prefix}_p99": q[1], f"{prefix}_max": float(values.max())}


def ratio_summary(delta: torch.Tensor) -> dict[str, float]:
    """The importance-ratio error ``|exp(delta) - 1|`` of log-probability errors ``delta`` (fp64): quantiles, the
    shares over :data:`RATIO_THRESHOLDS`, and the k3 estimate of the KL the errors imply."""
    ratio_error = torch.expm1(delta).abs()
    out = _quantiles(ratio_error, "ratio_err")
    out.update({name: float((ratio_error > limit).double().mean()) for name, limit in RATIO_THRESHOLDS.items()})
    out["kl_k3"] = float((torch.expm1(delta) - delta).mean())
    return out


LOSS_SCALES: dict[str, float] = {"bfloat16": 1.0, "float16": 2.0 ** 12}
"""The loss scale each dtype's backward starts from: fp16 training runs under a loss scale (GradScaler's), without
which a policy-gradient's entries (about A p / N) fall below fp16's normal range in every recipe; the gradients are
judged against the exact gradient times the scale."""


def _run_recipe(recipe: Recipe, x, w, b, target, temperature, advantages, loss_scale: float):
    leaves = [None if t is None else t.detach().clone().requires_grad_() for t in (x, w, b)]
    with input_dtype_gemms(recipe, x.dtype):
        log_probs, entropy = recipe.run(leaves[0], leaves[1], leaves[2], target, temperature)
        loss = -(advantages.to(log_probs.dtype) * log_probs).sum() / target.shape[0]
        (loss.float() * loss_scale).backward()
    return log_probs.detach().double(), entropy.detach().double(), leaves[0].grad, leaves[1].grad


def measure_problem(problem: Problem, dtype_text: str, temperature: float, seed: int,
                    recipes: Sequence[Recipe] = RECIPES) -> pd.DataFrame:
    """Every recipe's row at one (problem, dtype, temperature, seed): see the module docstring."""
    dtype = DTYPES[dtype_text]
    x, w, b, target, advantages = problem_inputs(problem, dtype, temperature, seed)
    exact = token_reference(x, w, b, target, temperature, advantages)
    rows = []
    for recipe in recipes:
        started = time.perf_counter()
        scale = LOSS_SCALES[dtype_text]
        log_probs, entropy, grad_x, grad_w = _run_recipe(recipe, x, w, b, target, temperature, advantages, scale)
        delta = log_probs - exact.log_probs
        worst = int(torch.expm1(delta).abs().argmax())
        row = {"recipe": recipe.label, "op": recipe.op, "policy": recipe.policy, "layout": recipe.layout,
               "acc_dtype": recipe.acc_dtype, "family": problem.family, "margin": problem.margin,
               "dtype": dtype_text, "N": problem.shape.N, "D": problem.shape.D, "C": problem.shape.C,
               "temperature": temperature, "seed": seed, "output_dtype": str(log_probs.dtype),
               **_quantiles(delta.abs(), "logp_err"), **ratio_summary(delta),
               **_quantiles((entropy - exact.entropy).abs(), "entropy_err"),
               "logp_rel_err_max": float((delta / exact.log_probs).abs().nan_to_num(nan=0.0).max()),
               "entropy_rel_err_max": float(((entropy - exact.entropy) / exact.entropy).abs()
                                            .nan_to_num(nan=0.0).max()),
               "worst_p_target": float(exact.log_probs[worst].exp()), "worst_entropy": float(exact.entropy[worst]),
               "worst_rank": int(exact.rank[worst]), "worst_ratio_err": float(torch.expm1(delta[worst]).abs()),
               "median_p_target": float(exact.log_probs.exp().median()),
               "mean_entropy": float(exact.entropy.mean()),
               "grad_input_floors": report(grad_x, exact.grad_input * scale, dtype).fro_in_floors,
               "grad_weight_floors": report(grad_w, exact.grad_weight * scale, dtype).fro_in_floors,
               "wall_s": time.perf_counter() - started}
        rows.append(row)
    return pd.DataFrame(rows)


def _key(problem: Problem, dtype_text: str, temperature: float, seed: int) -> tuple:
    return problem.family, problem.shape.N, problem.shape.D, problem.shape.C, dtype_text, float(temperature), seed


def _done(path: Path) -> dict[tuple, set[str]]:
    """The recipes already measured at each (problem, dtype, temperature, seed) key in ``path``."""
    done: dict[tuple, set[str]] = {}
    if not path.exists():
        return done
    for r in read_table(path).itertuples():
        key = (r.family, int(r.N), int(r.D), int(r.C), r.dtype, float(r.temperature), int(r.seed))
        done.setdefault(key, set()).add(r.recipe)
    return done


def all_problems(problems: Sequence[Problem] = PROBLEMS, dtypes: Sequence[str] = STUDY_DTYPES,
                 temperatures: Sequence[float] = TEMPERATURES, seeds: Sequence[int] = SEEDS,
                 qwen_head: bool = False) -> list[tuple]:
    """Every (problem, dtype, temperature, seed) of the grid; with ``qwen_head`` also :data:`QWEN_PROBLEM` in bf16 at
    :data:`QWEN_TEMPERATURES` and ``seeds``."""
    items = [(p, d, t, s) for p in problems for d in dtypes for t in temperatures for s in seeds]
    if qwen_head:
        items += [(QWEN_PROBLEM, "bfloat16", t, s) for t in QWEN_TEMPERATURES for s in seeds]
    return items


def record(folder: Path, file_name: str = RL_LOGPROBS_FILE, *, problems: Sequence[Problem] = PROBLEMS,
           dtypes: Sequence[str] = STUDY_DTYPES, temperatures: Sequence[float] = TEMPERATURES,
           seeds: Sequence[int] = SEEDS, recipes: Sequence[Recipe] = RECIPES, qwen_head: bool = False,
           restart: bool = False, progress: bool = True, kind: Kind = RL_LOGPROBS) -> tuple[Path, float]:
    """Measure every recipe not yet in ``folder/<file_name>`` at each (problem, dtype, temperature, seed) of the grid
    (:func:`all_problems`), and append each item's rows with provenance as it finishes, as rows of ``kind``: a
    recipe added later is measured alone, beside the rows already there. The bar's ETA weighs items by their logits
    times the recipes left. Returns the path and the seconds."""
    from tqdm import tqdm

    path = folder / file_name
    if restart:
        set_aside(path)
    done = _done(path)
    pending = []
    for item in all_problems(problems, dtypes, temperatures, seeds, qwen_head):
        missing = [recipe for recipe in recipes if recipe.label not in done.get(_key(*item), set())]
        if missing:
            pending.append((item, missing))
    total = sum(problem.shape.N * problem.shape.C * (1 + len(missing)) for (problem, *_), missing in pending)
    started = time.perf_counter()
    with tqdm(total=total, desc="rl-logprobs", unit="logit", unit_scale=True, disable=not progress,
              dynamic_ncols=True) as bar:
        for (problem, dtype_text, temperature, seed), missing in pending:
            bar.set_postfix_str(f"{problem.family} {problem.shape.C} {dtype_text} T={temperature:g} seed {seed}: "
                                f"{len(missing)} recipe(s)")
            table = measure_problem(problem, dtype_text, temperature, seed, missing)
            append_rows(path, kind.rows(table.assign(**provenance("cpu"))))
            bar.update(problem.shape.N * problem.shape.C * (1 + len(missing)))
    return path, time.perf_counter() - started


# ---- costs at a Qwen-size head ------------------------------------------------------------------------------------

COST_SHAPES: tuple[Shape, ...] = (Shape(512, 896, 151936), Shape(1024, 896, 151936))
"""Qwen2.5-0.5B's head (D = 896, C = 151,936) at two batches of tokens: the peak's growth with N is measured."""
COST_DTYPE = "bfloat16"


def _cost_step(recipe: Recipe, x, w, target, advantages,
               stand_in: Fp32LowPrecisionGemms | None = None) -> Callable[[], None]:
    def step() -> None:
        leaves = [t.detach().requires_grad_() for t in (x, w)]
        with input_dtype_gemms(recipe, x.dtype, stand_in):
            log_probs, entropy = recipe.run(leaves[0], leaves[1], None, target, 1.0)
            loss = -(advantages.to(log_probs.dtype) * log_probs).sum() / target.shape[0] - 0.01 * entropy.mean()
            loss.backward()
    return step


STAND_IN_NOTE = ("this CPU emulates bf16 GEMMs: the recipe's bf16 GEMMs ran on the fp32 stand-in (same arithmetic; "
                 "its scratch kept outside the measured call, so the peak is the recipe's own); the time is at fp32 "
                 "GEMM speed, not the emulated kernels' (about 80x slower on AVX2-only CPUs)")
"""The note of a cost row whose GEMMs ran on the stand-in (:func:`input_dtype_gemms`)."""


def measure_costs(shapes: Sequence[Shape] = COST_SHAPES, recipes: Sequence[Recipe] | None = None,
                  repeats: int = 3, progress: bool = False) -> pd.DataFrame:
    """Peak extra bytes (allocator events, one call) and median time of a forward and backward of a
    policy-gradient loss with an entropy bonus, per recipe, at ``shapes`` in bf16 on this CPU. lce's rows also give
    its plan's predicted peak. CUDA-layout arms are left out: on the CPU they would measure the emulation. Where
    this CPU emulates bf16 GEMMs, a peer's bf16 GEMMs run on the stand-in with kept scratch (one warm-up call before
    the measured one) and the row says so (``gemms``, ``note``: :data:`STAND_IN_NOTE`). ``progress``: a bar with
    an ETA, each (shape, recipe) weighed by the shape's logits."""
    from tqdm import tqdm

    recipes = [r for r in (RECIPES if recipes is None else recipes) if r.layout != "cuda"]
    dtype = DTYPES[COST_DTYPE]
    rows = []
    bar = tqdm(total=sum(s.N * s.C for s in shapes) * len(recipes), desc="rl-logprobs --costs", unit="logit",
               unit_scale=True, disable=not progress, dynamic_ncols=True)
    for shape in shapes:
        drawn = draw("random", shape, seed=0, bias=False)
        x, w = drawn.x.to(dtype), drawn.weight.to(dtype)
        target = drawn.target
        advantages = torch.randn(shape.N, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
        for recipe in recipes:
            bar.set_postfix_str(f"N={shape.N} {recipe.label}")
            stood_in = recipe.input_dtype_gemms and emulates(dtype)
            step = _cost_step(recipe, x, w, target, advantages, Fp32LowPrecisionGemms(keep_scratch=True))
            if stood_in:
                step()  # the stand-in's scratch, allocated before the measured call
            _, memory = measure_peak(step)
            timing = time_call(step, warmup=1, repeats=repeats)
            predicted = None
            if recipe.op == "lce":
                plan = lce.logprobs.log_probs_plan(x.requires_grad_(), w.requires_grad_(), return_entropy=True)
                predicted = plan.peak_extra_bytes
            rows.append({"recipe": recipe.label, "op": recipe.op, "dtype": COST_DTYPE, "N": shape.N, "D": shape.D,
                         "C": shape.C, "peak_bytes": memory.peak_bytes, "predicted_peak_bytes": predicted,
                         "logits_bytes": shape.N * shape.C * dtype.itemsize, "time_median_s": timing.median_s,
                         "time_spread_s": timing.spread_s, "repeats": repeats,
                         "gemms": "fp32 stand-in" if stood_in else "native",
                         "note": STAND_IN_NOTE if stood_in else ""})
            bar.update(shape.N * shape.C)
    bar.close()
    return pd.DataFrame(rows)


def record_costs(folder: Path, **settings) -> tuple[Path, float]:
    """Measure (:func:`measure_costs`) and write ``folder/rl_cost.csv`` with provenance (an earlier one set aside)."""
    started = time.perf_counter()
    path = folder / RL_COST_FILE
    table = measure_costs(**settings)
    set_aside(path)
    append_rows(path, RL_COST.rows(table.assign(**provenance("cpu"))))
    return path, time.perf_counter() - started


# ---- python -m analysis rl-logprobs ------------------------------------------------------------------------------

DESCRIPTION = ("Per-token log-probabilities and entropy for RL: each recipe (TRL 1.16's fused head, with and without "
               "cast_lm_head_to_fp32, materialized in the input dtype, fp32 statistics cast back, an fp32 head, lce) "
               "against fp64 on the trained LM's head, the calibrated family and confident rows, T 0.6-1.2, bf16 and "
               "fp16, 3 seeds, and the Qwen-size head in bf16: importance-ratio error, implied KL, entropy error, "
               "policy-gradient floors (rl_logprobs.csv.gz, resumable recipe by recipe; about 80 CPU-minutes); "
               "--costs: peak memory and time per recipe at the Qwen-size head (rl_cost.csv, about 30 minutes).")


def add_arguments(parser) -> None:
    from analysis.core.arguments import progress_option, results_option

    parser.add_argument("--costs", action="store_true", help="measure the costs at the Qwen-size head instead")
    parser.add_argument("--chunking", action="store_true",
                        help=f"lce at fixed chunk counts and class-tiled instead (bf16, T=1; {RL_CHUNKING_FILE})")
    parser.add_argument("--no-qwen-head", action="store_true",
                        help=f"leave out the Qwen-size head ({QWEN_HEAD.N}x{QWEN_HEAD.D}x{QWEN_HEAD.C}, bf16, T "
                             f"{', '.join(f'{t:g}' for t in QWEN_TEMPERATURES)}; about 3 CPU-minutes an item)")
    parser.add_argument("--quick", action="store_true",
                        help="one seed, T=1, the trained head and two margins (a smoke run; not the committed one)")
    parser.add_argument("--file", default=RL_LOGPROBS_FILE, metavar="NAME",
                        help=f"results file name in the results folder (default: {RL_LOGPROBS_FILE})")
    parser.add_argument("--restart", action="store_true", help="set an earlier file aside instead of resuming it")
    results_option(parser)
    progress_option(parser)


def run(args) -> None:
    from analysis.core.arguments import print_study

    if args.costs:
        print_study(*record_costs(args.results, progress=not args.no_progress))
        return
    settings = {"qwen_head": not args.no_qwen_head}
    file_name = args.file
    if args.chunking:
        settings = dict(problems=PROBLEMS[:2], dtypes=("bfloat16",), temperatures=(1.0,), recipes=CHUNKING_RECIPES,
                        kind=RL_CHUNKING, qwen_head=False)
        file_name = RL_CHUNKING_FILE
    if args.quick:
        settings = dict(problems=(PROBLEMS[0], *PROBLEMS[-2:]), temperatures=(1.0,), seeds=(0,), qwen_head=False)
    print_study(*record(args.results, file_name, restart=args.restart, progress=not args.no_progress, **settings))

