"""``linear_cross_entropy``: argument checks, the reference path, fallbacks, dispatch."""

from __future__ import annotations

import math
import warnings

import torch

from .autocasting import autocast_dtype, autocast_off, loss_dtype_under, take_head, taken_dtype
from .autograd import PerRowLoss, ScalarReductionLoss
from .checks import require
from .compiler import graph_break
from .errors import ArgumentTypeError, ArgumentValueError, TargetIndexError, TargetKindError
from .planning.options import LinearCrossEntropyOptions
from .planning.plan import Plan
from .planning.resolve import make_plan
from .unfused import DEFAULT_IGNORE_INDEX, unfused_linear_cross_entropy

__all__ = ["linear_cross_entropy", "plan", "check_arguments", "check_settings", "check_class_weight", "check_features",
           "check_materialized_dtypes", "first_out_of_range", "grads_needed"]

REDUCTIONS = ("mean", "sum", "none")


def _shape(t: torch.Tensor) -> tuple[int, ...]:
    return tuple(t.shape)


def check_arguments(input, linear_weight, target, linear_bias, weight, reduction, ignore_index,
                    label_smoothing) -> bool:
    """Reject bad arguments of :func:`linear_cross_entropy` with an error naming the argument; return whether
    ``target`` holds probabilities."""
    for name, value in (("input", input), ("linear_weight", linear_weight), ("target", target)):
        if not isinstance(value, torch.Tensor):
            raise ArgumentTypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    for name, value in (("linear_bias", linear_bias), ("weight", weight)):
        _check_tensor_or_none(name, value)
    if input.dim() not in (1, 2):
        raise ArgumentValueError(f"input must have shape (in_features,) or (N, in_features), got shape {_shape(input)}")
    if not input.is_floating_point():
        raise ArgumentTypeError(f"input must be a floating-point tensor, got dtype {input.dtype}")
    if linear_weight.dim() < 2:
        raise ArgumentValueError(
            f"linear_weight must have shape (C, in_features) or (C, d1, ..., dK, in_features), "
            f"got shape {_shape(linear_weight)}"
        )
    in_features = input.shape[-1]
    if linear_weight.shape[-1] != in_features:
        raise ArgumentValueError(
            f"linear_weight's last dimension must equal input's in_features={in_features}, "
            f"got linear_weight of shape {_shape(linear_weight)}"
        )
    if linear_weight.dtype != input.dtype:
        raise ArgumentTypeError(f"linear_weight must have input's dtype {input.dtype}, got {linear_weight.dtype}")
    num_classes = linear_weight.shape[0]
    out_features = _shape(linear_weight)[1:-1]
    if out_features and input.dim() != 2:
        raise ArgumentValueError(
            f"a K-dimensional linear_weight {_shape(linear_weight)} needs input of shape (N, {in_features}), "
            f"got input of shape {_shape(input)}"
        )
    logits_shape = (*_shape(input)[:-1], num_classes, *out_features)
    if linear_bias is not None:
        if _shape(linear_bias) != (num_classes, *out_features):
            raise ArgumentValueError(
                f"linear_bias must have shape {(num_classes, *out_features)}, got {_shape(linear_bias)}"
            )
        if linear_bias.dtype != input.dtype:
            raise ArgumentTypeError(f"linear_bias must have input's dtype {input.dtype}, got {linear_bias.dtype}")
    check_class_weight(weight, num_classes)
    check_settings(reduction, ignore_index, label_smoothing)
    devices = {t.device for t in (input, linear_weight, target, linear_bias, weight) if t is not None}
    if len(devices) > 1:
        raise ArgumentValueError(f"input, linear_weight, target, linear_bias and weight must share one device, "
                                 f"got {sorted(str(d) for d in devices)}")

    class_index_shape = (*_shape(input)[:-1], *out_features)
    if target.is_floating_point():
        if _shape(target) != logits_shape:
            raise TargetKindError(
                f"target must be int64 class indices of shape {class_index_shape}, or class probabilities "
                f"of the logits' shape {logits_shape}; got a {target.dtype} target of shape {_shape(target)}"
            )
        if ignore_index is not None:
            raise ArgumentValueError("ignore_index must be None when target holds class probabilities")
        return True
    if target.dtype != torch.int64:
        raise ArgumentTypeError(f"target (class indices) must have dtype torch.int64, got {target.dtype}")
    if _shape(target) != class_index_shape:
        raise ArgumentValueError(f"target must have shape {class_index_shape} to match input {_shape(input)}, "
                                 f"got {_shape(target)}")
    ignored = DEFAULT_IGNORE_INDEX if ignore_index is None else ignore_index
    bad = first_out_of_range(target, num_classes, ignored)
    if bad is not None:
        raise TargetIndexError(f"target values must lie in [0, {num_classes}) or equal ignore_index={ignored}, "
                               f"found {bad}")
    return False


def _check_tensor_or_none(name: str, value) -> None:
    if value is not None and not isinstance(value, torch.Tensor):
        raise ArgumentTypeError(f"{name} must be a torch.Tensor or None, got {type(value).__name__}")


def check_class_weight(weight: torch.Tensor | None, num_classes: int, dtype: torch.dtype | None = None) -> None:
    """The per-class ``weight``: None, or a floating-point (C,) tensor (of ``dtype``, where one is required: the
    materialized formula's ``cross_entropy`` takes it in the logits' dtype; the chunked passes read it in their fp32
    statistics, whatever its dtype)."""
    _check_tensor_or_none("weight", weight)
    if weight is None:
        return
    if _shape(weight) != (num_classes,):
        raise ArgumentValueError(f"weight (per-class) must have shape ({num_classes},), got {_shape(weight)}")
    if not weight.is_floating_point():
        raise ArgumentTypeError(f"weight (per-class) must be a floating-point tensor, got {weight.dtype}")
    if dtype is not None and weight.dtype != dtype:
        raise ArgumentTypeError(f"weight (per-class) must have input's dtype {dtype}, got {weight.dtype}")


def check_settings(reduction: str, ignore_index: int | None = None, label_smoothing: float = 0.0) -> None:
    """Reject bad values of the arguments that are not tensors (torch's op's), naming the argument."""
    if reduction not in REDUCTIONS:
        raise ArgumentValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
    if not isinstance(label_smoothing, (int, float)) or not 0.0 <= label_smoothing <= 1.0:
        raise ArgumentValueError(f"label_smoothing must be a float in [0, 1], got {label_smoothing!r}")
    if ignore_index is not None and (isinstance(ignore_index, bool) or not isinstance(ignore_index, int)):
        raise ArgumentTypeError(f"ignore_index must be an int or None, got {ignore_index!r}")


def first_out_of_range(target: torch.Tensor, num_classes: int, ignore_index: int) -> int | None:
    """The first int64 target outside ``[0, num_classes)`` that is not ``ignore_index``, or None if there is none.

    On CUDA (outside :func:`lce.checks.eager_checks`) the check is a device-side assert, without a host
    synchronisation (:mod:`lce.checks`), and this returns None."""
    if not target.numel():
        return None
    in_range = ((target >= 0) & (target < num_classes)) | (target == ignore_index)
    if require(in_range, f"lce: target values must lie in [0, {num_classes}) or equal ignore_index={ignore_index}"):
        return None
    return int(target[~in_range].flatten()[0])


LOSS_DTYPES: tuple[torch.dtype, ...] = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def check_features(softcap: float | None, z_loss: float, return_lse: bool,
                   loss_dtype: torch.dtype | None = None) -> None:
    """Reject bad values of lce's features beyond torch's op, naming the argument."""
    number = (int, float)
    if softcap is not None:
        if isinstance(softcap, bool) or not isinstance(softcap, number):
            raise ArgumentTypeError(f"softcap must be a float > 0 or None, got {type(softcap).__name__}")
        if not (math.isfinite(softcap) and softcap > 0):
            raise ArgumentValueError(f"softcap must be a finite float > 0 or None, got {softcap!r}")
    if isinstance(z_loss, bool) or not isinstance(z_loss, number):
        raise ArgumentTypeError(f"z_loss must be a float >= 0, got {type(z_loss).__name__}")
    if not (math.isfinite(z_loss) and z_loss >= 0):
        raise ArgumentValueError(f"z_loss must be a finite float >= 0, got {z_loss!r}")
    if not isinstance(return_lse, bool):
        raise ArgumentTypeError(f"return_lse must be a bool, got {type(return_lse).__name__}")
    if loss_dtype is not None and loss_dtype not in LOSS_DTYPES:
        raise ArgumentValueError(f"loss_dtype must be None or one of {[str(d) for d in LOSS_DTYPES]}, got "
                                 f"{loss_dtype!r}")


def _fallback_reason(linear_weight: torch.Tensor, target_is_probabilities: bool) -> str | None:
    if linear_weight.dim() > 2:
        return f"a K-dimensional linear_weight of shape {_shape(linear_weight)} (chunking supports (C, D))"
    if target_is_probabilities:
        return "class-probability targets (chunking supports int64 class indices)"
    if torch.jit.is_tracing():
        return "torch.jit tracing"
    return None


def grads_needed(input: torch.Tensor, linear_weight: torch.Tensor,
                 linear_bias: torch.Tensor | None) -> tuple[bool, bool, bool]:
    """Which of (input, linear_weight, linear_bias) need a gradient: those that require grad, under grad mode."""
    if not torch.is_grad_enabled():
        return (False, False, False)
    return (input.requires_grad, linear_weight.requires_grad,
            linear_bias is not None and linear_bias.requires_grad)


def plan(input: torch.Tensor, linear_weight: torch.Tensor, *extra, options: LinearCrossEntropyOptions | None = None,
         linear_bias: torch.Tensor | None = None, reduction: str = "mean", softcap: float | None = None,
         z_loss: float = 0.0, return_lse: bool = False, loss_dtype: torch.dtype | None = None) -> Plan:
    """The resolved :class:`~lce.planning.plan.Plan` that :func:`linear_cross_entropy` with these tensors and
    ``options``
    would run on its chunked path: tensors first, as the op takes them; ``options=None`` means the default options.

    Gradients are planned for the tensors that require grad (under grad mode).
    ``print(lce.plan(x, W, options=...))`` shows chunking, GEMM precisions, every buffer and
    the predicted peak extra memory. Under ``torch.autocast`` it is the plan of the call under it: the head's
    tensors taken in autocast's dtype, the loss in fp32 (:mod:`lce.autocasting`).
    """
    if extra:  # the older order lce.plan(options, x, W), or a stray positional argument
        raise ArgumentTypeError("lce.plan takes (input, linear_weight) and keywords: lce.plan(x, W, options=..., "
                                f"linear_bias=..., ...); got {2 + len(extra)} positional arguments")
    for name, value in (("input", input), ("linear_weight", linear_weight)):
        if not isinstance(value, torch.Tensor):
            raise ArgumentTypeError(f"lce.plan: {name} must be a torch.Tensor, got {type(value).__name__} (lce.plan "
                                    "takes the op's tensors first: lce.plan(x, W, options=...))")
    options = LinearCrossEntropyOptions() if options is None else LinearCrossEntropyOptions.coerce(options)
    check_features(softcap, z_loss, return_lse, loss_dtype)
    if input.dim() not in (1, 2) or linear_weight.dim() != 2:
        raise ArgumentValueError(f"plan needs input (N, D) or (D,) and linear_weight (C, D), got {_shape(input)} "
                                 f"and {_shape(linear_weight)}")
    check_settings(reduction)
    dtype = taken_dtype(input.dtype, input.device)
    loss_dtype = loss_dtype_under(loss_dtype, input)
    return make_plan(
        options,
        num_rows=input.shape[0] if input.dim() == 2 else 1,
        in_features=input.shape[-1],
        num_classes=linear_weight.shape[0],
        dtype=dtype,
        device=input.device,
        reduction=reduction,
        needs_grad=grads_needed(input, linear_weight, linear_bias),
        softcap=softcap,
        z_loss=z_loss,
        return_lse=return_lse,
        loss_dtype=None if loss_dtype == dtype else loss_dtype,
        autocast=autocast_dtype(input.device),
    )


@graph_break
def _chunked(input, linear_weight, target, linear_bias, weight, reduction, ignore_index, label_smoothing,
             options: LinearCrossEntropyOptions, features: dict):
    unbatched = input.dim() == 1
    if unbatched:
        input, target = input.unsqueeze(0), target.reshape(1)
    resolved = plan(input, linear_weight, options=options, linear_bias=linear_bias, reduction=reduction,
                    **features)
    function = PerRowLoss if reduction == "none" else ScalarReductionLoss
    with autocast_off(input.device):  # the plan decides every precision from here on (lce.autocasting)
        out = function.apply(input, linear_weight, linear_bias, target, weight, ignore_index, label_smoothing,
                             resolved)
    loss, lse = out if resolved.return_lse else (out, None)
    if unbatched:
        loss = loss.squeeze(0) if reduction == "none" else loss
        lse = None if lse is None else lse.squeeze(0)
    return loss if lse is None else (loss, lse)


def linear_cross_entropy(
    input: torch.Tensor,
    linear_weight: torch.Tensor,
    target: torch.Tensor,
    *,
    linear_bias: torch.Tensor | None = None,
    weight: torch.Tensor | None = None,
    reduction: str = "mean",
    ignore_index: int | None = None,
    label_smoothing: float = 0.0,
    options: LinearCrossEntropyOptions | None = None,
    softcap: float | None = None,
    z_loss: float = 0.0,
    return_lse: bool = False,
    loss_dtype: torch.dtype | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Cross-entropy of ``input @ linear_weight.T + linear_bias`` against ``target``.

    A drop-in for ``torch.nn.functional.linear_cross_entropy`` (torch 2.13):
    the result equals ``cross_entropy(linear(input, linear_weight,
    linear_bias), target, weight=weight, reduction=reduction,
    ignore_index=-100 if ignore_index is None else ignore_index,
    label_smoothing=label_smoothing)``.

    Args:
        input: ``(N, D)`` or ``(D,)``, floating point.
        linear_weight: ``(C, D)``, or ``(C, d1, ..., dK, D)`` for a K-dimensional
            loss (reference path only), same dtype as ``input``.
        target: int64 class indices of shape ``(N,)`` (``()`` for 1-D input,
            ``(N, d1, ..., dK)`` for K-dimensional weights), or class
            probabilities of the logits' shape (reference path only).
        linear_bias: ``(C,)`` (or ``(C, d1, ..., dK)``), same dtype as ``input``.
        weight: per-class rescaling weights ``(C,)``, floating point: on the chunked path any dtype (read in the
            fp32 statistics), on the materialized one ``input``'s dtype (any under autocast).
        reduction: ``"mean"`` (weighted by ``weight[target]``), ``"sum"`` or ``"none"``.
        ignore_index: target value that contributes neither loss nor gradient;
            ``None`` means -100. May lie inside or outside ``[0, C)``.
        label_smoothing: in ``[0, 1]``; supported on the chunked path too.
        options: ``None`` for the reference formula (materializes ``(N, C)``
            logits), or :class:`LinearCrossEntropyOptions` (lce's or torch's)
            for the chunked path, whose peak extra memory is one chunk of
            logits plus, per the policy, a ``(C, D)`` accumulator. Configurations
            chunking does not cover run the reference path with one warning
            naming the reason.
        softcap: lce only. ``None``, or a finite float > 0: the logits (bias
            included) become ``softcap * tanh(logits / softcap)`` before
            anything else, label smoothing included; gradients flow through
            the tanh. The chunked path applies it in place, chunk by chunk.
        z_loss: lce only. A finite float >= 0: adds ``z_loss * lse**2`` for
            every row that is not ignored, ``lse`` being the log-sum-exp of
            the (capped) logits. This term ignores the class weights. It is
            reduced on its own: "none" adds it to each row's loss (0 for an
            ignored row), "sum" adds the sum over rows, "mean" adds that sum
            divided by the number of rows that are not ignored, or 0 when
            every row is ignored (the cross-entropy term keeps torch's
            behaviour: NaN for an all-ignored "mean").
        return_lse: lce only. If True, return ``(loss, lse)``: ``lse`` is the
            per-row log-sum-exp of the (capped) logits, ``(N,)`` (``()`` for
            1-D input), fp32, detached (for logging; ignored rows included).
        loss_dtype: lce only. ``None`` (the input dtype, as torch's op) or a floating dtype for the returned
            loss, computed wide and rounded once to it. The gradient that comes back to the loss arrives in
            that dtype: an fp16 loss cannot carry a loss scale of 2**16 (65536 is inf in fp16), an fp32 one
            can, as torch's cross_entropy under fp16 autocast returns fp32.

    Under ``torch.autocast``, the chunked path takes ``input``, ``linear_weight`` and ``linear_bias`` in
    autocast's dtype (as ``linear`` would; fp64 stays fp64), returns the loss in fp32 unless ``loss_dtype`` says
    otherwise (as ``cross_entropy`` would), and runs its own arithmetic with autocast off, as the plan says
    (:mod:`lce.autocasting`). ``options=None`` is the materialized formula, on which autocast acts as on any code.

    Returns:
        The loss: a scalar, or per-sample losses (``(N,)``, or ``()`` for 1-D
        input) for ``reduction="none"``, in ``input``'s dtype (or ``loss_dtype``; fp32 under autocast); with
        ``return_lse``, the pair ``(loss, lse)``.

    Raises:
        ValueError / TypeError naming the offending argument for bad shapes,
        dtypes, values (including out-of-range targets) and options.
    """
    input, linear_weight, linear_bias = take_head("lce.linear_cross_entropy", input, linear_weight, linear_bias)
    is_probabilities = check_arguments(input, linear_weight, target, linear_bias, weight, reduction,
                                       ignore_index, label_smoothing)
    check_features(softcap, z_loss, return_lse, loss_dtype)
    features = dict(softcap=None if softcap is None else float(softcap), z_loss=float(z_loss), return_lse=return_lse,
                    loss_dtype=loss_dtype)
    keywords = dict(linear_bias=linear_bias, weight=weight, reduction=reduction, ignore_index=ignore_index,
                    label_smoothing=label_smoothing, **features)
    if options is None:
        check_materialized_dtypes(input, target, weight, is_probabilities)
        return unfused_linear_cross_entropy(input, linear_weight, target, **keywords)
    options = LinearCrossEntropyOptions.coerce(options)
    reason = _fallback_reason(linear_weight, is_probabilities)
    if reason is not None:
        check_materialized_dtypes(input, target, weight, is_probabilities)
        warnings.warn(f"lce.linear_cross_entropy: options ignored, running the reference path because of {reason}",
                      UserWarning, stacklevel=2)
        return unfused_linear_cross_entropy(input, linear_weight, target, **keywords)
    ignored = DEFAULT_IGNORE_INDEX if ignore_index is None else ignore_index
    features["loss_dtype"] = loss_dtype_under(loss_dtype, input)
    return _chunked(input, linear_weight, target, linear_bias, weight, reduction, ignored,
                    float(label_smoothing), options, features)


def check_materialized_dtypes(input: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None,
                              is_probabilities: bool) -> None:
    """The materialized formula's ``cross_entropy`` takes probability targets and the per-class ``weight`` in the
    logits' dtype (the input's), except under autocast, which takes them in fp32."""
    if autocast_dtype(input.device) is not None:
        return
    if is_probabilities and target.dtype != input.dtype:
        raise ArgumentTypeError(f"target (probabilities) must have input's dtype {input.dtype}, got {target.dtype}")
    check_class_weight(weight, weight.shape[0] if weight is not None else 0, input.dtype)
