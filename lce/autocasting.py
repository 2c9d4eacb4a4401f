"""What ``torch.autocast`` does to lce's ops: it picks the dtype the head's tensors are taken in, and nothing else.

Under an autocast enabled for the input's device type (``torch.autocast("cpu" | "cuda", dtype=bf16 | fp16)``),
lce's chunked ops -- :func:`lce.linear_cross_entropy` with options, :class:`lce.LinearCrossEntropyLoss`,
:func:`lce.linear_log_probs` and the vocab-parallel ops of :mod:`lce.distributed` -- do what the unfused
``linear`` + ``cross_entropy`` would do with their tensors, and then run their own arithmetic as outside autocast:

* ``input``, ``linear_weight`` and ``linear_bias`` are taken in autocast's dtype when they are fp32, bf16 or fp16
  (fp64 stays fp64), differentiably, as ``torch.nn.functional.linear`` takes them under autocast: the head's
  GEMMs then run at the speed autocast was asked for, and the gradient reaches fp32 parameters through the cast
  (the mixed-precision training setup: fp32 weights, bf16 hidden states);
* the loss comes back in fp32 (``loss_dtype=None`` means fp32 there), as ``cross_entropy`` returns it under
  autocast, so a ``GradScaler``'s 2**16 reaches backward in fp16 too; the per-class ``weight`` and the
  log-probabilities' temperature are read in lce's fp32 statistics, as cross-entropy under autocast reads them;
* everything lce computes after that -- every GEMM, sum, softmax and backward, including the backward passes that
  recompute the logits -- runs with autocast switched off, so the precision policy in the plan is what runs.
  Left on, autocast would recast lce's fp32 products to bf16 one op at a time and silently undo the policy.

So a call under autocast gives, bit for bit, what the same call outside autocast gives on the tensors cast to
autocast's dtype with ``loss_dtype=torch.float32``. :func:`lce.plan` called under autocast describes that call.

``options=None`` (and the fallbacks to it) is the materialized formula itself, ``linear`` then ``cross_entropy``,
and autocast acts on it as on any PyTorch code: logits rounded to autocast's dtype, the loss in fp32 -- as on
torch 2.13's own reference path. torch 2.13's chunked op, by contrast, ignores autocast and runs in its inputs'
dtype (docs/using-lce.md lists the difference).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import TypeVar

import torch

from .errors import ArgumentTypeError
from .planning.options import dtype_name

__all__ = ["CASTABLE", "autocast_dtype", "taken_dtype", "take", "take_head", "loss_dtype_under", "autocast_off",
           "outside_autocast"]

CASTABLE: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16, torch.float16)
"""The dtypes autocast casts (it leaves fp64, integers and everything else as they are)."""

F = TypeVar("F", bound=Callable)


def autocast_dtype(device: torch.device) -> torch.dtype | None:
    """The dtype of the autocast enabled for ``device``'s type, or None where none is (or the type has none)."""
    kind = device.type
    if not torch.amp.is_autocast_available(kind) or not torch.is_autocast_enabled(kind):
        return None
    return torch.get_autocast_dtype(kind)


def taken_dtype(dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """The dtype lce takes a head tensor of ``dtype`` on ``device`` in: autocast's for fp32/bf16/fp16 under an
    enabled autocast, else ``dtype`` itself."""
    cast = autocast_dtype(device)
    return cast if cast is not None and dtype in CASTABLE else dtype


def take(tensor, dtype: torch.dtype | None):
    """``tensor`` in ``dtype`` (autocast's, or None: no autocast), differentiably, where autocast would cast it;
    anything else (None, not a tensor, fp64, integers) as it is."""
    if dtype is None or not isinstance(tensor, torch.Tensor) or tensor.dtype not in CASTABLE:
        return tensor
    return tensor.to(dtype)


def take_head(who: str, input, linear_weight, linear_bias=None) -> tuple:
    """``(input, linear_weight, linear_bias)`` as lce's op takes them under the autocast enabled for input's
    device (unchanged without one). ``TypeError`` naming the dtypes when the cast leaves the head's tensors in
    different dtypes (fp64 beside an autocast-cast tensor: autocast leaves fp64 alone)."""
    if not isinstance(input, torch.Tensor):
        return input, linear_weight, linear_bias
    dtype = autocast_dtype(input.device)
    if dtype is None:
        return input, linear_weight, linear_bias
    taken = tuple(take(t, dtype) for t in (input, linear_weight, linear_bias))
    dtypes = {t.dtype for t in taken if isinstance(t, torch.Tensor) and t.is_floating_point()}
    if len(dtypes) > 1:
        named = zip(("input", "linear_weight", "linear_bias"), (input, linear_weight, linear_bias), strict=True)
        given = ", ".join(f"{name} {dtype_name(t.dtype)}" for name, t in named if isinstance(t, torch.Tensor))
        raise ArgumentTypeError(f"{who}: under torch.autocast({input.device.type!r}, dtype={dtype_name(dtype)}) the "
                                f"head's fp32/bf16/fp16 tensors are taken in {dtype_name(dtype)} and fp64 ones are "
                                f"left as they are, so they must all be fp64 or none; got {given}")
    return taken


def loss_dtype_under(loss_dtype: torch.dtype | None, input: torch.Tensor) -> torch.dtype | None:
    """The loss dtype a call asks for: ``loss_dtype`` if given; under an enabled autocast fp32 for a cast input (as
    ``cross_entropy`` returns under autocast); else None (the input's dtype)."""
    if loss_dtype is not None or autocast_dtype(input.device) is None or input.dtype not in CASTABLE:
        return loss_dtype
    return torch.float32


@contextlib.contextmanager
def autocast_off(device: torch.device) -> Iterator[None]:
    """Autocast switched off for ``device``'s type within, where it was on (a no-op otherwise)."""
    if autocast_dtype(device) is None:
        yield
        return
    with torch.autocast(device.type, enabled=False):
        yield


def outside_autocast(method: F) -> F:
    """An autograd Function's ``forward`` or ``backward`` run with autocast off for the device of its first tensor
    argument: a backward runs in whatever autocast state the caller of ``.backward()`` is in."""

    @functools.wraps(method)
    def run(ctx, *args):
        device = next((a.device for a in args if isinstance(a, torch.Tensor)), None)
        if device is None:
            return method(ctx, *args)
        with autocast_off(device):
            return method(ctx, *args)

    return run  # type: ignore[return-value]
