"""Head dumps: the ``(x, W, y)`` a trained model's head sees on held-out text, saved and loaded.

A dump holds, for one checkpoint of the model,

* ``x``: ``(rows, d_model)`` fp32, the final-normed hidden states the head reads;
* ``weight``: ``(vocab_size, d_model)`` fp32, the head weight ``W`` (no bias);
* ``target``: ``(rows,)`` int64, the next token after each position,

so ``cross_entropy(x @ weight.T, target)`` is the model's own loss on those positions. Positions
come from ``windows`` evenly spaced held-out windows of ``context + 1`` tokens, the same number of
positions from each window, drawn without replacement by a seeded generator. Each dump is a
``head-<checkpoint>.npz`` with a ``head-<checkpoint>.json`` beside it (provenance, step, losses).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ..paths import LM_DATA_DIR, display_path
from .model import TinyLM
from .train import heldout_windows, position_losses

__all__ = ["HeadDump", "DUMP_ROWS", "DUMP_WINDOWS", "MAKE_COMMAND", "compute_head_dump", "save_head_dump",
           "load_head_dump", "available_checkpoints"]

DUMP_ROWS = 2048
"""Rows (positions) per dump."""
DUMP_WINDOWS = 256
"""Held-out windows the rows are drawn from (``DUMP_ROWS // DUMP_WINDOWS`` from each); the recorded
held-out loss is the model's mean over every position of these windows."""
MAKE_COMMAND = "python -m analysis lm"
"""The command that writes the committed dumps."""


@dataclass(frozen=True)
class HeadDump:
    """One checkpoint's head inputs: ``x`` (N, D) fp32, ``weight`` (C, D) fp32, ``target`` (N,) int64,
    all CPU tensors, and ``meta`` (the JSON metadata: provenance, step, losses)."""

    x: torch.Tensor
    weight: torch.Tensor
    target: torch.Tensor
    meta: dict


@torch.no_grad()
def compute_head_dump(model: TinyLM, heldout_tokens: torch.Tensor, rows: int = DUMP_ROWS,
                      windows: int = DUMP_WINDOWS, seed: int = 0) -> HeadDump:
    """The dump of ``model`` on ``heldout_tokens`` (1-D int64); ``rows`` must be a multiple of
    ``windows`` and at most ``windows * context``.

    ``meta`` holds, in nats: ``heldout_loss``, the model's mean loss over every position of the
    windows; ``model_loss_at_rows``, its mean over the dumped positions, from the model's own forward
    pass; ``dump_loss``, ``cross_entropy(x @ weight.T, target)`` in fp64 from the dumped tensors; and
    ``rows_standard_error``, the standard error of a mean over ``rows`` positions drawn from the
    windows (per-position standard deviation / sqrt(rows), with the finite-population factor), which
    says how far ``dump_loss`` may stray from ``heldout_loss`` by sampling alone.
    """
    context = model.config.context
    if rows % windows or rows > windows * context:
        raise ValueError(f"rows={rows} must be a multiple of windows={windows} and at most windows * context "
                         f"= {windows * context}")
    model = model.eval()
    tokens = heldout_windows(heldout_tokens, context, windows)
    generator = torch.Generator().manual_seed(seed)
    per_window = rows // windows
    positions = torch.stack([torch.randperm(context, generator=generator)[:per_window].sort().values
                             for _ in range(windows)])  # (windows, per_window)
    hidden = torch.cat([model.hidden(part[:, :-1]) for part in tokens.split(8)])  # (windows, context, D)
    x = hidden.gather(1, positions.unsqueeze(-1).expand(-1, -1, hidden.shape[-1])).reshape(rows, -1)
    target = tokens[:, 1:].gather(1, positions).reshape(rows)
    weight = model.head.weight.detach().clone()
    losses = position_losses(model, tokens)  # (windows, context)
    population = losses.numel()
    standard_error = losses.std().item() / rows**0.5 * ((population - rows) / (population - 1)) ** 0.5
    meta = {"rows": rows, "windows": windows, "position_seed": seed, "heldout_positions": population,
            "heldout_loss": losses.mean().item(), "model_loss_at_rows": losses.gather(1, positions).mean().item(),
            "dump_loss": F.cross_entropy(F.linear(x.double(), weight.double()), target).item(),
            "rows_standard_error": standard_error}
    return HeadDump(x.float().contiguous(), weight.float().contiguous(), target.to(torch.int64), meta)


def _paths(folder: Path, checkpoint: str) -> tuple[Path, Path]:
    return folder / f"head-{checkpoint}.npz", folder / f"head-{checkpoint}.json"


def save_head_dump(dump: HeadDump, checkpoint: str, folder: Path | str = LM_DATA_DIR) -> tuple[Path, Path]:
    """Write ``head-<checkpoint>.npz`` and ``head-<checkpoint>.json`` into ``folder``; returns both paths."""
    if not checkpoint or not checkpoint.replace("-", "").replace("_", "").isalnum():
        raise ValueError(f"checkpoint name must be letters, digits, '-' or '_', got {checkpoint!r}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    arrays, meta = _paths(folder, checkpoint)
    with open(arrays.with_name(arrays.name + ".tmp"), "wb") as file:
        np.savez(file, x=dump.x.numpy(), weight=dump.weight.numpy(), target=dump.target.numpy())
    os.replace(arrays.with_name(arrays.name + ".tmp"), arrays)
    meta.with_name(meta.name + ".tmp").write_text(json.dumps(dump.meta, indent=2, sort_keys=True) + "\n",
                                                  encoding="utf-8")
    os.replace(meta.with_name(meta.name + ".tmp"), meta)
    return arrays, meta


def available_checkpoints(folder: Path | str = LM_DATA_DIR) -> list[str]:
    """The checkpoint names with both files in ``folder``, ordered by training step."""
    folder = Path(folder)
    names = [path.name[len("head-"):-len(".npz")] for path in folder.glob("head-*.npz")
             if _paths(folder, path.name[len("head-"):-len(".npz")])[1].exists()]
    steps = {name: json.loads(_paths(folder, name)[1].read_text(encoding="utf-8")).get("step", 0) for name in names}
    return sorted(names, key=lambda name: (steps[name], name))


def load_head_dump(checkpoint: str = "final", folder: Path | str = LM_DATA_DIR) -> HeadDump:
    """The dump of ``checkpoint`` (``"early"``, ``"final"``, ...) from ``folder``.

    Raises ``FileNotFoundError`` naming the available checkpoints and the command that writes them
    when the dump is missing.
    """
    folder = Path(folder)
    arrays, meta = _paths(folder, checkpoint)
    if not (arrays.exists() and meta.exists()):
        have = available_checkpoints(folder) if folder.is_dir() else []
        raise FileNotFoundError(
            f"no head dump {checkpoint!r} in {display_path(folder)} (available: {', '.join(have) or 'none'}); "
            f"`{MAKE_COMMAND}` trains the model and writes the dumps (about 15 minutes on 2 cores)")
    with np.load(arrays) as data:
        x, weight, target = (torch.from_numpy(data[name].copy()) for name in ("x", "weight", "target"))
    return HeadDump(x, weight, target, json.loads(meta.read_text(encoding="utf-8")))
