"""Head dumps: the ``(x, W, y)`` a trained model's head sees on held-out text, computed from the model.

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

import torch
import torch.nn.functional as F

from analysis.core.head_dumps import HeadDump
from analysis.lm.model import TinyLM
from analysis.lm.train import heldout_windows, position_losses

__all__ = ["DUMP_ROWS", "DUMP_WINDOWS", "compute_head_dump"]

DUMP_ROWS = 2048
"""Rows (positions) per dump."""
DUMP_WINDOWS = 256
"""Held-out windows the rows are drawn from (``DUMP_ROWS // DUMP_WINDOWS`` from each); the recorded
held-out loss is the model's mean over every position of these windows."""
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


