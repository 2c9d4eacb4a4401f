"""How error grows with the number of chunks, and the power law that describes it.

A policy that rounds the weight gradient into the input dtype once per chunk
(``compact``, and torch's native op in several layouts) adds one rounding
error per chunk to an accumulator; if those errors are independent the total
grows like the square root of the chunk count. A policy that sums in fp32 and
rounds once stays at the rounding floor whatever the count. This module
measures error against the number of chunks on one problem, for lce's
policies and torch's op with the same options, and fits ``error ∝ chunks^p``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.core.fp64 import reference_outputs
from analysis.core.implementations import ImplSpec, make_implementation
from analysis.core.inputs import make_inputs
from analysis.core.metrics import compare
from analysis.core.problem import DTYPES, Shape
from lce.planning.options import EXPLICIT_POLICIES

__all__ = ["chunk_growth", "fit_power_law"]


def chunk_growth(shape: Shape, dtype: str, policies: tuple[str, ...] = EXPLICIT_POLICIES,
                 chunk_counts: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64), *, acc_dtype: str | None = "float32",
                 device: str = "cpu", peer: bool = True, seed: int = 0) -> pd.DataFrame:
    """Error (in floors) of every output for each policy and chunk count; one row per (impl, policy, chunks).

    ``device="cuda-emulated"`` runs lce's CUDA layouts on CPU tensors (torch's op
    is then skipped: it has no such mode). Chunk counts must divide ``shape.N``.
    """
    inputs = make_inputs(shape, DTYPES[dtype], seed=seed)
    exact = reference_outputs(inputs)
    ops = ("lce", "torch") if peer and device == "cpu" else ("lce",)
    rows = []
    for count in chunk_counts:
        if shape.N % count:
            raise ValueError(f"chunk_counts must divide N={shape.N}, got {count}")
        for policy in policies:
            for op in ops:
                spec = ImplSpec(op, policy, f"rows:{shape.N // count}", acc_dtype or "default")
                got = make_implementation(spec, device).run(inputs)
                row = {"impl": op, "policy": policy, "chunks": count, "dtype": dtype,
                       "acc_dtype": acc_dtype or "default", "device": device, "N": shape.N, "D": shape.D, "C": shape.C,
                       "seed": seed}
                for name, rep in compare(got, exact).items():
                    row[f"{name}_in_floors"] = rep.fro_in_floors
                rows.append(row)
    return pd.DataFrame(rows)


def fit_power_law(table: pd.DataFrame, column: str = "grad_weight_in_floors") -> pd.DataFrame:
    """Least-squares fit of ``log(error) = log(a) + p * log(chunks)`` per (impl, policy).

    Returns one row per group with the exponent ``p`` and prefactor ``a``; p ≈ 0.5
    is independent per-chunk rounding, p ≈ 0 no growth.
    """
    fits = []
    for (impl, policy), group in table.groupby(["impl", "policy"], sort=True):
        x = np.log(group["chunks"].to_numpy(dtype=float))
        y = np.log(group[column].to_numpy(dtype=float))
        slope, intercept = np.polyfit(x, y, 1) if len(group) > 1 else (0.0, float(y[0]))
        fits.append({"impl": impl, "policy": policy, "exponent": slope, "prefactor": float(np.exp(intercept)),
                     "at_max_chunks": float(group[column].iloc[-1])})
    return pd.DataFrame(fits)
