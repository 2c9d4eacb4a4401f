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

from analysis.core.fp64 import gradcheck
from analysis.core.implementations import ImplSpec, make_implementation
from analysis.core.inputs import OUTPUT_NAMES, Inputs
from lce.planning.options import EXPLICIT_POLICIES

__all__ = ["PathCase", "path_cases", "gradcheck_table", "parity_table", "parity_summary", "parity_by_path",
           "PARITY_TOLERANCE", "INPUTS_DESCRIPTION", "GRADCHECK_SHAPE", "PARITY_SHAPE"]

PARITY_TOLERANCE = 1e-13
"""Largest fp64 error against the reference path that still counts as rounding (fp64's eps is 2.2e-16)."""
GRADCHECK_SHAPE = (7, 3, 5)
"""N, D, C of the gradcheck inputs: tiny, so finite differences over every entry stay fast."""
PARITY_SHAPE = (61, 16, 97)
"""N, D, C of the parity inputs: odd sizes, so chunks come out uneven."""
INPUTS_DESCRIPTION = ("fp64 inputs x ~ N(0, 1), W ~ N(0, 4/D), b ~ N(0, 1), uniform targets; class weights "
                      "~ U[0.5, 1.5) and every 4th target ignored on the paths that use them (seed 0)")
"""What :func:`_inputs` draws, in words (the conclusions quote it)."""

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
    """fp64 inputs and call arguments of ``case`` (:data:`INPUTS_DESCRIPTION`; keep the two in step)."""
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
    n, d, c = GRADCHECK_SHAPE
    for case in cases if cases is not None else path_cases():
        inputs = _inputs(case, n, d, c)
        start = time.perf_counter()
        passed = gradcheck(case.spec(), inputs, device=case.device, raise_exception=False)
        rows.append({**dataclasses.asdict(case), "features": case.features(), "gradcheck": bool(passed),
                     "seconds": time.perf_counter() - start, "dtype": "float64", "N": n, "D": d, "C": c,
                     "seed": 0})
    return pd.DataFrame(rows)


def parity_table(cases: list[PathCase] | None = None, shape: tuple[int, int, int] = PARITY_SHAPE) -> pd.DataFrame:
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
        row = {**dataclasses.asdict(case), "features": case.features(), "dtype": "float64", "N": n, "D": d, "C": c,
               "seed": 0, "torch_path": "reference (fallback)" if caught else "chunked"}
        for name in OUTPUT_NAMES:
            exact = reference.get(name)
            if exact is None:
                continue
            scale = exact.abs().max().clamp_min(torch.finfo(torch.float64).tiny)
            row[f"lce_{name}"] = ((ours.get(name) - exact).abs().max() / scale).item()
            row[f"torch_{name}"] = ((theirs.get(name) - exact).abs().max() / scale).item()
        rows.append(row)
    return pd.DataFrame(rows)


def parity_summary(parity: pd.DataFrame, tolerance: float = PARITY_TOLERANCE) -> pd.DataFrame:
    """One row per output of a :func:`parity_table`: the worst lce error over every path, torch's over the
    paths where its chunked op ran (NaN if none), and whether each is within ``tolerance``."""
    chunked = parity[parity["torch_path"] == "chunked"]
    rows = []
    for name in OUTPUT_NAMES:
        if f"lce_{name}" not in parity or parity[f"lce_{name}"].isna().all():
            continue
        lce_worst = float(parity[f"lce_{name}"].max())
        torch_worst = float(chunked[f"torch_{name}"].max()) if len(chunked) else float("nan")
        rows.append({"output": name, "lce_worst": lce_worst, "torch_worst": torch_worst,
                     "lce_ok": lce_worst < tolerance,
                     "torch_ok": None if torch_worst != torch_worst else torch_worst < tolerance})
    return pd.DataFrame(rows)


def parity_by_path(parity: pd.DataFrame) -> pd.DataFrame:
    """One row per path of a :func:`parity_table`: its options and the worst error over the outputs, lce and torch."""
    def worst(prefix: str) -> pd.Series:
        columns = [f"{prefix}_{name}" for name in OUTPUT_NAMES if f"{prefix}_{name}" in parity]
        return parity[columns].max(axis=1)

    return parity[["device_kind", "policy", "chunking", "reduction", "features", "torch_path"]].assign(
        lce_worst=worst("lce"), torch_worst=worst("torch"))
