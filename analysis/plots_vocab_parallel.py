"""The figure of vocab-parallel lce: peak memory per rank and error against the number of ranks.

Draws from the ``vocab_parallel`` results table (:mod:`analysis.studies.vocab_parallel`) and measures nothing;
returns a :class:`~analysis.plots.CaptionedFigure`, or None when its data is absent.
"""

from __future__ import annotations

import pandas as pd

from .plots import PALETTE, CaptionedFigure, _figure, _log_axes, _style

__all__ = ["plot_vocab_parallel", "draw_all"]


def plot_vocab_parallel(table: pd.DataFrame) -> CaptionedFigure | None:
    """Left: the largest per-rank peak (measured) and lce's model of one shard, against the ranks; right: both
    gradients' floors against the ranks (seed and family medians); bf16 rows where there are any."""
    if table.empty:
        return None
    dtype = "bfloat16" if (table["dtype"] == "bfloat16").any() else table["dtype"].iloc[0]
    table = table[table["dtype"] == dtype]
    _style()
    fig = _figure(10.5, 4.0)
    memory, error = fig.subplots(1, 2)
    for policy, group in table.groupby("policy", sort=False):
        per_ranks = group.groupby("ranks")
        colour = PALETTE.get(policy)
        memory.plot(per_ranks["peak_bytes_max"].median().index, per_ranks["peak_bytes_max"].median() / 2**20,
                    marker="o", color=colour, label=f"{policy}, measured (largest rank)")
        memory.plot(per_ranks["planned_shard_peak_bytes"].median().index,
                    per_ranks["planned_shard_peak_bytes"].median() / 2**20, ls=":", color=colour,
                    label=f"{policy}, lce.plan of one shard")
        for output, marker in (("grad_weight", "o"), ("grad_input", "s")):
            error.plot(per_ranks[f"{output}_floors"].median().index, per_ranks[f"{output}_floors"].median(),
                       marker=marker, color=colour, label=f"{policy} {output}")
    memory.set_xlabel("ranks (1 = lce in one process)")
    memory.set_ylabel("peak extra memory per rank (MiB)")
    memory.set_title("Memory per rank")
    memory.set_xticks(sorted(table["ranks"].unique()))
    memory.legend(fontsize=6)
    _log_axes(error, x=False)
    error.set_xticks(sorted(table["ranks"].unique()))
    error.set_xlabel("ranks (1 = lce in one process)")
    error.set_ylabel("error (floors, seed and family median)")
    error.set_title("Error does not depend on the ranks")
    error.legend(fontsize=6, ncol=2)
    row = table.iloc[0]
    caption = (f"lce.distributed on CPU processes over gloo, the {row.C} classes split evenly, at N={row.N} "
               f"D={row.D} ({dtype}; the other dtypes are in vocab_parallel.csv, "
               f"{', '.join(sorted(table['family'].unique()))} inputs, {table['seed'].nunique()} seeds, fp32 "
               "acc_dtype), against lce.linear_cross_entropy in one process (1 rank). Left: each rank's peak extra "
               "memory of one forward + backward, measured by the allocator profiler (the largest rank), and lce's "
               "model of a single process holding one shard (dotted: the distributed loop adds an fp32 row chunk of "
               "the input gradient). Right: both gradients' error against fp64.")
    return CaptionedFigure(fig, "vocab_parallel", caption)


def draw_all(table: pd.DataFrame) -> list[CaptionedFigure]:
    """Every figure this module draws that has data."""
    figure = plot_vocab_parallel(table)
    return [] if figure is None else [figure]
