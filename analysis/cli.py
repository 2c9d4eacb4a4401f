"""``python -m analysis COMMAND``: the commands, each registered by the module that does its work.

A command's module defines ``add_arguments(parser)``, ``run(args)`` (returning an exit status or None) and a
``DESCRIPTION``; :data:`COMMANDS` lists them with a one-line summary. Only the module of the command being run
is imported (``python -m analysis --help`` imports none), so a command pays for its own imports alone.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Collection, Sequence

__all__ = ["COMMANDS", "build_parser", "main"]

COMMANDS: dict[str, tuple[str, str]] = {
    "reproduce": ("analysis.reproduce", "sweep a grid, record the memory study, draw every figure"),
    "sweep": ("analysis.sweep.run", "run a named grid into analysis/results/<grid>.csv (resumable)"),
    "grids": ("analysis.sweep.grids", "list the named grids and their sizes"),
    "remeasure-memory": ("analysis.sweep.remeasure",
                         "bring committed sweep rows' peak memory up to date after lce's memory use changed"),
    "figures": ("analysis.report.figures", "draw every figure from the committed results files (seconds)"),
    "docs": ("analysis.report.readme", "rewrite the generated passages of the READMEs from the results files"),
    "notebooks": ("analysis.report.notebooks", "execute every notebook from its source and write the .ipynb"),
    "verdicts": ("analysis.judge.rule", "print the Pareto verdict and the error/noise rule of every \"auto\" entry"),
    "demo": ("analysis.studies.demo", "a one-minute tour: lce's plan, then lce's and torch's errors vs fp64"),
    "bench": ("analysis.studies.bench", "time and peak memory of lce, torch, unfused and compiled at one problem"),
    "memory-study": ("analysis.studies.memory_study", "measure where lce's bytes go and live memory over one step"),
    "family-stats": ("analysis.studies.family_stats", "describe each input family (loss, p_target, margins, ...)"),
    "margins": ("analysis.studies.margins", "error vs fp64 on confident rows, margins 0 to 40 nats"),
    "rare-rows": ("analysis.studies.rare_rows", "grad_weight's per-row error binned by class target count"),
    "loss-scale": ("analysis.studies.loss_scale",
                   "fp16 gradients under a loss scale: entries lost and floors, lce before/after its headroom"),
    "rl-logprobs": ("analysis.studies.rl_logprobs",
                    "RL's per-token log-probabilities and entropy: each recipe's ratio error, KL, floors; costs"),
    "head-mismatch": ("analysis.studies.head_mismatch",
                      "which trainer head matches which inference head: per-token log p mismatch, sequences masked"),
    "invariance-cost": ("analysis.studies.invariance_cost",
                        "the time of lce's batch-invariance contract: batch_invariant False and True, interleaved"),
    "noise": ("analysis.studies.noise", "gradient error against the sampling noise of the same batch"),
    "noise-scaling": ("analysis.studies.noise_scaling",
                      "the error/noise ratios over the batch size N (2^10 to 2^16), resumable"),
    "noise-scaling-fit": ("analysis.judge.noise_scaling",
                          "fit how each candidate's error/noise ratio grows with N; export it to lce.decide"),
    "train": ("analysis.studies.training", "train the small language model with each head arm, several seeds"),
    "head-train": ("analysis.studies.head_training",
                   "train a head alone for 10^4 steps per precision arm: held-out loss per frequency bucket"),
    "error-model": ("analysis.studies.error_model", "fit lce's gradient error model and validate it on held-out data"),
    "budgets": ("analysis.studies.budgets", "lce.recommend per memory budget, measured; class tiling's cost"),
    "features": ("analysis.studies.features", "error, time and memory of soft-capping, z-loss and lse"),
    "vocab-parallel": ("analysis.studies.vocab_parallel", "vocab-parallel lce on 1-4 CPU processes: errors, peaks"),
    "time-model": ("analysis.studies.time_model",
                   "fit lce's time model to the committed timed runs of each device kind; held-out report"),
    "cpu-kinds": ("analysis.studies.cpu_kinds", "this CPU's GEMM rates; lce.recommend's picks timed here"),
    "cpu-probe": ("analysis.studies.cpu_probe", "lce.planning.cpu_gemms' verdict at 1, 2 and all threads, idle and "
                                                "busy"),
    "hf-step": ("analysis.studies.hf_step",
                "one training step of a transformers causal LM, patched by lce or not: peak memory and time"),
    "hf-fp16": ("analysis.studies.hf_fp16",
                "train a transformers causal LM under fp16 autocast and a GradScaler, patched by lce or not"),
    "lm": ("analysis.lm.pipeline", "train the small language model and dump its head's (x, W, y)"),
    "test-times": ("analysis.studies.test_times",
                   "time make test-fast's and make test's pytest commands and train --quick on this CPU"),
    "gpu-check": ("analysis.gpu.check", "everything a lent GPU should measure, in one budgeted call"),
    "gpu-wheels": ("analysis.gpu.wheels", "download the GPU check's wheels for the GPU machine's Python"),
}
"""Command name -> (the module that registers and runs it, its one-line summary)."""


def build_parser(registered: Collection[str] | None = None) -> argparse.ArgumentParser:
    """The parser of every command; the modules of the commands in ``registered`` (every command when None) are
    imported and register their arguments, the others are listed by their summary."""
    parser = argparse.ArgumentParser(
        prog="python -m analysis",
        description="Measure what each lce precision policy costs (memory, time) and buys (accuracy vs fp64).")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module_name, summary) in COMMANDS.items():
        if registered is not None and name not in registered:
            commands.add_parser(name, help=summary)
            continue
        module = importlib.import_module(module_name)
        sub = commands.add_parser(name, help=summary, description=f"{summary}. {module.DESCRIPTION}")
        module.add_arguments(sub)
        sub.set_defaults(handler=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the process exit status (argparse exits with 2 on a usage error)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((word for word in argv if not word.startswith("-")), None)
    args = build_parser([command] if command in COMMANDS else []).parse_args(argv)
    status = args.handler(args)
    return status or 0
