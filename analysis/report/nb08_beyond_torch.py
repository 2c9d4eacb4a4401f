"""Notebook 08 (beyond torch's op: softcap, z-loss, lse, vocab-parallel): its figures, conclusions and README blocks.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from analysis.core.results_io import load_kind
from analysis.report.style import PALETTE, CaptionedFigure, apply_style, log_axes, new_figure
from analysis.report.wording import _conclusion, _finding, _join, _missing, _range, _shapes

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
               "the loss's ulps and the returned log-sum-exp's error are in features.csv.")
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

PLAIN = "plain"
"""The feature set without any feature: what every other set is compared with."""
NO_DATA = "No features study yet (`python -m analysis features`)."


def _seed_medians(table: pd.DataFrame, column: str) -> pd.Series:
    return table.groupby(["impl", "dtype", "family", "features"])[column].median()


def error_ratios(table: pd.DataFrame, output: str) -> pd.Series:
    """Per (lce contender, dtype, family, feature set): the seed-median floors of ``output`` over the plain op's
    on the same inputs."""
    lce_rows = table[table["op"] == "lce"]
    medians = _seed_medians(lce_rows, f"{output}_floors")
    plain = medians.xs(PLAIN, level="features")
    others = medians[medians.index.get_level_values("features") != PLAIN]
    return others / plain.reindex(others.index.droplevel("features")).to_numpy()


def errors(table: pd.DataFrame) -> str:
    """08: each feature's error in floors next to the plain op's, per dtype, and the returned log-sum-exp's."""
    if table.empty:
        return _missing(NO_DATA)
    worst = {output: error_ratios(table, output) for output in ("grad_input", "grad_weight")}
    output, ratios = max(worst.items(), key=lambda item: item[1].max())
    impl, dtype, family, name = ratios.idxmax()
    lce_rows = table[table["op"] == "lce"]
    lse = lce_rows["lse_max_error"]
    finding = (f"Soft-capping and z-loss keep lce's errors at the plain op's level: every lce contender's gradient "
               f"error with a feature is {_range(pd.concat(worst.values()))}× the same contender's with the plain op "
               f"on the same inputs (seed medians; the largest, {ratios.max():.2f}×, is {output} of {impl} with "
               f"{name!r} on {family} in {dtype}, where the cap reshapes the softmax itself, see below). The "
               f"log-sum-exp lce returns is within {lse.max():.2g} nats of fp64 for every contender and input.")
    bullets = []
    for name_, rows in lce_rows.groupby("features", sort=False):
        parts = []
        for dtype_, group in rows.groupby("dtype", sort=False):
            medians = {out: _seed_medians(group, f"{out}_floors") for out in ("grad_input", "grad_weight")}
            parts.append(f"{dtype_}: grad_input {_range(medians['grad_input'])}, grad_weight "
                         f"{_range(medians['grad_weight'])} floors")
        unfused = table[(table["impl"] == "unfused") & (table["features"] == name_)]
        unfused_weight = _seed_medians(unfused, "grad_weight_floors")
        bullets.append(f"{name_}: " + "; ".join(parts) + f" (lce, every policy and layout; the unfused formula in the "
                       f"input dtype: grad_weight {_range(unfused_weight)})")
    return _conclusion(finding, bullets,
                       inputs=f"families {_join(sorted(table['family'].unique()))} at {_shapes(table)}, bf16 and "
                              f"fp16, {table['seed'].nunique()} seeds; lce per policy on the CPU and the CUDA layouts "
                              "(emulated on CPU tensors) with fp32 acc_dtype, and \"auto\"; errors against the fp64 "
                              "result of the same formula (`python -m analysis features`).",
                       limits="the CUDA layouts are emulated (real cuBLAS sums in another order); a z-loss of 1e-4 "
                              "moves the gradient little, so its row says that the term is computed without new "
                              "rounding, not that a large z-loss would be as benign.")


def softmax_statistics(table: pd.DataFrame) -> str:
    """08: what a cap does to the softmax, from the fp64 statistics of the inputs."""
    if table.empty:
        return _missing(NO_DATA)
    problems = table.drop_duplicates(["family", "dtype", "seed", "features"])
    problems = problems[problems["z_loss"].fillna(0) == 0]
    stats = problems.groupby(["features", "family"])[["stat_mean_max_logit", "stat_median_target_prob",
                                                      "stat_mean_lse"]].median()
    plain = stats.xs(PLAIN, level="features")
    bullets = []
    for name in dict.fromkeys(problems["features"]):
        if name == PLAIN:
            continue
        capped = stats.xs(name, level="features")
        drop = 1 - capped["stat_mean_max_logit"] / plain["stat_mean_max_logit"]
        bullets.append(f"{name}: the mean largest logit falls by {_range(drop, '.0%')} and the median target "
                       f"probability goes from {_range(plain['stat_median_target_prob'], '.2g')} to "
                       f"{_range(capped['stat_median_target_prob'], '.2g')} (per family)")
    finding = (f"A cap compresses the logits long before they reach it (tanh(1/3) is already "
               f"{1 - 3 * math.tanh(1 / 3):.1%} below 1/3), so even a cap of 30 lowers every family's largest logits "
               "and raises the entropy a little; a cap of 5 "
               "flattens the softmax. The statistics lce's error depends on (how peaked each row is, how far the "
               "target leads) therefore change with the cap, and the errors above are measured against the fp64 "
               "result of the capped formula itself.")
    return _conclusion(finding, bullets,
                       inputs=f"fp64 logits of the rounded inputs, families "
                              f"{_join(sorted(problems['family'].unique()))}, {problems['seed'].nunique()} seeds "
                              "(medians).",
                       limits="the statistics of three families; a model trained with a cap learns logits shaped by "
                              "it, which a cap applied to these inputs after the fact does not reproduce.")


def cost(table: pd.DataFrame) -> str:
    """08: the time and memory each feature set costs lce's default options at the bench shape."""
    if table.empty:
        return _missing("No feature cost measurement yet (`python -m analysis features --cost-only`).")
    row = table.iloc[0]
    others = table[table["features"] != PLAIN]
    model = table["measured_peak_bytes"] / table["predicted_peak_bytes"]
    plain = table[table["features"] == PLAIN].iloc[0]
    extra = (others["measured_peak_bytes"] - plain["measured_peak_bytes"]) / 2**20
    finding = (f"At {row.N}×{row.D}×{row.C} in {row['dtype']} (lce's default options: {row.policy}, "
               f"{row.num_chunks} chunks) the features took {_range(others['time_ratio'])}× the plain op's time in "
               f"the same run, and {_range(extra, '.1f')} MiB more peak memory (plain: "
               f"{plain.measured_peak_bytes / 2**20:.0f} MiB); the measured peaks are {_range(model, '.3f')}× "
               f"lce's model.")
    bullets = [f"{r.features}: {r.time_median_s:.2f} s ({r.time_ratio:.2f}×, spread {r.time_spread_s:.2f} s over "
               f"{r.repeats} rounds), peak {r.measured_peak_bytes / 2**20:.1f} MiB measured, "
               f"{r.predicted_peak_bytes / 2**20:.1f} MiB modeled" for r in table.itertuples()]
    return _conclusion(finding, bullets,
                       inputs=f"random inputs, no bias, forward + backward, {row.repeats} alternating rounds after a "
                              f"warm-up in one process, CPU {row.cpu_model}, {int(row.num_threads)} threads "
                              "(`python -m analysis features --cost-only`).",
                       limits="one CPU and one shape on a shared machine; the tanh and the extra passes over the "
                              "logits are element-wise work whose share is larger where the GEMMs are faster (GPU).")


def readme_features(results: Path) -> str:
    """Notebook 08's findings, one bullet each: the features' errors next to the plain op, the cap's effect on
    the softmax, their time and memory at the bench shape."""
    from analysis.core.results_io import FEATURE_COST, FEATURES
    from analysis.report import nb08_beyond_torch as beyond

    table, cost = (load_kind(results, kind.name)[1] for kind in (FEATURES, FEATURE_COST))
    findings = [("Errors", beyond.errors(table)), ("The cap and the softmax", beyond.softmax_statistics(table)),
                ("Time and memory", beyond.cost(cost))]
    lines = [f"- **{name}.** {_finding(text)}" for name, text in findings]
    if not table.empty:
        lines += ["", "Per feature set (seed medians over families, policies and layouts):", ""]
        lines += [line for line in findings[0][1].splitlines() if line.startswith("- ")]
    return "\n".join(lines) + "\n"


def readme_vocab_parallel(results: Path) -> str:
    """The vocab-parallel study: difference to one process, errors per rank count, peak memory per rank."""
    from analysis.core.results_io import VOCAB_PARALLEL

    table = load_kind(results, VOCAB_PARALLEL.name)[1]
    if table.empty:
        return "(no vocab-parallel study yet: run `python -m analysis vocab-parallel`)\n"
    sharded = table[table["ranks"] > 1]
    row = table.iloc[0]
    exact = sharded[sharded["dtype"] == "float64"]
    low = table[table["dtype"] != "float64"]
    lines = [f"Measured ({row.N}x{row.D}x{row.C}, {', '.join(sorted(table['family'].unique()))} inputs, "
             f"{table['seed'].nunique()} seeds, CPU {row.cpu_model}, gloo; `python -m analysis vocab-parallel`):", ""]
    if not exact.empty:
        worst = exact[["loss_diff_to_single", "grad_input_diff_to_single", "grad_weight_diff_to_single"]].max()
        lines.append(f"- fp64: the largest difference to one process over 2-{int(sharded['ranks'].max())} ranks and "
                     f"every policy is {worst.max():.2g} (relative to the largest entry; loss {worst.iloc[0]:.2g}, "
                     f"grad_input {worst.iloc[1]:.2g}, grad_weight {worst.iloc[2]:.2g}).")
    lines += ["", "| ranks | dtype | policy | grad_input floors | grad_weight floors | peak per rank (largest) |",
              "|---:|---|---|---:|---:|---:|"]
    medians = low.groupby(["ranks", "dtype", "policy"], sort=False)[
        ["grad_input_floors", "grad_weight_floors", "peak_bytes_max"]].median()
    for (ranks, dtype, policy), values in medians.iterrows():
        lines.append(f"| {ranks} | {dtype} | {policy} | {values.grad_input_floors:.2f} | "
                     f"{values.grad_weight_floors:.2f} | {values.peak_bytes_max / 2**20:.1f} MiB |")
    lines += ["", "Floors are seed and family medians against fp64; 1 rank is `lce.linear_cross_entropy` in one "
              "process. Figure `vocab_parallel`."]
    return "\n".join(lines) + "\n"
