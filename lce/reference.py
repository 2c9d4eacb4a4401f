"""The unfused formula every path must reproduce: ``cross_entropy(linear(input, W, b), target)``.

It materializes the ``(N, C)`` logits, so it is what ``options=None`` runs,
what the chunked path falls back to, and (evaluated on fp64 upcasts of the
same rounded inputs) the exact answer the analysis measures errors against.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["DEFAULT_IGNORE_INDEX", "reference_linear_cross_entropy"]

DEFAULT_IGNORE_INDEX = -100
"""What ``ignore_index=None`` stands for, as in ``torch.nn.functional.cross_entropy``."""


def reference_linear_cross_entropy(
    input: torch.Tensor,
    linear_weight: torch.Tensor,
    target: torch.Tensor,
    *,
    linear_bias: torch.Tensor | None = None,
    weight: torch.Tensor | None = None,
    reduction: str = "mean",
    ignore_index: int | None = None,
    label_smoothing: float = 0.0,
) -> torch.Tensor:
    """``cross_entropy(linear(input, linear_weight, linear_bias), target, ...)`` in the input's dtype.

    ``linear_weight`` may be ``(C, D)`` or ``(C, d1, ..., dK, D)``; in the
    K-dimensional case the logits are reshaped to ``(N, C, d1, ..., dK)``. The
    arguments are not validated here (:func:`lce.linear_cross_entropy` does).
    """
    num_classes, out_features = linear_weight.shape[0], linear_weight.shape[1:-1]
    flat_weight = linear_weight.reshape(-1, linear_weight.shape[-1])
    flat_bias = None if linear_bias is None else linear_bias.reshape(-1)
    logits = F.linear(input, flat_weight, flat_bias)
    if len(out_features):
        logits = logits.reshape(input.shape[0], num_classes, *out_features)
    return F.cross_entropy(
        logits, target, weight=weight, reduction=reduction,
        ignore_index=DEFAULT_IGNORE_INDEX if ignore_index is None else ignore_index,
        label_smoothing=label_smoothing,
    )
