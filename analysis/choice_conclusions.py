"""The conclusions of notebook 07 (choosing options), written from the error model's validation, its predictions,
``lce.recommend``'s picks and the budgets study.

Each function returns Markdown that starts with :data:`analysis.conclusions.MARKER` and ends with the inputs and
limits it rests on, like :mod:`analysis.conclusions`.
"""

from __future__ import annotations

import pandas as pd

from .conclusions import _conclusion, _join, _missing, _range, _shapes
from .error_model_fit import SHARE_BAND, summary
from .plots_budgets import BUDGET_TOLERANCE
from .recommendations import CCE_REPORTED_MB, CCE_SHAPE, cce_anchor

__all__ = ["error_model", "llm_predictions", "recommendations", "budgets", "class_tiling", "temporaries"]

POLICIES = ("accurate", "balanced", "compact")


def error_model(validation: pd.DataFrame) -> str:
    """07: how well the error model predicts measured floors it was fitted on, and those it never saw."""
    report = summary(validation, worst=3)
    (fit_share, fit_count), (held_share, held_count) = report["fit"], report["held_out"]
    splits = [f"{split}: {share:.0%} of {count}" for split, (share, count) in report["per_split"].items()]
    finding = (f"Within ±{SHARE_BAND:.0%} of the measured floors: {held_share:.0%} of the {held_count} held-out "
               f"points and {fit_share:.0%} of the {fit_count} fitted ones. The model ranks options well enough to "
               f"choose between them; a single prediction can be off by more than a quarter, most often in the "
               f"direction of the worst misses below.")
    held = validation[validation["split"] != "fit"]
    return _conclusion(finding, splits + [f"worst held-out miss: {miss}" for miss in report["worst"]],
                       inputs=f"the committed grids' seed medians ({_join(sorted(validation['source'].unique()))}); "
                              f"fitted on {_join(sorted(validation[validation['split'] == 'fit']['family'].unique()))}"
                              f" inputs at N ≤ {validation[validation['split'] == 'fit']['N'].max()}, held out: "
                              f"{_join(sorted(held['family'].unique()))} and {_shapes(held)}.",
                       limits="the input statistics the model uses are those of the committed families; an input "
                              "far from them (e.g. much more confident rows) is outside what was validated.")


def llm_predictions(predictions: pd.DataFrame, dtype: str = "bfloat16", kind: str = "cuda") -> str:
    """07: the predicted weight-gradient floors per policy at the LLM heads (extrapolation)."""
    rows = predictions[(predictions["dtype"] == dtype) & (predictions["kind"] == kind)]
    default = rows[rows["chunking"] == "aspect_ratio:2"]
    most = int(rows["num_chunks"].max())
    per_policy = {policy: default[default["policy"] == policy]["grad_weight"] for policy in POLICIES}
    compact_most = rows[(rows["policy"] == "compact") & (rows["num_chunks"] == most)]["grad_weight"]
    finding = (f"Predicted, not measured: with `aspect_ratio:2` ({_range(default['num_chunks'], '.0f')} chunks at "
               f"these heads) compact's weight gradient is {_range(per_policy['compact'], '.1f')} floors, "
               f"balanced's {_range(per_policy['balanced'])} and accurate's {_range(per_policy['accurate'])}; "
               f"compact grows with the chunk count to {_range(compact_most, '.0f')} floors at {most} chunks, while "
               f"the fp32 accumulators keep balanced and accurate flat.")
    bullets = [f"{shape}: compact {group[group['policy'] == 'compact']['grad_weight'].iloc[0]:.1f}, balanced "
               f"{group[group['policy'] == 'balanced']['grad_weight'].iloc[0]:.2f}, accurate "
               f"{group[group['policy'] == 'accurate']['grad_weight'].iloc[0]:.2f} floors (aspect_ratio:2)"
               for shape, group in default.groupby("shape", sort=False)]
    return _conclusion(finding, bullets,
                       inputs=f"lce's error model (`lce.error_model`), {dtype}, {kind.upper()} layouts with fp32 "
                              f"acc_dtype, the worst committed input statistics, heads "
                              f"{_join(list(default['shape'].unique()))} (N×D×C).",
                       limits="an extrapolation from shapes up to N=2048, C=65536; the chunk-walk and stagnation "
                              "terms are the ones that grow here and were fitted where they are small.")


def recommendations(table: pd.DataFrame) -> str:
    """07: what recommend picks at the LLM heads, per device and budget, and the Cut Cross-Entropy anchor."""
    default = table[table["budget"] == "auto's peak"]
    unmet = table[~table["default_limit_met"]]
    anchor = cce_anchor()
    finding = (f"With no budget, recommend keeps within lce auto's peak and the default error limit and picks "
               f"{_join(sorted(set(default['choice'].str.split(',').str[0])))}; predicted peaks "
               f"{_range(default['peak_gib'])} GiB. {len(table) - len(unmet)} of the {len(table)} (head, device, "
               f"budget) cases meet the default limit; the others"
               f"{' (' + _join(sorted(set(unmet['device'] + ' at ' + unmet['budget']))) + ')' if len(unmet) else ''} "
               f"get the least predicted error that fits. At Cut Cross-Entropy's shape ({CCE_SHAPE}) the smallest "
               f"peak within the default limit is {anchor['within_limit_mib']:,.1f} MiB against the gradients' "
               f"{anchor['gradients_mib']:,.0f} MiB (CCE reports {CCE_REPORTED_MB} MB).")
    return _conclusion(finding, [f"{row.shape} {row.device}, {row.budget}: {row.choice} — {row.peak_gib:.2f} GiB, "
                                 f"{row.grad_weight_floors:.2f} weight floors" for row in default.itertuples()],
                       inputs="lce's memory model and error model at the heads above, bf16, \"mean\" reduction, no "
                              "bias (`lce.recommend`, nothing measured).",
                       limits="predictions only; the time estimate that breaks ties between feasible candidates is "
                              "a roofline, not a measurement.")


def budgets(table: pd.DataFrame) -> str:
    """07: the recommended options under budgets, measured in a fresh process each."""
    if table.empty:
        return _missing("No budgets study yet (`python -m analysis budgets`).")
    over = table["measured_peak_bytes"] / table["budget_bytes"]
    model = table["measured_peak_bytes"] / table["predicted_peak_bytes"]
    within = (over <= BUDGET_TOLERANCE).all()
    finding = (f"{'Every' if within else 'Not every'} recommended option set stayed within {BUDGET_TOLERANCE:g}× "
               f"its budget: measured peak {_range(over, '.3f')}× the budget and {_range(model, '.3f')}× the memory "
               f"model, down to {(table['budget_bytes'] / table['gradients_bytes']).min():.2f}× the gradients' own "
               f"bytes. The default error limit was met in {int(table['default_limit_met'].sum())} of {len(table)} "
               f"budgets; below that, recommend returned its least-error fit and said so.")
    bullets = []
    for output in ("grad_input", "grad_weight"):
        miss = table[f"predicted_{output}_floors"] / table[f"{output}_floors"] - 1
        bullets.append(f"{output}: measured {_range(table[f'{output}_floors'])} floors, predicted within "
                       f"{miss.abs().max():.0%} (median miss {miss.abs().median():.0%})")
    return _conclusion(finding, bullets,
                       inputs=f"{table['family'].iloc[0]} inputs, {table['dtype'].iloc[0]}, {_shapes(table)}, one "
                              f"seed per budget, CPU {table['cpu_model'].iloc[0]} (`python -m analysis budgets`).",
                       limits="CPU layouts only; the input gradient's error is where the model misses most (it "
                              "under-predicts CPU balanced on calibrated inputs).")


def class_tiling(table: pd.DataFrame) -> str:
    """07: the time and memory class tiling costs against row-only chunking, per policy."""
    if table.empty:
        return _missing("No class-tiling measurement yet (`python -m analysis budgets`).")
    bullets, savings = [], []
    for policy, group in table.groupby("policy", sort=False):
        rows_only = group[group["num_class_chunks"] == 1].iloc[0]
        tiled = group[group["num_class_chunks"] > 1]
        bullets.append(f"{policy}: " + ", ".join(f"{row.num_class_chunks} blocks {row.time_ratio:.2f}× the time, "
                                                  f"{row.measured_peak_bytes / 2**20:.0f} MiB"
                                                  for row in tiled.itertuples())
                       + f" (row-only {rows_only.measured_peak_bytes / 2**20:.0f} MiB)")
        savings.append(1 - tiled["measured_peak_bytes"].min() / rows_only["measured_peak_bytes"])
    row = table.iloc[0]
    tiled = table[table["num_class_chunks"] > 1]
    finding = (f"Tiling the vocabulary cut the measured peak by {_range(savings, '.0%')} per policy at a time cost "
               f"of {_range(tiled['time_ratio'])}× row-only chunking: each block's logits are computed twice, and "
               f"small blocks make small GEMMs, so choose tiling only when the budget needs it (recommend does).")
    return _conclusion(finding, bullets,
                       inputs=f"{row.N}×{row.D}×{row.C}, {row['dtype']}, {row.batch_chunk_size} rows per chunk, one "
                              f"run each, CPU {row.cpu_model}.",
                       limits="one run per point on a shared 2-core machine (a ratio below 1 is noise or cache "
                              "effects, not a speed-up to rely on); GPU costs are unmeasured.")


def temporaries(peaks: pd.DataFrame) -> str:
    """07: the predicted peaks per layout and policy once no (C, D) product is formed whole."""
    cuda = peaks[peaks["layouts"] == "cuda"].set_index("policy")["peak_kib"]
    gap = cuda["balanced"] / cuda["accurate"] - 1
    finding = (f"On the CUDA layouts balanced now needs {cuda['balanced']:.1f} KiB against accurate's "
               f"{cuda['accurate']:.1f} KiB ({gap:+.1%}) and compact's {cuda['compact']:.1f} KiB: each layout's "
               f"peak is its accumulator plus chunk-sized buffers, with no whole (C, D) product on top. On memory "
               f"alone balanced still does not undercut accurate on CUDA, so whether it earns its \"auto\" entry "
               f"there is a question of speed, which only a GPU can measure.")
    bullets = [f"{row.layouts} {row.policy}: {row.peak_kib:.1f} KiB" for row in peaks.itertuples()]
    return _conclusion(finding, bullets,
                       inputs="lce's memory model (`lce.plan`) at N=256, D=32, C=1000, bf16, fp32 acc_dtype; the "
                              "model matches the CPU allocator within 0.5% on the re-measured grids (notebook 03).",
                       limits="the CUDA figures are the model's; no GPU allocator was measured in this notebook.")
