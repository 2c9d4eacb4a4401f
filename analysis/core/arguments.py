"""The command-line pieces every ``python -m analysis`` command shares: argument types that turn a parser's
``ValueError`` into a usage error, the common options, and how a command reports the file it wrote.

Each command lives with the code it runs (a study, the sweep, the report) and registers its own arguments
(``add_arguments(parser)``) and handler (``run(args)``); :mod:`analysis.cli` only lists them.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from pathlib import Path

from analysis.core.problem import Shape, parse_shape
from analysis.paths import RESULTS_DIR, display_path

__all__ = ["argument", "results_option", "workers_option", "progress_option", "shape_option", "study_options",
           "family_names", "names_of", "seed_list", "set_aside_announced", "print_study"]


def argument(parse: Callable[[str], object]) -> Callable[[str], object]:
    """An argparse ``type`` that reports ``parse``'s ValueError message as a usage error."""

    def convert(text: str) -> object:
        try:
            return parse(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    convert.__name__ = parse.__name__
    return convert


def results_option(parser: argparse.ArgumentParser, what: str = "results folder") -> None:
    parser.add_argument("--results", type=Path, default=RESULTS_DIR,
                        help=f"{what} (default: {display_path(RESULTS_DIR)})")


def workers_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workers", type=int, default=None, metavar="N",
                        help="worker processes, one intra-op thread each (default: one per available core; "
                             "1 for a GPU grid)")


def progress_option(parser: argparse.ArgumentParser, flag: str = "--no-progress") -> None:
    parser.add_argument(flag, action="store_true", help="no progress bar")


def shape_option(parser: argparse.ArgumentParser, default: Shape, what: str = "problem size") -> None:
    parser.add_argument("--shape", default=default, type=argument(parse_shape), metavar="NxDxC",
                        help=f"{what} (default: {default})")


def study_options(parser: argparse.ArgumentParser, shape: Shape, dtypes: Sequence[str], note: str = "",
                  allowed: tuple[str, ...] = ("bfloat16", "float16")) -> None:
    """``--shape``, ``--seeds`` (0..K-1), ``--dtypes`` and ``--results``: the options of a study at one problem."""
    shape_option(parser, shape, f"problem size{note}")
    parser.add_argument("--seeds", type=int, default=5, help="seeds 0..K-1 (default: 5)")
    parser.add_argument("--dtypes", nargs="+", default=list(dtypes), choices=allowed,
                        help=f"input dtypes (default: {' '.join(dtypes)})")
    results_option(parser)


def family_names(text: str) -> tuple[str, ...]:
    """``random,calibrated`` -> the input family names, each checked."""
    from analysis.core.families import parse_family

    names = tuple(name.strip() for name in text.split(",") if name.strip())
    for name in names:
        parse_family(name)
    if not names:
        raise ValueError("--family needs at least one family name")
    return names


def names_of(allowed: Sequence[str]) -> Callable[[str], tuple[str, ...]]:
    """A parser of comma-separated names, each one of ``allowed``."""

    def names(text: str) -> tuple[str, ...]:
        chosen = tuple(part.strip() for part in text.split(",") if part.strip())
        if not chosen or any(name not in allowed for name in chosen):
            raise ValueError(f"expected names from {list(allowed)}, comma-separated; got {text!r}")
        return chosen

    return names


def seed_list(text: str) -> tuple[int, ...]:
    """``0,1,2`` -> the seeds, each non-negative."""
    seeds = tuple(int(part) for part in text.split(",") if part.strip())
    if not seeds or min(seeds) < 0:
        raise ValueError(f"expected non-negative seeds, comma-separated; got {text!r}")
    return seeds


def set_aside_announced(path: Path) -> None:
    """Move an existing results file to ``.previous`` (:func:`analysis.core.results_io.set_aside`), saying so."""
    from analysis.core.results_io import set_aside

    if set_aside(path) is not None:
        print(f"moved the existing {display_path(path)} to {display_path(path)}.previous")


def print_study(path: Path, seconds: float) -> None:
    """How a study reports the file it wrote."""
    print(f"{display_path(path)}: {seconds:.0f} s (an earlier one, if any, is now {path.name}.previous)")
