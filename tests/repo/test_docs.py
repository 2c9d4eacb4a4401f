"""The README passages that quote data are exactly what analysis.report.readme writes from the committed results."""

from __future__ import annotations

import re

import pytest

from analysis.paths import ROOT
from analysis.report import nb02_accuracy, readme


@pytest.mark.slow  # renders the generated passages from every results file

def test_committed_readmes_are_up_to_date_with_the_results_files():
    stale = readme.update(check=True)
    assert not stale, f"{[str(p.relative_to(ROOT)) for p in stale]} quote stale data: run `python -m analysis docs`"


@pytest.mark.parametrize("name", readme.DOCUMENTS)
def test_every_generated_passage_in_a_document_is_known_and_filled(name):
    text = (ROOT / name).read_text()
    begun = re.findall(r"<!-- BEGIN generated:([\w-]+) ", text)
    ended = re.findall(r"<!-- END generated:([\w-]+) -->", text)
    assert begun == ended and begun, f"{name}: unbalanced or missing generated passages"
    assert set(begun) <= set(readme.BLOCKS)
    for passage in begun:
        body = text.split(f"<!-- BEGIN generated:{passage} ")[1].split("-->", 1)[1].split("<!-- END")[0]
        assert re.search(r"\d", body), f"{name}: passage {passage!r} quotes no number"


README_MAX_LINES = 350
PROCESS_WORDS = re.compile(r"\b(lent|this session|sessions?'|stale \.git|this machine('s)?|these sessions)\b", re.I)


def test_the_readme_answers_on_one_screen_and_stays_short():
    """Issue 33: the decision table before anything else that takes room, and the README at most ~350 lines."""
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= README_MAX_LINES
    headings = re.findall(r"^## (.+)$", text, re.M)
    assert headings[0] == "Which options for my head, and what they cost"
    assert text.index("<!-- BEGIN generated:decision-table") < text.index("## Quick start")


def test_every_page_is_reachable_from_the_readme():
    readme_text = (ROOT / "README.md").read_text()
    pages = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md"))
    assert pages, "docs/ holds no page"
    for page in pages:
        assert f"]({page})" in readme_text, f"{page} is not linked from the README"
    for name in readme.DOCUMENTS:
        if name.startswith("docs/"):
            assert (ROOT / name).exists(), name


@pytest.mark.parametrize("name", ["README.md", *sorted(p.name for p in (ROOT / "docs").glob("*.md"))])
def test_no_sentence_about_how_the_project_is_built(name):
    """What users read says "a GPU machine", not that a GPU was lent; no words from inside the project's process."""
    path = ROOT / name if name == "README.md" else ROOT / "docs" / name
    found = PROCESS_WORDS.findall(path.read_text())
    assert not found, f"{name}: {found}"


def test_each_generated_passage_is_told_once():
    names = [name for document in readme.DOCUMENTS
             for name in re.findall(r"<!-- BEGIN generated:([\w-]+) ", (ROOT / document).read_text())]
    repeated = sorted({name for name in names if names.count(name) > 1})
    assert not repeated, f"generated passages in more than one place: {repeated}"


def test_render_rewrites_only_between_markers_and_rejects_unknown_passages(tmp_path):
    text = ("before\n<!-- BEGIN generated:grid-sizes (python -m analysis docs) -->\nstale 1 run\n"
            "<!-- END generated:grid-sizes -->\nafter\n")
    rendered = readme.render(text)
    assert rendered.startswith("before\n") and rendered.endswith("<!-- END generated:grid-sizes -->\nafter\n")
    assert "stale" not in rendered and "`quick`" in rendered
    with pytest.raises(ValueError, match="unknown generated passage 'nope'"):
        readme.render(text.replace("grid-sizes", "nope"))


def test_cpu_chunking_table_reads_every_cpu_kind_in_the_chunk_sweep():
    table = readme.cpu_chunking(ROOT / "analysis" / "results")
    assert "AMD EPYC" in table and "AVX2 stand-in (bf16 GEMMs emulated)" in table
    rows = [line for line in table.splitlines()[2:] if line.startswith("|")]
    assert rows and all(line.count("|") == 9 for line in rows)


def test_bf16_errors_table_per_family_with_seed_intervals(tmp_path):
    """From the tiny fixture (2 seeds), its compact acc=fp32 rows renamed balanced: one table per family, a row per
    shape and setting, each cell the seed median with its percentile interval."""
    import numpy as np
    import pandas as pd

    fixture = pd.read_csv(ROOT / "analysis" / "testdata" / "tiny_results.csv")
    wide = (fixture["policy"] == "compact") & (fixture["acc_dtype"] == "float32")
    fixture.loc[wide, "policy"] = "balanced"
    fixture.to_csv(tmp_path / "tiny.csv", index=False)
    text = nb02_accuracy.readme_bf16_errors(tmp_path)
    rows = fixture[(fixture["device"] == "cpu") & (fixture["dtype"] == "bfloat16") & (fixture["op"] == "torch")
                   & (fixture["policy"] == "auto") & (fixture["chunking"] == "auto")]
    loss = rows["loss_fro_in_floors"]
    low, high = np.percentile(loss, [5, 95])
    assert text.startswith("`random` inputs, 2 seeds:\n\n| N×D×C | setting | loss | grad_input | grad_weight |")
    torch_row = next(line for line in text.splitlines() if "| torch default |" in line)
    assert torch_row.startswith(f"| 16×8×64 | torch default | {loss.median():.2f} [{low:.2f}–{high:.2f}] |")
    assert [line.split(" | ")[1] for line in text.splitlines() if line.startswith("| 16×8×64")] == [
        "lce default", "torch default", "lce balanced, acc fp32"]
    assert "seed medians [5th–95th percentile over seeds]" in text


def test_error_model_block_is_the_same_whatever_the_row_order(tmp_path):
    """The worst held-out misses tie (issue 21): the block breaks ties by a stable key, not by the sort's order."""
    import pandas as pd

    from analysis.report.nb07_choosing_options import readme_error_model
    from analysis.studies.error_model import DETAIL_VALIDATION_FILE, VALIDATION_FILE

    (tmp_path / VALIDATION_FILE).parent.mkdir(parents=True)
    for name in (VALIDATION_FILE, DETAIL_VALIDATION_FILE):
        validation = pd.read_csv(ROOT / "analysis" / "results" / name)
        validation.sample(frac=1, random_state=0).to_csv(tmp_path / name, index=False)
    assert readme_error_model(tmp_path) == readme_error_model(ROOT / "analysis" / "results")


@pytest.mark.slow  # renders the generated passages from every results file
@pytest.mark.parametrize("name, tables", [("realistic-inputs", 4), ("does-it-matter", 3)])
def test_notebook_05_and_06_blocks_are_labelled_tables_of_numbers(name, tables):
    """Each table is one label line (ending in a colon) and rows of equal width; no sentences besides."""
    parts = readme.BLOCKS[name](ROOT / "analysis" / "results").strip().split("\n\n")
    assert len(parts) == 2 * tables
    for label, table in zip(parts[::2], parts[1::2], strict=True):
        lines = table.splitlines()
        assert label.endswith(":") and "\n" not in label and re.fullmatch(r"(\|---)+\|", lines[1])
        assert len(lines) > 2 and {line.count("|") for line in lines} == {lines[1].count("|")}
