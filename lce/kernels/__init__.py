"""Fused Triton kernels for a chunk's elementwise passes over its logits (optional; CUDA only).

The chunk loop (:mod:`lce.passes.loss`) turns each chunk's (rows, C) fp32 logits ``z`` into row statistics and then
into dz with a sequence of PyTorch ops, each a full pass over ``z``: gather the target logit, the row maximum,
``exp`` with the target left out and its sum, the division by the sum, dz's scaling, the target entry's scatter,
the smoothing term. At an LLM head (8192 x 256000 logits a step) those passes move about as many bytes as the
GEMMs take time. The kernels here do the same arithmetic in two passes over ``z``. They are a backend, not a
second description of the loss: the PyTorch ops stay the reference, the CPU path and the fallback, and every
per-row coefficient (what the reduction, the class weights, the smoothing, the z-loss and the fp16 rescale make of
a row) is computed by the caller with the chunk loop's own ops and handed in.

What each function replaces
---------------------------
:func:`row_statistics` -- one read of ``z`` (nothing written). Replaces :func:`lce.passes.statistics.chunk_statistics_`
(target gather, ``amax``, :func:`~lce.passes.statistics._exp_apart_from_target_`'s shift, scatter of -inf, ``exp`` and
sum, the smoothing's weighted logit sum) and, given ``running_max``, the same for a block of classes
(:func:`lce.passes.statistics.block_statistics_`, whose fold with the previous blocks stays the caller's). The maximum
and
the sum come from one sweep: the online log-sum-exp, the sum so far rescaled by ``exp(old_max - new_max)``
whenever a block raises the maximum. Unlike the reference it leaves ``z`` as it was (the logits), since the
gradient pass recomputes ``exp``.

:func:`sum_apart_from_target` -- one read. Replaces the sum in :func:`lce.passes.statistics.chunk_softmax_from_lse_`
(backward of reduction "none"): ``sum over c != y of exp(z_c - lse)``, the same sum with a fixed shift.

:func:`grad_logits_` -- one read and one write, in place. Replaces the division of
:func:`lce.passes.statistics.chunk_loss_and_softmax_` (``p = exp(z - row_max) / sum_exp``) or the ``exp`` of
:func:`~lce.passes.statistics.chunk_softmax_from_lse_` (``p = exp(z - lse)``), followed by
:func:`lce.passes.grad_logits.chunk_grad_logits_` (``dz = prob_coef * p``, the target entry, the smoothing term), for a
whole
row or a block of classes.

Why the arithmetic is the reference's
-------------------------------------
Each kernel performs the reference's operations on the same fp32 operands in the same order, element by
element: ``exp(z - shift)`` with the subtraction rounded first; the target's term excluded from the sum (never
``1 - p_y`` as a difference, lce's confident-row precision); ``p`` by a correctly rounded division (``div_rn``:
Triton's ``/`` is an approximate one); the target entry as ``(prob_coef - target_coef) * p_y - target_coef *
(1 - p_y)``; ``exp`` from libdevice (within 2 ulps, the function torch's CUDA ``exp`` calls, where ``tl.exp`` loses
about ``|x|`` half-ulps); no fused multiply-adds (:mod:`lce.kernels.interpreter`). So ``p`` and dz agree with the
reference to the ``exp`` implementations' last bits, and only two things are the kernels' own: the order of the
sum (blocks of columns, then splits) and the online rescale. A rise of the maximum multiplies the sum gathered so
far by ``exp(old_max - new_max)``; the rounding of that difference (2**-19 at 40 nats) would shift every gathered
term alike, so it is recovered exactly (two-sum) and put back to first order, and a rise costs the gathered part
``exp``'s error plus two roundings -- at most 3 ulps compiled (libdevice's 2), 1.5 interpreted -- and only while
that part still counts (a rise of ``d`` nats shrinks it by ``exp(-d)``). A row's split merge costs the same, once.

Measured in Triton's interpreter against lce's PyTorch functions and fp64 (tests/lce/test_kernels.py states the
numbers): ``other`` and ``1 - p_y`` as close to fp64 as the reference's (within 4.2 ulps, confident rows to 40 nats
included; the two at most 5 ulps apart), ``lse`` 1 ulp from the reference's, dz 2 to 4 ulps from the reference's
given the same statistics. Not yet compiled on a GPU: the ``cuda`` test there compares the compiled kernels
(libdevice ``exp``) with the reference, and the launch configurations are unmeasured starting points.

Determinism: no atomics. A row's splits write partial results to their own slots, merged in split order;
results depend on the launch configuration (:mod:`lce.kernels.launch`: a function of shape and SM count, never
timed), never on scheduling.

What the kernels do not cover (the caller keeps the PyTorch ops)
----------------------------------------------------------------
Soft-capping (``tanh`` and its chain rule: :func:`lce.passes.grad_logits.capped_grad_logits_`); stats dtypes other than
fp32
(fp64 inputs); logits whose columns are not contiguous; tensors off CUDA (outside the interpreter) and AMD GPUs
(``torch.version.hip``: untested); the per-token log-probabilities' passes (:mod:`lce.passes.logprob_passes`); the
losses, ``lse`` and the coefficients themselves (a few (rows,) ops). NaN logits: ``tl.max`` may drop a NaN that
``amax`` propagates, but the row's sum still carries it: a row with a NaN logit gets NaN statistics either way.
Logits below about -87 nats from their row's shift: libdevice's ``exp`` is built flush-to-zero, so where torch's
CUDA ``exp`` gives a subnormal (``exp(-87.3)`` is fp32's smallest normal) the compiled kernels give 0, a
difference of at most ``2**-126`` in an entry of ``p`` or dz, far below the row's rounding; no test reaches there
(the interpreter's fp64 ``exp`` keeps the subnormals).
:func:`unavailable_reason` and :func:`uncovered` are the dispatch test; :func:`lce.plan` prints their answer.

When the kernels cannot run
---------------------------
A CUDA call whose kernels cannot load (no triton, or one that fails to import) or fail to compile or launch (a
Triton error at the first launch of a variant) warns once per process (:class:`KernelsFallbackWarning`, naming
the reason) and runs the PyTorch ops: a failed launch raises :class:`KernelsFailed` before any logits are
changed, the chunk loop runs its pass again with the PyTorch ops, and every later plan says why
(:func:`unavailable_reason`). Nothing falls back unseen.

Triton is imported only when :func:`available` is asked about a CUDA tensor (or under ``TRITON_INTERPRET=1``);
``import lce`` never imports it.
"""

from __future__ import annotations

import contextvars
import importlib
import sys
import warnings
from types import ModuleType
from typing import NamedTuple

import torch

from .interpreter import interpreting
from .launch import Launch, grad_launch, statistics_launch

__all__ = ["available", "unavailable_reason", "uncovered", "covers", "row_statistics", "sum_apart_from_target",
           "grad_logits_", "Statistics", "Launch", "KernelsFailed", "KernelsFallbackWarning", "triton_version"]

_PASSES = "lce.kernels.softmax_passes"
_import_error: str | None = None
"""Why the kernel module did not import (the exception, in one line); None until an import failed."""
_launch_error: str | None = None
"""Why a kernel failed to compile or launch in this process; None until one did."""
_warned: set[str] = set()


class KernelsFailed(RuntimeError):
    """A kernel failed to compile or launch (a Triton error), before it changed any of its arguments: the caller
    runs the PyTorch ops instead (:mod:`lce.passes.loss` does so for the whole pass)."""


class KernelsFallbackWarning(UserWarning):
    """A CUDA call runs the PyTorch ops because the kernels cannot (issued once per process and reason)."""


class Statistics(NamedTuple):
    """A chunk's row statistics, in the field order of :class:`lce.passes.statistics.RowStatistics`
    (``RowStatistics(*s)``).

    All (rows,) fp32: ``row_max`` the largest logit (the running maximum's, if one was given),
    ``other`` the sum of ``exp(z - row_max)`` over the classes but the target, ``target_logit`` the target's
    logit (-inf where the target lies outside ``z``'s columns), ``weighted_logit_sum`` ``sum_c w_c z_c``
    (``sum_c z_c`` without class weights), None unless asked for.
    """

    row_max: torch.Tensor
    other: torch.Tensor
    target_logit: torch.Tensor
    weighted_logit_sum: torch.Tensor | None


def _passes() -> ModuleType | None:
    """The kernel module, imported on first use (None where triton does not import: :data:`_import_error` says
    why)."""
    global _import_error
    if _PASSES in sys.modules:
        return sys.modules[_PASSES]
    if _import_error is not None:
        return None
    try:
        return importlib.import_module(_PASSES)
    except Exception as error:  # no triton, or one that cannot load: the PyTorch ops run instead
        _import_error = _one_line(error)
        return None


def _one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}".rstrip(": ")


def _warn_once(reason: str) -> None:
    if reason not in _warned:
        _warned.add(reason)
        warnings.warn(f"lce: the Triton kernels do not run here ({reason}); the chunk passes run as PyTorch ops "
                      "(the same arithmetic, more passes over the logits)", KernelsFallbackWarning, stacklevel=3)


def triton_version() -> str | None:
    """The version of the triton the kernels were imported with (None before they were, or where they cannot)."""
    passes = sys.modules.get(_PASSES)
    return None if passes is None else passes.TRITON_VERSION


INTERPRETED_ON_CPU: contextvars.ContextVar[bool] = contextvars.ContextVar("lce_interpreted_kernels", default=False)
"""Whether CPU tensors run the kernels through Triton's interpreter (:func:`lce.testing.interpreted_kernels`: tests
only; the interpreter is far slower than the PyTorch ops)."""


def available(where: torch.Tensor | torch.device) -> bool:
    """Whether the kernels can run on a tensor's device (or on ``where``, a device): CUDA on an NVIDIA GPU with
    triton importable and no kernel failed in this process, or the CPU under Triton's interpreter where a test asks
    for it (``TRITON_INTERPRET=1`` before triton is imported, and :func:`lce.testing.interpreted_kernels`). False on
    the CPU otherwise, without importing triton. :func:`unavailable_reason` says why not."""
    return unavailable_reason(where) is None


def unavailable_reason(where: torch.Tensor | torch.device) -> str | None:
    """Why the kernels cannot run on ``where`` (a tensor or a device), in a few words; None where they can. On CUDA a
    missing or broken triton, or a kernel that failed earlier, also warns once (:class:`KernelsFallbackWarning`)."""
    device = where.device if isinstance(where, torch.Tensor) else torch.device(where)
    if device.type == "cuda":
        if torch.version.hip is not None:
            return "an AMD GPU, where the kernels are untested"
        wanted_interpreted = False
    elif device.type == "cpu" and interpreting() and INTERPRETED_ON_CPU.get():
        wanted_interpreted = True
    else:
        return f"{device.type} tensors (the kernels run on CUDA)"
    passes = _passes()
    if passes is None:
        reason = f"triton does not import: {_import_error}"
    elif _launch_error is not None:
        reason = f"a kernel failed to compile or launch: {_launch_error}"
    elif passes.INTERPRETED != wanted_interpreted:
        return ("triton was imported with TRITON_INTERPRET=1 (its interpreter)" if passes.INTERPRETED
                else "triton was imported compiled, not interpreted")
    else:
        return None
    if device.type == "cuda":
        _warn_once(reason)
    return reason


def uncovered(*, stats_dtype: torch.dtype, softcap: float | None = None) -> str | None:
    """What of a call the kernels do not compute (else None): soft-capping, or statistics in another dtype than
    fp32 (fp64 input). Everything else -- label smoothing, class weights, a z-loss, ignored rows, the fp16 rescale
    -- reaches them through the coefficients the caller passes."""
    if softcap is not None:
        return "soft-capping, which the kernels do not cover"
    if stats_dtype != torch.float32:
        return f"{stats_dtype} statistics (the kernels take fp32)"
    return None


def covers(*, stats_dtype: torch.dtype, softcap: float | None = None) -> bool:
    """Whether the kernels compute a chunk's statistics and dz for this call (:func:`uncovered` says why not)."""
    return uncovered(stats_dtype=stats_dtype, softcap=softcap) is None


def _launched(run):
    """``run()``, with a Triton error (compile or launch) recorded, warned about and raised as
    :class:`KernelsFailed`: Triton raises those before the kernel runs, so no argument has been changed."""
    global _launch_error
    try:
        return run()
    except Exception as error:
        if not type(error).__module__.startswith("triton"):
            raise
        _launch_error = _one_line(error)
        _warn_once(f"a kernel failed to compile or launch: {_launch_error}")
        raise KernelsFailed(f"lce.kernels: {_launch_error}") from error


def row_statistics(z: torch.Tensor, target_index: torch.Tensor, *, class_weight: torch.Tensor | None = None,
                   weighted_logit_sum: bool = False, running_max: torch.Tensor | None = None,
                   launch: Launch | None = None) -> Statistics:
    """The row statistics of the logits ``z`` (rows, C) fp32, read once and left as they are.

    ``target_index`` (rows,) int64: each row's target column in ``z``, or any value outside ``[0, C)`` (say -1)
    for a row whose target lies outside these columns (a block of classes): every class is then summed and
    ``target_logit`` is -inf. ``weighted_logit_sum``: also return ``sum_c w_c z_c`` (label smoothing), with
    ``class_weight`` (C,) fp32 the weights of ``z``'s columns (None: all ones). ``running_max`` (rows,) fp32: the
    maximum of the previous blocks of classes, from which the sweep starts (its result's ``row_max`` is then at
    least that; folding the previous blocks' sum in stays the caller's). ``launch``: default
    :func:`lce.kernels.launch.statistics_launch`.
    """
    rows, num_cols = _check_logits(z)
    target_index = _check_rows(target_index, "target_index", rows, z.device, torch.int64)
    running_max = None if running_max is None else _check_rows(running_max, "running_max", rows, z.device)
    class_weight = _check_class_weight(class_weight, num_cols, z.device) if weighted_logit_sum else None
    launch = launch or statistics_launch(rows, num_cols, z.device)
    return Statistics(*_launched(lambda: _kernels().row_statistics(
        z, target_index, running_max, fixed_shift=False, class_weight=class_weight, weighted_sum=weighted_logit_sum,
        launch=launch)))


def sum_apart_from_target(z: torch.Tensor, target_index: torch.Tensor, shift: torch.Tensor, *,
                          launch: Launch | None = None) -> torch.Tensor:
    """``sum over c != y of exp(z_c - shift)`` per row (rows,) fp32, ``z`` read once and left as it is: the sum
    :func:`lce.passes.statistics.chunk_softmax_from_lse_` forms, with ``shift`` the rows' log-sum-exp (``1 - p_y``).

    ``target_index`` as for :func:`row_statistics`; ``shift`` (rows,) fp32.
    """
    rows, num_cols = _check_logits(z)
    target_index = _check_rows(target_index, "target_index", rows, z.device, torch.int64)
    shift = _check_rows(shift, "shift", rows, z.device)
    launch = launch or statistics_launch(rows, num_cols, z.device)
    return _launched(lambda: _kernels().row_statistics(z, target_index, shift, fixed_shift=True, class_weight=None,
                                                       weighted_sum=False, launch=launch))[1]


def grad_logits_(z: torch.Tensor, target_index: torch.Tensor, shift: torch.Tensor, *, prob_coef: torch.Tensor,
                 target_coef: torch.Tensor, other_prob: torch.Tensor, divisor: torch.Tensor | None = None,
                 smoothing_coef: torch.Tensor | None = None, class_weight: torch.Tensor | None = None,
                 launch: Launch | None = None) -> torch.Tensor:
    """Turn the logits ``z`` (rows, C) fp32 into ``dz / rescale`` in place, and return ``z``.

    ``p = exp(z - shift)``, divided by ``divisor`` where given (forward: ``shift = row_max``,
    ``divisor = sum_exp``; backward of "none" and class blocks: ``shift = lse``, no divisor). Then, as
    :func:`lce.passes.grad_logits.chunk_grad_logits_`: ``dz = prob_coef * p``; the target's entry
    ``(prob_coef - target_coef) * p_y - target_coef * other_prob``; plus ``smoothing_coef * w_c``
    (``smoothing_coef`` alone without ``class_weight``) on every entry, the target's included.

    ``target_index`` (rows,) int64 as for :func:`row_statistics` (outside ``[0, C)``: no target entry in these
    columns). Per row, (rows,) fp32, with the reduction's row scale ``s`` (0 for ignored rows) and the fp16
    ``rescale`` already in them: ``prob_coef`` (``s (1 - eps) w_y + s eps / C sum(w) + lse_coef``, over
    ``rescale``), ``target_coef`` (``s (1 - eps) w_y / rescale``), ``other_prob`` (``1 - p_y``, from a sum
    without the target), ``smoothing_coef`` (``-(eps / C) s / rescale``; None without smoothing).
    ``class_weight`` (C,) fp32 for ``z``'s columns, used by the smoothing term only. ``launch``: default
    :func:`lce.kernels.launch.grad_launch`.
    """
    rows, num_cols = _check_logits(z)
    target_index = _check_rows(target_index, "target_index", rows, z.device, torch.int64)
    shift = _check_rows(shift, "shift", rows, z.device)
    divisor = None if divisor is None else _check_rows(divisor, "divisor", rows, z.device)
    prob_coef = _check_rows(prob_coef, "prob_coef", rows, z.device)
    target_coef = _check_rows(target_coef, "target_coef", rows, z.device)
    other_prob = _check_rows(other_prob, "other_prob", rows, z.device)
    smoothing_coef = None if smoothing_coef is None else _check_rows(smoothing_coef, "smoothing_coef", rows,
                                                                     z.device)
    class_weight = (None if smoothing_coef is None or class_weight is None
                    else _check_class_weight(class_weight, num_cols, z.device))
    launch = launch or grad_launch(rows, num_cols, z.device)
    return _launched(lambda: _kernels().grad_logits_(z, target_index, shift, divisor, prob_coef, target_coef,
                                                     other_prob, smoothing_coef, class_weight, launch))


# ---- argument checks ------------------------------------------------------------------------------

def _kernels() -> ModuleType:
    passes = _passes()
    if passes is None:
        raise RuntimeError("lce.kernels needs triton, which does not import here; check lce.kernels.available() "
                           "before calling the kernels")
    return passes


def _check_logits(z: torch.Tensor) -> tuple[int, int]:
    if z.dim() != 2 or z.dtype != torch.float32:
        raise ValueError(f"z must be a 2-D float32 tensor (rows, C), got {tuple(z.shape)} {z.dtype}")
    if z.shape[1] > 1 and z.stride(1) != 1:
        raise ValueError(f"z's columns must be contiguous (stride 1), got strides {z.stride()}")
    reason = unavailable_reason(z)
    if reason is not None and _launch_error is not None:
        raise KernelsFailed(f"lce.kernels: {reason}")
    if reason is not None:
        raise ValueError(f"z is on {z.device}, where the kernels do not run: {reason}")
    return z.shape[0], z.shape[1]


def _check_rows(values: torch.Tensor, name: str, rows: int, device: torch.device,
                dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A per-row argument as a contiguous (rows,) tensor of ``dtype`` (an expanded one is copied)."""
    if values.shape != (rows,) or values.dtype != dtype or values.device != device:
        raise ValueError(f"{name} must be a ({rows},) {dtype} tensor on {device}, got {tuple(values.shape)} "
                         f"{values.dtype} on {values.device}")
    return values.contiguous()


def _check_class_weight(class_weight: torch.Tensor | None, num_cols: int, device: torch.device,
                        ) -> torch.Tensor | None:
    if class_weight is None:
        return None
    if class_weight.shape != (num_cols,) or class_weight.dtype != torch.float32 or class_weight.device != device:
        raise ValueError(f"class_weight must be a ({num_cols},) float32 tensor on {device} (the weights of z's "
                         f"columns), got {tuple(class_weight.shape)} {class_weight.dtype} on {class_weight.device}")
    return class_weight.contiguous()
