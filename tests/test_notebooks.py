"""Every notebook runs top to bottom from its source (quick settings), and its committed .ipynb is in sync."""

from __future__ import annotations

import shutil

import jupytext
import nbformat
import pytest

from analysis.notebooks import execute, sources

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
    assert len(first.source.split()) > 30, "each notebook opens with a paragraph saying what it shows"
