"""lce for Hugging Face ``transformers`` causal LMs: ``patch(model)`` and the model's loss runs through lce.

::

    from lce.integrations.transformers import patch
    patch(model)                                   # lce's default options; or options=..., "recommend", z_loss=...
    loss = model(input_ids, labels=labels).loss    # the library's own loss; in training no (B, T, V) logits

What a patched model does when its forward is called with ``labels`` (without them it is the model's own
forward, logits and all):

* the model's forward runs as written, with two stand-ins for the duration of the call: its ``lm_head``
  keeps the final hidden states (after ``logits_to_keep``) and returns a stand-in for the logits (an empty
  ``(..., 0)`` tensor, or the real logits when they are returned, see below), and its ``loss_function`` is
  lce's. So everything the model does around the loss -- the base model's arguments (``attention_mask``,
  ``position_ids``, caches), ``logits_to_keep``, an auxiliary loss it adds (a mixture of experts' router
  loss) -- is the model's own code;
* whatever the forward applies to the logits between ``lm_head`` and the loss is recorded on the stand-in and
  identified from the recorded ops, then checked by replaying them on a probe (in fp64; a cast through fp32
  passes). Mapped: multiplications and divisions of the logits by a constant (a Python number or a 0-dim
  tensor that requires no gradient) -- Granite's ``logits / logits_scaling``, Cohere's
  ``logits * logit_scale`` --, and at most one ``tanh`` between them -- Gemma 2/3's
  ``final_logit_softcapping``, ``cap * tanh(logits / cap)``. Any such chain, ``s2 * c * tanh(s1 * z / c)``
  (scales before the cap, after it, or both), is ``C * tanh(S * z / C)`` with ``S = s1 * s2`` and
  ``C = |s2 * c|``, so it becomes lce's ``softcap=C`` on the logits scaled by ``S`` (the factors are composed
  as exact fractions, so Gemma's ``/ cap`` and ``* cap`` cancel exactly). Anything else (an addition, a
  clamp, a second ``tanh``, a scale of 0, a learned scale) is a ``ValueError`` naming the model class;
* the logit scale ``S`` goes into lce's input: the hidden states are multiplied by ``S`` (divided by ``k``
  when ``S = 1/k``), and a bias, if ``lm_head`` has one, too, in their own dtype before any autocast cast,
  differentiably, so the gradients reach the hidden states and the weight (a tied one included) through the
  scale; the weight itself is left as it is. When ``S`` is a power of two (Granite 3.x's ``logits_scaling``
  of 8 or 16, Cohere's ``logit_scale`` of 0.0625) the product is exact in every dtype (short of overflow or
  subnormals) and lce computes the logits of exactly the scaled hidden states; otherwise it costs one
  rounding of the hidden states in their dtype (at most 2**-8 relative in bf16, where the unpatched model
  rounds its logits twice, before and after the scale): the loss is then within about the same error of
  fp64's as the library's, not always below it;
* the loss is transformers' ``ForCausalLMLoss`` computed by :func:`lce.linear_cross_entropy` on the (scaled)
  hidden states and ``lm_head``'s weight (and bias): labels shifted left by one and padded with
  ``ignore_index`` (or ``shift_labels`` as given), flattened, rows labelled ``ignore_index`` (-100) ignored;
  the mean over the labelled tokens, or, with ``num_items_in_batch`` (the ``Trainer``'s gradient
  accumulation), their sum divided by it. A tied head is the embedding matrix itself, so its gradient sums
  both uses;
* the dtype: as the unpatched ``lm_head`` would compute. Under ``torch.autocast`` (the ``Trainer``'s
  ``bf16=True`` with fp32 parameters) the hidden states and the weight are cast to the autocast dtype
  (fp64 stays fp64, as autocast leaves it), differentiably, so the gradient reaches the fp32 weight; lce
  then runs with autocast off, its precision policy deciding every GEMM;
* the returned loss is fp32, as the library's (``ForCausalLMLoss`` upcasts the logits): lce returns its
  input's dtype, so in bf16 and fp16 the value is taken from lce's fp32 per-row log-sum-exp and the target
  logits (formed in fp32 from the same rounded, scaled operands lce received), while the gradient is lce's.
  An fp64 model gets an fp64 loss (the library's would be fp32: its upcast is a downcast there);
* ``logits`` in the output, set by ``patch(model, logits=...)``: ``"eval"`` (the default) returns them when
  the model is in eval mode (``not model.training``: ``Trainer.evaluate`` and ``predict``, whose
  ``compute_metrics`` needs them) and None in training mode; ``"always"`` returns them in both; ``"never"``
  in neither. Returned logits are the unpatched model's own: its ``lm_head`` (the forward it had, without a
  second run of its hooks) on the same hidden states, in the same dtype and autocast state, then the model's
  own ops after it (soft-capping, scaling) run on them as it runs them -- equal to the unpatched model's
  logits to the bit. The loss is lce's all the same, so evaluation and training report the same quantity
  (in fp64 the unpatched model's loss to 1e-10; in bf16 lce's fp32 value, not the library's from the
  rounded logits); the head's GEMM then runs twice, once for the logits and once inside lce. Returning
  logits costs their ``(B, T, V)`` memory, which is what lce avoids: in training, with ``"always"``, they
  also keep their autograd graph. None means the key is absent from the output (a tuple output, with
  ``return_dict=False``, lacks the item), as for an unpatched model's None.

``options``: None (lce's default options: "auto" policy and chunking), a
:class:`~lce.LinearCrossEntropyOptions` (lce's or torch's), or ``"recommend"`` / :class:`Recommended` --
:func:`lce.recommend` for each call's shape (rows = tokens in the batch, the head's features and classes,
the compute dtype, the device), optionally under a ``memory_budget``. ``lce_keywords``: ``z_loss`` (lce's
z-loss, added to the model's loss). ``softcap`` comes from the model, never from the caller.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import math
import numbers
import types
from collections.abc import Callable, Iterator
from fractions import Fraction

import torch

from ..autocasting import CASTABLE, autocast_dtype, autocast_off
from ..decide.recommendation import recommend
from ..functional import check_features, linear_cross_entropy
from ..planning.options import LinearCrossEntropyOptions

__all__ = ["patch", "unpatch", "is_patched", "Recommended", "LCE_KEYWORDS", "LOGITS_SETTINGS",
           "exactly_scaled"]

LCE_KEYWORDS: tuple[str, ...] = ("z_loss",)
"""The keywords of :func:`lce.linear_cross_entropy` that :func:`patch` passes on (the others are the model's:
its reduction, ``ignore_index`` and soft-cap)."""
LOGITS_SETTINGS: tuple[str, ...] = ("eval", "always", "never")
"""``patch(model, logits=...)``: when a call with labels also returns the logits -- in eval mode only (the
default), always, never."""

_STATE = "_lce_patch"
_VALUE_ROWS = 4096
"""Rows per block when the fp32 loss value's target logits are formed (bounds that pass's memory)."""
_CACHED_SHAPES = 64
"""How many call shapes' recommended options a patched model keeps (batches of varying length each bring one)."""
_PROBE_RTOL = 1e-5
"""How close a replayed transform must come to the one it is identified as (a cast through fp32 passes)."""


@dataclasses.dataclass(frozen=True)
class Recommended:
    """``options`` that :func:`lce.recommend` picks for each call's shape and dtype on its device: its
    ``memory_budget`` (bytes beyond the inputs; None: lce auto's peak) and ``max_error`` (floors; None: its default
    limit). A shape not seen before costs one ``lce.recommend`` call (about half a second on 2 CPU cores); the
    last :data:`_CACHED_SHAPES` shapes' options are kept."""

    memory_budget: int | None = None
    max_error: float | None = None

    def __post_init__(self) -> None:
        budget, limit = self.memory_budget, self.max_error
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget <= 0):
            raise ValueError(f"Recommended.memory_budget must be a positive int (bytes) or None, got {budget!r}")
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, (int, float)) or not limit >= 1):
            raise ValueError(f"Recommended.max_error must be a number of floors >= 1 or None, got {limit!r}")

    def options_for(self, num_rows: int, in_features: int, num_classes: int, dtype: torch.dtype,
                    device: torch.device) -> LinearCrossEntropyOptions:
        return recommend(num_rows, in_features, num_classes, dtype, device, memory_budget=self.memory_budget,
                         max_error=self.max_error).options


@dataclasses.dataclass
class _Patch:
    """What :func:`patch` left on a model (``model._lce_patch``): how to choose options, the extra keywords, the
    instance-level forward it replaced (None: the class's), and when to return the logits (``LOGITS_SETTINGS``)."""

    options: LinearCrossEntropyOptions | Recommended
    keywords: dict[str, float]
    previous_forward: Callable | None
    logits: str = "eval"
    chosen: dict[tuple, LinearCrossEntropyOptions] = dataclasses.field(default_factory=dict)

    def options_for(self, x: torch.Tensor, weight: torch.Tensor) -> LinearCrossEntropyOptions:
        if isinstance(self.options, LinearCrossEntropyOptions):
            return self.options
        key = (x.shape[0], x.shape[1], weight.shape[0], x.dtype, x.device)
        if key not in self.chosen:
            if len(self.chosen) >= _CACHED_SHAPES:
                del self.chosen[next(iter(self.chosen))]  # the oldest shape
            self.chosen[key] = self.options.options_for(*key)
        return self.chosen[key]


# ---- patch, unpatch -------------------------------------------------------------------------------------------

def patch(model, options: LinearCrossEntropyOptions | Recommended | str | None = None, *, logits: str = "eval",
          **lce_keywords):
    """Route ``model``'s loss through lce whenever it is called with ``labels``; returns ``model`` (patched in
    place: only its instance's ``forward`` changes).

    Args:
        model: a ``transformers`` decoder-only causal LM whose forward is "base model, then ``lm_head``" (an
            ``nn.Linear``) and whose loss is transformers' ``ForCausalLMLoss``.
        options: None (lce's default options), a ``LinearCrossEntropyOptions`` (lce's or torch's),
            ``"recommend"`` or :class:`Recommended` (``lce.recommend`` per call shape).
        logits: when a call with labels returns the logits too (the unpatched model's, beside lce's loss):
            ``"eval"`` when ``not model.training`` (the default: ``Trainer.evaluate``'s ``compute_metrics``
            gets them, training forms none), ``"always"``, or ``"never"`` (the output's logits are None).
        lce_keywords: ``z_loss`` (a float >= 0) added to the model's loss by lce.

    Raises:
        TypeError: ``model`` is not a transformers model, its ``lm_head`` is not an ``nn.Linear``, or
            ``options`` is of the wrong type.
        ValueError: an encoder-decoder model, a model without ``lm_head`` (a classification head) or with
            another loss than ``ForCausalLMLoss``, a model patched already, an unknown ``options`` string,
            ``logits`` setting or lce keyword.
    """
    _check_model(model)
    if is_patched(model):
        raise ValueError(f"this {type(model).__name__} is patched already; call unpatch(model) first")
    chosen = _resolve_options(options)
    if not isinstance(logits, str) or logits not in LOGITS_SETTINGS:
        raise ValueError(f"logits must be one of {', '.join(map(repr, LOGITS_SETTINGS))}, got {logits!r}")
    keywords = _check_keywords(lce_keywords)
    previous = model.__dict__.get("forward")
    setattr(model, _STATE, _Patch(chosen, keywords, previous, logits))
    model.forward = types.MethodType(_forward_like(getattr(previous, "__func__", type(model).forward)), model)
    return model


def unpatch(model):
    """Give ``model`` back the forward it had before :func:`patch`; returns ``model``.

    ``ValueError`` when it is not patched, or when its forward was replaced again after :func:`patch` (by
    ``accelerate``'s ``prepare``, say): restoring then would drop that wrapper too.
    """
    state = model.__dict__.get(_STATE) if isinstance(model, torch.nn.Module) else None
    if state is None:
        raise ValueError(f"model ({type(model).__name__}) is not patched by lce.integrations.transformers")
    current = model.__dict__.get("forward")
    if not getattr(getattr(current, "__func__", None), "lce_patched", False):
        raise ValueError(f"{type(model).__name__}.forward was replaced after patch() (now {current!r}); unpatch "
                         "would drop that replacement too -- unpatch before wrapping the model")
    if state.previous_forward is None:
        del model.forward
    else:
        model.forward = state.previous_forward
    delattr(model, _STATE)
    return model


def is_patched(model) -> bool:
    """Whether :func:`patch` has patched ``model`` (and :func:`unpatch` has not undone it)."""
    return isinstance(model, torch.nn.Module) and _STATE in model.__dict__


def _check_model(model) -> None:
    import transformers
    from transformers.loss.loss_utils import LOSS_MAPPING, ForCausalLMLoss

    name = type(model).__name__
    if not isinstance(model, transformers.PreTrainedModel):
        raise TypeError(f"model must be a transformers PreTrainedModel (a causal LM), got {name}")
    if getattr(model.config, "is_encoder_decoder", False):
        raise ValueError(f"{name} is an encoder-decoder model; lce.integrations.transformers patches decoder-only "
                         "causal LMs (base model, then lm_head)")
    head = getattr(model, "lm_head", None)
    if head is None:
        raise ValueError(f"{name} has no lm_head (a classification or encoder head?); lce.integrations.transformers "
                         "patches causal LMs whose forward is base model, then lm_head")
    if not isinstance(head, torch.nn.Linear):
        raise TypeError(f"{name}.lm_head must be a torch.nn.Linear, got {type(head).__name__}")
    if "labels" not in inspect.signature(type(model).forward).parameters:
        raise ValueError(f"{name}.forward takes no labels argument; it computes no causal-LM loss to patch")
    loss = model.__dict__.get("_loss_function") or LOSS_MAPPING.get(getattr(model, "loss_type", None),
                                                                    ForCausalLMLoss)
    if loss is not ForCausalLMLoss:
        raise ValueError(f"{name}'s loss is {getattr(loss, '__name__', loss)!r}, not transformers' ForCausalLMLoss; "
                         "lce.integrations.transformers reproduces that loss only")


def _resolve_options(options) -> LinearCrossEntropyOptions | Recommended:
    if options is None:
        return LinearCrossEntropyOptions()
    if isinstance(options, str):
        if options != "recommend":
            raise ValueError(f"options must be None, 'recommend', a LinearCrossEntropyOptions or a Recommended, "
                             f"got the string {options!r}")
        return Recommended()
    if isinstance(options, Recommended):
        return options
    try:
        return LinearCrossEntropyOptions.coerce(options)
    except TypeError:
        raise TypeError(f"options must be None, 'recommend', a LinearCrossEntropyOptions (lce's or torch's) or "
                        f"lce.integrations.transformers.Recommended, got {type(options).__name__}") from None


def _check_keywords(keywords: dict[str, object]) -> dict[str, float]:
    unknown = sorted(set(keywords) - set(LCE_KEYWORDS))
    if unknown:
        owned = {"softcap": "the model's config (final_logit_softcapping)", "ignore_index": "the model's loss",
                 "reduction": "the model's loss (mean, or sum over num_items_in_batch)"}
        why = "; ".join(f"{name} comes from {owned[name]}" for name in unknown if name in owned)
        raise ValueError(f"patch() passes only {LCE_KEYWORDS} to lce, got {unknown}" + (f" ({why})" if why else ""))
    z_loss = keywords.get("z_loss", 0.0)
    check_features(None, z_loss, False)
    return {"z_loss": float(z_loss)} if z_loss else {}


# ---- one call of a patched forward ----------------------------------------------------------------------------

def _forward_like(forward: Callable) -> Callable:
    """A forward function that runs :func:`_patched_forward` with the signature of ``forward`` (a function taking
    ``self``): the Trainer reads it to keep a dataset's columns and to pass ``num_items_in_batch``."""

    @functools.wraps(forward)
    def patched(self, *args, **kwargs):
        return _patched_forward(self, *args, **kwargs)

    patched.lce_patched = True
    return patched


def _patched_forward(self, *args, **kwargs):
    """The patched model's forward: its own forward, with lce's loss when ``labels`` are given."""
    state: _Patch = self.__dict__[_STATE]
    forward = state.previous_forward or type(self).forward.__get__(self)
    if _labels_of(forward, args, kwargs) is None:
        return forward(*args, **kwargs)
    call = _Call(self, state)
    with call.intercepting():
        output = forward(*args, **kwargs)
    return call.finish(output)


def _labels_of(forward: Callable, args: tuple, kwargs: dict):
    if "labels" in kwargs:
        return kwargs["labels"]
    try:
        return inspect.signature(forward).bind_partial(*args, **kwargs).arguments.get("labels")
    except TypeError:
        return None  # the forward itself reports the bad call


class _Call:
    """One forward with labels: the hidden states lm_head received, lce's loss, the stand-ins installed meanwhile."""

    def __init__(self, model, state: _Patch):
        self.model, self.state, self.name = model, state, type(model).__name__
        self.keep_logits = state.logits == "always" or (state.logits == "eval" and not model.training)
        self.hidden: torch.Tensor | None = None
        self.autocast_dtype: torch.dtype | None = None
        self.loss: torch.Tensor | None = None
        self.head_forward: Callable | None = None

    @contextlib.contextmanager
    def intercepting(self) -> Iterator[None]:
        head, model = self.model.lm_head, self.model
        saved_head = head.__dict__.get("forward")
        saved_loss = model.__dict__.get("_loss_function")
        self.head_forward = saved_head or type(head).forward.__get__(head)
        head.forward = self.capture
        model.loss_function = self.loss_function
        try:
            yield
        finally:
            if saved_head is None:
                del head.forward
            else:
                head.forward = saved_head
            if saved_loss is None:
                del model._loss_function
            else:
                model._loss_function = saved_loss

    def capture(self, hidden: torch.Tensor) -> torch.Tensor:
        """lm_head's stand-in: keep the hidden states, return a stand-in for the logits (empty, or holding the
        logits lm_head's own forward computes when they are to be returned)."""
        if self.hidden is not None:
            raise ValueError(f"{self.name}'s forward calls lm_head more than once; lce.integrations.transformers "
                             "patches models that call it once, on the final hidden states")
        self.hidden = hidden
        self.autocast_dtype = autocast_dtype(hidden.device)
        if self.keep_logits:  # the head's own forward, here: in the forward's autocast state, its hooks run once
            return _DeferredLogits(self.head_forward(hidden), self.name)
        dtype = self._compute_dtype(self.model.lm_head.weight)
        return _DeferredLogits(hidden.new_empty((*hidden.shape[:-1], 0), dtype=dtype), self.name)

    def _compute_dtype(self, tensor: torch.Tensor) -> torch.dtype:
        """The dtype the unpatched lm_head would compute ``tensor`` in: autocast's for fp32, bf16 and fp16."""
        return self.autocast_dtype if self.autocast_dtype is not None and tensor.dtype in CASTABLE else tensor.dtype

    def loss_function(self, logits, labels, vocab_size, num_items_in_batch=None, ignore_index=-100,
                      shift_labels=None, **_ignored):
        """transformers' ForCausalLMLoss, through lce (its signature; the other keywords it ignores too)."""
        if self.hidden is None or not isinstance(logits, _DeferredLogits):
            raise ValueError(f"{self.name}'s forward passed loss_function logits that lm_head did not return; "
                             "lce.integrations.transformers patches forwards that compute them with lm_head")
        scale, softcap = self._transform(logits)
        head = self.model.lm_head
        if vocab_size != head.weight.shape[0]:
            raise ValueError(f"{self.name} computes its loss over vocab_size={vocab_size} classes, but lm_head has "
                             f"{head.weight.shape[0]} rows")
        if shift_labels is None:
            labels = torch.nn.functional.pad(labels, (0, 1), value=ignore_index)
            shift_labels = labels[..., 1:]
        x = self.hidden.reshape(-1, self.hidden.shape[-1])
        target = shift_labels.reshape(-1).to(x.device)
        if target.shape[0] != x.shape[0]:
            raise ValueError(f"{self.name}: {target.shape[0]} label positions for {x.shape[0]} rows of hidden states "
                             f"(logits_to_keep with labels?); pass shift_labels for the positions kept")
        bias = head.bias
        if scale != 1:  # in the operands' own dtype, before autocast's cast: (S x) W^T + S b = S (x W^T + b)
            x, bias = exactly_scaled(x, scale), None if bias is None else exactly_scaled(bias, scale)
        x, weight = (t.to(self._compute_dtype(t)) for t in (x, head.weight))
        bias = None if bias is None else bias.to(self._compute_dtype(bias))
        options = self.state.options_for(x, weight)
        with autocast_off(x.device):
            loss = _lce_loss(x, weight, bias, target, num_items_in_batch=num_items_in_batch,
                             ignore_index=ignore_index, options=options, softcap=softcap, **self.state.keywords)
        self.loss = loss
        return loss

    def _transform(self, logits: _DeferredLogits) -> tuple[Fraction, float | None]:
        """What the forward did to the logits after lm_head, as lce's input scale and soft-cap: ``(S, C)`` for
        ``C * tanh(S * z / C)`` (``C`` None: ``S * z``); ``(1, None)`` for nothing. Derived from the recorded ops
        (:func:`_scale_and_cap`), then checked by replaying them on a probe."""
        if not logits.ops:
            return Fraction(1), None
        described = ", ".join(getattr(func, "__name__", str(func)) for func, _, _ in logits.ops)
        unmapped = (f"{self.name}'s forward applies {described} to the logits after lm_head; "
                    "lce.integrations.transformers maps nothing there but multiplications and divisions by a "
                    "constant and at most one tanh between them (a logit scale, a soft-cap)")
        try:
            scale, cap = _scale_and_cap(logits.ops)
        except _Unmappable as reason:
            raise ValueError(f"{unmapped}: {reason}") from None
        probe = torch.linspace(-60.0, 60.0, 121, dtype=torch.float64, device=self.hidden.device).reshape(1, 1, -1)
        try:
            result = _replay(logits.ops, probe).double()
        except Exception as error:
            raise ValueError(f"{self.name}'s forward applies {described} to the logits after lm_head, which "
                             f"lce.integrations.transformers cannot map: {error}") from error
        scaled = probe * float(scale)
        expected = scaled if cap is None else float(cap) * torch.tanh(scaled / float(cap))
        floor = 1e-12 * float(expected.abs().max())
        if result.shape != probe.shape or not torch.allclose(result, expected, rtol=_PROBE_RTOL, atol=floor):
            written = f"{float(scale)!r} * z" if cap is None else f"{float(cap)!r} * tanh({float(scale)!r} * z / " \
                                                                  f"{float(cap)!r})"
            raise ValueError(f"{unmapped}, and this is not {written}")
        return scale, None if cap is None else float(cap)

    def finish(self, output):
        """The forward's output with lce's loss in it and the logits (as plain tensors) or none; ``ValueError`` if
        the loss never ran."""
        if self.loss is None:
            raise ValueError(f"{self.name}'s forward received labels but never called its loss_function; "
                             "lce.integrations.transformers patches models whose loss is ForCausalLMLoss")
        if isinstance(output, tuple):
            if self.keep_logits:
                return tuple(_plain(item) for item in output)
            return tuple(item for item in output if not isinstance(item, _DeferredLogits))
        if isinstance(output.get("logits"), _DeferredLogits):
            if self.keep_logits:
                output["logits"] = _plain(output["logits"])
            else:
                output = type(output)(**{key: value for key, value in output.items() if key != "logits"})
        return output


# ---- the loss -------------------------------------------------------------------------------------------------

def _lce_loss(x, weight, bias, target, *, num_items_in_batch, ignore_index: int, options, softcap,
              z_loss: float = 0.0) -> torch.Tensor:
    """ForCausalLMLoss's reduction through lce, in at least fp32: the mean over the labelled rows, or their sum
    over ``num_items_in_batch``.

    fp32 and fp64 input: lce's own loss (its "sum" divided by ``num_items_in_batch``). Narrower input: lce
    returns its dtype, so the value is recomputed in fp64 from lce's fp32 log-sum-exp (:func:`_loss_value`), and
    the gradient's scale -- the one incoming the loss, times ``count / num_items_in_batch`` -- is applied to
    lce's gradients in fp32 on their way back (:class:`_GradientScale`) instead of reaching lce rounded to its
    dtype, where a scale such as 1/37 would be off by up to 2**-9 in every gradient alike. For fp16 input lce
    returns its loss in fp32 (``loss_dtype``) and that scale reaches lce's backward, which multiplies it into
    the gradients it keeps scaled by powers of two (:mod:`lce.passes.headroom`): a GradScaler's scale then protects
    them as it protects the unpatched model's. lce runs "mean"
    there, its gradients O(1/count) before they are rounded (a sum's can overflow fp16)."""
    keywords = dict(ignore_index=ignore_index, options=options, softcap=softcap, z_loss=z_loss)
    if x.dtype.itemsize >= 4:
        reduction = "mean" if num_items_in_batch is None else "sum"
        loss = linear_cross_entropy(x, weight, target, linear_bias=bias, reduction=reduction, **keywords)
        return loss if num_items_in_batch is None else loss / _on(num_items_in_batch, loss.device)
    if x.dtype == torch.float16:
        # fp16: the incoming gradient (a GradScaler's scale, times the factor) reaches lce's backward in fp32,
        # where it lifts the gradients lce keeps scaled (lce.passes.headroom) before they are rounded
        scale = None
        loss, lse = linear_cross_entropy(x, weight, target, linear_bias=bias, reduction="mean", return_lse=True,
                                         loss_dtype=torch.float32, **keywords)
    else:
        scale = _GradientScale()
        loss, lse = linear_cross_entropy(scale.on(x), scale.on(weight), target, linear_bias=scale.on(bias),
                                         reduction="mean", return_lse=True, **keywords)
    with torch.no_grad():
        value = _loss_value(x, weight, bias, target, lse, ignore_index=ignore_index, softcap=softcap, z_loss=z_loss)
    factor = 1.0
    if num_items_in_batch is not None:
        count = int((target != ignore_index).sum())
        factor = count / float(num_items_in_batch)
        value = value * factor if count else torch.zeros_like(value)  # no labelled row: 0, as a sum over them
    return _ValueWithGradient.apply(loss, value.to(torch.float32), factor, scale)


def _on(value, device: torch.device):
    """``num_items_in_batch`` on ``device`` (a tensor), or as given (a number), as transformers divides by it."""
    return value.to(device) if torch.is_tensor(value) else value


def _loss_value(x, weight, bias, target, lse, *, ignore_index: int, softcap: float | None,
                z_loss: float) -> torch.Tensor:
    """lce's "mean" loss in fp64, from its per-row log-sum-exp: ``lse - z_y`` per labelled row (``z_y`` the
    target's logit, capped, formed in fp32 (fp64 for fp64 input) from the rounded operands, whose products are
    exact), plus
    ``z_loss * lse**2``, averaged over the labelled rows (NaN when there are none, as lce's)."""
    rows = (target != ignore_index).nonzero().squeeze(1)
    acc = torch.promote_types(x.dtype, torch.float32)
    total = torch.zeros((), dtype=torch.float64, device=x.device)
    for start in range(0, rows.numel(), _VALUE_ROWS):
        block = rows[start:start + _VALUE_ROWS]
        classes = target[block]
        logit = (x[block].to(acc) * weight[classes].to(acc)).sum(-1)
        if bias is not None:
            logit = logit + bias[classes].to(acc)
        if softcap is not None:
            logit = softcap * torch.tanh(logit / softcap)
        row_lse = lse[block].double()
        total += (row_lse - logit.double()).sum() + z_loss * row_lse.square().sum()
    return total / rows.numel()


class _GradientScale:
    """A factor that the gradients of lce's inputs are multiplied by on their way back: set by
    :class:`_ValueWithGradient`'s backward, which runs before lce's, and applied by :class:`_ScaledBackward`."""

    def __init__(self) -> None:
        self.factor = 1.0

    def on(self, tensor: torch.Tensor | None) -> torch.Tensor | None:
        return None if tensor is None else _ScaledBackward.apply(tensor, self)


class _ScaledBackward(torch.autograd.Function):
    """Identity forward; backward multiplies the gradient by its :class:`_GradientScale`'s factor (a Python float,
    so the product is formed in fp32 and rounded once), in place: the gradient is lce's own buffer, handed out to
    this node alone, so no second gradient-sized tensor is allocated."""

    @staticmethod
    def forward(ctx, tensor: torch.Tensor, scale: _GradientScale) -> torch.Tensor:
        ctx.scale = scale
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad.mul_(ctx.scale.factor), None


class _ValueWithGradient(torch.autograd.Function):
    """Forward: ``value`` (fp32). Backward: sets ``scale.factor`` to the incoming gradient times ``factor`` and
    sends lce's loss a gradient of one, which its dtype holds exactly; with no ``scale`` (an fp32 lce loss), sends
    lce's loss the incoming gradient times ``factor`` itself."""

    @staticmethod
    def forward(ctx, loss: torch.Tensor, value: torch.Tensor, factor: float, scale: _GradientScale) -> torch.Tensor:
        ctx.dtype, ctx.factor, ctx.scale = loss.dtype, factor, scale
        return value.clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        if ctx.scale is None:  # an fp32 lce loss (fp16 input): the gradient goes to lce itself
            return (grad * ctx.factor).to(ctx.dtype), None, None, None
        ctx.scale.factor = float(grad) * ctx.factor
        return torch.ones((), dtype=ctx.dtype, device=grad.device), None, None, None


# ---- the logits' stand-in -------------------------------------------------------------------------------------

class _DeferredLogits(torch.Tensor):
    """A stand-in for the logits -- an empty ``(..., 0)`` tensor, or the logits themselves when they are to be
    returned (sharing their storage and autograd history) -- remembering every op the forward applies to it
    (``ops``: ``(func, args, kwargs)`` in order) so that :meth:`_Call._transform` can identify the transform."""

    ops: tuple
    model_name: str

    @staticmethod
    def __new__(cls, data: torch.Tensor, model_name: str, ops: tuple = ()):
        stand_in = data.as_subclass(cls)
        stand_in.ops, stand_in.model_name = ops, model_name
        return stand_in

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        parent = next(value for value in (*args, *kwargs.values()) if isinstance(value, cls) and hasattr(value, "ops"))
        try:
            result = super().__torch_function__(func, types, args, kwargs)
        except Exception as error:
            raise ValueError(f"{parent.model_name}'s forward applies {getattr(func, '__name__', func)} to the logits "
                             f"after lm_head, which lce.integrations.transformers cannot defer: {error}") from error
        if isinstance(result, cls):
            result.ops, result.model_name = (*parent.ops, (func, args, kwargs)), parent.model_name
        return result


def _plain(item):
    """``item`` as a plain tensor if it is a stand-in holding the logits (same storage, same autograd history)."""
    return item.as_subclass(torch.Tensor) if isinstance(item, _DeferredLogits) else item


def _replay(ops: tuple, probe: torch.Tensor) -> torch.Tensor:
    """Apply the recorded ``ops`` to ``probe`` in place of the stand-in."""
    value = probe
    for func, args, kwargs in ops:
        args = [value if isinstance(arg, _DeferredLogits) else arg for arg in args]
        kwargs = {key: value if isinstance(arg, _DeferredLogits) else arg for key, arg in kwargs.items()}
        value = func(*args, **kwargs)
    if not isinstance(value, torch.Tensor) or not value.is_floating_point() or not math.isfinite(value.sum()):
        raise ValueError(f"replaying gives {value!r}, not finite floating-point logits")
    return value


# ---- the transform's identification: a logit scale and a soft-cap ----------------------------------------------

_T = torch.Tensor
_MULTIPLIES = frozenset({torch.mul, torch.multiply, _T.mul, _T.mul_, _T.multiply, _T.multiply_, _T.__mul__,
                         _T.__rmul__, _T.__imul__})
_DIVIDES = frozenset({torch.div, torch.divide, torch.true_divide, _T.div, _T.div_, _T.divide, _T.divide_,
                      _T.true_divide, _T.true_divide_, _T.__truediv__, _T.__itruediv__})
_TANHS = frozenset({torch.tanh, _T.tanh, _T.tanh_})


class _Unmappable(Exception):
    """Why a chain of recorded ops is not a logit scale and a soft-cap."""


def _scale_and_cap(ops: tuple) -> tuple[Fraction, Fraction | None]:
    """The recorded ops as ``(S, C)``: the logits ``z`` become ``C * tanh(S * z / C)`` (``C`` None: ``S * z``).

    The chain is followed as ``outer * h(inner * z)``, ``h`` the identity until a ``tanh``: a multiplication or
    division by a constant multiplies ``outer``; a ``tanh`` moves ``outer`` inside (``inner = outer``,
    ``outer = 1``), once. Then ``outer * tanh(inner * z) = C * tanh(S * z / C)`` with ``S = outer * inner`` and
    ``C = |outer|`` (tanh is odd). The factors are exact fractions of the constants, so ``/ cap`` and ``* cap``
    cancel exactly. Any other op is taken to leave the values as they are (a cast, a copy, a view); the replay
    on the probe (:meth:`_Call._transform`) checks that, and the whole chain."""
    outer, inner, capped = Fraction(1), Fraction(1), False
    for func, args, kwargs in ops:
        factor = _factor_of(func, args, kwargs)
        if factor is not None:
            outer *= factor
        elif func in _TANHS and len(args) == 1 and isinstance(args[0], _DeferredLogits) and not kwargs:
            if capped:
                raise _Unmappable("a second tanh (lce applies one soft-cap)")
            outer, inner, capped = Fraction(1), outer, True
    scale = outer * inner
    if scale == 0:
        raise _Unmappable("the logits are multiplied by 0")
    try:
        in_range = math.isfinite(float(scale)) and math.isfinite(float(outer))
    except OverflowError:
        in_range = False
    if not in_range:
        raise _Unmappable("the composed scale or cap is out of float range")
    return scale, abs(outer) if capped else None


def _factor_of(func, args: tuple, kwargs: dict) -> Fraction | None:
    """The factor a recorded multiplication or division of the stand-in by a constant applies (as an exact
    fraction), or None when the op is not one."""
    divide = func in _DIVIDES
    if not divide and func not in _MULTIPLIES:
        return None
    if len(args) != 2 or any(key != "rounding_mode" or value is not None for key, value in kwargs.items()):
        return None
    first, second = args
    if isinstance(first, _DeferredLogits):
        constant = _constant(second)
    elif not divide and isinstance(second, _DeferredLogits):
        constant = _constant(first)
    else:
        return None
    if constant is None:
        return None
    if divide:
        if constant == 0:
            raise _Unmappable("the logits are divided by 0")
        return 1 / constant
    return constant


def _constant(value) -> Fraction | None:
    """A Python real number or a 0-dim real tensor as an exact fraction; None for anything else."""
    if isinstance(value, torch.Tensor):
        if isinstance(value, _DeferredLogits) or value.dim() != 0 or value.is_complex() or value.dtype == torch.bool:
            return None
        if value.requires_grad:
            raise _Unmappable("the logits are scaled by a tensor that requires grad (a learned scale), which would "
                              "get no gradient through lce")
        number = float(value.item())
    elif isinstance(value, numbers.Real) and not isinstance(value, bool):
        number = float(value)
    else:
        return None
    return Fraction(number) if math.isfinite(number) else None


def exactly_scaled(tensor: torch.Tensor, scale: Fraction) -> torch.Tensor:
    """``tensor * scale`` in ``tensor``'s dtype, differentiably: a division by the integer when the scale is one's
    reciprocal (Granite's ``logits / 3``: one rounding, not two), else a product by the nearest float."""
    if abs(scale.numerator) == 1 and scale.denominator < 2 ** 53:
        return tensor / float(scale.numerator * scale.denominator)
    return tensor * float(scale)
