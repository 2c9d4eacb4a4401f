"""Notebook 01 (fp64: are lce's gradients the derivatives of its loss, and is every path exact?): its key
numbers, from the tables :mod:`analysis.studies.fp64_checks` measures when the notebook runs.

The notebook's prose quotes these numbers; ``tests/claims/test_nb01_gradcheck.py`` asserts each claim the
prose makes about them.
"""

from __future__ import annotations

import dataclasses

import pandas as pd

from analysis.studies.fp64_checks import PARITY_TOLERANCE, parity_summary

__all__ = ["GradcheckNumbers", "gradcheck_numbers", "ParityNumbers", "parity_numbers"]


@dataclasses.dataclass(frozen=True)
class GradcheckNumbers:
    """How many chunked paths ``torch.autograd.gradcheck`` passed, over which layout tables and shape."""

    paths: int
    passed: int
    layouts: str
    shape: str
    failed: pd.DataFrame  # the paths that failed (policy, chunking, reduction, features, layouts)


def _shape(table: pd.DataFrame) -> str:
    shapes = table[["N", "D", "C"]].drop_duplicates()
    return ", ".join(f"{r.N}×{r.D}×{r.C}" for r in shapes.itertuples())


def gradcheck_numbers(table: pd.DataFrame) -> GradcheckNumbers:
    """From a :func:`~analysis.studies.fp64_checks.gradcheck_table`."""
    passed = table["gradcheck"].astype(bool)
    return GradcheckNumbers(len(table), int(passed.sum()), " and ".join(sorted(set(table["device_kind"]))),
                            _shape(table), table.loc[~passed, ["device_kind", "policy", "chunking", "reduction",
                                                                 "features"]])


@dataclasses.dataclass(frozen=True)
class ParityNumbers:
    """The worst fp64 error against the reference path (relative to each output's largest entry), lce's over
    every path and torch's over the paths where its chunked op ran, and the bound that counts as rounding."""

    paths: int
    tolerance: float
    lce_worst: float
    torch_chunked_paths: int
    torch_worst: float
    torch_fallback_features: tuple[str, ...]  # the feature sets of the paths where torch fell back
    per_output: pd.DataFrame  # output, lce_worst, torch_worst


def parity_numbers(table: pd.DataFrame, tolerance: float = PARITY_TOLERANCE) -> ParityNumbers:
    """From a :func:`~analysis.studies.fp64_checks.parity_table`."""
    summary = parity_summary(table, tolerance)
    chunked = table["torch_path"] == "chunked"
    return ParityNumbers(len(table), tolerance, float(summary["lce_worst"].max()), int(chunked.sum()),
                         float(summary["torch_worst"].max()), tuple(sorted(set(table.loc[~chunked, "features"]))),
                         summary[["output", "lce_worst", "torch_worst"]])
