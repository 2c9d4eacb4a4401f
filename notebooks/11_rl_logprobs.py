# %% [markdown]
# # 11 · Log-probabilities and entropy for RL: how exact is each recipe?
#
# PPO and GRPO fine-tuning (TRL, verl, OpenRLHF) weigh every sampled token by the importance ratio
# exp(log p_trainer − log p_sampler) and clip it at 1 ± 0.2; an entropy bonus or an entropy metric rides on
# the same head. The training/inference mismatch debate (FP16 instead of BF16 for RL, fp32 LM heads) is
# about how far the trainer's log-probabilities are from the exact ones, yet nobody publishes that error for
# a fused head. `lce.linear_log_probs` computes log p(target) under softmax(logits / T) and the entropy per
# token through the chunked head (the (N, V) logits never exist), with fp32 statistics formed as sums of
# terms of one sign. This notebook measures every recipe against fp64 on the *same rounded inputs*
# (`python -m analysis rl-logprobs`), so an error is the recipe's own arithmetic. The recipes, the heads RL
# stacks run today first:
#
# * **trl**: TRL 1.16's own fused head, which its GRPO, RLOO, DPO, KTO and SFT trainers install, imported from
#   the installed TRL and called as they call it: under the trainer's bf16 autocast each tile of 4,096 tokens x
#   32,768 classes gets its logits from a bf16 GEMM, then fp32 statistics and fp32 results;
# * **trl cast_lm_head_to_fp32**: the same head with TRL's remedy switched on: fp32 hidden states, autocast off,
#   fp32 GEMMs;
# * **materialized**: a plain PyTorch loop: logits from a GEMM in the input dtype, divided by T there,
#   `log_softmax` and `-Σ p log p` in the input dtype;
# * **fp32 statistics, cast back** (verl's torch path): the same logits, statistics in fp32, both results
#   rounded to the input dtype;
# * **fp32 head**: hidden states and head weight upcast, logits materialized, everything in fp32;
# * **lce**: default options on the CUDA and CPU layouts, compact with fp32 accumulation, and compact
#   without `acc_dtype` (its logits GEMM rounds to the input dtype, as the materialized recipe's does). lce's
#   default is also what `lce.integrations.trl.route(trainer)` runs inside TRL, bit for bit
#   (`tests/integrations/test_trl.py`).
#
# The rows: the trained LM's head dump and the calibrated family with targets **sampled from the exact
# tempered softmax** (as a rollout samples them), T from 0.6 to 1.2, bf16 and fp16, three seeds; confident
# rows whose target leads by up to 40 nats; and a Qwen-size head (the calibrated family at 512 x 896 x 151,936,
# bf16, T = 0.6 and 1.0, three seeds) beside the memory and time of each recipe there. On RL's scale: the
# importance-ratio error |exp(Δ) − 1| per token, the trainer-vs-sampler KL it implies (k3 over the sampled
# tokens), the entropy error in nats, and the policy-gradient loss −mean(A log p)'s gradient in floors of the
# input dtype.

# %%
from IPython.display import Markdown

from analysis.core.results_io import HEAD_BATCH, HEAD_MISMATCH, RL_CHUNKING, RL_COST, RL_EXAMPLE, RL_LOGPROBS, load_kind
from analysis.paths import RESULTS_DIR
from analysis.report import nb11_head_mismatch as hm
from analysis.report import nb11_rl_logprobs as nb11
from analysis.report.tables import show, span

# %matplotlib inline
paths, table = load_kind(RESULTS_DIR, RL_LOGPROBS.name)
cost_paths, costs = load_kind(RESULTS_DIR, RL_COST.name)
example_paths, example = load_kind(RESULTS_DIR, RL_EXAMPLE.name)
chunking_paths, chunking = load_kind(RESULTS_DIR, RL_CHUNKING.name)
figures = {figure.stem: figure for figure in nb11.draw_rl_figures(table, costs)}  # draws, measures nothing
summary = nb11.recipe_summary(table)
by = summary.set_index(["recipe", "dtype"])
print("data:", ", ".join(path.name for path in [*paths, *chunking_paths, *cost_paths, *example_paths]))

# %% [markdown]
# ## At a Qwen-size head: TRL's fused head, TRL's remedy, and lce routed into TRL
# Each recipe's importance-ratio error against the peak extra memory of its forward and backward, at the same
# head and batch (bf16).

# %%
figures["rl_qwen_head"].figure

# %%
qwen = nb11.qwen_summary(table, costs).set_index("recipe")
show(nb11.qwen_table(table, costs), name="rl-qwen-head",
     caption=f"The Qwen-size head ({nb11.qwen_line(table)}); † the bf16 GEMMs ran on the fp32 stand-in on this CPU")

# %%
def at_qwen(recipe, column="ratio_p99"):
    return qwen.loc[recipe, column]


Markdown(f"""**Conclusion.** At Qwen2.5-0.5B's head, TRL 1.16's default fused head moves the importance ratio by
{at_qwen("trl"):.1%} at the 99th percentile of the sampled tokens (range over temperatures and seeds
{at_qwen("trl", "ratio_p99_low"):.1%}–{at_qwen("trl", "ratio_p99_high"):.1%}), {at_qwen("trl", "ratio_max"):.1%} for
the worst token, and its entropy by up to {at_qwen("trl", "entropy_err_max"):.2f} nats: its fp32 statistics come
after each tile's logits were rounded to bf16, so it measures like the materialized recipe
({at_qwen("materialized"):.1%}) without the materialized logits. `cast_lm_head_to_fp32=True` removes it
(worst token {at_qwen("trl cast_lm_head_to_fp32", "ratio_max"):.0e}) with fp32 GEMMs; lce's default, which is what
`lce.integrations.trl.route` runs inside TRL, gives the same accuracy (worst token
{at_qwen("lce auto cpu", "ratio_max"):.0e}, CUDA layouts {at_qwen("lce auto cuda", "ratio_max"):.0e}) from bf16
operands. In memory, one forward and backward at {int(qwen["N"].iloc[0])} tokens peaks at
{at_qwen("trl", "peak_gib"):.2f} GiB for TRL's head, {at_qwen("trl cast_lm_head_to_fp32", "peak_gib"):.2f} GiB with
its fp32 cast, {at_qwen("materialized", "peak_gib"):.2f} GiB for materialized logits and
{at_qwen("lce auto cpu", "peak_gib"):.2f} GiB for lce, the least of them.

*Inputs:* {nb11.qwen_line(table)}; costs `python -m analysis rl-logprobs --costs`.

*Limits:* a synthetic family at the Qwen head's shape, not Qwen's trained weights; the CPU's times are not a GPU's
(on a GPU lce's default runs bf16 GEMMs into fp32, TRL's cast fp32 GEMMs: the GPU check measures both). On a CPU
that emulates bf16 GEMMs TRL's default head and the materialized recipes ran their bf16 GEMMs on the fp32 stand-in,
so their bytes are their own and their times are those of fp32 GEMMs.""")

# %% [markdown]
# ## The importance ratio
# Dots: the 99th percentile of |exp(Δ log p) − 1| over a problem's sampled tokens (median over temperatures
# and seeds, bar to their range); crosses: the worst token. Dashed: the 0.2 clip; dotted: 1e-3.

# %%
figures["rl_ratio_error"].figure

# %%
show(summary[["recipe", "dtype", "problems", "ratio_median", "ratio_p99", "ratio_p99_low", "ratio_p99_high",
              "ratio_max", "share_over_1e-3", "kl", "kl_low", "kl_high", "worst_p_target", "worst_rank"]],
     {c: "{:.2g}" for c in ("ratio_median", "ratio_p99", "ratio_p99_low", "ratio_p99_high", "ratio_max", "kl",
                            "kl_low", "kl_high", "worst_p_target")} | {"share_over_1e-3": "{:.1%}"},
     name="rl-ratio", caption="Per recipe and input dtype, over the sampled-target problems (2 families x 4 "
                              "temperatures x 3 seeds): the per-problem median and p99 ratio errors (median over "
                              "problems, with the p99's range), the worst token, the share of tokens over 1e-3, the "
                              "k3 KL (mean, range) and the worst tokens' exact p(target) and rank (medians)")

# %%
def ratio(recipe, dtype="bfloat16", column="ratio_p99"):
    return by.loc[(recipe, dtype), column]


lce_worst = summary[summary["recipe"].isin(["lce auto cuda", "lce auto cpu"])]["ratio_max"].max()
Markdown(f"""**Conclusion.** TRL 1.16's default fused head, the one its trainers run, moves the importance ratio by
{ratio("trl"):.1%} at the 99th percentile of the sampled tokens with bf16 inputs ({ratio("trl", "float16"):.2%} in fp16)
and {ratio("trl", column="ratio_max"):.1%} for the worst token: its statistics are fp32, but each tile's logits come
from a bf16 GEMM, so the error is bf16's rounding of the logits, the same numbers as lce without `acc_dtype` (whose
logits GEMM rounds likewise). With `cast_lm_head_to_fp32=True` the worst token is at
{ratio("trl cast_lm_head_to_fp32", column="ratio_max"):.0e}; lce's default gets there from the bf16 operands.
The older recipes are worse: with bf16 inputs the materialized recipe moves the importance ratio of a typical
sampled token by {ratio("materialized", column="ratio_median"):.1%} (median), {ratio("materialized"):.1%} at the 99th
percentile and {ratio("materialized", column="ratio_max"):.1%} for the worst token; {ratio("materialized",
column="share_over_1e-3"):.0%} of the tokens are off by more than 1e-3. Computing the statistics in fp32 and casting
back (verl's torch path) does not help: {ratio("fp32 statistics, cast back"):.1%} at the 99th percentile, because
the logits were already rounded to bf16 and the results are rounded again. In fp16 both are about
{ratio("materialized", "float16") / ratio("materialized"):.2f} times that ({ratio("materialized", "float16"):.2%} at
the 99th percentile): fp16's three extra mantissa bits, the FP16-for-RL argument in numbers. Keeping the logits of the
rounded inputs in fp32 removes it: the fp32 head's worst token is at {ratio("fp32 head", column="ratio_max"):.0e},
TRL's fp32 cast's at {ratio("trl cast_lm_head_to_fp32", column="ratio_max"):.0e} and lce's default options' at
{lce_worst:.0e} in both dtypes, with an implied KL of
{by.loc[("lce auto cuda", "bfloat16"), "kl"]:.0e} nats against {by.loc[("materialized", "bfloat16"), "kl"]:.0e} for
the materialized bf16 recipe. lce without `acc_dtype` rounds its logits GEMM to the input dtype and lands between
({ratio("lce compact cuda acc=input"):.1%}): the option to avoid for RL. The bf16 recipes that round the logits push
a few tokens past the 0.2 clip ({ratio("materialized", column="share_over_clip"):.3%} of the sampled tokens on
average, worst {ratio("materialized", column="ratio_max"):.2f}, all on the calibrated family), where the clip then
fires on arithmetic alone; every fp32-logits recipe stays below 1e-4. The worst tokens are not rare ones (median exact
p(target) {ratio("materialized", column="worst_p_target"):.2f} for the materialized recipe): bf16's error grows with
the logits' magnitude, not with the token's rarity.

*Inputs:* {nb11.inputs_line(table)}.

*Limits:* the sampler is exact here; a real sampler (vLLM, SGLang) adds its own error, so these are the trainer's
half of the mismatch. One trained head of 16,384 classes and one synthetic family; TRL's kernel ran on the CPU (its
PyTorch fold of each tile, the path TRL takes without Triton), its bf16 GEMMs on fp32 copies rounded once where
this CPU emulates them.""")

# %% [markdown]
# ## The entropy
# The worst absolute error of the per-token entropy, in nats.

# %%
figures["rl_entropy_error"].figure

# %%
Markdown(f"""**Conclusion.** TRL's default head's bf16 entropy is off by up to
{ratio("trl", column="entropy_err_max"):.2f} nats on a token (99th percentile
{ratio("trl", column="entropy_err_p99"):.2f}),
the materialized recipe's by up to {ratio("materialized", column="entropy_err_max"):.2f} (99th percentile
{ratio("materialized", column="entropy_err_p99"):.2f}); verl's fp32 statistics with the result rounded to bf16 by up
to {ratio("fp32 statistics, cast back", column="entropy_err_max"):.2f}. As a logged metric, averaged over many tokens,
that is noise; as an entropy bonus it is a per-token gradient weight off by that much. The fp32 head's worst entropy
error is {ratio("fp32 head", column="entropy_err_max"):.0e} nats, TRL's fp32 cast's
{ratio("trl cast_lm_head_to_fp32", column="entropy_err_max"):.0e} and lce's
{ratio("lce auto cuda", column="entropy_err_max"):.0e}.

*Limits:* the entropy bonus's own gradient is checked in fp64 (`tests/lce/test_log_probs.py`: parity with the
materialized formula and a gradcheck of a mixed RL loss), not in this study's floors.""")

# %% [markdown]
# ## Confident rows
# Rows whose target leads every other class by M nats (bf16 inputs): the relative error of log p(target) and
# of the entropy, both about e^−M in size.

# %%
figures["rl_confident_rows"].figure

# %%
confident = nb11.confident_summary(table)
bf16_confident = confident[(confident["dtype"] == "bfloat16")].set_index(["recipe", "margin"])
show(confident[confident["dtype"] == "bfloat16"].drop(columns=["dtype"]),
     {c: "{:.2g}" for c in ("logp_rel_err_max", "entropy_rel_err_max", "grad_input_floors", "grad_weight_floors")},
     name="rl-confident", caption="Confident rows, bf16 inputs, worst over seeds and temperatures: relative error of "
                                  "log p(target) and of the entropy, and the policy-gradient floors")

# %%
high = max(m for m in confident["margin"].unique())
peers = ["trl", "trl cast_lm_head_to_fp32", "materialized", "fp32 statistics, cast back", "fp32 head"]
peer_floors = min(bf16_confident.loc[(r, high), "grad_input_floors"] for r in peers)
lce_floors = bf16_confident.loc[("lce auto cpu", high), "grad_input_floors"]
fp16_confident = confident[(confident["dtype"] == "float16")].set_index(["recipe", "margin"])
lce_rel = max(bf16_confident.loc[(r, m), c] for r in ("lce auto cuda", "lce auto cpu")
              for m in confident["margin"].unique() for c in ("logp_rel_err_max", "entropy_rel_err_max"))
Markdown(f"""**Conclusion.** On a row whose target leads by {high:.0f} nats, log p(target) is about e^−{high:.0f}: every
peer recipe returns it with relative error {bf16_confident.loc[("fp32 head", high), "logp_rel_err_max"]:.0f} (fp32's
`lse − u_y` cancels), and the entropy loses the target's own term. lce keeps both to
{lce_rel:.0e} relatively at every margin. The absolute errors are far below anything a ratio could show; what a
confident row loses in the peers is its *gradient*: the policy-gradient's entry for the target is
A (1 − p_y), and 1 − p_y rounds to 0 in fp32, so every peer recipe, the fp32 head and TRL with its fp32 cast
included, returns the input gradient
of these rows at {peer_floors:.0f}+ floors (all of it wrong) where lce's is at {lce_floors:.2f}: lce sums the other
classes' share instead of forming 1 − p_y. In fp16 the peers lose them too at 20 nats
({min(fp16_confident.loc[(r, 20.0), "grad_input_floors"] for r in peers):.0f}+ floors, lce
{fp16_confident.loc[("lce auto cuda", 20.0), "grad_input_floors"]:.2f}); from 30 nats the exact gradient of these
rows lies below fp16's range even under a 2^12 loss scale, and every recipe reads about 1 floor there.

*Limits:* synthetic rows built to lead by exactly M nats (`analysis.core.families.confident_rows`), 64 rows of 4,096
classes; real heads have such rows too (code keywords, closing brackets: the calibrated family holds a share).""")

# %% [markdown]
# ## The policy-gradient's gradient
# The gradients of −mean(A log p) with respect to the hidden states and the head weight, in floors of the
# input dtype (1 = the exact gradient merely rounded), median over the sampled-target problems.

# %%
show(summary[["recipe", "dtype", "grad_input_floors", "grad_weight_floors", "grad_weight_floors_high"]],
     {c: "{:.2f}" for c in ("grad_input_floors", "grad_weight_floors", "grad_weight_floors_high")},
     name="rl-floors", caption="Policy-gradient floors per recipe and dtype (median over problems; the weight "
                               "gradient's worst problem)")

# %%
Markdown(f"""**Conclusion.** TRL's default head's bf16 gradients sit at
{by.loc[("trl", "bfloat16"), "grad_input_floors"]:.1f} (input) and
{by.loc[("trl", "bfloat16"), "grad_weight_floors"]:.1f}
(weight) floors: its backward recomputes each tile's logits in bf16 before forming dz (its fp32 cast:
{by.loc[("trl cast_lm_head_to_fp32", "bfloat16"), "grad_weight_floors"]:.2f}). The materialized bf16 recipe's gradients
sit at {by.loc[("materialized", "bfloat16"), "grad_input_floors"]:.1f} (input) and
{by.loc[("materialized", "bfloat16"), "grad_weight_floors"]:.1f} (weight) floors, the fp32-statistics recipe at
{by.loc[("fp32 statistics, cast back", "bfloat16"), "grad_input_floors"]:.1f} and
{by.loc[("fp32 statistics, cast back", "bfloat16"), "grad_weight_floors"]:.1f}. lce's default options give
{by.loc[("lce auto cuda", "bfloat16"), "grad_input_floors"]:.2f} and {by.loc[("lce auto cuda", "bfloat16"),
"grad_weight_floors"]:.2f} on the CUDA layouts (one rounding of dz for the backward GEMMs, an fp32 weight-gradient
sum) and {by.loc[("lce auto cpu", "bfloat16"), "grad_input_floors"]:.2f} on the CPU's (fp32 GEMMs); compact's
per-chunk bf16 weight-gradient sum costs {by.loc[("lce compact cuda acc=fp32", "bfloat16"), "grad_weight_floors"]:.1f}
floors at these heads' automatic chunk counts, as for the loss (notebooks 02 and 10). The fp32 head's
{by.loc[("fp32 head", "bfloat16"), "grad_weight_floors"]:.2f} is an fp32 gradient (better than any bf16 one can be),
paid for below.

*Limits:* floors of one policy-gradient loss with standard normal advantages; an fp16 backward starts from the loss
times 2^12 (`LOSS_SCALES`).""")

# %% [markdown]
# ## Chunking
# lce's CUDA layouts at 1, 8, 64 and 256 row chunks, and with the classes in blocks of 4,096 (bf16, T = 1,
# `python -m analysis rl-logprobs --chunking`): the forward's errors and the policy-gradient floors.

# %%
chunks = nb11.chunking_summary(chunking)
show(chunks, {"ratio_err_max": "{:.2g}", "entropy_err_max": "{:.2g}", "grad_input_floors": "{:.2f}",
              "grad_weight_floors": "{:.2f}"}, name="rl-chunking",
     caption="lce by row chunks and class tiling: the worst token's ratio and entropy errors (max over seeds), the "
             "policy-gradient floors (median over seeds)")

# %%
compact = chunks[(chunks["policy"] == "compact") & chunks["chunks"].notna()]
balanced = chunks[chunks["policy"] == "balanced"]
by_count = chunks[chunks["chunks"].notna()].groupby("family")["ratio_err_max"]
count_spread = (by_count.max() / by_count.min() - 1).max()
tiled = chunks[chunks["tiled"]].set_index("family")["ratio_err_max"]
tiled_shift = (tiled / by_count.median() - 1).abs().max()
Markdown(f"""**Conclusion.** Row chunks compute each row's statistics on their own: the worst ratio error moves by at
most {count_spread:.1%} between 1 and 256 chunks (the logits GEMM sums in another order at another chunk size), and
class tiling's blockwise statistics by {tiled_shift:.1%}. The gradients are where chunking shows, as for the loss:
compact's bf16 weight-gradient sum grows from {compact[compact["chunks"] == 1]["grad_weight_floors"].max():.2f}
floors at one chunk to {compact[compact["chunks"] == 256]["grad_weight_floors"].max():.2f} at 256, while balanced's
fp32 sum stays within {balanced["grad_weight_floors"].min():.2f}–{balanced["grad_weight_floors"].max():.2f} at
every chunk count and tiled.

*Limits:* bf16 and T = 1 only; the trained head and the calibrated family at the main study's shapes.""")

# %% [markdown]
# ## What each recipe costs at a Qwen-size head
# One forward and backward (policy-gradient loss with an entropy bonus) at D = 896, C = 151,936 in bf16, at two
# batches, on this CPU.

# %%
figures["rl_costs"].figure

# %%
cost = nb11.cost_summary(costs)
show(cost[["recipe", "N", "peak_gib", "logits_copies", "predicted_gib", "time_median_s", "gemms"]],
     {"peak_gib": "{:.2f}", "logits_copies": "{:.1f}", "predicted_gib": "{:.2f}", "time_median_s": "{:.2f}"},
     name="rl-cost", caption="Peak extra memory (GiB, and in copies of the bf16 logits), lce's predicted peak, and "
                             "the median time of a forward and backward")

# %%
tokens = 16384
grown = nb11.grown_peak(costs, tokens).set_index("recipe")
big = cost[cost["N"] == cost["N"].max()].set_index("recipe")
first = cost.iloc[0]
Markdown(f"""**Conclusion.** At {int(cost["N"].max())} tokens TRL's default head peaks at
{big.loc["trl", "peak_gib"]:.2f} GiB and its fp32 cast at {big.loc["trl cast_lm_head_to_fp32", "peak_gib"]:.2f} GiB:
no logits beyond one tile, but an fp32 (C, D) weight-gradient sum in its backward. The materialized recipe peaks at
{big.loc["materialized", "peak_gib"]:.2f} GiB ({big.loc["materialized", "logits_copies"]:.1f} bf16 copies of the
logits), the fp32-statistics recipe at {big.loc["fp32 statistics, cast back", "peak_gib"]:.2f} GiB and the fp32 head at
{big.loc["fp32 head", "peak_gib"]:.2f} GiB, against {big.loc["lce auto cpu", "peak_gib"]:.2f} GiB for lce (its plan
predicted {big.loc["lce auto cpu", "predicted_gib"]:.2f} GiB). Each peer's peak grows by the measured
{grown.loc["materialized", "logits_copies_per_token"]:.1f} (materialized),
{grown.loc["fp32 statistics, cast back", "logits_copies_per_token"]:.1f} (cast back) and
{grown.loc["fp32 head", "logits_copies_per_token"]:.1f} (fp32 head) bf16 logits copies per token; along those lines a
GRPO batch of {tokens:,} tokens would need {grown.loc["materialized", "peak_gib"]:.0f},
{grown.loc["fp32 statistics, cast back", "peak_gib"]:.0f} and {grown.loc["fp32 head", "peak_gib"]:.0f} GiB for the
head alone, TRL's head {grown.loc["trl", "peak_gib"]:.1f} GiB and lce {grown.loc["lce auto cpu", "peak_gib"]:.1f} GiB
(their chunks do not grow with N). On this CPU lce takes {big.loc["lce auto cpu", "time_median_s"]:.1f} s against
{big.loc["trl", "time_median_s"]:.1f} s for TRL's default
head{" †" if big.loc["trl", "gemms"] == "fp32 stand-in" else ""},
{big.loc["trl cast_lm_head_to_fp32", "time_median_s"]:.1f} s for its fp32 cast,
{big.loc["materialized", "time_median_s"]:.1f} s for the materialized recipe and
{big.loc["fp32 head", "time_median_s"]:.1f} s for the fp32 head.

{nb11.example_line(example)}

*Limits:* times on {first["cpu_model"]}, one process; † where this CPU emulates bf16 GEMMs, the peers' bf16 GEMMs ran
on the fp32 stand-in (their bytes are their own; their time is at fp32 GEMM speed, not the emulated kernels'), and
lce plans fp32 GEMMs itself; a GPU's bf16 GEMMs change the times, not the bytes. The {tokens:,}-token peaks are
extrapolated along the two measured batches (TRL's tiles stop growing at 4,096 tokens, so its line overstates it).""")

# %% [markdown]
# ## Which recipe
# Per recipe and dtype: does every sampled token keep its importance-ratio error below 1e-3, and below the clip?

# %%
verdict = nb11.verdicts(table)
show(verdict, {"ratio_max": "{:.2g}"}, name="rl-verdicts",
     caption="Worst token's ratio error over every sampled-target problem, and the two thresholds")

# %%
def every_dtype(column):
    kept = verdict.groupby("recipe")[column].all()
    return ", ".join(sorted(kept[kept].index))


past_clip = verdict[~verdict["below_clip"]]
Markdown(f"""**Conclusion.** Below 1e-3 for every token, in both dtypes: {every_dtype("below_tight")}. Below the 0.2
clip for every token in both dtypes: {every_dtype("below_clip")}; past it somewhere:
{", ".join(f"{r.recipe} ({r.dtype})" for r in past_clip.itertuples())}. For RL, the question is less whether the clip
fires than whether the trainer's ratio carries noise the size of the signal: a per-token ratio off by
{ratio("materialized"):.1%} (99th percentile) with bf16 logits ({ratio("trl"):.1%} for TRL's default head), against
{ratio("lce auto cuda"):.0e} with fp32 logits from the same bf16 weights. lce gives the accuracy of an fp32 head and of
TRL's `cast_lm_head_to_fp32` from the input dtype's operands (and, unlike both, keeps the confident rows), at a
fraction of the memory of any materialized recipe; inside TRL it is one call, `lce.integrations.trl.route(trainer)`.

*Limits:* one trainer-side measurement per recipe; the sampler's own error and the RL dynamics it drives are not
measured here.""")


# %% [markdown]
# ## Which trainer head matches which inference head
# With a vLLM rollout, the engine samples each token and returns its log-probability; the trainer recomputes that
# token's log-probability with its own head, and the importance ratio exp(log π_trainer − log π_infer), TRL's
# sequence mask and NeMo-RL's sequence filter compare the two (issue 51, `python -m analysis head-mismatch`). Here
# both sides get the *same* bf16 hidden states and head weight, so the difference is the heads' alone (a real
# engine's hidden states differ too), and each computes log p(target) forward only.
#
# * **inference heads**: vLLM's default (the head's bf16 GEMM, logits rounded to bf16, then the sampler's fp32
#   log-softmax of logits / T, the `processed_logprobs` TRL asks for), vLLM with `head_dtype=float32` (fp32 logits
#   of the bf16 values), and an fp16 engine (the same values in fp16, fp16 logits);
# * **trainer heads**: TRL 1.16's fused head, by default and with `cast_lm_head_to_fp32`; a Liger-style chunked
#   head, written here from Liger-Kernel's documented chunked log-probability path (bf16 block logits of 2,048
#   rows x 4,096 classes, upcast, times 1/T, an online fp32 log-sum-exp); the materialized bf16 loop; lce's default
#   on the CUDA layouts (emulated) and the CPU's; and lce with `acc_policy="compact"`, its low-memory option, whose
#   logits GEMM rounds to bf16.
#
# Per pair, on the tokens sampled from the exact tempered softmax: the RMS of the log-ratio in nats, the 99th
# percentile of |ratio − 1|, and the share of 512-token sequences (consecutive blocks of the batch) that TRL 1.16's
# default sequence mask (ratio above 3), the same mask with a lower bound of 1/3, and NeMo-RL's
# `seq_logprob_error_threshold` of 2.0 (its default is off) would drop, with a Wilson 95% interval.

# %%
mismatch_paths, mismatch = load_kind(RESULTS_DIR, HEAD_MISMATCH.name)
batch_paths, head_batch = load_kind(RESULTS_DIR, HEAD_BATCH.name)
head_figures = {figure.stem: figure for figure in hm.draw_head_mismatch_figures(mismatch)}
pairs = hm.pair_summary(mismatch).set_index(["family", "trainer", "inference"])
print("data:", ", ".join(path.name for path in [*mismatch_paths, *batch_paths]))
head_figures["rl_head_mismatch"].figure

# %%
show(hm.pair_table(mismatch, "calibrated"), name="rl-head-mismatch",
     caption=f"Trainer head against inference head at the Qwen-size head ({hm.inputs_line(mismatch)}): RMS over "
             "the tokens of log π_trainer − log π_infer (median over batch sizes, temperatures and seeds; range), "
             "|ratio − 1| at the 99th percentile (median), sequences dropped by each mask (pooled; Wilson 95%), each "
             "side's RMS error against fp64")

# %%
show(hm.pair_table(mismatch, "trained"), name="rl-head-mismatch-trained",
     caption="The same pairs on the trained LM's own head (2048 x 128 x 16,384: the trained family has no "
             "Qwen-size head); at 2048 rows every seed takes every row, so its seeds differ in their targets only")

# %%
qwen_pairs = pairs.loc["calibrated"]
matched = pairs[pairs["same_grid"]]
mixed = hm.mixed_pairs(mismatch)  # bf16 logits on one side, fp32 on the other
fp32_trainers = ["trl cast_lm_head_to_fp32", "lce auto cuda", "lce auto cpu"]
bf16_trainers = ["trl", "liger-style bf16 chunks", "lce compact cuda"]
best = hm.best_pairs(mismatch)
fp16_fp32 = qwen_pairs.loc[[(t, "fp16") for t in fp32_trainers], "rms"]
materialized = qwen_pairs.loc["materialized"]
below = materialized.drop(index="vllm default")  # against the fp32 and fp16 engine heads
below_third = int((below["masked_trl_two_sided"] - below["masked_trl_default"]).sum())  # ratio < 1/3
trained = pairs.loc["trained"]
trained_mixed = hm.mixed_pairs(mismatch, "trained")
dropped, sequences = int(mixed["masked_trl_default"].sum()), int(mixed["sequences"].sum())
low, high = hm.wilson(dropped, sequences)
Markdown(f"""**Conclusion.** A trainer head matches an inference head when both round the logits to the same grid.
With vLLM's default head (bf16 logits), TRL 1.16's default fused head, the Liger-style chunked head and lce's
`acc_policy="compact"` agree with the engine to {matched["rms_high"].max():.0e} nats RMS at most (both families);
with vLLM's `head_dtype=float32`, lce's default (either layout) and TRL's `cast_lm_head_to_fp32` do. Every pair that
puts bf16 logits on one side and fp32 logits on the other is off by {mixed["rms"].median():.4f} nats RMS at the
Qwen-size head (median over batch sizes, temperatures and seeds;
{mixed["rms_low"].min():.4f}–{mixed["rms_high"].max():.4f} over them), |ratio − 1| of
{span(mixed["ratio_p99"], ".1%")} at the 99th percentile of the sampled tokens and up to
{mixed["ratio_max"].max():.0%} for the worst: bf16's rounding of the logits, on one side only. The pair to use is
{hm.prose_names(best["trainer"])} with vLLM's `head_dtype=float32`: they agree to {best["rms"].max():.0e} nats and
each side is within {best[["trainer_rms_exact", "inference_rms_exact"]].max().max():.0e} nats of fp64, where the bf16
pairs agree as closely while both sides sit
{qwen_pairs.loc[[(t, "vllm default") for t in bf16_trainers], "trainer_rms_exact"].median():.4f} nats from fp64. An
fp16 engine sits near the fp32 heads ({span(fp16_fp32, ".4f")} nats against lce's default and TRL's cast) and as far
from the bf16 trainer heads as vLLM's fp32 head is. The materialized bf16 loop matches no engine head
({span(materialized["rms"], ".4f")} nats): its bf16 log-softmax rounds once more.

Summed over a 512-token sequence, the per-token log-ratios of the bf16-against-fp32 pairs mostly cancel (their mean
is at most {mixed["mean_delta"].abs().max():.0e} nats): their largest sequence log-ratio is
{mixed["seq_log_ratio_max"].max():.2f} nats, below TRL's ln 3 = 1.10, so TRL's default sequence mask drops {dropped}
of their {sequences} sequences (Wilson 95%: {low:.1%}–{high:.1%}), and {int(pairs["masked_trl_default"].sum())} of
any pair's. Only the materialized loop, against the fp32 and fp16 engine heads, goes past ln 3
({below["seq_log_ratio_max"].max():.2f} nats): {below_third} of those {int(below["sequences"].sum())} sequences
fall below a ratio of 1/3, which only the mask with that lower bound drops. NeMo-RL's statistic (the mean of exp|Δ|
over a sequence) peaks at {pairs["seq_mult_prob_error_max"].max():.3f}, far from its recipes' 2.0. The head's
mismatch alone is a noise of about {mixed["rms"].median():.1%} on every token's ratio, which these sequence masks do
not see at 512 tokens. On the trained LM's own head the pattern is the same: matched pairs within
{trained[trained["same_grid"]]["rms_high"].max():.0e} nats, bf16 against fp32 {trained_mixed["rms"].median():.4f}
({trained_mixed["rms_low"].min():.4f}–{trained_mixed["rms_high"].max():.4f}).

*Inputs:* {hm.inputs_line(mismatch)}.

*Limits:* the head alone, on shared hidden states: a real engine's body adds its own mismatch (Fast-LLM measured
0.03–0.04 nats RMS over Qwen2.5-0.5B's whole forward, ServiceNow/Fast-LLM#525), which these numbers leave out. The
calibrated family stands in for Qwen2.5-0.5B's head (the trained family exists only at D = 128, C = 16,384). Both
sides' bf16 GEMMs ran on this CPU's kernels; on a GPU the trainer's and the engine's kernels sum in different orders
and can round a logit to its other bf16 neighbour, so same-grid pairs agree less closely there. The Liger-style head is
this repository's code from Liger-Kernel's documented behaviour, not Liger's kernel. The sequences are consecutive
blocks of one batch and share their hidden states across temperatures, so the Wilson interval treats as independent
draws that are not quite.""")

# %% [markdown]
# ## The batch component
# Each head's log p of the batch's first 512 and first 100 rows, scored alone against the same rows scored inside
# the whole batch (4,096 rows of the Qwen-size head, 2,048 of the trained one; T = 1, three seeds).

# %%
show(hm.batch_table(head_batch), name="rl-head-batch",
     caption="Scored alone against scored inside the batch: same bits in every seed, and the largest difference")

# %%
batch = hm.batch_summary(head_batch)
same_bits = batch.groupby("head", sort=False)["bitwise_equal"].all()
lce_default = ["lce auto cuda", "lce auto cpu"]
varying = batch[~batch["bitwise_equal"]]
which = (f"every one of the {len(same_bits)} heads gives" if same_bits.all() else
         f"{same_bits.sum()} of the {len(same_bits)} heads give")
differ = ("" if varying.empty else f"; {hm.join_names(varying['head'].unique())} do not (largest difference "
          f"{varying['max_abs_diff'].max():.0e} nats)")
Markdown(f"""**Conclusion.** On this CPU ({mismatch["cpu_model"].iloc[0]}), {which} the first 512 and the first 100
rows the same bits scored alone as inside the batch, in every seed: {hm.join_names(same_bits[same_bits].index)}{differ}.
lce's default {"is among them" if same_bits[lce_default].all() else "is not among them"}, as it is meant to be; that
the peers are too says that this CPU's GEMM kernels compute each output row alike whatever the number of rows, so the
CPU cannot tell the batch-invariant heads from the others.

*Limits:* a GPU's GEMMs change their tile shapes and split-K with the number of rows, which is what makes a head
batch-variant there (vLLM's and the trainers' alike); the GPU check has to measure it.""")
