# %% [markdown]
# # 05 · Do the verdicts hold on realistic inputs: a trained model's head, Zipfian targets, confident rows?
#
# Every earlier verdict rested on `random` inputs: a head that is confidently wrong on every
# row (11–14 nats) with uniformly drawn targets. Real heads differ in the ways that matter to
# rounding: a loss of a few nats, Zipfian targets (so most classes' weight-gradient rows are
# tiny), a few feature dimensions tens of times larger than the rest, and rows predicted with
# near certainty (p_target → 1, where `p_y − 1` and `lse − z_y` cancel). This notebook
# describes three input families (`random`; `calibrated`, a synthetic head with those traits
# as knobs; `trained`, the head of a small language model trained here on the CPython
# standard library), then measures what changes on them: the cancellation-free target terms
# at growing margins, the rows of rarely targeted classes in fp16/bf16, and the verdict on
# every "auto" entry, per family, over 5 seeds.

# %%
import os

from IPython.display import Markdown, display

from analysis.core.results_io import FAMILY_STATS, MARGINS, RARE_ROWS, load_kind
from analysis.judge import pareto
from analysis.paths import RESULTS_DIR
from analysis.report import figures
from analysis.report import nb05_realistic_inputs as family_conclusions
from analysis.report.tables import show

# %matplotlib inline
QUICK = os.environ.get("LCE_QUICK", "1") == "1"  # reads committed data only; nothing to shorten
paths, table = pareto.load_table()
studies = {kind.name: load_kind(RESULTS_DIR, kind.name)[1] for kind in (FAMILY_STATS, MARGINS, RARE_ROWS)}
figures = {figure.stem: figure for figure in figures.draw_all(table, **studies)}  # draws, measures nothing
print("data:", ", ".join(p.name for p in paths), "| families:", ", ".join(sorted(table.family.unique())))

# %% [markdown]
# ## The input families
# Statistics in fp64 on each family's fp32 draw at the trained head's shape (2048 rows, D=128,
# C=16384): the mean loss, percentiles of the target's probability and of its logit's lead over
# the best other class, how far the largest feature dimension stands out, and how often classes
# are targets (`python -m analysis family-stats`).

# %%
stats = studies[FAMILY_STATS.name]
summary = stats[stats.statistic != "target_count"].pivot_table(index="statistic", columns="family", values="value")
show(summary[[f for f in dict.fromkeys(stats.family)]].reset_index(), {f: "{:.3g}" for f in summary.columns},
     name="family-statistics")

# %%
figure = figures["families"]
display(figure.figure, Markdown(figure.markdown))

# %%
Markdown(family_conclusions.family_portraits(stats))

# %% [markdown]
# ## Confident rows: the target terms without cancellation
# Rows whose target logit leads every other class by a margin of 0–40 nats, bf16 and fp16,
# 5 seeds (`python -m analysis margins`). lce forms the target's share `1 − p_y` from the other
# classes and the row loss as `log1p` of their mass; the unfused fp32 formula and torch's op
# subtract nearly equal numbers. The fp64 reference is itself cancellation-free.

# %%
figure = figures["margins"]
display(figure.figure, Markdown(figure.markdown))

# %%
Markdown(family_conclusions.margins(studies[MARGINS.name]))

# %% [markdown]
# ## Rare classes' weight-gradient rows in fp16 and bf16
# Calibrated inputs (Zipfian targets): the per-row error of grad_weight, each class row against
# its own rounding floor, binned by how often the class is a target in the batch
# (`python -m analysis rare-rows`). The Frobenius error averages over rows and hides these.

# %%
figure = figures["rare_rows"]
display(figure.figure, Markdown(figure.markdown))

# %%
Markdown(family_conclusions.rare_rows(studies[RARE_ROWS.name]))

# %% [markdown]
# ## Do the verdicts change with the inputs?
# One row per "auto" entry, one column per family: mem/time ✓ when the pick is on that front in
# every seed (✗ with the number of seeds it is off in), and its worst gradient error in floors
# (seed median [5th–95th percentile]), per shape, from the quick and medium grids.

# %%
verdicts = pareto.verdicts(table)
show(family_conclusions.verdict_matrix(verdicts), wrap=[c for c in ("random", "calibrated", "trained")],
     wrap_width="40ch", name="verdicts-per-family")

# %%
Markdown(family_conclusions.verdict_changes(verdicts))

# %% [markdown]
# ## Rows and bias: what the Frobenius error does not say
# Per family and dtype, the whole-tensor error of grad_weight next to its 99th-percentile and
# worst class row (lce's emulated CUDA layouts, where the per-chunk rounding of compact lives),
# and the signed error along the exact gradient, which does not average out over steps.

# %%
for stem in ("row_errors_cuda-emulated", "gradient_bias"):
    if stem in figures:
        display(figures[stem].figure, Markdown(figures[stem].markdown))

# %%
Markdown(family_conclusions.rows_and_bias(table))
