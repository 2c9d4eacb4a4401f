"""The README passages that quote data are exactly what analysis.docs writes from the committed results."""

from __future__ import annotations

import re

import pytest

from analysis import docs
from analysis.paths import ROOT


def test_committed_readmes_are_up_to_date_with_the_results_files():
    stale = docs.update(check=True)
    assert not stale, f"{[str(p.relative_to(ROOT)) for p in stale]} quote stale data: run `python -m analysis docs`"


@pytest.mark.parametrize("name", docs.DOCUMENTS)
def test_every_generated_passage_in_a_document_is_known_and_filled(name):
    text = (ROOT / name).read_text()
    begun = re.findall(r"<!-- BEGIN generated:([\w-]+) ", text)
    ended = re.findall(r"<!-- END generated:([\w-]+) -->", text)
    assert begun == ended and begun, f"{name}: unbalanced or missing generated passages"
    assert set(begun) <= set(docs.BLOCKS)
    for passage in begun:
        body = text.split(f"<!-- BEGIN generated:{passage} ")[1].split("-->", 1)[1].split("<!-- END")[0]
        assert re.search(r"\d", body), f"{name}: passage {passage!r} quotes no number"


def test_render_rewrites_only_between_markers_and_rejects_unknown_passages(tmp_path):
    text = ("before\n<!-- BEGIN generated:grid-sizes (python -m analysis docs) -->\nstale 1 run\n"
            "<!-- END generated:grid-sizes -->\nafter\n")
    rendered = docs.render(text)
    assert rendered.startswith("before\n") and rendered.endswith("<!-- END generated:grid-sizes -->\nafter\n")
    assert "stale" not in rendered and "`quick`" in rendered
    with pytest.raises(ValueError, match="unknown generated passage 'nope'"):
        docs.render(text.replace("grid-sizes", "nope"))


def test_cpu_chunking_table_reads_every_cpu_in_the_chunk_sweep():
    table = docs.cpu_chunking(ROOT / "analysis" / "results")
    assert "AMD EPYC" in table
    rows = [line for line in table.splitlines()[2:] if line.startswith("|")]
    assert rows and all(line.count("|") == 8 for line in rows)
