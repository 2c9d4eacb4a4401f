"""analysis.report.tables: formatted, wrapped, NaN-free tables whose HTML and repr do not change between runs."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from analysis.report.tables import NA, check, details, markdown_escape, show

FRAME = pd.DataFrame({"policy": ["compact", "accurate"], "error": [1.23456, math.nan], "front": [True, False],
                      "runs": [1200, 3], "reason": ["a long <reason> " * 8, None]})


def test_numbers_are_formatted_and_missing_values_read_a_dash():
    html = show(FRAME, {"error": "{:.2f}"}, name="t").to_html()
    assert ">1.23<" in html and "1.2345" not in html
    assert f">{NA}<" in html and "nan" not in html.lower()
    assert "✓" in html and "✗" in html and "1,200" in html


def test_wrapped_columns_wrap_with_inline_styles_and_text_is_escaped():
    html = show(FRAME, name="t", wrap=["reason"], wrap_width="40ch").to_html()
    assert "max-width: 40ch; white-space: normal" in html  # inline: kept when JupyterLab drops <style> blocks
    assert "&lt;reason&gt;" in html and "<reason>" not in html


def test_raw_html_columns_keep_their_markup():
    frame = pd.DataFrame({"figure": ['<a href="../figures/x.png">x</a>']})
    assert '<a href="../figures/x.png">x</a>' in show(frame, name="t", raw_html=["figure"]).to_html()


def test_html_and_repr_are_the_same_on_every_run():
    first, second = show(FRAME, name="fixed-id"), show(FRAME, name="fixed-id")
    assert first.to_html() == second.to_html() and 'id="T_fixed-id"' in first.to_html()
    assert repr(first) == "<table fixed-id: 2 rows x 5 columns>"


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="name must be"):
        show(FRAME, name="has space")
    with pytest.raises(ValueError, match=r"columns \['nope'\] are not in the table"):
        show(FRAME, {"nope": "{:.2f}"}, name="t")


def test_details_folds_a_table_under_a_summary():
    html = details("All <3> rows", show(FRAME, name="t")).data
    assert html.startswith("<details><summary>All &lt;3&gt; rows</summary>") and 'id="T_t"' in html


def test_small_helpers():
    assert [check(True), check(False), check(None), check(math.nan)] == ["✓", "✗", NA, NA]
    assert markdown_escape("a*b_c `d`") == r"a\*b\_c \`d\`"
