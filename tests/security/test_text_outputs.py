"""Text outputs show names from files as text: Markdown tables escape HTML and Markdown markup (a trusted notebook
renders HTML inside Markdown), and control / bidi characters are shown as ``\\uXXXX`` in tables and the report.
On 5da1164 class names went raw into the ``.md`` tables (``render(fmt='md')``, ``PaperTable.to_markdown``) and a
U+202E in a name reached the report and reversed the text after it."""
from __future__ import annotations

import pandas as pd

from xbench.outputs.report import render_page
from xbench.outputs.tables import PaperTable, render

HOSTILE = "Nodule <img src=x onerror=alert(1)> | [link](javascript:alert(1)) \u202eevil"


def _wide() -> pd.DataFrame:
    cols = pd.MultiIndex.from_tuples([(HOSTILE, "pointing", s) for s in ("value", "ci_low", "ci_high")])
    return pd.DataFrame([[0.5, 0.4, 0.6], [0.3, 0.2, 0.4]], index=pd.Index([f"model{HOSTILE}", "b"], name="model"),
                        columns=cols)


def _assert_inert(text: str) -> None:
    assert "<img" not in text and "[link](javascript" not in text and "\u202e" not in text, text
    assert "&lt;img" in text and "\\u202e" in text and "\\|" in text, text


def test_markdown_table_escapes_names():
    _assert_inert(render(_wide(), fmt="md"))


def test_paper_table_markdown_escapes_names():
    rows = pd.Index([f"model {HOSTILE}", "center_prior"], name="Method")
    values = pd.DataFrame([[50.0, 40.0], [30.0, 20.0]], index=rows, columns=[HOSTILE, "Mass"])
    n = pd.DataFrame(20, index=rows, columns=values.columns)
    table = PaperTable(values, n, pd.Series([True, True], index=rows), caption=f"Table {HOSTILE}", notes=[])
    text = table.to_markdown()
    _assert_inert(text)
    assert "| center_prior |" in text  # plain names are unchanged (no escaped underscores)


def test_report_shows_bidi_controls():
    page = render_page(f"run {HOSTILE}", [("Models", [{"kind": "p", "text": f"class {HOSTILE}"}])])
    assert "\u202e" not in page and "\\u202e" in page and "<img src=x" not in page
