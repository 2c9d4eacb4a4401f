"""Notebook 08 (beyond torch's op: softcap, z-loss, lse, vocab-parallel): its figures, the key numbers its prose
quotes (each claim asserted in tests/claims/test_nb08_beyond_torch.py) and its README blocks.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from analysis.core.results_io import load_kind
from analysis.report.style import PALETTE, CaptionedFigure, apply_style, log_axes, new_figure
from analysis.report.tables import markdown_table

SHOWN_CONTENDERS: tuple[str, ...] = ("lce accurate cuda acc=fp32", "lce balanced cuda acc=fp32",
                                     "lce compact cuda acc=fp32", "lce auto cpu acc=default", "unfused")
"""The contenders the error figure draws (the others are in the table): CUDA layouts per policy, CPU auto, unfused."""


def _feature_order(table: pd.DataFrame) -> list[str]:
    return list(dict.fromkeys(table["features"]))


def plot_feature_errors(features: pd.DataFrame) -> CaptionedFigure | None:
    """Floors of both gradients per feature set and contender: median over seeds and families, bars from the
    smallest to the largest seed median of a family."""
    shown = features[features["impl"].isin(SHOWN_CONTENDERS)] if not features.empty else features
    if shown.empty:
        return None
    apply_style()
    dtypes = list(dict.fromkeys(shown["dtype"]))
    fig = new_figure(11.0, 3.4 * len(dtypes))
    axes = fig.subplots(len(dtypes), 2, squeeze=False)
    order = _feature_order(shown)
    impls = [impl for impl in SHOWN_CONTENDERS if impl in set(shown["impl"])]
    width = 0.8 / len(impls)
    for row, dtype in enumerate(dtypes):
        for col, output in enumerate(("grad_input", "grad_weight")):
            ax = axes[row][col]
            rows = shown[shown["dtype"] == dtype]
            medians = rows.groupby(["impl", "features", "family"])[f"{output}_floors"].median()
            for index, impl in enumerate(impls):
                per_family = medians.xs(impl, level="impl")
                centre = per_family.groupby(level="features").median().reindex(order)
                low = per_family.groupby(level="features").min().reindex(order)
                high = per_family.groupby(level="features").max().reindex(order)
                x = [position + (index - (len(impls) - 1) / 2) * width for position in range(len(order))]
                ax.errorbar(x, centre, yerr=[centre - low, high - centre], fmt="o", ms=4, capsize=2, label=impl)
            ax.set_xticks(range(len(order)), order, rotation=15, fontsize=7)
            log_axes(ax, x=False)
            ax.axhline(1.0, color="0.5", lw=0.8)
            ax.set_ylabel(f"{output} error (floors)")
            ax.set_title(f"{output}, {dtype}")
            if row == 0 and col == 0:
                ax.legend(fontsize=6)
    families = ", ".join(sorted(shown["family"].unique()))
    shapes = ", ".join(sorted({f"{r.N}x{r.D}x{r.C}" for r in shown[["N", "D", "C"]].drop_duplicates().itertuples()}))
    caption = (f"Error against fp64 (rounding floors of the exact result of the same formula) of lce's soft-capping "
               f"and z-loss next to the plain op, on {families} inputs ({shapes}), {shown['seed'].nunique()} seeds. "
               "Points: median over families of the seed median; bars: the smallest and the largest family. CUDA "
               "layouts emulated on CPU tensors; 'unfused' is the formula in the input dtype. Every contender, "
               "the loss's ulps and the returned log-sum-exp's error are in features.csv.gz.")
    return CaptionedFigure(fig, "feature_errors", caption)


def plot_softcap_statistics(features: pd.DataFrame) -> CaptionedFigure | None:
    """What the cap does to the softmax (fp64 statistics of the inputs): mean largest logit and median target
    probability, per family and feature set."""
    if features.empty:
        return None
    per_problem = features.drop_duplicates(["family", "dtype", "seed", "features"])
    per_problem = per_problem[per_problem["z_loss"].fillna(0) == 0]
    if per_problem.empty:
        return None
    apply_style()
    fig = new_figure(10.0, 3.8)
    axes = fig.subplots(1, 2)
    order = _feature_order(per_problem)
    families = list(dict.fromkeys(per_problem["family"]))
    width = 0.8 / len(families)
    for ax, column, label in ((axes[0], "stat_mean_max_logit", "mean over rows of the largest logit"),
                              (axes[1], "stat_median_target_prob", "median target probability")):
        for index, family in enumerate(families):
            values = per_problem[per_problem["family"] == family].groupby("features")[column].median().reindex(order)
            x = [position + (index - (len(families) - 1) / 2) * width for position in range(len(order))]
            ax.bar(x, values, width=width, label=family)
        ax.set_xticks(range(len(order)), order, fontsize=7)
        ax.set_ylabel(label)
    axes[1].set_yscale("log")
    axes[0].legend(fontsize=7)
    fig.suptitle("What a logit cap does to the softmax (fp64, before any rounding)")
    max_logit = per_problem.groupby(["features", "family"])["stat_mean_max_logit"].median()
    plain = max_logit.xs(order[0], level="features")
    shifts = "; ".join(f"{name}: {(1 - max_logit.xs(name, level='features') / plain).min():.0%}-"
                       f"{(1 - max_logit.xs(name, level='features') / plain).max():.0%} lower"
                       for name in order[1:])
    caption = (f"The softmax statistics of each feature set's logits, computed in fp64 from the same rounded inputs "
               f"(median over seeds), per family. Mean largest logit against {order[0]!r} ({shifts}). The cap "
               "changes the function itself, not only its rounding: errors in figure feature_errors are measured "
               "against the fp64 result of the capped formula.")
    return CaptionedFigure(fig, "softcap_statistics", caption)


def draw_feature_figures(features: pd.DataFrame) -> list[CaptionedFigure]:
    """Every figure this module draws that has data."""
    return [figure for figure in (plot_feature_errors(features), plot_softcap_statistics(features))
            if figure is not None]


def plot_vocab_parallel(table: pd.DataFrame) -> CaptionedFigure | None:
    """Left: the largest per-rank peak (measured) and lce's model of one shard, against the ranks; right: both
    gradients' floors against the ranks (seed and family medians); bf16 rows where there are any."""
    if table.empty:
        return None
    dtype = "bfloat16" if (table["dtype"] == "bfloat16").any() else table["dtype"].iloc[0]
    table = table[table["dtype"] == dtype]
    apply_style()
    fig = new_figure(10.5, 4.0)
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
    log_axes(error, x=False)
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


def draw_vocab_parallel_figures(table: pd.DataFrame) -> list[CaptionedFigure]:
    """Every figure this module draws that has data."""
    figure = plot_vocab_parallel(table)
    return [] if figure is None else [figure]

# --- key numbers: what the notebook's prose quotes and tests/claims/test_nb08_beyond_torch.py asserts ----------

PLAIN = "plain"
"""The feature set without any feature: what every other set is compared with."""


def seed_medians(table: pd.DataFrame, column: str) -> pd.Series:
    """Per (contender, dtype, family, feature set): the median of ``column`` over the seeds."""
    return table.groupby(["impl", "dtype", "family", "features"])[column].median()


def error_ratios(table: pd.DataFrame) -> pd.Series:
    """Per (output, lce contender, dtype, family, feature set), in sorted order: the seed-median floors over the
    plain op's on the same inputs."""
    ratios = {}
    for output in ("grad_input", "grad_weight"):
        medians = seed_medians(table[table["op"] == "lce"], f"{output}_floors")
        others = medians[medians.index.get_level_values("features") != PLAIN]
        plain = medians.xs(PLAIN, level="features").reindex(others.index.droplevel("features"))
        ratios[output] = others / plain.to_numpy()
    return pd.concat(ratios, names=["output"])


def _span(values: pd.Series, spec: str = "{:.2f}") -> str:
    values = values.dropna()
    return f"{spec.format(values.min())}-{spec.format(values.max())}" if len(values) else "-"


def feature_error_numbers(table: pd.DataFrame) -> pd.DataFrame:
    """Per feature set and dtype, ranges of seed medians over families (and lce's contenders): lce's floors, the
    unfused formula's (input dtype) grad_weight floors, lce over the plain op (both gradients), the returned lse's
    largest error (nats)."""
    ratios, rows = error_ratios(table), []
    for (name, dtype), group in table[table["op"] == "lce"].groupby(["features", "dtype"], sort=False):
        unfused = table[(table["impl"] == "unfused") & (table["features"] == name) & (table["dtype"] == dtype)]
        mine = ratios[(ratios.index.get_level_values("features") == name)
                      & (ratios.index.get_level_values("dtype") == dtype)]
        rows.append({"feature set": name, "dtype": dtype,
                     "lce grad_input": _span(seed_medians(group, "grad_input_floors")),
                     "lce grad_weight": _span(seed_medians(group, "grad_weight_floors")),
                     "unfused grad_weight": _span(seed_medians(unfused, "grad_weight_floors")),
                     "lce / plain op": _span(mine), "lse error (nats)": f"{group['lse_max_error'].max():.1e}"})
    return pd.DataFrame(rows)


def softmax_numbers(table: pd.DataFrame) -> pd.DataFrame:
    """Per feature set without z-loss (which leaves the logits alone) and family, seed medians of the fp64 mean
    largest logit and median target probability, and how far the largest logit falls from the plain op's."""
    problems = table.drop_duplicates(["family", "dtype", "seed", "features"])
    stats = problems[problems["z_loss"].fillna(0) == 0].groupby(["features", "family"], sort=False)[
        ["stat_mean_max_logit", "stat_median_target_prob"]].median()
    plain = stats.xs(PLAIN, level="features")["stat_mean_max_logit"]
    drop = 1 - stats["stat_mean_max_logit"] / plain.reindex(stats.index.get_level_values("family")).to_numpy()
    return stats.assign(max_logit_drop=drop.where(stats.index.get_level_values("features") != PLAIN)).reset_index()


def cost_numbers(cost: pd.DataFrame) -> pd.DataFrame:
    """``feature_cost.csv`` with the extra measured peak over the plain op's (MiB) and the peak over lce's model."""
    plain = cost.loc[cost["features"] == PLAIN, "measured_peak_bytes"].iloc[0]
    return cost.assign(extra_mib=(cost["measured_peak_bytes"] - plain) / 2**20,
                       over_model=cost["measured_peak_bytes"] / cost["predicted_peak_bytes"])


def vocab_parallel_numbers(table: pd.DataFrame) -> tuple[pd.Series, pd.DataFrame]:
    """The largest fp64 difference to one process per output over 2+ ranks and every policy (relative to the
    largest entry), and seed and family medians per (ranks, dtype, policy): floors and the largest rank's peak."""
    exact = table[(table["ranks"] > 1) & (table["dtype"] == "float64")]
    worst = exact[[f"{out}_diff_to_single" for out in ("loss", "grad_input", "grad_weight")]].max()
    medians = table[table["dtype"] != "float64"].groupby(["ranks", "dtype", "policy"], sort=False)[
        ["grad_input_floors", "grad_weight_floors", "peak_bytes_max"]].median().reset_index()
    medians["peak_bytes_max"] /= 2**20
    return worst.rename(lambda name: name.removesuffix("_diff_to_single")), medians.rename(
        columns={"peak_bytes_max": "peak_mib"})


# --- README blocks ---------------------------------------------------------------------------------------------

def readme_features(results: Path) -> str:
    """Errors per feature set and dtype; per feature set, the cap's effect on the softmax and the time and peak."""
    from analysis.core.results_io import FEATURE_COST, FEATURES

    table, cost = (load_kind(results, kind.name)[1] for kind in (FEATURES, FEATURE_COST))
    if table.empty or cost.empty:
        return "(no features study yet: run `python -m analysis features`)\n"
    stats, row = softmax_numbers(table).groupby("features", sort=False), cost.iloc[0]
    costs = cost_numbers(cost).set_index("features")
    summary = costs[["time_ratio", "over_model"]].assign(peak_mib=costs["measured_peak_bytes"] / 2**20).join(
        pd.DataFrame({"largest logit falls": stats["max_logit_drop"].agg(_span, "{:.0%}"),
                      "median target p": stats["stat_median_target_prob"].agg(_span, "{:.2g}")}))
    return "\n".join([markdown_table(feature_error_numbers(table)),
                      f"- per family, fp64; time and peak: {row.N}x{row.D}x{row.C}, {row['dtype']}, {row.policy}, "
                      f"{row.num_chunks} chunks, {row.repeats} rounds, CPU {row.cpu_model}", "",
                      markdown_table(summary.fillna("-").reset_index(), {"time_ratio": "{:.2f}", "over_model": "{:.3f}",
                                                                         "peak_mib": "{:.1f}"})])


def readme_vocab_parallel(results: Path) -> str:
    """The vocab-parallel study: fp64 difference to one process, errors and peak per rank count."""
    from analysis.core.results_io import VOCAB_PARALLEL

    table = load_kind(results, VOCAB_PARALLEL.name)[1]
    if table.empty:
        return "(no vocab-parallel study yet: run `python -m analysis vocab-parallel`)\n"
    (worst, medians), row = vocab_parallel_numbers(table), table.iloc[0]
    return "\n".join([f"- measured: {row.N}x{row.D}x{row.C}, {', '.join(sorted(table['family'].unique()))} inputs, "
                      f"{table['seed'].nunique()} seeds, CPU {row.cpu_model}, gloo",
                      f"- fp64, 2-{table['ranks'].max()} ranks, every policy, largest difference to one process: "
                      + ", ".join(f"{output} {value:.2g}" for output, value in worst.items()), "",
                      markdown_table(medians, {"grad_input_floors": "{:.2f}", "grad_weight_floors": "{:.2f}",
                                               "peak_mib": "{:.1f}"})])
