"""fp64 correctness of every chunked path: gradcheck, and agreement with the reference path.

A *path* is one combination of policy, chunking, reduction and the optional
features (bias, class weights, ignore_index, label smoothing), on one device
kind's layout table. In fp64 every policy should agree with the unfused
reference to about 1e-15: any larger difference is a bug, not rounding. The
same table is computed for torch 2.13's native chunked op next to lce's.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
import warnings

import pandas as pd
import torch

from lce.options import EXPLICIT_POLICIES

from ..implementations import ImplSpec, make_implementation
from ..inputs import OUTPUT_NAMES, Inputs
from ..reference import gradcheck

__all__ = ["PathCase", "path_cases", "gradcheck_table", "parity_table"]

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

    def spec(self, op: str = "lce") -> ImplSpec:
        """The implementation of this path for ``op`` ("lce" or "torch")."""
        return ImplSpec(op, self.policy, self.chunking)

    @property
    def device(self) -> str:
        """Where lce runs this path: the CUDA layout table is emulated on CPU tensors."""
        return "cuda-emulated" if self.device_kind == "cuda" else "cpu"

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
            itertools.product(kinds, EXPLICIT_POLICIES, chunkings, REDUCTIONS)):
        everything = chunking == "rows:3"
        cases.append(PathCase(policy, chunking, reduction, bias=everything or i % 2 == 0,
                              class_weight=everything or i % 3 == 0, ignore_index=everything or i % 2 == 1,
                              label_smoothing=0.1 if everything or i % 4 == 0 else 0.0, device_kind=kind))
    return cases


def _inputs(case: PathCase, n: int, d: int, c: int, seed: int = 0) -> Inputs:
    """fp64 inputs and call arguments of ``case``: class weights in [0.5, 1.5), every 4th target ignored."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=torch.float64)
    w = torch.randn(c, d, generator=g, dtype=torch.float64) / d**0.5 * 2
    b = torch.randn(c, generator=g, dtype=torch.float64) if case.bias else None
    target = torch.randint(0, c, (n,), generator=g)
    inputs = Inputs(x.requires_grad_(), w.requires_grad_(), None if b is None else b.requires_grad_(), target,
                    case.reduction, label_smoothing=case.label_smoothing)
    if case.class_weight:
        inputs.class_weight = torch.rand(c, generator=g, dtype=torch.float64) + 0.5
    if case.ignore_index:
        target[::4] = 1
        inputs.ignore_index = 1
    if case.reduction == "none":
        inputs.grad_output = torch.randn(n, generator=g, dtype=torch.float64)
    return inputs


def gradcheck_table(cases: list[PathCase] | None = None) -> pd.DataFrame:
    """``torch.autograd.gradcheck`` (fp64 finite differences) of lce on each path; one row per path."""
    rows = []
    for case in cases if cases is not None else path_cases():
        inputs = _inputs(case, n=7, d=3, c=5)
        start = time.perf_counter()
        passed = gradcheck(case.spec(), inputs, device=case.device, raise_exception=False)
        rows.append({**dataclasses.asdict(case), "features": case.features(), "gradcheck": bool(passed),
                     "seconds": time.perf_counter() - start})
    return pd.DataFrame(rows)


def parity_table(cases: list[PathCase] | None = None, shape: tuple[int, int, int] = (61, 16, 97)) -> pd.DataFrame:
    """Largest error of lce and of torch's native op against the fp64 reference path, per path.

    The error of an output is ``max |value - ref| / max |ref|`` (an elementwise
    maximum, normalised by the output's scale). ``torch_path`` says whether
    torch's chunked op ran or fell back to its reference path (with a warning).
    torch's op has no CUDA-layout emulation: it runs its CPU path on every case.
    """
    n, d, c = shape
    rows = []
    for case in cases if cases is not None else path_cases():
        inputs = _inputs(case, n, d, c)
        reference = make_implementation(ImplSpec("reference")).run(inputs)
        ours = make_implementation(case.spec(), case.device).run(inputs)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            theirs = make_implementation(case.spec("torch")).run(inputs)
        row = {**dataclasses.asdict(case), "features": case.features(),
               "torch_path": "reference (fallback)" if caught else "chunked"}
        for name in OUTPUT_NAMES:
            exact = reference.get(name)
            if exact is None:
                continue
            scale = exact.abs().max().clamp_min(torch.finfo(torch.float64).tiny)
            row[f"lce_{name}"] = ((ours.get(name) - exact).abs().max() / scale).item()
            row[f"torch_{name}"] = ((theirs.get(name) - exact).abs().max() / scale).item()
        rows.append(row)
    return pd.DataFrame(rows)
