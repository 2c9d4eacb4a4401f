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
import math

from IPython.display import Markdown

from analysis.core.results_io import FEATURE_COST, FEATURES, load_kind
from analysis.paths import RESULTS_DIR
from analysis.report import nb08_beyond_torch
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
show(nb08_beyond_torch.feature_error_numbers(features), name="feature-error-ranges",
     caption="Seed medians, ranges over families, lce's policies and layouts; lce / plain op: each contender's error "
             "with the feature over its error with the plain op on the same inputs (both gradients)")

# %%
ratios = nb08_beyond_torch.error_ratios(features)
largest, (output, impl, dtype, family, name) = ratios.max(), ratios.idxmax()  # the first in sorted order on a tie
medians = {out: nb08_beyond_torch.seed_medians(features, f"{out}_floors") for out in ("grad_input", "grad_weight")}
impls = medians["grad_weight"].index.get_level_values("impl")
accurate = max(medians[out][impls.str.startswith("lce accurate")].max() for out in medians)
unfused = {out: medians[out][impls == "unfused"] for out in medians}
Markdown(f"""**Conclusion.** Soft-capping and z-loss add no rounding of their own: with a feature, every lce
contender's gradient error is {ratios.min():.2f}–{ratios.max():.2f}× its error with the plain op on the same inputs,
within a quarter of it. The largest ratio, {largest:.2f}×, is {output} of {impl} with {name!r} on {family} inputs in
{dtype}: a cap changes the softmax itself (next section), so with a cap the floors are those of another function.
lce's accurate policy stays at the rounding floor with every feature ({accurate:.2f} floors at most, both
gradients), where the unfused formula in the input dtype is
{unfused["grad_weight"].min():.2f}–{unfused["grad_weight"].max():.1f} floors on the weight gradient and up to
{unfused["grad_input"].max():.0f} on the input gradient. The log-sum-exp lce returns is within
{lce_rows["lse_max_error"].max():.1e} nats of fp64 for every contender and input.

*Inputs:* families {", ".join(sorted(features["family"].unique()))} at
{", ".join(sorted({f"{r.N}×{r.D}×{r.C}" for r in features[["N", "D", "C"]].itertuples()}))} (N×D×C), bf16 and fp16,
{features["seed"].nunique()} seeds (medians); lce per policy on the CPU and the CUDA layouts (emulated on CPU
tensors) with fp32 acc_dtype, and "auto"; errors against the fp64 result of the same formula (`python -m analysis
features`).

*Limits:* the CUDA layouts are emulated (real cuBLAS sums in another order); a z-loss of 1e-4 moves the gradient
little, so its rows say that the term is computed without new rounding, not that a large z-loss would be as
benign.""")

# %% [markdown]
# ## What a cap does to the softmax
# The cap is part of the function: it changes the statistics the error depends on (how peaked a
# row is, how far the target leads). These are fp64 statistics of the inputs, before any rounding.

# %%
figures["softcap_statistics"].figure

# %%
softmax = nb08_beyond_torch.softmax_numbers(features)
show(softmax, {"stat_mean_max_logit": "{:.2f}", "stat_median_target_prob": "{:.2g}", "max_logit_drop": "{:.0%}"},
     name="softcap-statistics", caption="fp64 statistics per feature set and family (seed medians); the fall of the "
                                        "mean largest logit from the plain op's")

# %%
drop = softmax.dropna().groupby("features", sort=False)["max_logit_drop"]
low, high = drop.min(), drop.max()
caps = list(low.index)
Markdown(f"""**Conclusion.** A cap compresses the logits long before they reach it (tanh(1/3) is already
{1 - 3 * math.tanh(1 / 3):.1%} below 1/3), so every cap lowers every family's largest logits: the mean largest logit
falls by {low[caps[0]]:.0%}–{high[caps[0]]:.0%} with {caps[0]!r} and by {low[caps[1]]:.0%}–{high[caps[1]]:.0%} with
{caps[1]!r}, the stronger cap lowering it more on each family. The statistics lce's error depends on (how peaked each
row is, how far the target leads) therefore change with the cap, which is why the errors above are measured against
the fp64 result of the capped formula itself.

*Inputs:* fp64 logits of the rounded inputs of the previous section, families
{", ".join(sorted(softmax["family"].unique()))}, {features["seed"].nunique()} seeds (medians).

*Limits:* the statistics of three families; a model trained with a cap learns logits shaped by it, which a cap
applied to these inputs after the fact does not reproduce.""")

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
costs = nb08_beyond_torch.cost_numbers(cost)
others, plain = costs[costs["features"] != "plain"], costs[costs["features"] == "plain"].iloc[0]
Markdown(f"""**Conclusion.** At {plain.N}×{plain.D}×{plain.C} in {plain["dtype"]} (lce's default options:
{plain.policy}, {plain.num_chunks} chunks) the features took
{others["time_ratio"].min():.2f}–{others["time_ratio"].max():.2f}× the plain op's median time in the same run: each
is slower, but by less than the spread of its own rounds
({others["time_spread_s"].min():.2f}–{others["time_spread_s"].max():.2f} s around medians of
{costs["time_median_s"].min():.2f}–{costs["time_median_s"].max():.2f} s), so the size of the cost is not resolved on
this machine. They added no measurable peak memory ({others["extra_mib"].abs().max():.1f} MiB over the plain op's
{plain.measured_peak_bytes / 2**20:.0f} MiB), and every measured peak is within
{(costs["over_model"] - 1).abs().max():.2%} of lce's model.

*Inputs:* random inputs, no bias, forward + backward, {plain.repeats} alternating rounds after a warm-up in one
process, CPU {plain.cpu_model}, {int(plain.num_threads)} threads (`python -m analysis features --cost-only`).

*Limits:* one CPU and one shape on a shared machine; the tanh and the extra passes over the logits are element-wise
work whose share is larger where the GEMMs are faster (GPU).""")

# %% [markdown]
# ### Limits of this notebook
# - The CUDA layouts ran emulated on CPU tensors; real cuBLAS kernels sum in another order
#   (`python -m analysis gpu-check` measures them where a GPU is lent).
# - Three input families, one shape each; the cap is applied to inputs that were not trained with
#   it, so the logits a capped model would learn are not what these families hold.
# - Timing is one CPU and one shape on a shared machine (ratios within one run only).
#
# ### How to use them
# `lce.linear_cross_entropy(x, W, y, options=..., softcap=30.0, z_loss=1e-4, return_lse=True)`
# returns `(loss, lse)`; the same keywords exist on `lce.LinearCrossEntropyLoss`. The README compares
# the semantics with torch 2.13, Liger-Kernel and Cut Cross-Entropy.
