"""The implementations the numerics studies compare, run once per distinct arithmetic.

A study names its contenders as :class:`Contender` rows (a label, an
:class:`~analysis.core.implementations.ImplSpec`, the device it runs on, and
whether it sees the inputs upcast to fp32). :func:`run_contenders` runs them
on one set of inputs and returns each one's outputs in the input dtype.

Many lce contenders resolve to the same plan: with ``acc_dtype`` equal to the
input dtype every policy computes the same numbers, "compact" with a wider
``acc_dtype`` runs the balanced layout on CPU, "auto" is one of the explicit
policies. The chunk loop reads nothing of a plan but the dtypes its roles
resolve to and its chunk size, so contenders whose plans agree on those get
the outputs of one call (tests/analysis/test_numerics.py checks the shortcut against a real call).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pandas as pd
import torch

from analysis.core.implementations import ImplSpec, make_implementation
from analysis.core.inputs import Inputs, Outputs
from analysis.core.provenance import provenance
from analysis.core.results_io import Kind, append_rows, set_aside
from lce.planning.options import dtype_name

__all__ = ["Contender", "lce_contenders", "run_contenders", "Result", "LAYOUT_NAMES", "record_study",
           "plan_arithmetic"]

LAYOUT_NAMES: dict[str, str] = {"cpu": "cpu", "cuda-emulated": "cuda", "cuda": "cuda"}
"""Device of a contender -> the name of the lce layout table it runs (``cuda-emulated``: CUDA's on CPU tensors)."""


@dataclasses.dataclass(frozen=True)
class Contender:
    """One implementation in a study: ``spec`` on ``device``; ``upcast`` feeds it the fp32 upcast of the inputs
    (its outputs are rounded back to the input dtype, as a caller would store them)."""

    label: str
    spec: ImplSpec
    device: str = "cpu"
    upcast: bool = False

    @property
    def layout(self) -> str:
        """``cpu`` or ``cuda`` for lce (the layout table it runs); empty for the other ops."""
        return LAYOUT_NAMES[self.device] if self.spec.op == "lce" else ""


def lce_contenders(policies: Sequence[str], devices: Sequence[str], acc_dtypes: Sequence[str],
                   chunkings: Sequence[str] = ("auto",), name_chunking: bool = False) -> list[Contender]:
    """Every combination, labelled ``lce <policy> <layout> acc=<acc> [<chunking>]`` (chunking named when
    ``name_chunking`` or more than one is asked for). "auto" is taken with the default ``acc_dtype`` only: it
    resolves its own."""
    contenders = []
    for device in devices:
        for policy in policies:
            for acc in acc_dtypes:
                if policy == "auto" and acc != "default":
                    continue
                for chunking in chunkings:
                    short = {"default": "default", "float32": "fp32"}.get(acc, acc)
                    label = f"lce {policy} {LAYOUT_NAMES[device]} acc={short}"
                    if name_chunking or len(chunkings) > 1:
                        label += f" {chunking}"
                    contenders.append(Contender(label, ImplSpec("lce", policy, chunking, acc), device))
    return contenders


@dataclasses.dataclass(frozen=True)
class Result:
    """A contender's outputs (in the input dtype) and, for chunked ops, what its options resolved to."""

    outputs: Outputs
    resolved_policy: str = ""
    resolved_acc_dtype: str = ""
    num_chunks: int | None = None


def plan_arithmetic(plan) -> tuple:
    """What the chunk loop's numbers depend on: the dtypes each GEMM and sum resolve to (not the layout roles
    that name them, nor the policy name), the chunk size, the reduction, the gradients asked for and whether fp16
    gradients keep their headroom (:mod:`lce.passes.headroom`)."""
    gemms = tuple(plan.gemm_dtypes(name) for name in ("logits", "grad_input", "grad_weight"))
    return (plan.device_kind, plan.input_dtype, plan.acc_dtype, gemms, plan.weight_grad_sum_dtype,
            plan.stats_dtype, plan.rescales_grad_logits, plan.upcasts_weight_for("logits"),
            plan.upcasts_weight_for("grad_input"), plan.batch_chunk_size, plan.reduction, plan.needs_grad,
            plan.gradient_headroom)


def _rounded(outputs: Outputs, dtype: torch.dtype) -> Outputs:
    def cast(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t.to(dtype)

    return Outputs(cast(outputs.loss), cast(outputs.grad_input), cast(outputs.grad_weight), cast(outputs.grad_bias))


def run_contenders(contenders: Sequence[Contender], inputs: Inputs) -> dict[str, Result]:
    """Each contender's :class:`Result` on ``inputs``, by label; lce plans with the same arithmetic run once."""
    results: dict[str, Result] = {}
    done: dict[tuple, Outputs] = {}
    upcast = None
    for contender in contenders:
        implementation = make_implementation(contender.spec, contender.device)
        if not contender.spec.chunked:
            if contender.upcast:
                upcast = upcast or inputs.to(torch.float32)
                outputs = _rounded(implementation.run(upcast), inputs.dtype)
            else:
                outputs = implementation.run(inputs)
            results[contender.label] = Result(outputs)
            continue
        plan = implementation.plan(inputs)
        key = (contender.spec.op, contender.device, *plan_arithmetic(plan))
        if contender.spec.op != "lce" or key not in done:  # torch's op: its own arithmetic, always run
            done[key] = implementation.run(inputs)
        results[contender.label] = Result(done[key], plan.acc_policy, dtype_name(plan.acc_dtype), plan.num_chunks)
    return results


def record_study(path: Path, kind: Kind, measure: Callable[..., pd.DataFrame], *, provenance_device: str = "cpu",
                 **settings) -> tuple[Path, float]:
    """Run ``measure(**settings)`` and write its table to ``path`` as ``kind`` rows, with its wall time
    (``wall_s``), the CPU time of this process (``cpu_s``: on a shared machine, what the study costs one
    core) and provenance; an earlier file is moved to ``.previous`` (a study's file holds one
    measurement). Returns the path and the wall time in seconds."""
    started, cpu_started = time.perf_counter(), time.process_time()
    table = measure(**settings)
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
    set_aside(path)
    append_rows(path, kind.rows(table.assign(wall_s=seconds, cpu_s=cpu_seconds, **provenance(provenance_device))))
    return path, seconds
