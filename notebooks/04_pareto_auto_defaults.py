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
# No data from a real GPU is committed yet; the conclusions say so while it is missing.
# Every verdict is per input family (`random`, `calibrated`, `trained`: notebook 05 describes
# them) and holds only if it holds in every one of the 5 seeds.

# %%
import html
import os

import pandas as pd
from IPython.display import Markdown, display

from analysis.core.results_io import BENCH, CHUNK_SWEEP, MEMORY_BREAKDOWN, MEMORY_TRACE, load_kind
from analysis.judge import pareto
from analysis.paths import RESULTS_DIR
from analysis.report import figures, nb04_pareto
from analysis.report.tables import show
from lce.options import dtype_name
from lce.policies import AUTO_FALLBACK, AUTO_TABLE

# %matplotlib inline
QUICK = os.environ.get("LCE_QUICK", "1") == "1"  # reads committed data only; nothing to shorten
paths, table = pareto.load_table()
studies = {kind.name: load_kind(RESULTS_DIR, kind.name)[1] for kind in (MEMORY_BREAKDOWN, MEMORY_TRACE, BENCH,
                                                                         CHUNK_SWEEP)}
figures = {figure.stem: figure for figure in figures.draw_all(table, **studies)}  # draws, measures nothing
print("data:", ", ".join(p.name for p in paths), "| devices:", ", ".join(sorted(table.device.unique())))

# %% [markdown]
# ## The "auto" table, the reason recorded for each entry, and its evidence
# Evidence names the figures `python -m analysis figures` draws into `figures/` (links open
# them); "no data" marks one the committed results cannot draw yet.

# %%
entries = pd.DataFrame(
    [{"device": kind, "dtype": dtype_name(dtype), "pick": pick} for (kind, dtype), pick in AUTO_TABLE.items()]
    + [{"device": "other", "dtype": "any", "pick": AUTO_FALLBACK}])
entries = entries.assign(
    policy=entries.pick.map(lambda pick: pick.acc_policy),
    chunking=entries.pick.map(lambda pick: pick.chunking_method
                              + (f", ≥ {pick.min_rows} rows" if pick.min_rows > 1 else "")),
    reason=entries.pick.map(lambda pick: pick.reason),
    evidence=entries.pick.map(lambda pick: pick.evidence))
links = entries.evidence.map(lambda stems: "<br>".join(
    f'<a href="../figures/{html.escape(stem)}.png">{html.escape(stem)}</a>'
    + ("" if stem in figures else " (no data)") for stem in stems))
show(entries[["device", "dtype", "policy", "chunking", "reason"]].assign(evidence=links),
     wrap=["reason"], raw_html=["evidence"], name="auto-table")

# %%
verdicts = pareto.verdicts(table)
Markdown(nb04_pareto.auto_table(entries, verdicts, figures))

# %% [markdown]
# ## Verdicts
# `error` is the worst gradient error in floors; a rival must be no worse on both axes and
# more than 5% better on one to knock the pick off a front (✗ names the strongest rival).

# %%
show(pareto.verdict_summary(verdicts), {"error (floors)": "{:.2f}", "× unfused": "{:.2f}", "peak MiB": "{:.2f}",
                                        "time ms": "{:.1f}"},
     wrap=["memory front", "time front"], wrap_width="32ch", name="verdicts")

# %%
Markdown(nb04_pareto.verdicts_conclusion(verdicts, table))

# %% [markdown]
# ## Fronts on this CPU (error vs measured peak memory)

# %%
figure = figures["error_vs_memory_cpu"]
display(figure.figure, Markdown(figure.markdown))

# %%
Markdown(nb04_pareto.fronts(table, "cpu"))

# %% [markdown]
# ## CUDA layouts (emulated on CPU tensors; memory from lce's model)

# %%
figure = figures["error_vs_memory_cuda-emulated"]
display(figure.figure, Markdown(figure.markdown))

# %%
Markdown(nb04_pareto.fronts(table, "cuda-emulated"))

# %% [markdown]
# ## What should fp32 use? (the entries torch's table lacks, ranked from the data)
# Score: mean over shapes of log(cost / best cost) + log(error / best error); lower is better.
# Configurations that compute the same numbers are one choice (listed under "same numbers as").

# %%
show(pareto.choices_summary(table, "float32"), {"score": "{:.2f}", "worst gradient (floors)": "{:.2f}",
                                               "× unfused": "{:.2f}"},
     wrap=["same numbers as"], wrap_width="36ch", name="fp32-choices")

# %%
Markdown(nb04_pareto.fp32_choice(table))
