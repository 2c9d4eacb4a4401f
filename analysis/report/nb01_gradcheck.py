"""Notebook 01 (fp64 gradcheck and parity): its conclusions.
"""

from __future__ import annotations

import pandas as pd

from analysis.report.wording import _conclusion, _features, _join, _paths, _shapes


def gradcheck(table: pd.DataFrame, *, cpu: str) -> str:
    """01: did ``torch.autograd.gradcheck`` pass on every path (a ``fp64_checks.gradcheck_table``)?"""
    from analysis.studies.fp64_checks import INPUTS_DESCRIPTION

    failed = table[~table["gradcheck"].astype(bool)]
    if failed.empty:
        finding = (f"lce's analytic gradients are the derivatives of its loss on all {len(table)} chunked paths: "
                   "`torch.autograd.gradcheck` (fp64 finite differences) passed on every one.")
        bullets = []
    else:
        finding = f"gradcheck **failed** on {len(failed)} of {len(table)} paths:"
        bullets = [f"{r.policy}, {r.chunking}, {r.reduction}, {r.features} ({r.device_kind} layouts)"
                   for r in failed.itertuples()]
    quick = "" if "cuda" in set(table["device_kind"]) else (
        "the CUDA layout table is not in this quick run (`LCE_QUICK=0` adds it); ")
    return _conclusion(
        finding, bullets,
        inputs=(f"{_paths(table)}, paths with features: {_features(table)}; {INPUTS_DESCRIPTION}; "
                f"{_shapes(table)}, float64; run on {cpu} when the notebook executed."),
        limits=(f"{quick}one tiny shape and one seed; gradcheck shows that the gradients are those of lce's own "
                "loss, not that the loss is right: the next section compares it with the reference."))


def parity(table: pd.DataFrame, *, cpu: str, tolerance: float | None = None) -> str:
    """01: does every chunked path equal the reference path in fp64, lce's and torch's (a ``parity_table``)?"""
    from analysis.studies.fp64_checks import INPUTS_DESCRIPTION, PARITY_TOLERANCE, parity_summary

    tolerance = PARITY_TOLERANCE if tolerance is None else tolerance
    summary = parity_summary(table, tolerance)
    worst = summary["lce_worst"].max()
    per_output = ", ".join(f"{r.output} {r.lce_worst:.1e}" for r in summary.itertuples())
    if summary["lce_ok"].all():
        finding = (f"In fp64 every chunked lce path agrees with the reference path to within {worst:.1e} of each "
                   f"output's largest entry (worst per output: {per_output}), below the {tolerance:.0e} bound: "
                   "chunking adds nothing beyond rounding.")
    else:
        bad = summary[~summary["lce_ok"].astype(bool)]["output"]
        finding = (f"lce **disagrees** with the reference path beyond the {tolerance:.0e} bound on "
                   f"{_join(list(bad))} (worst {worst:.1e}; per output: {per_output}).")
    chunked = table[table["torch_path"] == "chunked"]
    fallback = len(table) - len(chunked)
    if chunked.empty:
        torch_text = f"torch 2.13's op fell back to its reference path on all {len(table)} paths."
    else:
        torch_worst = summary["torch_worst"].max()
        verdict = "within" if torch_worst < tolerance else "**beyond**"
        fell_back = table[table["torch_path"] != "chunked"]["features"].str.contains("smoothing", regex=False)
        chunked_smoothing = chunked["features"].str.contains("smoothing", regex=False).any()
        why = " (the paths with label smoothing)" if fell_back.all() and not chunked_smoothing else ""
        torch_text = (f"torch 2.13's chunked op ran on {len(chunked)} of {len(table)} paths and is {verdict} the "
                      f"same bound there (worst {torch_worst:.1e}); on the other {fallback}{why} it fell back to "
                      "its reference path, so those say nothing about its chunking.")
    return _conclusion(
        finding, [torch_text],
        inputs=(f"{_paths(table)}; {INPUTS_DESCRIPTION}; {_shapes(table)}, float64; error = "
                f"max |value − ref| / max |ref| per output; run on {cpu} when the notebook executed."),
        limits=("one shape and one seed; fp64 only, where rounding is negligible: this shows the algebra is "
                "right, not how accurate low precision is (notebook 02)."))
