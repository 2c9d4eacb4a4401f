# %% [markdown]
# # 02 · Accuracy against fp64: what does each precision policy buy, in rounding floors?
#
# Every error here is measured against fp64 computed from the *same rounded inputs* the
# low-precision run sees, and reported as a multiple of its rounding floor: the error of the
# exact answer merely rounded to the output dtype, the best any implementation can return
# (1.0). We read the committed quick grid for errors per dtype and policy, then measure on
# the spot how the weight-gradient error grows with the number of chunks (with a fitted power
# law), lce next to torch 2.13's native op with the same options, and finally two defects of
# torch's op shown with numbers: the bf16 loss drifting with the chunk count, and NaN
# gradients on an all-ignored batch.

# %%
import os

import pandas as pd
import torch
from IPython.display import Markdown, display

from analysis.core.families import RANDOM_LOGIT_SCALE
from analysis.core.problem import Shape
from analysis.core.provenance import cpu_model
from analysis.judge import pareto
from analysis.report import nb02_accuracy
from analysis.report.nb02_accuracy import AT_FLOOR, GROWTH_EXPONENT, cpus, shapes
from analysis.report.style import families_text, seeds_text
from analysis.report.tables import show, span
from analysis.studies import defects, growth

# %matplotlib inline
QUICK = os.environ.get("LCE_QUICK", "1") == "1"
CPU = cpu_model()  # the studies below measure on this machine; the grid's rows carry their own provenance
TORCH = torch.__version__.split("+")[0]
RANDOM = (f"`random` inputs (x ~ N(0, 1), W ~ N(0, {RANDOM_LOGIT_SCALE**2:g}/D), b ~ N(0, 1), uniform targets; "
          "notebook 05 describes every family)")
paths, table = pareto.load_table()
print("data:", ", ".join(p.name for p in paths), f"({len(table)} runs)")

# %% [markdown]
# ## Errors per family, dtype and policy (committed grids, CPU, default chunking)
# Median over shapes and seeds of the loss error and of the worst gradient error, in floors, per
# input family (notebook 05 describes the families).
# `acc_dtype=default` follows the options contract: fp32 accumulation only under
# `acc_policy="auto"`; an explicit policy without `acc_dtype` accumulates in the input dtype.

# %%
runs = table[(table.device == "cpu") & table.op.isin(["lce", "torch"]) & (table.chunking == "auto")]
medians = runs.groupby(["family", "dtype", "policy", "acc_dtype", "op"])[["loss_fro_in_floors", pareto.ERROR]].median()
medians = medians.unstack("op").sort_index(axis="columns", level="op")
medians.columns = [f"{op}: {'loss' if column == 'loss_fro_in_floors' else 'worst gradient'}"
                   for column, op in medians.columns]
show(medians.reset_index(), {column: "{:.2f}" for column in medians.columns}, name="errors-per-policy")

# %%
errors = nb02_accuracy.policy_errors(table)
low = errors[errors.dtype != "float32"]  # bf16 and fp16
worst, loss = nb02_accuracy.error_ranges(low), nb02_accuracy.error_ranges(low, "loss_fro_in_floors")
bf16, fp16 = (nb02_accuracy.error_ranges(errors[errors.dtype == dtype]) for dtype in ("bfloat16", "float16"))
explicit = worst.loc[["lce accurate", "lce balanced", "lce compact"]]
fp32 = nb02_accuracy.error_ranges(errors[errors.dtype == "float32"], pareto.VS_UNFUSED)
fp32_floors = nb02_accuracy.error_ranges(errors[errors.dtype == "float32"])
fp16_errors = errors[(errors.dtype == "float16") & (errors.setting == "lce default")]
fp16_default, few_rows = fp16_errors[pareto.ERROR], fp16_errors["N"] == 32
Markdown(f"""**Conclusion.** In bf16 lce's default options return the exact answer rounded once: on every input
family and shape the seed median of their worst gradient error is at most {bf16.high['lce default']:.2f} floors
(every 95th percentile over seeds below {AT_FLOOR:g}), and in bf16 and fp16 their loss at most
{loss.high['lce default']:.2f}. In fp16 their gradients are at the floor at 32 rows
({span(fp16_default[few_rows])}) and at {span(fp16_default[~few_rows])} floors at 1024–2048 rows, where a "mean"
gradient lies largely in fp16's subnormal range and lce's fp16 headroom rounds it twice (`lce/passes/headroom.py`: the
price of keeping it for a loss scale, which lifts it out of that range).
torch {TORCH}'s defaults have a larger worst gradient error than lce's on every family, dtype and shape,
{worst.low['torch default']:.2f}–{worst.high['torch default']:.2f} floors, and their loss reaches
{loss.high['torch default']:.2f} floors (95th percentile {loss.p95['torch default']:.2f}). An explicit lce policy
without `acc_dtype` computes in the input dtype and costs {explicit.low.min():.2f}–{explicit.high.max():.2f}
floors, more than the default everywhere. With `acc_dtype=float32`, `accurate` returns the default's numbers
again ({bf16.high['lce accurate, acc fp32']:.2f} in bf16), while `balanced` and `compact`, which run the same
layout on the CPU and return the same numbers, reach
{bf16.low['lce balanced, acc fp32']:.2f}–{bf16.high['lce balanced, acc fp32']:.2f} floors in bf16 and
{fp16.high['lce balanced, acc fp32']:.2f} in fp16. In fp32 the floor is out of reach for every
setting (lowest seed median {fp32_floors.low.min():.2f} floors); measured against the unfused fp32 computation on
the same inputs, whose GEMMs sum in fp32 too, lce's default is at {fp32.low['lce default']:.2f}–
{fp32.high['lce default']:.2f}x its error, never above it, and torch's default at up to
{fp32.high['torch default']:.2f}x.

*Inputs:* the committed sweep grids, CPU runs only ({cpus(runs)}), default ("auto") chunking; families
{families_text(runs)} ({seeds_text(runs)}); shapes {shapes(runs)} (N×D×C; not every family has every shape);
bf16, fp16 and fp32; error = Frobenius error in rounding floors of the same-dtype exact answer; numbers are
ranges over families and shapes of seed medians.

*Limits:* a few small shapes per family, so a range hides which shape is worst (the table and the figure below
show every one); one CPU; the `trained` family at N=2048 takes every row of the LM dump, so its seeds are the
same inputs and its intervals have zero width; CPU layouts only (the CUDA layouts are in notebook 04).""")

# %% [markdown]
# ## Growth with the number of chunks, and a fitted law
# bf16 input, explicit chunk counts, `acc_dtype=float32`. On the CPU layouts lce's
# accurate policy sums the weight gradient in fp32 and rounds once; compact runs the
# balanced layout there (the options contract), so the growth of a per-chunk-rounding policy
# is shown on the CUDA layouts (run on CPU tensors with an exact stand-in for the
# mixed-precision GEMM). The fit is `error ≈ prefactor × chunks^exponent`.

# %%
shape, counts = nb02_accuracy.QUICK_GROWTH if QUICK else (Shape(2048, 256, 8192), (1, 2, 4, 8, 16, 32, 64, 128, 256))
growth_runs = pd.concat([growth.chunk_growth(shape, "bfloat16", chunk_counts=counts, device=device)
                         for device in ("cpu", "cuda-emulated")], ignore_index=True)
layouts = {"cpu": "CPU", "cuda-emulated": "emulated CUDA"}
fits = pd.concat([growth.fit_power_law(rows).assign(layouts=layouts[device])
                  for device, rows in growth_runs.groupby("device", sort=True)], ignore_index=True)
show(fits[["layouts", "impl", "policy", "exponent", "prefactor", "at_max_chunks"]]
     .rename(columns={"at_max_chunks": f"floors at {counts[-1]} chunks"}),
     {"exponent": "{:.2f}", "prefactor": "{:.2f}", f"floors at {counts[-1]} chunks": "{:.2f}"}, name="growth-fits")

# %%
figure = nb02_accuracy.plot_error_vs_chunks(table, "cpu")  # the function `python -m analysis figures` calls
display(figure.figure, Markdown(figure.markdown))

# %%
growing = fits[nb02_accuracy.grows(fits)]
flat = fits[~nb02_accuracy.grows(fits) & (fits.impl == "lce")]
compact = growing[growing.impl == "lce"].iloc[0]
torch_growth = growing[growing.impl == "torch"]
accurate = fits[(fits.impl == "lce") & (fits.policy == "accurate")]
Markdown(f"""**Conclusion.** Rounding the weight gradient once per chunk makes its error grow with the chunk count;
summing in fp32 and rounding once does not. On the emulated CUDA layouts lce's `{compact.policy}`, which has no
(C, D) fp32 accumulator there and rounds into the bf16 weight gradient once per chunk, grows as
chunks^{compact.exponent:.2f}, to {compact.at_max_chunks:.2f} floors at {counts[-1]} chunks. torch {TORCH}'s op
grows the same way under every policy on the CPU, although it was asked for `acc_dtype=float32` (exponent
{span(torch_growth.exponent)}, {span(torch_growth.at_max_chunks)} floors at {counts[-1]} chunks). Every other lce
series is flat (|exponent| at most {flat.exponent.abs().max():.2f}; above {GROWTH_EXPONENT} counts as growth):
`accurate` stays at {accurate.at_max_chunks.max():.2f} floors on both layout tables, `balanced` at most
{flat[flat.policy == "balanced"].at_max_chunks.max():.2f}.

*Inputs:* {RANDOM}, seed 0; shape {shape.N}×{shape.D}×{shape.C} (N×D×C); bf16 with `acc_dtype=float32`;
chunk counts {", ".join(map(str, counts))} (explicit rows per chunk); measured on {CPU} when the notebook
executed: the CPU layouts, and lce's CUDA layouts run on CPU tensors with an exact upcast standing in for the
mixed-precision GEMM.

*Limits:* one seed and one shape: the exponents are least-squares fits to {len(counts)} points, a description of
this run, not a law; the CUDA series are emulated (only the fp32 summation order differs from cuBLAS), and
torch's op has no emulated CUDA path, so it is measured on the CPU only.""")

# %% [markdown]
# ## Defect 1 — the loss drifts with the chunk count (bf16, default options)
# Distance of the returned loss from the exact one, in bf16 ulps at the exact loss, the worst
# over three seeds; lce sums the loss in fp64 across chunks and rounds once.

# %%
drift_shape, drift_counts, seeds = (nb02_accuracy.QUICK_DRIFT if QUICK else
                                    (Shape(2048, 256, 8192), (1, 4, 16, 64, 256), (0, 1, 2)))
drift = pd.concat([defects.loss_drift(drift_shape, "bfloat16", drift_counts, seed=seed) for seed in seeds],
                  ignore_index=True)
worst_drift = nb02_accuracy.worst_drift(drift)
show(worst_drift.reset_index().rename(columns={"lce": "lce (ulps)", "torch": "torch (ulps)"}),
     {"lce (ulps)": "{:.2f}", "torch (ulps)": "{:.2f}"}, name="loss-drift")

# %%
exact = drift.exact_loss.median()
beyond = worst_drift.index[worst_drift.torch > 1]
Markdown(f"""**Conclusion.** lce's bf16 loss is correctly rounded at every chunk count: at most
{worst_drift.lce.max():.2f} ulps from the exact loss (0.5 or less is the nearest bf16 number), because it sums
across chunks in fp64 and rounds once. torch {TORCH}'s loss is {worst_drift.torch.iloc[0]:.2f} ulps off with
{worst_drift.index[0]} chunk and {worst_drift.torch.iloc[-1]:.2f} with {worst_drift.index[-1]}, more than one
ulp at {" and ".join(map(str, beyond))} chunks (worst over {drift.seed.nunique()} seeds; every count in the table).

*Inputs:* {RANDOM}, seeds {", ".join(map(str, sorted(drift.seed.unique())))}; shape
{drift_shape.N}×{drift_shape.D}×{drift_shape.C} (N×D×C); bf16; default options with explicit chunk counts
{", ".join(map(str, drift_counts))}; measured on {CPU} when the notebook executed; ulps of bf16 at the exact
(fp64) loss.

*Limits:* one shape and {drift.seed.nunique()} seeds; the CPU path of torch's op (its CUDA path may sum
differently). One bf16 ulp at this loss ({exact:.2f} nats) is {defects.ulp(exact, torch.bfloat16):.4f} nats: small
for training, large for a reference.""")

# %% [markdown]
# ## Defect 2 — an all-ignored batch
# Every target equals `ignore_index`: the reference gives a NaN "mean" loss (0/0) and zero
# gradients; a NaN gradient would poison the optimizer step.

# %%
ignored = defects.all_ignored_gradients()
shown = ignored.assign(loss=ignored.loss.map(lambda value: f"{value:.3g}".replace("nan", "NaN (0/0)")))
show(shown[["impl", "loss", "grad_input_nan_entries", "grad_weight_nan_entries", "grad_bias_nan_entries",
            "max_abs_finite_grad"]]
     .rename(columns={"grad_input_nan_entries": "NaN in grad_input", "grad_weight_nan_entries": "NaN in grad_weight",
                      "grad_bias_nan_entries": "NaN in grad_bias", "max_abs_finite_grad": "largest finite |grad|"}),
     {"largest finite |grad|": "{:.3g}"}, name="all-ignored")

# %%
nans = nb02_accuracy.nan_gradients(ignored).set_index("impl")
Markdown(f"""**Conclusion.** With every target ignored, the mean loss is 0/0, NaN, for all three ops, as it must
be. lce returns gradients that are all zero, like the reference; torch {TORCH}'s op returns NaN in
{nans.nan['torch']:,} of its {nans.entries['torch']:,} gradient entries, every one of them, which would poison an
optimizer step.

*Inputs:* {RANDOM} with every target set to `ignore_index`; shape {shapes(ignored)} (N×D×C); float32;
`reduction="mean"`; lce and torch with default options and {int(ignored.chunk_rows.max())}-row chunks; measured on
{CPU} when the notebook executed.

*Limits:* one shape, one dtype and one reduction; the CPU path of torch's op.""")
