"""Notebook 05 (do the verdicts hold on realistic inputs?): its figures, its key numbers and its README block.

The notebook's prose quotes the key numbers; ``tests/claims/test_nb05_realistic_inputs.py`` asserts each claim the
prose (and the README around the block) makes about them, on the committed results.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib import ticker

from analysis.core.results_io import latest, load_kind
from analysis.judge.pareto import seed_interval, verdicts
from analysis.report.style import (
    ERROR_SPAN,
    PALETTE,
    POLICY_ORDER,
    CaptionedFigure,
    apply_style,
    chunk_lines,
    family_panels,
    honest_limits,
    legend_below,
    log_axes,
    new_figure,
    panel_grid,
    seed_caption,
)
from analysis.report.tables import markdown_table

ROW_METRICS = {"grad_weight_fro_in_floors": ("Frobenius (whole tensor)", "o"),
               "grad_weight_row_p99": ("99th percentile class row", "^"),
               "grad_weight_row_max": ("worst class row", "v")}
"""The grad_weight errors :func:`plot_row_errors` sets side by side, with their legend text and marker."""


def plot_row_errors(table: pd.DataFrame, device: str = "cpu") -> CaptionedFigure | None:
    """grad_weight error per implementation with default chunking: the Frobenius error next to the p99 and
    worst class row, per (family, dtype, shape); seed medians with their interval."""
    data = table[(table["device"] == device) & table["chunking"].isin(["auto", ""])
                 & (table["acc_dtype"] == "default")]
    data = data.dropna(subset=list(ROW_METRICS), how="all")
    if data.empty:
        return None
    apply_style()
    fig, axes, panels = family_panels(data, width=4.8)
    for ax, group in panels:
        points = seed_interval(group, list(ROW_METRICS), by=["op", "policy", "label"])
        points["order"] = [(op != "lce", op, POLICY_ORDER.index(p) if p in POLICY_ORDER else 99)
                           for op, p in zip(points["op"], points["policy"], strict=True)]
        points = points.sort_values("order").reset_index(drop=True)
        offsets = np.linspace(-0.22, 0.22, len(ROW_METRICS))
        for offset, (column, (text, marker)) in zip(offsets, ROW_METRICS.items(), strict=True):
            for x, row in points.iterrows():
                ax.errorbar([x + offset], [row[column]], yerr=[[row[column] - row[f"{column}_low"]],
                                                               [row[f"{column}_high"] - row[column]]],
                            fmt=marker, ms=5, color=PALETTE.get(row["policy"], "k"), elinewidth=0.8,
                            mfc="none" if column != "grad_weight_fro_in_floors" else None)
            ax.plot([], [], marker, color="0.3", mfc="none" if marker != "o" else None, ls="", label=text)
        ax.set_xticks(range(len(points)), [f"{op}\n{policy}".strip() for op, policy in
                                           zip(points["op"], points["policy"], strict=True)], fontsize=7)
        values = pd.concat([points[f"{c}{s}"] for c in ROW_METRICS for s in ("_low", "_high")])
        log_axes(ax, x=False)
        honest_limits(ax, "y", values, span=ERROR_SPAN, floor=1.0)
    fig.supylabel("grad_weight error (multiples of the rounding floor)", fontsize=9)
    legend_below(fig, axes)
    return CaptionedFigure(fig, f"row_errors_{device}",
                           f"Weight-gradient error on {device} per implementation with default options and chunking "
                           "(colour: policy), three ways: the Frobenius error of the whole tensor (filled circle), "
                           "and the 99th-percentile and worst class row, each row's error over its own rounding "
                           "floor (open triangles). Rows of rarely targeted classes are tiny and can be far off "
                           "while the Frobenius average, dominated by the frequent classes, stays near the floor. "
                           f"One row of panels per input family. {seed_caption(data)} Error axes reach down to the "
                           f"rounding floor (1) and span at least a factor {ERROR_SPAN:g}.")


BIAS_COLUMN = "grad_weight_bias_in_floors"
"""The signed error :func:`plot_gradient_bias` draws: grad_weight's error along the exact gradient, in floors."""


def plot_gradient_bias(table: pd.DataFrame, device: str = "cpu") -> CaptionedFigure | None:
    """Signed bias of grad_weight (in floors) vs chunk count per policy, lce next to torch, per (family, dtype,
    shape); seed median and band."""
    data = table[(table["device"] == device) & table["op"].isin(["lce", "torch"])].dropna(subset=[BIAS_COLUMN])
    if data.empty:
        return None
    apply_style()
    fig, axes, panels = family_panels(data)
    for ax, group in panels:
        points = chunk_lines(ax, group, BIAS_COLUMN)
        ax.axhline(0, color="k", lw=0.8)
        reach = np.nanmax(np.abs(points[[f"{BIAS_COLUMN}_low", f"{BIAS_COLUMN}_high"]].to_numpy()))
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda value, _: f"{value:g}"))
        ax.set_yscale("symlog", linthresh=1.0)
        ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda value, _: f"{value:g}"))
        limit = max(2.0, 1.3 * reach) if np.isfinite(reach) else 2.0
        ax.set_ylim(-limit, limit)  # symmetric: a bias of either sign reads at its true size
        ax.set_xlabel("number of chunks")
    fig.supylabel("grad_weight bias along the exact gradient (rounding floors)", fontsize=9)
    legend_below(fig, axes)
    return CaptionedFigure(fig, "gradient_bias",
                           f"Signed error of the weight gradient along the exact gradient, in Frobenius rounding "
                           f"floors, vs number of chunks, per policy, on {device}: negative means the gradient comes "
                           "out systematically shorter than the exact one (as if the learning rate were lower), "
                           "positive longer. Independent rounding errors contribute about (Frobenius error)/"
                           "sqrt(entries), near 0 here; a bias that does not average out over steps shows at full "
                           "size. Circles lce, crosses torch; solid where the resolved acc_dtype is wider than the "
                           f"input. One row of panels per input family. {seed_caption(data)} Symmetric symlog "
                           "axis, linear within ±1 floor.")


def plot_families(stats: pd.DataFrame) -> CaptionedFigure | None:
    """What each input family looks like: mean loss, p_target and margin quantiles, feature outliers, rank-frequency."""
    if stats.empty:
        return None
    apply_style()
    data = latest(stats, ["family", "statistic", "rank"]) if "date" in stats else stats
    families = list(dict.fromkeys(data["family"]))
    colours = dict(zip(families, sns.color_palette("colorblind", len(families)), strict=True))
    value = data[data["statistic"] != "target_count"].pivot(index="family", columns="statistic", values="value")
    value = value.reindex(families)
    fig, axes = panel_grid(5, width=3.6, height=3.0, columns=5)
    ax = axes.flat[0]
    ax.barh(families, value["mean_loss"], color=[colours[f] for f in families])
    ax.invert_yaxis()
    ax.set_xlabel("mean loss (nats)")
    quantiles = sorted(float(c.split("_q")[1]) for c in value.columns if c.startswith("p_target_q"))
    for ax, name, xlabel, log in ((axes.flat[1], "p_target", "target probability p_y", True),
                                  (axes.flat[2], "margin", "target logit − best other (nats)", False)):
        for position, family in enumerate(families):
            points = [value.loc[family, f"{name}_q{q:g}"] for q in quantiles]
            ax.plot(points, [position] * len(points), "-", color=colours[family], lw=1)
            ax.scatter(points, [position] * len(points), color=colours[family], s=[10, 18, 34, 18, 10][:len(points)])
        ax.set_yticks(range(len(families)), families if name == "p_target" else [""] * len(families))
        ax.invert_yaxis()
        ax.set_xlabel(xlabel + "\n(5, 25, 50, 75, 95th percentiles)")
        if log:
            ax.set_xscale("log")
            ax.set_xlim(left=max(1e-12, np.nanmin(value[[f"p_target_q{q:g}" for q in quantiles]].to_numpy()) / 3),
                        right=1.5)
    ax = axes.flat[3]
    ax.barh(families, value["feature_rms_max_over_median"], color=[colours[f] for f in families])
    ax.set_yticks(range(len(families)), [""] * len(families))
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("largest feature RMS / median feature RMS")
    ax = axes.flat[4]
    curves = data[data["statistic"] == "target_count"]
    for family, curve in curves.groupby("family", sort=False):
        ax.plot(curve["rank"], curve["value"], color=colours[family], lw=1.2, label=family)
    log_axes(ax)
    ax.set_xlabel("class rank (1 = most frequent target)")
    ax.set_ylabel("times targeted")
    ax.legend(fontsize=7, frameon=False)
    first = data.iloc[0]
    return CaptionedFigure(fig, "families",
                           f"The input families at N={first.N} D={first.D} C={first.C} (seed {first.seed}), in fp64 "
                           "on each family's fp32 draw: mean loss; percentiles of the target's probability and of "
                           "its logit's lead over the best other class; how far the largest feature dimension "
                           "stands out; how often each class is a target. Data: the family_stats results "
                           "(python -m analysis family-stats).")


def _brace_label(names: list[str]) -> str:
    """Names of the same word count that differ word by word, written as one: ``lce {accurate,balanced} cpu``.

    Exact only when the names are every combination of their words' values; otherwise the names are split on
    their third word (the layout), then their last (the chunking), and the parts joined by " = "."""
    words = [name.split(" ") for name in names]
    if len({len(w) for w in words}) == 1:
        columns = list(zip(*words, strict=True))
        values = [sorted(set(column), key=column.index) for column in columns]
        if np.prod([len(v) for v in values]) == len(names):
            return " ".join(v[0] if len(v) == 1 else "{" + ",".join(v) + "}" for v in values)
        for position in (2, -1):
            parts = {}
            for name, w in zip(names, words, strict=True):
                parts.setdefault(w[position], []).append(name)
            if len(parts) > 1:
                return " = ".join(_brace_label(part) for part in parts.values())
    return " = ".join(names)


def _merge_identical(data: pd.DataFrame, keys: list[str], values: list[str]) -> pd.Series:
    """Each ``impl``'s display name, implementations with identical ``values`` at every ``keys`` merged into one
    (:func:`_brace_label`): contenders whose options resolve to the same arithmetic draw one line instead of
    hiding each other."""
    wide = data.pivot_table(index="impl", columns=keys, values=values, aggfunc="first", dropna=False)
    signature = wide.apply(lambda row: tuple(np.round(row.to_numpy(dtype=float), 12)), axis=1)
    names = {}
    for _, members in signature.groupby(signature, sort=False):
        group = sorted(members.index)
        for impl in group:
            names[impl] = _brace_label(group)
    return data["impl"].map(names)


def _study_colours(labels) -> dict[str, tuple]:
    """One colour per (merged) implementation label of a numerics study, in sorted order."""
    labels = sorted(set(labels))
    palette = sns.color_palette("tab20" if len(labels) > 10 else "colorblind", len(labels))
    return dict(zip(labels, palette, strict=True))


MARGIN_OUTPUTS = {"grad_input_floors": "grad_input (floors)", "grad_weight_floors": "grad_weight (floors)",
                  "loss_ulps": "loss (ulps of the dtype)"}


def plot_margins(margins: pd.DataFrame) -> CaptionedFigure | None:
    """Error against the target's lead (nats), one line per implementation: seed median, 5-95% band."""
    if margins.empty:
        return None
    apply_style()
    data = latest(margins, ["impl", "dtype", "N", "D", "C", "seed", "margin"])
    data = data.assign(impl=_merge_identical(data, ["dtype", "margin", "seed"], list(MARGIN_OUTPUTS)))
    dtypes = sorted(data["dtype"].unique())
    fig = new_figure(4.2 * len(MARGIN_OUTPUTS), 3.4 * len(dtypes) + 1.6)
    axes = fig.subplots(len(dtypes), len(MARGIN_OUTPUTS), squeeze=False)
    colours = _study_colours(data["impl"])
    for row, dtype in enumerate(dtypes):
        for column, (output, label) in enumerate(MARGIN_OUTPUTS.items()):
            ax = axes[row, column]
            group = data[data["dtype"] == dtype]
            floor = 0.01 if output == "loss_ulps" else 0.5  # an exact loss is 0 ulps: clamp onto the log axis
            values = group[output].clip(lower=floor)
            stats = values.groupby([group["impl"], group["margin"]]).quantile([0.05, 0.5, 0.95]).unstack()
            for impl in sorted(stats.index.get_level_values(0).unique()):
                line = stats.loc[impl].sort_index()
                ax.plot(line.index, line[0.5], marker="o", ms=3, lw=1.1, color=colours[impl],
                        ls="-" if impl.startswith("lce") else "--", label=impl)
                ax.fill_between(line.index, line[0.05], line[0.95], color=colours[impl], alpha=0.12, lw=0)
            ax.axhline(1.0, color="k", lw=0.8, ls=":")
            log_axes(ax, x=False)
            honest_limits(ax, "y", values, span=ERROR_SPAN, floor=None if output == "loss_ulps" else 1.0)
            ax.set_title(f"{dtype}: {label}", fontsize=9)
            ax.set_xlabel("target's lead over every other class (nats)")
    legend_below(fig, axes, columns=2)
    first = data.iloc[0]
    seeds = data["seed"].nunique()
    caption = ("Error against fp64 on rows whose target logit leads every other class by the margin "
               f"(N={first.N} D={first.D} C={first.C}, every row confident; "
               "analysis.core.families.confident_rows), per "
               f"implementation: the median over {seeds} seeds, the band their 5-95% range; dashed: torch and the "
               "unfused formula. \"cuda\" is lce's CUDA layouts, emulated on CPU; implementations whose numbers "
               "are identical everywhere share one line (names in braces: every combination). Gradients in "
               "multiples of their rounding floor (1 = the exact answer rounded), the loss in ulps of the dtype "
               "(values below 0.01 drawn at 0.01). lce \"accurate\" needs acc=fp32 (or \"auto\") to be at the "
               "floor: with the default acc_dtype an explicit policy computes in the input dtype. In fp16 the exact "
               "gradients of these rows fall below fp16's subnormals from about 15 nats on (mean over the rows), so "
               "every answer reads 1 floor there: only bf16 separates the implementations at large margins. Data: "
               "the margins results (python -m analysis margins).")
    return CaptionedFigure(fig, "margins", caption)


RARE_BIN_COLOURS = dict(zip(("never", "1-2", "3-15", "16+"), sns.color_palette("viridis", 4), strict=True))


_DEFAULT_WORDS = ("acc=default", "auto")
"""Words of a rare_rows implementation name after its layout that only restate a default (acc_dtype, chunking)."""


def _impl_words(impl: str) -> tuple[str, str, list[str]] | None:
    """(policy, layout, the options that are not defaults) of an lce name ``lce POLICY LAYOUT [OPTION ...]``; None
    for any other name (``torch default``, ``unfused``)."""
    words = impl.split(" ")
    if words[0] != "lce" or len(words) < 3:
        return None
    return words[1], words[2], [word for word in words[3:] if word not in _DEFAULT_WORDS]


def _short_impl(impl: str) -> str:
    """``lce compact (cuda, acc=fp32, ar:2)`` for ``lce compact cuda acc=fp32 aspect_ratio:2``: the default options
    (acc=default, auto chunking) left out; other names (``torch default``, ``unfused``) as they are."""
    parts = _impl_words(impl)
    if parts is None:
        return impl
    policy, layout, options = parts
    return f"lce {policy} ({', '.join([layout, *(word.replace('aspect_ratio', 'ar') for word in options)])})"


def _explicit_options(impl: str) -> tuple:
    """How a spelling sorts as a class's name: fewest explicit options (policy, acc_dtype, chunking), then the CPU
    layout, then by name."""
    parts = _impl_words(impl)
    if parts is None:
        return (0, False, impl)
    policy, layout, options = parts
    return (int(policy != "auto") + len(options), layout != "cpu", impl)


def rare_row_names(data: pd.DataFrame) -> dict[str, tuple[str, list[str]]]:
    """Per implementation of a rare_rows table: its row's short tick label and every spelling that computes the same
    numbers (identical row p99, row max and Frobenius floors in every dtype, seed and bin).

    A class is named by its spelling with the fewest explicit options (:func:`_explicit_options`), shortened by
    :func:`_short_impl`, with ``[+k]`` when k other spellings join it."""
    merged = _merge_identical(data, ["dtype", "seed", "bin"], ["row_p99", "row_max", "grad_weight_floors"])
    classes: dict[str, list[str]] = {}
    for impl, name in zip(data["impl"], merged, strict=True):
        members = classes.setdefault(name, [])
        if impl not in members:
            members.append(impl)
    names = {}
    for members in classes.values():
        members = sorted(members, key=_explicit_options)
        label = _short_impl(members[0]) + (f" [+{len(members) - 1}]" if len(members) > 1 else "")
        for impl in members:
            names[impl] = (label, members)
    return names


def _rare_row_order(label: str) -> tuple:
    """lce rows first, the CPU layout before the CUDA one, policies in lce's order; then torch and unfused."""
    if not label.startswith("lce ") or "(" not in label:
        return (1, False, 0, label)
    policy, options = label.split(" ")[1], label.split("(", 1)[1]
    return (0, not options.startswith("cpu"), POLICY_ORDER.index(policy) if policy in POLICY_ORDER else 9, label)


def plot_rare_rows(rare: pd.DataFrame) -> CaptionedFigure | None:
    """Per implementation (rows, short names; the spellings each row stands for in the caption) and dtype (panels):
    grad_weight's row error per bin of the class's target count (filled: p99, median over seeds; open: max over
    seeds) and the Frobenius error (black bar)."""
    if rare.empty:
        return None
    apply_style()
    data = latest(rare, ["impl", "dtype", "N", "D", "C", "seed", "bin"])
    n, d, c = data.groupby(["N", "D", "C"]).size().idxmax()  # the study; spot checks at other shapes stay out
    data = data[(data["N"] == n) & (data["D"] == d) & (data["C"] == c)]
    names = rare_row_names(data)
    data = data.assign(impl=data["impl"].map(lambda impl: names[impl][0]))
    dtypes = sorted(data["dtype"].unique(), reverse=True)  # float16 first: its auto pick is the case
    impls = sorted(data["impl"].unique(), key=_rare_row_order)
    position = {impl: index for index, impl in enumerate(impls)}
    fig = new_figure(5.6 * len(dtypes) + 1.6, 0.42 * len(impls) + 2.0)
    axes = fig.subplots(1, len(dtypes), squeeze=False, sharey=True)
    offsets = dict(zip(RARE_BIN_COLOURS, np.linspace(-0.27, 0.27, len(RARE_BIN_COLOURS)), strict=True))
    for ax, dtype in zip(axes.flat, dtypes, strict=True):
        group = data[data["dtype"] == dtype]
        p99 = group.groupby(["impl", "bin"])["row_p99"].median()
        worst = group.groupby(["impl", "bin"])["row_max"].max()
        fro = group[group["bin"] == "all"].groupby("impl")["grad_weight_floors"].median()
        for name, colour in RARE_BIN_COLOURS.items():
            here = [impl for impl in impls if (impl, name) in p99.index]
            y = [position[impl] + offsets[name] for impl in here]
            ax.scatter([p99[(impl, name)] for impl in here], y, s=16, color=colour,
                       label=f"p99, class targeted {name} times" if name != "never" else "p99, class never targeted")
            ax.scatter([worst[(impl, name)] for impl in here], y, s=16, facecolor="none", edgecolor=colour,
                       label=f"max ({name})")
        ax.scatter(fro.to_numpy(), [position[impl] for impl in fro.index], marker="|", s=120, color="k",
                   label="Frobenius (median over seeds)")
        ax.axvline(1.0, color="k", lw=0.8, ls=":")
        log_axes(ax, y=False)
        honest_limits(ax, "x", pd.concat([p99, worst, fro]), span=ERROR_SPAN, floor=1.0)
        ax.set_yticks(range(len(impls)), impls, fontsize=8)
        ax.set_ylim(len(impls) - 0.5, -0.5)
        first = group.iloc[0]
        ax.set_title(f"{dtype}, N={first.N} D={first.D} C={first.C}, {group['seed'].nunique()} seeds", fontsize=9)
        ax.set_xlabel("grad_weight row error (multiples of the row's rounding floor)")
    legend_below(fig, axes)
    classes = {label: members for label, members in names.values()}
    same = "; ".join(f"{label} = {_brace_label(members)}" for label, members in
                     sorted(classes.items(), key=lambda item: _rare_row_order(item[0])) if len(members) > 1)
    return CaptionedFigure(fig, "rare_rows",
                           "Weight-gradient rows of rarely targeted classes: each class's row error over its own "
                           "rounding floor (analysis.core.metrics.row_floors), binned by how often the class is a "
                           "target "
                           "in the batch (calibrated family: Zipfian prior, targets sampled from the model), per "
                           "implementation; filled: the 99th percentile (median over seeds), open: the maximum (over "
                           "all seeds), black bar: the Frobenius error of the whole gradient. Row names: lce's "
                           "policy and, in brackets, the layout (cpu, or cuda: lce's CUDA layouts emulated on CPU) "
                           "and any option that is not the default (acc=fp32; ar:2 = aspect_ratio:2 chunking; "
                           "otherwise acc_dtype default and auto chunking); \"auto\" resolves to the AUTO_TABLE "
                           "entry of its layout and dtype. A row stands for every spelling whose numbers are "
                           "identical in both dtypes, every seed and bin; [+k]: k more spellings, named with the "
                           "fewest explicit options; the equivalences (names in braces: every combination): "
                           f"{same}. Drawn at the shape with the most rows; spot checks at other shapes are in the "
                           "data only. Data: the rare_rows results (python -m analysis rare-rows).")


# --- key numbers: the notebook's prose quotes them, tests/claims/test_nb05_realistic_inputs.py asserts its claims

CONFIDENT_SHARE = 0.01
"""A family "has near-certain rows" when more than this share of its rows has p_target > 0.999."""
OUTLIER_RATIO = 10.0
"""A family "has feature outliers" when its largest feature's RMS exceeds the median feature's by this factor."""
ZIPF_SLOPE = -0.5
"""A family "has Zipfian targets" when its rank-frequency slope (log-log) is below this."""
WRONG_P = 1e-3
"""A family is "confidently wrong on almost every row" when 95% of its rows give the target less than this."""
TRAITS = {"mean_loss": "mean loss (nats)", "p_target_q0.5": "median p_target", "p_target_q0.95": "95th pct p_target",
          "share_p_target_above_0.999": "rows with p_target > 0.999", "max_margin": "largest margin (nats)",
          "feature_rms_max_over_median": "largest / median feature RMS", "zipf_slope": "rank-frequency slope"}


def family_traits(stats: pd.DataFrame) -> pd.DataFrame:
    """One row per family (the study's order), one column per statistic of :data:`TRAITS`."""
    values = stats[stats["statistic"].isin(TRAITS)].pivot_table(index="family", columns="statistic", values="value")
    return values.reindex(index=list(dict.fromkeys(stats["family"])), columns=list(TRAITS))


MARGIN_PEERS = ("torch accurate acc=fp32", "torch compact acc=fp32", "unfused fp32")
"""The margins study's implementations that form ``p_y - 1`` and ``lse - z_y`` by subtraction."""
MARGIN_SHOWN = ("lce accurate cpu acc=fp32", "lce accurate cuda acc=fp32", "lce auto cpu acc=default",
                "lce auto cuda acc=default", *MARGIN_PEERS)


def margin_worst(margins: pd.DataFrame) -> pd.DataFrame:
    """Per dtype and implementation: the largest seed-median worst-gradient floors over the margins
    (``worst``) and the margin where it is (``at_margin``), the same over margins <= 10 nats
    (``worst_to_10``), and the largest loss distance in ulps (``loss_ulps``)."""
    data = margins.assign(worst=margins[["grad_input_floors", "grad_weight_floors"]].max(axis=1))
    medians = data.groupby(["dtype", "impl", "margin"], sort=True)["worst"].median().reset_index()
    rows = []
    for (dtype, impl), group in medians.groupby(["dtype", "impl"], sort=True):
        top = group.loc[group["worst"].idxmax()]
        rows.append({"dtype": dtype, "impl": impl, "worst": top["worst"], "at_margin": top["margin"],
                     "worst_to_10": group[group["margin"] <= 10]["worst"].max(),
                     "loss_ulps": data[(data["dtype"] == dtype) & (data["impl"] == impl)]["loss_ulps"].max()})
    return pd.DataFrame(rows)


RARE_SHOWN = {"lce auto cpu acc=default auto": "lce CPU auto", "lce auto cuda acc=default auto": "lce CUDA auto",
              "lce compact cuda acc=fp32 aspect_ratio:2": "compact, CUDA layouts, fp32 acc, aspect_ratio:2",
              "lce balanced cuda acc=fp32 aspect_ratio:2": "balanced, CUDA layouts, fp32 acc, aspect_ratio:2",
              "torch default": "torch's default", "unfused": "unfused in the input dtype"}


def rare_summary(rare: pd.DataFrame) -> pd.DataFrame:
    """At the study's shape (the one with the most rows; spot checks elsewhere stay out), per dtype and
    implementation: the Frobenius floors (seed median), the worst bin's p99 row (seed median) and the worst
    row over seeds, each with the bin of classes it is in."""
    n, d, c = rare.groupby(["N", "D", "C"]).size().idxmax()
    rare = rare[(rare["N"] == n) & (rare["D"] == d) & (rare["C"] == c)]
    rows = []
    for (dtype, impl), group in rare.groupby(["dtype", "impl"], sort=True):
        bins = group[group["bin"] != "all"]
        p99 = bins.groupby("bin")["row_p99"].median()
        top = bins.loc[bins["row_max"].idxmax()]
        rows.append({"dtype": dtype, "impl": impl, "N": n, "D": d, "C": c,
                     "frobenius": group.groupby("seed")["grad_weight_floors"].first().median(),
                     "p99": p99.max(), "p99_bin": p99.idxmax(), "max": top["row_max"], "max_bin": top["bin"]})
    return pd.DataFrame(rows)


def _cell(rows: pd.DataFrame) -> str:
    """One verdict cell: memory and time front marks and the error median with its interval, per shape."""
    parts = []
    for row in rows.sort_values("shape").itertuples():
        memory = "✓" if row.on_memory_front else f"✗ ({row.memory_off_seeds}/{row.seeds})"
        if row.device == "cuda-emulated":
            time = "–"
        else:
            time = "✓" if row.on_time_front else f"✗ ({row.time_off_seeds}/{row.seeds})"
        parts.append(f"{row.shape}: mem {memory} time {time}, {row.error:.2f} [{row.error_low:.2f}–"
                     f"{row.error_high:.2f}]")
    return "; ".join(parts)


def verdict_matrix(verdicts_table: pd.DataFrame) -> pd.DataFrame:
    """The verdicts of :func:`analysis.judge.pareto.verdicts` as one row per auto entry (device, dtype, pick) and one
    column per input family: front marks (✗ with the seeds it is off in) and the worst-gradient error in floors
    (seed median [interval]), per shape."""
    if verdicts_table.empty:
        return pd.DataFrame(columns=["device", "dtype", "auto pick"])
    rows = []
    for (device, dtype, pick), group in verdicts_table.groupby(["device", "dtype", "pick"], sort=True):
        row = {"device": device, "dtype": dtype, "auto pick": pick}
        for family, cells in group.groupby("family", sort=False):
            row[family] = _cell(cells)
        rows.append(row)
    families = [f for f in ("random", "calibrated", "trained") if f in verdicts_table["family"].values]
    families += sorted(set(verdicts_table["family"]) - set(families))
    return pd.DataFrame(rows, columns=["device", "dtype", "auto pick", *families])


def verdict_changes(verdicts_table: pd.DataFrame) -> pd.DataFrame:
    """Per auto entry (device, dtype, pick): is it on the memory / time front in every family (on a front in a
    family: in every seed and shape there), does either mark change between families (time is not judged on
    emulated layouts), and the lowest and highest family's median worst-gradient error (floors)."""
    per_family = verdicts_table.groupby(["device", "dtype", "pick", "family"]).agg(
        memory=("on_memory_front", "all"), time=("on_time_front", "all"), error=("error", "median"))
    emulated = per_family.index.get_level_values("device") == "cuda-emulated"
    per_family["time"] = per_family["time"].astype(object).where(~emulated)
    grouped = per_family.groupby(level=["device", "dtype", "pick"])
    changes = (grouped["memory"].nunique() > 1) | (grouped["time"].nunique() > 1)
    return pd.DataFrame({"families": grouped.size(), "memory front": grouped["memory"].all(),
                         "time front": grouped["time"].agg(lambda t: t.all() if t.notna().all() else np.nan),
                         "changes": changes, "error low": grouped["error"].min(),
                         "error high": grouped["error"].max()}).reset_index()


ROW_COLUMNS = ("grad_weight_fro_in_floors", "grad_weight_row_p99", "grad_weight_row_max", "grad_weight_bias_in_floors")


def time_verdict_changes(verdicts_table: pd.DataFrame) -> pd.DataFrame:
    """The (device, dtype, pick) entries of a ``pareto.verdicts`` table whose time verdict differs between families
    (on the time front in every seed and shape of one family, not of another; emulated layouts are not timed)."""
    per_family = verdicts_table[verdicts_table["device"] != "cuda-emulated"].groupby(
        ["device", "dtype", "pick", "family"])["on_time_front"].all()
    changed = per_family.groupby(level=["device", "dtype", "pick"]).nunique() > 1
    return changed[changed].reset_index()[["device", "dtype", "pick"]]


def rows_and_bias(table: pd.DataFrame) -> pd.DataFrame:
    """Per device, family, dtype and op (lce, torch), default options in bf16 and fp16 at each family's largest
    shape on that device: grad_weight's Frobenius floors, p99 and worst class row, and signed bias (seed medians,
    with the interval of :func:`analysis.judge.pareto.seed_interval`)."""
    data = table[(table["op"].isin(["lce", "torch"])) & (table["policy"] == "auto") & (table["chunking"] == "auto")
                 & (table["acc_dtype"] == "default") & (table["dtype"] != "float32")]
    largest = data.groupby(["device", "family"])["N"].transform("max") == data["N"]
    medians = seed_interval(data[largest], list(ROW_COLUMNS))
    return medians.sort_values(["device", "family", "dtype", "op"]).reset_index(drop=True)


# --- README block and its formatting

def by_dtype(frame: pd.DataFrame, names: dict[str, str], order) -> pd.DataFrame:
    """One row per ``impl`` of ``order`` (renamed by it when a dict), one column "bf16 NAME" / "fp16 NAME" per
    column of ``names`` (a dict of column to NAME)."""
    wide = frame[frame["impl"].isin(order)].set_index(["impl", "dtype"])[list(names)].unstack("dtype")
    wide.columns = [f"{dtype.replace('bfloat', 'bf').replace('float', 'fp')} {names[n]}" for n, dtype in wide.columns]
    wide = wide.reindex([impl for impl in order if impl in wide.index])
    return wide.rename(index=order if isinstance(order, dict) else {}).rename_axis("implementation").reset_index()


def _shape(frame: pd.DataFrame) -> str:
    return f"{frame['N'].iloc[0]}×{frame['D'].iloc[0]}×{frame['C'].iloc[0]}"


def readme_realistic_inputs(results: Path) -> str:
    """Notebook 05's key numbers as four small tables: the families, confident rows, rare rows, verdicts."""
    from analysis.core.results_io import FAMILY_STATS, MARGINS, RARE_ROWS
    from analysis.judge.pareto import load_table

    stats, margins, rare = (load_kind(results, kind.name)[1] for kind in (FAMILY_STATS, MARGINS, RARE_ROWS))
    worst = by_dtype(margin_worst(margins), {"worst": "floors", "at_margin": "at (nats)", "loss_ulps": "loss (ulps)"},
                     MARGIN_SHOWN)
    rows = by_dtype(rare_summary(rare), {"frobenius": "Frobenius", "max": "worst row"}, RARE_SHOWN)
    changes = verdict_changes(verdicts(load_table(results)[1]))
    return "\n\n".join(part.rstrip("\n") for part in [
        f"The families (`python -m analysis family-stats`, {_shape(stats)}, seed {stats['seed'].iloc[0]}):",
        markdown_table(family_traits(stats).rename(columns=TRAITS).reset_index(),
                       dict(zip(TRAITS.values(), (".2f", ".2g", ".2g", ".1%", ".1f", ".1f", ".2f"), strict=True))),
        f"Confident rows, margins 0–{margins['margin'].max():g} nats (`python -m analysis margins`, {_shape(margins)}, "
        f"{margins['seed'].nunique()} seeds): the largest seed-median error of the worse gradient over the margins, "
        "where it is, the largest loss error:",
        markdown_table(worst, {c: ".0f" if "nats" in c else ".2f" for c in worst.columns}),
        f"Rare classes' grad_weight rows, `{rare['family'].iloc[0]}` inputs (`python -m analysis rare-rows`, "
        f"{_shape(rare_summary(rare))}, {rare['seed'].nunique()} seeds): "
        "Frobenius floors (seed median) and the worst class row over seeds (in its own floors):",
        markdown_table(rows, {c: ".2f" for c in rows.columns}),
        "Each auto entry's verdict per input family (CPU: the quick and medium grids; CUDA: an H200's cuda grid; "
        "✓: on that front in every seed and shape of every family; error: the lowest and the highest family's "
        "median, floors):",
        markdown_table(changes.assign(changes=~changes["changes"]).rename(columns={"changes": "same everywhere"}),
                       {"error low": ".2f", "error high": ".2f"}),
    ]) + "\n"
