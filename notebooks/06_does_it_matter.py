# %% [markdown]
# # 06 · Does a gradient error matter? Error against sampling noise, and a training study
#
# "Floors" say how far a gradient is from fp64, not whether training notices. SGD already
# trains on a gradient that differs from the full-data one by sampling noise; an error far
# below that noise cannot be told from it, unless it is a *bias*, which does not average out
# as steps go by. This notebook measures each policy's gradient error against the sampling
# noise of the same batch, trains the small language model of notebook 05 with its head
# loss under each policy, and states the rule the "auto" table is held to. It also settles
# a peer's claim: torch removed `balanced` after 2.13 (pull requests 187838 and 188283),
# reasoning that on CUDA compact's per-chunk `addmm_` already matches balanced's precision
# because cuBLAS accumulates in fp32.
#
# Where the numbers come from: real-GPU rows (one H200, torch 2.11, `python -m analysis gpu-check`)
# where this task was lent a GPU, and the CPU emulation of lce's CUDA layouts (exact
# products, fp32 sums) that CI can rerun.

# %%

import pandas as pd
from IPython.display import Markdown, display

from analysis.core.results_io import HEAD_TRAINING, NOISE, NOISE_SCALING, TRAINING, load_kind
from analysis.judge import rule
from analysis.lm.model import ModelConfig
from analysis.lm.pipeline import DEFAULT_VOCAB
from analysis.paths import RESULTS_DIR
from analysis.report import nb06_does_it_matter as nb06
from analysis.report.tables import show, span
from analysis.studies import training as study
from analysis.studies.noise import NOISE_SHAPE

# %matplotlib inline
noise_paths, noise = load_kind(RESULTS_DIR, NOISE.name)
training_paths, training = load_kind(RESULTS_DIR, TRAINING.name)
scaling_paths, scaling = load_kind(RESULTS_DIR, NOISE_SCALING.name)
head_paths, head = load_kind(RESULTS_DIR, HEAD_TRAINING.name)
figures = {figure.stem: figure for figure in [*nb06.draw_all(noise, training, scaling),
                                              *nb06.draw_large_batch_figures(head)]}  # draws, measures nothing
print("data:", ", ".join(p.name for p in [*noise_paths, *training_paths, *scaling_paths, *head_paths]))

# %% [markdown]
# ## Does compact match balanced on CUDA?
# lce with fp32 `acc_dtype` (what "auto" resolves to) at explicit chunk counts 1–256, on four
# input families (notebook 05), bf16 and fp16, 5 seeds; the weight-gradient error in floors.
# Compact adds each chunk's product into the low-precision gradient (`addmm_`), balanced into
# an fp32 `(C, D)` buffer rounded once at the end.

# %%
rows = rule.study_rows(noise)
best = rows[rows.device == ("cuda" if (rows.device == "cuda").any() else "cuda-emulated")]
floors = best[best.layout == "cuda"].pivot_table(index=["dtype", "policy"], columns="num_chunks",
                                                 values="grad_weight_floors", aggfunc="median")
show(floors.reset_index(), {c: "{:.2f}" for c in floors.columns}, name="floors-by-chunks")

# %%
numbers = nb06.noise_numbers(noise)
where, most = nb06.SOURCE_WORDS[numbers.source], numbers.most
floors = {dtype: numbers.at("compact", "grad_weight_floors", dtype=dtype) for dtype in ("bfloat16", "float16")}
typical, largest, at = nb06.emulation_agreement(noise)
memory = rule.memory_at_llm_shapes()
Markdown(f"""**Conclusion.** No. On {where}, compact's weight-gradient error grows with the chunk count in every
family and dtype: from {span(numbers.at("compact", "grad_weight_floors", 1))} floors at 1 chunk, where it equals
balanced's, to {span(floors["bfloat16"])} floors at {most} chunks in bf16 and {span(floors["float16"])} in fp16,
while balanced stays at {span(numbers.at("balanced", "grad_weight_floors"))}. Compact's per-chunk `addmm_` into the
bf16/fp16 gradient rounds the running sum once per chunk, whatever cuBLAS accumulates inside one product: torch's
premise (compact's precision matches balanced's) holds for a single chunk only. The CPU emulation of the CUDA layouts
that CI reruns reproduces the H200's floors: the median relative difference is {100 * typical:.2g}% over every
policy, chunk count, family and dtype (seed medians over the seeds both ran), the largest {100 * largest:.0f}%
({at}).

*Inputs:* lce with fp32 acc_dtype on the CUDA layouts at explicit chunk counts (1 to {most}); families
{", ".join(numbers.families)} at N={NOISE_SHAPE.N}, D={NOISE_SHAPE.D}, C={NOISE_SHAPE.C}; bf16 and fp16;
{numbers.seeds} seeds (medians) on {where} (`python -m analysis noise --device cuda`; the emulation: `python -m
analysis noise`, CPU {rows[rows.device == "cuda-emulated"].cpu_model.iloc[0]}).

*Limits:* one shape (D={NOISE_SHAPE.D}; at the LLM heads of the last section `aspect_ratio:2` gives
{span(memory.num_chunks, "d")} chunks, inside the range measured here); torch's own op was not run on the GPU
(torch {rows[rows.device == "cuda"].torch_version.iloc[0]} there has none): compact is lce's layout with the
arithmetic torch documents.""")

# %% [markdown]
# ## Error against the sampling noise of the same batch
# For the mean loss over N rows the weight gradient's standard error is computable from the
# per-example gradients `g_i = (softmax_i − onehot_i) x_iᵀ` in closed form
# (`analysis.studies.noise`). Two ratios per run: the whole error over that noise (below 1:
# hidden in one step's noise), and the error's component along the exact gradient over the
# noise along it (a bias: it stands out of the noise averaged over `ratio⁻²` steps).

# %%
figure = figures.get("noise_vs_chunks_cuda") or figures["noise_vs_chunks_cuda-emulated"]
display(figure.figure, Markdown(figure.markdown))

# %%
if "noise_vs_chunks_cuda-emulated" in figures and figure.stem != "noise_vs_chunks_cuda-emulated":
    emulated = figures["noise_vs_chunks_cuda-emulated"]
    display(emulated.figure, Markdown(emulated.markdown))
peers = rule.peer_table(noise)
show(peers[["rule", "dtype", "policy", "num_chunks", "source", "worst_family", "weight_bias_over_noise",
            "weight_error_over_noise", "passes"]],
     {"weight_bias_over_noise": "{:.3g}", "weight_error_over_noise": "{:.3g}"}, name="chunking-rules")

# %% [markdown]
# The three ratios per policy at 256 chunks, worst family (seed medians): the input gradient's error is
# per row, so chunking does not change it, and it stays far below its noise for every policy.

# %%
at_256 = best[((best.num_chunks == 256) & (best.layout == "cuda")) | (best.policy == "unfused")]
ratios = at_256.groupby(["dtype", "policy", "family"])[list(rule.RATIO_COLUMNS)].median()
show(ratios.groupby(["dtype", "policy"]).max().reset_index(), {c: "{:.3g}" for c in rule.RATIO_COLUMNS},
     name="ratios-at-256")

# %%
bias = {policy: numbers.at(policy, "weight_bias_over_noise") for policy in ("compact", "balanced", "accurate")}
steps = {policy: span(ratio ** -2, ".2g") for policy, ratio in bias.items()}
at_most = numbers.medians.xs(most, level="num_chunks")
Markdown(f"""**Conclusion.** Per step, every policy's error hides in the sampling noise of the batch: at {most}
chunks the whole weight-gradient error is at most {at_most.weight_error_over_noise.max():.2g} of the noise and the
input gradient's at most {at_most.input_error_over_noise.max():.2g}. What separates the policies is the error's
component along the exact gradient, a bias, which does not average out over steps. Compact's bias/noise grows with
the chunk count (in every family and dtype it is larger at 16 chunks than at 1, and at 256 than at 16; between
neighbouring counts it can dip) to {span(bias["compact"], ".2g")} at {most} chunks (per family and dtype), so it
would stand out of the averaged noise after {steps["compact"]} steps. At the same chunk count balanced's is
{span(bias["balanced"], ".2g")} ({steps["balanced"]} steps) and accurate's {span(bias["accurate"], ".2g")}
({steps["accurate"]} steps), below compact's in every family and dtype; the unfused op in the input dtype's is
{span(numbers.at("unfused", "weight_bias_over_noise", 1), ".2g")}.

*Inputs:* the runs of the previous section, on {where}; {numbers.seeds} seeds (medians); the noise is the standard
error of the mean-loss gradient over the batch's {NOISE_SHAPE.N} rows (`analysis.studies.noise`).

*Limits:* the noise is that of one batch of {NOISE_SHAPE.N} rows (it shrinks as 1/sqrt(rows): a 16x larger batch
makes every ratio 4x larger); the input gradient's ratio treats the layers below as the identity; reading a bias as
"stands out after ratio⁻² steps" assumes a steady bias and independent noise from step to step.""")

# %% [markdown]
# ## Training with each policy
# The small language model (notebook 05) trained with its head's loss computed by each arm:
# the fp32 head, the unfused bf16 head, lce accurate / balanced / compact in bf16 and in fp16
# (with a dynamic loss scale), all lce arms at `aspect_ratio:2` (256 chunks of 8 rows, the
# chunk count of LLM heads). Same initialisation and same batches for every arm of a seed.
# The committed full setting's results follow (`python -m analysis train`; its quick setting,
# `--quick`, checks the machinery in a few minutes and is what the tests run).

# %%
for name in ("training_cuda", "training_cpu"):
    if name in figures:
        display(figures[name].figure, Markdown(figures[name].markdown))
display(figures["noise_during_training"].figure, Markdown(figures["noise_during_training"].markdown))

# %%
runs = {device: nb06.training_numbers(training, noise, device) for device in ("cuda", "cpu")}
gaps = pd.concat({run.where: run.summary[["seeds", "gap_mean", "gap_min", "gap_max"]] for run in runs.values()})
show(gaps.rename_axis(["trained on", "arm"]).reset_index(), {c: "{:+.3f}" for c in ("gap_mean", "gap_min", "gap_max")},
     name="training-gaps")

# %%
gpu, cpu = runs["cuda"], runs["cpu"]
config = ModelConfig(DEFAULT_VOCAB)
Markdown(f"""**Conclusion.** No arm can be told from the fp32 head after {cpu.steps} steps, on either device: the
largest final held-out gap is {gpu.widest.gap:+.3f} nats ({gpu.widest.arm}) on {gpu.where} and
{cpu.widest.gap:+.3f} nats ({cpu.widest.arm}) on the CPU, while the fp32 head alone varies by {gpu.fp32_spread:.3f}
and {cpu.fp32_spread:.3f} nats between seeds (every arm's gaps: the table). This is not because compact's bias is
small here: on the fp32 run's snapshots (steps {", ".join(f"{s:g}" for s in cpu.snapshots.step)}) its bias/noise in
bf16, at the training arms' chunk count, was {span(gpu.snapshots["median"], ".2g")} on the H200 and
{span(cpu.snapshots["median"], ".2g")} emulated, above the 1/sqrt({cpu.steps}) = {cpu.steps ** -0.5:.2g} at which a
steady bias would stand out by the end of the run. So at this scale the ratio⁻² reading is conservative.

*Inputs:* TinyLM ({config.n_layers} layers, D={config.d_model}, C={config.vocab_size}), {cpu.tokens} tokens per
step, {gpu.seeds} seeds per arm on {gpu.where} and {cpu.seeds} on {cpu.where}; same initialisation and batches per
seed; held-out loss in fp32 (`python -m analysis train`, `--device cuda` on the GPU).

*Limits:* a small model, {cpu.steps} steps and one vocabulary: a gap below the seed-to-seed spread is all such runs
can resolve, and on the H200 {", ".join(gpu.summary.index[gpu.summary.seeds == 1])} have a single seed and
{", ".join(arm.name for arm in study.ARMS if arm.name not in gpu.summary.index) or "no arm"} did not run. They
say nothing about 10⁴–10⁶ steps at 128k–256k classes, where compact's bias has far longer to act.""")

# %% [markdown]
# ## The rule, and what each policy buys at LLM shapes
# A pick must lie on the error–memory front (notebook 04) and keep its weight-gradient bias
# below 0.01 of the sampling noise along the gradient (10⁴ steps before it could stand out)
# and its whole errors below 0.1 of the noise (1% more gradient variance), on the worst input
# family (`analysis.judge.rule`). What compact saves is real: the table gives, per policy in
# bf16 on CUDA with `aspect_ratio:2`, lce's predicted peak extra memory of one forward+backward
# at three LLM heads (N×D×C), next to its worst bias/noise at 256 chunks and the training
# study's final-loss gap to the fp32 head.

# %%
costs = rule.policy_costs(noise, training)
show(costs, {c: ("{:.2f}" if c.startswith("GiB") else "{:.3g}") for c in costs.columns
             if c.startswith(("GiB", "bias"))}, name="policy-costs")
show(rule.rule_table(noise)[["device", "dtype", "pick", "source", "worst_family", "weight_bias_over_noise",
                                 "weight_error_over_noise", "input_error_over_noise", "passes"]],
     {c: "{:.3g}" for c in ("weight_bias_over_noise", "weight_error_over_noise", "input_error_over_noise")},
     name="auto-rule")

# %%
auto, peers = rule.rule_table(noise), rule.peer_table(noise)
peers = peers[peers.rule != "lce auto"]


def named(picks):
    return ", ".join(f"{r.rule} in {r.dtype} ({r.policy}, {r.num_chunks} chunks: bias/noise "
                     f"{r.weight_bias_over_noise:.2g})" for r in picks.itertuples())


Markdown(f"""**Conclusion.** Every "auto" entry meets the rule ({auto.passes.sum()} of {len(auto)}): on its worst
input family its bias/noise is at most {auto.weight_bias_over_noise.max():.2g} (limit {rule.BIAS_LIMIT}) and its
error/noise at most {auto[["weight_error_over_noise", "input_error_over_noise"]].max().max():.2g} (limit
{rule.ERROR_LIMIT}). torch's CUDA default fails it in both dtypes, and pull request 187838's rule in bf16:
{named(peers[~peers.passes])}; {named(peers[peers.passes])} passes. What compact buys is real: at the LLM heads
({", ".join(memory["shape"])}) it needs {span(memory.compact_saves_vs_balanced_gib)} GiB less peak memory than
balanced, by lce's memory model. It pays for it with a bias that the rule's {rule.BIAS_LIMIT ** -2:,.0f} steps
would expose.

*Inputs:* the noise study (the H200's rows for the CUDA entries and torch's picks, the CPU's own runs for the CPU
entries), worst family, seed medians; memory: `lce.plan`'s predicted peak at bf16, `aspect_ratio:2`, fp32
acc_dtype.

*Limits:* this notebook's training study reads a bias (ratio⁻² steps to stand out) over {cpu.steps} steps only;
notebook 10 measures it over {rule.BIAS_LIMIT ** -2:,.0f} steps with the head alone, where the limit falls between
the ratios that stayed hidden and those that separated, and adds a training condition the ratio alone misses. The
ratios here are at N={NOISE_SHAPE.N} rows per batch, and grow with the batch.""")

# %% [markdown]
# ## The ratios over the batch size: do the picks hold at LLM steps?
# Everything above is at N = 1024 rows per batch; an LLM step sees 10⁵–10⁶ tokens. The noise
# along the gradient shrinks as 1/sqrt(N); an error that does not shrink with it makes every
# ratio grow as sqrt(N). The noise-scaling study (`python -m analysis noise-scaling`) measures
# the ratios for each candidate the rule weighs (each device kind's auto pick, torch 2.13's
# CUDA default, compact at auto's 2048 rows and at 16 chunks, balanced and accurate at 256
# chunks, the unfused op) from N = 2¹⁰ to 2¹⁶ at D = 128, C = 16384 (and D = 512, 2048 at
# smaller N), on three input families and three seeds, in bf16 and fp16.
# `analysis.judge.noise_scaling` fits `log2(ratio) = level[family] + exponent · log2(N)` on the
# families whose expected gradient is nonzero, checks it on held-out N, and extrapolates to
# 2¹⁷–2²⁰; `lce.decide` reads the result at each head's own N.

# %%
figure = figures["noise_scaling_weight_bias"]
display(figure.figure, Markdown(figure.markdown))
numbers_n = nb06.scaling_numbers(scaling)
show(nb06.scaling_table(numbers_n), name="noise-scaling-fit")

# %% [markdown]
# The fit's own checks: fitted on the even powers of two, does it predict the odd ones
# (`heldout_check`)? Does each family alone grow at the shared exponent, and does D change it?
# And the premise of reading the auto picks' ratio as the floor's: their weight gradient's
# Frobenius error in floors at every N.

# %%
show(nb06.heldout_summary(numbers_n), {"largest_error_log2": "{:.2f}"}, name="noise-scaling-heldout")
show(numbers_n.own, {c: "{:.2f}" for c in ("exponent", "exponent_low", "exponent_high")},
     name="noise-scaling-families")
show(numbers_n.by_d[["candidate", "dtype", "D", "rows", "exponent", "exponent_low", "exponent_high"]],
     {c: "{:.2f}" for c in ("exponent", "exponent_low", "exponent_high")}, name="noise-scaling-by-d")
show(nb06.floor_check(scaling), {"floors_min": "{:.3f}", "floors_max": "{:.3f}"}, name="noise-scaling-floors")

# %%
Markdown(nb06.scaling_conclusion(numbers_n, scaling))

# %% [markdown]
# ### Training at a larger batch
# Where a candidate's ratio crosses the limit at LLM batch sizes, does training notice? The
# head-only study of notebook 10 again (AdamW, calibrated teacher, D = 32, C = 2048), at 16x
# its batch per step (4096 rows: the noise along the gradient 4x smaller, so a fixed bias counts
# 4x more), for fp32 and the bf16 candidates the fit puts at or over the limit: the unfused op,
# compact at 64 chunks (torch 2.13's default's count at the Llama head) and at 256, beside lce's
# auto pick (balanced at 64). `python -m analysis head-train --setting large-batch`.

# %%
large = nb06.large_batch_rows(head)
if "head_gap_vs_step_adamw-large" in figures:
    display(figures["head_gap_vs_step_adamw-large"].figure, Markdown(figures["head_gap_vs_step_adamw-large"].markdown))
show(nb06.large_batch_summary(large), {c: "{:+.4f}" for c in ("gap", "low", "high")} | {"seed_spread": "{:.4f}"},
     name="large-batch-gaps")

# %%
Markdown(nb06.large_batch_conclusion(large))

# %% [markdown]
# ### Limits of this notebook
# - **Scale.** The training study is a 4-layer, D=128 model over 300 steps with a 16k
#   vocabulary. Arms of one seed drift apart by a few hundredths of a nat whatever the
#   rounding, so it can only show that no policy costs more than that here. It cannot show
#   the effect of a bias acting over 10⁴–10⁶ steps at 128k–256k classes, nor on rare
#   classes' embeddings over a long run; notebook 10 trains the head alone for 10⁴ steps for
#   that, and the rule's limits now rest on it (stated in `analysis.judge.rule`).
# - **Noise depends on the batch.** The first sections are at 1024 rows per batch; the noise
#   shrinks as 1/sqrt(rows). How much each ratio grows with the batch is measured to 2¹⁶ rows
#   and predicted beyond by a fitted power law (the batch-size section): a prediction, at
#   D = 128 and C = 16384, on synthetic families and a small trained head's 2048 rows.
# - **Hardware.** The real-GPU rows ran on one H200 with torch 2.11; other GPUs' cuBLAS
#   kernels may sum in another order. TF32 was off.
# - **What would settle it.** Train a 1B-parameter model with a 128k vocabulary for 10⁴ steps
#   with balanced and compact heads (3 seeds each) on GPUs, and compare the loss and the
#   rare-token embeddings; `python -m analysis gpu-check --steps noise,train` is the start of that run.
