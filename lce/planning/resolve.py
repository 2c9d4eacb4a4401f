"""Resolve options against one call into a :class:`~lce.planning.plan.Plan`: the one place a call's options meet
its shapes, dtype and device.

In order: the "auto" entry for (device kind, dtype) (:func:`~lce.planning.policies.auto_pick`), the chunking (a
method's size, an explicit size, "auto"'s floor on rows), ``acc_dtype``, the layout -- one row of
:mod:`lce.planning.policies`' table, chosen by device kind, policy and whether the input dtype's GEMMs are fast on
this device, never rewritten after the lookup --, the backend of the elementwise passes (:mod:`lce.kernels`, or the
PyTorch ops and why) and the CUDA GEMM paths the device has (:mod:`lce.planning.device`), then the buffers all that
allocates (:mod:`lce.planning.memory_model`).
"""

from __future__ import annotations

import dataclasses

import torch

from .. import kernels
from .blocks import block_elements
from .cpu_gemms import LOW_PRECISION, GemmSupport, gemm_support
from .device import device_kind_of, has_mixed_precision_mm, mixed_addmm_supported, mixed_mm_supported
from .memory_model import plan_buffers
from .options import LinearCrossEntropyOptions, dtype_name, parse_chunking_method
from .plan import HEADROOM_OFF, INVARIANT_ROW_MULTIPLE, GradsNeeded, Op, Plan, aspect_ratio_chunk_size
from .policies import COMPACT_ON_CPU_NOTE, LAYOUTS, AutoPick, Layout, auto_pick, layout_of

__all__ = ["make_plan"]


def make_plan(
    options: LinearCrossEntropyOptions,
    *,
    num_rows: int,
    in_features: int,
    num_classes: int,
    dtype: torch.dtype,
    device: torch.device,
    reduction: str = "mean",
    needs_grad: tuple[bool, bool, bool] = (True, True, False),
    softcap: float | None = None,
    z_loss: float = 0.0,
    return_lse: bool = False,
    chunking_classes: int | None = None,
    loss_dtype: torch.dtype | None = None,
    op: Op = "cross_entropy",
    returns_entropy: bool = False,
    autocast: torch.dtype | None = None,
) -> Plan:
    """Resolve ``options`` for one call (the rules of the options contract).

    * ``"auto"`` policy/chunking come from :func:`lce.planning.policies.auto_pick` for
      (device kind, dtype); an explicit ``batch_chunk_size`` switches "auto"
      chunking off;
    * an explicit chunking method decides the size; a ``batch_chunk_size``
      that disagrees with it is a ``ValueError``;
    * ``acc_dtype=None`` becomes fp32 for fp16/bf16 input under the "auto"
      policy where a mixed-precision GEMM exists, else the input dtype.

    ``softcap``, ``z_loss`` and ``return_lse`` are lce's features beyond torch's
    op (see :func:`lce.linear_cross_entropy`); they change what the loop
    computes and keeps, not the chunking or the precision layout.

    ``op="log_probs"`` plans :func:`lce.linear_log_probs` (``reduction`` must then be "none", its per-row
    structure; ``returns_entropy`` says whether the entropy is computed).

    ``chunking_classes`` (default ``num_classes``) is the class count the row
    chunking is sized for. :mod:`lce.distributed` passes the largest shard of
    its group, so that every rank walks the same row chunks, and so issues the
    same collectives in the same order, whatever the size of its own shard.
    """
    if op == "log_probs" and (reduction != "none" or z_loss or return_lse or loss_dtype is not None):
        raise ValueError("a log_probs plan has per-row outputs (reduction 'none') and none of the loss's features "
                         f"(z_loss, return_lse, loss_dtype); got reduction={reduction!r}, z_loss={z_loss!r}, "
                         f"return_lse={return_lse!r}, loss_dtype={loss_dtype!r}")
    sizing_classes = num_classes if chunking_classes is None else chunking_classes
    kind = device_kind_of(device)
    pick = auto_pick(kind, dtype)
    policy = pick.acc_policy if options.acc_policy == "auto" else options.acc_policy
    method = options.chunking_method
    if method == "auto":
        method = None if options.batch_chunk_size is not None else pick.chunking_method

    notes: list[str] = []
    acc_dtype = options.acc_dtype
    if acc_dtype is None:
        use_fp32 = options.acc_policy == "auto" and has_mixed_precision_mm(device, kind, dtype)
        acc_dtype = torch.float32 if use_fp32 else dtype
    invariant, why_not = _batch_invariance(options, dtype, acc_dtype, pick, op)
    if invariant:  # rows that do not follow N: the given size, or the auto table's; the last chunk padded to it
        asked = options.batch_chunk_size or pick.invariant_rows
        chunk, method = -(-asked // INVARIANT_ROW_MULTIPLE) * INVARIANT_ROW_MULTIPLE, None
        if chunk != asked:
            notes.append(f"batch_chunk_size={asked} rounded up to {chunk} rows, a multiple of {INVARIANT_ROW_MULTIPLE},"
                         " as batch invariance needs")
    elif method is None:
        chunk = num_rows if options.batch_chunk_size is None else min(options.batch_chunk_size, num_rows)
    else:
        chunk = aspect_ratio_chunk_size(num_rows, in_features, sizing_classes, parse_chunking_method(method))
        if options.batch_chunk_size is not None and options.batch_chunk_size != chunk:
            raise ValueError(
                f"batch_chunk_size={options.batch_chunk_size} disagrees with chunking_method="
                f"{method!r}, which gives {chunk} rows for N={num_rows}, D={in_features}, "
                f"C={sizing_classes}; pass only one of them"
            )
        if options.chunking_method == "auto" and chunk < min(pick.min_rows, num_rows):
            chunk = min(pick.min_rows, num_rows)
            why = "each step's fixed cost" if kind == "cuda" else "GEMM efficiency"
            notes.append(f"auto chunking on {kind} keeps at least {pick.min_rows} rows per chunk ({why})")
    chunk = max(1, chunk)
    padded_rows = -(-num_rows // chunk) * chunk if invariant else num_rows
    if why_not:
        notes.append(f"not batch-invariant: {why_not}")

    support = gemm_support(dtype) if device.type == "cpu" and dtype in LOW_PRECISION else None
    narrow_fast = kind != "cpu" or support is None or not (dtype == torch.float16 or support.slower_than_fp32)
    narrow_dz = not (invariant and dtype == torch.float16)  # an fp16 dz's power-of-two scale follows the batch
    layout = layout_of(kind, policy, narrow_fast, narrow_dz)
    if acc_dtype != dtype:  # what the table's row means here (with acc_dtype == dtype every row computes alike)
        notes += _layout_notes(kind, policy, dtype, support, layout)

    passes = _passes_backend(op, device, torch.float64 if dtype == torch.float64 else torch.float32, softcap)
    plan = Plan(
        device_kind=kind,
        input_dtype=dtype,
        acc_dtype=acc_dtype,
        acc_policy=policy,
        chunking_method=method,
        batch_chunk_size=chunk,
        class_chunk_size=max(1, min(options.class_chunk_size or num_classes, num_classes)),
        num_rows=num_rows,
        in_features=in_features,
        num_classes=num_classes,
        reduction=reduction,
        layout=layout,
        needs_grad=GradsNeeded(*needs_grad),
        allow_retain_graph=options.allow_retain_graph,
        notes=tuple(notes),
        softcap=None if softcap is None else float(softcap),
        z_loss=float(z_loss),
        return_lse=bool(return_lse),
        loss_dtype=loss_dtype,
        cpu_gemms=support,
        op=op,
        returns_entropy=bool(returns_entropy) and op == "log_probs",
        gradient_headroom=dtype == torch.float16 and not HEADROOM_OFF.get() and not invariant,
        batch_invariant=invariant,
        padded_rows=padded_rows,
        fused_passes=passes[0],
        passes_reason=passes[1],
        mixed_addmm=kind == "cuda" and mixed_addmm_supported(device),
        cuda_gemms=_cuda_gemms_text(device) if kind == "cuda" else "",
        autocast=autocast,
    )
    return dataclasses.replace(plan, buffers=plan_buffers(plan))


def _passes_backend(op: Op, device: torch.device, stats_dtype: torch.dtype, softcap: float | None,
                    ) -> tuple[bool, str]:
    """Whether the elementwise passes run as :mod:`lce.kernels`' Triton kernels, and why (or why not), in words."""
    if op != "cross_entropy":
        return False, "PyTorch ops (the per-token log-probabilities' passes have no kernels)"
    if not kernels.available(device):
        return False, f"PyTorch ops ({kernels.unavailable_reason(device) or 'the kernels switched off'})"
    reason = kernels.uncovered(stats_dtype=stats_dtype, softcap=softcap)
    if reason is not None:
        return False, f"PyTorch ops ({reason})"
    how = "interpreted" if device.type == "cpu" else "compiled"
    return True, (f"two fused Triton kernels per step (lce.kernels: statistics, then dz in place; triton "
                  f"{kernels.triton_version()}, {how})")


def _cuda_gemms_text(device: torch.device) -> str:
    """How a CUDA plan's mixed-precision GEMMs run on ``device``, in words (see :attr:`Plan.cuda_gemms`)."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return ("not probed (no GPU): low-precision products with an fp32 result planned as torch.mm(out_dtype), "
                f"the weight-gradient sum as blocks of {block_elements('cuda'):,} elements")
    mm = ("torch.mm(out_dtype=float32)" if mixed_mm_supported(device)
          else "operands upcast to fp32 first (this build has no torch.mm(out_dtype): a full fp32 copy of each "
               "operand beside the GEMM, which the predicted peak does not count)")
    addmm = ("one torch.addmm(out_dtype=float32, out=) per chunk" if mixed_addmm_supported(device)
             else f"blocks of {block_elements('cuda'):,} elements (this build has no torch.addmm(out_dtype, out=))")
    return f"probed on {device}: low-precision products with an fp32 result by {mm}; the weight-gradient sum by {addmm}"


def _batch_invariance(options: LinearCrossEntropyOptions, dtype: torch.dtype, acc_dtype: torch.dtype,
                      pick: AutoPick, op: str) -> tuple[bool, str]:
    """Whether the call is batch-invariant (see :attr:`LinearCrossEntropyOptions.batch_invariant`), and, where
    it is not, why. ``None`` resolves to True for the per-token log-probabilities (what RL scores in many batches);
    for the loss, where "auto" sizes the chunks (no ``batch_chunk_size``, ``chunking_method="auto"``), to the auto
    table's :attr:`~lce.planning.policies.AutoPick.batch_invariant`, else to False (chunks sized as torch's are);
    never in float16 or with an explicit ``chunking_method``."""
    explicit_method = options.chunking_method not in (None, "auto")
    if options.batch_invariant is True:
        if explicit_method:
            raise ValueError(f"batch_invariant=True needs rows per chunk that do not follow N, but chunking_method="
                             f"{options.chunking_method!r} sizes them from N; use chunking_method='auto' or a "
                             "batch_chunk_size")
        if dtype == torch.float16 and acc_dtype == torch.float16:
            raise ValueError(f"batch_invariant=True with float16 input needs a wider acc_dtype, got acc_policy="
                             f"{options.acc_policy!r} with acc_dtype={options.acc_dtype}, which computes in float16 "
                             "(an fp16 dz needs a power-of-two scale that follows the batch); pass "
                             "acc_dtype=torch.float32")
        return True, ""
    if options.batch_invariant is False:
        return False, "batch_invariant=False"
    if explicit_method:
        return False, f"chunking_method={options.chunking_method!r} sizes the chunks from N"
    if dtype == torch.float16:
        return False, ("float16: its power-of-two gradient scales follow the batch (batch_invariant=True keeps dz "
                       "in fp32 for the backward GEMMs instead: slower on CUDA)")
    if op == "log_probs":
        return True, ""
    if options.batch_chunk_size is not None or options.chunking_method is None:
        return False, ("the options size the chunks as torch's do (batch_chunk_size, or one chunk of N); "
                       "batch_invariant=True pads the last chunk to batch_chunk_size rows instead")
    if pick.batch_invariant:
        return True, ""
    return False, ("the auto table leaves the loss's default not batch-invariant here: fixed chunks cost more than "
                   "5% time or memory at a reference head (docs/policies.md); batch_invariant=True turns it on")


def _layout_notes(kind: str, policy: str, dtype: torch.dtype, support: GemmSupport | None,
                  layout: Layout) -> list[str]:
    """Why a CPU plan with a wider ``acc_dtype`` runs the row it does, where that differs from the policy's own
    row of :data:`~lce.planning.policies.LAYOUTS` or from torch's options contract reads."""
    if kind != "cpu":
        return []
    notes = [COMPACT_ON_CPU_NOTE] if policy == "compact" else []
    if support is None or layout == LAYOUTS[kind][policy]:
        return notes
    if dtype == torch.float16:
        return [*notes, "fp16 GEMMs run in acc_dtype on CPU: no CPU measured runs them faster than fp32 (emulated, "
                        "or at about fp32's rate), so narrow ones would only lose precision"]
    how = "emulated on this CPU" if support.emulated else "slower than fp32's on this CPU"
    return [*notes, f"{dtype_name(dtype)} GEMMs are {how} ({support.source}: lce.planning.cpu_gemms): the "
                    f"policy's {dtype_name(dtype)} GEMMs run in acc_dtype instead (exact upcasts: the same or less "
                    "error, at fp32's speed)"]
