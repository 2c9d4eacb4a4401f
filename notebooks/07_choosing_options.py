# %% [markdown]
# # 07 · Which options suit my model's shape, dtype and memory budget? An error model, `lce.recommend`, budgets
#
# Notebooks 04–06 judged fixed option sets at shapes this machine can run. A user with a
# 128k-vocabulary head and a memory budget needs an answer for *their* shape before training:
# which policy, how many rows per chunk, and — when the budget is below one chunk of logits —
# how many classes per block. `lce.recommend` answers from three models: lce's memory model
# (checked against the allocator since notebook 03), a rounding-error model fitted here on the
# committed measurements and validated on inputs and shapes it never saw, and a time model
# fitted to the committed timed runs (held out by shape, it predicts a majority of runs within
# 30%: it ranks candidates). Every number at an LLM head is a **prediction**; the
# measured checks run on this machine's CPU (bf16, calibrated inputs, the worst family of
# notebook 05).

# %%
import pandas as pd
import torch
from IPython.display import Markdown

import lce
from analysis.core.results_io import BUDGETS, CLASS_TILING, load_kind
from analysis.paths import RESULTS_DIR
from analysis.report import nb07_choosing_options
from analysis.report.tables import show
from analysis.studies import error_model as error_model_fit
from lce.decide.recommendation import DEFAULT_MAX_ERROR

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
# ## The answer first: the decision table
# One procedure, `lce.decide`, gives every answer: what `"auto"` resolves to (derived at the reference
# heads below; a test fails if `lce/planning/policies.py` says otherwise), what `lce.recommend` picks, and this
# table. It plans each candidate, predicts its peak memory, errors and time, drops the candidates that
# fail a condition (the error limit; the training evidence of notebook 10 for a weight gradient summed in
# the input dtype; for a default, no less accurate than torch's own), and takes the least memory within a
# time factor of the fastest. The rest of this notebook checks the models it rests on.

# %%
from analysis.report import decision_table  # noqa: E402
from lce import decide  # noqa: E402

table = decision_table.decision_table(RESULTS_DIR)
show(table[["device", "dtype", "head", "auto", "rows", "peak_gib", "saves_gib", "grad_input_floors",
            "grad_weight_floors", "torch_grad_weight_floors", "bias_over_noise", "recommend", "recommend_peak_gib"]],
     {"peak_gib": "{:.2f}", "saves_gib": "{:+.2f}", "grad_input_floors": "{:.2f}", "grad_weight_floors": "{:.2f}",
      "torch_grad_weight_floors": "{:.2f}", "bias_over_noise": "{:.2g}", "recommend_peak_gib": "{:.2f}"},
     name="decision-table", wrap=["recommend"],
     caption="Per device, dtype and reference head: auto's options, predicted peak (GiB) and what it saves against "
             "torch 2.13's default (negative: more), predicted floors (lce, and torch's weight gradient), the "
             "measured bias/noise of the auto entry, and recommend's pick without a budget")

# %%
cuda = table[table["device"] == "cuda"]
llm = cuda[cuda["head_name"] != "small"]
floor, recovered = cuda["min_rows"].min(), llm["peak_gib"] - llm["recommend_peak_gib"]
Markdown(f"""**Conclusion.** On CUDA auto is `balanced` with the factor-1 aspect ratio and at least {floor} rows per
chunk: predicted {cuda["grad_weight_floors"].max():.2f} floors on the weight gradient at most, where torch's default
sits at {cuda["torch_grad_weight_floors"].min():.1f}-{cuda["torch_grad_weight_floors"].max():.1f}, for
{-cuda["saves_gib"].max():.2f}-{-cuda["saves_gib"].min():.2f} GiB more than torch's default: its fp32 copy of the
weight gradient ({cuda["accumulator_gib"].min():.2f}-{cuda["accumulator_gib"].max():.2f} GiB) and its chunks of at
least {floor} rows, whose fp32 logits take up to {cuda["logits_chunk_gib"].max():.2f} GiB (each step costs a GPU a
fixed time, `lce.decide.time_model`). `lce.recommend` without a budget finds
{recovered.min():.2f}-{recovered.max():.2f} GiB of that back at the LLM heads with compact in few,
large row chunks, within the error limit and at chunk counts the training study passed; auto cannot express those
(one rule for every shape, `decide.AUTO_CHUNKINGS`). On CPU auto is torch's own policy.

*Inputs:* lce's models at the reference heads {", ".join(str(h) for h in decide.REFERENCE_HEADS)}; CPU rows for a
CPU with native bf16 GEMMs; the measured bias/noise from the noise study (N=1024, D=128, C=16384).

*Limits:* predictions; CUDA times from lce's time model, fitted to an H200's runs of earlier plans (no GPU has run
auto's {floor}-row plan yet); the worst rows' error is not modeled (notebook 05 measures
it; the training condition guards the rare classes).""")

# %% [markdown]
# ## The error model, and how well it predicts what it never saw
# `lce.decide.error_model` adds independent roundings in squared floors: `floors² = 1 + Σ c_s f_s`,
# one term per rounding the plan's layout performs — dz rounded before a backward GEMM,
# logits rounded to the input dtype, each chunk's product rounded before an fp32 sum, the
# running weight-gradient sum rounded per chunk (a random walk while increments are large,
# stagnation once they fall below half an ulp), and fp32 GEMM summation length. The `f_s`
# depend on the plan (chunk count, N, D, C, dtypes) and on a few input statistics measured on
# a sample (`lce.decide.error_model.measure_input_stats`); the constants `c_s` are fitted on random
# and trained inputs at the smaller shapes. Calibrated inputs and larger shapes are held out.

# %%
figures["error_model_validation"].figure

# %%
shares, worst = nb07_choosing_options.validation_numbers(validation)
show(shares.reset_index(), {"within": "{:.0%}", "rank": "{:.3f}"}, name="error-model-shares",
     caption=f"Points within ±{error_model_fit.SHARE_BAND:.0%} of the measured floors; rank: Spearman correlation "
             "of predicted and measured floors")

# %%
show(worst, {"predicted": "{:.2f}", "measured": "{:.2f}", "relative_miss": "{:+.0%}"}, name="error-model-worst",
     caption="The worst held-out misses, once per problem (points: the problem's layouts and chunk counts)")

# %%
held, fitted, top = shares.loc["held out"], shares.loc["fit"], worst.iloc[0]
held_rows, fit_rows = validation[validation["split"] != "fit"], validation[validation["split"] == "fit"]
Markdown(f"""**Conclusion.** The error model is good enough to choose between options, not to certify one: it
orders the {held.points:.0f} held-out points almost as well as the {fitted.points:.0f} it was fitted on (rank
correlation {held["rank"]:.3f} against {fitted["rank"]:.3f}), but only {held.within:.0%} of the held-out
predictions fall within ±{error_model_fit.SHARE_BAND:.0%} of the measured floors ({fitted.within:.0%} of the fitted
ones). Where it misses most it errs on the safe side: each of the {len(worst)} worst held-out problems is an fp16
input gradient with fp16 `acc_dtype`, and each is over-predicted, the worst {top.predicted:.2f} floors against
{top.measured:.2f} measured ({top.N}×{top.D}×{top.C}, {top.family} inputs, {top.policy},
{top.relative_miss:+.0%}).

*Inputs:* the committed grids' seed medians ({", ".join(sorted(validation["source"].unique()))}) on the
{", ".join(sorted(validation["device"].unique()))} layouts (cuda: a GPU; cuda-emulated: CUDA layouts on CPU
tensors); fitted on {", ".join(sorted(fit_rows["family"].unique()))} inputs at N ≤ {fit_rows["N"].max()}; held out:
{", ".join(sorted(held_rows.loc[held_rows["split"] == "held-out family", "family"].unique()))} inputs at every
shape, and the larger shapes of every family (N up to {held_rows["N"].max()}, C up to {held_rows["C"].max()}).
A miss is predicted / measured − 1; points of one problem that tie (its layouts and chunk counts) are listed once,
so the list is the same on every machine.

*Limits:* the input statistics the model uses are those of the committed families; an input far from them (e.g.
much more confident rows) is outside what was validated.""")

# %% [markdown]
# ### Two details of the weight gradient: its bias and its worst row
# The rule judges a bias (the error along the exact gradient, which steps do not average away) and the rare
# classes' rows, which the Frobenius norm hides. `lce.decide.error_model.predict_weight_details` predicts both from the
# same
# terms, fitted and held out on the same split: the bias as an upper bound (its share along the gradient depends on
# the inputs more than on the layout), the worst class row in that row's own floors.

# %%
details = nb07_choosing_options.detail_validation(RESULTS_DIR)
show(details, {"covered": "{:.0%}", "within": "{:.0%}", "within_2x": "{:.0%}", "median_ratio": "{:.2f}"},
     name="error-model-details",
     caption="Held-out and fitted hit rates of the weight gradient's details (covered: prediction at or above the "
             "measurement; median_ratio: predicted / measured)")

# %%
by = details.set_index(["detail", "split"])
bias, worst_row = by.loc[("weight_bias", "held out")], by.loc[("worst_row", "held out")]
Markdown(f"""**Conclusion.** The bias bound holds: it sits at or above the measured bias for {bias.covered:.0%} of
the {bias.points:.0f} held-out points, a median {bias.median_ratio:.1f}x above it, so it can clear a candidate but
not measure one. The worst-row model is a low estimate: held out, {worst_row.within:.0%} of its predictions fall
within ±{error_model_fit.SHARE_BAND:.0%} and {worst_row.within_2x:.0%} within 2x, but the median measurement is
{1 / worst_row.median_ratio:.1f}x the prediction (it was fitted at N = 32, where a class row sums few tokens).
Neither is a condition of `lce.decide`: the rule's bias condition is judged against one batch's sampling noise,
which no model here predicts at LLM batch sizes, and the rare rows' effect on training is what the training
condition measures (notebook 10). They are reported beside each pick (the decision table, `explain()`).

*Inputs:* as above; the worst row comes from the grids only (the noise study records no per-row errors), and bias
points below {error_model_fit.DETAIL_MIN:g} floors are left out (sign noise).""")

# %% [markdown]
# ## Predictions at LLM heads
# The three heads of notebook 06's memory table, bf16, CUDA layouts with fp32 `acc_dtype`, the
# default (worst committed) input statistics. These are **extrapolations**, far beyond the
# measured shapes.

# %%
figures["error_model_llm"].figure

# %%
bf16_cuda = predictions[(predictions["dtype"] == "bfloat16") & (predictions["kind"] == "cuda")]
table = bf16_cuda.pivot_table(index=["shape", "policy"], columns="chunking", values="grad_weight",
                              aggfunc="first")
show(table.reset_index(), {c: "{:.2f}" for c in table.columns}, name="llm-predicted-floors",
     caption="Predicted grad_weight floors (extrapolation)")

# %%
llm = nb07_choosing_options.prediction_numbers(predictions)
compact, wide = llm[llm["policy"] == "compact"], llm[llm["policy"] != "compact"]
Markdown(f"""**Conclusion.** Predicted, not measured: compact's weight-gradient error grows with every step in the
chunk count at each head, from {compact["one_chunk"].max():.2f} floors with one chunk to
{compact["at_most"].min():.0f}–{compact["at_most"].max():.0f} at {compact["most_chunks"].max()} chunks; with the
CUDA "auto" chunking ({llm["chunks"].min()}–{llm["chunks"].max()} chunks at these heads) it is
{compact["auto"].min():.1f}–{compact["auto"].max():.1f} floors. balanced and accurate, which sum the weight gradient
across chunks in fp32, stay flat: at each head their prediction varies by a factor of at most
{wide["spread"].max():.3f} over every chunking, and is at most {wide["auto"].max():.2f} floors with auto chunking.

*Inputs:* lce's error model (`lce.decide.error_model`), bfloat16, CUDA layouts with fp32 acc_dtype, the conservative
default input statistics, heads {", ".join(llm["shape"].unique())} (N×D×C); chunkings
{", ".join(predictions["chunking"].unique())}.

*Limits:* an extrapolation: the largest validated shapes have N = {validation["N"].max()} and C =
{validation["C"].max()}; the chunk-walk and stagnation terms that grow here were fitted where they are small.""")

# %% [markdown]
# ## `lce.recommend` at an LLM head
# With no budget it applies the procedure's objective alone: among the candidates within the largest
# error the error/noise rule of notebook 06 tolerated (`lce.decide.DEFAULT_MAX_ERROR`, in floors) and
# the training condition, the least memory within a time factor of the fastest; with a budget, the same
# among those that fit. It explains what it weighed, and names auto's plan beside its pick.

# %%
choice = lce.recommend(16384, 4096, 128256, torch.bfloat16, "cuda")
print(choice.explain())

# %%
picks = nb07_choosing_options.llm_recommendations()
show(picks, {"budget_gib": "{:.2f}", "peak_gib": "{:.2f}",
                                             "grad_input_floors": "{:.2f}", "grad_weight_floors": "{:.2f}",
                                             "estimated_s": "{:.3g}"},
     name="llm-recommendations", wrap=["choice"], caption="lce.recommend at LLM heads (predictions)")

# %%
per_budget = nb07_choosing_options.recommend_numbers(picks)
show(per_budget, {"peak_over_budget": "{:.3f}", "grad_input": "{:.2f}", "grad_weight": "{:.2f}"},
     name="recommend-per-budget", caption="Per device and budget, over the heads: how many meet the default limit "
                                          "and tile the vocabulary; the largest predicted peak / budget and errors")

# %%
_, middle, tightest = nb07_choosing_options.LLM_BUDGET_MULTIPLES
by_budget = per_budget.set_index(["device", "budget"])
cuda_mid, cpu_mid = (by_budget.loc[(device, f"{middle:g}x gradients")] for device in ("cuda", "cpu"))
anchor = nb07_choosing_options.cce_anchor()
Markdown(f"""**Conclusion.** With no budget recommend meets the default error limit
({DEFAULT_MAX_ERROR[torch.bfloat16]:g} floors in bf16) at all {len(picks["shape"].unique())} heads on both layout
tables, never tiles, and never needs more than lce auto's own peak. With {middle:g}× the gradients' bytes the
CUDA layouts still meet it at {cuda_mid["limit_met"]} of the {cuda_mid["heads"]} heads, by tiling the vocabulary
with large row chunks (few per-chunk roundings). Below auto's peak the CPU layouts meet it only where one chunk
of all the rows fits ({cpu_mid["limit_met"]} of the {cpu_mid["heads"]} heads at {middle:g}×, none at the tightest
budget): `accurate` with one chunk needs no weight-gradient accumulator (its fp32 product is rounded straight into
the gradient), the classes in blocks; elsewhere their accumulator-free layout (compact with `acc_dtype` equal to the
input) also rounds the logits to bf16, which costs the input gradient up to {cpu_mid["grad_input"]:.2f} floors. At the
tightest budget, {tightest:g}× the gradients, every pick tiles the vocabulary, and every predicted peak is within its
budget. At Cut Cross-Entropy's benchmark shape
({nb07_choosing_options.CCE_SHAPE}) the smallest peak within the default limit is {anchor["within_limit_mib"]:,.1f}
MiB, {anchor["within_limit_mib"] / anchor["gradients_mib"] - 1:.1%} above the {anchor["gradients_mib"]:,.0f} MiB the
gradients alone take (CCE reports {nb07_choosing_options.CCE_REPORTED_MB} MB).

*Inputs:* lce's memory model and error model at the heads above, bf16, "mean" reduction, no bias (`lce.recommend`,
nothing measured).

*Limits:* predictions only; the time that breaks ties between feasible candidates is lce's time model, fitted to
other runs than these (`lce.decide.time_model.FIT`), not a measurement.""")

# %% [markdown]
# ## Measured: the recommended options under budgets, on this machine
# Budgets from auto's own peak down to just above the gradients' own bytes; for each, a fresh
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
ratios = nb07_choosing_options.budget_ratios(budgets)
miss = ratios[["grad_input_miss", "grad_weight_miss"]].abs()
Markdown(f"""**Conclusion.** Every recommended option set stayed within {nb07_choosing_options.BUDGET_TOLERANCE:g}×
its budget: the measured peak was {ratios["over_budget"].min():.3f}–{ratios["over_budget"].max():.3f}× the budget
and {ratios["over_model"].min():.3f}–{ratios["over_model"].max():.3f}× the memory model's prediction, at budgets
down to {ratios["multiple"].min():.2f}× the gradients' own bytes. The default error limit was met in
{int(budgets["default_limit_met"].sum())} of {len(budgets)} budgets, exactly those where balanced fits; below them
recommend returned compact, its least-error fit, and said the limit was unmet. The error model misses in both
directions here: it under-predicts balanced's errors and over-predicts compact's input gradient; the input gradient
is where it misses most (by up to {miss["grad_input_miss"].max():.0%}, median {miss["grad_input_miss"].median():.0%};
the weight gradient up to {miss["grad_weight_miss"].max():.0%}).

*Inputs:* {budgets["family"].iloc[0]} inputs, {budgets["dtype"].iloc[0]}, shapes
{", ".join(sorted({f"{r.N}×{r.D}×{r.C}" for r in budgets.itertuples()}))} (N×D×C), one seed per budget, CPU
{budgets["cpu_model"].iloc[0]} (`python -m analysis budgets`).

*Limits:* CPU layouts only, one input family and one seed per budget.""")

# %% [markdown]
# ## What class tiling costs
# Tiling computes every block's logits twice (once for the log-sum-exp, once for the
# gradients), and small blocks make small GEMMs.

# %%
figures["class_tiling_cost"].figure

# %%
tiled = nb07_choosing_options.tiling_numbers(tiling)
show(tiled, {"row_only_mib": "{:.0f}", "tiled_mib": "{:.0f}", "saving": "{:.0%}", "time_low": "{:.2f}",
             "time_high": "{:.2f}"}, name="class-tiling",
     caption="Per policy: peak with the vocabulary whole and the smallest tiled peak (MiB); tiled time / row-only time")

# %%
policy = tiled.set_index("policy")
setup = tiling.iloc[0]
Markdown(f"""**Conclusion.** Tiling the vocabulary cut every policy's measured peak, by
{tiled["saving"].min():.0%}–{tiled["saving"].max():.0%}; compact gains most ({policy.loc["compact", "row_only_mib"]:.0f}
→ {policy.loc["compact", "tiled_mib"]:.0f} MiB) because accurate and balanced keep their whole fp32 (C, D)
weight-gradient accumulator whatever the blocks. The time cost is uneven,
{tiled["time_low"].min():.2f}–{tiled["time_high"].max():.2f}× row-only chunking over policies and block counts,
and only balanced is slower at every block count: tiling computes each block's logits twice and makes small GEMMs,
but one run per point cannot separate that from noise, so choose tiling only when the budget needs it (recommend
does).

*Inputs:* {setup.N}×{setup.D}×{setup.C}, {setup["dtype"]}, {setup.batch_chunk_size} rows per chunk, class blocks
{", ".join(map(str, sorted(set(tiling["num_class_chunks"]) - {1})))} against the whole vocabulary, one run each,
CPU {setup.cpu_model}.

*Limits:* one run per point on a shared 2-core machine (a ratio below 1 is noise or cache effects, not a speed-up to
rely on); GPU costs are unmeasured.""")

# %% [markdown]
# ## No (C, D) temporaries
# Before this notebook's change, the layouts that sum the weight gradient in a buffer of another
# dtype formed each chunk's full `(C, D)` product first: on CUDA, balanced then allocated as much
# as accurate. The product is now formed a block of classes at a time, so each layout's peak is
# its accumulator plus chunk-sized buffers.

# %%
peaks = nb07_choosing_options.planned_peaks()
show(peaks, {"peak_kib": "{:.1f}"}, name="no-cd-temporaries",
     caption="Predicted peak extra memory at N=256, D=32, C=1000, bf16, fp32 acc_dtype, auto chunking")

# %%
cuda, cpu = (peaks[peaks["layouts"] == kind].set_index("policy")["peak_kib"] for kind in ("cuda", "cpu"))
shape = nb07_choosing_options.TEMPORARIES_SHAPE
Markdown(f"""**Conclusion.** On the CUDA layouts balanced now plans {cuda["balanced"]:.1f} KiB against accurate's
{cuda["accurate"]:.1f} KiB ({cuda["balanced"] / cuda["accurate"] - 1:+.1%}) and compact's {cuda["compact"]:.1f} KiB:
each layout's peak is its accumulator plus chunk-sized buffers, with no whole (C, D) product on top. On memory alone
balanced still does not undercut accurate on CUDA, so whether it earns its "auto" entry there is a question of
speed, which only a GPU can measure. On the CPU layouts the three policies plan the same {cpu.max():.1f} KiB.

*Inputs:* lce's memory model (`lce.plan`) at N={shape.N}, D={shape.D}, C={shape.C}, bf16, fp32 acc_dtype, chunks
of {nb07_choosing_options.TEMPORARIES_ROWS} rows (one chunk of rows would need no accumulator); notebook 03 checks the
model against the CPU allocator.

*Limits:* the CUDA figures are the model's; no GPU allocator was measured in this notebook.""")

# %% [markdown]
# ### Limits of this notebook
# - The error model is fitted and validated at the shapes of the first section (CPU, CUDA
#   layouts emulated on CPU tensors, and a GPU); at LLM heads it extrapolates. Held out, its
#   single predictions miss the band often enough that it should rank options, not certify one.
# - The default error limits translate notebook 06's error/noise rule into floors at that
#   notebook's batch size; larger batches shrink the sampling noise, so at LLM batch sizes the
#   limits are optimistic.
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
#    and why it lost; `print(lce.plan(x, W, options=choice.options))` lists every buffer.
# 3. Pass `choice.options` to `lce.linear_cross_entropy` or `lce.LinearCrossEntropyLoss`.
#    `class_chunk_size` is lce's own field: torch's op cannot take those options.
