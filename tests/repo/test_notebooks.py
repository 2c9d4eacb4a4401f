"""Every notebook runs top to bottom from its source (quick settings), and its committed .ipynb is in sync."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import jupytext
import nbformat
import pytest

from analysis.report.notebooks import KERNEL, MARKER, execute, save_as_jupyterlab, sources, stable_cell_ids

SOURCES = sources()


def test_there_are_notebooks():
    """Numbered 01, 02, ... with no gap: the README and the notebooks refer to one another by number."""
    numbers = [s.stem[:2] for s in SOURCES]
    assert len(numbers) >= 8 and numbers == [f"{n:02d}" for n in range(1, len(numbers) + 1)]


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


def _sections(notebook: nbformat.NotebookNode) -> list[tuple[str, list]]:
    """Each "## " section of a notebook: its heading and the cells up to the next section."""
    sections: list[tuple[str, list]] = []
    for cell in notebook.cells:
        heading = next((line for line in cell.source.splitlines() if line.startswith("## ")), None)
        if cell.cell_type == "markdown" and heading is not None:
            sections.append((heading, []))
        elif sections:
            sections[-1][1].append(cell)
    return sections


def _is_conclusion(output: dict) -> bool:
    text = output.get("data", {}).get("text/markdown", "")
    return "".join(text).startswith(MARKER)


@pytest.mark.parametrize("source", SOURCES, ids=lambda s: s.stem)
def test_every_section_of_the_committed_notebook_ends_with_a_conclusion(source):
    """A reader finds each section's result stated in words: prose over the numbers of its report module."""
    notebook = nbformat.read(source.with_suffix(".ipynb"), as_version=4)
    sections = _sections(notebook)
    assert sections, f"{source.name} has no '## ' sections"
    for heading, cells in sections:
        code = [cell for cell in cells if cell.cell_type == "code"]
        assert code, f"{source.name}, {heading!r}: no code cell"
        last = code[-1].get("outputs", [])
        assert any(_is_conclusion(output) for output in last), (
            f"{source.name}, {heading!r}: its last code cell must display a Markdown conclusion starting with "
            f"{MARKER!r} (prose over its report module's numbers)")


@pytest.mark.parametrize("source", SOURCES, ids=lambda s: s.stem)
def test_committed_outputs_are_stable_and_show_no_nan(source):
    """No memory address in a text/plain repr (it would change on every run) and no NaN cell in a table."""
    notebook = nbformat.read(source.with_suffix(".ipynb"), as_version=4)
    for cell in notebook.cells:
        for output in cell.get("outputs", []) if cell.cell_type == "code" else []:
            data = output.get("data", {})
            plain, markup = "".join(data.get("text/plain", "")), "".join(data.get("text/html", ""))
            assert not re.search(r" at 0x[0-9a-f]+", plain), f"{source.name}: {plain[:80]!r} changes on every run"
            assert not re.search(r">\s*(nan|NaN|None)\s*<", markup), f"{source.name}: a table shows a missing value"


def test_cell_ids_depend_on_the_cells_only():
    """Executing an unchanged source twice must write the same bytes: no random cell ids."""
    first, second = (stable_cell_ids(jupytext.read(SOURCES[0])) for _ in range(2))
    assert [cell.id for cell in first.cells] == [cell.id for cell in second.cells]
    twins = stable_cell_ids(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x") for _ in range(2)]))
    assert [cell.id for cell in twins.cells] == [twins.cells[0].id, twins.cells[0].id + "-2"]
    nbformat.validate(twins)


def test_the_section_check_catches_a_section_without_a_conclusion():
    cell = nbformat.v4.new_code_cell
    conclusion = nbformat.v4.new_output("execute_result", data={"text/markdown": f"{MARKER} yes"})
    notebook = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# 00 · t?"), nbformat.v4.new_markdown_cell("## A"),
        cell("x", outputs=[conclusion]), nbformat.v4.new_markdown_cell("## B"), cell("y", outputs=[])])
    verdicts = {heading: any(_is_conclusion(o) for o in [c for c in cells if c.cell_type == "code"][-1].outputs)
                for heading, cells in _sections(notebook)}
    assert verdicts == {"## A": True, "## B": False}


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
    makefile = (Path(__file__).resolve().parents[2] / "Makefile").read_text()
    assert re.search(rf"^KERNEL := {re.escape(KERNEL['name'])}$", makefile, re.M)
    assert re.search(rf"^KERNEL_DISPLAY := {re.escape(KERNEL['display_name'])}$", makefile, re.M)
    assert "ipykernel install --sys-prefix --name $(KERNEL)" in makefile
