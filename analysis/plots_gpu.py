"""What a lent GPU's data adds to the figures: how faithful the CUDA layouts' CPU stand-in was.

``cuda-emulated`` runs (lce's CUDA layouts on CPU tensors, products exact, only the fp32 summation order
differs from cuBLAS) stand in for the GPU in every committed grid. When ``cuda.csv`` from
``python -m analysis gpu-check`` is committed, the same configuration on the same inputs (family, seed,
shape, dtype, policy, chunking, acc_dtype) exists on both; :func:`emulated_vs_real` pairs them and
:func:`plot_emulated_vs_real` draws one point per pair and gradient. Without such pairs nothing is drawn.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .plots import PALETTE, CaptionedFigure, _figure, _log_axes, _style

__all__ = ["PAIR_KEYS", "GRADIENTS", "emulated_vs_real", "plot_emulated_vs_real", "draw_all"]

PAIR_KEYS: tuple[str, ...] = ("op", "dtype", "N", "D", "C", "policy", "chunking", "acc_dtype", "bias", "family",
                              "seed")
"""What must match for an emulated run and a real one to be the same computation on the same inputs."""
GRADIENTS: tuple[str, ...] = ("grad_input", "grad_weight")
_MARKERS = {"bfloat16": "o", "float16": "s", "float32": "^"}


def emulated_vs_real(table: pd.DataFrame) -> pd.DataFrame:
    """One row per lce configuration run both emulated (``cuda-emulated``) and on a GPU (``cuda``, TF32 off), with
    each gradient's Frobenius error in floors from both (``<grad>_emulated``, ``<grad>_real``) and their ratio
    (``<grad>_ratio``, real over emulated); empty without pairs."""
    columns = [f"{grad}_fro_in_floors" for grad in GRADIENTS]
    needed = {"device", "status", "resolved_policy", *PAIR_KEYS, *columns}
    if table.empty or not needed <= set(table.columns):
        return pd.DataFrame()
    ok = table[(table["status"] == "ok") & (table["op"] == "lce")]
    keep = [*PAIR_KEYS, "resolved_policy", *columns]
    emulated = ok[ok["device"] == "cuda-emulated"][keep]
    real = ok[ok["device"] == "cuda"][[*PAIR_KEYS, *columns]]
    pairs = emulated.merge(real, on=list(PAIR_KEYS), suffixes=("_emulated", "_real"))
    for grad in GRADIENTS:
        pairs = pairs.rename(columns={f"{grad}_fro_in_floors_emulated": f"{grad}_emulated",
                                      f"{grad}_fro_in_floors_real": f"{grad}_real"})
        pairs[f"{grad}_ratio"] = pairs[f"{grad}_real"] / pairs[f"{grad}_emulated"]
    return pairs.reset_index(drop=True)


def plot_emulated_vs_real(table: pd.DataFrame) -> CaptionedFigure | None:
    """Per gradient, each pair's error on the GPU against its emulated error, coloured by the layout (resolved
    policy) and marked by dtype; the diagonal is a faithful stand-in. None without pairs."""
    pairs = emulated_vs_real(table)
    if pairs.empty:
        return None
    _style()
    fig = _figure(7.5, 3.4)
    axes = fig.subplots(1, len(GRADIENTS))
    for ax, grad in zip(axes, GRADIENTS, strict=True):
        data = pairs.dropna(subset=[f"{grad}_emulated", f"{grad}_real"])
        for (policy, dtype), group in data.groupby(["resolved_policy", "dtype"], sort=True):
            ax.scatter(group[f"{grad}_emulated"], group[f"{grad}_real"], s=14, alpha=0.7,
                       color=PALETTE.get(policy, PALETTE[""]), marker=_MARKERS.get(dtype, "o"),
                       label=f"{policy} {dtype}")
        values = data[[f"{grad}_emulated", f"{grad}_real"]].to_numpy(dtype=float)
        low, high = (np.nanmin(values), np.nanmax(values)) if values.size else (1.0, 2.0)
        ax.plot([low, high], [low, high], color="0.4", lw=0.8, ls="--")
        _log_axes(ax)
        ax.set_title(grad, fontsize=9)
        ax.set_xlabel("emulated on CPU (floors)")
        ax.set_ylabel("on the GPU (floors)")
    axes[-1].legend(fontsize=6, frameon=False, loc="upper left")
    ratios = pd.concat([pairs[f"{grad}_ratio"] for grad in GRADIENTS]).dropna()
    devices = ", ".join(sorted(set(table.loc[table["device"] == "cuda", "device_name"].dropna().astype(str))))
    caption = (f"How faithful the CPU stand-in for the CUDA layouts was: {len(pairs)} lce configurations run both "
               f"emulated and on {devices or 'a GPU'} on the same inputs (families "
               f"{', '.join(sorted(set(pairs['family'])))}; seeds {', '.join(map(str, sorted(set(pairs['seed']))))})."
               f" Real over emulated error: median {ratios.median():.2f}, range {ratios.min():.2f}-{ratios.max():.2f}."
               " Points on the dashed diagonal: the emulation's numbers are the GPU's. Data: the sweep results with "
               "device cuda (python -m analysis gpu-check) and cuda-emulated (the medium grid).")
    return CaptionedFigure(fig, "cuda_emulated_vs_real", caption)


def draw_all(table: pd.DataFrame) -> list[CaptionedFigure]:
    """The figures a GPU's sweep rows add (none without them)."""
    return [figure for figure in (plot_emulated_vs_real(table),) if figure is not None]
