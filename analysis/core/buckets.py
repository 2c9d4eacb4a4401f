"""Target-frequency buckets: which classes are frequent, middle or rare, from how often they are targets.

A bucket is defined by its share of the target *occurrences*, not by a fixed count, so the same
definition works for a 65k-row synthetic pool and a 9M-token corpus: rank the classes by their count
in the training data (most frequent first, ties by class index); the **frequent** classes are the
first ones whose targets make up :data:`FREQUENT_SHARE` of all targets, the **rare** ones the last
whose targets make up :data:`RARE_SHARE` (classes never seen in training included), the **middle**
ones the rest. Each bucket then holds a known share of the held-out rows (about 50%, 40% and 10%),
so a per-bucket held-out loss always averages enough rows; the count edges that result are reported
(:func:`bucket_edges`) beside every per-bucket number.
"""

from __future__ import annotations

import torch

__all__ = ["BUCKETS", "FREQUENT_SHARE", "RARE_SHARE", "class_buckets", "bucket_edges", "bucket_losses"]

BUCKETS: tuple[str, ...] = ("frequent", "middle", "rare")
FREQUENT_SHARE = 0.5
RARE_SHARE = 0.1


def class_buckets(counts: torch.Tensor) -> torch.Tensor:
    """``(C,)`` int64 bucket index per class (0 frequent, 1 middle, 2 rare) from its ``(C,)`` training counts."""
    if counts.dim() != 1 or counts.numel() == 0:
        raise ValueError(f"counts must be a non-empty 1-D tensor of per-class counts, got shape {tuple(counts.shape)}")
    if bool((counts < 0).any()) or float(counts.sum()) <= 0:
        raise ValueError("counts must be non-negative with a positive total")
    counts = counts.double()
    # most frequent first; a stable sort keeps ties in class order, so the buckets are the same on every machine
    order = torch.sort(-counts, stable=True).indices
    share_before = (torch.cumsum(counts[order], 0) - counts[order]) / counts.sum()
    bucket_sorted = torch.ones_like(order)
    bucket_sorted[share_before < FREQUENT_SHARE] = 0
    bucket_sorted[share_before >= 1.0 - RARE_SHARE] = 2
    buckets = torch.empty_like(order)
    buckets[order] = bucket_sorted
    return buckets


def bucket_edges(counts: torch.Tensor, buckets: torch.Tensor) -> dict[str, dict[str, float]]:
    """Per bucket: how many classes, the smallest and largest training count, and the share of targets."""
    total = float(counts.sum())
    edges = {}
    for index, name in enumerate(BUCKETS):
        chosen = counts[buckets == index]
        edges[name] = {"classes": int(chosen.numel()),
                       "min_count": float(chosen.min()) if chosen.numel() else float("nan"),
                       "max_count": float(chosen.max()) if chosen.numel() else float("nan"),
                       "target_share": float(chosen.sum()) / total}
    return edges


def bucket_losses(losses: torch.Tensor, targets: torch.Tensor, buckets: torch.Tensor) -> dict[str, float]:
    """Mean of per-row ``losses`` overall and over the rows whose target is in each bucket (NaN for an empty one)."""
    if losses.shape != targets.shape:
        raise ValueError(f"losses and targets must have the same shape, got {tuple(losses.shape)} and "
                         f"{tuple(targets.shape)}")
    row_bucket = buckets[targets]
    means = {"all": float(losses.double().mean())}
    for index, name in enumerate(BUCKETS):
        chosen = losses[row_bucket == index]
        means[name] = float(chosen.double().mean()) if chosen.numel() else float("nan")
    return means
