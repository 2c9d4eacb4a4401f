"""Two measured defects of torch 2.13's chunked op, and what lce returns on the same inputs.

* **Loss drift**: the chunked loss summed across chunks in low precision moves
  away from the exact loss as the chunk count grows. Reported in units in the
  last place (ulps) of the output dtype at the exact loss.
* **All-ignored batch**: when every target equals ``ignore_index``, the
  reference path gives a NaN "mean" loss (0/0) and zero gradients; a chunked
  op that divides the gradients by the zero weight returns NaN gradients,
  which poison an optimizer step.
"""

from __future__ import annotations

import dataclasses
import math

import pandas as pd
import torch

from analysis.core.fp64 import fp64_loss
from analysis.core.implementations import ImplSpec, make_implementation
from analysis.core.inputs import make_inputs
from analysis.core.problem import DTYPES, Shape

__all__ = ["ulp", "loss_drift", "all_ignored_gradients"]

CHUNKED_OPS = ("lce", "torch")
"""The two chunked ops compared, each with default options but an explicit chunk size."""


def ulp(value: float, dtype: torch.dtype) -> float:
    """The spacing of ``dtype``'s numbers at ``value`` (for normal numbers)."""
    info = torch.finfo(dtype)
    if value == 0:
        return info.tiny * info.eps
    # eps is the spacing at 1.0, so the spacing in [2**e, 2**(e+1)) is eps * 2**e.
    return info.eps * 2.0 ** math.floor(math.log2(abs(value)))


def loss_drift(shape: Shape, dtype: str, chunk_counts: tuple[int, ...] = (1, 4, 16, 64, 256), *,
               seed: int = 0) -> pd.DataFrame:
    """Distance of the default-options loss from the exact loss, in ulps, per impl and chunk count."""
    inputs = make_inputs(shape, DTYPES[dtype], seed=seed)
    with torch.no_grad():
        exact = fp64_loss(inputs.to(torch.float64)).item()
        spacing = ulp(exact, DTYPES[dtype])
        rows = []
        for count in chunk_counts:
            if shape.N % count:
                raise ValueError(f"chunk_counts must divide N={shape.N}, got {count}")
            for op in CHUNKED_OPS:
                value = make_implementation(ImplSpec(op, "auto", f"rows:{shape.N // count}")).loss(inputs).item()
                rows.append({"impl": op, "chunks": count, "dtype": dtype, "N": shape.N, "D": shape.D, "C": shape.C,
                             "seed": seed, "loss": value, "exact_loss": exact,
                             "ulps_from_exact": abs(value - exact) / spacing})
    return pd.DataFrame(rows)


def all_ignored_gradients(shape: Shape | None = None, dtype: str = "float32",
                          reduction: str = "mean") -> pd.DataFrame:
    """Loss and gradient summary when every target is ignored: reference, lce and torch (default 64x16x100).

    lce and torch run default options with 16-row chunks. ``loss`` is the loss (its sum for ``"none"``).
    """
    shape = shape or Shape(64, 16, 100)
    inputs = make_inputs(shape, DTYPES[dtype], reduction=reduction)
    inputs = dataclasses.replace(inputs, target=torch.full_like(inputs.target, inputs.ignore_index))
    chunk_rows = 16
    specs = {"reference": ImplSpec("reference"),
             **{op: ImplSpec(op, "auto", f"rows:{chunk_rows}") for op in CHUNKED_OPS}}
    rows = []
    for impl, spec in specs.items():
        outputs = make_implementation(spec).run(inputs)
        grads = [g for g in (outputs.grad_input, outputs.grad_weight, outputs.grad_bias) if g is not None]
        rows.append({"impl": impl, "dtype": dtype, "N": shape.N, "D": shape.D, "C": shape.C, "seed": 0,
                     "chunk_rows": None if impl == "reference" else chunk_rows, "reduction": reduction,
                     "loss": outputs.loss.sum().item(),
                     **{f"{name}_nan_entries": int(g.isnan().sum()) for name, g in
                        zip(("grad_input", "grad_weight", "grad_bias"), grads, strict=False)},
                     "max_abs_finite_grad": max(float(g.nan_to_num(0).abs().max()) for g in grads)})
    return pd.DataFrame(rows)
