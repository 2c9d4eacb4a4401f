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

from analysis import pareto, plots
from analysis.inputs import Shape
from analysis.studies import defects, growth

QUICK = os.environ.get("LCE_QUICK", "1") == "1"
pd.set_option("display.width", 200)
paths, table = pareto.load_table()
print("data:", [p.name for p in paths], f"{len(table)} runs;",
      "provenance:", table[["torch_version", "git_revision", "date"]].iloc[0].to_dict())

# %% [markdown]
# ## Errors per dtype and policy (committed quick grid, CPU, default chunking)
# Median over shapes of each output's error in floors. `acc=default` follows the options
# contract: fp32 accumulation only under `acc_policy="auto"`; an explicit policy without
# `acc_dtype` accumulates in the input dtype.

# %%
chunked = table[(table.device == "cpu") & table.op.isin(["lce", "torch"]) & (table.chunking == "aspect_ratio")]
columns = ["loss_fro_in_floors", "grad_input_fro_in_floors", "grad_weight_fro_in_floors", "grad_bias_fro_in_floors"]
summary = chunked.groupby(["dtype", "op", "policy", "acc_dtype"])[columns].median().unstack("op")
summary.style.format("{:.2f}")

# %% [markdown]
# ## Growth with the number of chunks, and a fitted law
# bf16 input, explicit chunk counts, `acc_dtype=float32`. On the CPU layouts lce's
# accurate policy sums the weight gradient in fp32 and rounds once; compact runs the
# balanced layout there (the options contract), so the growth of a per-chunk-rounding policy
# is shown on the CUDA layouts (run on CPU tensors with an exact stand-in for the
# mixed-precision GEMM).

# %%
shape = Shape(512, 64, 2048) if QUICK else Shape(2048, 256, 8192)
counts = (1, 2, 4, 8, 16, 32, 64) if QUICK else (1, 2, 4, 8, 16, 32, 64, 128, 256)
cpu = growth.chunk_growth(shape, "bfloat16", chunk_counts=counts)
cuda = growth.chunk_growth(shape, "bfloat16", chunk_counts=counts, device="cuda-emulated")
fits = pd.concat([growth.fit_power_law(cpu).assign(layouts="cpu"),
                  growth.fit_power_law(cuda).assign(layouts="cuda (emulated)")])
fits.style.format({"exponent": "{:.2f}", "prefactor": "{:.2f}", "at_max_chunks": "{:.2f}"})

# %%
growing = fits[fits.exponent > 0.2]
print("error ∝ chunks^p with p > 0.2 (per-chunk rounding):",
      ", ".join(f"{r.impl} {r.policy} ({r.layouts}) p={r.exponent:.2f}" for r in growing.itertuples()))
flat = fits[(fits.impl == "lce") & (fits.policy == "accurate")]
print("lce accurate stays at", ", ".join(f"{v:.2f}" for v in flat.at_max_chunks), "floors at", counts[-1], "chunks")

# %%
figure = plots.plot_error_vs_chunks(table, "cpu")  # the function `python -m analysis figures` calls
print(figure.caption)

# %% [markdown]
# ## Defect 1 — the loss drifts with the chunk count (bf16, default options)
# Distance of the returned loss from the exact one, in bf16 ulps at the exact loss; lce sums
# the loss in fp64 across chunks and rounds once.

# %%
drift_shape = Shape(1024, 128, 4096) if QUICK else Shape(2048, 256, 8192)
drift_counts = (1, 4, 16, 64) if QUICK else (1, 4, 16, 64, 256)
drift = pd.concat([defects.loss_drift(drift_shape, "bfloat16", drift_counts, seed=seed).assign(seed=seed)
                   for seed in range(3)])
drift.pivot_table(index="chunks", columns="impl", values="ulps_from_exact", aggfunc="max").style.format("{:.2f}")

# %% [markdown]
# ## Defect 2 — an all-ignored batch
# Every target equals `ignore_index`: the reference gives a NaN "mean" loss (0/0) and zero
# gradients; a NaN gradient would poison the optimizer step.

# %%
defects.all_ignored_gradients()
