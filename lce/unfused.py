"""The unfused formula every path must reproduce: ``cross_entropy(linear(input, W, b), target)``.

It materializes the ``(N, C)`` logits, so it is what ``options=None`` runs,
what the chunked path falls back to, and (evaluated on fp64 upcasts of the
same rounded inputs) the exact answer the analysis measures errors against.
The features beyond torch's op (soft-capping, z-loss, the per-row
log-sum-exp) are written here in their plainest form, on the full logits.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["DEFAULT_IGNORE_INDEX", "unfused_linear_cross_entropy", "unfused_linear_log_probs"]

DEFAULT_IGNORE_INDEX = -100
"""What ``ignore_index=None`` stands for, as in ``torch.nn.functional.cross_entropy``."""


def unfused_linear_cross_entropy(
    input: torch.Tensor,
    linear_weight: torch.Tensor,
    target: torch.Tensor,
    *,
    linear_bias: torch.Tensor | None = None,
    weight: torch.Tensor | None = None,
    reduction: str = "mean",
    ignore_index: int | None = None,
    label_smoothing: float = 0.0,
    softcap: float | None = None,
    z_loss: float = 0.0,
    return_lse: bool = False,
    loss_dtype: torch.dtype | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """``cross_entropy(linear(input, linear_weight, linear_bias), target, ...)`` in the input's dtype (or
    ``loss_dtype``: the logits are converted to it first, as fp16 autocast converts them to fp32 for
    ``cross_entropy``, so the loss's gradient comes back in that dtype).

    ``linear_weight`` may be ``(C, D)`` or ``(C, d1, ..., dK, D)``; in the
    K-dimensional case the logits are reshaped to ``(N, C, d1, ..., dK)``.
    ``softcap`` replaces the logits by ``softcap * tanh(logits / softcap)``
    first; ``z_loss`` adds ``z_loss * lse**2`` per row that is not ignored
    (see :func:`lce.linear_cross_entropy`); ``return_lse`` also returns the
    per-row log-sum-exp of the (capped) logits in fp32, detached. The
    arguments are not validated here (:func:`lce.linear_cross_entropy` does).
    """
    num_classes, out_features = linear_weight.shape[0], linear_weight.shape[1:-1]
    flat_weight = linear_weight.reshape(-1, linear_weight.shape[-1])
    flat_bias = None if linear_bias is None else linear_bias.reshape(-1)
    logits = F.linear(input, flat_weight, flat_bias)
    if len(out_features):
        logits = logits.reshape(input.shape[0], num_classes, *out_features)
    if loss_dtype is not None and loss_dtype != logits.dtype:
        logits = logits.to(loss_dtype)
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    ignored = DEFAULT_IGNORE_INDEX if ignore_index is None else ignore_index
    loss = F.cross_entropy(logits, target, weight=weight, reduction=reduction, ignore_index=ignored,
                           label_smoothing=label_smoothing)
    if not z_loss and not return_lse:
        return loss
    class_dim = 0 if logits.dim() == 1 else 1
    # The log-sum-exp in at least fp32 (fp64 stays fp64): the z-loss of a bf16 call is not rounded twice.
    lse = torch.logsumexp(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=class_dim)
    if z_loss:
        loss = loss + _z_loss_term(lse, target, ignored, reduction, z_loss).to(loss.dtype)
    return (loss, lse.detach().float()) if return_lse else loss


def _z_loss_term(lse: torch.Tensor, target: torch.Tensor, ignore_index: int, reduction: str,
                 z_loss: float) -> torch.Tensor:
    """``z_loss * lse**2`` per position that is not ignored, reduced as ``reduction`` says: "mean" divides the
    sum by the number of such positions (0 when there are none), not by the class weights' sum."""
    valid = torch.ones_like(lse, dtype=torch.bool) if target.is_floating_point() else target != ignore_index
    per_row = torch.where(valid, z_loss * lse.square(), 0)
    if reduction == "none":
        return per_row
    total = per_row.sum()
    return total / valid.sum().clamp_min(1) if reduction == "mean" else total


def unfused_linear_log_probs(
    input: torch.Tensor,
    linear_weight: torch.Tensor,
    target: torch.Tensor,
    *,
    linear_bias: torch.Tensor | None = None,
    temperature: float | torch.Tensor = 1.0,
    return_entropy: bool = False,
    softcap: float | None = None,
    ignore_index: int = DEFAULT_IGNORE_INDEX,
    stats_dtype: torch.dtype | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """The materialized formula :func:`lce.linear_log_probs` must reproduce: the ``(..., C)`` logits in the input's
    dtype, converted to ``stats_dtype`` (default: at least fp32), soft-capped, divided by the temperature, then
    ``log_softmax``, the target's entry and ``-sum p log p``. Ignored tokens give 0. The arguments are not validated
    here (:func:`lce.linear_log_probs` does)."""
    logits = F.linear(input, linear_weight, linear_bias)
    logits = logits.to(stats_dtype or torch.promote_types(logits.dtype, torch.float32))
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    if isinstance(temperature, torch.Tensor):
        temperature = temperature.to(logits.dtype)
        temperature = temperature[..., None] if temperature.dim() else temperature
    logits = logits / temperature
    log_probs = torch.log_softmax(logits, dim=-1)
    valid = target != ignore_index
    picked = log_probs.gather(-1, torch.where(valid, target, 0)[..., None]).squeeze(-1)
    picked = torch.where(valid, picked, 0)
    if not return_entropy:
        return picked
    entropy = -(log_probs.exp() * log_probs).sum(-1)
    return picked, torch.where(valid, entropy, 0)
