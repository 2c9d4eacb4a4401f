# %% [markdown]
# # 01 · fp64: are lce's gradients the derivatives of its loss, and is every path exact?
#
# In fp64 rounding is negligible, so any disagreement between a chunked path and the plain
# reference formula `cross_entropy(linear(x, W, b), y)` would be a bug in the algebra, not
# noise. This notebook checks every chunked lce path (policy × chunking × reduction, with
# bias, class weights, ignore_index and label smoothing rotated through them, on the CPU and
# the CUDA layout tables) two ways: `torch.autograd.gradcheck` compares lce's analytic
# gradients with finite differences of its own loss, and a parity table gives the largest
# error of the loss and of each gradient against the reference path. The same table is
# computed for torch 2.13's native chunked op on the same inputs and options.

# %%
import os

from IPython.display import Markdown

from analysis.core.provenance import cpu_model
from analysis.report import nb01_gradcheck
from analysis.report.tables import check, details, show
from analysis.studies import fp64_checks

QUICK = os.environ.get("LCE_QUICK", "1") == "1"  # quick: CPU layouts and two chunkings; else both layout tables
cases = fp64_checks.path_cases(quick=QUICK)
CPU = cpu_model()
print(f"{len(cases)} chunked paths on {CPU}")

# %% [markdown]
# ## gradcheck on every path
# Shape 7 × 3 against 5 classes: tiny, so finite differences over every input entry stay fast.

# %%
gradchecks = fp64_checks.gradcheck_table(cases)
show(gradchecks[["device_kind", "policy", "chunking", "reduction", "features", "gradcheck"]]
     .rename(columns={"device_kind": "layouts"}), {"gradcheck": check}, name="gradcheck")

# %%
gradcheck = nb01_gradcheck.gradcheck_numbers(gradchecks)
Markdown(f"""**Conclusion.** `torch.autograd.gradcheck` (fp64 finite differences) passed on {gradcheck.passed} of
{gradcheck.paths} chunked paths: lce's analytic gradients are the derivatives of its own loss, whatever the
policy, chunking, reduction and optional features.

*Inputs:* every policy × chunking × reduction of the quick set on the {gradcheck.layouts} layout table(s), with
bias, class weights, ignore_index and label smoothing rotated through them; {fp64_checks.INPUTS_DESCRIPTION};
shape {gradcheck.shape} (N×D×C), float64; run on {CPU} when the notebook executed.

*Limits:* one tiny shape and one seed (`LCE_QUICK=0` adds the CUDA layout table and a third chunking).
gradcheck shows that the gradients are those of lce's loss, not that the loss is right: the next section
compares the loss itself with the reference.""")

# %% [markdown]
# ## Largest error against the reference path, lce and torch
# Each entry is `max |value − ref| / max |ref|` for that output, the worst over every path;
# torch's is over the paths where its chunked op ran (it does not chunk label smoothing and
# falls back to its reference path). The per-path table is folded below the summary.

# %%
parity = fp64_checks.parity_table(cases)
bound = f"within {fp64_checks.PARITY_TOLERANCE:.0e}"
summary = fp64_checks.parity_summary(parity).rename(columns={
    "lce_worst": "worst lce error", "torch_worst": "worst torch error (chunked paths)",
    "lce_ok": f"lce {bound}", "torch_ok": f"torch {bound}"})
show(summary, {"worst lce error": "{:.1e}", "worst torch error (chunked paths)": "{:.1e}",
               f"lce {bound}": check, f"torch {bound}": check}, name="parity-summary")

# %%
by_path = fp64_checks.parity_by_path(parity).rename(columns={
    "device_kind": "layouts", "torch_path": "torch ran", "lce_worst": "worst lce error",
    "torch_worst": "worst torch error"})
details(f"Every path ({len(by_path)}): the worst error over its outputs",
        show(by_path, {"worst lce error": "{:.1e}", "worst torch error": "{:.1e}"}, name="parity-by-path"))

# %%
exact = nb01_gradcheck.parity_numbers(parity)
Markdown(f"""**Conclusion.** In fp64 every chunked lce path agrees with the reference path to within
{exact.lce_worst:.1e} of each output's largest entry (the bound for rounding: {exact.tolerance:.0e}):
chunking changes nothing beyond rounding. torch 2.13's chunked op ran on {exact.torch_chunked_paths} of
{exact.paths} paths and agrees as closely there (worst {exact.torch_worst:.1e}); on the others, those with
label smoothing, it fell back to its reference path, so they say nothing about its chunking.

*Inputs:* the paths of the previous section; {fp64_checks.INPUTS_DESCRIPTION}; shape
{"×".join(map(str, fp64_checks.PARITY_SHAPE))} (N×D×C, odd sizes so chunks come out uneven), float64;
error = max |value − ref| / max |ref| per output; run on {CPU} when the notebook executed.

*Limits:* one shape and one seed; fp64 only, where rounding is negligible: this shows the algebra is right,
not how accurate low precision is (notebook 02).""")
