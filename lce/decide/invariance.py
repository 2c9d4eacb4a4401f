"""What batch invariance costs, and whether "auto" pays for it: per (device kind, input dtype), the fixed rows per
chunk of a batch-invariant call and whether ``batch_invariant=None`` turns it on for the loss.

A batch-invariant call runs every chunk at one number of rows, whatever N (the last chunk padded with ignored
rows), so that no GEMM or row statistic changes shape with the batch. Its rows must not follow N, so they cannot be
the aspect-ratio rule's; :func:`derive_invariance` picks them at the reference heads (and, on a CPU, each reference
CPU kind) from powers of two: among the sizes whose predicted time stays within :data:`INVARIANCE_COST` of the
"auto" pick's at every head (of the fastest size's, where none is that quick), the one with the least predicted
peak memory (summed relative to the pick's). The
loss's default (``batch_invariant=None``) keeps the contract where it is that cheap in time *and* memory, and never
in float16, whose gradient scales would have to follow the batch (:mod:`lce.passes.headroom`); the per-token
log-probabilities keep it wherever they can (RL scores one token in many batches). The auto table records both
answers and a test requires them to equal this derivation.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Mapping, Sequence

import torch

from ..planning.cpu_gemms import assumed_support
from ..planning.options import LinearCrossEntropyOptions, dtype_name
from ..planning.policies import AutoPick, auto_pick
from .procedure import REFERENCE_HEADS, Candidate, Head, evaluate_options, reference_contexts, rule_candidate

__all__ = ["INVARIANCE_COST", "INVARIANT_ROW_SIZES", "InvarianceDerivation", "derive_invariance",
           "invariance_table_rows"]

INVARIANCE_COST = 0.05
"""The most a batch-invariant default may cost: its predicted time and peak memory at every reference head at most
this share above the "auto" pick's (which chunks by the aspect ratio, its rows following N)."""

INVARIANT_ROW_SIZES: tuple[int, ...] = (64, 128, 256, 512, 1024, 2048, 4096)
"""The fixed rows per chunk the derivation weighs."""


@dataclasses.dataclass(frozen=True)
class InvarianceDerivation:
    """:func:`derive_invariance`'s answer for one (device kind, dtype): the fixed ``rows``, whether the loss's
    default keeps the contract (``by_default``, with ``reason``), and per candidate row size and context the
    time and peak-memory ratios to the "auto" pick's (1.0: the same)."""

    device_kind: str
    dtype: torch.dtype
    rows: int
    by_default: bool
    reason: str
    time_ratio: Mapping[int, Mapping[str, float]]
    memory_ratio: Mapping[int, Mapping[str, float]]

    def worst(self, rows: int | None = None) -> tuple[float, float]:
        """The largest time and memory ratio over the contexts at ``rows`` (default: the picked rows)."""
        rows = self.rows if rows is None else rows
        return max(self.time_ratio[rows].values()), max(self.memory_ratio[rows].values())


def _invariant_candidate(pick: AutoPick, rows: int, head: Head, dtype: torch.dtype, device_kind: str,
                         cpu_rate: float | None) -> Candidate:
    acc_dtype = torch.float32 if dtype in (torch.bfloat16, torch.float16) else None
    options = LinearCrossEntropyOptions(acc_policy=pick.acc_policy, acc_dtype=acc_dtype, batch_chunk_size=rows,
                                        batch_invariant=True)
    return evaluate_options(device_kind, options, head, dtype, cpu_rate)


def derive_invariance(device_kind: str, dtype: torch.dtype, heads: Sequence[Head] = REFERENCE_HEADS,
                      pick: AutoPick | None = None) -> InvarianceDerivation:
    """The fixed rows and the default of the batch-invariance contract for ``device_kind`` and ``dtype`` (see the
    module docstring); ``pick``: the "auto" entry to price it against (default: the table's)."""
    pick = pick or auto_pick(device_kind, dtype)
    time_ratio: dict[int, dict[str, float]] = {rows: {} for rows in INVARIANT_ROW_SIZES}
    memory_ratio: dict[int, dict[str, float]] = {rows: {} for rows in INVARIANT_ROW_SIZES}
    for name, head, support, rate in reference_contexts(device_kind, dtype, heads):
        with contextlib.nullcontext() if support is None else assumed_support(support):
            base = rule_candidate(pick.acc_policy, pick.chunking_method, head, dtype, device_kind, rate,
                                  min_rows=pick.min_rows)
            for rows in INVARIANT_ROW_SIZES:
                fixed = _invariant_candidate(pick, rows, head, dtype, device_kind, rate)
                time_ratio[rows][name] = fixed.seconds / base.seconds
                memory_ratio[rows][name] = fixed.peak_bytes / base.peak_bytes
    limit = 1.0 + INVARIANCE_COST
    fastest = min(max(time_ratio[rows].values()) for rows in INVARIANT_ROW_SIZES)
    quick = [rows for rows in INVARIANT_ROW_SIZES if max(time_ratio[rows].values()) <= limit * max(1.0, fastest)]
    chosen = min(quick, key=lambda rows: (round(sum(memory_ratio[rows].values()), 6), rows))
    worst_time, worst_memory = max(time_ratio[chosen].values()), max(memory_ratio[chosen].values())
    if dtype == torch.float16:
        by_default = False
        reason = (f"never by default in float16, whose power-of-two gradient scales would follow the batch; forced "
                  f"on (dz kept fp32 for the backward GEMMs), {chosen} fixed rows cost up to {worst_time - 1:+.1%} "
                  f"time and {worst_memory - 1:+.1%} peak memory at a reference head")
    elif worst_time > limit or worst_memory > limit:
        by_default = False
        reason = (f"{chosen} fixed rows cost up to {worst_time - 1:+.1%} time and {worst_memory - 1:+.1%} peak "
                  f"memory at a reference head, more than {INVARIANCE_COST:.0%}")
    else:
        by_default = True
        reason = (f"{chosen} fixed rows cost at most {worst_time - 1:+.1%} time and {worst_memory - 1:+.1%} peak "
                  f"memory at the reference heads")
    return InvarianceDerivation(device_kind, dtype, chosen, by_default, reason, time_ratio, memory_ratio)


def invariance_table_rows(derivations: Sequence[InvarianceDerivation]) -> list[tuple[str, ...]]:
    """The rows of the docs' invariance table: device, dtype, fixed rows, worst time and memory, default."""
    rows = [("device", "input", "fixed rows", "time (worst head)", "peak (worst head)", "loss default")]
    for d in derivations:
        worst_time, worst_memory = d.worst()
        rows.append((d.device_kind, dtype_name(d.dtype), str(d.rows), f"{worst_time - 1:+.1%}",
                     f"{worst_memory - 1:+.1%}", "invariant" if d.by_default else "not invariant"))
    return rows
