# %% [markdown]
# # 04 · Is each "auto" default on the error–memory and error–time fronts, and what should fp32 use?
#
# For every (device, dtype) entry of lce's "auto" table — plus the entries torch's table
# lacks (CPU fp32, CUDA fp32, which fall back to compact with aspect_ratio:2) — we place the
# auto pick among every measured configuration of the same problem on two Pareto fronts:
# (peak memory, worst gradient error in floors) and (time, error). A verdict says whether
# the pick is on each front and, if not, which configuration dominates it. CPU panels are
# measured on a CPU; the CUDA entries are judged on an H200's own runs (`python -m analysis
# gpu-check`: one shape per input family and two LLM heads), and lce's CUDA layouts run on CPU
# tensors (errors of the CUDA path, memory from lce's model, no GPU times) cover more shapes in
# their own section.
# Every verdict is per input family (`random`, `calibrated`, `trained`: notebook 05 describes
# them) and holds only if it holds in every seed of the sweep.

# %%
import html

import pandas as pd
from IPython.display import Markdown, display

from analysis.judge import pareto
from analysis.paths import FIGURES_DIR
from analysis.report import nb04_pareto
from analysis.report.auto_table import AUTO_EVIDENCE
from analysis.report.nb02_accuracy import AT_FLOOR, cpus, shapes
from analysis.report.style import families_text, seeds_text
from analysis.report.tables import show, span
from lce.planning.options import dtype_name
from lce.planning.policies import AUTO_FALLBACK, AUTO_TABLE

# %matplotlib inline
paths, table = pareto.load_table()
drawn_here = (nb04_pareto.plot_error_vs_memory(table, "cpu"), nb04_pareto.plot_error_vs_memory_all_shapes(table, "cpu"),
              nb04_pareto.plot_error_vs_memory(table, "cuda"), nb04_pareto.plot_error_vs_memory(table, "cuda-emulated"),
              nb04_pareto.plot_error_vs_memory_all_shapes(table, "cuda-emulated"))
figures = {figure.stem: figure for figure in drawn_here if figure is not None}  # draws, measures nothing
print("data:", ", ".join(p.name for p in paths), "| devices:", ", ".join(sorted(table.device.unique())))

# %% [markdown]
# ## The "auto" table, the reason recorded for each entry, and its evidence
# The reasons and the figures that carry each entry's evidence are the analysis's
# (`analysis/report/auto_table.py`; the library keeps a sentence per entry). Evidence names the figures
# `python -m analysis figures` draws into `figures/` (links open them); "no data" marks one `figures/`
# does not hold yet.

# %%
entries = pd.DataFrame(
    [{"device": kind, "dtype": dtype_name(dtype), "pick": pick} for (kind, dtype), pick in AUTO_TABLE.items()]
    + [{"device": "other", "dtype": "any", "pick": AUTO_FALLBACK}])
entries = entries.assign(
    policy=entries.pick.map(lambda pick: pick.acc_policy),
    chunking=entries.pick.map(lambda pick: pick.chunking_method
                              + (f", ≥ {pick.min_rows} rows" if pick.min_rows > 1 else "")),
    reason=[AUTO_EVIDENCE[(device, dtype)].why for device, dtype in zip(entries.device, entries.dtype, strict=True)],
    evidence=[AUTO_EVIDENCE[(device, dtype)].figures for device, dtype in zip(entries.device, entries.dtype,
                                                                              strict=True)])
drawn = {stem: (FIGURES_DIR / f"{stem}.png").exists() for stems in entries.evidence for stem in stems}
links = entries.evidence.map(lambda stems: "<br>".join(
    f'<a href="../figures/{html.escape(stem)}.png">{html.escape(stem)}</a>'
    + ("" if drawn[stem] else " (no data)") for stem in stems))
show(entries[["device", "dtype", "policy", "chunking", "reason"]].assign(evidence=links),
     wrap=["reason"], raw_html=["evidence"], name="auto-table")

# %%
verdicts = pareto.verdicts(table)
problems = verdicts.groupby(["device", "dtype"]).size()
Markdown(f"""**Conclusion.** lce's "auto" table has {len(entries) - 1} entries and a fallback, each with its reason
and the figures that carry its evidence: {len(drawn)} figures in all, {sum(drawn.values())} of them drawn in
`figures/` from the committed results. The verdicts below judge {len(problems)} (device, dtype) cases, the entries
and the fallback's fp32 cases, on {span(problems, "d")} problems (input family × shape) each, with
{span(verdicts.seeds, "d")} seeds a problem. The CUDA entries are judged on the runs of
{", ".join(sorted(table[table.device == "cuda"].device_name.unique()))} (TF32 off), which replace the CPU emulation of
lce's CUDA layouts wherever the GPU ran the dtype.

*Inputs:* the table in `lce/planning/policies.py` at this revision; the sweep results
{", ".join(p.name for p in paths)}.

*Limits:* a reason is a claim; only the verdicts and figures test it, on the shapes and machines they cover.""")

# %% [markdown]
# ## Verdicts
# `error` is the worst gradient error in floors; a rival must be no worse on both axes and
# more than 5% better on one to knock the pick off a front (✗ names the strongest rival).

# %%
show(pareto.verdict_summary(verdicts), {"error (floors)": "{:.2f}", "× unfused": "{:.2f}", "peak MiB": "{:.2f}",
                                        "time ms": "{:.1f}"},
     wrap=["memory front", "time front"], wrap_width="32ch", name="verdicts")

# %%
by_entry = nb04_pareto.entry_verdicts(verdicts)
show(by_entry, {"error_low": "{:.2f}", "error_high": "{:.2f}", "error_p95": "{:.2f}", "time_front": "{:.0f}"},
     wrap=["memory_rivals", "time_rivals"], wrap_width="28ch", name="entry-verdicts")

# %%
timed = verdicts[verdicts.device != "cuda-emulated"]
low = verdicts.dtype != "float32"
cpu_low, cpu_fp32 = verdicts[(verdicts.device == "cpu") & low], verdicts[(verdicts.device == "cpu") & ~low]
cuda_low, cuda_fp32 = verdicts[(verdicts.device == "cuda") & low], verdicts[(verdicts.device == "cuda") & ~low]
off_memory = cpu_low[~cpu_low.on_memory_front]
off_time = cpu_fp32[~cpu_fp32.on_time_front]
rival = cuda_low[~cuda_low.on_memory_front]
heads = cuda_low[cuda_low["shape"].map(lambda shape: int(shape.split("x")[2]) >= nb04_pareto.HEAD_MIN_CLASSES)]
slow = cuda_low[~cuda_low.on_time_front]
fp32_slow = cuda_fp32[~cuda_fp32.on_time_front]


def names(rivals):
    return ", ".join(f"`{name}`" for name in sorted(set(rivals)))


def problems_of(rows):
    return ", ".join(f"{row.family} {row.shape}" for row in rows.itertuples())


Markdown(f"""**Conclusion.** {verdicts.on_memory_front.sum()} of {len(verdicts)} auto picks (entry × input family ×
shape) are on the error–memory front in every seed, and {timed.on_time_front.sum()} of the {len(timed)} timed (on the
CPU and the H200) are on the error–time front. Where a pick is off a front, its rival says why:

- CPU, bf16 and fp16 (`accurate`, chunks of at least `CPU_MIN_ROWS` rows): on the time front on all
  {len(cpu_low)} problems. Off the memory front on {len(off_memory)}, beaten only by
  {names(off_memory.memory_dominator)}: the same policy with explicit aspect-ratio chunking, which has no row floor,
  at {span(off_memory.memory_dominator_error)} floors (the pick: {span(off_memory.error)}) with
  {span(off_memory.peak_mib / off_memory.memory_dominator_peak_mib, ".1f")}x less memory. The row floor spends
  memory to stay fast.
- CPU, fp32 (`compact`, at least `CPU_MIN_ROWS` rows): off the memory front on
  {(~cpu_fp32.on_memory_front).sum()} of {len(cpu_fp32)} problems, to the same aspect-ratio spellings
  ({names(cpu_fp32.memory_dominator[~cpu_fp32.on_memory_front])}), and off the time front on {len(off_time)}
  ({problems_of(off_time)}), where torch's op with aspect-ratio chunks ({names(off_time.time_dominator)}) takes
  {span(off_time.time_dominator_ms / off_time.time_ms)}x the pick's time at no higher error.
- CUDA on the H200, bf16 and fp16 (`balanced`): on both fronts at the {len(heads)} LLM heads
  ({problems_of(heads)}). Off the memory front on {len(rival)} of {len(cuda_low)} problems (the
  {rival.family.nunique()} families at {", ".join(sorted(set(rival["shape"])))}, in
  {" and ".join(sorted(set(rival.dtype)))}),
  each time to {names(rival.memory_dominator)}, at {span(rival.memory_dominator_error)} floors (the pick:
  {span(rival.error)}); off the time front on {len(slow)}, to {names(slow.time_dominator)}. At that small shape
  every lce run is bound by its chunk loop's launches ({span(slow.time_ms, ".0f")} ms for the pick), so the time front
  there orders overheads, not arithmetic; at the heads the cost of the pick in time is the next section's subject.
- CUDA on the H200, fp32 (the fallback, `compact`, aspect_ratio:2): on the memory front on
  {cuda_fp32.on_memory_front.sum()} of {len(cuda_fp32)} problems; off the time front on {len(fp32_slow)}, to
  {names(fp32_slow.time_dominator)} ({span(fp32_slow.time_dominator_ms / fp32_slow.time_ms, ".2f")}x the pick's time).

In bf16 and fp16 every pick's worst gradient error is at most {verdicts[low].error.max():.2f} floors (seed
medians; highest 95th percentile over seeds {verdicts[low].error_high.max():.2f}).

*Inputs:* the committed sweep grids: families {families_text(table)} ({seeds_text(table)}); shapes {shapes(table)}
(N×D×C; not every family has every shape); bf16, fp16 and fp32; the CPU ({cpus(table[table.device == "cpu"])}) and
an H200 (CUDA events after warm-up); errors are seed medians; time: median of
{", ".join(map(str, sorted(table.time_repeats.dropna().astype(int).unique())))} repeats on the first seed (memory
and time do not depend on the values). A rival must be no worse on both axes and more than
{pareto.VERDICT_TOLERANCE:.0%} better on one, in a seed, to knock a pick off.

*Limits:* a few small shapes per family; on the H200 one small shape per family and two LLM heads in bf16 only
(random inputs, one seed), and seeds 1–2 only for the random and calibrated families' bf16 and fp32 and the random
fp16 runs; one CPU, and times of one thread on a shared machine; the `trained` family's seeds at N=2048 are the same
inputs (every row of the LM dump).""")

# %% [markdown]
# ## At LLM heads on the H200: what each CUDA configuration costs
# Every lce configuration the GPU grid ran at the two LLM heads (bf16, random inputs, seed 0),
# beside the unfused op: worst gradient error in floors, measured peak extra memory, and
# time (CUDA events, median after warm-up) also as a multiple of the unfused op's.

# %%
costs = nb04_pareto.head_costs(table)
show(costs, {"error": "{:.2f}", "peak_mib": "{:.0f}", "time_ms": "{:.0f}", "vs_unfused_time": "{:.1f}"},
     name="head-costs-cuda")

# %%
pick = costs[costs.pick]
today = nb04_pareto.todays_pick(costs)
fast = costs[costs.run == "lce compact auto acc=fp32"].set_index("shape")
unfused = costs[costs.run == "reference"].set_index("shape")
by_shape = pick.set_index("shape")
Markdown(f"""**Conclusion.** At the LLM heads the CUDA pick (`balanced`, fp32 accumulator) is at
{span(pick.error)} floors, the lowest error but for `accurate` with fp32 acc_dtype, in
{span(pick.peak_mib / unfused.peak_mib.reindex(pick["shape"]).to_numpy(), ".2f")}x the unfused op's memory, and it
pays for that in time: {span(pick.vs_unfused_time, ".0f")}x the unfused op's time, and
{span(by_shape.time_ms / fast.time_ms, ".1f")}x the time of `compact` with an fp32 accumulator, which is at
{span(fast.error)} floors in {span(fast.peak_mib / by_shape.peak_mib, ".2f")}x the pick's memory. The unfused op is
at {span(unfused.error)} floors. The gap is not arithmetic: both run the same GEMMs at the same precision. The code
the H200 ran added each chunk's weight-gradient product into the fp32 (C, D) accumulator a block of about a million
elements at a time, hundreds of small GEMMs per chunk, at the aspect ratio's chunks of a few hundred rows; lce's time
model, which counts those launches and the accumulator's traffic (fitted to the H200's runs, these among them),
puts the pick at {span(by_shape.predicted_ms, ".0f")} ms against {span(by_shape.time_ms, ".0f")} ms measured, and
`compact` at {span(fast.predicted_ms, ".0f")} ms against {span(fast.time_ms, ".0f")} ms. lce now adds that product
with one mixed-precision addmm where the CUDA build has it, else in blocks of 2^26 elements, and the default on CUDA
takes chunks of at least 2048 rows; for that plan ({today.policy.iloc[0]}, {span(today.rows, ".0f")} rows,
{span(today.chunks, ".0f")} chunks) the model predicts {span(today.predicted_ms, ".0f")} ms on the path every build
has (blocked sums, no Triton kernels), {span(today.predicted_vs_unfused, ".1f")}x the unfused op's measured time where
the H200 measured {span(today.measured_pick_vs_unfused, ".0f")}x, and a peak of {span(today.predicted_gib, ".2f")} GiB
where the H200's smaller chunks peaked at {span(today.measured_pick_gib, ".2f")} GiB (its fp32 logits chunk is
larger). That is a prediction until a GPU runs it (`python -m analysis gpu-check`). The error verdict of the "auto"
table stands either way.

*Inputs:* the `cuda` grid's runs at 16384×4096×128256 and 8192×2304×256000 (bf16, random family, seed 0) on
{", ".join(sorted(table[table.device == "cuda"].device_name.unique()))}, torch
{", ".join(sorted(table[table.device == "cuda"].torch_version.unique()))}.

*Limits:* one seed and one family at these shapes; the unfused op's peak is its (N, C) logits and their gradient,
which lce never forms; times of one process on one GPU, after warm-up.""")

# %% [markdown]
# ## Fronts on this CPU (error vs measured peak memory)

# %%
figure = figures["error_vs_memory_cpu"]
display(figure.figure, Markdown(figure.markdown))

# %%
figure = figures["error_vs_memory_cpu_all_shapes"]  # every shape and family measured
display(figure.figure, Markdown(figure.markdown))

# %%
cpu_fronts = nb04_pareto.fronts(table, verdicts, "cpu")
FRONT_FORMATS = {column: "{:.2f}" for column in ("lowest", "pick", "pick_low", "pick_high", "pick_mib",
                                                 "cheapest_mib", "cheapest_error")}
show(cpu_fronts, {**FRONT_FORMATS, "torch": "{:.2f}"}, name="fronts-cpu")

# %%
low, fp32 = cpu_fronts[cpu_fronts.dtype != "float32"], cpu_fronts[cpu_fronts.dtype == "float32"]
beaten = fp32[fp32.pick > fp32.lowest]
above = low[low.cheapest_error > AT_FLOOR]
cpu_bf16, cpu_fp16 = low[low.dtype == "bfloat16"], low[low.dtype == "float16"]
as_accurate = (low.pick <= low.lowest * 1.001).sum()
Markdown(f"""**Conclusion.** On the CPU the auto pick is the most accurate run on every family, shape and
low-precision dtype ({as_accurate} of {len(low)} problems, within 0.1%). In bf16 it is at the rounding floor
({span(cpu_bf16.pick)} floors, 95th percentile over seeds {span(cpu_bf16.pick_high)}); in fp16 at
{span(cpu_fp16.pick)}, the floor at 32 rows and above it where a "mean" gradient over 1024–2048 rows lies largely in
fp16's subnormal range, which lce's fp16 headroom rounds twice. The picks take {span(low.pick_mib, ".1f")} MiB.
torch's best run is above the pick on every problem it ran ({span(low.torch)} floors).
The run needing the least memory of all is above the floor on {len(above)} of {len(low)} problems
({span(above.cheapest_error)} floors at {span(above.cheapest_mib, ".1f")} MiB); between it and the pick,
aspect-ratio chunking without the row floor saves memory at the floor (previous section). In fp32 the pick is the
most accurate run on {len(fp32) - len(beaten)} of {len(fp32)} problems; on the other {len(beaten)}
({problems_of(beaten)}) torch's op has {span(1 - beaten.lowest / beaten.pick, ".0%")} less error.

*Inputs:* the CPU runs of the committed sweep grids ({cpus(table[table.device == "cpu"])}); families
{families_text(table)}; shapes {shapes(table[table.device == "cpu"])} (N×D×C); measured peak memory; seed medians,
the pick with its 5th–95th percentile over seeds.

*Limits:* a few small shapes per family; one CPU.""")

# %% [markdown]
# ## CUDA on the H200 (error vs measured peak memory)

# %%
figure = figures["error_vs_memory_cuda"]
display(figure.figure, Markdown(figure.markdown))

# %%
gpu_fronts = nb04_pareto.fronts(table, verdicts, "cuda")
show(gpu_fronts.drop(columns="torch"), FRONT_FORMATS, name="fronts-cuda")

# %%
bf16, fp16 = gpu_fronts[gpu_fronts.dtype == "bfloat16"], gpu_fronts[gpu_fronts.dtype == "float16"]
gpu_fp32 = gpu_fronts[gpu_fronts.dtype == "float32"]
small = gpu_fronts[(gpu_fronts.dtype != "float32") & (gpu_fronts.pick_mib < 100)]
emulated_verdicts = pareto.verdicts(table[table.device != "cuda"])  # judged on the emulation alone
cuda_fronts = nb04_pareto.fronts(table, emulated_verdicts, "cuda-emulated")  # shown in the emulated section
emulated_fp16_lowest = cuda_fronts.set_index(["family", "dtype", "shape"]).loc[
    [(family, "float16", shape) for family, shape in zip(fp16["family"], fp16["shape"], strict=True)], "lowest"]
Markdown(f"""**Conclusion.** On the H200 in bf16 some run reaches the floor on every problem (lowest error
{span(bf16.lowest)} floors) and the `balanced` pick is at {span(bf16.pick)}; in fp16 no run does: the lowest is
{span(fp16.lowest)} floors, as the emulation of today's code has it on the same problems
({span(emulated_fp16_lowest)}), and the pick is at {span(fp16.pick)}. That is lce's fp16 headroom
(`lce/passes/headroom.py`): with no loss scale, a "mean" gradient over 2048 rows lands largely in fp16's subnormal
range, where the stored scaled gradient and the unscaling multiply round twice.
The least memory costs error: at 2048×128×16384 the cheapest run ({span(small.cheapest_mib, ".1f")} MiB against the
pick's {span(small.pick_mib, ".1f")}) is at {span(bf16[bf16.pick_mib < 100].cheapest_error, ".0f")} floors in bf16
and {span(fp16.cheapest_error, ".0f")} in fp16. In fp32 the fallback needs the least memory of any run on every
problem and is within {(gpu_fp32.pick / gpu_fp32.lowest - 1).max():.0%} of the lowest error.

*Inputs:* the `cuda` grid (TF32 off) on {", ".join(sorted(table[table.device == "cuda"].device_name.unique()))}:
families {families_text(table[table.device == "cuda"])}; shapes {shapes(table[table.device == "cuda"])} (N×D×C);
measured peak memory (CUDA allocator); seed medians, the pick with its 5th–95th percentile over seeds.

*Limits:* one small shape per family, the LLM heads in bf16 on random inputs only; the `trained` family and
calibrated fp16 with one seed; torch 2.11 has no `linear_cross_entropy`, so torch's op is absent.""")

# %% [markdown]
# ## CUDA layouts emulated on CPU tensors, at more shapes (memory from lce's model)
# Judged as the H200's runs would be, on the emulation's own verdicts (the table without the GPU's rows).
# First, how faithful the emulation is: every lce configuration run both emulated and on the
# H200 on the same inputs, each gradient's error on the GPU against its emulated error.

# %%
faithful = nb04_pareto.plot_emulated_vs_real(table)
display(faithful.figure, Markdown(faithful.markdown))
pairs = nb04_pareto.emulated_vs_real(table)
ratios = pd.concat([pairs[f"{grad}_ratio"] for grad in nb04_pareto.GRADIENTS]).dropna()
Markdown(f"""**Conclusion.** The emulation predicts the H200's errors: over {len(pairs)} lce configurations
that ran the same plan on both ({pairs.family.nunique()} families, {pairs.dtype.nunique()} dtypes, seeds
{", ".join(map(str, sorted(pairs.seed.unique())))}) the GPU's gradient error is {ratios.median():.2f}x the emulated one
at the median, {ratios.quantile(0.05):.2f}–{ratios.quantile(0.95):.2f}x for 90% of them and
{ratios.min():.2f}–{ratios.max():.2f}x at the extremes. The verdicts of the emulated section below, at shapes the GPU
did not run, therefore stand for the GPU's errors up to that spread; its memory is lce's model, which the H200
matched within a fraction of a per cent (notebook 03).

*Inputs:* the `cuda` rows (TF32 off) and the `cuda-emulated` rows of the medium grid with the same configuration,
inputs, seed and plan (policy, sums and rows per chunk as run: a call whose "auto" resolves to other chunks today
is another computation), at 2048×128×16384.

*Limits:* one shape; errors only (the emulation's times are the CPU's).""")

# %%
figure = figures["error_vs_memory_cuda-emulated"]
display(figure.figure, Markdown(figure.markdown))

# %%
figure = figures["error_vs_memory_cuda-emulated_all_shapes"]
display(figure.figure, Markdown(figure.markdown))

# %%
show(cuda_fronts.drop(columns="torch"), FRONT_FORMATS, name="fronts-cuda-emulated")

# %%
low, fp32 = cuda_fronts[cuda_fronts.dtype != "float32"], cuda_fronts[cuda_fronts.dtype == "float32"]
fp16_rows = low[low.dtype == "float16"]
few_rows = fp16_rows[fp16_rows["shape"].str.startswith("32×")]
many_rows_fp16 = fp16_rows[~fp16_rows["shape"].str.startswith("32×")]
Markdown(f"""**Conclusion.** On lce's CUDA layouts in bf16 some run reaches the floor on every family and shape, and
in fp16 at 32 rows (lowest error {span(pd.concat([low[low.dtype == "bfloat16"].lowest, few_rows.lowest]))} floors);
in fp16 at 1024 and 2048 rows the lowest is {span(many_rows_fp16.lowest)} floors, the headroom's second rounding of
gradient entries in fp16's subnormal range (a "mean" over that many rows, no loss scale), as on the H200. The
`balanced` pick is at {span(low.pick)} floors (95th percentile over seeds up to {low.pick_high.max():.2f}) for
{span(low.pick_mib, ".1f")} MiB of modeled memory. In
fp32 the fallback needs the least modeled memory of any run on every problem and is within
{(fp32.pick / fp32.lowest - 1).max():.1%} of the lowest error.

*Inputs:* the emulated CUDA runs of the committed sweep grids: lce's CUDA layouts on CPU tensors
({cpus(table[table.device == "cuda-emulated"])}); families {families_text(table)}; shapes
{shapes(table[table.device == "cuda-emulated"])} (N×D×C); lce's modeled memory; seed medians.

*Limits:* emulated (an exact upcast stands in for the mixed-precision GEMM, so only the fp32 summation order differs
from cuBLAS); memory is lce's model; no times; torch's op has no emulated CUDA path.""")

# %% [markdown]
# ## What should fp32 use? (the entries torch's table lacks, ranked from the data)
# Score: mean over shapes of log(cost / best cost) + log(error / best error); lower is better.
# Configurations that compute the same numbers are one choice (listed under "same numbers as").

# %%
show(pareto.choices_summary(table, "float32"), {"score": "{:.2f}", "worst gradient (floors)": "{:.2f}",
                                               "× unfused": "{:.2f}"},
     wrap=["same numbers as"], wrap_width="36ch", name="fp32-choices")

# %%
rankings = nb04_pareto.fp32_rankings(table)
computations = nb04_pareto.fp32_computations(table)
show(rankings, {"score": "{:.2f}", "default's rank": "{:.0f}"}, name="fp32-rankings")

# %%
on_gpu = rankings.device.isin(["cuda", "cuda-tf32"])
exceptions = rankings[(rankings["default's rank"] != 1) & ~on_gpu]
exception = "; ".join(f"{r['ranked by']} on `{r.family}` inputs on {r.device}, where `{r.choice}` (explicit "
                      f"{r.chunking} chunking) scores {r.score:.2f}" for _, r in exceptions.iterrows())
gpu_time = rankings[on_gpu & (rankings["ranked by"] == "time × error")]
Markdown(f"""**Conclusion.** In fp32 the policy does not matter: for every family, device and chunking the
{computations.policies.max()} policies compute bit-identical numbers on every shape and seed, so each choice above
is a tie of spellings. The chunking does. On the CPU and the emulation the current default (`lce auto auto`) is the
first choice in {(~on_gpu).sum() - len(exceptions)} of the {(~on_gpu).sum()} rankings; the
exception{"s are" if len(exceptions) > 1 else " is"} {exception}, ahead of the default: on the CPU the fp32 loss's
default is batch-invariant (docs/using-lce.md), its chunks a fixed 512 rows, so a call of fewer rows (the grids' 32-row
problems) runs one chunk padded to 512, where the aspect ratio's chunks follow N. On the H200 (TF32 off and on)
every time × error ranking puts {names(gpu_time.choice)} (explicit
{", ".join(sorted(set(gpu_time.chunking)))} chunking) first, the default
(aspect_ratio:2, twice the chunks) ranking {span(gpu_time["default's rank"], ".0f")}: with launch-bound chunks, half
as many take less time. The fallback keeps torch 2.13's aspect_ratio:2 for fp32; these rankings rest on one small
shape, where every lce run is launch-bound (previous sections).

*Inputs:* the fp32 lce runs of the committed sweep grids, CPU ({cpus(table[table.device == "cpu"])}), emulated
CUDA and the H200; families {families_text(table)}; shapes {shapes(table)} (N×D×C). Score: mean over shapes and seeds of
log(cost / best cost) + log(error / best error), lower is better; ties: {pareto.TIE_RULE}.

*Limits:* a few small shapes per family, and the score weighs a factor in cost like the same factor in error;
emulated CUDA rows have no time; one CPU; on the H200 one shape per family.""")
