# %% [markdown]
# # 04 · Is each "auto" default on the error–memory and error–time fronts, and what should fp32 use?
#
# For every (device, dtype) entry of lce's "auto" table — plus the entries torch's table
# lacks (CPU fp32, CUDA fp32, which fall back to compact with aspect_ratio:2) — we place the
# auto pick among every measured configuration of the same problem on two Pareto fronts:
# (peak memory, worst gradient error in floors) and (time, error). A verdict says whether
# the pick is on each front and, if not, which configuration dominates it. CPU panels are
# measured on this machine; CUDA panels use lce's CUDA layouts run on CPU tensors (their
# errors are the CUDA path's, their memory is lce's model, their times are not GPU times).
# No data from a real GPU is committed yet; the conclusions say so while it is missing.
# Every verdict is per input family (`random`, `calibrated`, `trained`: notebook 05 describes
# them) and holds only if it holds in every seed of the sweep.

# %%
import html

import pandas as pd
from IPython.display import Markdown, display

from analysis.judge import pareto
from analysis.paths import FIGURES_DIR
from analysis.report import nb04_pareto
from analysis.report.nb02_accuracy import AT_FLOOR, cpus, shapes
from analysis.report.style import families_text, seeds_text
from analysis.report.tables import show, span
from lce.options import dtype_name
from lce.policies import AUTO_FALLBACK, AUTO_TABLE

# %matplotlib inline
paths, table = pareto.load_table()
drawn_here = (nb04_pareto.plot_error_vs_memory(table, "cpu"), nb04_pareto.plot_error_vs_memory_all_shapes(table, "cpu"),
              nb04_pareto.plot_error_vs_memory(table, "cuda-emulated"),
              nb04_pareto.plot_error_vs_memory_all_shapes(table, "cuda-emulated"))
figures = {figure.stem: figure for figure in drawn_here if figure is not None}  # draws, measures nothing
print("data:", ", ".join(p.name for p in paths), "| devices:", ", ".join(sorted(table.device.unique())))

# %% [markdown]
# ## The "auto" table, the reason recorded for each entry, and its evidence
# Evidence names the figures `python -m analysis figures` draws into `figures/` (links open
# them); "no data" marks one `figures/` does not hold yet.

# %%
entries = pd.DataFrame(
    [{"device": kind, "dtype": dtype_name(dtype), "pick": pick} for (kind, dtype), pick in AUTO_TABLE.items()]
    + [{"device": "other", "dtype": "any", "pick": AUTO_FALLBACK}])
entries = entries.assign(
    policy=entries.pick.map(lambda pick: pick.acc_policy),
    chunking=entries.pick.map(lambda pick: pick.chunking_method
                              + (f", ≥ {pick.min_rows} rows" if pick.min_rows > 1 else "")),
    reason=entries.pick.map(lambda pick: pick.reason),
    evidence=entries.pick.map(lambda pick: pick.evidence))
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
{span(verdicts.seeds, "d")} seeds a problem. No sweep on a real GPU is committed, so the CUDA entries are judged on
lce's CUDA layouts emulated on CPU tensors.

*Inputs:* the table in `lce/policies.py` at this revision; the sweep results {", ".join(p.name for p in paths)}.

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
cuda_low, cuda_fp32 = (verdicts[(verdicts.device == "cuda-emulated") & low],
                       verdicts[(verdicts.device == "cuda-emulated") & ~low])
off_memory = cpu_low[~cpu_low.on_memory_front]
off_time = cpu_fp32[~cpu_fp32.on_time_front]
rival = cuda_low[~cuda_low.on_memory_front]


def names(rivals):
    return ", ".join(f"`{name}`" for name in sorted(set(rivals)))


def problems_of(rows):
    return ", ".join(f"{row.family} {row.shape}" for row in rows.itertuples())


Markdown(f"""**Conclusion.** {verdicts.on_memory_front.sum()} of {len(verdicts)} auto picks (entry × input family ×
shape) are on the error–memory front in every seed, and {timed.on_time_front.sum()} of the {len(timed)} timed on the
CPU are on the error–time front. Where a pick is off a front, its rival says why:

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
- Emulated CUDA, bf16 and fp16 (`balanced`): off the memory front on {len(rival)} of {len(cuda_low)} problems, each
  time to {names(rival.memory_dominator)}, which reaches {span(rival.memory_dominator_error)} floors (the pick:
  {span(rival.error)}) in no more modeled memory. That rival runs every GEMM in fp32, whose cost in time only a run
  on a GPU can measure; the emulation is not timed, so this trade stays open.
- Emulated CUDA, fp32 (the fallback, `compact`): on the memory front on {cuda_fp32.on_memory_front.sum()} of
  {len(cuda_fp32)} problems.

In bf16 and fp16 every pick's worst gradient error is at most {verdicts[low].error.max():.2f} floors (seed
medians; highest 95th percentile over seeds {verdicts[low].error_high.max():.2f}).

*Inputs:* the committed sweep grids: families {families_text(table)} ({seeds_text(table)}); shapes {shapes(table)}
(N×D×C; not every family has every shape); bf16, fp16 and fp32; the CPU ({cpus(table[table.device == "cpu"])}) and
lce's CUDA layouts emulated on CPU tensors; errors are seed medians; time: median of
{", ".join(map(str, sorted(table.time_repeats.dropna().astype(int).unique())))} repeats on the first seed (memory
and time do not depend on the values). A rival must be no worse on both axes and more than
{pareto.VERDICT_TOLERANCE:.0%} better on one, in a seed, to knock a pick off.

*Limits:* a few small shapes per family; the emulated CUDA rows use an exact upcast for the mixed-precision GEMM
(only the fp32 summation order differs from cuBLAS), their memory is lce's model and they are not timed; one CPU,
and times of one thread on a shared machine; the `trained` family's seeds at N=2048 are the same inputs (every row
of the LM dump).""")

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
Markdown(f"""**Conclusion.** On the CPU in bf16 and fp16 the auto pick is at the rounding floor on every family and
shape, so no run is more accurate: {span(low.pick)} floors (95th percentile over seeds {span(low.pick_high)}), for
{span(low.pick_mib, ".1f")} MiB. torch's best run is above it on every problem it ran ({span(low.torch)} floors).
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
# ## CUDA layouts (emulated on CPU tensors; memory from lce's model)

# %%
figure = figures["error_vs_memory_cuda-emulated"]
display(figure.figure, Markdown(figure.markdown))

# %%
figure = figures["error_vs_memory_cuda-emulated_all_shapes"]
display(figure.figure, Markdown(figure.markdown))

# %%
cuda_fronts = nb04_pareto.fronts(table, verdicts, "cuda-emulated")
show(cuda_fronts.drop(columns="torch"), FRONT_FORMATS, name="fronts-cuda-emulated")

# %%
low, fp32 = cuda_fronts[cuda_fronts.dtype != "float32"], cuda_fronts[cuda_fronts.dtype == "float32"]
Markdown(f"""**Conclusion.** On lce's CUDA layouts in bf16 and fp16 some run reaches the floor on every family and
shape (lowest error {span(low.lowest)} floors), while the `balanced` pick is at {span(low.pick)} floors (95th
percentile over seeds up to {low.pick_high.max():.2f}) for {span(low.pick_mib, ".1f")} MiB of modeled memory. In
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
exceptions = rankings[rankings["default's rank"] != 1]
exception = "; ".join(f"{r['ranked by']} on `{r.family}` inputs on {r.device}, where `{r.choice}` (explicit "
                      f"{r.chunking} chunking) scores {r.score:.2f}" for _, r in exceptions.iterrows())
Markdown(f"""**Conclusion.** In fp32 the policy does not matter: for every family, device and chunking the
{computations.policies.max()} policies compute bit-identical numbers on every shape and seed, so each choice above
is a tie of spellings. The chunking does: the current default (`lce auto auto`) is the first choice in
{len(rankings) - len(exceptions)} of the {len(rankings)} rankings; the exception is {exception}, ahead of the default.

*Inputs:* the fp32 lce runs of the committed sweep grids, CPU ({cpus(table[table.device == "cpu"])}) and emulated
CUDA; families {families_text(table)}; shapes {shapes(table)} (N×D×C). Score: mean over shapes and seeds of
log(cost / best cost) + log(error / best error), lower is better; ties: {pareto.TIE_RULE}.

*Limits:* a few small shapes per family, and the score weighs a factor in cost like the same factor in error;
emulated CUDA rows have no time; one CPU.""")
