# %% [markdown]
# # 07 · Which options suit my model's shape, dtype and memory budget? An error model, `lce.recommend`, budgets
#
# Notebooks 04–06 judged fixed option sets at shapes this machine can run. A user with a
# 128k-vocabulary head and a memory budget needs an answer for *their* shape before training:
# which policy, how many rows per chunk, and — when the budget is below one chunk of logits —
# how many classes per block. `lce.recommend` answers from three models: lce's memory model
# (checked against the allocator since notebook 03), a rounding-error model fitted here on the
# committed measurements and validated on inputs and shapes it never saw, and a roofline time
# estimate that only ranks candidates. Every number at an LLM head is a **prediction**; the
# measured checks run on this machine's CPU (bf16, calibrated inputs, the worst family of
# notebook 05).

# %%
import pandas as pd
import torch
from IPython.display import Markdown

import lce
from analysis.core.results_io import BUDGETS, CLASS_TILING, load_kind
from analysis.paths import RESULTS_DIR
from analysis.report import (
    nb07_choosing_options,
)
from analysis.report import (
    nb07_choosing_options as choice_conclusions,
)
from analysis.report import (
    nb07_choosing_options as recommendations,
)
from analysis.report.tables import show
from analysis.studies import error_model as error_model_fit

# %matplotlib inline
validation = pd.read_csv(RESULTS_DIR / error_model_fit.VALIDATION_FILE)
predictions = error_model_fit.llm_predictions()
(budget_paths, budgets), (tiling_paths, tiling) = (load_kind(RESULTS_DIR, kind.name)
                                                   for kind in (BUDGETS, CLASS_TILING))
drawn = [*nb07_choosing_options.draw_error_model_figures(validation, predictions),
         *nb07_choosing_options.draw_budget_figures(budgets, tiling)]  # draws, measures nothing
figures = {figure.stem: figure for figure in drawn}
print("data:", ", ".join(p.name for p in [*budget_paths, *tiling_paths]), "+", error_model_fit.VALIDATION_FILE)

# %% [markdown]
# ## The error model, and how well it predicts what it never saw
# `lce.error_model` adds independent roundings in squared floors: `floors² = 1 + Σ c_s f_s`,
# one term per rounding the plan's layout performs — dz rounded before a backward GEMM,
# logits rounded to the input dtype, each chunk's product rounded before an fp32 sum, the
# running weight-gradient sum rounded per chunk (a random walk while increments are large,
# stagnation once they fall below half an ulp), and fp32 GEMM summation length. The `f_s`
# depend on the plan (chunk count, N, D, C, dtypes) and on a few input statistics measured on
# a sample (`lce.error_model.measure_input_stats`); the constants `c_s` are fitted on random
# and trained inputs at N ≤ 1024. Calibrated inputs and larger shapes are held out.

# %%
figures["error_model_validation"].figure

# %%
Markdown(choice_conclusions.error_model(validation))

# %% [markdown]
# ## Predictions at LLM heads
# The three heads of notebook 06's memory table, bf16, CUDA layouts with fp32 `acc_dtype`, the
# default (worst committed) input statistics. These are **extrapolations**: the largest measured
# shape has N = 2048 and C = 65536.

# %%
figures["error_model_llm"].figure

# %%
bf16_cuda = predictions[(predictions["dtype"] == "bfloat16") & (predictions["kind"] == "cuda")]
table = bf16_cuda.pivot_table(index=["shape", "policy"], columns="chunking", values="grad_weight",
                              aggfunc="first")
show(table.reset_index(), {c: "{:.2f}" for c in table.columns}, name="llm-predicted-floors",
     caption="Predicted grad_weight floors (extrapolation)")

# %%
Markdown(choice_conclusions.llm_predictions(predictions))

# %% [markdown]
# ## `lce.recommend` at an LLM head
# With no budget it allows what lce's "auto" options would use, and the largest error the
# error/noise rule of notebook 06 tolerated (2 floors in bf16, 10 in fp16; measured at N = 1024);
# it returns the fastest candidate that meets both, and explains what it weighed.

# %%
choice = lce.recommend(16384, 4096, 128256, torch.bfloat16, "cuda")
print(choice.explain())

# %%
picks = recommendations.llm_recommendations()
show(picks, {"budget_gib": "{:.2f}", "peak_gib": "{:.2f}",
                                             "grad_input_floors": "{:.2f}", "grad_weight_floors": "{:.2f}",
                                             "estimated_s": "{:.3g}"},
     name="llm-recommendations", wrap=["choice"], caption="lce.recommend at LLM heads (predictions)")

# %% [markdown]
# Below about 1.2× the gradients' own bytes the CUDA layouts still find options within the
# default limit by tiling the vocabulary with large row chunks (few per-chunk roundings); the
# CPU cannot: its accumulator-free layout (compact with `acc_dtype` equal to the input) also
# rounds the logits to bf16, which costs the input gradient about 6 floors.

# %%
Markdown(choice_conclusions.recommendations(picks))

# %% [markdown]
# ## Measured: the recommended options under budgets, on this machine
# Three shapes, budgets from auto's own peak down to 1.05× the gradients; for each, a fresh
# process builds the inputs and the fp64 reference and measures one forward + backward of the
# recommended options.

# %%
figures["recommend_budgets"].figure

# %%
show(budgets[["N", "D", "C", "budget", "policy", "batch_chunk_size", "class_chunk_size", "budget_bytes",
              "predicted_peak_bytes", "measured_peak_bytes", "predicted_grad_weight_floors", "grad_weight_floors",
              "predicted_grad_input_floors", "grad_input_floors", "default_limit_met", "time_median_s"]],
     {"budget_bytes": lambda v: f"{v / 2**20:.1f} MiB", "predicted_peak_bytes": lambda v: f"{v / 2**20:.1f} MiB",
      "measured_peak_bytes": lambda v: f"{v / 2**20:.1f} MiB"}, name="budgets-measured")

# %%
Markdown(choice_conclusions.budgets(budgets))

# %% [markdown]
# ## What class tiling costs
# Tiling computes every block's logits twice (once for the log-sum-exp, once for the
# gradients), and small blocks make small GEMMs.

# %%
figures["class_tiling_cost"].figure

# %%
Markdown(choice_conclusions.class_tiling(tiling))

# %% [markdown]
# ## No (C, D) temporaries
# Before this notebook's change, the layouts that sum the weight gradient in a buffer of another
# dtype formed each chunk's full `(C, D)` product first: on CUDA, balanced then allocated as much
# as accurate. The product is now formed a block of classes at a time, so each layout's peak is
# its accumulator plus chunk-sized buffers.

# %%
x = torch.empty(256, 32, dtype=torch.bfloat16, device="meta", requires_grad=True)
w = torch.empty(1000, 32, dtype=torch.bfloat16, device="meta", requires_grad=True)
peaks = []
for kind in ("cpu", "cuda"):
    with lce.testing.emulate_device_kind(kind):
        for policy in ("accurate", "balanced", "compact"):
            options = lce.LinearCrossEntropyOptions(acc_policy=policy, acc_dtype=torch.float32)
            peaks.append(dict(layouts=kind, policy=policy, peak_kib=lce.plan(options, x, w).peak_extra_bytes / 1024))
show(pd.DataFrame(peaks), {"peak_kib": "{:.1f}"}, name="no-cd-temporaries",
     caption="Predicted peak extra memory at N=256, D=32, C=1000, bf16, fp32 acc_dtype, auto chunking")

# %%
Markdown(choice_conclusions.temporaries(pd.DataFrame(peaks)))

# %% [markdown]
# ### Limits of this notebook
# - The error model is fitted on CPU-emulated and H200 measurements at N ≤ 2048, C ≤ 65536;
#   at LLM heads it extrapolates. Held out, about a quarter of its predictions miss by more
#   than 25% (worst: fp16 with fp16 acc_dtype, grad_input; compact on random inputs, whose error
#   levels off sooner than the model says).
# - The default error limits translate notebook 06's error/noise rule into floors at N = 1024;
#   larger batches shrink the sampling noise, so at LLM batch sizes the limits are optimistic.
# - The time model only ranks candidates (orders of magnitude per device and dtype); it is not
#   validated here. `recommend(..., measure=True)` times the three fastest-estimated
#   candidates on the actual device.
# - Memory and errors under budgets were measured on this machine's CPU only, on one input
#   family and one seed per budget; the CUDA recommendations rest on the memory model (checked
#   against CPU-emulated allocations, not a GPU allocator) and the error model.
# - `lce.recommend` plans "mean" reduction with input and weight gradients, no bias; other
#   calls move the peak slightly (`lce.plan` shows the exact plan).

# %% [markdown]
# ### How to choose options for your model
# 1. `lce.recommend(N, D, C, dtype, device)` for the shape of one step; add `memory_budget=`
#    (bytes) if the head must fit next to the rest of the model, `max_error=` (floors) to be
#    stricter than the default.
# 2. `print(choice.explain())` says what was chosen, what each policy's best alternative was
#    and why it lost; `print(lce.plan(choice.options, x, W))` lists every buffer.
# 3. Pass `choice.options` to `lce.linear_cross_entropy` or `lce.LinearCrossEntropyLoss`.
#    `class_chunk_size` is lce's own field: torch's op cannot take those options.
