"""Issue 20 item 2: no string from a run folder becomes markup in ``report.html``; only the report's own script runs.

On a7aa795 a class name holding a ``<script>`` reached ``tables/paper_*.html`` unescaped and the report pasted
that file verbatim: headless Chromium ran it. The planted scripts set ``data-owned`` on ``<body>`` to a value
they compute at run time (so the marker is absent from the page unless a script ran)."""
from __future__ import annotations

import html
import warnings

import pandas as pd
import pytest
import torch

from conftest import tiny_run
from test_report import chromium
from xbench.spec.config import RunConfig
from xbench.core.errors import XBenchWarning
from xbench.outputs.report import build_report
from xbench.workflows.run import run
from xbench.outputs.tables import PaperTable

pytestmark = pytest.mark.usefixtures("phantom_cache")
SCRIPT = "<script>document.body.setAttribute('data-owned', 'yes-' + 'ran')</script>"
IMG = "<img src=x onerror=\"document.body.setAttribute('data-owned', 'yes-' + 'ran')\">"
MARK = "yes-ran"


@pytest.fixture(scope="module")
def hostile_run(tmp_path_factory) -> dict:
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("hostile-run")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", XBenchWarning)
        run(RunConfig.from_dict(tiny_run(out, cases=8)), progress=False)
    rows = pd.Index([f"model {SCRIPT}", "center_prior"], name="Method")
    cols = [f"Nodule {IMG}", "Mass"]
    values = pd.DataFrame([[50.0, 40.0], [30.0, 20.0]], index=rows, columns=cols)
    n = pd.DataFrame([[20, 20], [20, 20]], index=rows, columns=cols)
    table = PaperTable(values, n, pd.Series([True, True], index=rows), caption=f"Table {SCRIPT}", notes=[IMG])
    table.write(out / "tables" / "paper_hostile")
    tidy = pd.DataFrame({f"{SCRIPT} / value": [0.5], f"{SCRIPT} / ci_low": [0.4], f"{SCRIPT} / ci_high": [0.6]},
                        index=pd.Index([IMG], name="model"))
    tidy.to_csv(out / "tables" / "csv_hostile.csv")  # a write_table table: .csv + .md
    (out / "tables" / "csv_hostile.md").write_text(f"**{SCRIPT}**\n")
    path = build_report(out, max_cases_per_class=1)
    return {"out": out, "path": path, "html": path.read_text()}


def test_paper_table_html_file_is_escaped(hostile_run):
    text = (hostile_run["out"] / "tables" / "paper_hostile.html").read_text()
    assert "<script>" not in text and "<img src=x" not in text and "&lt;script&gt;" in text


def test_report_holds_hostile_names_as_text_only(hostile_run):
    text = hostile_run["html"]
    assert text.count("<script>") == 1 and "<img src=x" not in text  # the report's own script only
    assert "&lt;script&gt;document.body.setAttribute" in text and "Paper-form table: paper_hostile" in text
    assert "Content-Security-Policy" in text and "script-src 'sha256-" in html.unescape(text)


def test_no_planted_script_runs_in_headless_chromium(hostile_run, tmp_path):
    dom, _ = chromium(hostile_run["path"].as_uri(), "--dump-dom", "--virtual-time-budget=3000")
    assert 'data-ready="1"' in dom and MARK not in dom
    assert "&lt;script&gt;" in dom  # the hostile name is shown, as text
    # defence in depth: a script pasted into the page by anything else is blocked by the CSP, while the
    # report's own script still runs (it marks <body data-ready="1"> when it has applied the URL-hash filters)
    pasted = hostile_run["html"].replace("</body>", SCRIPT + IMG + "</body>")
    page = tmp_path / "pasted.html"
    page.write_text(pasted)
    dom, _ = chromium(page.as_uri(), "--dump-dom", "--virtual-time-budget=3000")
    assert MARK not in dom
    assert 'data-ready="1"' in dom, "the report's own script did not run under its CSP"
