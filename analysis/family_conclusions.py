"""The data-written conclusions of notebook 05 (realistic inputs), in the style of :mod:`analysis.conclusions`.

Each function takes a table the notebook shows and returns Markdown that
starts with :data:`analysis.conclusions.MARKER`: the finding with its numbers,
the inputs it rests on, its limits.
"""

from __future__ import annotations

import pandas as pd
import torch

from .conclusions import _conclusion, _format, _join, _range, _shapes

__all__ = ["family_portraits", "margins", "rare_rows", "verdict_matrix", "verdict_changes", "rows_and_bias",
           "CONFIDENT_SHARE", "OUTLIER_RATIO"]

CONFIDENT_SHARE = 0.01
"""A family "has confident rows" when more than this share of its rows has p_target > 0.999."""

OUTLIER_RATIO = 10.0
"""A family "has feature outliers" when its largest feature's RMS exceeds the median feature's by this factor."""


def _statistic(values: pd.DataFrame, family: str, name: str) -> float:
    return float(values.loc[family, name]) if family in values.index and name in values.columns else float("nan")


def family_portraits(stats: pd.DataFrame) -> str:
    """What separates the families: loss, confident rows, margins, feature outliers, Zipfian targets."""
    values = stats[stats["statistic"] != "target_count"].pivot_table(index="family", columns="statistic",
                                                                     values="value")
    families = list(dict.fromkeys(stats["family"]))
    bullets = []
    for family in families:
        loss = _statistic(values, family, "mean_loss")
        confident = _statistic(values, family, "share_p_target_above_0.999")
        median_p = _statistic(values, family, "p_target_q0.5")
        top_margin = _statistic(values, family, "max_margin")
        outliers = _statistic(values, family, "feature_rms_max_over_median")
        slope = _statistic(values, family, "zipf_slope")
        bullets.append(f"`{family}`: mean loss {loss:.2f} nats, median p_target {median_p:.2g}, "
                       f"{confident:.1%} of rows with p_target > 0.999 (largest margin {top_margin:.1f} nats), "
                       f"largest feature {outliers:.1f}x the median feature's RMS, rank-frequency slope "
                       f"{slope:.2f}")
    def named(names: list[str]) -> str:
        return _join([f"`{f}`" for f in names]) or "none"

    confident = [f for f in families if _statistic(values, f, "share_p_target_above_0.999") > CONFIDENT_SHARE]
    outliers = [f for f in families if _statistic(values, f, "feature_rms_max_over_median") > OUTLIER_RATIO]
    zipfian = [f for f in families if _statistic(values, f, "zipf_slope") < -0.5]
    wrong = [f for f in families if _statistic(values, f, "p_target_q0.95") < 1e-3]
    finding = (f"Confidently wrong on almost every row (95% of rows below p_target 0.001): {named(wrong)}. "
               f"Zipfian targets (rank-frequency slope below −0.5): {named(zipfian)}. More than "
               f"{CONFIDENT_SHARE:.0%} of rows predicted with near certainty (p_target > 0.999): {named(confident)}. "
               f"Feature outliers above {OUTLIER_RATIO:g}x the median feature's RMS: {named(outliers)}.")
    seed = int(stats["seed"].iloc[0]) if "seed" in stats else 0
    return _conclusion(
        finding, bullets,
        inputs=f"{_join([f'`{f}`' for f in families])} at {_shapes(stats)}, seed {seed}, statistics in fp64 on "
               "each family's fp32 draw (`python -m analysis family-stats`).",
        limits=f"one draw per family ({int(stats['N'].iloc[0])} rows each: a mean loss is a few tenths of a nat from "
               f"sampling); the trained model is small ({_trained_model()}): its loss is above a production LM's 2–3 "
               "nats and it has not learned the near-certain predictions larger models make, which the "
               "`calibrated` family supplies synthetically.")


def _trained_model() -> str:
    """The trained family's model in words, from its final dump's metadata."""
    from .lm.dumps import load_head_dump

    meta = load_head_dump("final").meta
    model, training = meta["model_config"], meta["train_config"]
    return (f"{model['n_layers']} layers, D={model['d_model']}, {meta['step']} steps of {training['batch_size']}x"
            f"{model['context']} tokens, held-out loss {meta['heldout_loss']:.2f} nats")


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
    """The verdicts of :func:`analysis.pareto.verdicts` as one row per auto entry (device, dtype, pick) and one
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


def verdict_changes(verdicts_table: pd.DataFrame) -> str:
    """Per auto entry: do its memory/time verdicts and its error change between input families?"""
    if verdicts_table.empty:
        return _conclusion("The results hold no run of an \"auto\" pick to judge.",
                           inputs="the committed sweep results.", limits="nothing to conclude from.")
    bullets, changed = [], []
    for (device, dtype, pick), group in verdicts_table.groupby(["device", "dtype", "pick"], sort=True):
        per_family = group.groupby("family", sort=False).agg(
            memory=("on_memory_front", "all"), time=("on_time_front", "all"), error=("error", "median"),
            high=("error_high", "max"))
        words = []
        for family, row in per_family.iterrows():
            time = "" if device == "cuda-emulated" else f", time front {'✓' if row.time else '✗'}"
            words.append(f"{family}: memory front {'✓' if row.memory else '✗'}{time}, {row.error:.2f} floors "
                         f"[up to {row.high:.2f}]")
        varies = per_family["memory"].nunique() > 1 or (device != "cuda-emulated" and per_family["time"].nunique() > 1)
        if varies:
            changed.append(f"{device} {dtype}")
        bullets.append(f"**{device} {dtype} → {pick}**{' (changes with the inputs)' if varies else ''}: "
                       + "; ".join(words))
    finding = (f"The verdict changes between input families for {_join(changed)}." if changed else
               "No auto entry's verdict changes between the input families measured.")
    seeds = int(verdicts_table["seeds"].max())
    return _conclusion(
        finding, bullets,
        inputs=f"the committed quick and medium grids: {_join(sorted(set(verdicts_table['family'])))} inputs, "
               f"shapes {_join(sorted(set(verdicts_table['shape'])))}, up to {seeds} seeds per configuration "
               "(✓: on the front in every seed and shape; errors are seed medians, in brackets the largest 95th "
               "percentile over seeds).",
        limits="CUDA entries are judged on lce's CUDA layouts run on CPU tensors (exact products, fp32 sums in "
               "the CPU's order; memory is lce's model, no time); CPU times are one thread on a shared 2-core "
               "machine, so time verdicts within 10–20% are noise.")


ROW_COLUMNS = ("grad_weight_fro_in_floors", "grad_weight_row_p99", "grad_weight_row_max", "grad_weight_bias_in_floors")


def rows_and_bias(table: pd.DataFrame) -> str:
    """05: per device, family and dtype, lce's default options next to torch's: grad_weight's whole-tensor error,
    its p99 and worst class row, and its signed bias (seed medians; the largest shape of each family)."""
    from .pareto import INTERVAL, seed_interval

    data = table[(table["op"].isin(["lce", "torch"])) & (table["policy"] == "auto") & (table["chunking"] == "auto")
                 & (table["acc_dtype"] == "default") & (table["dtype"] != "float32")]
    if data.empty or not set(ROW_COLUMNS) <= set(data.columns):
        return _conclusion("The results hold no per-row errors of the default options.",
                           inputs="the committed sweep results.", limits="nothing to conclude from.")
    largest = data.groupby("family")["N"].transform("max") == data["N"]
    medians = seed_interval(data[largest], list(ROW_COLUMNS))
    bullets = []
    worst_gap = None
    for row in medians.sort_values(["device", "family", "dtype", "op"]).itertuples():
        values = row._asdict()
        gap = values["grad_weight_row_max"] / values["grad_weight_fro_in_floors"]
        if worst_gap is None or gap > worst_gap[0]:
            worst_gap = (gap, f"{row.op} on {row.device}, {row.family} {row.dtype}")
        bullets.append(f"{row.device} {row.family} {row.dtype} {row.N}×{row.D}×{row.C}, {row.op} defaults: "
                       f"{values['grad_weight_fro_in_floors']:.2f} floors on the whole grad_weight, "
                       f"{values['grad_weight_row_p99']:.2f} at the 99th-percentile class row, "
                       f"{values['grad_weight_row_max']:.2f} at the worst (up to "
                       f"{values['grad_weight_row_max_high']:.2f}), bias "
                       f"{_format(values['grad_weight_bias_in_floors'], '+.2f')} floors")
    finding = (f"The worst class row is up to {worst_gap[0]:.0f}x the whole tensor's error ({worst_gap[1]}); "
               "a bias of a fraction of a floor is what unbiased rounding leaves, a bias of whole floors "
               "shrinks or grows every step's update the same way.")
    return _conclusion(
        finding, bullets,
        inputs=f"default options of lce and torch (policy and chunking \"auto\"), bf16 and fp16, the largest "
               f"shape of each family in the committed grids; seed medians (intervals: {INTERVAL}).",
        limits="row errors are each row against its own rounding floor, so a row whose entries are all tiny "
               "reads large even when its absolute error is below the tensor's; CUDA rows are lce's CUDA "
               "layouts on CPU tensors.")


def _worst_over_margins(margins: pd.DataFrame) -> pd.DataFrame:
    """Per dtype and implementation: the largest seed-median worst-gradient floors over the margins, the margin
    where it occurs, the same restricted to margins <= 10 nats, and the largest loss distance in ulps."""
    data = margins.assign(worst=margins[["grad_input_floors", "grad_weight_floors"]].max(axis=1))
    medians = data.groupby(["dtype", "impl", "margin"], sort=True)["worst"].median().reset_index()
    rows = []
    for (dtype, impl), group in medians.groupby(["dtype", "impl"], sort=True):
        top = group.loc[group["worst"].idxmax()]
        rows.append({"dtype": dtype, "impl": impl, "worst": top["worst"], "at_margin": top["margin"],
                     "worst_to_10": group[group["margin"] <= 10]["worst"].max(),
                     "loss_ulps": data[(data["dtype"] == dtype) & (data["impl"] == impl)]["loss_ulps"].max()})
    return pd.DataFrame(rows)


MARGIN_BULLETS = ("lce auto cpu acc=default", "lce auto cuda acc=default", "lce accurate cpu acc=fp32",
                  "lce accurate cuda acc=fp32", "torch accurate acc=fp32", "torch compact acc=fp32", "unfused fp32")
"""The implementations the margins conclusion lists one by one (the figure shows every one)."""


def margins(margins: pd.DataFrame) -> str:
    """05: lce's cancellation-free target terms against the unfused fp32 formula and torch's op, 0-40 nats."""
    if margins.empty:
        return _conclusion("No margins results yet (`python -m analysis margins`).",
                           inputs="the committed results.", limits="nothing to conclude from.")
    worst = _worst_over_margins(margins)
    ours = worst[worst["impl"].str.startswith("lce accurate") & worst["impl"].str.endswith("acc=fp32")]
    peers = worst[~worst["impl"].str.startswith("lce")]
    bf16_peers = peers[peers["dtype"] == "bfloat16"]
    finding = (f"lce's `accurate` with fp32 accumulation (CPU and CUDA layouts) stays within "
               f"{ours['worst'].max():.2f} floors on both gradients at every margin from "
               f"{margins['margin'].min():g} to {margins['margin'].max():g} nats in bf16 and fp16, its loss within "
               f"{ours['loss_ulps'].max():.2f} ulp of fp64. The peers that form `p_y − 1` reach "
               f"{_range(bf16_peers['worst'], '.0f')} floors in bf16 (at {_range(bf16_peers['at_margin'], 'g')} "
               f"nats) and {_range(bf16_peers['loss_ulps'], '.0f')} ulps on the loss, while being within "
               f"{bf16_peers['worst_to_10'].max():.2f} floors up to 10 nats.")
    bullets = []
    shown = worst[worst["impl"].isin(MARGIN_BULLETS)]
    for row in shown.sort_values(["dtype", "worst"]).itertuples():
        bullets.append(f"{row.dtype}, {row.impl}: worst {row.worst:.2f} floors (at {row.at_margin:g} nats; "
                       f"{row.worst_to_10:.2f} up to 10 nats), loss within {row.loss_ulps:.2f} ulps")
    first = margins.iloc[0]
    return _conclusion(
        finding, bullets,
        inputs=f"rows whose target leads by 0–40 nats (`families.confident_rows`), {first.N}×{first.D}×{first.C}, "
               f"{margins['seed'].nunique()} seeds (seed medians), bf16 and fp16, errors against the "
               "cancellation-free fp64 reference (`python -m analysis margins`).",
        limits="in fp16 past about 15 nats the exact gradients are below fp16's subnormals, so every "
               "implementation reads 1 floor there: fp16 cannot judge large margins. An explicit policy without "
               "acc_dtype accumulates in the input dtype (torch's options contract): those rows measure bf16/fp16 "
               "accumulation, not the target terms.")


def _rare_summary(rare: pd.DataFrame) -> pd.DataFrame:
    """Per dtype and implementation: Frobenius floors (seed median), the worst bin's p99 row (seed median) and the
    worst row over seeds, with the bin they occur in."""
    rows = []
    for (dtype, impl), group in rare.groupby(["dtype", "impl"], sort=True):
        bins = group[group["bin"] != "all"]
        p99 = bins.groupby("bin")["row_p99"].median()
        top = bins.loc[bins["row_max"].idxmax()]
        rows.append({"dtype": dtype, "impl": impl,
                     "frobenius": group.groupby("seed")["grad_weight_floors"].first().median(),
                     "p99": p99.max(), "p99_bin": p99.idxmax(), "max": top["row_max"], "max_bin": top["bin"]})
    return pd.DataFrame(rows)


def rare_rows(rare: pd.DataFrame) -> str:
    """05: the weight-gradient rows of rarely targeted classes, per policy and layout, fp16 and bf16."""
    if rare.empty:
        return _conclusion("No rare-rows results yet (`python -m analysis rare-rows`).",
                           inputs="the committed results.", limits="nothing to conclude from.")
    summary = _rare_summary(rare)

    def line(impl_prefix: str) -> list[str]:
        picked = summary[summary["impl"] == impl_prefix]
        return [f"{r.dtype}: {r.frobenius:.2f} floors Frobenius, p99 row {r.p99:.1f} (classes targeted "
                f"{r.p99_bin}), worst row {r.max:.0f} ({r.max_bin})" for r in picked.itertuples()]

    compact = summary[summary["impl"] == "lce compact cuda acc=fp32 aspect_ratio:2"]
    balanced = summary[summary["impl"] == "lce balanced cuda acc=fp32 aspect_ratio:2"]
    from lce.policies import auto_pick

    picks = _join(sorted({f"{dtype} → {auto_pick('cuda', getattr(torch, dtype)).acc_policy}"
                          for dtype in summary["dtype"]}))
    finding = (f"On the CUDA layouts, compact's once-per-chunk rounding of the weight gradient costs "
               f"{_range(compact['frobenius'])} floors on the whole grad_weight and up to "
               f"{compact['max'].max():.0f} floors on single class rows; balanced, with the same chunks and an fp32 "
               f"sum, is {_range(balanced['frobenius'])} floors with no row above {balanced['max'].max():.1f}. "
               f"lce's CUDA \"auto\" entries: {picks}.")
    bullets = []
    for name, impl in (("CPU auto", "lce auto cpu acc=default auto"), ("CUDA auto", "lce auto cuda acc=default auto"),
                       ("compact, CUDA layout, fp32, aspect_ratio:2", "lce compact cuda acc=fp32 aspect_ratio:2"),
                       ("balanced, CUDA layout, fp32, aspect_ratio:2", "lce balanced cuda acc=fp32 aspect_ratio:2"),
                       ("torch's default", "torch default"), ("unfused in the input dtype", "unfused")):
        bullets += [f"{name}, {text}" for text in line(impl)]
    first = rare.iloc[0]
    return _conclusion(
        finding, bullets,
        inputs=f"`{first.family}` inputs (Zipfian targets), {first.N}×{first.D}×{first.C}, "
               f"{rare['seed'].nunique()} seeds (medians; the worst row over seeds), fp16 and bf16, each class row "
               "of grad_weight against its own rounding floor (`python -m analysis rare-rows`).",
        limits="one shape (the cost of emulating the CUDA layouts on CPU grows as C² with aspect_ratio:2); "
               "`rare_rows_c32768.csv` holds a 2-seed spot check at C=32768 (`rare-rows --shape 2048x256x32768`); "
               "CUDA numbers are lce's CUDA layouts on CPU tensors.")
