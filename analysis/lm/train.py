"""Train :class:`~analysis.lm.model.TinyLM` on a token stream: resumable, logged, deterministic.

Determinism: a run is a function of its :class:`TrainConfig` (seed included), the token streams and
the number of intra-op threads (``torch.get_num_threads()``, recorded in the checkpoint): with the
same thread count on the same CPU and torch build, two runs give bitwise-equal weights. Every batch
is drawn from a generator seeded by ``(seed, step)`` alone and there is no dropout, so a run
resumed from a checkpoint continues exactly as an uninterrupted run would.

Resumability: ``latest.pt`` in the run folder holds the model, the optimizer and the step, rewritten
atomically every ``checkpoint_every`` steps and at the end; calling :func:`train` again on the same
folder continues from it. The steps in ``snapshot_steps`` (and the last step) also keep the model's
weights alone in ``weights-step-NNNNNN.pt``, for the head dumps.

The head's loss is pluggable: ``head_loss(hidden (N, D), weight (C, D), targets (N,)) -> scalar``;
:func:`fp32_head_loss` (the unfused fp32 formula) is the default. Held-out evaluation always uses
the fp32 formula, so runs with different head losses are compared on the same yardstick; beside the
mean it logs the mean over the held-out positions whose next token is a frequent, middle or rare class
(:mod:`analysis.core.buckets`, buckets from the class counts of the *training* stream). A head
loss in fp16 needs ``loss_scaling=True``: a dynamic loss scale (``torch.amp.GradScaler``) keeps the
small gradients of rare classes above fp16's underflow, and steps whose gradients overflow are
skipped and logged (``skipped`` column).

``device`` runs the model there (``"cuda"`` on a GPU); batches are drawn on the CPU either way, so
the data order does not depend on the device.
"""

from __future__ import annotations

import csv
import math
import os
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from analysis.core.buckets import BUCKETS, bucket_losses, class_buckets
from analysis.core.results_io import write_csv_atomically
from analysis.lm.model import ModelConfig, TinyLM

__all__ = ["HeadLoss", "fp32_head_loss", "TrainConfig", "TrainResult", "train", "heldout_windows",
           "heldout_loss", "heldout_losses", "training_buckets", "position_losses", "learning_rate", "load_snapshot",
           "LOG_COLUMNS", "BUCKET_COLUMNS"]

HeadLoss = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]

BUCKET_COLUMNS: tuple[str, ...] = tuple(f"heldout_{bucket}" for bucket in BUCKETS)
"""The per-bucket held-out losses of ``log.csv``: ``heldout_frequent``, ``heldout_middle``, ``heldout_rare``."""
LOG_COLUMNS = ("step", "learning_rate", "train_loss", "heldout_loss", "elapsed_s", "skipped", *BUCKET_COLUMNS)
"""Columns of ``log.csv`` in the run folder; the held-out ones are empty on steps without an evaluation (and the
per-bucket ones in logs written before they existed: a resumed old log keeps its rows, with those cells empty)."""


def fp32_head_loss(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of the unfused fp32 head: ``cross_entropy(hidden @ weight.T, targets)``."""
    return F.cross_entropy(F.linear(hidden.float(), weight.float()), targets)


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation settings. ``warmup_steps=None`` warms up over 5% of ``steps`` (at least 1).

    AdamW with weight decay on matrices only; the learning rate rises linearly over the warm-up,
    then follows a cosine from ``learning_rate`` down to ``min_lr_ratio * learning_rate``.
    """

    steps: int
    batch_size: int = 16
    learning_rate: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int | None = None
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0
    seed: int = 0
    eval_every: int = 100
    eval_windows: int = 16
    checkpoint_every: int = 100
    snapshot_steps: tuple[int, ...] = field(default=())

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "eval_every", "eval_windows", "checkpoint_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"TrainConfig.{name} must be positive, got {getattr(self, name)}")
        bad = [s for s in self.snapshot_steps if not 0 < s <= self.steps]
        if bad:
            raise ValueError(f"TrainConfig.snapshot_steps must lie in 1..steps={self.steps}, got {bad}")

    @property
    def warmup(self) -> int:
        return max(1, self.steps // 20) if self.warmup_steps is None else self.warmup_steps

    def as_dict(self) -> dict[str, object]:
        values = asdict(self)
        values["betas"], values["snapshot_steps"] = list(self.betas), list(self.snapshot_steps)
        return values


@dataclass(frozen=True)
class TrainResult:
    """Where a run lives and how it ended; ``elapsed_s`` sums the wall time of every session."""

    run_dir: Path
    step: int
    elapsed_s: float
    heldout_loss: float
    log_path: Path
    snapshots: dict[int, Path]


def learning_rate(config: TrainConfig, step: int) -> float:
    """The learning rate of update number ``step`` (0-based)."""
    if step < config.warmup:
        return config.learning_rate * (step + 1) / config.warmup
    progress = (step - config.warmup) / max(1, config.steps - config.warmup)
    floor = config.min_lr_ratio * config.learning_rate
    return floor + (config.learning_rate - floor) * 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))


def _batch(tokens: torch.Tensor, context: int, batch_size: int, seed: int, step: int) -> torch.Tensor:
    """``(batch_size, context + 1)`` windows at offsets drawn from a generator seeded by (seed, step)."""
    if tokens.numel() < context + 1:
        raise ValueError(f"the training stream has {tokens.numel()} tokens, fewer than context + 1 = {context + 1}")
    generator = torch.Generator().manual_seed(seed * 1_000_003 + step)
    starts = torch.randint(0, tokens.numel() - context, (batch_size,), generator=generator)
    return torch.stack([tokens[start:start + context + 1] for start in starts.tolist()])


def heldout_windows(tokens: torch.Tensor, context: int, count: int) -> torch.Tensor:
    """``count`` windows of ``context + 1`` tokens at evenly spaced offsets of the held-out stream."""
    if tokens.numel() < context + 1:
        raise ValueError(f"the held-out stream has {tokens.numel()} tokens, fewer than context + 1 = {context + 1}")
    starts = torch.linspace(0, tokens.numel() - context - 1, count).round().long()
    return torch.stack([tokens[start:start + context + 1] for start in starts.tolist()])


@torch.no_grad()
def position_losses(model: TinyLM, windows: torch.Tensor, windows_per_pass: int = 8) -> torch.Tensor:
    """``(len(windows), context)`` fp64 next-token losses (nats) of ``model`` at every position of
    ``windows`` (fp32 logits), a few windows at a time so the ``(positions, vocab)`` logits stay small."""
    losses = []
    device = next(model.parameters()).device
    for part in windows.to(device).split(windows_per_pass):
        logits = model(part[:, :-1]).double()  # (B, T, C)
        losses.append(F.cross_entropy(logits.transpose(1, 2), part[:, 1:], reduction="none"))
    return torch.cat(losses).cpu()


def heldout_loss(model: TinyLM, windows: torch.Tensor) -> float:
    """Mean next-token cross-entropy (nats) of ``model`` over every position of ``windows``."""
    return position_losses(model, windows).mean().item()


def training_buckets(train_tokens: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """``(vocab_size,)`` bucket index per class (:func:`analysis.core.buckets.class_buckets`) from how often it
    occurs in the training stream (every training token is some window's target)."""
    return class_buckets(torch.bincount(train_tokens, minlength=vocab_size))


def heldout_losses(model: TinyLM, windows: torch.Tensor, buckets: torch.Tensor) -> dict[str, float]:
    """The held-out row of ``log.csv``: ``heldout_loss`` (mean over every position of ``windows``) and
    ``heldout_<bucket>`` (mean over the positions whose next token is in that bucket of ``buckets``; NaN if none)."""
    means = bucket_losses(position_losses(model, windows).flatten(), windows[:, 1:].flatten(), buckets)
    return {"heldout_loss": means["all"], **{f"heldout_{bucket}": means[bucket] for bucket in BUCKETS}}


def _new_model(config: ModelConfig, seed: int) -> TinyLM:
    with torch.random.fork_rng(devices=[]):  # leave the caller's global RNG as it was
        torch.manual_seed(seed)
        return TinyLM(config)


def _optimizer(model: TinyLM, config: TrainConfig) -> torch.optim.AdamW:
    matrices = [p for p in model.parameters() if p.dim() >= 2]
    vectors = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": matrices, "weight_decay": config.weight_decay}, {"params": vectors, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=config.learning_rate, betas=config.betas)


def _save_atomically(payload: object, path: Path) -> None:
    partial = path.with_name(path.name + ".tmp")
    torch.save(payload, partial)
    os.replace(partial, path)


def load_snapshot(path: Path | str) -> TinyLM:
    """The model saved in a ``weights-step-NNNNNN.pt`` (or ``latest.pt``) file, in eval mode."""
    state = torch.load(path, map_location="cpu", weights_only=True)
    model = TinyLM(ModelConfig(**state["model_config"]))
    model.load_state_dict(state["model"])
    return model.eval()


def _read_log(path: Path, up_to_step: int) -> list[dict[str, str]]:
    if not path.exists():
        return []
    with open(path, newline="", encoding="utf-8") as file:
        return [row for row in csv.DictReader(file) if int(row["step"]) <= up_to_step]


def _write_log(path: Path, rows: list[dict[str, object]]) -> None:
    write_csv_atomically(path, rows, LOG_COLUMNS)


def _loss_name(head_loss: HeadLoss) -> str:
    """How a checkpoint names its head loss: ``module.qualname`` of a function, else its repr."""
    qualname = getattr(head_loss, "__qualname__", None)
    return f"{head_loss.__module__}.{qualname}" if qualname else repr(head_loss)


def train(model_config: ModelConfig, config: TrainConfig, train_tokens: torch.Tensor, heldout_tokens: torch.Tensor,
          run_dir: Path | str, head_loss: HeadLoss = fp32_head_loss, progress: bool = True,
          stop_after: int | None = None, *, loss_scaling: bool = False, device: str = "cpu") -> TrainResult:
    """Train (or resume training) a model in ``run_dir`` up to ``config.steps`` updates.

    ``train_tokens`` and ``heldout_tokens`` are 1-D int64 streams. ``stop_after`` ends this session
    after that many updates in all (a checkpoint is written), as an interruption would. Raises
    ``ValueError`` if ``run_dir`` holds a checkpoint made with another configuration or head loss
    (named by ``module.qualname``, so give each lambda-built loss its own ``run_dir``); warns when
    resuming with another thread count, as the result may then differ in the last bits.
    """
    from tqdm.auto import tqdm

    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    latest, log_path = run_dir / "latest.pt", run_dir / "log.csv"
    identity = {"model_config": model_config.as_dict(), "train_config": config.as_dict(),
                "head_loss": _loss_name(head_loss), "loss_scaling": loss_scaling}
    model = _new_model(model_config, config.seed).to(device)
    optimizer = _optimizer(model, config)
    scaler = torch.amp.GradScaler(torch.device(device).type, enabled=loss_scaling)
    step, elapsed = 0, 0.0
    if latest.exists():
        state = torch.load(latest, map_location=device, weights_only=True)
        saved = {key: state.get(key, False) for key in identity}
        if saved != identity:
            raise ValueError(f"{latest} was written by a run with another configuration ({saved}, now {identity}); "
                             "delete the folder or train in another one")
        if state["num_threads"] != torch.get_num_threads():
            warnings.warn(f"{latest} was written with {state['num_threads']} thread(s), resuming with "
                          f"{torch.get_num_threads()}: the weights may differ in the last bits from an "
                          "uninterrupted run", stacklevel=2)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        if loss_scaling:
            scaler.load_state_dict(state["scaler"])
        step, elapsed = state["step"], state["elapsed_s"]
    rows: list[dict[str, object]] = list(_read_log(log_path, step))
    windows = heldout_windows(heldout_tokens, model_config.context, config.eval_windows)
    buckets = training_buckets(train_tokens, model_config.vocab_size)
    snapshots = {s: run_dir / f"weights-step-{s:06d}.pt" for s in (*config.snapshot_steps, config.steps)}

    def checkpoint() -> None:
        _save_atomically({**identity, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                          "scaler": scaler.state_dict(), "step": step, "elapsed_s": elapsed,
                          "num_threads": torch.get_num_threads()}, latest)
        _write_log(log_path, rows)

    if step == 0 and not rows:
        rows.append({"step": 0, "learning_rate": "", "train_loss": "", **heldout_losses(model, windows, buckets),
                     "elapsed_s": 0.0, "skipped": ""})
    end = config.steps if stop_after is None else min(config.steps, stop_after)
    started = time.perf_counter() - elapsed
    bar = tqdm(total=config.steps, initial=step, desc="train", unit="step", disable=not progress, dynamic_ncols=True)
    last_heldout = "-"
    model.train()
    while step < end:
        batch = _batch(train_tokens, model_config.context, config.batch_size, config.seed, step).to(device)
        hidden = model.hidden(batch[:, :-1])
        loss = head_loss(hidden.reshape(-1, model_config.d_model), model.head.weight, batch[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)  # clip the true gradients (a no-op without loss scaling)
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        rate = learning_rate(config, step)
        for group in optimizer.param_groups:
            group["lr"] = rate
        scale_before = scaler.get_scale() if loss_scaling else 1.0
        scaler.step(optimizer)  # skipped when a gradient overflowed
        scaler.update()
        skipped = int(loss_scaling and scaler.get_scale() < scale_before)
        step += 1
        row: dict[str, object] = {"step": step, "learning_rate": rate, "train_loss": loss.item(), "heldout_loss": "",
                                  "skipped": skipped}
        if step % config.eval_every == 0 or step in snapshots:
            model.eval()
            row.update(heldout_losses(model, windows, buckets))
            model.train()
            last_heldout = f"{row['heldout_loss']:.3f}"
        elapsed = time.perf_counter() - started
        row["elapsed_s"] = elapsed
        rows.append(row)
        if step in snapshots:
            _save_atomically({"model_config": model_config.as_dict(), "model": model.state_dict(), "step": step},
                             snapshots[step])
        if step % config.checkpoint_every == 0 or step == end:
            checkpoint()
        bar.update(1)
        bar.set_postfix(loss=f"{loss.item():.3f}", heldout=last_heldout, refresh=False)
    bar.close()
    final = next((float(r["heldout_loss"]) for r in reversed(rows) if r["heldout_loss"] != ""), math.nan)
    return TrainResult(run_dir, step, elapsed, final, log_path,
                       {s: p for s, p in sorted(snapshots.items()) if p.exists()})
