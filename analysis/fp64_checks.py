"""fp64 correctness of every chunked path: gradcheck, and agreement with the reference path.

A *path* is one combination of policy, chunking, reduction and the optional
features (bias, class weights, ignore_index, label smoothing), on one device
kind's layout table. In fp64 every policy should agree with the unfused
reference to about 1e-15: any larger difference is a bug, not rounding. The
same table is computed for torch 2.13's native chunked op next to lce's.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import time
import warnings

import pandas as pd
import torch
import torch.nn.functional as F

import lce
from lce.testing import emulate_device_kind

from .inputs import OUTPUT_NAMES

__all__ = ["PathCase", "path_cases", "gradcheck_table", "parity_table"]

POLICIES = ("accurate", "balanced", "compact")
CHUNKINGS = ("aspect_ratio", "aspect_ratio:4", "rows:3")
REDUCTIONS = ("mean", "sum", "none")


@dataclasses.dataclass(frozen=True)
class PathCase:
    """One chunked path. ``chunking`` is a chunking_method or ``"rows:K"`` (batch_chunk_size=K)."""

    policy: str
    chunking: str
    reduction: str
    bias: bool = False
    class_weight: bool = False
    ignore_index: bool = False
    label_smoothing: float = 0.0
    device_kind: str = "cpu"

    def options(self, **extra) -> lce.LinearCrossEntropyOptions:
        if self.chunking.startswith("rows:"):
            chunking = dict(chunking_method=None, batch_chunk_size=int(self.chunking.split(":")[1]))
        else:
            chunking = dict(chunking_method=self.chunking)
        return lce.LinearCrossEntropyOptions(acc_policy=self.policy, **chunking, **extra)

    def features(self) -> str:
        names = [name for name, on in (("bias", self.bias), ("class weight", self.class_weight),
                                       ("ignore_index", self.ignore_index),
                                       ("smoothing", self.label_smoothing)) if on]
        return ", ".join(names) or "-"


def path_cases(quick: bool = True) -> list[PathCase]:
    """Every policy x chunking x reduction x device kind; the optional features rotate through them.

    The rotation gives each feature every policy and reduction somewhere, and one
    row per (policy, reduction) switches everything on. ``quick`` keeps the CPU
    layouts and one chunking method besides the explicit size.
    """
    kinds = ("cpu",) if quick else ("cpu", "cuda")
    chunkings = ("aspect_ratio:4", "rows:3") if quick else CHUNKINGS
    cases = []
    for i, (kind, policy, chunking, reduction) in enumerate(
            itertools.product(kinds, POLICIES, chunkings, REDUCTIONS)):
        everything = chunking == "rows:3"
        cases.append(PathCase(policy, chunking, reduction, bias=everything or i % 2 == 0,
                              class_weight=everything or i % 3 == 0, ignore_index=everything or i % 2 == 1,
                              label_smoothing=0.1 if everything or i % 4 == 0 else 0.0, device_kind=kind))
    return cases


def _arguments(case: PathCase, n: int, d: int, c: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=torch.float64)
    w = torch.randn(c, d, generator=g, dtype=torch.float64) / d**0.5 * 2
    b = torch.randn(c, generator=g, dtype=torch.float64) if case.bias else None
    target = torch.randint(0, c, (n,), generator=g)
    kwargs = dict(reduction=case.reduction, label_smoothing=case.label_smoothing)
    if case.class_weight:
        kwargs["weight"] = torch.rand(c, generator=g, dtype=torch.float64) + 0.5
    if case.ignore_index:
        target[::4] = 1
        kwargs["ignore_index"] = 1
    grad_output = torch.randn(n, generator=g, dtype=torch.float64) if case.reduction == "none" else None
    return x, w, b, target, kwargs, grad_output


def _chunked_loss(case: PathCase, target: torch.Tensor, kwargs: dict, x: torch.Tensor, w: torch.Tensor,
                  *bias: torch.Tensor) -> torch.Tensor:
    """lce's loss on ``case``'s path (retain-graph on: gradcheck runs backward repeatedly)."""
    with emulate_device_kind(case.device_kind):
        return lce.linear_cross_entropy(x, w, target, linear_bias=bias[0] if bias else None,
                                        options=case.options(allow_retain_graph=True), **kwargs)


def gradcheck_table(cases: list[PathCase] | None = None) -> pd.DataFrame:
    """``torch.autograd.gradcheck`` (fp64 finite differences) of lce on each path; one row per path."""
    rows = []
    for case in cases if cases is not None else path_cases():
        x, w, b, target, kwargs, _ = _arguments(case, n=7, d=3, c=5)
        leaves = [t.requires_grad_() for t in (x, w, b) if t is not None]
        loss = functools.partial(_chunked_loss, case, target, kwargs)
        start = time.perf_counter()
        passed = torch.autograd.gradcheck(loss, tuple(leaves), eps=1e-6, atol=1e-8, rtol=1e-6,
                                          raise_exception=False)
        rows.append({**dataclasses.asdict(case), "features": case.features(), "gradcheck": bool(passed),
                     "seconds": time.perf_counter() - start})
    return pd.DataFrame(rows)


def _loss_and_grads(fn, case: PathCase, n: int, d: int, c: int, **extra):
    x, w, b, target, kwargs, grad_output = _arguments(case, n, d, c)
    leaves = [t.requires_grad_() for t in (x, w, b) if t is not None]
    with emulate_device_kind(case.device_kind):
        loss = fn(x, w, target, linear_bias=b, **kwargs, **extra)
    grads = torch.autograd.grad(loss, leaves, grad_output)
    return (loss.detach(), *grads)


def parity_table(cases: list[PathCase] | None = None, shape: tuple[int, int, int] = (61, 16, 97)) -> pd.DataFrame:
    """Largest error of lce and of torch's native op against the fp64 reference path, per path.

    The error of an output is ``max |value - ref| / max |ref|`` (an elementwise
    maximum, normalised by the output's scale). ``torch_path`` says whether
    torch's chunked op ran or fell back to its reference path (with a warning).
    """
    n, d, c = shape
    rows = []
    for case in cases if cases is not None else path_cases():
        reference = _loss_and_grads(lce.linear_cross_entropy, case, n, d, c)
        ours = _loss_and_grads(lce.linear_cross_entropy, case, n, d, c, options=case.options())
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            peer_options = torch.nn.LinearCrossEntropyOptions(**{
                f.name: getattr(case.options(), f.name) for f in dataclasses.fields(lce.LinearCrossEntropyOptions)})
            theirs = _loss_and_grads(F.linear_cross_entropy, case, n, d, c, options=peer_options)
        row = {**dataclasses.asdict(case), "features": case.features(),
               "torch_path": "reference (fallback)" if caught else "chunked"}
        names = [name for name in OUTPUT_NAMES if name != "grad_bias" or case.bias]
        for name, mine, peer, exact in zip(names, ours, theirs, reference, strict=False):
            scale = exact.abs().max().clamp_min(torch.finfo(torch.float64).tiny)
            row[f"lce_{name}"] = ((mine - exact).abs().max() / scale).item()
            row[f"torch_{name}"] = ((peer - exact).abs().max() / scale).item()
        rows.append(row)
    return pd.DataFrame(rows)
