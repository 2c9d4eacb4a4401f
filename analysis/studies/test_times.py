"""``python -m analysis test-times``: how long the test tiers take on this CPU, for the README's commands table.

Runs ``make test-fast``'s and ``make test``'s pytest command (``-n auto``, the fast tier deselecting the ``slow``
marker) in a fresh process each, and ``python -m analysis train --quick`` into a scratch folder, times them, and
appends one row per tier to ``test_times.csv`` (kind ``test_time``) with the pass/fail counts pytest printed and
the provenance, whose CPU model and GEMM verdict say which CPU kind the time belongs to. ``--stand-in`` runs
them under the AVX2 stand-in (``ONEDNN_MAX_CPU_ISA=AVX2`` and ``LCE_CPU_GEMMS`` unset: the slow kind, bf16 GEMMs
emulated) and records that in the ``cpu_gemms`` column.

A new row makes the README's generated commands block stale until ``python -m analysis docs`` rewrites it, so a
tier timed after another in one call fails its docs test on the row the first one wrote: time the whole suite in
a call of its own (``--tiers test``), then regenerate the docs and commit the rows and the block together.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from analysis.paths import ROOT

__all__ = ["TIERS", "TEST_TIMES_FILE", "run_tier", "record"]

TEST_TIMES_FILE = "test_times.csv"
TIERS: dict[str, list[str]] = {
    "test-fast": [sys.executable, "-m", "pytest", "-q", "-n", "auto", "-m", "not slow", "-p", "no:cacheprovider"],
    "test": [sys.executable, "-m", "pytest", "-q", "-n", "auto", "-p", "no:cacheprovider"],
    "train --quick": [sys.executable, "-m", "analysis", "train", "--quick", "--no-progress"],
}
"""The commands timed: ``make test-fast``'s, ``make test``'s (what CI runs) and the training study's quick run."""
STAND_IN = {"ONEDNN_MAX_CPU_ISA": "AVX2"}


def _counts(output: str) -> dict[str, int]:
    """pytest's closing counts (``12 passed, 3 skipped, 1 failed``) as a dict."""
    tail = output.strip().splitlines()[-1] if output.strip() else ""
    return {word: int(number) for number, word in re.findall(r"(\d+) (passed|failed|skipped|errors?)", tail)}


def run_tier(name: str, *, stand_in: bool = False) -> dict[str, object]:
    """Run one tier in a fresh process from the repository root; its wall time, exit status and counts."""
    command = list(TIERS[name])
    environment = dict(os.environ)
    if stand_in:
        environment.update(STAND_IN)
        environment.pop("LCE_CPU_GEMMS", None)
    with tempfile.TemporaryDirectory() as scratch:
        if name == "train --quick":  # a fresh clone's run: the tokenizer and token streams built too
            command += ["--results", scratch, "--cache", scratch]
        started = time.perf_counter()
        done = subprocess.run(command, cwd=ROOT, env=environment, capture_output=True, text=True)
        seconds = time.perf_counter() - started
    counts = _counts(done.stdout)
    return {"tier": name, "command": " ".join(command[1:]), "stand_in": "AVX2" if stand_in else "",
            "wall_s": seconds, "status": done.returncode, "passed": counts.get("passed"),
            "failed": counts.get("failed", 0) + counts.get("error", 0) + counts.get("errors", 0),
            "skipped": counts.get("skipped")}


def record(folder: Path, tiers: list[str], *, stand_in: bool = False) -> Path:
    """Time ``tiers`` and append their rows, with provenance, to ``folder/test_times.csv``."""
    from analysis.core.provenance import provenance
    from analysis.core.results_io import TEST_TIME, append_rows

    path = folder / TEST_TIMES_FILE
    for name in tiers:
        row = run_tier(name, stand_in=stand_in)
        details = provenance("cpu")
        if stand_in:
            details["cpu_gemms"] = f"{details['cpu_gemms']} (AVX2 stand-in)"
        append_rows(path, [TEST_TIME.row(**row, **details)])
        print(f"{name}: {row['wall_s']:.0f} s, exit {row['status']} ({row['passed']} passed, {row['failed']} failed)")
    return path


# ---- python -m analysis test-times ---------------------------------------------------------------------------

DESCRIPTION = ("Time `make test-fast`'s and `make test`'s pytest commands and `train --quick` on this CPU (optionally "
               "under the AVX2 stand-in) and append them to test_times.csv, which the README's commands table quotes.")


def add_arguments(parser) -> None:
    from analysis.core.arguments import results_option

    parser.add_argument("--tiers", default=",".join(TIERS), help=f"comma-separated, of {list(TIERS)}")
    parser.add_argument("--stand-in", action="store_true", help="under the AVX2 stand-in (ONEDNN_MAX_CPU_ISA=AVX2)")
    results_option(parser)


def run(args) -> int:
    tiers = [name.strip() for name in args.tiers.split(",") if name.strip()]
    unknown = [name for name in tiers if name not in TIERS]
    if unknown:
        raise SystemExit(f"--tiers must name tiers of {list(TIERS)}, got {unknown}")
    record(args.results, tiers, stand_in=args.stand_in)
    return 0

