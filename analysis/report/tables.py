"""Tables as a reader sees them in a notebook: formatted numbers, wrapped text, no NaN, stable HTML.

:func:`show` turns a DataFrame into a :class:`Table` (a pandas ``Styler``) that
a notebook cell displays as its last expression. Three choices keep it readable
at a 1440 px JupyterLab window and keep the committed ``.ipynb`` stable:

* every layout rule is an inline ``style`` attribute on a ``<div>`` inside the
  cell: JupyterLab strips ``<style>`` blocks from the HTML of an untrusted
  notebook (one opened from a fresh clone) but keeps inline styles, so a
  wrapped column stays wrapped for every reader;
* the table's id is a fixed ``uuid`` (``Styler.set_uuid``) and its plain-text
  repr names that id instead of a memory address, so executing a notebook
  twice writes the same bytes;
* missing values read :data:`NA`, booleans ✓/✗, floats three significant
  digits unless a column's format says otherwise.
"""

from __future__ import annotations

import html
import math
import numbers
import re
from collections.abc import Callable, Iterable, Mapping

import numpy as np
import pandas as pd
from IPython.display import HTML
from pandas.io.formats.style import Styler

__all__ = ["NA", "Table", "show", "details", "check", "markdown_escape", "span", "markdown_table"]

NA = "—"
"""What a missing value (NaN, None) reads as in every table and conclusion."""

Format = str | Callable[[object], str]


def check(value: object) -> str:
    """✓ for true, ✗ for false, :data:`NA` for a missing value."""
    if _missing(value):
        return NA
    return "✓" if bool(value) else "✗"


def markdown_escape(text: str) -> str:
    """``text`` with Markdown's emphasis and code characters escaped (``N*D*C`` stays ``N*D*C``)."""
    return re.sub(r"([\\`*_\[\]<>])", r"\\\1", text)


def _missing(value: object) -> bool:
    if value is None:
        return True
    try:
        return bool(pd.isna(value))
    except (TypeError, ValueError):
        return False


def _general(value: object) -> str:
    """Default cell text: booleans ✓/✗, floats to three significant digits, the rest as str."""
    if _missing(value):
        return NA
    if isinstance(value, bool):
        return check(value)
    if isinstance(value, numbers.Integral):
        return f"{value:,}"
    if isinstance(value, numbers.Real):
        number = float(value)
        return f"{number:.3g}" if math.isfinite(number) else str(number)
    return str(value)


def _formatter(spec: Format) -> Callable[[object], str]:
    """A cell formatter from a ``str.format`` spec (``"{:.2f}"``) or a callable; missing values read :data:`NA`."""
    function = spec.format if isinstance(spec, str) else spec

    def apply(value: object) -> str:
        return NA if _missing(value) else str(function(value))

    return apply


class Table(Styler):
    """A ``Styler`` whose plain-text repr is stable: ``<table NAME: R rows x C columns>``.

    IPython writes an object's repr as the ``text/plain`` part of its output;
    Styler's own repr holds a memory address, which changes on every run.
    """

    def __repr__(self) -> str:
        rows, columns = self.data.shape
        return f"<table {self.uuid}: {rows} rows x {columns} columns>"


def _div(style: str) -> Callable[[str], str]:
    def wrap(text: str) -> str:
        return f'<div style="{style}">{text}</div>'

    return wrap


def show(frame: pd.DataFrame, formats: Mapping[str, Format] | None = None, *, name: str,
         wrap: Iterable[str] = (), wrap_width: str = "46ch", raw_html: Iterable[str] = (), index: bool = False,
         caption: str | None = None) -> Table:
    """``frame`` as a display-ready :class:`Table`.

    ``formats`` maps a column to a ``str.format`` spec or a callable; other
    columns get :func:`_general` (✓/✗, three significant digits). Missing values
    read :data:`NA`. Text is HTML-escaped, except in the ``raw_html`` columns
    (already HTML, e.g. links). Columns in ``wrap`` wrap at
    ``wrap_width`` and align left; other text columns align left without
    wrapping, number columns align right. ``name`` is the table's fixed HTML id
    (letters, digits, ``-`` and ``_``; unique within a notebook). The index is
    hidden unless ``index``.
    """
    if not re.fullmatch(r"[A-Za-z0-9_-]+", name):
        raise ValueError(f"name must be letters, digits, '-' or '_' (it becomes an HTML id), got {name!r}")
    formats = dict(formats or {})
    wrap, raw_html = set(wrap), set(raw_html)
    unknown = [column for column in [*formats, *wrap, *raw_html] if column not in frame.columns]
    if unknown:
        raise ValueError(f"columns {unknown} are not in the table; its columns are {list(frame.columns)}")
    table = Table(frame, cell_ids=False)
    table.set_uuid(name)
    wrapped = _div(f"min-width: 16ch; max-width: {wrap_width}; white-space: normal; text-align: left")
    left, centre = _div("white-space: nowrap; text-align: left"), _div("text-align: center")
    layouts = {}
    for column in frame.columns:
        cell = _formatter(formats[column]) if column in formats else _general
        if column in wrap:
            layouts[column] = wrapped
        elif pd.api.types.is_bool_dtype(frame[column]):
            layouts[column] = centre
        elif not pd.api.types.is_numeric_dtype(frame[column]):
            layouts[column] = left
        table.format(_compose(cell, layouts.get(column), escape=column not in raw_html), subset=[column])
    # Headers sit over their columns: left over text, centred over ✓/✗, right (JupyterLab's default) over numbers.
    header_styles = {column: "text-align: left" if layout in (wrapped, left) else "text-align: center"
                     for column, layout in layouts.items()}
    table.format_index(lambda label: _header(label, header_styles), axis="columns")
    if not index:
        table.hide(axis="index")
    if caption:
        table.set_caption(html.escape(caption))
    return table


def _header(label: object, styles: Mapping[object, str]) -> str:
    text = html.escape(str(label), quote=False)
    return _div(styles[label])(text) if label in styles else text


def _compose(cell: Callable[[object], str], layout: Callable[[str], str] | None, *,
             escape: bool = True) -> Callable[[object], str]:
    """Format a cell, escape its text for HTML, then lay it out (the escaping must not touch the layout's tags)."""

    def apply(value: object) -> str:
        text = html.escape(cell(value), quote=False) if escape else cell(value)
        return text if layout is None else layout(text)

    return apply


def details(summary: str, table: Table) -> HTML:
    """``table`` folded under a one-line ``summary`` the reader clicks to open (HTML ``<details>``)."""
    return HTML(f"<details><summary>{html.escape(summary)}</summary>{table.to_html()}</details>")


def span(values, spec: str = ".2f", sep: str = "–") -> str:
    """``"1.00"`` when every finite value formats the same, else ``"1.00–1.48"`` (lowest, ``sep``, highest)."""
    values = [v for v in values if pd.notna(v) and np.isfinite(v)]
    low, high = format(min(values), spec), format(max(values), spec)
    return low if low == high else f"{low}{sep}{high}"


def markdown_table(frame: pd.DataFrame, formats: dict[str, str] | None = None) -> str:
    """``frame`` as a Markdown table (the README's generated blocks): a number through its column's spec in
    ``formats`` (``".2f"`` or ``"{:.2f}"``), booleans ✓/✗, missing values —."""
    formats = formats or {}

    def cell(column, value) -> str:
        if isinstance(value, (bool, np.bool_)) or (not isinstance(value, str) and pd.isna(value)):
            return check(value)
        spec = formats.get(column, "")
        if isinstance(value, str):
            return value
        return spec.format(value) if "{" in spec else format(value, spec)

    lines = ["| " + " | ".join(map(str, frame.columns)) + " |", "|---" * len(frame.columns) + "|"]
    lines += ["| " + " | ".join(cell(c, v) for c, v in zip(frame.columns, row, strict=True)) + " |"
              for row in frame.itertuples(index=False)]
    return "\n".join(lines) + "\n"
