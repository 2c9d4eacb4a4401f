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

from analysis.core.problem import BENCH_SHAPE, DTYPES
from analysis.core.provenance import bf16_gemms, cpu_kind, cpu_kinds
from analysis.core.results_io import BENCH, CHUNK_SWEEP, REPRODUCE, latest, load_kind
from analysis.paths import RESULTS_DIR, ROOT
from analysis.report.auto_table import auto_reasons, batch_invariance
from analysis.report.decision_table import readme_decision_table
from analysis.report.headlines import readme_commands, readme_headlines
from analysis.report.hf_fp16 import readme_hf_fp16
from analysis.report.hf_step import readme_hf_step
from analysis.report.invariance import readme_invariance_cost
from analysis.report.nb02_accuracy import readme_bf16_errors
from analysis.report.nb05_realistic_inputs import readme_realistic_inputs
from analysis.report.nb06_does_it_matter import readme_does_it_matter, readme_noise_scaling
from analysis.report.nb07_choosing_options import readme_budgets, readme_error_model, readme_recommend
from analysis.report.nb08_beyond_torch import readme_features, readme_vocab_parallel
from analysis.report.nb09_cpu_kinds import readme_cpu_kinds, readme_cpu_probe
from analysis.report.nb10_long_horizon import readme_long_horizon
from analysis.report.nb10_loss_scale import readme_loss_scale
from analysis.report.nb11_head_mismatch import readme_rl_head_mismatch
from analysis.report.nb11_rl_logprobs import readme_rl_logprobs, readme_rl_qwen_head
from analysis.sweep.grids import GRIDS
from lce.planning.policies import CPU_MIN_ROWS

__all__ = ["BLOCKS", "DOCUMENTS", "render", "update"]


DOCUMENTS: tuple[str, ...] = ("README.md", "docs/policies.md", "docs/findings.md", "docs/cpu-kinds.md",
                               "docs/using-lce.md", "analysis/README.md")
"""The files (relative to the repository root) that carry generated passages (the other docs/ pages have none)."""

_MARKER = re.compile(r"(<!-- BEGIN generated:(?P<name>[\w-]+) \(python -m analysis docs\) -->\n)"
                     r"(?P<body>.*?)"
                     r"(<!-- END generated:(?P=name) -->)", re.S)


def _minutes(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest:02d} s" if minutes else f"{rest} s"


def reproduce_time(results: Path) -> str:
    """How long the last whole ``reproduce --quick`` took on each CPU kind, and where."""
    _, runs = load_kind(results, REPRODUCE.name)
    runs = runs[runs["grid"] == "quick"]
    if runs.empty:
        return "No whole reproduction has been timed yet (`analysis/results/reproduce.csv`).\n"
    runs = runs.assign(cpu_kind=[cpu_kind(model, gemms) for model, gemms in zip(runs["cpu_model"], runs["cpu_gemms"],
                                                                               strict=True)])
    lines = ["The last `python -m analysis reproduce --quick` (what `make reproduce` runs once the venv is installed) "
             "on each CPU kind (`analysis/results/reproduce.csv`):", ""]
    for kind, group in runs.groupby("cpu_kind", sort=True):
        last = group.sort_values("date").iloc[-1]
        lines.append(f"- {kind}, {int(last.num_threads)} threads: **{_minutes(last.total_s)}** (sweep "
                     f"{_minutes(last.sweep_s)} for {int(last.runs)} runs in {int(last.workers)} worker processes, "
                     f"memory study {_minutes(last.memory_study_s)}, figures {_minutes(last.figures_s)}), "
                     f"{str(last.date)[:10]} at revision {last.git_revision}")
    return "\n".join(lines) + "\n"


_BENCH_COLUMNS = {"lce": "lce (default)", "lce balanced": "lce balanced, acc fp32", "torch": "torch 2.13 native",
                  "unfused": "unfused reference", "3-GEMM floor": "3-GEMM floor"}


def bench_table(results: Path) -> str:
    """Time and peak memory at the bench shape, one table per CPU kind ("not run" where it emulates the dtype's
    GEMMs and a peer would call them: :mod:`analysis.core.emulated_gemms`)."""
    _, bench = load_kind(results, BENCH.name)
    shape = BENCH_SHAPE
    bench = bench[(bench["N"] == shape.N) & (bench["D"] == shape.D) & (bench["C"] == shape.C)]
    bench = bench.assign(cpu_kind=cpu_kinds(bench, bench))
    bench = latest(bench, ["cpu_kind", "impl", "dtype", "metric"])
    parts = []
    for kind, rows in bench.groupby("cpu_kind", sort=True):
        value = {(r.impl, r.dtype, r.metric): r.value for r in rows.itertuples()}
        when = str(rows["date"].max())[:10]
        emulated = bf16_gemms(rows["cpu_gemms"].iloc[0]) == "emulated"
        threads = int(rows["num_threads"].iloc[0])
        lines = [f"{kind}, {threads} thread{'s' if threads > 1 else ''}, {when}:", "",
                 "| dtype | " + " | ".join(_BENCH_COLUMNS.values()) + " |",
                 "|---" * (len(_BENCH_COLUMNS) + 1) + "|"]
        for dtype in ("float32", "bfloat16"):
            cells = []
            for impl in _BENCH_COLUMNS:
                seconds, peak = value.get((impl, dtype, "time_s")), value.get((impl, dtype, "peak_bytes"))
                cell = "-" if seconds is None else f"{seconds:.2f} s"
                if seconds is None and emulated and dtype != "float32" and not impl.startswith("lce"):
                    cell = "not run (emulated)"
                if peak is not None and peak == peak:
                    cell += f", {peak / 2**20:.0f} MiB"
                cells.append(cell)
            lines.append(f"| {dtype} | " + " | ".join(cells) + " |")
        parts.append("\n".join(lines) + "\n")
    return "\n".join(parts)


def cpu_chunking(results: Path) -> str:
    """What CPU "auto" chunking rests on: time at the row floor against the best and aspect-ratio sizes, per CPU."""
    _, chunks = load_kind(results, CHUNK_SWEEP.name)
    _, bench = load_kind(results, BENCH.name)
    chunks = chunks[chunks["metric"] == "time_s"]
    chunks = latest(chunks.assign(cpu_kind=cpu_kinds(chunks, bench)), ["cpu_kind", "impl", "dtype", "chunk_size"])
    lines = ["| CPU kind | threads | dtype, policy | 32 rows | 64 rows | auto's floor (spread) | best (rows) | "
             "floor / best |", "|---|---|---|---|---|---|---|---|"]
    floor_ratios, narrow_ratios, spreads, repeats = [], [], [], {}
    for (cpu, dtype, impl), rows in chunks.groupby(["cpu_kind", "dtype", "impl"], sort=True):
        time = dict(zip(rows["chunk_size"].astype(int), rows["value"], strict=True))
        spread = dict(zip(rows["chunk_size"].astype(int), rows["spread_s"], strict=True))
        floor = CPU_MIN_ROWS[DTYPES[dtype]]
        best_rows = min(time, key=time.get)
        policy = "default (auto)" if impl == "lce" else impl.removeprefix("lce ")
        floor_spread = "" if spread[floor] != spread[floor] else f" (±{spread[floor] / 2:.2f})"
        lines.append(f"| {cpu} | {int(rows['num_threads'].iloc[0])} | {dtype}, {policy} | "
                     f"{time.get(32, float('nan')):.2f} s | "
                     f"{time.get(64, float('nan')):.2f} s | {time[floor]:.2f} s{floor_spread} ({floor}) | "
                     f"{time[best_rows]:.2f} s ({best_rows}) | {time[floor] / time[best_rows]:.2f} |")
        floor_ratios.append(time[floor] / time[best_rows])
        narrow_ratios += [time[rows_] / time[best_rows] for rows_ in (32, 64) if rows_ in time]
        spreads += [value for value in spread.values() if value == value]
        repeats[cpu] = int(rows["repeats"].max())
    summary = (f"\nOver these rows the floor takes at most {max(floor_ratios):.2f}x the fastest size's time (the "
               f"repeats of one size spread by up to {max(spreads):.2f} s), while 32 or 64 rows take "
               f"{min(narrow_ratios):.2f}-{max(narrow_ratios):.2f}x it. Spread: half the range of a size's "
               "repeats (" + "; ".join(f"{kind}: {count}" for kind, count in repeats.items()) + ").\n")
    return "\n".join(lines) + "\n" + summary


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
            f"{max(ratios):.2f}x: on a shared 2-core machine differences within that band are noise.\n")


def quick_plan(results: Path) -> str:
    """The quick start's plan: lce's default options for its bf16 4096x512x32768 call with gradients (planned on
    meta tensors: nothing is allocated)."""
    import torch

    import lce

    shape = BENCH_SHAPE
    x = torch.empty(shape.N, shape.D, dtype=torch.bfloat16, device="meta", requires_grad=True)
    weight = torch.empty(shape.C, shape.D, dtype=torch.bfloat16, device="meta", requires_grad=True)
    return "```text\n" + str(lce.plan(x, weight, options=lce.LinearCrossEntropyOptions())) + "\n```\n"


BLOCKS: dict[str, Callable[[Path], str]] = {
    "quick-plan": quick_plan,
    "headlines": readme_headlines,
    "commands": readme_commands,
    "decision-table": readme_decision_table,
    "auto-reasons": auto_reasons,
    "batch-invariance": batch_invariance,
    "invariance-cost": readme_invariance_cost,
    "reproduce-time": reproduce_time,
    "bench-table": bench_table,
    "cpu-chunking": cpu_chunking,
    "bf16-errors": readme_bf16_errors,
    "grid-sizes": grid_sizes,
    "realistic-inputs": readme_realistic_inputs,
    "baseline-bench": baseline_bench,
    "does-it-matter": readme_does_it_matter,
    "noise-scaling": readme_noise_scaling,
    "error-model": readme_error_model,
    "recommend": readme_recommend,
    "budgets": readme_budgets,
    "features": readme_features,
    "vocab-parallel": readme_vocab_parallel,
    "cpu-kinds": readme_cpu_kinds,
    "cpu-probe": readme_cpu_probe,
    "hf-step": readme_hf_step,
    "long-horizon": readme_long_horizon,
    "loss-scale": readme_loss_scale,
    "rl-logprobs": readme_rl_logprobs,
    "rl-qwen-head": readme_rl_qwen_head,
    "rl-head-mismatch": readme_rl_head_mismatch,
    "hf-fp16": readme_hf_fp16,
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


# ---- python -m analysis docs ---------------------------------------------------------------------------------

DESCRIPTION = ("Every number a README quotes from data sits between <!-- BEGIN generated:NAME --> and "
               "<!-- END generated:NAME --> comments; this rewrites them (analysis/report/readme.py). --check only "
               "reports the files that are out of date and exits with 1 if any is.")


def add_arguments(parser) -> None:
    from analysis.core.arguments import results_option

    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a README is out of date")
    results_option(parser, "folder of results files")


def run(args) -> int:
    from analysis.paths import display_path

    changed = update(results=args.results, check=args.check)
    for path in changed:
        print(f"{display_path(path)}: {'out of date' if args.check else 'rewritten'}")
    return 1 if args.check and changed else 0
