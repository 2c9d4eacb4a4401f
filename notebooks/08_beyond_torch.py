# %% [markdown]
# # 08 · Soft-capping, z-loss, the per-row log-sum-exp: what do they cost in accuracy, time and memory?
#
# Models trained today ask more of the head than plain cross-entropy: Gemma 2 caps its logits
# (`cap * tanh(z / cap)`), PaLM-style training adds a z-loss (`z_loss * lse**2`) that keeps the
# log-partition near zero, and training loops log each token's log-sum-exp. torch 2.13's chunked op
# has none of them, so their users would materialize the full logits. lce computes all three on
# the chunked path, for every policy: the cap's tanh is kept in the logits buffer and its derivative
# applied a workspace of columns at a time (no second chunk of logits), the z-loss adds one
# coefficient to each row's softmax in dz, and the log-sum-exp is a by-product of the softmax
# statistics. This notebook measures, against fp64, whether they cost accuracy next to the plain
# op, what a cap does to the softmax, and their time and memory at the bench shape.

# %%
from IPython.display import Markdown

from analysis.core.results_io import FEATURE_COST, FEATURES, load_kind
from analysis.paths import RESULTS_DIR
from analysis.report import nb08_beyond_torch
from analysis.report import nb08_beyond_torch as feature_conclusions
from analysis.report.tables import show

# %matplotlib inline
(feature_paths, features), (cost_paths, cost) = (load_kind(RESULTS_DIR, kind.name) for kind in (FEATURES, FEATURE_COST))
drawn = nb08_beyond_torch.draw_feature_figures(features)  # draws, measures nothing
figures = {figure.stem: figure for figure in drawn}
print("data:", ", ".join(path.name for path in [*feature_paths, *cost_paths]))

# %% [markdown]
# ## Errors with each feature, next to the plain op
# Each feature set runs on the same rounded inputs as the plain op; errors are in rounding floors of
# the exact (fp64) result of the *same* formula, so a feature that added rounding of its own would
# show as a ratio above 1 against the plain op.

# %%
figures["feature_errors"].figure

# %%
lce_rows = features[features["op"] == "lce"]
table = (lce_rows.groupby(["dtype", "features", "impl"], sort=False)[["grad_input_floors", "grad_weight_floors",
                                                                        "loss_ulps", "lse_max_error"]]
         .median().reset_index())
show(table, {"grad_input_floors": "{:.2f}", "grad_weight_floors": "{:.2f}", "loss_ulps": "{:.2f}",
             "lse_max_error": "{:.2g}"}, name="feature-errors", caption="Seed and family medians (lce contenders)")

# %%
Markdown(feature_conclusions.errors(features))

# %% [markdown]
# ## What a cap does to the softmax
# The cap is part of the function: it changes the statistics the error depends on (how peaked a
# row is, how far the target leads). These are fp64 statistics of the inputs, before any rounding.

# %%
figures["softcap_statistics"].figure

# %%
Markdown(feature_conclusions.softmax_statistics(features))

# %% [markdown]
# ## Time and memory at the bench shape
# lce's default options with each feature set, forward + backward, timed in alternating rounds in
# one process; the peak is measured by the allocator and compared with lce's memory model (which
# lists the cap's workspace). Whether the features *off* cost anything is the baseline bench
# (README, "Speed and memory"): lce now against the revision before the features, fresh processes.

# %%
show(cost[["features", "policy", "num_chunks", "time_median_s", "time_spread_s", "time_ratio",
           "predicted_peak_bytes", "measured_peak_bytes"]],
     {"time_median_s": "{:.2f}", "time_spread_s": "{:.2f}", "time_ratio": "{:.2f}",
      "predicted_peak_bytes": lambda v: f"{v / 2**20:.1f} MiB",
      "measured_peak_bytes": lambda v: f"{v / 2**20:.1f} MiB"},
     name="feature-cost")

# %%
Markdown(feature_conclusions.cost(cost))

# %% [markdown]
# ### Limits of this notebook
# - The CUDA layouts ran emulated on CPU tensors; real cuBLAS kernels sum in another order
#   (`python -m analysis gpu-check` measures them where a GPU is lent).
# - Three input families and one shape each; the cap is applied to inputs that were not trained with
#   it, so the logits a capped model would learn are not what these families hold.
# - Timing is one CPU and one shape on a shared machine (ratios within one run only).
#
# ### How to use them
# `lce.linear_cross_entropy(x, W, y, options=..., softcap=30.0, z_loss=1e-4, return_lse=True)`
# returns `(loss, lse)`; the same keywords exist on `lce.LinearCrossEntropyLoss`. The README compares
# the semantics with torch 2.13, Liger-Kernel and Cut Cross-Entropy.
