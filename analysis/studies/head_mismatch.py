"""Which trainer head matches which inference head (issue 51): the per-token log-probability mismatch between the head
an RL trainer recomputes ``log p(target)`` with and the head the rollout engine sampled the target with.

GRPO and PPO with a vLLM rollout weigh each sampled token by ``exp(log pi_trainer - log pi_infer)``; where the two
sides' LM heads round differently, that ratio is off 1 before the policy has moved. This study isolates the head:
both sides get the *same* rounded bf16 hidden states and head weight (a real engine's hidden states differ too: its
attention, norms and MoE kernels are not the trainer's), the targets are sampled from the exact tempered softmax of
those tensors (:func:`analysis.core.token_reference.sample_and_score`, as a rollout samples them, with the fp64
reference of each token's ``log p``), and each side computes only ``log p(target)``, forward.

Inference heads (:data:`INFERENCE_HEADS`), what the engine returns as the sampled token's log-probability with
``logprobs_mode="processed_logprobs"`` (the mode TRL 1.16 starts vLLM with, so that temperature is applied):

* ``vllm default``: the head's bf16 GEMM, its logits rounded to bf16, then the sampler's fp32 path (upcast, divide by
  T, fp32 log-softmax);
* ``vllm head_dtype=float32``: vLLM's fp32 head (``hf_overrides={"head_dtype": "float32"}``, vllm-project/vllm#48390;
  on CUDA a bf16-operand GEMM written in fp32, elsewhere both operands upcast): fp32 logits of the bf16 values, the
  same fp32 sampler path. Here the operands are upcast (the products of bf16 values are exact in fp32 either way);
* ``fp16``: an fp16 engine (the same values cast to fp16, :func:`fp16_cast_changed` counts the ones the cast moves),
  fp16 logits, the same fp32 sampler path.

Trainer heads (:data:`TRAINER_HEADS`): TRL 1.16's fused head by default (``trl``) and with ``cast_lm_head_to_fp32``,
lce's default options on the CUDA layouts (emulated, :func:`lce.testing.emulate_device_kind`) and on the CPU's, and
``acc_policy="compact"`` alone on the CUDA layouts, the option lce offers where memory is tight (its logits GEMM then
rounds to the input dtype: docs/using-lce.md) -- TRL's two are the recipes of
:data:`analysis.studies.rl_logprobs.RECIPES` with those labels, lce's three :func:`lce.linear_log_probs` with their
recipes' options, asked for ``log p`` alone (the same bits as with the entropy); the materialized bf16 loop (bf16
logits, divided by T and ``log_softmax`` in bf16: the recipe's formula, its logits shared with ``vllm default``'s
GEMM); and ``liger-style bf16 chunks``, written here from Liger-Kernel's documented chunked log-probability path
(``liger_kernel/chunked_loss/fused_linear_ppo.py``, its selective log-prob forward): rows in chunks of 2048, classes
in blocks of 4096, each block's logits from a GEMM in the input dtype (rounded to bf16), upcast to fp32, multiplied
by 1/T in fp32, an online fp32 log-sum-exp over the blocks, ``log p = u_y - lse``.

A bf16/fp16 GEMM that this CPU emulates runs on the fp32 stand-in (:class:`analysis.core.emulated_gemms.
Fp32LowPrecisionGemms`: fp32 sums rounded once to the dtype); where the CPU has native bf16 GEMMs the peers' bf16
GEMMs run natively. Each row names how its two sides' GEMMs ran (``trainer_gemms``, ``inference_gemms``). On a GPU
the two sides' bf16 GEMMs come from different kernels whose sums differ in order, so two heads that round to the
same grid here agree more often than they would there.

Inputs (:data:`CASES`): the ``calibrated`` family at Qwen2.5-0.5B's head (D = 896, C = 151,936) at 512 and 4096
tokens, and the ``trained`` family -- the repository's small LM, whose dump has D = 128, C = 16,384 and 2048 rows
(``draw("trained", ...)`` refuses more) -- at its own 2048 x 128 x 16384: the trained family is not available at
the Qwen shape, and at 2048 rows every seed takes every row, so its seeds differ in their sampled targets only. Both
heads have no bias (as Qwen2.5's: the calibrated family's class prior rides on a constant feature). T = 0.6 and
1.0, seeds 0, 1, 2; inputs rounded once to bf16.

Per (case, temperature, seed, trainer head, inference head) one row of kind ``head_mismatch``, on
``delta = log pi_trainer - log pi_infer`` per token: its RMS in nats (the measure Fast-LLM reports,
ServiceNow/Fast-LLM#525), mean and largest magnitude, the 99th percentile and max of ``|exp(delta) - 1|``, the share
of tokens where the two sides agree bit for bit; over the batch cut into consecutive sequences of
:data:`SEQUENCE_TOKENS` tokens, the sequences each mask of :data:`SEQUENCE_MASKS` would drop (TRL's and NeMo-RL's
rules and thresholds, cited there) and the statistics they read; and each side's own RMS error and p99 ratio error
against the fp64 reference.

Per (case with N > 512, seed, head) at T = 1, rows of kind ``head_batch``: the batch component -- the first 512 and
the first 100 rows scored inside the case's batch and scored alone: the largest and RMS difference, and whether
they are equal bit for bit (lce's default is meant to be batch-invariant: measured, not assumed).

:func:`record` appends each case's rows as it finishes and skips the finished cases on a rerun; each case draws its
inputs once, computes each shared GEMM once and applies every temperature to it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import pandas as pd
import torch

import lce
from analysis.core.emulated_gemms import Fp32LowPrecisionGemms
from analysis.core.families import draw
from analysis.core.problem import Shape
from analysis.core.provenance import provenance
from analysis.core.results_io import HEAD_BATCH, HEAD_MISMATCH, append_rows, read_table, set_aside
from analysis.core.token_reference import sample_and_score
from analysis.studies.rl_logprobs import RECIPES, emulates, input_dtype_gemms
from lce.testing import emulate_device_kind

__all__ = ["Case", "CASES", "TEMPERATURES", "SEEDS", "SEQUENCE_TOKENS", "BATCH_ROWS", "BATCH_TEMPERATURE",
           "HEAD_MISMATCH_FILE", "HEAD_BATCH_FILE", "Head", "TRAINER_HEADS", "INFERENCE_HEADS", "SequenceMask",
           "SEQUENCE_MASKS", "SharedLogits", "liger_style_log_probs", "fp16_cast_changed", "pair_measures",
           "measure_case", "record"]

HEAD_MISMATCH_FILE = "head_mismatch.csv"
HEAD_BATCH_FILE = "head_batch.csv"
INPUT_DTYPE = torch.bfloat16
TEMPERATURES: tuple[float, ...] = (0.6, 1.0)
SEEDS: tuple[int, ...] = (0, 1, 2)
SEQUENCE_TOKENS = 512
"""Tokens per sequence when a batch is cut into sequences for the sequence-level masks (consecutive blocks)."""
BATCH_ROWS: tuple[int, ...] = (512, 100)
"""The leading rows scored alone for the batch component: one sequence, and an odd size."""
BATCH_TEMPERATURE = 1.0
ROW_BLOCK = 512
"""Rows per block when a head's statistics run over materialized logits (row by row: the block changes nothing)."""


@dataclasses.dataclass(frozen=True)
class Case:
    """One input: a ``family`` (``calibrated`` or ``trained``) at ``shape``; the batch component is measured where
    N exceeds the largest of :data:`BATCH_ROWS`."""

    family: str
    shape: Shape

    @property
    def batch_rows(self) -> tuple[int, ...]:
        return BATCH_ROWS if self.shape.N > max(BATCH_ROWS) else ()


QWEN_D, QWEN_C = 896, 151936
CASES: tuple[Case, ...] = (
    Case("trained", Shape(2048, 128, 16384)),
    Case("calibrated", Shape(512, QWEN_D, QWEN_C)),
    Case("calibrated", Shape(4096, QWEN_D, QWEN_C)),
)
"""The trained LM's head at its own largest shape first (seconds), then the Qwen-size head at 512 and 4096 tokens."""


# ---- shared logits ------------------------------------------------------------------------------------------------

def _gemms_note(dtype: torch.dtype) -> str:
    """How a peer's ``dtype`` GEMM runs on this CPU: natively or on the fp32 stand-in."""
    return "fp32 stand-in" if emulates(dtype) else "native"


def low_precision_logits(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``x @ w.T`` in the operands' dtype, one GEMM: where this CPU emulates that dtype's GEMMs, on the fp32 stand-in
    (fp32 sums rounded once to the dtype, as a native kernel's)."""
    stand_in = Fp32LowPrecisionGemms() if emulates(x.dtype) else contextlib.nullcontext()
    with stand_in:
        return x @ w.T


class SharedLogits:
    """The logits several heads share within one case, each computed once on first use: ``bfloat16`` (the bf16
    GEMM of vLLM's default head and of the materialized loop), ``float32`` (the upcast operands' GEMM) and
    ``float16`` (the fp16 engine's). :meth:`release` drops them before the heads that compute their own."""

    def __init__(self, x: torch.Tensor, w: torch.Tensor):
        self.x, self.w = x, w
        self._logits: dict[str, torch.Tensor] = {}

    def __call__(self, kind: str) -> torch.Tensor:
        if kind not in self._logits:
            if kind == "float32":
                self._logits[kind] = self.x.float() @ self.w.float().T
            elif kind == "bfloat16":
                self._logits[kind] = low_precision_logits(self.x.bfloat16(), self.w.bfloat16())
            elif kind == "float16":
                self._logits[kind] = low_precision_logits(self.x.half(), self.w.half())
            else:
                raise ValueError(f"kind must be 'float32', 'bfloat16' or 'float16', got {kind!r}")
        return self._logits[kind]

    def release(self) -> None:
        self._logits.clear()


def _picked_log_softmax(logits: torch.Tensor, target: torch.Tensor, transform: Callable) -> torch.Tensor:
    """``log_softmax(transform(logits))`` at each row's target, a block of rows at a time (its dtype
    ``transform``'s)."""
    out = []
    for start in range(0, logits.shape[0], ROW_BLOCK):
        rows = slice(start, start + ROW_BLOCK)
        out.append(torch.log_softmax(transform(logits[rows]), -1).gather(1, target[rows, None]).squeeze(1))
    return torch.cat(out)


def _sampler_path(kind: str) -> Callable:
    """An engine's sampled-token log-probability from the shared ``kind`` logits: upcast to fp32, divide by T,
    fp32 log-softmax (vLLM's processed logprobs)."""
    def score(x, w, targets, shared: SharedLogits) -> dict[float, torch.Tensor]:
        logits = shared(kind)
        return {t: _picked_log_softmax(logits, y, lambda z, t=t: z.to(torch.float32, copy=True).div_(t))
                for t, y in targets.items()}
    return score


def _materialized(x, w, targets, shared: SharedLogits) -> dict[float, torch.Tensor]:
    """The materialized bf16 loop on the shared bf16 logits: divided by T in bf16, ``log_softmax`` in bf16 (torch's
    kernel sums in fp32 and rounds its result to bf16); the recipe ``materialized`` of rl_logprobs, forward only."""
    logits = shared("bfloat16")
    return {t: _picked_log_softmax(logits, y, lambda z, t=t: z / t) for t, y in targets.items()}


LIGER_ROWS, LIGER_CLASSES = 2048, 4096
"""Rows per chunk and classes per block of the Liger-style head (Liger-Kernel's selective log-prob defaults)."""


def liger_style_log_probs(x: torch.Tensor, w: torch.Tensor, targets: Mapping[float, torch.Tensor],
                          rows: int = LIGER_ROWS, classes: int = LIGER_CLASSES) -> dict[float, torch.Tensor]:
    """The Liger-style chunked head (module docstring) at every temperature of ``targets`` ({T: (N,) targets}):
    each (rows x classes) block's logits from one GEMM in the input dtype, upcast to fp32 and shared by the
    temperatures, each temperature's online fp32 log-sum-exp and target logit. Returns {T: (N,) fp32 log p}."""
    n, c = x.shape[0], w.shape[0]
    out = {t: torch.empty(n, dtype=torch.float32) for t in targets}
    for start in range(0, n, rows):
        chunk = slice(start, min(start + rows, n))
        here = {t: y[chunk] for t, y in targets.items()}
        size = chunk.stop - chunk.start
        running_max = {t: torch.full((size,), -math.inf) for t in targets}
        running_sum = {t: torch.zeros(size) for t in targets}
        target_logit = {t: torch.zeros(size) for t in targets}
        for first in range(0, c, classes):
            block = low_precision_logits(x[chunk], w[first:first + classes]).float()
            for t, y in here.items():
                u = block * (1.0 / t)
                new_max = torch.maximum(running_max[t], u.amax(1))
                running_sum[t] = running_sum[t] * torch.exp(running_max[t] - new_max) + torch.exp(
                    u - new_max[:, None]).sum(1)
                running_max[t] = new_max
                inside = (y >= first) & (y < first + u.shape[1])
                picked = u.gather(1, (y - first).clamp(0, u.shape[1] - 1)[:, None]).squeeze(1)
                target_logit[t] += torch.where(inside, picked, 0.0)
        for t in targets:
            out[t][chunk] = target_logit[t] - (running_max[t] + running_sum[t].log())
    return out


def _liger_style(x, w, targets, shared: SharedLogits) -> dict[float, torch.Tensor]:
    return liger_style_log_probs(x, w, targets)


def _recipe(label: str) -> Callable:
    """The rl_logprobs recipe ``label`` at each temperature, forward only, its input-dtype GEMMs on the stand-in
    where this CPU emulates them."""
    recipe = next(r for r in RECIPES if r.label == label)

    def score(x, w, targets, shared: SharedLogits) -> dict[float, torch.Tensor]:
        out = {}
        for t, y in targets.items():
            with torch.no_grad(), input_dtype_gemms(recipe, x.dtype):
                out[t] = recipe.run(x, w, None, y, t)[0]
        return out
    return score


def _lce(label: str) -> Callable:
    """lce.linear_log_probs with the options and layout table of the rl_logprobs recipe ``label``, log p alone (no
    entropy: the same bits, tests/analysis/test_head_mismatch_study.py, for less work)."""
    recipe = next(r for r in RECIPES if r.label == label)
    acc_dtype = torch.float32 if recipe.acc_dtype == "float32" else None

    def score(x, w, targets, shared: SharedLogits) -> dict[float, torch.Tensor]:
        options = lce.LinearCrossEntropyOptions(acc_policy=recipe.policy, acc_dtype=acc_dtype)
        with torch.no_grad(), emulate_device_kind(recipe.layout):
            return {t: lce.linear_log_probs(x, w, y, temperature=t, options=options) for t, y in targets.items()}
    return score


@dataclasses.dataclass(frozen=True)
class Head:
    """One side's head: ``label``, who runs it (``source``), ``score(x, w, {T: targets}, shared) -> {T: log p}``,
    whether it reads :class:`SharedLogits` (``shared``: those run first), and ``gemms()``: how its low-precision
    GEMMs run on this CPU."""

    label: str
    side: str
    source: str
    score: Callable[..., dict[float, torch.Tensor]]
    gemms: Callable[[], str]
    shared: bool = False


def _lce_gemms() -> str:
    return "lce's plan"


def _peer_gemms(dtype: torch.dtype = INPUT_DTYPE) -> Callable[[], str]:
    return lambda: _gemms_note(dtype)


TRAINER_HEADS: tuple[Head, ...] = (
    Head("trl", "trainer", "TRL 1.16's fused head: bf16 logits tiles of 4096 x 32768, fp32 statistics",
         _recipe("trl"), _peer_gemms()),
    Head("trl cast_lm_head_to_fp32", "trainer", "TRL 1.16's fused head with cast_lm_head_to_fp32: fp32 GEMMs",
         _recipe("trl cast_lm_head_to_fp32"), lambda: "fp32"),
    Head("liger-style bf16 chunks", "trainer", "Liger-Kernel's chunked log-probs as documented: bf16 block logits, "
         "fp32 online log-sum-exp", _liger_style, _peer_gemms()),
    Head("materialized", "trainer", "a plain loop: bf16 logits, divided by T and log_softmax in bf16",
         _materialized, _peer_gemms(), shared=True),
    Head("lce auto cuda", "trainer", "lce.linear_log_probs, default options, CUDA layouts (emulated)",
         _lce("lce auto cuda"), _lce_gemms),
    Head("lce auto cpu", "trainer", "lce.linear_log_probs, default options, CPU layouts", _lce("lce auto cpu"),
         _lce_gemms),
    Head("lce compact cuda", "trainer", "lce.linear_log_probs with acc_policy='compact' alone, CUDA layouts: its "
         "logits GEMM rounds to bf16", _lce("lce compact cuda acc=input"), _lce_gemms),
)
"""The trainer-side heads, in the report's order."""

INFERENCE_HEADS: tuple[Head, ...] = (
    Head("vllm default", "inference", "vLLM: bf16 head GEMM, logits rounded to bf16, fp32 sampler log-softmax of "
         "logits / T", _sampler_path("bfloat16"), _peer_gemms(), shared=True),
    Head("vllm head_dtype=float32", "inference", "vLLM's fp32 head: fp32 logits of the bf16 values, fp32 sampler",
         _sampler_path("float32"), lambda: "fp32", shared=True),
    Head("fp16", "inference", "an fp16 engine: fp16 operands, logits rounded to fp16, fp32 sampler",
         _sampler_path("float16"), _peer_gemms(torch.float16), shared=True),
)
"""The engine-side heads."""


# ---- sequence masks -----------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class SequenceMask:
    """A sequence-level mismatch mask: its column, where its rule and threshold come from, and
    ``drops(log_ratio_sum, mult_prob_error) -> bool per sequence``."""

    column: str
    source: str
    drops: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


SEQUENCE_MASKS: tuple[SequenceMask, ...] = (
    SequenceMask("masked_trl_default",
                 "TRL 1.16's GRPOConfig defaults: vllm_importance_sampling_correction=True, "
                 "vllm_importance_sampling_mode='sequence_mask', vllm_importance_sampling_clip_max=3.0, clip_min "
                 "None: a sequence is dropped when exp(sum of its tokens' log pi_trainer - log pi_vllm) > 3",
                 lambda s, m: s > math.log(3.0)),
    SequenceMask("masked_trl_two_sided",
                 "a grid point, not a default: TRL's sequence mask with vllm_importance_sampling_clip_min=1/3 too "
                 "(dropped outside [1/3, 3])", lambda s, m: s.abs() > math.log(3.0)),
    SequenceMask("masked_nemo_rl_2",
                 "NeMo-RL's grpo.seq_logprob_error_threshold (default None: off; 2.0 in its Nemotron 3 Nano "
                 "recipe): dropped when the mean over its tokens of exp(|log pi_gen - log pi_prev|) > 2",
                 lambda s, m: m > 2.0),
)
"""The masks whose dropped share is measured, with the sources of their rules and thresholds."""


def pair_measures(trainer: torch.Tensor, inference: torch.Tensor, sequence_tokens: int = SEQUENCE_TOKENS
                  ) -> dict[str, float]:
    """The mismatch measures of one pair of per-token log-probabilities (module docstring): ``delta = trainer -
    inference`` in fp64, and the batch cut into consecutive sequences of ``sequence_tokens`` (a shorter tail is
    left out)."""
    a, b = trainer.double(), inference.double()
    delta = a - b
    ratio_error = torch.expm1(delta).abs()
    sequences = delta.shape[0] // sequence_tokens
    blocks = delta[:sequences * sequence_tokens].reshape(sequences, sequence_tokens)
    log_ratio = blocks.sum(1)
    mult_prob_error = blocks.abs().exp().mean(1)
    out = {"tokens": delta.shape[0], "rms_nats": float(delta.square().mean().sqrt()),
           "mean_delta": float(delta.mean()), "max_abs_delta": float(delta.abs().max()),
           "ratio_err_p99": float(torch.quantile(ratio_error, 0.99)), "ratio_err_max": float(ratio_error.max()),
           "bitwise_equal_share": float((trainer.float() == inference.float()).double().mean()),
           "sequence_tokens": sequence_tokens, "sequences": sequences,
           "seq_log_ratio_rms": float(log_ratio.square().mean().sqrt()) if sequences else math.nan,
           "seq_log_ratio_max": float(log_ratio.abs().max()) if sequences else math.nan,
           "seq_mult_prob_error_max": float(mult_prob_error.max()) if sequences else math.nan}
    for mask in SEQUENCE_MASKS:
        out[mask.column] = int(mask.drops(log_ratio, mult_prob_error).sum())
    return out


def _own_error(log_probs: torch.Tensor, exact: torch.Tensor) -> tuple[float, float]:
    error = log_probs.double() - exact
    return float(error.square().mean().sqrt()), float(torch.quantile(torch.expm1(error).abs(), 0.99))


def fp16_cast_changed(x: torch.Tensor, w: torch.Tensor) -> float:
    """The share of the entries of ``x`` and ``w`` whose value the cast to fp16 changes (fp16's range)."""
    changed = sum(int((t.half().float() != t.float()).sum()) for t in (x, w))
    return changed / (x.numel() + w.numel())


# ---- one case -----------------------------------------------------------------------------------------------------

def _inputs(case: Case, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    drawn = draw(case.family, case.shape, seed=seed, bias=False)
    return drawn.x.to(INPUT_DTYPE), drawn.weight.to(INPUT_DTYPE)


def _ordered(heads: Sequence[Head]) -> list[Head]:
    """Heads that read the shared logits first, so that those can be dropped before the others run."""
    return [h for h in heads if h.shared] + [h for h in heads if not h.shared]


def measure_case(case: Case, seed: int, temperatures: Sequence[float] = TEMPERATURES,
                 trainers: Sequence[Head] = TRAINER_HEADS, inference: Sequence[Head] = INFERENCE_HEADS,
                 progress: Callable[[float], None] | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Every (temperature, trainer head, inference head) row of one case and seed, and its batch-component rows
    (:data:`BATCH_ROWS`, at :data:`BATCH_TEMPERATURE` when it is among ``temperatures``). ``progress(share)`` is
    told each step's share of the case's work as it finishes."""
    started = time.perf_counter()
    advance = progress or (lambda share: None)
    heads = [*trainers, *inference]
    x, w = _inputs(case, seed)
    reference = sample_and_score(x, w, None, temperatures, seed=seed, block_elements=1 << 26)
    targets = {t: reference[t][0] for t in reference}
    steps = 2 + len(heads) * (1 + sum(case.batch_rows) / case.shape.N)
    advance(2 / steps)
    shared = SharedLogits(x, w)
    scored: dict[str, dict[float, torch.Tensor]] = {}
    for head in _ordered(heads):
        if not head.shared:
            shared.release()
        scored[head.label] = head.score(x, w, targets, shared)
        advance(1 / steps)
    shared.release()
    batch_rows = []
    batch_t = BATCH_TEMPERATURE if BATCH_TEMPERATURE in targets else None
    for rows in case.batch_rows if batch_t is not None else ():
        alone = SharedLogits(x[:rows], w)
        for head in _ordered(heads):
            if not head.shared:
                alone.release()
            part = head.score(x[:rows], w, {batch_t: targets[batch_t][:rows]}, alone)[batch_t]
            inside = scored[head.label][batch_t][:rows]
            diff = part.double() - inside.double()
            batch_rows.append({"head": head.label, "side": head.side, "gemms": head.gemms(), "rows": rows,
                               "max_abs_diff": float(diff.abs().max()), "rms_diff": float(diff.square().mean().sqrt()),
                               "bitwise_equal": bool(torch.equal(part, inside))})
            advance(rows / case.shape.N / steps)
        alone.release()
    cast_changed = fp16_cast_changed(x, w)
    rows_out = []
    for t in temperatures:
        exact = reference[t][1]
        for trainer in trainers:
            own_t = _own_error(scored[trainer.label][t], exact)
            for engine in inference:
                own_i = _own_error(scored[engine.label][t], exact)
                rows_out.append({"trainer": trainer.label, "inference": engine.label, "temperature": t,
                                 "trainer_gemms": trainer.gemms(), "inference_gemms": engine.gemms(),
                                 **pair_measures(scored[trainer.label][t], scored[engine.label][t]),
                                 "trainer_rms_exact": own_t[0], "inference_rms_exact": own_i[0],
                                 "trainer_ratio_p99_exact": own_t[1], "inference_ratio_p99_exact": own_i[1],
                                 "fp16_cast_changed": cast_changed})
    wall = time.perf_counter() - started
    common = {"family": case.family, "N": case.shape.N, "D": case.shape.D, "C": case.shape.C,
              "dtype": str(INPUT_DTYPE).removeprefix("torch."), "seed": seed, "case_wall_s": wall}
    pairs = pd.DataFrame(rows_out).assign(**common)
    batch = pd.DataFrame(batch_rows).assign(**common, temperature=batch_t) if batch_rows else pd.DataFrame()
    return pairs, batch


# ---- resumable record ---------------------------------------------------------------------------------------------

def _key(case: Case, seed: int) -> tuple:
    return case.family, case.shape.N, case.shape.D, case.shape.C, seed


def _counts(path: Path) -> dict[tuple, int]:
    """Rows per (family, N, D, C, seed) in ``path``."""
    if not path.exists():
        return {}
    table = read_table(path)
    if table.empty:
        return {}
    return {tuple(k): int(v) for k, v in table.groupby(["family", "N", "D", "C", "seed"]).size().items()}


def record(folder: Path, *, cases: Sequence[Case] = CASES, seeds: Sequence[int] = SEEDS,
           temperatures: Sequence[float] = TEMPERATURES, trainers: Sequence[Head] = TRAINER_HEADS,
           inference: Sequence[Head] = INFERENCE_HEADS, pairs_file: str = HEAD_MISMATCH_FILE,
           batch_file: str = HEAD_BATCH_FILE, restart: bool = False, progress: bool = True) -> tuple[Path, float]:
    """Measure every (case, seed) not yet complete in ``folder`` (its pair rows and, where the case has one, its
    batch rows) and append each one's rows with provenance as it finishes; with ``restart`` set both files aside
    first. The bar's ETA weighs each case by its logits. Returns the pairs file and the seconds."""
    from tqdm import tqdm

    pairs_path, batch_path = folder / pairs_file, folder / batch_file
    if restart:
        set_aside(pairs_path)
        set_aside(batch_path)
    pair_counts, batch_counts = _counts(pairs_path), _counts(batch_path)
    heads = len(trainers) + len(inference)
    pending = []
    for case in cases:
        for seed in seeds:
            key = _key(case, seed)
            pairs_done = pair_counts.get(key, 0) >= len(temperatures) * len(trainers) * len(inference)
            batch_done = not case.batch_rows or batch_counts.get(key, 0) >= heads * len(case.batch_rows)
            if not (pairs_done and batch_done):
                pending.append((case, seed, pairs_done, batch_done))
    started = time.perf_counter()
    total = sum(case.shape.N * case.shape.C for case, *_ in pending)
    with tqdm(total=total, desc="head-mismatch", unit="logit", unit_scale=True, disable=not progress,
              dynamic_ncols=True) as bar:
        for case, seed, pairs_done, batch_done in pending:
            shape = case.shape
            bar.set_postfix_str(f"{case.family} {shape.N}x{shape.D}x{shape.C} seed {seed}")
            weight = shape.N * shape.C
            pairs, batch = measure_case(case, seed, temperatures, trainers, inference,
                                        progress=lambda share, weight=weight: bar.update(share * weight))
            stamp = provenance("cpu")
            if not batch_done and not batch.empty:
                append_rows(batch_path, HEAD_BATCH.rows(batch.assign(**stamp)))
            if not pairs_done:
                append_rows(pairs_path, HEAD_MISMATCH.rows(pairs.assign(**stamp)))
    return pairs_path, time.perf_counter() - started


# ---- python -m analysis head-mismatch ----------------------------------------------------------------------------

DESCRIPTION = ("Which trainer head matches which inference head: per-token log p mismatch (RMS nats, |ratio - 1|, "
               "sequences TRL's and NeMo-RL's masks would drop) between each trainer head (TRL 1.16 default and "
               "cast_lm_head_to_fp32, a Liger-style bf16 chunked head, materialized bf16 logits, lce default and "
               "compact) and each inference head (vLLM's default bf16 logits, vLLM head_dtype=float32, fp16), "
               "same bf16 inputs, targets sampled from the exact tempered softmax; the calibrated family at the "
               "Qwen2.5-0.5B head (512 and 4096 tokens) and the trained LM's head (2048 x 128 x 16384), T 0.6 and "
               "1, 3 seeds; plus the batch component (head_mismatch.csv, head_batch.csv; resumable; 26 minutes "
               "on a 2-core AMD EPYC shared with other jobs).")


def add_arguments(parser) -> None:
    from analysis.core.arguments import progress_option, results_option

    parser.add_argument("--quick", action="store_true",
                        help="the trained head only, seed 0, T=1 (a smoke run; not the committed one)")
    parser.add_argument("--restart", action="store_true", help="set the earlier files aside instead of resuming")
    results_option(parser)
    progress_option(parser)


def run(args) -> None:
    from analysis.core.arguments import print_study

    settings = {}
    if args.quick:
        settings = dict(cases=CASES[:1], seeds=(0,), temperatures=(1.0,))
    print_study(*record(args.results, restart=args.restart, progress=not args.no_progress, **settings))
