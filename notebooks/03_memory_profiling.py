# %% [markdown]
# # 03 · Memory: does lce's model match the measured peak, and where do the bytes go over one step?
#
# lce's plan predicts the peak extra memory of one forward+backward from the buffers it will
# allocate; the analysis measures the real peak from the CPU allocator's event stream (every
# tensor allocation and free, in order). This notebook checks the model against the
# measurement over the committed quick grid, breaks each configuration's plan down buffer by
# buffer, and traces live memory through one forward+backward for lce, torch 2.13's native op
# and the unfused reference. It measures nothing itself: the breakdown and the trace are the
# committed results of `python -m analysis memory-study`. CUDA memory snapshots need a GPU;
# no GPU data is committed yet, so everything here is CPU.

# %%
import os

from IPython.display import Markdown, display

from analysis.core.results_io import MEMORY_BREAKDOWN, MEMORY_TRACE, load_kind
from analysis.judge import pareto
from analysis.paths import RESULTS_DIR
from analysis.report import nb03_memory
from analysis.report.tables import show
from analysis.studies import memory_study

# %matplotlib inline
QUICK = os.environ.get("LCE_QUICK", "1") == "1"  # reads committed results only; nothing to shorten
paths, table = pareto.load_table()
breakdown_paths, breakdown = load_kind(RESULTS_DIR, MEMORY_BREAKDOWN.name)
trace_paths, traces = load_kind(RESULTS_DIR, MEMORY_TRACE.name)
print("data:", ", ".join(path.name for path in [*paths, *breakdown_paths, *trace_paths]))

# %% [markdown]
# ## Measured vs modeled, every lce run of the quick grid
# Measured over modeled peak, per dtype and policy (1.00: the model is exact).

# %%
lce_runs = table[(table.op == "lce") & (table.device == "cpu")]
ratios = (lce_runs.assign(ratio=lce_runs.peak_bytes_measured / lce_runs.peak_bytes_modeled)
          .groupby(["dtype", "policy", "acc_dtype"])["ratio"].agg(["min", "median", "max"]).reset_index())
show(ratios, {"min": "{:.2f}", "median": "{:.2f}", "max": "{:.2f}"}, name="model-ratios")

# %%
figure = nb03_memory.plot_memory_model(table)
display(figure.figure, Markdown(figure.markdown))

# %%
Markdown(nb03_memory.memory_model(table))

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
Markdown(nb03_memory.buffer_breakdown(breakdown))

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
Markdown(nb03_memory.memory_trace(peaks, traces))
