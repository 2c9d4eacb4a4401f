# %% [markdown]
# # 10 · Does a gradient bias change training over a long horizon?
#
# Notebook 06's rule holds every "auto" pick's weight-gradient bias below 0.01 of the sampling noise,
# a limit read off the ratio⁻² steps a steady bias needs to stand out and *extrapolated* from a
# 300-step training study that could not tell any arm from fp32. lce's CUDA pick (balanced) rests on
# it, against torch 2.13's compact, at a cost of about 1.8 GiB at an LLM head. Peers report
# convergence problems tied to low-precision accumulation across chunks. This notebook measures the
# effect instead of extrapolating it:
#
# * **the head alone, 10⁴ steps** (`python -m analysis head-train`): the features are fixed and only the
#   head's weight trains, so one step is one linear-cross-entropy forward and backward. A calibrated
#   teacher (Zipf prior, outlier features, confident rows; `analysis.core.families`) labels a pool of
#   rows; every arm of a seed starts from the same weight and sees the same batches; fp32 master weights
#   are cast to the arm's dtype each step, as mixed-precision training does. The lce arms run lce's
#   CUDA layouts at the chunk counts the rules give at a 16384×4096×128256 head (lce auto's balanced
#   and torch 2.13's compact at 64 chunks, torch 2.14's compact rule at 32) and a harsh 256;
# * **the small language model, 3000 steps** (`python -m analysis train --setting long`), held-out loss
#   per target-frequency bucket, so both kinds of evidence speak the same metric.
#
# Held-out loss is reported overall and per **bucket** of classes by how often they are targets:
# frequent (the classes holding the first 50% of the training targets), middle (the next 40%), rare
# (the last 10%, classes never seen included). A *gap* is an arm's held-out loss minus the fp32 arm's
# of the same seed; it *separates* when its 95% t-interval over seeds excludes zero, and it *exceeds
# the seed spread* when it is also larger than the fp32 arm's own spread over seeds (different start
# and batch order).

# %%
import pandas as pd
from IPython.display import Markdown

from analysis.core.buckets import BUCKETS
from analysis.core.results_io import HEAD_TRAINING, LOSS_SCALE, TRAINING, load_kind, read_table
from analysis.judge import horizon, rule
from analysis.paths import RESULTS_DIR
from analysis.report import hf_fp16, nb10_loss_scale
from analysis.report import nb10_long_horizon as nb10
from analysis.report.tables import show
from analysis.studies import head_training as study
from analysis.studies import training as study_lm
from analysis.studies.hf_fp16 import HF_FP16_FILE

# %matplotlib inline
head_paths, head = load_kind(RESULTS_DIR, HEAD_TRAINING.name)
head = head[head["setting"] == "full"]
training_paths, training = load_kind(RESULTS_DIR, TRAINING.name)
figures = {figure.stem: figure for figure in nb10.draw_long_horizon_figures(head)}  # draws, measures nothing
print("data:", ", ".join(path.name for path in [*head_paths, *training_paths]))

# %% [markdown]
# ## The head alone, 10⁴ steps of AdamW: which arms can be told from fp32?
# Each panel: an arm's held-out loss minus the fp32 arm's (millinats), mean over seeds, band = the
# seeds' range.

# %%
figures["head_gap_vs_step_adamw"].figure

# %%
summary = horizon.arm_summary(head)
final = horizon.final_gaps(head)
show(summary.drop(columns=["dtype"]),
     {c: (lambda v: f"{v * 1e3:+.2f}") for c in summary.columns if c.startswith("gap_")}
     | {"bias_over_noise": "{:.2g}", "bias_low": "{:.2g}", "bias_high": "{:.2g}"},
     name="head-arms", caption="Per arm: final held-out gap to the fp32 head (millinats) overall and on the rare "
                               "classes with its 95% t-interval over seeds, the buckets where the gap is systematic "
                               "and where it counts (exceeds the seed spread), and the gradient's bias/noise along "
                               "the run (median, range over seeds and checkpoints)")

# %%
settings = study.SETTINGS["full"]
adamw = final[final["optimizer"] == "adamw"].set_index(["arm", "bucket"])
counts = horizon.count_steps(head).set_index(["optimizer", "arm"])
spread = adamw.groupby(level="bucket")["seed_spread"].first()
quiet = adamw.loc[[a for a in adamw.index.get_level_values("arm").unique() if "balanced" in a or "accurate" in a]]
restated = horizon.bias_numbers(head)["restated_vs_lce"].max()


def gap(arm, bucket="rare"):
    return adamw.loc[(arm, bucket), "gap"] * 1e3


Markdown(f"""**Conclusion.** After {settings.steps:,} steps the only arms whose held-out loss differs from the fp32
head's by more than the fp32 head differs from itself across seeds ({spread["rare"] * 1e3:.0f} millinats on the rare
classes, {spread["middle"] * 1e3:.0f} on the middle ones, {spread["all"] * 1e3:.1f} overall) are compact at 256 chunks
(rare classes {gap("bf16 compact@256"):+.0f} millinats, counting from step
{counts.loc[("adamw", "bf16 compact@256"), "counts_from"]:,.0f}) and torch 2.13's fp16 pick, compact at 64 chunks
(rare classes {gap("fp16 compact@64"):+.0f}, overall {gap("fp16 compact@64", "all"):+.0f}, from step
{counts.loc[("adamw", "fp16 compact@64"), "counts_from"]:,.0f}). Below that, the paired runs still resolve
systematic effects: torch 2.13's bf16 pick (compact at 64 chunks) ends {gap("bf16 compact@64"):+.1f} millinats on the
rare classes (interval {adamw.loc[("bf16 compact@64", "rare"), "low"] * 1e3:+.1f} to
{adamw.loc[("bf16 compact@64", "rare"), "high"] * 1e3:+.1f}) and {gap("bf16 compact@64", "middle"):+.1f} on the middle
ones, systematic from the first evaluation; torch 2.14's rule (32 chunks) {gap("bf16 compact@32", "middle"):+.1f}
on the middle ones. lce's auto picks (balanced, bf16 and fp16) and accurate stay within
{quiet["gap"].abs().max() * 1e3:.1f} millinats of fp32 in every bucket: what rounding to bf16 at all does (accurate,
the most exact bf16 arithmetic, moves as much).

*Inputs:* calibrated teacher, D={settings.D}, C={settings.C}, {settings.batch_rows} rows per step from a pool of
{settings.pool_rows:,} ({settings.steps * settings.batch_rows / settings.pool_rows:.0f} passes), held-out
{settings.heldout_rows:,} rows; AdamW (lr {settings.adamw_lr:g}, betas 0.9/0.95, weight decay
{settings.weight_decay:g}, warm-up then cosine), {final["seeds"].min()} seeds; lce's CUDA layouts with fp32
acc_dtype, restated in whole-batch ops (`analysis.studies.head_arithmetic`, checked against lce at every bias
checkpoint: at most {restated:.1%} apart on the ratios).

*Limits:* one teacher family at a small head; three seeds, so a t-interval is wide where seeds disagree and the
seed spread is a range of three; the paired design resolves gaps far below the seed spread, which is what a user
comparing two runs would see.""")

# %% [markdown]
# ## Where it shows, and why the bias ratio alone does not say
# How far each arm's class rows drift from the fp32 head's, per bucket; and the final rare-class gap
# against the arm's bias/noise ratio (both optimizers).

# %%
figures["head_row_distance_adamw"].figure

# %%
figures["head_gap_vs_bias"].figure

# %%
bias = horizon.bias_numbers(head).set_index(["optimizer", "arm"])
fp16_ratio = bias.loc[("adamw", "fp16 compact@64"), "bias_over_noise"]
bf16_ratios = bias.loc["adamw"].loc[["bf16 compact@32", "bf16 compact@64", "bf16 compact@256"], "bias_over_noise"]
sgd = final[(final["optimizer"] == "sgd") & (final["bucket"] == "rare")].set_index("arm")
rare_fp32 = head[(head["arm"] == "fp32") & (head["optimizer"] == "adamw") & (head["metric"] == "heldout_loss")
                 & (head["bucket"] == "rare")].groupby("step")["value"].mean()
Markdown(f"""**Conclusion.** For the bf16 arms the rule's ratio orders the rare classes' effect: compact's bias/noise
along the run is {bf16_ratios.iloc[0]:.3f}, {bf16_ratios.iloc[1]:.3f} and {bf16_ratios.iloc[2]:.3f} at 32, 64 and 256
chunks, above the rule's {rule.BIAS_LIMIT}, and its rare-class gap is {gap("bf16 compact@32"):+.1f},
{gap("bf16 compact@64"):+.1f} and {gap("bf16 compact@256"):+.1f} millinats; balanced sits at
{bias.loc[("adamw", "bf16 balanced@64"), "bias_over_noise"]:.4f} with none. Plain SGD, where a biased gradient adds up
step by step, shows the same: compact at 256 chunks ends {sgd.loc["bf16 compact@256", "gap"] * 1e3:+.0f} millinats on
the rare classes, beyond the seed spread, balanced {sgd.loc["bf16 balanced@64", "gap"] * 1e3:+.2f}. But fp16
compact's ratio is {fp16_ratio:.4f}, far below the limit, and it moves the rare classes most. Its rounding is not a bias
along the gradient: lce (like torch's and Liger-Kernel's fused ops) forms a scalar loss's gradients in forward and
multiplies them by the incoming gradient in backward, so a loss scale does not lift them out of fp16's subnormals, and
compact adds each chunk's tiny product into the fp16 gradient, where the rare classes' entries are flushed or
coarsened. Adam divides every coordinate by its own running size, so a coordinate whose small gradient is lost stops
moving: here the rare classes, which the fp32 head keeps pushing down (its rare-class loss rises from
{rare_fp32.loc[rare_fp32.index >= 1000].min():.2f} to {rare_fp32.iloc[-1]:.2f} nats after step 1,000), stay
nearer where they started. The ratio, a projection on the whole gradient's direction, is dominated by the frequent
classes and misses it.

*Inputs:* as above; ratios measured at the fp32 arm's weight on that step's batch at steps
{", ".join(f"{s:,}" for s in settings.bias_steps)}, per seed.

*Limits:* the mechanism is read from the arithmetic and the per-bucket curves, not isolated by an ablation.""")

# %% [markdown]
# ## The picks `lce.recommend` offers under tight budgets: compact with few, large chunks
# At the LLM heads, the least memory within the error limit is compact with 2048 or 4096 rows per chunk
# (8 or 4 chunks of the 16384-row head), with class tiling under the tightest budgets. Before such a pick
# is offered it is trained here, in a group of its own (AdamW, the same seeds, its own fp32 arm): compact
# at 4, 8 and 16 chunks in bf16, at 4 and 8 in fp16, and balanced at 4. Class tiling leaves the weight
# gradient's roundings as they are, so a row-chunk arm stands for its tiled pick.

# %%
budget = summary[summary["optimizer"] == "adamw-budget"]
show(budget[["arm", "rule", "bias_over_noise", "gap_all", "gap_rare", "counts_in", "systematic_in"]],
     {"bias_over_noise": "{:.2g}", "gap_all": lambda v: f"{v * 1e3:+.2f}", "gap_rare": lambda v: f"{v * 1e3:+.2f}"},
     name="horizon-budget-arms", caption="The tight-budget arms after 10⁴ AdamW steps: bias/noise (median over "
                                         "seeds and checkpoints), final gap to their fp32 arm overall and on the "
                                         "rare classes (mnats), and where the gap counts or is only systematic")

# %%
from lce.decide import TRAINED_CHUNK_COUNTS  # noqa: E402

budget_by_arm = budget.set_index("arm")
passing = {str(dtype).removeprefix("torch."): [k for k, ok in counts if ok]
           for dtype, counts in TRAINED_CHUNK_COUNTS.items()}
fp16_eight = budget_by_arm.loc["fp16 compact@8"]
Markdown(f"""**Conclusion.** No tight-budget arm counts in any bucket: compact at
{", ".join(str(k) for k in (4, 8, 16))} chunks in bf16 trains like balanced, its bias/noise
{budget_by_arm.loc["bf16 compact@4", "bias_over_noise"]:.4f} and
{budget_by_arm.loc["bf16 compact@8", "bias_over_noise"]:.4f} at 4 and 8 chunks (balanced:
{bias.loc[("adamw", "bf16 balanced@64"), "bias_over_noise"]:.4f}), reaching the rule's
{rule.BIAS_LIMIT} at 16 ({budget_by_arm.loc["bf16 compact@16", "bias_over_noise"]:.4f}). fp16 compact at 8 chunks is
systematic on the rare classes ({fp16_eight["gap_rare"] * 1e3:+.1f} mnats, the direction of torch's fp16 pick at 64
chunks) but inside the seed spread. The training condition of `lce.decide` is this evidence: a weight gradient summed
in the input dtype is offered at {", ".join(f"{d} up to {max(v)}" for d, v in passing.items())} chunks and never beyond,
so `lce.recommend`'s compact picks at the LLM heads (8 chunks without a budget, 4 under 1.2x the gradients) are
trained offers. Balanced at 4 chunks ends exactly where balanced at 64 does: its weight gradient does not depend on
the chunk count.

*Inputs:* the head-only study's budget group (D={settings.D}, C={settings.C}, {settings.batch_rows} rows per step,
{settings.steps:,} steps, {int(budget["seeds"].min())} seeds).

*Limits:* the study's chunk counts stand for the LLM head's (the error grows with the count of per-chunk roundings,
not with the rows per chunk); this group's fp16 arms were trained before lce's fp16 gradients were protected by the
loss scale (`lce/passes/headroom.py`; the next section trains fp16 again with it).""")

# %% [markdown]
# ## fp16 under a loss scale that reaches lce's gradients
# The fp16 arms train with a dynamic loss scale (2¹⁶ at the start, halved on an overflow, doubled after a run of
# clean steps, as `torch.amp.GradScaler` does). The `adamw` group's fp16 arms were trained when lce formed a scalar
# loss's gradients at their true size in forward and multiplied the scale in afterwards, so the scale protected
# nothing. lce now keeps fp16 gradients scaled by powers of two and multiplies the scale in before their last
# rounding (`lce/passes/headroom.py`); the `adamw-headroom` group trains the same fp16 arms again, with the same seeds
# and its own fp32 arm.

# %%
headroom = nb10.headroom_comparison(summary)
show(headroom[["arm", "when", "step", "seeds", "gap_all", "gap_rare", "counts_in", "systematic_in"]],
     {"gap_all": lambda v: f"{v * 1e3:+.2f}", "gap_rare": lambda v: f"{v * 1e3:+.2f}"},
     name="horizon-headroom", caption="fp16 arms before and after lce.passes.headroom: final gap to the group's fp32 "
                                      "arm "
                                      "overall and on the rare classes (mnats), where it counts or is only "
                                      "systematic")

# %%
by_when = headroom.set_index(["arm", "when"])
compact_before, compact_after = by_when.loc[("fp16 compact@64", "before")], by_when.loc[("fp16 compact@64", "after")]


def interval(row, bucket):
    return (f"{row[f'gap_{bucket}'] * 1e3:+.1f} mnats [{row[f'gap_{bucket}_low'] * 1e3:+.1f}, "
            f"{row[f'gap_{bucket}_high'] * 1e3:+.1f}]")


after_counts = compact_after["counts_in"] or "no bucket"
Markdown(f"""**Conclusion.** With the loss scale reaching lce's fp16 gradients, torch 2.13's fp16 pick (compact, 64
chunks) moves the rare classes' held-out loss by {interval(compact_after, "rare")} after
{int(compact_after["step"]):,} steps, against {interval(compact_before, "rare")} before; its gap counts in
{after_counts} (before: {compact_before["counts_in"] or "no bucket"}). Overall: {interval(compact_after, "all")}
after, {interval(compact_before, "all")} before.

*Inputs:* the head-only study (D={settings.D}, C={settings.C}, {settings.batch_rows} rows per step), groups `adamw`
(before) and `adamw-headroom` (after), {int(compact_after["seeds"])} seeds each; intervals as above.

*Limits:* the two groups ran at different revisions of lce (their rows' provenance); the fp32 arms they are measured
against are the same arithmetic, so the gaps compare.""")

# %% [markdown]
# ## Entries lost to fp16's subnormal range, per policy, up to N=16384 and C=131072
# `python -m analysis loss-scale` draws fp16 problems of the calibrated family (its Zipfian prior makes most
# classes rare, their weight-gradient entries about p/N), computes each gradient under loss scales of 2¹² to 2¹⁶,
# and counts the entries that are zero or subnormal where fp64 times the scale is a normal fp16 number, for lce's
# arms before and after the headroom, torch 2.13's op, and the unfused op as fp16 autocast runs it (the reference).

# %%
loss_paths, loss_scale = load_kind(RESULTS_DIR, LOSS_SCALE.name)
print("data:", ", ".join(path.name for path in loss_paths))
nb10_loss_scale.plot_lost_entries(loss_scale).figure

# %%
arm_verdicts = nb10_loss_scale.arm_verdicts(loss_scale)
show(arm_verdicts[["arm", "headroom", "problems", "weight_never_more", "weight_extra_lost_fraction",
                   "input_never_more", "weight_floor_ratio_low", "weight_floor_ratio_high",
                   "input_floor_ratio_high"]],
     {"weight_extra_lost_fraction": lambda v: f"{100 * v:+.3f}%", "weight_floor_ratio_low": "{:.2f}",
      "weight_floor_ratio_high": "{:.2f}", "input_floor_ratio_high": "{:.2f}"},
     name="loss-scale-arms", caption="Per lce arm, before and after lce.passes.headroom, over every shape, seed and "
                                     "scale: "
                                     "whether it never loses more entries than the reference, its worst excess "
                                     "(share of the eligible entries) and its floors over the reference's")

# %%
after_rows = arm_verdicts[arm_verdicts["headroom"] == "after"]
before_rows = arm_verdicts[arm_verdicts["headroom"] == "before"]
fp32_acc = after_rows[~after_rows["arm"].str.contains("acc=fp16")]
fp16_acc = after_rows[after_rows["arm"].str.contains("acc=fp16")]
compact_cuda = after_rows[after_rows["arm"].str.startswith("lce compact cuda")]
floor_span = f'{compact_cuda["weight_floor_ratio_low"].min():.1f}–{compact_cuda["weight_floor_ratio_high"].max():.1f}'
torch_rows = loss_scale[loss_scale["impl"] == nb10_loss_scale.TORCH_DEFAULT]
overflow = sorted(torch_rows[~torch_rows["finite"].astype(bool)]["scale_log2"].unique())
Markdown(f"""**Conclusion.** After the headroom, {int(fp32_acc["weight_never_more"].sum())} of {len(fp32_acc)} arms
that accumulate in fp32 never lose more weight-gradient entries than the reference at any shape, seed or scale
(input gradient: {int(fp32_acc["input_never_more"].sum())} of {len(fp32_acc)}); before it, every arm lost up to
{100 * before_rows["weight_extra_lost_fraction"].min():.0f}–{100 * before_rows["weight_extra_lost_fraction"].max():.0f}%
of the eligible weight-gradient entries more than the reference. Arms computing in fp16 (an explicit policy without
`acc_dtype`) lose at most {100 * fp16_acc["weight_extra_lost_fraction"].max():.3f}% more. Compact's fp16 running sum
on the CUDA layouts costs {floor_span} times the reference's weight-gradient floors, before the headroom as after:
its own rounding, which no scale gives back.
torch 2.13's op returns inf gradients at {", ".join(f"2^{s}" for s in overflow)} (its fp16 loss cannot carry the scale).

*Inputs:* {nb10_loss_scale.inputs_line(loss_scale)}.

*Limits:* the CUDA layouts are emulated on the CPU (the same roundings, cuBLAS's summation order not reproduced); the
largest problem has one seed; lost entries count only fp16's subnormal range, the floors the rest of the error.""")

# %% [markdown]
# ## A transformers model trained in fp16 with a GradScaler
# `python -m analysis hf-fp16` trains a small Llama under fp16 autocast and `torch.amp.GradScaler`, unpatched and
# patched by `lce.integrations.transformers` (CPU layouts, emulated CUDA layouts, and the latter before the headroom),
# 3 seeds, against an fp32 run of the same seed.

# %%
hf_fp16_final = hf_fp16.final_gaps(read_table(RESULTS_DIR / HF_FP16_FILE))
show(hf_fp16_final[["arm", "seeds", "heldout", "gap", "low", "high", "skipped_high", "scale_low"]],
     {"heldout": "{:.4f}", "gap": lambda v: f"{v * 1e3:+.2f}", "low": lambda v: f"{v * 1e3:+.2f}",
      "high": lambda v: f"{v * 1e3:+.2f}"},
     name="hf-fp16", caption="Held-out loss at the last step and its gap to the fp32 run of the same seed (mnats, 95% "
                             "t-interval over seeds), the most steps the scaler skipped, the final scale")

# %%
by_arm = hf_fp16_final.set_index("arm")
lce_arms = [arm for arm in by_arm.index if arm.startswith("lce")]
includes_zero = bool(((by_arm["low"] <= 0) & (by_arm["high"] >= 0)).all())
Markdown(f"""**Conclusion.** Under fp16 autocast and a GradScaler, the patched model's held-out gap to fp32 is
{", ".join(f"{1e3 * by_arm.loc[arm, 'gap']:+.2f} mnats ({arm})" for arm in lce_arms)}, against
{1e3 * by_arm.loc["unpatched", "gap"]:+.2f} for the unpatched model; {"every" if includes_zero else "not every"}
interval includes zero. Every run is finite, the scaler skipped {int(by_arm["skipped_high"].max())} steps and the
scale stayed at 2^{int(by_arm["scale_low"].min()).bit_length() - 1}: the integration returns an fp32 loss, so 2¹⁶
reaches lce's backward without overflowing.

*Inputs:* a {int(read_table(RESULTS_DIR / HF_FP16_FILE)["layers"].iloc[0])}-layer Llama, fp16 autocast on the CPU,
{int(by_arm["seeds"].min())} seeds (`analysis/studies/hf_fp16.py`).

*Limits:* a small model and a short run on the CPU, whose intervals (each seed draws its own data) are wide: it shows
that the scale reaches lce's head through the integration and trains as the unpatched head does, not how an LLM's
rare tokens fare over a long run (the head-only study above is that evidence); the arm before the headroom cannot be
told apart at this length either.""")

# %% [markdown]
# ## The rule, from the evidence
# Each "auto" entry and the peers' CUDA picks, judged by whether the head-only arm that stands for
# them counts (differs from fp32 beyond the seed spread) in any bucket, beside the bias/noise limit.

# %%
verdicts = horizon.rule_verdicts(head)
show(verdicts, {"bias_over_noise": "{:.2g}", "largest_gap": lambda v: "" if v != v else f"{v * 1e3:+.1f} mnats"},
     name="horizon-verdicts", caption="Per rule the study stands for, dtype and optimizer: the arm, its bias/noise, "
                                      "the buckets where its final gap counts and the largest such gap, and the "
                                      "buckets where it is only systematic")

# %%
bracket = horizon.bias_bracket(head)
auto = verdicts[verdicts["rule"] == "lce auto"]
failing = verdicts[~verdicts["passes"]]
scale = (settings.steps / 1e5) ** 0.5
compact64 = bias.loc[("adamw", "bf16 compact@64"), "bias_over_noise"]
auto_text = "all pass" if auto["passes"].all() else "NOT all pass"
failing_text = ", ".join(f"{r.rule} in {r.dtype} ({r.optimizer}: {r.counts_in})" for r in failing.itertuples())
Markdown(f"""**Conclusion.** Measured, the threshold sits between {bracket["hidden_max"]:.3f} (the largest bf16 ratio
whose gap never counted: compact at 64 chunks) and {bracket["shown_min"]:.3f} (the smallest that did: 256 chunks) for a
{settings.steps:,}-step run. A bias that stands out after about ratio⁻² steps needs a ratio √10 smaller to stay hidden
over 10⁵ steps: {bracket["hidden_max"] * scale:.4f} to {bracket["shown_min"] * scale:.4f}, and the rule's
{rule.BIAS_LIMIT} lies in that range, so the limit stands as the 10⁵-step threshold, now scaled from a measurement
rather than extrapolated from 300 steps. By the same scaling torch 2.13's bf16 pick (ratio {compact64:.3f}) would
count within about {settings.steps * (bracket["shown_min"] / compact64) ** 2:,.0f} steps, at this head's 256 rows per
step; an LLM step's million tokens shrink the noise and raise every ratio. The ratio is not sufficient, though: fp16
compact passes it and changes training most. So the rule gains a second condition: the head-only arm standing for an
auto pick must not count in any bucket. lce's auto picks meet both ({auto_text}), and the CUDA auto stays balanced;
against it, {failing_text} count. The CPU
entries compute at least as accurately as arms that stayed hidden: accurate runs every GEMM in acc_dtype (the CUDA
accurate arm here rounds its operands to bf16 first), and fp32's compact sums in fp32. What compact would save,
about {rule.memory_at_llm_shapes()["compact_saves_vs_balanced_gib"].max():.1f} GiB at the largest LLM head by lce's
memory model, is paid for on the rare classes at the aspect-ratio chunk counts; with few, large chunks (the section
above) it is not, and `lce.recommend` offers it there.

*Inputs:* the head-only study above (final gaps at step {settings.steps:,}, {final["seeds"].min()} seeds).

*Limits:* the threshold is a bracket from a handful of arms at one head (D={settings.D}, C={settings.C}) and one
batch size; the 10⁵-step figure rests on the ratio⁻² scaling, which the study does not test beyond its own
{settings.steps:,} steps. A 2-core CPU horizon is that many steps; an LLM run of 10⁵ steps at 128k classes has ten
times the steps and a far longer tail of rare classes.""")

# %% [markdown]
# ### At a larger batch
# The bracket above is at 256 rows per step. Notebook 06 measures how each ratio grows with the
# batch (to 2¹⁶ rows, predicted to 2²⁰) and reruns this study at 4096 rows per step for the
# candidates its fit puts at or over the limit at LLM batch sizes; its conclusion:

# %%
from analysis.report import nb06_does_it_matter as nb06  # noqa: E402 (this section's only use)

Markdown(nb06.large_batch_conclusion(nb06.large_batch_training(RESULTS_DIR)))

# %% [markdown]
# ## The language model, 3000 steps, per bucket
# The small language model of notebook 05 trained with its head in fp32, bf16 balanced and bf16 compact
# at 256 chunks (one seed each), held-out loss per bucket every 100 steps.

# %%
lm = nb10.lm_long_gaps(training)
lm_final = lm[lm["step"] == lm["step"].max()] if not lm.empty else lm
show(lm_final.pivot_table(index="arm", columns="bucket", values="gap").reset_index() if not lm.empty
     else pd.DataFrame({"status": ["not run yet"]}),
     {bucket: (lambda v: f"{v * 1e3:+.1f}") for bucket in ("all", *BUCKETS)} if not lm.empty else {},
     name="lm-long", caption="The language model's final held-out gap to its fp32 run (millinats), per bucket")

# %%
long = study_lm.SETTINGS["long"]
last = lm.groupby("arm")["step"].transform("max")
tail = lm[lm["step"] > last - 5 * long.eval_every]  # each arm's last five evaluations
late = tail.groupby(["arm", "bucket"])["gap"].agg(["mean", "min", "max"]) * 1e3
done = lm.groupby("arm")["step"].max()


full = training[(training["setting"] == "full") & (training["device"] == "cpu")]
full_spread = study_lm.summary(full).loc["fp32", "seed_spread"]


def late_gap(arm, bucket):
    row = late.loc[(arm, bucket)]
    return f"{row['mean']:+.1f} ({row['min']:+.1f} to {row['max']:+.1f})"


Markdown(f"""**Conclusion.** With one seed per arm, the language model's held-out gap to its fp32 run (millinats;
mean of the arm's last five evaluations, their range) is, for bf16 balanced after {done["bf16 balanced"]:,} of
{long.steps:,} steps, {late_gap("bf16 balanced", "all")} overall and {late_gap("bf16 balanced", "rare")} on the rare
tokens, and for bf16 compact at 256 chunks after {done["bf16 compact"]:,} steps {late_gap("bf16 compact", "all")}
overall and {late_gap("bf16 compact", "rare")} on the rare tokens. Compact's overall gap stayed above zero at each
of those evaluations, balanced's straddled it; the rare tokens' gaps swing by up to
{(tail.groupby(["arm", "bucket"])["gap"].std().max() * 1e3):.0f} millinats (standard deviation) between
evaluations, as the whole model trains and the arms' trunks drift apart. One seed gives no interval: against the
300-step study's fp32 seed spread ({full_spread * 1e3:.0f} millinats, notebook 06) compact's overall gap is inside it,
so this run points the same way as the head-only study's harsh arm without separating it.

*Inputs:* TinyLM ({study_lm.CONTEXT}-token windows, {long.batch_size} windows = {long.batch_rows} rows per step,
{long.steps:,} steps, AdamW as in notebook 06), compact and balanced at exactly 256 chunks of
{long.batch_rows // 256} rows on lce's CUDA-layout arithmetic (restated, as in the head-only study; checked against
lce in the tests), held-out loss on 16 windows per evaluation, buckets from the training stream's token counts.

*Limits:* one seed; the rare bucket holds about a tenth of the 2048 held-out positions per evaluation.""")
