# %% [markdown]
# # 09 · Native or emulated: does this CPU run bf16 GEMMs fast, and do lce's plans and `lce.recommend` know?
#
# A bf16 or fp16 GEMM on a CPU is fast only where torch's oneDNN back end has kernels for the CPU's
# instruction set: AVX512-BF16 or AMX for bf16. Elsewhere -- AVX2-only CPUs, common among cloud VMs,
# laptops and older servers -- torch falls back to a generic loop, and a layout chosen *because* its
# bf16 GEMMs are fast becomes the slowest one. lce decides which kind of CPU it runs on
# (`lce.planning.cpu_gemms`: the CPU's flags, else a one-thread timed check, once per process and dtype), prints it in
# every plan, runs
# the GEMMs a layout would emulate in fp32 instead, and feeds it to `lce.recommend`'s time model.
# This notebook shows, from `python -m analysis cpu-kinds` (run natively and with the AVX2 stand-in:
# this machine's oneDNN, MKL and ATen limited to AVX2, which makes it emulate bf16 and fp16 as an
# AVX2-only part does), how far apart the kinds are, whether the verdict holds at every thread count and
# load (`python -m analysis cpu-probe`), and whether `lce.recommend` picks the fast options on each.

# %%
from IPython.display import Markdown

from analysis.core.results_io import CPU_GEMM_PROBE, CPU_GEMM_RATES, RECOMMEND_CHECK, load_kind
from analysis.paths import RESULTS_DIR
from analysis.report import nb09_cpu_kinds
from analysis.report.tables import show, span
from analysis.studies.cpu_probe import EARLIER_METHOD, THIS_METHOD
from lce.planning.cpu_gemms import EMULATED_SLOWDOWN

# %matplotlib inline
(rate_paths, rates), (check_paths, check), (probe_paths, probe) = (
    load_kind(RESULTS_DIR, kind.name) for kind in (CPU_GEMM_RATES, RECOMMEND_CHECK, CPU_GEMM_PROBE))
figures = {figure.stem: figure
           for figure in nb09_cpu_kinds.draw_cpu_kind_figures(rates, check, probe)}  # measures nothing
print("data:", ", ".join(path.name for path in [*rate_paths, *check_paths, *probe_paths]))

# %% [markdown]
# ## How far apart the kinds are
# The rate of one 512x512x8192 product per dtype, and what lce's own check (a 64x256x256 product on
# one thread, the best of five interleaved rounds, where the CPU's flags do not decide) concluded on the
# same machine.

# %%
figures["cpu_gemm_rates"].figure

# %%
numbers = nb09_cpu_kinds.rate_numbers(rates)
show(numbers, {"fp32_gflops": "{:.0f}", "bf16_over_fp32": "{:.3g}", "fp16_over_fp32": "{:.3g}",
               "bf16_probe_slowdown": "{:.3g}", "fp16_probe_slowdown": "{:.3g}",
               "probe_cost_s": lambda v: f"{v * 1e3:.0f} ms"},
     name="cpu-gemm-rates", caption="Per CPU kind (latest run): rates over fp32's at 512x512x8192, "
                                    "lce.planning.cpu_gemms' "
                                    "verdicts, its probe's slowdown per dtype and what the two probes cost")

# %%
native, emulated = numbers[numbers["bf16"] == "native"], numbers[numbers["bf16"] == "emulated"]
probe_native = numbers[["bf16_probe_slowdown", "fp16_probe_slowdown"]].where(numbers[["bf16", "fp16"]].eq(
    "native").to_numpy()).max().max()
probe_emulated = numbers[["bf16_probe_slowdown", "fp16_probe_slowdown"]].where(numbers[["bf16", "fp16"]].eq(
    "emulated").to_numpy()).min().min()
Markdown(f"""**Conclusion.** Where bf16 GEMMs are native they run at {span(native["bf16_over_fp32"], ".2g")}× fp32's
rate; where they are emulated at {span(emulated["bf16_over_fp32"], ".2g")}× it, about
{1 / emulated["bf16_over_fp32"].max():.0f} times slower than fp32. fp16 runs at
{numbers["fp16_over_fp32"].max():.2g}× fp32's rate at best, never meaningfully faster, which is why lce computes fp16
GEMMs in fp32 on every CPU. lce's small probe separates the kinds by a wide margin: its slowest native dtype took
{probe_native:.2g}× fp32's time, its fastest emulated one {probe_emulated:.0f}×, on either side of the
{EMULATED_SLOWDOWN:g}× threshold, and both probes together cost {numbers["probe_cost_s"].max() * 1e3:.0f} ms at most,
once per process.

*Inputs:* one 512x512x8192 product per dtype, best of 3 after a warm-up, {int(rates["num_threads"].max())} intra-op
thread(s), CPUs
{", ".join(numbers["cpu_kind"])} (`python -m analysis cpu-kinds [--avx2-stand-in]`).

*Limits:* the emulating kinds are {" and ".join(emulated["cpu_kind"])}: the Xeon's AVX2 stand-in runs its fp32 GEMMs
on wider cores than an AVX2-only CPU has; a CPU without bf16 instructions is judged by its flags and runs no probe
(its probe column is empty); the rates are of one shape on a shared 2-core machine.""")

# %% [markdown]
# ## Is the verdict the same at every thread count and under load?
# The verdict decides how every bf16 plan runs, so it must not depend on what else the machine does.
# lce's earlier probe timed the 64x256x256 product at torch's thread count; on an AVX2-only EPYC under
# `pytest -n auto` it called emulated bf16 native, and the suite's results with it. Here each thread
# count and load (idle, or one spinning process per core) gets three fresh processes, each deciding with
# lce's method and with the earlier probe, natively and under the AVX2 stand-in.

# %%
figures["cpu_gemm_probe"].figure

# %%
verdicts = nb09_cpu_kinds.probe_numbers(probe)
show(verdicts.drop(columns=["date"]), {"slowdown_min": "{:.3g}", "slowdown_max": "{:.3g}",
                                       "probe_s_max": lambda v: f"{v * 1e3:.0f} ms"},
     name="cpu-gemm-probe", caption="Per CPU kind, method and dtype: fresh processes, their verdicts, conditions "
                                    "(thread count x load) whose processes disagreed, the slowdowns' range and the "
                                    "longest decision")

# %%
ours, earlier = verdicts[verdicts["method"] == THIS_METHOD], verdicts[verdicts["method"] == EARLIER_METHOD]
stand_in = earlier[earlier["cpu_kind"].str.contains("stand-in")]
ours_native = ours[ours["native"] > 0]
ours_emulated = ours[ours["emulated"] > 0]
Markdown(f"""**Conclusion.** lce's verdict was unanimous for each CPU kind and dtype: {int(ours["processes"].max())}
fresh processes each, over {int(ours["conditions"].max())} conditions (1 and {int(probe["threads"].max())} threads,
idle and every core busy), natively and under the stand-in. Its slowdowns stayed on their side of the
{EMULATED_SLOWDOWN:g}× threshold with room to spare: at most {ours_native["slowdown_max"].max():.2g}× where native, at
least {ours_emulated["slowdown_min"].min():.0f}× where emulated. The earlier probe, on the same processes, called the
stand-in's emulated bf16 and fp16 native in {int(stand_in["native"].max())} of {int(stand_in["processes"].max())}
processes, every one of them in the condition {" and ".join(sorted(set(stand_in["native_conditions"])))}, at
{stand_in.loc[stand_in["native"] > 0, "slowdown_min"].min():.2g}× fp32's time: the busy core stalls the small
two-thread fp32 product, not the emulated one. lce's check decided within {ours["probe_s_max"].max() * 1e3:.0f} ms per
dtype.

*Inputs:* a 64x256x256 product per method and dtype, {int(probe["process"].max()) + 1} fresh processes per thread count
and load, CPUs {", ".join(sorted(ours["cpu_kind"].unique()))} (`python -m analysis cpu-probe [--avx2-stand-in]`).

*Limits:* the emulating kind is a stand-in (this Xeon with its back ends capped at AVX2); on a real AVX2-only CPU the
flags decide before anything is timed, so this check is the fallback for capped back ends and unknown CPUs. A
2-core machine: "every core busy" means both cores.""")

# %% [markdown]
# ## Does `lce.recommend` pick the fast options on each kind?
# For three shapes (bf16) and three budgets, recommend's pick from its models is timed in one process,
# in interleaved rounds, beside the pick of `measure=True`, the feasible alternatives its time model
# ranks best per policy, and -- where bf16 is emulated -- the pick a model that assumed native bf16
# GEMMs would make, run as that model assumed (the CPU's own bf16 kernel).

# %%
figures["recommend_check"].figure

# %%
picks = nb09_cpu_kinds.recommend_numbers(check)
show(picks, {"pick_time_s": "{:.3g}", "pick_over_fastest": "{:.2f}", "measured_pick_over_fastest": "{:.2f}"},
     name="recommend-check", caption="Per CPU kind, shape and budget: recommend's pick, its median time and its time "
                                     "over the fastest option set timed in the same run")

# %%
blind = nb09_cpu_kinds.blind_numbers(check)
show(blind, {"blind_time_s": "{:.3g}", "blind_estimate_s": "{:.3g}", "pick_time_s": "{:.3g}",
             "blind_over_pick": "{:.1f}"}, name="blind-picks",
     caption="Where bf16 is emulated: the capability-blind pick's time over lce's pick; measured where its estimate "
             "from the GEMM rates was under 20 s per call, else that estimate")

# %%
per_kind = picks.groupby("cpu_kind")["pick_over_fastest"]
measured_blind, estimated_blind = blind[blind["timing"] == "measured"], blind[blind["timing"] != "measured"]
overshoot = nb09_cpu_kinds.estimate_overshoot(blind)
Markdown(f"""**Conclusion.** On every CPU kind measured, recommend's pick from its models alone ran within
{per_kind.max().max():.2f}× of the fastest option set timed beside it (median {picks["pick_over_fastest"].median():.2f}×
over {len(picks)} shape and budget problems); with `measure=True` it was within
{picks["measured_pick_over_fastest"].max():.2f}×. Where bf16 is emulated, the pick a capability-blind model makes --
balanced's or compact's bf16 GEMMs on the CPU's own kernel -- took {measured_blind["blind_over_pick"].min():.1f}–
{measured_blind["blind_over_pick"].max():.0f}× the time of lce's pick where it was timed ({len(measured_blind)}
problems), and an estimated {estimated_blind["blind_over_pick"].min():.0f}–
{estimated_blind["blind_over_pick"].max():.0f}× at the larger shapes, where one call would take minutes. The estimate
overshot the measurement by up to {overshoot:.1f}× where both exist (it takes the emulated rate of one
512x512x8192 product, and the blocks' smaller products run faster there), so even discounted by that factor
the blind picks are at least {estimated_blind["conservative_over_pick"].min():.0f}× slower: the cliff the
capability keeps plans from.

*Inputs:* bf16, random inputs, shapes {", ".join(dict.fromkeys(f"{r.N}x{r.D}x{r.C}" for r in check.itertuples()))},
budgets lce auto's peak and 1.5x and 1.1x the gradients' bytes; {int(check["repeats"].max())} interleaved rounds after a
warm-up, one forward + backward each, {int(check["num_threads"].max())} intra-op thread(s)
(`python -m analysis cpu-kinds [--avx2-stand-in]`).

*Limits:* "fastest" is the fastest of what was timed, not of every candidate; one thread on a shared 2-core machine
(two threads wait on each other whenever the other core is busy), which times within roughly ±15% from run to run, so
ratios below about 1.15 do not separate options.""")
