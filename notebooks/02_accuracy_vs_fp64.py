# %% [markdown]
# # 02 · Accuracy against fp64: what does each precision policy buy, in rounding floors?
#
# Every error here is measured against fp64 computed from the *same rounded inputs* the
# low-precision run sees, and reported as a multiple of its rounding floor: the error of the
# exact answer merely rounded to the output dtype, the best any implementation can return
# (1.0). We read the committed quick grid for errors per dtype and policy, then measure on
# the spot how the weight-gradient error grows with the number of chunks (with a fitted power
# law), lce next to torch 2.13's native op with the same options, and finally two defects of
# torch's op shown with numbers: the bf16 loss drifting with the chunk count, and NaN
# gradients on an all-ignored batch.

# %%
import os

import pandas as pd
from IPython.display import Markdown, display

from analysis.core.problem import Shape
from analysis.core.provenance import cpu_model
from analysis.judge import pareto
from analysis.report import nb02_accuracy
from analysis.report.tables import show
from analysis.studies import defects, growth

# %matplotlib inline
QUICK = os.environ.get("LCE_QUICK", "1") == "1"
CPU = cpu_model()  # the studies below measure on this machine; the grid's rows carry their own provenance
paths, table = pareto.load_table()
print("data:", ", ".join(p.name for p in paths), f"({len(table)} runs)")

# %% [markdown]
# ## Errors per family, dtype and policy (committed grids, CPU, default chunking)
# Median over shapes and seeds of the loss error and of the worst gradient error, in floors, per
# input family (notebook 05 describes the families).
# `acc_dtype=default` follows the options contract: fp32 accumulation only under
# `acc_policy="auto"`; an explicit policy without `acc_dtype` accumulates in the input dtype.

# %%
runs = table[(table.device == "cpu") & table.op.isin(["lce", "torch"]) & (table.chunking == "auto")]
medians = runs.groupby(["family", "dtype", "policy", "acc_dtype", "op"])[["loss_fro_in_floors", pareto.ERROR]].median()
medians = medians.unstack("op").sort_index(axis="columns", level="op")
medians.columns = [f"{op}: {'loss' if column == 'loss_fro_in_floors' else 'worst gradient'}"
                   for column, op in medians.columns]
show(medians.reset_index(), {column: "{:.2f}" for column in medians.columns}, name="errors-per-policy")

# %%
Markdown(nb02_accuracy.policy_errors(table))

# %% [markdown]
# ## Growth with the number of chunks, and a fitted law
# bf16 input, explicit chunk counts, `acc_dtype=float32`. On the CPU layouts lce's
# accurate policy sums the weight gradient in fp32 and rounds once; compact runs the
# balanced layout there (the options contract), so the growth of a per-chunk-rounding policy
# is shown on the CUDA layouts (run on CPU tensors with an exact stand-in for the
# mixed-precision GEMM). The fit is `error ≈ prefactor × chunks^exponent`.

# %%
shape = Shape(512, 64, 2048) if QUICK else Shape(2048, 256, 8192)
counts = (1, 2, 4, 8, 16, 32, 64) if QUICK else (1, 2, 4, 8, 16, 32, 64, 128, 256)
growth_runs = pd.concat([growth.chunk_growth(shape, "bfloat16", chunk_counts=counts, device=device)
                         for device in ("cpu", "cuda-emulated")], ignore_index=True)
layouts = {"cpu": "CPU", "cuda-emulated": "emulated CUDA"}
fits = pd.concat([growth.fit_power_law(rows).assign(layouts=layouts[device])
                  for device, rows in growth_runs.groupby("device", sort=True)], ignore_index=True)
show(fits[["layouts", "impl", "policy", "exponent", "prefactor", "at_max_chunks"]]
     .rename(columns={"at_max_chunks": f"floors at {counts[-1]} chunks"}),
     {"exponent": "{:.2f}", "prefactor": "{:.2f}", f"floors at {counts[-1]} chunks": "{:.2f}"}, name="growth-fits")

# %%
figure = nb02_accuracy.plot_error_vs_chunks(table, "cpu")  # the function `python -m analysis figures` calls
display(figure.figure, Markdown(figure.markdown))

# %%
Markdown(nb02_accuracy.chunk_growth(growth_runs, fits, cpu=CPU))

# %% [markdown]
# ## Defect 1 — the loss drifts with the chunk count (bf16, default options)
# Distance of the returned loss from the exact one, in bf16 ulps at the exact loss, the worst
# over three seeds; lce sums the loss in fp64 across chunks and rounds once.

# %%
drift_shape = Shape(1024, 128, 4096) if QUICK else Shape(2048, 256, 8192)
drift_counts = (1, 4, 16, 64) if QUICK else (1, 4, 16, 64, 256)
drift = pd.concat([defects.loss_drift(drift_shape, "bfloat16", drift_counts, seed=seed) for seed in range(3)],
                  ignore_index=True)
worst_drift = drift.pivot_table(index="chunks", columns="impl", values="ulps_from_exact", aggfunc="max")
show(worst_drift.reset_index().rename(columns={"lce": "lce (ulps)", "torch": "torch (ulps)"}),
     {"lce (ulps)": "{:.2f}", "torch (ulps)": "{:.2f}"}, name="loss-drift")

# %%
Markdown(nb02_accuracy.loss_drift(drift, cpu=CPU))

# %% [markdown]
# ## Defect 2 — an all-ignored batch
# Every target equals `ignore_index`: the reference gives a NaN "mean" loss (0/0) and zero
# gradients; a NaN gradient would poison the optimizer step.

# %%
ignored = defects.all_ignored_gradients()
shown = ignored.assign(loss=ignored.loss.map(lambda value: f"{value:.3g}".replace("nan", "NaN (0/0)")))
show(shown[["impl", "loss", "grad_input_nan_entries", "grad_weight_nan_entries", "grad_bias_nan_entries",
            "max_abs_finite_grad"]]
     .rename(columns={"grad_input_nan_entries": "NaN in grad_input", "grad_weight_nan_entries": "NaN in grad_weight",
                      "grad_bias_nan_entries": "NaN in grad_bias", "max_abs_finite_grad": "largest finite |grad|"}),
     {"largest finite |grad|": "{:.3g}"}, name="all-ignored")

# %%
Markdown(nb02_accuracy.all_ignored(ignored, cpu=CPU))
