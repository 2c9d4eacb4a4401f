"""``LinearCrossEntropyLoss``: a module holding the linear head, over :func:`lce.linear_cross_entropy`."""

from __future__ import annotations

import math

import torch
from torch import nn

from .functional import check_class_weight, check_features, check_settings, linear_cross_entropy
from .planning.options import LinearCrossEntropyOptions

__all__ = ["LinearCrossEntropyLoss"]


class LinearCrossEntropyLoss(nn.Module):
    """Cross-entropy of a learnable linear head's logits; torch 2.13's constructor and forward.

    The head is ``self.linear``, an ``nn.Linear(in_features, C * prod(out_features))``
    whose weight is viewed as ``(C, *out_features, in_features)`` in forward.
    ``weight`` (per-class) is a buffer. See :func:`lce.linear_cross_entropy`
    for the loss, ``options`` and lce's own keywords ``softcap``, ``z_loss``,
    ``return_lse`` (with it, forward returns ``(loss, lse)``) and ``loss_dtype``
    (the dtype the loss is returned in; fp32 lets a 2^16 fp16 loss scale through).
    """

    def __init__(
        self,
        in_features: int,
        num_classes: int,
        *,
        out_features: tuple[int, ...] = (),
        bias: bool = False,
        device=None,
        dtype=None,
        reduction: str = "mean",
        weight: torch.Tensor | None = None,
        ignore_index: int | None = None,
        label_smoothing: float = 0.0,
        options: LinearCrossEntropyOptions | None = None,
        softcap: float | None = None,
        z_loss: float = 0.0,
        return_lse: bool = False,
        loss_dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        # the function's own checks, now rather than at the first forward (the dtypes are checked there)
        check_settings(reduction, ignore_index, label_smoothing)
        check_features(softcap, z_loss, return_lse, loss_dtype)
        check_class_weight(weight, num_classes)
        self.num_classes = num_classes
        self.out_features = tuple(out_features)
        self.reduction = reduction
        self.ignore_index = ignore_index
        self.label_smoothing = label_smoothing
        self.options = None if options is None else LinearCrossEntropyOptions.coerce(options)
        self.softcap = None if softcap is None else float(softcap)
        self.z_loss = float(z_loss)
        self.return_lse = return_lse
        self.loss_dtype = loss_dtype
        self.register_buffer("weight", weight)
        self.linear = nn.Linear(in_features, math.prod(self.out_features, start=num_classes), bias=bias,
                                device=device, dtype=dtype)

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        head_shape = (self.num_classes, *self.out_features)
        bias = self.linear.bias
        return linear_cross_entropy(
            input,
            self.linear.weight.reshape(*head_shape, self.linear.in_features),
            target,
            linear_bias=None if bias is None else bias.reshape(head_shape),
            weight=self.weight,
            reduction=self.reduction,
            ignore_index=self.ignore_index,
            label_smoothing=self.label_smoothing,
            options=self.options,
            softcap=self.softcap,
            z_loss=self.z_loss,
            return_lse=self.return_lse,
            loss_dtype=self.loss_dtype,
        )

    def extra_repr(self) -> str:
        features = "".join([f", softcap={self.softcap:g}" if self.softcap is not None else "",
                            f", z_loss={self.z_loss:g}" if self.z_loss else "",
                            ", return_lse=True" if self.return_lse else "",
                            f", loss_dtype={self.loss_dtype}" if self.loss_dtype is not None else ""])
        return (f"num_classes={self.num_classes}, out_features={self.out_features}, "
                f"reduction={self.reduction!r}, options={self.options}{features}")
