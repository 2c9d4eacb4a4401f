# %% [markdown]
# # 04 · Is each "auto" default on the error–memory and error–time fronts, and what should fp32 use?
#
# For every (device, dtype) entry of lce's "auto" table — plus the entries torch's table
# lacks (CPU fp32, CUDA fp32, which fall back to compact with aspect_ratio:2) — we place the
# auto pick among every measured configuration of the same problem on two Pareto fronts:
# (peak memory, worst gradient error in floors) and (time, error). A verdict says whether
# the pick is on each front and, if not, which configuration dominates it. CPU panels are
# measured on this machine; CUDA panels use lce's CUDA layouts run on CPU tensors (their
# errors are the CUDA path's, their memory is lce's model, their times are not GPU times).
# No data from a real GPU is committed yet, and the notebook says so below when it is missing.

# %%
import os

import pandas as pd

from analysis import pareto, plots
from lce.policies import AUTO_FALLBACK, AUTO_TABLE

QUICK = os.environ.get("LCE_QUICK", "1") == "1"  # reads committed data only; nothing to shorten
pd.set_option("display.width", 200)
paths, table = pareto.load_table()
print("data:", [p.name for p in paths], "| devices:", sorted(table.device.unique()))
if "cuda" not in set(table.device):
    print("No real-GPU results are committed: the CUDA rows below are the emulated CUDA layouts.")

# %% [markdown]
# ## The "auto" table and the reason recorded for each entry

# %%
pd.DataFrame([{"device": kind, "dtype": str(dtype).removeprefix("torch."), "policy": pick.acc_policy,
               "chunking": pick.chunking_method, "reason": pick.reason}
              for (kind, dtype), pick in AUTO_TABLE.items()]
             + [{"device": "other", "dtype": "any", "policy": AUTO_FALLBACK.acc_policy,
                 "chunking": AUTO_FALLBACK.chunking_method, "reason": AUTO_FALLBACK.reason}])

# %% [markdown]
# ## Verdicts
# `error` is the worst gradient error in floors; a rival must be no worse on both axes and
# more than 5% better on one to knock the pick off a front.

# %%
verdicts = pareto.verdicts(table)
verdicts[["device", "dtype", "shape", "pick", "listed", "error", "peak_mib", "time_ms", "on_memory_front",
          "memory_dominator", "on_time_front", "time_dominator"]].style.format(
    {"error": "{:.2f}", "peak_mib": "{:.2f}", "time_ms": "{:.1f}"})

# %%
for line in pareto.verdict_lines(table):
    print("-", line)

# %% [markdown]
# ## Fronts on this CPU (error vs measured peak memory)

# %%
print(plots.plot_error_vs_memory(table, "cpu").caption)

# %% [markdown]
# ## CUDA layouts (emulated on CPU tensors; memory from lce's model)

# %%
print(plots.plot_error_vs_memory(table, "cuda-emulated").caption)

# %% [markdown]
# ## Picks for the entries torch's table lacks (fp32), ranked from the data
# Score: mean over shapes of log(cost / best cost) + log(error / best error); lower is better.

# %%
pd.concat([pareto.recommend(table, device, "float32", cost=cost).head(3).assign(device=device, cost=cost)
           for device in ("cpu", "cuda-emulated") for cost in (pareto.MEMORY, pareto.TIME)])
