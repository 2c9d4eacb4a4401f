"""``linear_log_probs``: per-token log-probabilities and entropy of ``softmax(input @ W.T + b) / T`` through the
chunked head, for RL fine-tuning (PPO, GRPO), with their gradients; argument checks and autograd wiring.

The passes are :mod:`lce.passes.logprob_passes`'s; the plan, the precision policies and the gradient products are the
loss's (:mod:`lce.planning.plan`, :mod:`lce.planning.policies`, :class:`lce.passes.gradients.GradientSums`), so every
policy, chunking and
class tiling applies, and :mod:`lce.distributed` runs the same passes on shards of the vocabulary.
"""

from __future__ import annotations

import dataclasses
import math

import torch
from torch.autograd.function import once_differentiable

from .autocasting import autocast_dtype, autocast_off, outside_autocast, take_head, taken_dtype
from .checks import require
from .compiler import graph_break
from .errors import ArgumentTypeError, ArgumentValueError, TargetIndexError
from .functional import check_features, first_out_of_range, grads_needed
from .passes.chunk import HeadTensors, Targets, pad_rows
from .passes.logprob_passes import TokenRows, token_gradients, token_statistics
from .passes.loop import GroupReduction
from .planning.options import LinearCrossEntropyOptions
from .planning.plan import Plan
from .planning.resolve import make_plan
from .unfused import DEFAULT_IGNORE_INDEX

__all__ = ["linear_log_probs", "log_probs_plan", "check_log_probs_arguments", "temperature_per_row",
           "TokenLogProbs", "TokenCall", "raise_on_bad_rows"]

_WHO = "lce.linear_log_probs"


def check_log_probs_arguments(input, linear_weight, target, linear_bias, temperature, return_entropy, softcap,
                              ignore_index, who: str = _WHO) -> None:
    """Reject bad arguments of :func:`linear_log_probs` with an error naming the argument, the value and what was
    expected (the values of a temperature tensor and the targets are checked after forward, in one host sync)."""
    for name, value in (("input", input), ("linear_weight", linear_weight), ("target", target)):
        if not isinstance(value, torch.Tensor):
            raise ArgumentTypeError(f"{who}: {name} must be a torch.Tensor, got {type(value).__name__}")
    if linear_bias is not None and not isinstance(linear_bias, torch.Tensor):
        raise ArgumentTypeError(f"{who}: linear_bias must be a torch.Tensor or None, got {type(linear_bias).__name__}")
    if input.dim() < 1 or not input.is_floating_point():
        raise ArgumentTypeError(f"{who}: input must be a floating-point tensor of shape (..., in_features), got "
                                f"{input.dtype} of shape {tuple(input.shape)}")
    if linear_weight.dim() != 2 or linear_weight.shape[1] != input.shape[-1]:
        raise ArgumentValueError(f"{who}: linear_weight must have shape (C, {input.shape[-1]}) to match input's last "
                                 f"dimension, got {tuple(linear_weight.shape)}")
    if linear_weight.shape[0] < 1:
        raise ArgumentValueError(f"{who}: linear_weight must hold at least one class, got shape "
                                 f"{tuple(linear_weight.shape)}")
    if linear_weight.dtype != input.dtype:
        raise ArgumentTypeError(f"{who}: linear_weight must have input's dtype {input.dtype}, got "
                                f"{linear_weight.dtype}")
    if linear_bias is not None:
        if tuple(linear_bias.shape) != (linear_weight.shape[0],):
            raise ArgumentValueError(f"{who}: linear_bias must have shape ({linear_weight.shape[0]},), got "
                                     f"{tuple(linear_bias.shape)}")
        if linear_bias.dtype != input.dtype:
            raise ArgumentTypeError(f"{who}: linear_bias must have input's dtype {input.dtype}, got "
                                    f"{linear_bias.dtype}")
    if target.dtype != torch.int64:
        raise ArgumentTypeError(f"{who}: target must hold int64 class indices, got {target.dtype}")
    if tuple(target.shape) != tuple(input.shape)[:-1]:
        raise ArgumentValueError(f"{who}: target must have shape {tuple(input.shape)[:-1]} (input's without "
                                 f"in_features), got {tuple(target.shape)}")
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, int):
        raise ArgumentTypeError(f"{who}: ignore_index must be an int, got {ignore_index!r}")
    if not isinstance(return_entropy, bool):
        raise ArgumentTypeError(f"{who}: return_entropy must be a bool, got {type(return_entropy).__name__}")
    check_features(softcap, 0.0, False)
    _check_temperature(temperature, target, input.device, who)
    devices = {t.device for t in (input, linear_weight, target, linear_bias) if t is not None}
    if len(devices) > 1:
        raise ArgumentValueError(f"{who}: input, linear_weight, target and linear_bias must share one device, got "
                                 f"{sorted(str(d) for d in devices)}")


def _check_temperature(temperature, target: torch.Tensor, device: torch.device, who: str) -> None:
    if isinstance(temperature, torch.Tensor):
        if not temperature.is_floating_point():
            raise ArgumentTypeError(f"{who}: temperature must be a float > 0 or a floating-point tensor, got a "
                                    f"tensor of {temperature.dtype}")
        if temperature.dim() and tuple(temperature.shape) != tuple(target.shape):
            raise ArgumentValueError(f"{who}: a temperature tensor must be 0-dim or have target's shape "
                                     f"{tuple(target.shape)} (one per token), got {tuple(temperature.shape)}")
        if temperature.requires_grad:
            raise ArgumentValueError(f"{who}: temperature receives no gradient; pass temperature.detach() (it requires "
                                     "grad)")
        if temperature.device != device:
            raise ArgumentValueError(f"{who}: temperature must be on input's device {device}, got {temperature.device}")
        return
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        raise ArgumentTypeError(f"{who}: temperature must be a float > 0 or a tensor, got {type(temperature).__name__}")
    if not (math.isfinite(temperature) and temperature > 0):
        raise ArgumentValueError(f"{who}: temperature must be a finite float > 0, got {temperature!r}")


def pad_temperature(plan: Plan, temperature: float | torch.Tensor) -> float | torch.Tensor:
    """A per-row temperature with the padded rows' (1) after it, for a batch-invariant plan's padded call."""
    return temperature if isinstance(temperature, float) else pad_rows(plan, temperature, 1.0)


def temperature_per_row(temperature: float | torch.Tensor, num_rows: int, dtype: torch.dtype) -> float | torch.Tensor:
    """A float temperature as a float; a tensor as an (N,) tensor of ``dtype`` (a 0-dim one repeated)."""
    if not isinstance(temperature, torch.Tensor):
        return float(temperature)
    return temperature.to(dtype).reshape(-1).expand(num_rows).contiguous() if temperature.dim() == 0 else \
        temperature.to(dtype).reshape(-1)


def log_probs_plan(input: torch.Tensor, linear_weight: torch.Tensor, *, linear_bias: torch.Tensor | None = None,
                   return_entropy: bool = False, softcap: float | None = None,
                   options: LinearCrossEntropyOptions | None = None, chunking_classes: int | None = None) -> Plan:
    """The :class:`~lce.planning.plan.Plan` :func:`linear_log_probs` runs for these tensors: ``print`` it for the
    chunking,
    the GEMM precisions, every buffer and the predicted peak extra memory. Under ``torch.autocast``, the plan of
    the call under it (:mod:`lce.autocasting`)."""
    options = LinearCrossEntropyOptions() if options is None else LinearCrossEntropyOptions.coerce(options)
    rows = input.reshape(-1, input.shape[-1]).shape[0]
    return make_plan(options, num_rows=rows, in_features=input.shape[-1], num_classes=linear_weight.shape[0],
                     dtype=taken_dtype(input.dtype, input.device), device=input.device, reduction="none",
                     needs_grad=grads_needed(input, linear_weight, linear_bias), softcap=softcap, op="log_probs",
                     returns_entropy=return_entropy, chunking_classes=chunking_classes,
                     autocast=autocast_dtype(input.device))


def raise_on_bad_rows(rows: TokenRows, target: torch.Tensor, num_classes: int, ignore_index: int,
                      temperature: float | torch.Tensor, who: str = _WHO) -> None:
    """After forward: targets outside ``[0, C)`` that are not ``ignore_index``, a temperature tensor with a value
    that is not a finite number > 0, and rows whose statistics are not finite (inf or NaN in the input, weight or
    bias, or logits that overflow) raise ``ValueError``, in one host synchronisation. On CUDA tensors (outside
    :func:`lce.checks.eager_checks`) the same three checks are device-side asserts, without a synchronisation
    (:mod:`lce.checks`)."""
    if not target.numel():
        return
    in_range = ((target >= 0) & (target < num_classes)) | (target == ignore_index)
    good_temperature = (torch.isfinite(temperature) & (temperature > 0) if isinstance(temperature, torch.Tensor)
                        else torch.ones_like(in_range))
    finite = torch.isfinite(rows.lse) & torch.isfinite(rows.nll)
    if rows.entropy is not None:
        finite &= torch.isfinite(rows.entropy)
    message = (f"{who}: targets in [0, {num_classes}) or ignore_index={ignore_index}, temperatures finite and > 0, "
               "finite logits (run under lce.checks.eager_checks() for which)")
    if require(torch.stack([in_range.all(), good_temperature.all(), finite.all()]), message):
        return
    bad = first_out_of_range(target, num_classes, ignore_index)
    if bad is not None:
        raise TargetIndexError(f"{who}: target values must lie in [0, {num_classes}) or equal "
                               f"ignore_index={ignore_index}, found {bad}")
    if not bool(good_temperature.all()):
        value = float(temperature[~good_temperature][0])
        raise ArgumentValueError(f"{who}: temperature must hold finite values > 0, found {value!r}")
    row = int(torch.nonzero(~finite)[0, 0])
    raise ArgumentValueError(f"{who}: the logits of row {row} (of the flattened input) are not finite: input, "
                             "linear_weight or linear_bias hold inf or NaN there, or the logits overflow")


@dataclasses.dataclass(frozen=True)
class TokenCall:
    """What one call of the op passes beside its tensors: the rows' :class:`~lce.passes.chunk.Targets`, the
    temperature
    (a float or an (N,) tensor in the stats dtype), the plan, the ``ignore_index`` (for messages), the
    :class:`~lce.passes.loop.GroupReduction` of a vocabulary sharded across processes (None on one device) and the
    name errors are raised under."""

    targets: Targets
    temperature: float | torch.Tensor
    plan: Plan
    ignore_index: int
    group: GroupReduction | None = None
    who: str = _WHO


class TokenLogProbs(torch.autograd.Function):
    """``(log p_y, H)`` per row (or ``log p_y`` alone), fp32 or wider; backward recomputes the logits chunk by
    chunk."""

    @staticmethod
    @outside_autocast
    def forward(ctx, input, weight, bias, target, call: TokenCall):
        n = input.shape[0]  # a batch-invariant plan runs whole chunks: per-row vectors padded, outputs sliced
        rows = token_statistics(call.plan, HeadTensors(input, weight, bias), call.targets, call.temperature,
                                call.group)
        raise_on_bad_rows(rows.first(n), target, call.targets.num_classes, call.ignore_index,
                          call.temperature if isinstance(call.temperature, float) else call.temperature[:n],
                          call.who)
        ctx.save_for_backward(input, weight, bias)
        ctx.call, ctx.rows = call, rows
        ctx.set_materialize_grads(False)
        valid = call.targets.valid[:n]
        log_probs = torch.where(valid, -rows.nll[:n], 0)
        if rows.entropy is None:
            return log_probs
        return log_probs, torch.where(valid, rows.entropy[:n], 0)

    @staticmethod
    @outside_autocast
    @once_differentiable
    def backward(ctx, grad_log_probs, grad_entropy=None):
        input, weight, bias = ctx.saved_tensors
        if grad_log_probs is None and grad_entropy is None:
            return None, None, None, None, None
        call = ctx.call
        grads = token_gradients(call.plan, HeadTensors(input, weight, bias), call.targets, call.temperature, ctx.rows,
                                None if grad_log_probs is None else pad_rows(call.plan, grad_log_probs, 0),
                                None if grad_entropy is None else pad_rows(call.plan, grad_entropy, 0),
                                call.group)
        return grads.input, grads.weight, grads.bias, None, None


@graph_break
def linear_log_probs(
    input: torch.Tensor,
    linear_weight: torch.Tensor,
    target: torch.Tensor,
    *,
    linear_bias: torch.Tensor | None = None,
    temperature: float | torch.Tensor = 1.0,
    return_entropy: bool = False,
    softcap: float | None = None,
    ignore_index: int = DEFAULT_IGNORE_INDEX,
    options: LinearCrossEntropyOptions | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Per-token ``log p(target)`` under ``softmax(logits / temperature)``, and optionally the entropy of that
    distribution, with ``logits = input @ linear_weight.T + linear_bias``, never forming the ``(N, C)`` logits.

    For RL fine-tuning (PPO, GRPO): the log-probabilities of sampled tokens under the policy, and an entropy
    bonus, through the vocabulary head. Both outputs are differentiable (the entropy's gradient is
    ``-p (log p + H) / T`` per logit) and computed with at least fp32 statistics, as sums of terms of one sign,
    so a confident token keeps fp32's relative precision (:mod:`lce.passes.logprob_passes`).

    Args:
        input: ``(..., D)`` hidden states, floating point (``(B, T, D)`` is fine).
        linear_weight: ``(C, D)``, input's dtype.
        target: int64 token ids of shape ``input.shape[:-1]``.
        linear_bias: ``(C,)``, input's dtype, or None.
        temperature: a finite float > 0, or a tensor of target's shape (one per token) or 0-dim; it receives no
            gradient. The logits are divided by it after the soft cap, as a sampler does.
        return_entropy: also return the entropy ``-sum_c p_c log p_c`` of each token's distribution.
        softcap: ``None``, or a finite float > 0: logits become ``softcap * tanh(logits / softcap)`` first.
        ignore_index: target value whose token gets 0 for both outputs and no gradient.
        options: :class:`~lce.LinearCrossEntropyOptions` (lce's or torch's): policy, ``acc_dtype``, chunking and
            class tiling, as for the loss. ``None`` means the default options (``"auto"``); unlike
            :func:`lce.linear_cross_entropy`, ``None`` does not select a materialized formula (that is
            :func:`lce.unfused.unfused_linear_log_probs`).

    Returns:
        ``log_probs`` of target's shape, fp32 (fp64 for fp64 input); with ``return_entropy``, the pair
        ``(log_probs, entropy)``.

    Raises:
        ValueError / TypeError naming the argument for bad shapes, dtypes, a temperature <= 0 or not finite, targets
        out of range, and inputs whose logits are not finite (checked after forward, one host synchronisation; on
        CUDA a device-side assert instead, without one, unless under :func:`lce.checks.eager_checks`).

    Under ``torch.autocast`` the head's fp32/bf16/fp16 tensors are taken in autocast's dtype (as ``linear`` would
    take them) and everything after runs with autocast off, as the plan says (:mod:`lce.autocasting`): the
    outputs are those of the same call outside autocast on the cast tensors, bit for bit.

    Under ``torch.compile`` the call is a graph break (the chunk loop runs eagerly, as the loss's does); the rest of
    a compiled model compiles around it.
    """
    input, linear_weight, linear_bias = take_head(_WHO, input, linear_weight, linear_bias)
    check_log_probs_arguments(input, linear_weight, target, linear_bias, temperature, return_entropy, softcap,
                              ignore_index)
    plan = log_probs_plan(input, linear_weight, linear_bias=linear_bias, return_entropy=return_entropy,
                          softcap=None if softcap is None else float(softcap), options=options)
    flat_input, flat_target = input.reshape(-1, input.shape[-1]), target.reshape(-1)
    with autocast_off(input.device):  # the plan decides every precision from here on (lce.autocasting)
        targets = Targets.build(pad_rows(plan, flat_target, ignore_index), class_weight=None,
                                ignore_index=ignore_index, label_smoothing=0.0, num_classes=plan.num_classes,
                                stats_dtype=plan.stats_dtype)
        per_row = pad_temperature(plan, temperature_per_row(temperature, flat_target.shape[0], plan.stats_dtype))
        out = TokenLogProbs.apply(flat_input, linear_weight, linear_bias, flat_target,
                                  TokenCall(targets, per_row, plan, ignore_index))
    if not return_entropy:
        return out.reshape(target.shape)
    log_probs, entropy = out
    return log_probs.reshape(target.shape), entropy.reshape(target.shape)
