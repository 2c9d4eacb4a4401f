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

import pandas as pd

from analysis.studies import fp64_checks

QUICK = os.environ.get("LCE_QUICK", "1") == "1"  # quick: CPU layouts and two chunkings; else both layout tables
pd.set_option("display.width", 200)
cases = fp64_checks.path_cases(quick=QUICK)
print(f"{len(cases)} chunked paths")

# %% [markdown]
# ## gradcheck on every path
# Shape 7 × 3 against 5 classes with 3-row chunks, so every path runs several chunks,
# one of them short.

# %%
gradchecks = fp64_checks.gradcheck_table(cases)
print(f"gradcheck passed on {gradchecks.gradcheck.sum()} of {len(gradchecks)} paths")
gradchecks[["device_kind", "policy", "chunking", "reduction", "features", "gradcheck"]]

# %% [markdown]
# ## Largest error against the reference path, lce and torch
# Each entry is `max |value − ref| / max |ref|` for that output. `torch_path` says whether
# torch's op chunked or fell back to its reference path (it does not chunk label smoothing).

# %%
parity = fp64_checks.parity_table(cases)
error_columns = [c for c in parity.columns if c.startswith(("lce_", "torch_")) and c != "torch_path"]
summary = parity[["policy", "chunking", "reduction", "features", "torch_path"] + error_columns]
summary.style.format("{:.1e}", subset=error_columns, na_rep="-")

# %%
worst = parity[[c for c in error_columns if c.startswith("lce_")]].max().max()
chunked_torch = parity[parity.torch_path == "chunked"]
worst_torch = chunked_torch[[c for c in error_columns if c.startswith("torch_")]].max().max()
print(f"worst lce error over all paths and outputs: {worst:.1e}")
print(f"worst torch error where its chunked op ran ({len(chunked_torch)} paths): {worst_torch:.1e}")
assert worst < 1e-13, "an fp64 path disagrees with the reference beyond rounding"
