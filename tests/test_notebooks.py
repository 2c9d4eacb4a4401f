"""Every notebook runs top to bottom from its source (quick settings), and its committed .ipynb is in sync."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import jupytext
import nbformat
import pytest

from analysis.notebooks import KERNEL, execute, save_as_jupyterlab, sources

SOURCES = sources()


def test_there_are_notebooks():
    assert [s.stem[:2] for s in SOURCES] == ["01", "02", "03", "04"]


@pytest.mark.slow
@pytest.mark.parametrize("source", SOURCES, ids=lambda s: s.stem)
def test_notebook_executes_without_error(source, tmp_path):
    copy = shutil.copy(source, tmp_path / source.name)
    notebook = execute(tmp_path / source.name, quick=True)
    errors = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors, errors
    assert copy.exists()


@pytest.mark.parametrize("source", SOURCES, ids=lambda s: s.stem)
def test_committed_notebook_matches_its_source_and_has_outputs(source):
    committed = nbformat.read(source.with_suffix(".ipynb"), as_version=4)
    expected = jupytext.read(source)

    def code(nb):
        return [cell.source for cell in nb.cells if cell.cell_type == "code"]

    assert code(committed) == code(expected), f"{source.name} changed: rebuild with `python -m analysis notebooks`"
    assert any(cell.get("outputs") for cell in committed.cells if cell.cell_type == "code")
    first = next(cell for cell in committed.cells if cell.cell_type == "markdown")
    title = first.source.splitlines()[0]
    assert title.startswith(f"# {source.stem[:2]} "), f"{source.name} opens with its numbered title, got {title!r}"
    assert "?" in first.source, f"{source.name}'s opening cell states the question it answers"


@pytest.mark.parametrize("source", SOURCES, ids=lambda s: s.stem)
def test_committed_notebook_is_as_jupyterlab_saves_it(source, tmp_path):
    """Opening a committed notebook in `make lab` must not rewrite it (git status stays clean).

    JupyterLab rewrites a notebook whose kernelspec names a kernel other than the one it starts,
    and its server re-serialises whatever it saves; both must be no-ops on the committed file.
    """
    committed = source.with_suffix(".ipynb")
    notebook = nbformat.read(committed, as_version=4)
    assert notebook.metadata.get("kernelspec") == KERNEL
    assert "jupytext" not in notebook.metadata, "jupytext metadata is removed by JupyterLab's save"
    timed = [cell.id for cell in notebook.cells if "execution" in cell.metadata]
    assert not timed, f"cells {timed} carry execution timing metadata, which churns on every run"
    shutil.copy(source.parent / "jupytext.toml", tmp_path)  # the pairing JupyterLab applies beside it
    save_as_jupyterlab(notebook, tmp_path / committed.name)
    assert (tmp_path / committed.name).read_bytes() == committed.read_bytes(), (
        f"{committed.name} is not in the form JupyterLab saves: rebuild with `python -m analysis notebooks`")


def test_makefile_registers_the_kernel_the_notebooks_name():
    makefile = (Path(__file__).resolve().parents[1] / "Makefile").read_text()
    assert re.search(rf"^KERNEL := {re.escape(KERNEL['name'])}$", makefile, re.M)
    assert re.search(rf"^KERNEL_DISPLAY := {re.escape(KERNEL['display_name'])}$", makefile, re.M)
    assert "ipykernel install --sys-prefix --name $(KERNEL)" in makefile
