"""Build the research notebooks from their sources and run them top to bottom.

Each notebook is written as a percent-format script, ``notebooks/NN_name.py``
(readable diffs, reviewable as code), and committed next to its executed
``.ipynb`` (readable with outputs on a code host). :func:`execute` turns a
source into a notebook and runs every cell in a fresh kernel; a cell that
raises fails the run. ``LCE_QUICK`` tells the notebooks' ``QUICK`` parameter
which settings to use (quick ones by default).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import jupytext
import nbformat
from nbclient import NotebookClient

from .paths import ROOT

__all__ = ["NOTEBOOKS_DIR", "QUICK_ENV", "sources", "execute", "build_all"]

NOTEBOOKS_DIR: Path = ROOT / "notebooks"
QUICK_ENV = "LCE_QUICK"
KERNEL = {"name": "python3", "display_name": "Python 3", "language": "python"}


def sources(folder: Path = NOTEBOOKS_DIR) -> list[Path]:
    """The notebook sources ``NN_*.py`` in ``folder``, in reading order."""
    return sorted(folder.glob("[0-9][0-9]_*.py"))


@contextlib.contextmanager
def _environment(name: str, value: str) -> Iterator[None]:
    previous = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if previous is None:
            del os.environ[name]
        else:
            os.environ[name] = previous


def execute(source: Path, output: Path | None = None, *, quick: bool = True,
            timeout: int = 900) -> nbformat.NotebookNode:
    """Run ``source`` (a percent-format ``.py``) as a notebook in a fresh kernel; write it to ``output``.

    The kernel's working directory is the source's folder. Raises
    ``nbclient.exceptions.CellExecutionError`` naming the failing cell.
    """
    notebook = jupytext.read(source)
    notebook.metadata["kernelspec"] = KERNEL
    client = NotebookClient(notebook, timeout=timeout, kernel_name=KERNEL["name"],
                            resources={"metadata": {"path": str(source.parent)}})
    with _environment(QUICK_ENV, "1" if quick else "0"):
        client.execute()
    if output is not None:
        nbformat.write(notebook, output)
    return notebook


def build_all(folder: Path = NOTEBOOKS_DIR, *, quick: bool = True) -> list[Path]:
    """Execute every source in ``folder`` and write ``NN_name.ipynb`` beside it."""
    written = []
    for source in sources(folder):
        target = source.with_suffix(".ipynb")
        execute(source, target, quick=quick)
        written.append(target)
    return written
