"""Does a policy's gradient bias change training over a long horizon? The head alone, trained for 10^4 steps.

The features are fixed and only the head's weight ``W`` (C, D) trains, so one step is one
linear-cross-entropy forward and backward and 10^4 steps per arm fit on one core.

**Data.** A teacher from the ``calibrated`` family (:mod:`analysis.core.families`: Zipf prior on
feature 0, outlier features, confident rows; no bias, as LLM heads have none) labels a fixed pool
of rows by sampling its softmax: ``pool_rows`` for training, ``heldout_rows`` more for evaluation.
Each step draws ``batch_rows`` rows of the pool with replacement, from a generator seeded by
``(seed, step)``; the student head starts from ``N(0, 0.02^2)`` drawn by the seed. The trained
LM's dumps hold 2048 rows, a pool a 10^4-step run would see about a thousand times over; the
language model's own long run (``python -m analysis train --setting long``) carries that evidence.

**Arms** (:data:`ADAMW_ARMS`, :data:`SGD_ARMS`). Mixed-precision training as LLMs run it: fp32
master weights, cast to the arm's dtype for the op every step, the op's low-precision weight
gradient upcast for the update. The lce arms run lce's CUDA layouts with fp32 ``acc_dtype`` at the
chunk counts the rules give at the first LLM shape (16384x4096x128256, bf16): 64 (lce auto's
balanced, torch 2.13 auto's compact), 32 (torch 2.14's compact rule) and 256 (a harsh count);
their arithmetic is :mod:`analysis.studies.head_arithmetic` (lce's, restated; checked against lce
itself here at every bias checkpoint and in the tests). fp16 arms keep a dynamic loss scale
(start 2**16, halved and the step skipped on overflow, doubled after 2000 clean steps). The
unfused arm is ``cross_entropy(x_t @ W_t.T)`` in the arm's dtype (torch's own kernels). All
arms of a (optimizer, seed) group run in lockstep on the same batches from the same start.

**Metrics** (tidy rows, one per arm, step, metric and bucket; :data:`METRICS`): held-out loss
overall and per target-frequency bucket (:mod:`analysis.core.buckets`, from the pool's counts);
the relative distance of ``W``'s class rows to the fp32 arm's, per bucket; the head's norm;
skipped steps; and at :attr:`Setting.bias_steps` the gradient's bias and error against the
sampling noise of that step's batch (:mod:`analysis.studies.noise`), measured at the fp32 arm's
weight for every arm's arithmetic, by the restatement and by lce.

Runs are resumable (each group checkpoints its arms every evaluation), show a progress bar with
an ETA, and the results file is rewritten from every group's rows after each evaluation.
"""

from __future__ import annotations

import csv
import dataclasses
import math
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pandas as pd
import torch
import torch.nn.functional as F

import lce.planning.cpu_gemms
from analysis.core.buckets import BUCKETS, class_buckets
from analysis.core.emulated_gemms import low_precision_linear
from analysis.core.problem import DTYPES
from analysis.core.results_io import write_csv_atomically
from analysis.studies.head_arithmetic import head_step, lce_weight_gradient

__all__ = ["Arm", "ADAMW_ARMS", "SGD_ARMS", "BUDGET_ARMS", "HEADROOM_ARMS",
           "LARGE_BATCH_ARMS", "ARM_GROUPS", "SETTING_GROUPS", "Setting", "SETTINGS", "METRICS", "Pool", "make_pool",
           "run_group",
           "collect", "run_study", "HEAD_TRAINING_FILE", "CACHE_DIR"]

HEAD_TRAINING_FILE = "head_training.csv.gz"
"""The results file (its settings' files add a suffix before ``.csv.gz``); compressed, being large and rewritten
whole (:mod:`analysis.core.results_io`)."""
TEACHER_SEED = 0
INIT_STD = 0.02
METRICS = ("heldout_loss", "train_loss", "w_distance", "head_norm", "skipped_steps", "loss_scale",
           "bias_over_noise", "error_over_noise", "error_over_gradient", "bias_over_noise_lce", "error_over_noise_lce",
           "error_over_gradient_lce")


@dataclasses.dataclass(frozen=True)
class Arm:
    """How one arm computes the head's weight gradient: ``op`` "fp32", "unfused" or "lce" (a policy at a chunk
    count) in ``dtype``; ``rule`` names the chunk-count rule it stands for."""

    name: str
    dtype: str
    op: str
    policy: str = ""
    num_chunks: int = 1
    rule: str = ""

    @property
    def loss_scaling(self) -> bool:
        return self.dtype == "float16"


FP32 = Arm("fp32", "float32", "fp32")
ADAMW_ARMS: tuple[Arm, ...] = (
    FP32,
    Arm("bf16 unfused", "bfloat16", "unfused"),
    Arm("bf16 accurate@64", "bfloat16", "lce", "accurate", 64),
    Arm("bf16 balanced@64", "bfloat16", "lce", "balanced", 64, "lce auto"),
    Arm("bf16 compact@64", "bfloat16", "lce", "compact", 64, "torch 2.13 auto"),
    Arm("bf16 compact@32", "bfloat16", "lce", "compact", 32, "torch 2.14 rule"),
    Arm("bf16 compact@256", "bfloat16", "lce", "compact", 256, "harsh"),
    Arm("fp16 balanced@64", "float16", "lce", "balanced", 64, "lce auto"),
    Arm("fp16 compact@64", "float16", "lce", "compact", 64, "torch 2.13 auto"),
)
"""The AdamW arms: fp32 first (every gap is measured against it)."""
SGD_ARMS: tuple[Arm, ...] = (FP32, ADAMW_ARMS[3], ADAMW_ARMS[6])
"""Plain SGD, where a biased gradient adds up in the weight step by step: fp32, lce auto, the harsh compact."""
BUDGET_ARMS: tuple[Arm, ...] = (
    FP32,
    Arm("bf16 compact@4", "bfloat16", "lce", "compact", 4, "recommend, 1.2x gradients"),
    Arm("bf16 compact@8", "bfloat16", "lce", "compact", 8, "recommend, auto's peak"),
    Arm("bf16 compact@16", "bfloat16", "lce", "compact", 16, "recommend, 1.05x gradients"),
    Arm("bf16 balanced@4", "bfloat16", "lce", "balanced", 4, "balanced, class-tiled"),
    Arm("fp16 compact@4", "float16", "lce", "compact", 4, "recommend, 1.2x gradients"),
    Arm("fp16 compact@8", "float16", "lce", "compact", 8, "recommend, auto's peak"),
)
"""AdamW arms for the options ``lce.recommend`` offers under tight budgets at the LLM heads (issue 30): compact at 4,
8 and 16 row chunks (4096, 2048 and 1024 rows of the 16384-row head) and balanced at 4. Class tiling leaves the
weight gradient's roundings as they are (each class block's rows are the same chunk products; only the softmax
statistics' last bits move, ``tests/analysis/test_head_training.py``), so a row-chunk arm stands for its class-tiled
pick too."""
HEADROOM_ARMS: tuple[Arm, ...] = (FP32, *(dataclasses.replace(arm, rule="") for arm in ADAMW_ARMS
                                           if arm.dtype == "float16"))
"""The fp16 arms of :data:`ADAMW_ARMS` again, with lce's fp16 gradients kept scaled by powers of two so that the
loss scale protects them (:mod:`lce.passes.headroom`, issue 31): the ``adamw`` group's fp16 rows were trained before
it."""
LARGE_BATCH_ARMS: tuple[Arm, ...] = (FP32, *(dataclasses.replace(arm, rule="") for arm in
                                           (ADAMW_ARMS[1], ADAMW_ARMS[3], ADAMW_ARMS[4], ADAMW_ARMS[6])))
"""The AdamW arms of the batch-size question (issue 52, setting ``large-batch``): fp32, and the bf16 candidates whose
weight bias/noise the noise-scaling study predicts at or over the rule's limit at LLM batch sizes -- the unfused op,
torch 2.13's default (compact@64) and compact at 256 chunks (compact at 2048 rows per chunk of a 2^19-row step) --
beside lce's auto pick (balanced@64, predicted near the limit at 2^20, at the bf16 rounding floor). Their ``rule``
is left empty: the rule verdicts of notebook 10 are the full study's, at its batch."""
ARM_GROUPS: dict[str, tuple[str, tuple[Arm, ...]]] = {
    "adamw": ("adamw", ADAMW_ARMS), "sgd": ("sgd", SGD_ARMS), "adamw-budget": ("adamw", BUDGET_ARMS),
    "adamw-headroom": ("adamw", HEADROOM_ARMS), "adamw-large": ("adamw", LARGE_BATCH_ARMS)}
"""Each group of arms trained in lockstep, by the name its rows carry in the ``optimizer`` column: the optimizer it
trains with and its arms (fp32 first; every gap is measured against the group's own fp32 arm)."""
SETTING_GROUPS: dict[str, tuple[str, ...]] = {"large-batch": ("adamw-large",)}
"""The groups of arms a setting trains that the others do not (every other group runs in every other setting)."""
ARMS_BY_OPTIMIZER = {group: arms for group, (_, arms) in ARM_GROUPS.items()}


@dataclasses.dataclass(frozen=True)
class Setting:
    """Sizes and lengths of one study; ``eval_every`` after the early evaluations ``(100, 250)``."""

    name: str
    steps: int
    batch_rows: int
    pool_rows: int
    heldout_rows: int
    D: int
    C: int
    seeds: tuple[int, ...]
    eval_every: int
    bias_steps: tuple[int, ...]
    adamw_lr: float = 3e-3
    sgd_lr: float = 1e-2
    weight_decay: float = 0.1

    @property
    def eval_steps(self) -> tuple[int, ...]:
        early = [s for s in (100, 250) if s < self.eval_every]
        return tuple(sorted({0, *early, *range(self.eval_every, self.steps + 1, self.eval_every), self.steps,
                             *self.bias_steps}))


SETTINGS: dict[str, Setting] = {
    # CI and the notebook: a small head, a few hundred steps, two seeds (about a minute on one core)
    "quick": Setting("quick", steps=200, batch_rows=256, pool_rows=16384, heldout_rows=2048, D=16, C=512,
                     seeds=(0, 1), eval_every=50, bias_steps=(0, 200)),
    # the committed study: 10^4 steps of 256 rows (about 40 epochs of the pool), three seeds
    "full": Setting("full", steps=10_000, batch_rows=256, pool_rows=65536, heldout_rows=8192, D=32, C=2048,
                    seeds=(0, 1, 2), eval_every=500, bias_steps=(0, 1000, 3000, 10_000)),
    # issue 52: 16x the full study's batch per step (the sampling noise 4x smaller, so a fixed bias counts 4x more),
    # 3.2x the full run's rows in all; arms ARM_GROUPS["adamw-large"]
    "large-batch": Setting("large-batch", steps=2000, batch_rows=4096, pool_rows=262144, heldout_rows=8192, D=32,
                           C=2048, seeds=(0, 1, 2), eval_every=250, bias_steps=(0, 1000, 2000)),
    # a lent GPU (gpu-check step "head"): an LLM-like head on real cuBLAS, as many steps as its budget allows
    "gpu": Setting("gpu", steps=2000, batch_rows=4096, pool_rows=16384, heldout_rows=4096, D=2048, C=131072,
                   seeds=(0,), eval_every=250, bias_steps=(0, 1000, 2000)),
}


@dataclasses.dataclass(frozen=True)
class Pool:
    """The teacher-labelled rows (fp32 ``x``, int64 ``target``) for training and evaluation, and the classes'
    buckets by their count in the training pool."""

    train_x: torch.Tensor
    train_target: torch.Tensor
    heldout_x: torch.Tensor
    heldout_target: torch.Tensor
    buckets: torch.Tensor
    counts: torch.Tensor


def make_pool(setting: Setting, device: str = "cpu") -> Pool:
    """The teacher's pool for ``setting`` (the same on every machine: a seeded draw on the CPU), on ``device``."""
    from analysis.core.families import draw
    from analysis.core.problem import Shape

    drawn = draw("calibrated", Shape(setting.pool_rows + setting.heldout_rows, setting.D, setting.C),
                 seed=TEACHER_SEED, bias=False)
    train, held = slice(0, setting.pool_rows), slice(setting.pool_rows, None)
    counts = torch.bincount(drawn.target[train], minlength=setting.C)
    tensors = (drawn.x[train], drawn.target[train], drawn.x[held], drawn.target[held], class_buckets(counts), counts)
    return Pool(*(tensor.contiguous().to(device) for tensor in tensors))


def batch_rows(setting: Setting, seed: int, step: int) -> torch.Tensor:
    """The pool rows of step ``step`` (with replacement), from a generator seeded by ``(seed, step)``."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + step)
    return torch.randint(0, setting.pool_rows, (setting.batch_rows,), generator=generator)


def learning_rate(setting: Setting, optimizer: str, step: int) -> float:
    """Linear warm-up over 5% of the steps, then a cosine down to 10% (the language model's schedule)."""
    peak = setting.adamw_lr if ARM_GROUPS[optimizer][0] == "adamw" else setting.sgd_lr
    warmup = max(1, setting.steps // 20)
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, setting.steps - warmup))
    return peak * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress)))


def arm_gradient(arm: Arm, x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                 loss_scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """``(loss, fp32 weight gradient, finite)`` of ``arm`` at fp32 master ``weight`` on rows ``x``."""
    if arm.op == "lce" and x.is_cuda:  # lce itself on real cuBLAS
        gradient = lce_weight_gradient(x, weight, target, DTYPES[arm.dtype], arm.policy, arm.num_chunks,
                                       loss_scale, with_loss=True)
        return gradient.loss, gradient.grad_weight, gradient.finite
    if arm.op == "lce":
        step = head_step(x, weight, target, DTYPES[arm.dtype], arm.policy, arm.num_chunks, loss_scale)
        return step.loss, step.grad_weight, step.finite
    dtype = DTYPES[arm.dtype]
    w = weight.detach().to(dtype, copy=True).requires_grad_(True)
    inputs = x.to(dtype)
    logits = inputs @ w.T if arm.op == "fp32" else low_precision_linear(inputs, w)
    loss = F.cross_entropy(logits, target)
    (loss * loss_scale).backward()
    grad = w.grad.float()
    finite = bool(torch.isfinite(grad).all())
    return loss.detach().float(), grad.div_(loss_scale), finite


class _ArmState:
    """One arm's master weight, optimizer, loss scale and counters."""

    def __init__(self, arm: Arm, weight: torch.Tensor, optimizer: str, setting: Setting):
        self.arm = arm
        self.weight = weight.clone()
        self.weight.grad = None
        if ARM_GROUPS[optimizer][0] == "adamw":
            self.optimizer = torch.optim.AdamW([self.weight], lr=setting.adamw_lr, betas=(0.9, 0.95),
                                               weight_decay=setting.weight_decay)
        else:
            self.optimizer = torch.optim.SGD([self.weight], lr=setting.sgd_lr)
        self.loss_scale = 2.0**16 if arm.loss_scaling else 1.0
        self.clean_steps = 0
        self.skipped = 0
        self.train_losses: list[float] = []

    def step(self, x: torch.Tensor, target: torch.Tensor, rate: float) -> None:
        loss, grad, finite = arm_gradient(self.arm, x, self.weight, target, self.loss_scale)
        self.train_losses.append(float(loss))
        if not finite:  # the dynamic loss scale: skip the step and halve the scale
            self.skipped += 1
            self.loss_scale /= 2
            self.clean_steps = 0
            return
        if self.arm.loss_scaling:
            self.clean_steps += 1
            if self.clean_steps == 2000:
                self.loss_scale *= 2
                self.clean_steps = 0
        for group in self.optimizer.param_groups:
            group["lr"] = rate
        self.weight.grad = grad
        self.optimizer.step()
        self.weight.grad = None

    def state(self) -> dict:
        return {"weight": self.weight.detach().clone(), "optimizer": self.optimizer.state_dict(),
                "loss_scale": self.loss_scale, "clean_steps": self.clean_steps, "skipped": self.skipped}

    def load(self, saved: dict) -> None:
        with torch.no_grad():
            self.weight.copy_(saved["weight"])
        self.optimizer.load_state_dict(saved["optimizer"])
        self.loss_scale, self.clean_steps, self.skipped = saved["loss_scale"], saved["clean_steps"], saved["skipped"]


def _heldout_losses(weight: torch.Tensor, pool: Pool) -> dict[str, float]:
    from analysis.core.buckets import bucket_losses

    with torch.no_grad():
        losses = F.cross_entropy(pool.heldout_x @ weight.T, pool.heldout_target, reduction="none")
    return bucket_losses(losses, pool.heldout_target, pool.buckets)


def _row_distance(weight: torch.Tensor, reference: torch.Tensor, buckets: torch.Tensor) -> dict[str, float]:
    """``||W - W_fp32|| / ||W_fp32||`` over all class rows and over each bucket's rows."""
    difference = (weight - reference).double().square().sum(1)
    size = reference.double().square().sum(1)
    out = {"all": math.sqrt(float(difference.sum()) / float(size.sum()))}
    for index, name in enumerate(BUCKETS):
        chosen = buckets == index
        out[name] = math.sqrt(float(difference[chosen].sum()) / max(float(size[chosen].sum()), 1e-300))
    return out


def bias_rows(arms: Sequence[Arm], weight: torch.Tensor, x: torch.Tensor, target: torch.Tensor,
              buckets: torch.Tensor | None = None, with_lce: bool = True) -> list[dict[str, object]]:
    """Per low-precision arm: its weight gradient's bias and error against the batch's sampling noise, at the
    fp32 ``weight``, by the restated arithmetic and (``with_lce``) by lce; over the whole gradient (bucket "all",
    the noise study's ratios, :mod:`analysis.studies.noise`) and, given the classes' ``buckets``, over each
    bucket's rows of it alone: ``bias_over_noise`` = ``|<E_b, u_b>| / noise along u_b`` (``u_b`` the exact
    gradient's rows of the bucket, normalised) and ``error_over_gradient`` = ``||E_b|| / ||G_b||``."""
    rows = []
    for arm in arms:
        if arm.op == "fp32":
            continue
        dtype = DTYPES[arm.dtype]
        x_t, w_t = x.to(dtype).double(), weight.to(dtype).double()
        residual = torch.softmax(x_t @ w_t.T, dim=1)
        residual[torch.arange(x.shape[0]), target] -= 1.0
        exact = residual.T @ x_t / x.shape[0]
        gradients = {"": arm_gradient(arm, x, weight, target)[1]}
        if with_lce and arm.op == "lce" and not x.is_cuda:
            gradients["_lce"] = lce_weight_gradient(x, weight, target, dtype, arm.policy, arm.num_chunks)
        groups = {"all": slice(None)}
        if buckets is not None:
            groups.update({name: buckets == index for index, name in enumerate(BUCKETS)})
        for bucket, chosen in groups.items():
            part = exact[chosen]
            direction = part / torch.linalg.vector_norm(part)
            along = (residual[:, chosen] * (x_t @ direction.T)).sum(1)  # each row's gradient along u_b
            noise_along = float(along.std()) / math.sqrt(x.shape[0])
            spread = ((residual[:, chosen].square().sum(1) * x_t.square().sum(1)).sum()
                      - x.shape[0] * part.square().sum()).clamp_min(0.0) / (x.shape[0] - 1)
            noise = math.sqrt(float(spread) / x.shape[0])
            for suffix, gradient in gradients.items():
                error = gradient.double()[chosen] - part
                values = {"bias_over_noise": abs(float((error * direction).sum())) / noise_along,
                          "error_over_noise": float(torch.linalg.vector_norm(error)) / noise,
                          "error_over_gradient": float(torch.linalg.vector_norm(error))
                          / float(torch.linalg.vector_norm(part))}
                rows.extend({"arm": arm.name, "metric": f"{metric}{suffix}", "bucket": bucket, "value": value}
                            for metric, value in values.items())
    return rows


def bucket_bias_at_end(setting: Setting, cache: Path, optimizer: str, seed: int, pool: Pool) -> list[dict]:
    """The per-bucket rows of :func:`bias_rows` at a finished group's last step (its saved fp32 weight and that
    step's batch), for a run made before the per-bucket ratios were measured along it."""
    saved = torch.load(_group_dir(cache, setting, optimizer, seed) / "state.pt", weights_only=False)
    step = saved["step"]
    chosen = batch_rows(setting, seed, step)
    rows = bias_rows(ARMS_BY_OPTIMIZER[optimizer], saved["arms"][FP32.name]["weight"], pool.train_x[chosen],
                     pool.train_target[chosen], pool.buckets, with_lce=False)
    return [{"step": step, **row} for row in rows if row["bucket"] != "all"]


LOG_COLUMNS = ("step", "arm", "metric", "bucket", "value")


def _group_dir(cache: Path, setting: Setting, optimizer: str, seed: int) -> Path:
    return cache / setting.name / optimizer / f"seed-{seed}"


def run_group(setting: Setting, optimizer: str, seed: int, pool: Pool, cache: Path,
              on_step: Callable[[int], None] | None = None, on_eval: Callable[[], None] | None = None,
              stop_after: int | None = None, deadline: float | None = None) -> Path:
    """Train (or resume) every arm of ``optimizer`` for ``seed`` in lockstep; returns the group's folder.

    The folder holds ``state.pt`` (every arm at the last evaluation) and ``log.csv`` (the rows so far, up to
    that step); a resumed group truncates the log to its state's step and goes on identically. ``stop_after``
    ends this call at the first evaluation at or after that step, as an interruption would; so does ``deadline``
    (a ``time.monotonic()`` value) once it has passed.
    """
    arms = ARMS_BY_OPTIMIZER[optimizer]
    folder = _group_dir(cache, setting, optimizer, seed)
    folder.mkdir(parents=True, exist_ok=True)
    state_path, log_path = folder / "state.pt", folder / "log.csv"
    generator = torch.Generator().manual_seed(10_000 + seed)
    start = (torch.randn(setting.C, setting.D, generator=generator) * INIT_STD).to(pool.train_x.device)
    states = [_ArmState(arm, start, optimizer, setting) for arm in arms]
    step, rows = 0, []
    if state_path.exists():
        saved = torch.load(state_path, weights_only=False, map_location=pool.train_x.device)
        step = saved["step"]
        for arm_state in states:
            arm_state.load(saved["arms"][arm_state.arm.name])
        with open(log_path, newline="", encoding="utf-8") as handle:
            rows = [row for row in csv.DictReader(handle) if int(row["step"]) <= step]
    evals = [s for s in setting.eval_steps if s > step or (s == 0 and not rows)]

    def evaluate(at: int) -> None:
        reference = states[0].weight.detach()
        for arm_state in states:
            weight = arm_state.weight.detach()
            values = [("heldout_loss", bucket, value) for bucket, value in _heldout_losses(weight, pool).items()]
            if arm_state.arm is not FP32:
                values += [("w_distance", bucket, value)
                           for bucket, value in _row_distance(weight, reference, pool.buckets).items()]
            values += [("head_norm", "all", float(torch.linalg.vector_norm(weight))),
                       ("skipped_steps", "all", arm_state.skipped), ("loss_scale", "all", arm_state.loss_scale)]
            if arm_state.train_losses:
                values.append(("train_loss", "all", sum(arm_state.train_losses) / len(arm_state.train_losses)))
                arm_state.train_losses.clear()
            rows.extend({"step": at, "arm": arm_state.arm.name, "metric": metric, "bucket": bucket, "value": value}
                        for metric, bucket, value in values)
        if at in setting.bias_steps:
            chosen = batch_rows(setting, seed, at).to(pool.train_x.device)
            rows.extend({"step": at, **row} for row in bias_rows(
                [s.arm for s in states], reference, pool.train_x[chosen], pool.train_target[chosen], pool.buckets))
        _save(state_path, log_path, at, states, rows)
        if on_eval is not None:
            on_eval()

    if evals and evals[0] == 0:
        evaluate(0)
    while step < setting.steps:
        chosen = batch_rows(setting, seed, step).to(pool.train_x.device)
        x, target = pool.train_x[chosen], pool.train_target[chosen]
        rate = learning_rate(setting, optimizer, step)
        for arm_state in states:
            arm_state.step(x, target, rate)
        step += 1
        if on_step is not None:
            on_step(1)
        if step in setting.eval_steps:
            evaluate(step)
            if (stop_after is not None and step >= stop_after) or (deadline is not None
                                                                    and time.monotonic() > deadline):
                break
    return folder


def _save(state_path: Path, log_path: Path, step: int, states: list[_ArmState], rows: list[dict]) -> None:
    partial = state_path.with_name(state_path.name + ".tmp")
    torch.save({"step": step, "arms": {s.arm.name: s.state() for s in states}}, partial)
    write_csv_atomically(log_path, rows, LOG_COLUMNS)
    os.replace(partial, state_path)


def _add_bucket_bias(setting: Setting, cache: Path, optimizer: str, seed: int, pool: Pool) -> None:
    """Append :func:`bucket_bias_at_end`'s rows to a finished group's log unless it has per-bucket ratios there."""
    folder = _group_dir(cache, setting, optimizer, seed)
    if _done_steps(cache, setting, optimizer, seed) < setting.steps:
        return
    log = pd.read_csv(folder / "log.csv")
    at_end = log[(log["step"] == setting.steps) & (log["metric"] == "bias_over_noise")]
    if (at_end["bucket"] != "all").any():
        return
    added = pd.DataFrame(bucket_bias_at_end(setting, cache, optimizer, seed, pool))
    pd.concat([log, added[list(LOG_COLUMNS)]], ignore_index=True).to_csv(folder / "log.csv", index=False)


def collect(cache: Path, setting: Setting) -> pd.DataFrame:
    """Tidy rows of every group's log of ``setting`` (finished or partial), labelled with the arm's description."""
    frames = []
    for optimizer, arms in ARMS_BY_OPTIMIZER.items():
        by_name = {arm.name: arm for arm in arms}
        for seed in setting.seeds:
            log = _group_dir(cache, setting, optimizer, seed) / "log.csv"
            if not log.exists():
                continue
            table = pd.read_csv(log)
            if table.empty:
                continue
            arm = table["arm"].map(by_name)
            frames.append(table.assign(
                setting=setting.name, optimizer=optimizer, seed=seed, steps=setting.steps,
                dtype=arm.map(lambda a: a.dtype), op=arm.map(lambda a: a.op), policy=arm.map(lambda a: a.policy),
                num_chunks=arm.map(lambda a: a.num_chunks), rule=arm.map(lambda a: a.rule),
                batch_rows=setting.batch_rows, pool_rows=setting.pool_rows, heldout_rows=setting.heldout_rows,
                D=setting.D, C=setting.C))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def _run_group_in_worker(setting: Setting, optimizer: str, seed: int, cache: Path, threads: int, queue,
                         gemm_verdicts: dict) -> None:
    # the parent's CPU GEMM verdicts: every group plans as one process would
    lce.planning.cpu_gemms.adopt(gemm_verdicts)
    torch.set_num_threads(threads)
    pool = make_pool(setting)
    run_group(setting, optimizer, seed, pool, cache, on_step=lambda n: queue.put(("step", n)),
              on_eval=lambda: queue.put(("eval", 0)))


def run_study(setting: Setting, cache: Path, *, optimizers: Sequence[str] = ("adamw", "sgd"), workers: int = 1,
              progress: bool = True, on_eval: Callable[[pd.DataFrame], None] | None = None) -> pd.DataFrame:
    """Every (optimizer, seed) group of ``setting``, ``workers`` processes at a time (one thread each); the
    progress bar counts steps over all groups (with an ETA). ``on_eval`` gets the rows so far after each
    evaluation of any group."""
    from multiprocessing import get_context

    from tqdm import tqdm

    groups = [(optimizer, seed) for seed in setting.seeds for optimizer in optimizers]
    done = {(o, s): _done_steps(cache, setting, o, s) for o, s in groups}
    bar = tqdm(total=setting.steps * len(groups), initial=sum(done.values()), desc=f"head-train {setting.name}",
               unit="step", disable=not progress, dynamic_ncols=True, smoothing=0.05)
    context = get_context("spawn")
    queue = context.Queue()
    gemm_verdicts = lce.planning.cpu_gemms.verdicts()
    pending = [g for g in groups if done[g] < setting.steps]
    running: list = []
    while pending or running:
        while pending and len(running) < max(1, workers):
            optimizer, seed = pending.pop(0)
            process = context.Process(target=_run_group_in_worker,
                                      args=(setting, optimizer, seed, cache, 1, queue, gemm_verdicts))
            process.start()
            running.append(process)
        try:
            kind, count = queue.get(timeout=1.0)
            if kind == "step":
                bar.update(count)
            elif on_eval is not None:
                on_eval(collect(cache, setting))
        except Exception:  # queue.Empty: look after the processes
            pass
        for process in [p for p in running if not p.is_alive()]:
            running.remove(process)
            if process.exitcode != 0:
                bar.close()
                raise RuntimeError(f"a head-train group exited with status {process.exitcode}")
    bar.close()
    table = collect(cache, setting)
    if on_eval is not None:
        on_eval(table)
    return table


def _done_steps(cache: Path, setting: Setting, optimizer: str, seed: int) -> int:
    state = _group_dir(cache, setting, optimizer, seed) / "state.pt"
    return int(torch.load(state, weights_only=False)["step"]) if state.exists() else 0


# ---- python -m analysis head-train ---------------------------------------------------------------------------

DESCRIPTION = ("Head-only training of a calibrated teacher's head for 10^4 steps per arm (AdamW: fp32, bf16 "
               "unfused, lce accurate/balanced/compact at 64, 32 and 256 chunks, fp16 balanced/compact with a loss "
               "scale; SGD: fp32, balanced, compact at 256), 3 seeds, in lockstep. Writes head_training.csv.gz "
               "(held-out loss per target-frequency bucket, distance to the fp32 head, bias/noise along the run) "
               "as it goes; resumable (analysis/cache/head_training). --quick: about a minute.")
CACHE_DIR = Path(__file__).resolve().parents[1] / "cache" / "head_training"


def add_arguments(parser) -> None:
    from analysis.core.arguments import progress_option, results_option, workers_option

    parser.add_argument("--quick", action="store_true", help="the quick setting (writes head_training_quick.csv.gz)")
    parser.add_argument("--setting", choices=sorted(SETTINGS), default=None,
                        help="a setting by name (default: full; large-batch: 4096 rows per step, issue 52; gpu: an "
                             "LLM-like head for a lent GPU)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cuda: one process on the GPU, lce's real kernels (default: cpu)")
    parser.add_argument("--budget-s", type=float, default=None, metavar="S",
                        help="stop each group at its first evaluation after S seconds (the rows so far are kept)")
    parser.add_argument("--optimizers", default=None,
                        help="groups of arms: adamw, sgd, adamw-large (the large-batch setting's), adamw-budget "
                             "(AdamW, the arms of recommend's tight-budget picks), adamw-headroom (the fp16 arms "
                             "with lce.passes.headroom), comma-separated "
                             "(default: adamw,sgd; the large-batch setting: adamw-large)")
    parser.add_argument("--cache", type=Path, default=CACHE_DIR, help="run folders (resumable state)")
    parser.add_argument("--file", default=None, metavar="NAME",
                        help="results file name (default: head_training[_quick][_cuda].csv.gz; a .csv is written "
                             "plain)")
    parser.add_argument("--bucket-bias-at-end", action="store_true",
                        help="add the per-bucket bias ratios at the last step to finished groups whose run did not "
                             "measure them along the way (then rewrite the results file)")
    workers_option(parser)
    results_option(parser)
    progress_option(parser)


def run(args) -> None:
    from analysis.core.provenance import provenance
    from analysis.core.results_io import HEAD_TRAINING, replace_rows
    from analysis.paths import display_path

    started = time.monotonic()
    setting = SETTINGS["quick" if args.quick else (args.setting or "full")]
    chosen = args.optimizers or ",".join(SETTING_GROUPS.get(setting.name, ("adamw", "sgd")))
    optimizers = tuple(name.strip() for name in chosen.split(",") if name.strip())
    unknown = [name for name in optimizers if name not in ARMS_BY_OPTIMIZER]
    if unknown or not optimizers:
        raise ValueError(f"--optimizers must name some of {sorted(ARMS_BY_OPTIMIZER)}, got {chosen!r}")
    suffix = ("_quick" if args.quick else "") + ("_cuda" if args.device == "cuda" else "")
    path = args.results / (args.file or HEAD_TRAINING_FILE.replace(".csv", f"{suffix}.csv", 1))
    args.results.mkdir(parents=True, exist_ok=True)
    stamp = provenance(args.device)

    def write(table: pd.DataFrame) -> None:
        table = table[table["optimizer"].isin(optimizers)] if not table.empty else table  # the cache holds others
        if table.empty:
            return
        threads = {"num_threads": "1"} if args.device == "cpu" else {}
        replace_rows(path, HEAD_TRAINING.rows(table.assign(**{**stamp, **threads})))

    if args.bucket_bias_at_end:
        pool = make_pool(setting)
        for optimizer in optimizers:
            for seed in setting.seeds:
                _add_bucket_bias(setting, args.cache, optimizer, seed, pool)
        write(collect(args.cache, setting))
        return
    if args.device == "cuda":  # one process, the groups in turn, each stopped at the budget
        pool = make_pool(setting, "cuda")
        deadline = None if args.budget_s is None else started + args.budget_s
        for seed in setting.seeds:
            for optimizer in optimizers:
                run_group(setting, optimizer, seed, pool, args.cache, deadline=deadline,
                          on_eval=lambda: write(collect(args.cache, setting)))
        table = collect(args.cache, setting)
        write(table)
        print(f"{display_path(path)}: {len(table)} rows, {time.monotonic() - started:.0f} s")
        return
    workers = args.workers or 1
    table = run_study(setting, args.cache, optimizers=optimizers, workers=workers, progress=not args.no_progress,
                      on_eval=write)
    print(f"{display_path(path)}: {len(table)} rows, {time.monotonic() - started:.0f} s")
