"""lce for Hugging Face TRL: ``route(trainer)`` and TRL's fused LM head runs through :func:`lce.linear_log_probs`.

::

    from lce.integrations.trl import route
    trainer = trl.GRPOTrainer(model=..., args=trl.GRPOConfig(..., bf16=True), ...)
    route(trainer)          # the policy's and the reference model's fused heads; unroute(trainer) undoes it
    trainer.train()

What TRL does, and where lce comes in (written against trl 1.16.0, :data:`TESTED_TRL`): its trainers (GRPO,
RLOO, DPO, KTO, SFT) never form the logits. In ``__init__`` they call ``trl.trainer.utils.add_fused_lm_head``
on the policy (and on the reference model), which replaces the model's ``forward`` with TRL's ``_fused_forward``;
``model(..., labels=..., fused_lm_head=True)`` then runs the backbone, shifts the labels (or takes
``shift_labels``), gathers a sharded head (FSDP2's ``full_tensor()``; DeepSpeed ZeRO-3 around the call), and calls
``_ChunkedLogProbFunction.apply(hidden, weight, bias, targets, temperature, chunk_size, final_logit_softcapping,
logit_scale, outputs)`` -- a name it looks up in ``trl.trainer.utils`` at every call -- for per-row
``(log_probs, entropy, log_sum_sq_probs, mean_logits, is_top1)``, which it scatters back to the label mask and
hands to the trainers' losses and metrics.

The hook, and why this one: :func:`route` replaces that module-level name with a stand-in of the same ``apply``
signature (checked against TRL's, :func:`check_trl`), installed once and shared by every routed model. Each call
finds the model it is computing for as the ``self`` of the ``_fused_forward`` frame that called it (the frame's
code is checked to be TRL's), and runs lce for a routed model and TRL's own function for any other. So routing
is keyed by the model object itself, never by a module or a forward: what TRL and its wrappers do to the model
after routing -- PEFT wrapping it (TRL installs the head on ``get_base_model()``), FSDP2's ``fully_shard``
changing its class and sharding its head, accelerate's ``prepare`` wrapping its ``forward`` in autocast, a
``lm_head`` replaced -- leaves the route in place, and TRL still does everything around the head itself: the
backbone call, the label shift, ``shift_labels``, the label mask, the loss, ``num_items_in_batch`` and an MoE
router loss. :func:`unroute` takes the models out and, when none is left, puts TRL's own object back, so nothing
of lce remains in TRL. (Re-wrapping each model's ``forward`` instead would be undone, or buried, by
accelerate's wrapper, which ``Trainer.train`` adds after the trainer is built.) A copy of a routed model
(``copy.deepcopy``) is not routed.

What a routed call computes, per row of ``hidden`` (``(N, D)``) with target ``y``: TRL's logits
``z = hidden @ weight.T + bias``, multiplied by ``logit_scale``, soft-capped as ``cap * tanh(z / cap)``, then
divided by the temperature (TRL's kernel applies them in that order):

* ``log_probs`` and ``entropy``: :func:`lce.linear_log_probs` with ``temperature`` and ``softcap=cap``, both
  differentiable (gradients through the hidden states, the head's weight and bias, a tied head included);
* ``logit_scale`` (TRL reads it from the config: Cohere's and Falcon-H1's multipliers, Granite's
  ``1 / logits_scaling``) is folded into the hidden states (and the bias) in their own dtype before anything is
  cast, as :mod:`lce.integrations.transformers` folds it: exact when it is a power of two (Granite 3.x's 1/8
  and 1/16, Cohere's 0.0625); a scale TRL passes as ``1 / k`` (Granite's ``logits_scaling=k``) divides by
  ``k``, one rounding; any other costs one rounding of the hidden states in their dtype. A scale of 0 is
  refused (every logit 0 and no gradient: a broken config, not a model);
* ``log_sum_sq_probs`` (``log sum_c p_c**2``), ``mean_logits`` (the mean of the tempered logits) and
  ``is_top1`` (the target is the first maximum), which DPO, KTO and SFT ask for as metrics, without gradient,
  as TRL's: one more forward sweep of lce's chunk loop, under the same plan (its chunking, its logits GEMM),
  only when one of them is asked for;
* every output in fp32 (fp64 for fp64 hidden states), of shape ``(N,)``, ``is_top1`` bool.

dtypes: under TRL's ``accelerator.autocast()`` (``bf16=True`` with fp32 parameters) lce takes the hidden
states and the head in autocast's dtype, as TRL's own head computes its tiles, and runs its precision policy
with autocast off (:mod:`lce.autocasting`): bf16 GEMMs by default on a GPU, fp32 statistics, so the
log-probabilities and the importance ratios keep about fp32's accuracy without an fp32 copy of the head.
``cast_lm_head_to_fp32=True`` is honoured, not overridden: TRL then hands over fp32 hidden states with autocast
off, and lce runs fp32 GEMMs on them -- it costs fp32's GEMM time and buys nothing lce's bf16 head lacks
(docs/using-lce.md, the TRL section, has the numbers). Outside autocast the weight is taken in the hidden
states' dtype, as TRL's head takes it.

Sharded heads: with FSDP2, TRL gathers the head with ``full_tensor()`` before the call, so lce receives a full,
plain weight (the gradient reaches the shards through ``full_tensor``'s backward, a reduce-scatter); tested on
the CPU over gloo. DeepSpeed ZeRO-3 is refused: TRL gathers the partitioned weight only for the forward call
(and again in its own backward), while lce's backward recomputes the logits from the weight it saved, which
ZeRO-3 has re-partitioned by then.

``options``: None (lce's defaults: the "auto" policy and chunking) or a
:class:`~lce.LinearCrossEntropyOptions` (lce's or torch's), for every routed call. TRL's ``chunk_size`` (its
vocabulary tile) is not used: lce's plan chunks.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import sys
import types
import weakref
from fractions import Fraction

import torch

from ..autocasting import autocast_dtype, autocast_off, take_head
from ..logprobs import linear_log_probs, log_probs_plan
from ..passes.chunk import HeadTensors, Targets, pad_rows
from ..passes.logprob_passes import token_summaries
from ..planning.options import LinearCrossEntropyOptions
from .transformers import exactly_scaled, is_patched

__all__ = ["route", "unroute", "is_routed", "check_trl", "fused_head", "IncompatibleTRLError", "TESTED_TRL",
           "OUTPUTS", "HOOK_PARAMETERS"]

TESTED_TRL = "1.16.0"
"""The TRL release this module was written against and is tested with (the ``hf`` extra pins it)."""
OUTPUTS: tuple[str, ...] = ("log_probs", "entropy", "log_sum_sq_probs", "mean_logits", "is_top1")
"""The per-row outputs of TRL's fused head, in the order its hook returns them; a routed call computes each."""
HOOK_PARAMETERS: tuple[str, ...] = ("ctx", "hidden", "weight", "bias", "targets", "temperature", "chunk_size",
                                    "final_logit_softcapping", "logit_scale", "outputs")
"""The parameters of TRL's ``ChunkedLogProbFunction.forward``, which the stand-in's ``apply`` mirrors."""

_HOOK = "_ChunkedLogProbFunction"
"""The name ``trl.trainer.utils`` binds TRL's kernel to and ``_fused_forward`` looks up at every call."""
_FUSED_FORWARD = "_fused_forward"
_WRAPPER_DEPTH = 16
"""How many wrappers of a model's ``forward`` (accelerate's autocast and fp32 conversion, ...) are looked through
for TRL's ``_fused_forward``."""
_WHO = "lce.integrations.trl"
_IGNORE = -100

_routes: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""Routed model -> its :class:`_Route` (a model that is garbage-collected leaves by itself)."""


class IncompatibleTRLError(RuntimeError):
    """The installed TRL's fused head is not the one this module routes (TRL changed its hook): raised instead of
    leaving TRL's own head silently in place."""


@dataclasses.dataclass(frozen=True)
class _Route:
    """What :func:`route` recorded for one model: the options its calls run with."""

    options: LinearCrossEntropyOptions


@dataclasses.dataclass(frozen=True)
class _TRL:
    """The pieces of the installed TRL that routing touches, as :func:`check_trl` found them."""

    version: str
    utils: types.ModuleType
    kernel: type
    fused_forward_code: types.CodeType


# ---- route, unroute ---------------------------------------------------------------------------------------------

def route(target, options: LinearCrossEntropyOptions | None = None):
    """Run TRL's fused LM head through lce for ``target``: a built TRL trainer (its policy and, when it has one,
    its reference model) or a model carrying TRL's fused head. Returns ``target``.

    Args:
        target: a TRL trainer after ``__init__`` (``GRPOTrainer``, ``RLOOTrainer``, ``DPOTrainer``,
            ``KTOTrainer``, ``SFTTrainer``: each installs the head with ``add_fused_lm_head``), or a model on
            which ``trl.trainer.utils.add_fused_lm_head`` was called (a PEFT model: its base model). For a
            trainer, the policy must carry the head; a reference model is routed when it carries one.
        options: None (lce's default options) or a ``LinearCrossEntropyOptions`` (lce's or torch's).

    Raises:
        IncompatibleTRLError: the installed TRL's hook is not the one this module routes (:func:`check_trl`).
        TypeError: ``target`` is neither a trainer nor a ``torch.nn.Module``, or ``options`` has the wrong type.
        ValueError: a model without TRL's fused head, one routed already, one patched by
            :mod:`lce.integrations.transformers` (that patch breaks TRL's ``fused_lm_head=True`` calls), a trainer
            under DeepSpeed ZeRO-3, or TRL's hook replaced by someone else.
    """
    trl = _installed_trl()
    chosen = _resolve_options(options)
    models = _models_of(target, trl, for_route=True)
    for model in models:
        if model in _routes:
            raise ValueError(f"this {type(model).__name__} is routed through lce already; call unroute() first")
    _refuse_zero3()
    current = getattr(trl.utils, _HOOK)
    if current is not trl.kernel and not isinstance(current, _StandIn):
        raise ValueError(f"trl.trainer.utils.{_HOOK} is {current!r}, not TRL's {trl.kernel.__qualname__}: another "
                         "patch replaced TRL's fused-head kernel; lce.integrations.trl routes TRL's own")
    for model in models:
        _routes[model] = _Route(chosen)
    if current is trl.kernel:
        setattr(trl.utils, _HOOK, _StandIn(trl.kernel, trl.fused_forward_code))
    return target


def unroute(target):
    """Give ``target``'s models (a trainer's policy and reference model, or a model) TRL's own fused head back;
    when no routed model is left, TRL's kernel goes back in ``trl.trainer.utils``. Returns ``target``.

    ``ValueError`` when a model is not routed, or when TRL's hook was replaced again after :func:`route` (putting
    TRL's back would drop that replacement too)."""
    trl = _installed_trl()
    models = _models_of(target, trl, for_route=False)
    for model in models:
        if model not in _routes:
            raise ValueError(f"{type(model).__name__} is not routed by lce.integrations.trl")
    current = getattr(trl.utils, _HOOK)
    if not isinstance(current, _StandIn):
        raise ValueError(f"trl.trainer.utils.{_HOOK} was replaced after route() (now {current!r}); unroute would "
                         "drop that replacement too -- unroute before patching TRL's kernel again")
    for model in models:
        del _routes[model]
    if not _routes:
        setattr(trl.utils, _HOOK, current.original)
    return target


def is_routed(model) -> bool:
    """Whether :func:`route` routed ``model`` (and :func:`unroute` has not undone it)."""
    try:
        return model in _routes
    except TypeError:  # not hashable, so never routed
        return False


def _resolve_options(options) -> LinearCrossEntropyOptions:
    if options is None:
        return LinearCrossEntropyOptions()
    try:
        return LinearCrossEntropyOptions.coerce(options)
    except TypeError:
        raise TypeError(f"options must be None or a LinearCrossEntropyOptions (lce's or torch's), got "
                        f"{type(options).__name__}") from None


def _models_of(target, trl: _TRL, *, for_route: bool) -> list[torch.nn.Module]:
    """The models behind ``target``, unwrapped (accelerate, DeepSpeed, PEFT) to the ones TRL put its head on;
    for a trainer, the policy and a reference model that carries the head (or, to unroute, that is routed)."""
    if isinstance(target, torch.nn.Module):
        model = _unwrapped(target)
        _check_model(model, trl, "model")
        return [model]
    if not isinstance(getattr(target, "model", None), torch.nn.Module):
        raise TypeError(f"target must be a TRL trainer (with a .model) or a torch.nn.Module, got "
                        f"{type(target).__name__}")
    policy = _unwrapped(target.model)
    _check_model(policy, trl, f"{type(target).__name__}.model")
    models = [policy]
    reference = getattr(target, "ref_model", None)
    if isinstance(reference, torch.nn.Module):
        reference = _unwrapped(reference)
        keep = _fused_forward_of(reference, trl) is not None if for_route else is_routed(reference)
        if keep and reference is not policy:
            models.append(reference)
    return models


def _unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    """The model under DeepSpeed's engine, DDP or FSDP1 (``.module``) and PEFT (``get_base_model()``)."""
    for _ in range(_WRAPPER_DEPTH):
        inner = getattr(model, "module", None)
        if isinstance(inner, torch.nn.Module) and type(model).__name__ in (
                "DeepSpeedEngine", "DistributedDataParallel", "FullyShardedDataParallel", "DataParallel"):
            model = inner
            continue
        base = getattr(model, "get_base_model", None)
        if callable(base) and type(model).__module__.startswith("peft"):
            inner = base()
            if inner is not model:
                model = inner
                continue
        return model
    return model


def _check_model(model: torch.nn.Module, trl: _TRL, name: str) -> None:
    kind = type(model).__name__
    if is_patched(model):
        raise ValueError(f"{name} ({kind}) is patched by lce.integrations.transformers, whose forward breaks TRL's "
                         "fused_lm_head=True calls; call lce.integrations.transformers.unpatch(model) first (TRL's "
                         "trainers compute their losses from the fused head, which route() sends through lce)")
    if _fused_forward_of(model, trl) is None:
        raise ValueError(f"{name} ({kind}) carries no TRL fused LM head: its forward is {_named(model.forward)}, in "
                         f"which trl {trl.version}'s _fused_forward was not found. Route a TRL trainer after it is "
                         "built (its __init__ calls trl.trainer.utils.add_fused_lm_head), or call "
                         "add_fused_lm_head(model) before route(model)")


def _named(function) -> str:
    """``module.qualname`` of a function or bound method (not the repr of the module it is bound to)."""
    function = getattr(function, "__func__", function)
    return f"{getattr(function, '__module__', '?')}.{getattr(function, '__qualname__', type(function).__name__)}"


def _fused_forward_of(model: torch.nn.Module, trl: _TRL):
    """TRL's ``_fused_forward`` function in ``model``'s forward, looked for through the wrappers around it
    (accelerate's ``__wrapped__`` and ``model_forward``), or None."""
    current = model.__dict__.get("forward")
    for _ in range(_WRAPPER_DEPTH):
        if current is None:
            return None
        function = getattr(current, "__func__", current)
        if getattr(function, "__code__", None) is trl.fused_forward_code:
            return function
        current = getattr(function, "__wrapped__", None) or getattr(function, "model_forward", None)
    return None


def _refuse_zero3() -> None:
    from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled

    if is_deepspeed_zero3_enabled():
        raise ValueError(_ZERO3)


_ZERO3 = ("DeepSpeed ZeRO-3 partitions the head's weight: TRL gathers it around the forward call only, and lce's "
          "backward recomputes the logits from the weight it saved, re-partitioned by then. lce.integrations.trl "
          "routes unsharded heads and FSDP2's (gathered with full_tensor()); use ZeRO-2 or FSDP2, or leave TRL's "
          "head (unroute)")


# ---- TRL's hook, checked ---------------------------------------------------------------------------------------

def check_trl() -> str:
    """The installed TRL's version, after checking that its fused head is the one this module routes:
    ``trl.trainer.utils`` binds ``_ChunkedLogProbFunction`` to TRL's ``ChunkedLogProbFunction`` (or to lce's
    stand-in), whose ``forward`` takes :data:`HOOK_PARAMETERS` and computes :data:`OUTPUTS`, and
    ``add_fused_lm_head``'s ``_fused_forward`` looks that name up and calls its ``apply``. Any difference is an
    :class:`IncompatibleTRLError` naming the installed TRL version; :func:`route` and :func:`unroute` run the same
    check, so a TRL upgrade that changes the hook fails there, not silently."""
    return _installed_trl().version


def _installed_trl() -> _TRL:
    """The pieces of the installed TRL that routing touches, checked as :func:`check_trl` says."""
    try:
        import trl
        import trl.kernels.chunked_logprob as kernels
        import trl.trainer.utils as utils
    except ImportError as error:
        raise ImportError(f"{_WHO} needs TRL (pip install 'lce-lab[hf]', which pins trl=={TESTED_TRL}): {error}") \
            from error
    version = getattr(trl, "__version__", "?")

    def incompatible(what: str) -> IncompatibleTRLError:
        return IncompatibleTRLError(f"{_WHO} routes TRL's fused LM head through trl.trainer.utils.{_HOOK}.apply"
                                    f"({', '.join(HOOK_PARAMETERS[1:])}) (written against trl {TESTED_TRL}); in the "
                                    f"installed trl {version}, {what}. Leave TRL's head as it is, or pin "
                                    f"trl=={TESTED_TRL}")

    kernel = getattr(kernels, "ChunkedLogProbFunction", None)
    if kernel is None:
        raise incompatible("trl.kernels.chunked_logprob has no ChunkedLogProbFunction")
    bound = getattr(utils, _HOOK, None)
    if bound is not kernel and not isinstance(bound, _StandIn):
        raise incompatible(f"trl.trainer.utils.{_HOOK} is {bound!r}, not trl.kernels' ChunkedLogProbFunction")
    parameters = tuple(inspect.signature(kernel.forward).parameters)
    if parameters != HOOK_PARAMETERS:
        raise incompatible(f"ChunkedLogProbFunction.forward takes ({', '.join(parameters)})")
    extra = tuple(getattr(kernels, "OPTIONAL_OUTPUTS", ()))
    if ("log_probs", *extra) != OUTPUTS:
        raise incompatible(f"the fused head computes {('log_probs', *extra)}, not {OUTPUTS}")
    add = getattr(utils, "add_fused_lm_head", None)
    code = next((const for const in getattr(getattr(add, "__code__", None), "co_consts", ())
                 if isinstance(const, types.CodeType) and const.co_name == _FUSED_FORWARD), None)
    if code is None:
        raise incompatible(f"trl.trainer.utils.add_fused_lm_head defines no {_FUSED_FORWARD}")
    if _HOOK not in code.co_names or "apply" not in code.co_names or code.co_varnames[:1] != ("self",):
        raise incompatible(f"{_FUSED_FORWARD} does not call {_HOOK}.apply as a method of the model")
    return _TRL(version, utils, kernel, code)


# ---- the stand-in: lce for routed models, TRL's kernel for the others ----------------------------------------

class _StandIn:
    """What ``trl.trainer.utils._ChunkedLogProbFunction`` is while a model is routed: its ``apply`` has the
    signature of TRL's kernel and runs lce when the ``_fused_forward`` calling it belongs to a routed model,
    TRL's kernel (``original``) otherwise."""

    def __init__(self, original: type, fused_forward_code: types.CodeType):
        self.original = original
        self.fused_forward_code = fused_forward_code

    def __repr__(self) -> str:
        return f"<lce.integrations.trl stand-in for {self.original.__module__}.{self.original.__qualname__}>"

    def __getattr__(self, name: str):
        return getattr(self.original, name)  # anything but apply (forward, backward, ...) is TRL's kernel's

    def apply(self, hidden, weight, bias, targets, temperature, chunk_size, final_logit_softcapping=None,
              logit_scale=1.0, outputs=OUTPUTS[1:]):
        caller = sys._getframe(1)  # TRL's _fused_forward: its `self` is the model this call is for
        model = caller.f_locals.get("self") if caller.f_code is self.fused_forward_code else None
        state = _routes.get(model) if isinstance(model, torch.nn.Module) else None
        if state is None:
            return self.original.apply(hidden, weight, bias, targets, temperature, chunk_size,
                                       final_logit_softcapping, logit_scale, outputs)
        return fused_head(hidden, weight, bias, targets, temperature=temperature,
                              softcap=final_logit_softcapping, logit_scale=logit_scale, outputs=outputs,
                              options=state.options, model_name=type(model).__name__)


def fused_head(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor, *,
               temperature: float, softcap: float | None = None, logit_scale: float = 1.0,
               outputs: tuple[str, ...] = OUTPUTS, options: LinearCrossEntropyOptions | None = None,
               model_name: str = "model") -> tuple:
    """What TRL's hook returns, computed by lce: ``(log_probs, entropy, log_sum_sq_probs, mean_logits, is_top1)``
    per row, each None where ``outputs`` does not name it (``log_probs`` always comes), for the tempered logits
    ``u = softcap * tanh(logit_scale * (hidden @ weight.T + bias) / softcap) / temperature``.

    Args:
        hidden: ``(N, D)`` hidden states (fp32, bf16, fp16 or fp64).
        weight: ``(C, D)`` head weight; bias: ``(C,)`` or None. Outside autocast both are taken in hidden's dtype,
            under autocast in autocast's (:mod:`lce.autocasting`).
        targets: ``(N,)`` int64 class indices; -100 gives 0 and no gradient.
        temperature, softcap, logit_scale, outputs: TRL's (``outputs`` among :data:`OUTPUTS`).
        options: lce's options (None: the defaults); model_name: the name errors give.

    Returns:
        Five entries, ``(N,)`` each where computed: ``log_probs`` and ``entropy`` differentiable, fp32 (fp64 for
        fp64 hidden states); ``log_sum_sq_probs`` and ``mean_logits`` the same dtype without gradient; ``is_top1``
        bool.
    """
    options = LinearCrossEntropyOptions() if options is None else options
    unknown = [name for name in outputs if name not in OUTPUTS]
    if unknown:
        raise IncompatibleTRLError(f"{_WHO}: TRL asks the fused head of {model_name} for {unknown}; lce computes "
                                   f"{OUTPUTS}")
    if hasattr(weight, "ds_id"):  # a DeepSpeed ZeRO-3 parameter
        raise ValueError(f"{_WHO}: {model_name}'s head weight is a DeepSpeed ZeRO-3 parameter. {_ZERO3}")
    if softcap is not None and not (isinstance(softcap, (int, float)) and math.isfinite(softcap) and softcap > 0):
        raise ValueError(f"{_WHO}: {model_name}'s final_logit_softcapping must be None or a finite number > 0, got "
                         f"{softcap!r}")
    scale = _scale_of(logit_scale, model_name)
    if autocast_dtype(hidden.device) is None:  # TRL's head computes in the hidden states' dtype without autocast
        weight = weight.to(hidden.dtype)
        bias = None if bias is None else bias.to(hidden.dtype)
    if scale != 1:  # (S x) W^T + S b = S (x W^T + b), in the operands' own dtype, before any cast
        hidden, bias = exactly_scaled(hidden, scale), None if bias is None else exactly_scaled(bias, scale)
    cap = None if softcap is None else float(softcap)
    with_entropy = "entropy" in outputs
    result = linear_log_probs(hidden, weight, targets, linear_bias=bias, temperature=temperature,
                              return_entropy=with_entropy, softcap=cap, ignore_index=_IGNORE, options=options)
    log_probs, entropy = result if with_entropy else (result, None)
    extras = [name for name in OUTPUTS[2:] if name in outputs]
    metrics = _metrics(hidden, weight, bias, targets, temperature, cap, extras, options) if extras else {}
    return (log_probs, entropy, *(metrics.get(name) for name in OUTPUTS[2:]))


def _scale_of(logit_scale, model_name: str) -> Fraction:
    """TRL's ``logit_scale`` as an exact fraction: ``1/k`` where TRL passes the float nearest ``1/k`` for an
    integer ``k`` (Granite's ``1 / logits_scaling``), else the float itself."""
    if isinstance(logit_scale, bool) or not isinstance(logit_scale, (int, float)) or not math.isfinite(logit_scale):
        raise ValueError(f"{_WHO}: {model_name}'s logit scale must be a finite number, got {logit_scale!r}")
    if logit_scale == 0:
        raise ValueError(f"{_WHO}: {model_name}'s logit scale is 0 (every logit 0, no gradient reaches the model); "
                         "lce routes nonzero scales only")
    inverse = round(1 / logit_scale)
    if inverse != 0 and abs(inverse) < 2 ** 53 and 1 / inverse == logit_scale:
        return Fraction(1, inverse)
    return Fraction(logit_scale)


# ---- the metrics TRL's trainers log: lce's summaries pass, no gradient ---------------------------------------

@torch.no_grad()
def _metrics(hidden, weight, bias, targets, temperature: float, softcap: float | None, names: list[str],
             options: LinearCrossEntropyOptions) -> dict[str, torch.Tensor]:
    """``log_sum_sq_probs``, ``mean_logits`` and ``is_top1`` (those in ``names``), per row: lce's summaries pass
    (:func:`lce.passes.logprob_passes.token_summaries`) under the plan of the log-probabilities' call, so the
    logits are the same and no ``(N, C)`` buffer exists."""
    hidden, weight, bias = take_head(_WHO, hidden, weight, bias)
    flat = hidden.reshape(-1, hidden.shape[-1])
    plan = log_probs_plan(flat, weight, linear_bias=bias, softcap=softcap, options=options)
    with autocast_off(flat.device):  # a batch-invariant plan runs whole chunks: the rows padded, the sums sliced
        labels = Targets.build(pad_rows(plan, targets.reshape(-1), _IGNORE), class_weight=None, ignore_index=_IGNORE,
                               label_smoothing=0.0, num_classes=plan.num_classes, stats_dtype=plan.stats_dtype)
        summaries = token_summaries(plan, HeadTensors(flat, weight, bias), labels, float(temperature), tuple(names))
        return {name: values[:flat.shape[0]] for name, values in summaries.items()}
