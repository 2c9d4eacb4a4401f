"""Build the research notebooks from their sources and run them top to bottom.

Each notebook is written as a percent-format script, ``notebooks/NN_name.py``
(readable diffs, reviewable as code), and committed next to its executed
``.ipynb`` (readable with outputs on a code host). :func:`execute` turns a
source into a notebook and runs every cell in a fresh kernel; a cell that
raises fails the run. ``LCE_QUICK`` tells the notebooks' ``QUICK`` parameter
which settings to use (quick ones by default).

The ``.ipynb`` is written exactly as JupyterLab saves it (:func:`save_as_jupyterlab`:
the same contents manager the server uses, jupytext's wrapper included), for the
kernel ``make setup`` registers (:data:`KERNEL`), without per-cell timing metadata.
So a reader who opens a committed notebook in ``make lab`` and leaves it open
finds nothing to save: ``git status`` stays clean.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import jupytext
import nbformat
from nbclient import NotebookClient

from analysis.paths import ROOT

__all__ = ["NOTEBOOKS_DIR", "QUICK_ENV", "sources", "stable_cell_ids", "execute", "build_all"]

NOTEBOOKS_DIR: Path = ROOT / "notebooks"
QUICK_ENV = "LCE_QUICK"
MARKER = "**Conclusion.**"
"""How the prose that closes each notebook section starts (tests/repo/test_notebooks.py requires one at the
 end of every section)."""

KERNEL = {"name": "lce-lab", "display_name": "Python (lce-lab)", "language": "python"}
"""The kernel ``make setup`` registers in the venv (``ipykernel install --sys-prefix``) and every notebook names."""


def sources(folder: Path = NOTEBOOKS_DIR) -> list[Path]:
    """The notebook sources ``NN_*.py`` in ``folder``, in reading order."""
    return sorted(folder.glob("[0-9][0-9]_*.py"))


def stable_cell_ids(notebook: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Give every cell an id drawn from its type and source (jupytext draws random ones), in place.

    Re-executing an unchanged source then writes the same ``.ipynb`` bytes, and editing a cell changes
    that cell's id only. A repeated cell gets ``-2``, ``-3``... after its digest.
    """
    seen: collections.Counter[str] = collections.Counter()
    for cell in notebook.cells:
        digest = hashlib.sha1(f"{cell.cell_type}\n{cell.source}".encode()).hexdigest()[:8]
        seen[digest] += 1
        cell.id = digest if seen[digest] == 1 else f"{digest}-{seen[digest]}"
    return notebook


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
    notebook = stable_cell_ids(jupytext.read(source))
    notebook.metadata.pop("jupytext", None)  # the source's own format; not part of the notebook
    notebook.metadata["kernelspec"] = dict(KERNEL)
    client = NotebookClient(notebook, timeout=timeout, kernel_name=KERNEL["name"], record_timing=False,
                            resources={"metadata": {"path": str(source.parent)}})
    with _environment(QUICK_ENV, "1" if quick else "0"):
        client.execute()
    if output is not None:
        save_as_jupyterlab(notebook, output)
    return notebook


def save_as_jupyterlab(notebook: nbformat.NotebookNode, path: Path) -> None:
    """Write ``notebook`` to ``path`` through the contents manager JupyterLab's server uses to save.

    That is jupyter_server's file manager wrapped by jupytext's server extension
    (installed with the notebooks extra), so the bytes are the ones a save in
    ``make lab`` would produce.
    """
    manager = _server_contents_manager(path.parent)
    model = {"type": "notebook", "format": "json", "content": nbformat.from_dict(notebook)}
    asyncio.run(manager.save(model, path.name))


def _server_contents_manager(root: Path):
    from jupyter_server.services.contents.largefilemanager import AsyncLargeFileManager
    from jupytext.async_contentsmanager import build_async_jupytext_contents_manager_class

    manager_class = build_async_jupytext_contents_manager_class(AsyncLargeFileManager)
    return manager_class(root_dir=str(root))


def build_all(folder: Path = NOTEBOOKS_DIR, *, quick: bool = True, only: tuple[str, ...] = ()) -> list[Path]:
    """Execute every source in ``folder`` (or those whose number ``NN`` is in ``only``) and write
    ``NN_name.ipynb`` beside it. ``ValueError`` naming the numbers that match no source."""
    chosen = [source for source in sources(folder) if not only or source.stem[:2] in only]
    unknown = sorted(set(only) - {source.stem[:2] for source in chosen})
    if unknown:
        raise ValueError(f"only={unknown} matches no notebook source in {folder} (sources: "
                         f"{', '.join(source.stem[:2] for source in sources(folder))})")
    written = []
    for source in chosen:
        target = source.with_suffix(".ipynb")
        execute(source, target, quick=quick)
        written.append(target)
    return written


# ---- python -m analysis notebooks ----------------------------------------------------------------------------

DESCRIPTION = "Runs notebooks/NN_*.py top to bottom in a fresh kernel each (quick settings unless --full)."


def add_arguments(parser) -> None:
    parser.add_argument("--full", action="store_true", help="QUICK=False: the larger settings (slow)")
    parser.add_argument("--only", nargs="+", default=[], metavar="NN",
                        help="only the notebooks with these numbers, e.g. --only 01 06")


def run(args) -> None:
    from analysis.paths import display_path

    for path in build_all(quick=not args.full, only=tuple(args.only)):
        print(display_path(path))
