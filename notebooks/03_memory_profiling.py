# %% [markdown]
# # 03 · Memory: does lce's model match the measured peak, and where do the bytes go over one step?
#
# lce's plan predicts the peak extra memory of one forward+backward from the buffers it will
# allocate; the analysis measures the real peak from the CPU allocator's event stream (every
# tensor allocation and free, in order). This notebook checks the model against the
# measurement over the committed grids, breaks each configuration's plan down buffer by
# buffer, and traces live memory through one forward+backward for lce, torch 2.13's native op
# and the unfused reference. It measures nothing itself: the breakdown and the trace are the
# committed results of `python -m analysis memory-study`, and, for CUDA, of `python -m analysis
# gpu-check` on an H200 (the CUDA allocator's peaks against the model, last section).

# %%
from IPython.display import Markdown, display

from analysis.core.results_io import GPU_MEMORY, MEMORY_BREAKDOWN, MEMORY_TRACE, load_kind
from analysis.judge import pareto
from analysis.paths import RESULTS_DIR
from analysis.report import nb03_memory
from analysis.report.nb02_accuracy import cpus, shapes
from analysis.report.nb03_memory import MODEL_BAND
from analysis.report.style import families_text, seeds_text
from analysis.report.tables import show
from analysis.studies import memory_study

# %matplotlib inline
paths, table = pareto.load_table()
breakdown_paths, breakdown = load_kind(RESULTS_DIR, MEMORY_BREAKDOWN.name)
trace_paths, traces = load_kind(RESULTS_DIR, MEMORY_TRACE.name)
print("data:", ", ".join(path.name for path in [*paths, *breakdown_paths, *trace_paths]))

# %% [markdown]
# ## Measured vs modeled, every lce run of the committed grids
# Measured over modeled peak, per dtype and policy (1.00: the model is exact).

# %%
lce_runs = nb03_memory.model_runs(table)
ratios = lce_runs.groupby(["dtype", "policy", "acc_dtype"])["ratio"].agg(["min", "median", "max"]).reset_index()
show(ratios, {"min": "{:.2f}", "median": "{:.2f}", "max": "{:.2f}"}, name="model-ratios")

# %%
figure = nb03_memory.plot_memory_model(table)
display(figure.figure, Markdown(figure.markdown))

# %%
furthest = lce_runs.loc[lce_runs.ratio.idxmax()]


def shape_of(row):
    return f"{row['N']}x{row['D']}x{row['C']}"


Markdown(f"""**Conclusion.** lce's memory model predicts the measured peak within ±{MODEL_BAND:.0%} on
{lce_runs.within.sum()} of {len(lce_runs)} runs, and it never predicts more than was measured: measured/modeled
runs from {lce_runs.ratio.min():.3f} to {lce_runs.ratio.max():.3f}, median {lce_runs.ratio.median():.3f}; the largest
miss is {lce_runs.ratio.max() - 1:.1%} (at {shape_of(furthest)}, {furthest["dtype"]}).

*Inputs:* every lce run of the committed sweep grids on the CPU ({cpus(lce_runs)}): families
{families_text(lce_runs)} ({seeds_text(lce_runs)}); shapes {shapes(lce_runs)} (N×D×C); bf16, fp16 and fp32;
measured: peak live tensor bytes of one forward+backward (method:
{", ".join(lce_runs.memory_method.dropna().unique())}); modeled: `lce.plan(...).peak_extra_bytes`.

*Limits:* small shapes, where fixed overheads weigh more than at LLM sizes; the CPU allocator (the CUDA allocator's
peaks are the last section's); one CPU; memory is measured on one seed per configuration (it does not depend on the
values).""")

# %% [markdown]
# ## Where the bytes go: lce's plan, buffer by buffer
# MiB per planned buffer and configuration (— where a configuration has no such buffer), and
# the plan's predicted peak.

# %%
mib = breakdown.assign(MiB=breakdown.nbytes / 2**20).pivot_table(
    index="buffer", columns="config", values="MiB", aggfunc="sum", sort=False)
mib.loc["predicted peak"] = breakdown.groupby("config", sort=False).predicted_peak_bytes.first() / 2**20
show(mib.reset_index(), {config: "{:.2f}" for config in mib.columns}, name="buffers")

# %%
figure = nb03_memory.plot_buffer_breakdown(breakdown)
display(figure.figure, Markdown(figure.markdown))

# %%
plans = nb03_memory.plan_sizes(breakdown)
largest, smallest = plans.peak.idxmax(), plans.peak.idxmin()
missing = nb03_memory.lacks(breakdown, smallest, largest)
show(plans.reset_index(), {"peak": "{:.1f} MiB", "total": "{:.1f} MiB"}, name="plan-sizes")

# %%
Markdown(f"""**Conclusion.** `{largest}` plans the largest peak, {plans.peak[largest]:.1f} MiB, and
`{smallest}` the smallest, {plans.peak[smallest]:.1f} MiB ({plans.peak[largest] / plans.peak[smallest]:.1f}x
less). `{smallest}` has none of these {" and ".join(missing.buffer_dtype.unique())} working buffers of
`{largest}`: {", ".join(f"{b.buffer} ({b.MiB:.2f} MiB)" for b in missing.itertuples())}; the largest of them is the
persistent (C, D) weight-gradient accumulator. `lce balanced acc=fp32` keeps that accumulator and plans
{plans.peak['lce balanced acc=fp32']:.1f} MiB.

*Inputs:* `lce.plan` for shape {shapes(breakdown)} (N×D×C), {", ".join(breakdown.dtype.unique())} input, no bias;
configurations {", ".join(plans.index)}; recorded by `python -m analysis memory-study` at revision
{", ".join(breakdown.git_revision.unique())}.

*Limits:* a plan, not a measurement (the next section measures it); one shape and one input dtype. A plan's
buffers add up to more than its peak ({", ".join(f"{total:.1f}" for total in plans.total)} MiB against the peaks
above) because chunk buffers and the final rounding never coexist.""")

# %% [markdown]
# ## Memory over one forward+backward, measured

# %%
peaks = memory_study.peaks(traces, breakdown)
show(peaks.rename(columns={"measured_mib": "measured peak (MiB)", "predicted_mib": "predicted (MiB)",
                           "measured_over_predicted": "measured / predicted", "over_reference": "vs reference"}),
     {"measured peak (MiB)": "{:.1f}", "predicted (MiB)": "{:.1f}", "measured / predicted": "{:.2f}",
      "vs reference": "{:.2f}x"}, name="peaks")

# %%
figure = nb03_memory.plot_memory_trace(traces, breakdown)
display(figure.figure, Markdown(figure.markdown))

# %%
measured = peaks.set_index("config")
lce = measured[measured.index.str.startswith("lce")]
outside = lce[(lce.measured_over_predicted - 1).abs() > MODEL_BAND]
inside = lce.drop(outside.index)
beyond = " and ".join(f"`{config}` measures {row.measured_over_predicted:.2f}x its prediction ({row.measured_mib:.1f}"
                      f" against {row.predicted_mib:.1f} MiB)" for config, row in outside.iterrows())
Markdown(f"""**Conclusion.** Measured over one forward+backward, every lce configuration peaks below torch's op
({measured.measured_mib['torch auto']:.1f} MiB) and the unfused reference ({measured.measured_mib['reference']:.1f}
MiB): from {lce.measured_mib.min():.1f} to {lce.measured_mib.max():.1f} MiB, {lce.over_reference.min():.2f}–
{lce.over_reference.max():.2f}x the reference. {" and ".join(f"`{config}`" for config in inside.index)} measure
within {(inside.measured_over_predicted - 1).abs().max():.1%} of their predicted peaks; {beyond}: outside the
±{MODEL_BAND:.0%} band that held for every run of the first section.

*Inputs:* `random` inputs without a bias (memory does not depend on the values); shape {shapes(traces)} (N×D×C);
{", ".join(traces.dtype.unique())}; on {cpus(traces)}; one call per configuration after a warm-up call, live
tensor bytes after each allocator event; recorded by `python -m analysis memory-study`.

*Limits:* the CPU allocator (an H200's peaks against the model: last section); one shape and one dtype; live
tensor bytes, not the process's resident memory.""")


# %% [markdown]
# ## On a GPU: the CUDA allocator's peaks against the model
# `python -m analysis gpu-check`'s memory step: per policy and shape (bf16), the CUDA
# allocator's peak allocated bytes over one forward+backward, above the inputs, against
# `lce.plan(...).peak_extra_bytes`.

# %%
gpu = nb03_memory.gpu_memory_fit(load_kind(RESULTS_DIR, GPU_MEMORY.name)[1])
show(gpu, {"modeled_gib": "{:.3f}", "measured_gib": "{:.3f}", "measured_over_modeled": "{:.4f}"}, name="gpu-memory")

# %%
Markdown(f"""**Conclusion.** On {", ".join(sorted(gpu.device_name.unique()))} the model predicts the CUDA
allocator's peak within {(gpu.measured_over_modeled - 1).abs().max():.2%} on all {len(gpu)} runs (measured over
modeled {gpu.measured_over_modeled.min():.4f}–{gpu.measured_over_modeled.max():.4f}), from
{gpu.modeled_gib.min():.2f} to {gpu.modeled_gib.max():.2f} GiB, at shapes up to
{gpu.loc[gpu.modeled_gib.idxmax(), "shape"]}; the model never predicts more than was measured.

*Inputs:* `gpu_memory.csv` (torch {", ".join(sorted(gpu.torch_version.unique()))}): bf16, the calls
{", ".join(f"`{call}`" for call in dict.fromkeys(gpu.call))}, auto chunking, shapes
{", ".join(sorted(gpu["shape"].unique()))} (N×D×C).

*Limits:* one GPU, bf16 only; the reserved bytes (the caching allocator's pools) are in the file, not judged here.""")

