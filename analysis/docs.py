"""The numbers the READMEs quote, written by code from the committed results files.

A README marks each generated passage with a pair of comments::

    <!-- BEGIN generated:NAME (python -m analysis docs) -->
    ...
    <!-- END generated:NAME -->

and :func:`update` rewrites what lies between them from :data:`BLOCKS`, so a
number quoted in prose cannot drift from the data behind it:
``python -m analysis docs`` rewrites the files, ``--check`` only reports, and a
test requires the committed READMEs to be up to date.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from lce.policies import CPU_MIN_ROWS

from .grids import GRIDS
from .inputs import DTYPES, Shape
from .paths import RESULTS_DIR, ROOT
from .results_io import BENCH, CHUNK_SWEEP, REPRODUCE, latest, load_kind

__all__ = ["BLOCKS", "DOCUMENTS", "BENCH_SHAPE", "render", "update"]

BENCH_SHAPE = Shape(4096, 512, 32768)
"""The problem ``python -m analysis bench`` measures by default, quoted in the README."""

DOCUMENTS: tuple[str, ...] = ("README.md", "analysis/README.md")
"""The files (relative to the repository root) that carry generated passages."""

_MARKER = re.compile(r"(<!-- BEGIN generated:(?P<name>[\w-]+) \(python -m analysis docs\) -->\n)"
                     r"(?P<body>.*?)"
                     r"(<!-- END generated:(?P=name) -->)", re.S)


def _minutes(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest:02d} s" if minutes else f"{rest} s"


def reproduce_time(results: Path) -> str:
    """How long the last whole ``reproduce --quick`` took, and where."""
    _, runs = load_kind(results, REPRODUCE.name)
    runs = runs[runs["grid"] == "quick"]
    if runs.empty:
        return "No whole reproduction has been timed yet (`analysis/results/reproduce.csv` is empty).\n"
    last = runs.sort_values("date").iloc[-1]
    return (f"The last `python -m analysis reproduce --quick` (what `make reproduce` runs once the venv is "
            f"installed) took **{_minutes(last.total_s)}** (sweep {_minutes(last.sweep_s)} for "
            f"{int(last.runs)} runs in {int(last.workers)} worker processes, memory study "
            f"{_minutes(last.memory_study_s)}, figures {_minutes(last.figures_s)}) on an {last.cpu_model} "
            f"({int(last.num_threads)} cores), {str(last.date)[:10]} at revision {last.git_revision} "
            f"(`analysis/results/reproduce.csv`).\n")


_BENCH_COLUMNS = {"lce": "lce (default)", "lce balanced": "lce balanced, acc fp32", "torch": "torch 2.13 native",
                  "unfused": "unfused reference", "3-GEMM floor": "3-GEMM floor"}


def bench_table(results: Path) -> str:
    """Time and peak memory at the bench shape, one table per CPU model."""
    _, bench = load_kind(results, BENCH.name)
    shape = BENCH_SHAPE
    bench = bench[(bench["N"] == shape.N) & (bench["D"] == shape.D) & (bench["C"] == shape.C)]
    bench = latest(bench, ["cpu_model", "impl", "dtype", "metric"])
    parts = []
    for cpu, rows in bench.groupby("cpu_model", sort=True):
        value = {(r.impl, r.dtype, r.metric): r.value for r in rows.itertuples()}
        when = str(rows["date"].max())[:10]
        lines = [f"{cpu} ({int(rows['num_threads'].iloc[0])} threads, {when}):", "",
                 "| dtype | " + " | ".join(_BENCH_COLUMNS.values()) + " |",
                 "|---" * (len(_BENCH_COLUMNS) + 1) + "|"]
        for dtype in ("float32", "bfloat16"):
            cells = []
            for impl in _BENCH_COLUMNS:
                seconds, peak = value.get((impl, dtype, "time_s")), value.get((impl, dtype, "peak_bytes"))
                cell = "-" if seconds is None else f"{seconds:.2f} s"
                if peak is not None and peak == peak:
                    cell += f", {peak / 2**20:.0f} MiB"
                cells.append(cell)
            lines.append(f"| {dtype} | " + " | ".join(cells) + " |")
        parts.append("\n".join(lines) + "\n")
    return "\n".join(parts)


def cpu_chunking(results: Path) -> str:
    """What CPU "auto" chunking rests on: time at the row floor against the best and aspect-ratio sizes, per CPU."""
    _, chunks = load_kind(results, CHUNK_SWEEP.name)
    chunks = latest(chunks[chunks["metric"] == "time_s"], ["cpu_model", "impl", "dtype", "chunk_size"])
    lines = ["| CPU | dtype, policy | 32 rows | 64 rows | auto's floor (spread) | best (rows) | floor / best |",
             "|---|---|---|---|---|---|---|"]
    floor_ratios, narrow_ratios, spreads = [], [], []
    for (cpu, dtype, impl), rows in chunks.groupby(["cpu_model", "dtype", "impl"], sort=True):
        time = dict(zip(rows["chunk_size"].astype(int), rows["value"], strict=True))
        spread = dict(zip(rows["chunk_size"].astype(int), rows["spread_s"], strict=True))
        floor = CPU_MIN_ROWS[DTYPES[dtype]]
        best_rows = min(time, key=time.get)
        policy = "default (auto)" if impl == "lce" else impl.removeprefix("lce ")
        floor_spread = "" if spread[floor] != spread[floor] else f" (±{spread[floor] / 2:.2f})"
        lines.append(f"| {cpu} | {dtype}, {policy} | {time.get(32, float('nan')):.2f} s | "
                     f"{time.get(64, float('nan')):.2f} s | {time[floor]:.2f} s{floor_spread} ({floor}) | "
                     f"{time[best_rows]:.2f} s ({best_rows}) | {time[floor] / time[best_rows]:.2f} |")
        floor_ratios.append(time[floor] / time[best_rows])
        narrow_ratios += [time[rows_] / time[best_rows] for rows_ in (32, 64) if rows_ in time]
        spreads += [value for value in spread.values() if value == value]
    summary = (f"\nOver these rows the floor takes at most {max(floor_ratios):.2f}x the fastest size's time (the "
               f"repeats of one size spread by up to {max(spreads):.2f} s), while 32 or 64 rows take "
               f"{min(narrow_ratios):.2f}-{max(narrow_ratios):.2f}x it. Spread: half the range of a size's "
               "repeats; AMD rows from 2 repeats, Intel rows from 3.\n")
    return "\n".join(lines) + "\n" + summary


def bf16_errors(results: Path) -> str:
    """Errors in floors of lce's and torch's defaults on CPU bf16 (quick grid, default chunking), per input family:
    seed medians with their 5th-95th percentile interval."""
    from .conclusions import spread
    from .pareto import INTERVAL, load_table

    _, table = load_table(results)
    data = table[(table["device"] == "cpu") & (table["dtype"] == "bfloat16") & (table["chunking"] == "auto")]
    parts, shapes, seeds = [], set(), set()
    for family, rows in data.groupby("family", sort=True):
        default = rows[(rows["policy"] == "auto") & (rows["acc_dtype"] == "default")]
        mine, theirs = default[default["op"] == "lce"], default[default["op"] == "torch"]
        balanced = rows[(rows["op"] == "lce") & (rows["policy"] == "balanced") & (rows["acc_dtype"] == "float32")]
        if mine.empty or theirs.empty or balanced.empty:
            continue
        shapes |= {f"{r.N}x{r.D}x{r.C}" for r in mine.itertuples()}
        seeds |= set(mine["seed"])
        parts.append(f"on `{family}` inputs lce's default is {spread(mine, 'worst_grad_in_floors', unit='x')} the "
                     f"rounding floor on its worst gradient and {spread(mine, 'loss_fro_in_floors', unit='x')} on "
                     f"the loss; torch's default is {spread(theirs, 'loss_fro_in_floors', unit='x')} on the loss, "
                     f"{spread(theirs, 'grad_weight_fro_in_floors', unit='x')} on grad_weight and "
                     f"{spread(theirs, 'grad_bias_fro_in_floors', unit='x')} on grad_bias; `balanced` with "
                     f"`acc_dtype=torch.float32` gives {spread(balanced, 'grad_weight_fro_in_floors', unit='x')} "
                     "on grad_weight")
    if not parts:
        return "The quick grid has no CPU bf16 runs with default chunking yet.\n"
    interval = f"; in brackets the {INTERVAL}" if len(seeds) > 1 else ""
    return ("In bf16 on the CPU, with lce's default (\"accurate\": every GEMM in fp32) and `balanced` with bf16 "
            "backward GEMMs: " + "; ".join(parts) + f". Quick grid, default chunking, shapes "
            f"{', '.join(sorted(shapes))}, {len(seeds)} seed{'s' if len(seeds) != 1 else ''}: medians over seeds"
            f"{interval} (`analysis/results/quick.csv`).\n")


def grid_sizes(results: Path) -> str:
    """Runs per named grid, and the measured time of the quick one."""
    lines = [f"- `{grid.name}`: {len(grid.configs):,} runs; {grid.description}." for grid in GRIDS.values()]
    return "\n".join(lines) + "\n\n" + reproduce_time(results)


def baseline_bench(results: Path) -> str:
    """lce here against an earlier revision (``bench --baseline``), as time ratios per dtype: every run against
    the most recent baseline revision, so one noisy run cannot stand for the comparison."""
    _, bench = load_kind(results, BENCH.name)
    rows = bench[bench["impl"].astype(str).str.startswith("lce@") | (bench["impl"] == "lce now")]
    if rows.empty:
        return "No baseline comparison has been run yet (`python -m analysis bench --baseline REV`).\n"
    baseline = rows[rows["impl"].str.startswith("lce@")].sort_values("date")["impl"].iloc[-1]
    runs = rows[rows["date"].isin(rows[rows["impl"] == baseline]["date"])]
    parts = []
    for (date, dtype), group in runs.groupby(["date", "dtype"], sort=True):
        value = dict(zip(group["impl"], group["value"], strict=True))
        parts.append(f"{dtype} {value['lce now']:.2f} s against {value[baseline]:.2f} s "
                     f"({value['lce now'] / value[baseline]:.2f}x, {int(group['repeats'].iloc[0])} rounds, "
                     f"{str(date)[:16]})")
    first = runs.iloc[0]
    ratios = [float(part.split("(")[1].split("x")[0]) for part in parts]
    return (f"lce's default options at N={first.N} D={first.D} C={first.C}, one forward+backward, against "
            f"{baseline.removeprefix('lce@')}, fresh processes alternating, median over the rounds: "
            f"{'; '.join(parts)} on an {first.cpu_model} (`python -m analysis bench --baseline "
            f"{baseline.removeprefix('lce@')}`). Runs of the same comparison range over {min(ratios):.2f}-"
            f"{max(ratios):.2f}x: on this shared machine differences within that band are noise.\n")


def _finding(conclusion: str) -> str:
    """The finding of a notebook conclusion: its first paragraph without the marker."""
    from .conclusions import MARKER

    return conclusion.split("\n\n", 1)[0].removeprefix(MARKER).strip()


def realistic_inputs(results: Path) -> str:
    """Notebook 05's findings, one bullet each: the families, confident rows, rare rows, the verdicts per family."""
    from . import family_conclusions as realistic
    from .pareto import load_table, verdicts
    from .results_io import FAMILY_STATS, MARGINS, RARE_ROWS

    studies = {kind.name: load_kind(results, kind.name)[1] for kind in (FAMILY_STATS, MARGINS, RARE_ROWS)}
    _, table = load_table(results)
    findings = [
        ("The families", realistic.family_portraits(studies[FAMILY_STATS.name])
         if len(studies[FAMILY_STATS.name]) else ""),
        ("Confident rows", realistic.margins(studies[MARGINS.name])),
        ("Rare classes' rows", realistic.rare_rows(studies[RARE_ROWS.name])),
        ("The verdicts per family", realistic.verdict_changes(verdicts(table)) if len(table) else ""),
    ]
    return "\n".join(f"- **{name}.** {_finding(text)}" for name, text in findings if text) + "\n"


def does_it_matter(results: Path) -> str:
    """Notebook 06's findings, one bullet each: torch's claim, error against noise, training, the rule."""
    from . import matter_conclusions as matter
    from .results_io import NOISE, TRAINING

    noise, training = (load_kind(results, kind.name)[1] for kind in (NOISE, TRAINING))
    findings = [("Compact against balanced on CUDA", matter.torch_claim(noise)),
                ("Error against sampling noise", matter.error_against_noise(noise)),
                *((f"Training ({'one H200' if device == 'cuda' else 'CPU, emulated CUDA layouts'})",
                   matter.training(training, noise, device)) for device in ("cuda", "cpu")
                  if (training["device"] == device).any()),
                ("The rule", matter.rule(noise))]
    return "\n".join(f"- **{name}.** {_finding(text)}" for name, text in findings) + "\n"


def error_model(results: Path) -> str:
    """The error model's validation summary and its predicted weight-gradient floors at LLM heads (CUDA layouts,
    acc fp32, default statistics), marked as extrapolations."""
    import pandas as pd

    from .error_model_fit import SHARE_BAND, VALIDATION_FILE, llm_predictions, summary

    path = results / VALIDATION_FILE
    if not path.exists():
        return "(no error-model validation yet: run `python -m analysis error-model`)\n"
    report = summary(pd.read_csv(path), worst=3)
    (fit_share, fit_count), (held_share, held_count) = report["fit"], report["held_out"]
    lines = [f"`lce.error_model` predicts each gradient's error in rounding floors from the plan and a few input "
             f"statistics. Within ±{SHARE_BAND:.0%} of the measurement: {held_share:.0%} of {held_count} held-out "
             f"points (calibrated inputs, larger shapes), {fit_share:.0%} of the {fit_count} it was fitted on. "
             "Worst held-out misses: " + "; ".join(report["worst"]) + ".", ""]
    table = llm_predictions(dtypes=("bfloat16",))
    table = table[table["kind"] == "cuda"]
    grad_input = ", ".join(f"{policy} {group['grad_input'].min():.2f}-{group['grad_input'].max():.2f}"
                           for policy, group in table.groupby("policy"))
    lines += ["**Predictions (extrapolated, not measured)**: grad_weight floors in bf16 on the CUDA layouts, fp32 "
              f"acc_dtype, worst committed input statistics (grad_input over all cells: {grad_input}).", ""]
    chunkings = list(dict.fromkeys(table["chunking"]))
    lines += ["| N x D x C | policy | " + " | ".join(chunkings) + " |", "|---|---|" + "---:|" * len(chunkings)]
    for (shape, policy), group in table.groupby(["shape", "policy"], sort=False):
        cells = [f"{row.grad_weight:.1f} (k={row.num_chunks})" for row in group.itertuples()]
        lines.append(f"| {shape} | {policy} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def recommend(results: Path) -> str:
    """lce.recommend's picks at LLM heads (predictions of lce's models) and the Cut Cross-Entropy anchor."""
    from .recommendations import recommend_markdown

    return recommend_markdown()


def budgets(results: Path) -> str:
    """The budgets study: measured peak over budget, errors against their prediction, class tiling's cost."""
    from .recommendations import budgets_markdown
    from .results_io import BUDGETS, CLASS_TILING

    return budgets_markdown(*(load_kind(results, kind.name)[1] for kind in (BUDGETS, CLASS_TILING)))


def features(results: Path) -> str:
    """Notebook 08's findings, one bullet each: the features' errors next to the plain op, the cap's effect on
    the softmax, their time and memory at the bench shape."""
    from . import feature_conclusions as beyond
    from .results_io import FEATURE_COST, FEATURES

    table, cost = (load_kind(results, kind.name)[1] for kind in (FEATURES, FEATURE_COST))
    findings = [("Errors", beyond.errors(table)), ("The cap and the softmax", beyond.softmax_statistics(table)),
                ("Time and memory", beyond.cost(cost))]
    lines = [f"- **{name}.** {_finding(text)}" for name, text in findings]
    if not table.empty:
        lines += ["", "Per feature set (seed medians over families, policies and layouts):", ""]
        lines += [line for line in findings[0][1].splitlines() if line.startswith("- ")]
    return "\n".join(lines) + "\n"


def vocab_parallel(results: Path) -> str:
    """The vocab-parallel study: difference to one process, errors per rank count, peak memory per rank."""
    from .results_io import VOCAB_PARALLEL

    table = load_kind(results, VOCAB_PARALLEL.name)[1]
    if table.empty:
        return "(no vocab-parallel study yet: run `python -m analysis vocab-parallel`)\n"
    sharded = table[table["ranks"] > 1]
    row = table.iloc[0]
    exact = sharded[sharded["dtype"] == "float64"]
    low = table[table["dtype"] != "float64"]
    lines = [f"Measured ({row.N}x{row.D}x{row.C}, {', '.join(sorted(table['family'].unique()))} inputs, "
             f"{table['seed'].nunique()} seeds, CPU {row.cpu_model}, gloo; `python -m analysis vocab-parallel`):", ""]
    if not exact.empty:
        worst = exact[["loss_diff_to_single", "grad_input_diff_to_single", "grad_weight_diff_to_single"]].max()
        lines.append(f"- fp64: the largest difference to one process over 2-{int(sharded['ranks'].max())} ranks and "
                     f"every policy is {worst.max():.2g} (relative to the largest entry; loss {worst.iloc[0]:.2g}, "
                     f"grad_input {worst.iloc[1]:.2g}, grad_weight {worst.iloc[2]:.2g}).")
    lines += ["", "| ranks | dtype | policy | grad_input floors | grad_weight floors | peak per rank (largest) |",
              "|---:|---|---|---:|---:|---:|"]
    medians = low.groupby(["ranks", "dtype", "policy"], sort=False)[
        ["grad_input_floors", "grad_weight_floors", "peak_bytes_max"]].median()
    for (ranks, dtype, policy), values in medians.iterrows():
        lines.append(f"| {ranks} | {dtype} | {policy} | {values.grad_input_floors:.2f} | "
                     f"{values.grad_weight_floors:.2f} | {values.peak_bytes_max / 2**20:.1f} MiB |")
    lines += ["", "Floors are seed and family medians against fp64; 1 rank is `lce.linear_cross_entropy` in one "
              "process. Figure `vocab_parallel`."]
    return "\n".join(lines) + "\n"


BLOCKS: dict[str, Callable[[Path], str]] = {
    "reproduce-time": reproduce_time,
    "bench-table": bench_table,
    "cpu-chunking": cpu_chunking,
    "bf16-errors": bf16_errors,
    "grid-sizes": grid_sizes,
    "realistic-inputs": realistic_inputs,
    "baseline-bench": baseline_bench,
    "does-it-matter": does_it_matter,
    "error-model": error_model,
    "recommend": recommend,
    "budgets": budgets,
    "features": features,
    "vocab-parallel": vocab_parallel,
}
"""Every generated passage by name: a function of the results folder returning its Markdown."""


def render(text: str, results: Path = RESULTS_DIR) -> str:
    """``text`` with every generated passage rewritten; ``ValueError`` naming an unknown passage."""

    def body(match: re.Match) -> str:
        name = match["name"]
        if name not in BLOCKS:
            raise ValueError(f"unknown generated passage {name!r}; known: {sorted(BLOCKS)}")
        return match.group(1) + BLOCKS[name](results) + match.group(4)

    return _MARKER.sub(body, text)


def update(root: Path = ROOT, results: Path = RESULTS_DIR, *, check: bool = False) -> list[Path]:
    """Rewrite the generated passages of :data:`DOCUMENTS`; return the files that were (or, with
    ``check``, would be) changed."""
    changed = []
    for name in DOCUMENTS:
        path = root / name
        text = path.read_text(encoding="utf-8")
        new = render(text, results)
        if new != text:
            changed.append(path)
            if not check:
                path.write_text(new, encoding="utf-8")
    return changed
