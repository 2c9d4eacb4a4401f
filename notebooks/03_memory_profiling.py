# %% [markdown]
# # 03 · Memory: does lce's model match the measured peak, and where do the bytes go over one step?
#
# lce's plan predicts the peak extra memory of one forward+backward from the buffers it will
# allocate; the analysis measures the real peak from the CPU allocator's event stream (every
# tensor allocation and free, in order). This notebook checks the model against the
# measurement over the committed quick grid, breaks each configuration's plan down buffer by
# buffer, and traces live memory through one forward+backward for lce, torch 2.13's native op
# and the unfused reference. CUDA memory snapshots need a GPU; no GPU data is committed yet,
# so everything here is CPU.

# %%
import os

import pandas as pd

from analysis import pareto, plots
from analysis.studies import memory_study

QUICK = os.environ.get("LCE_QUICK", "1") == "1"  # both settings are quick here: the study problem is fixed
pd.set_option("display.width", 200)
paths, table = pareto.load_table()

# %% [markdown]
# ## Measured vs modeled, every lce run of the quick grid

# %%
lce_runs = table[(table.op == "lce") & (table.device == "cpu")].copy()
lce_runs["measured/modeled"] = lce_runs.peak_bytes_measured / lce_runs.peak_bytes_modeled
ratios = lce_runs.groupby(["dtype", "policy", "acc_dtype"])["measured/modeled"]
ratios.agg(["min", "median", "max"]).style.format("{:.2f}")

# %%
print(plots.plot_memory_model(table).caption)

# %% [markdown]
# ## Where the bytes go: lce's plan, buffer by buffer (bf16, N=2048 D=256 C=16384)

# %%
breakdown = memory_study.buffer_breakdown()
(breakdown.assign(MiB=breakdown.nbytes / 2**20)
 .pivot_table(index="buffer", columns="config", values="MiB", aggfunc="sum").fillna(0).style.format("{:.2f}"))

# %%
print(plots.plot_buffer_breakdown(breakdown).caption)

# %% [markdown]
# ## Memory over one forward+backward, measured

# %%
traces = memory_study.memory_traces()
peaks = (traces.groupby("config", sort=False).live_bytes.max() / 2**20).rename("measured peak (MiB)").to_frame()
peaks["predicted (MiB)"] = breakdown.groupby("config").predicted_peak_bytes.first() / 2**20
peaks["vs reference"] = peaks["measured peak (MiB)"] / peaks.loc["reference", "measured peak (MiB)"]
peaks.style.format("{:.2f}")

# %%
print(plots.plot_memory_trace(traces, breakdown).caption)
