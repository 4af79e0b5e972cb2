"""HTML report of a run: built from the run folder alone; checked in headless Chromium where installed
(screenshot, no console errors, URL-hash filters change which cards are shown)."""
from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pandas as pd
import pytest

from conftest import copy_run
from xbench.cli import main
from xbench.evaluation.evaluate import load_tables
from xbench.outputs.report import SIZE_EDGES, build_report

CASES, PER_CLASS = 22, 3
pytestmark = pytest.mark.usefixtures("phantom_cache")


@pytest.fixture(scope="module")
def report(tmp_path_factory, phantom_run) -> dict:
    out = copy_run(phantom_run, tmp_path_factory.mktemp("run-for-report") / "run")  # the report is written into it
    path = build_report(out, max_cases_per_class=PER_CLASS)
    pairs = load_tables(out)["pairs"]
    rows = load_tables(out)["pairs"].drop_duplicates(["dataset", "case_id", "finding"])
    order = {c: i for i, c in enumerate(sorted(rows["case_id"]))}
    shown = (rows.assign(o=rows["case_id"].map(order)).sort_values("o").groupby(["dataset", "finding"], sort=False)
             .head(PER_CLASS))
    return {"out": out, "path": path, "html": path.read_text(), "pairs": pairs, "shown": shown}


def test_report_is_self_contained_and_complete(report):
    text = report["html"]
    for section in ("Tables", "Per-case browser", "Figures", "Models and weights", "Evaluation log", "Run configuration"):
        assert f">{section}</h2>" in text
    assert not re.search(r'(src|href)="(https?:)?//', text) and "<link" not in text
    assert text.count('<div class="card"') == len(report["shown"]) > 0
    assert text.count('class="sortable"') >= 3
    for model in ("center_prior", "random_prior", "anatomical_prior"):
        assert f'data-model="{model}"' in text
    assert "pairs evaluated" in text and "chunk_size" in text
    assert f"Showing {len(report['shown'])} of {report['pairs'].drop_duplicates(['case_id', 'finding']).shape[0]}" in text


def test_cli_report(report, tmp_path, capsys):
    assert main(["report", "--run", str(report["out"]), "--out", str(tmp_path / "r.html"), "--cases-per-class", "1"]) == 0
    assert (tmp_path / "r.html").stat().st_size > 10_000 and "report in" in capsys.readouterr().out
    assert main(["report", "--run", str(tmp_path / "nothing")]) == 2


def browser() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    pytest.skip("no headless browser installed (apt-get install chromium): the report's browser check is skipped; "
                "the report itself is still built and checked above")


def chromium(url: str, *args: str) -> tuple[str, str]:
    with tempfile.TemporaryDirectory() as profile:
        done = subprocess.run([browser(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                               "--disable-background-networking", "--disable-component-update", "--disable-sync",
                               f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0", *args, url],
                              capture_output=True, text=True, timeout=120)
    return done.stdout, done.stderr


def visible(dom: str) -> tuple[int, int]:
    """(cards shown, the page's own 'shown' counter) in a dumped DOM."""
    cards = len(re.findall(r'<div class="card"[ >]', dom))
    counter = int(re.search(r'id="shown">(\d+)<', dom).group(1))
    return cards, counter


def expected(shown: pd.DataFrame, pairs: pd.DataFrame, *, finding=None, model=None, outcome=None, size=None) -> int:
    keep = shown
    if finding:
        keep = keep[keep["finding"] == finding]
    if size:
        labels = [f"{lo:.0%}–{hi:.0%}" for lo, hi in zip(SIZE_EDGES[:-1], SIZE_EDGES[1:])]
        bins = pd.cut(keep["area_fraction"], bins=list(SIZE_EDGES), labels=labels, include_lowest=True)
        keep = keep[bins == size]
    if outcome:
        hit = pairs[pairs["model"] == model] if model else pairs
        want = 1.0 if outcome == "hit" else 0.0
        ok = hit[hit["pointing"] == want][["case_id", "finding"]].drop_duplicates()
        keep = keep.merge(ok, on=["case_id", "finding"])
    return len(keep)


def test_in_headless_chromium(report, tmp_path):
    url = report["path"].resolve().as_uri()
    shot = tmp_path / "report.png"
    _, err = chromium(url, "--window-size=1400,1800", f"--screenshot={shot}")
    assert shot.exists() and shot.stat().st_size > 20_000, err[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    dom, err = chromium(url, "--dump-dom")
    assert 'data-ready="1"' in dom, "the page script did not finish"
    assert re.search(r'id="js-errors"[^>]*></pre>', dom), "JavaScript errors on the page"
    assert "Uncaught" not in err and ":CONSOLE" not in err, err[-2000:]
    total = len(report["shown"])
    assert visible(dom) == (total, total)

    shown, pairs = report["shown"], report["pairs"]
    cases = [({"class": "Nodule"}, expected(shown, pairs, finding="Nodule")),
             ({"model": "anatomical_prior", "outcome": "hit"}, expected(shown, pairs, model="anatomical_prior", outcome="hit")),
             ({"model": "anatomical_prior", "outcome": "miss"}, expected(shown, pairs, model="anatomical_prior", outcome="miss")),
             ({"outcome": "hit"}, expected(shown, pairs, outcome="hit")),
             ({"size": "0%–1%"}, expected(shown, pairs, size="0%–1%")),
             ({"class": "Cardiomegaly", "outcome": "miss", "model": "center_prior"},
              expected(shown, pairs[pairs["finding"] == "Cardiomegaly"], finding="Cardiomegaly", model="center_prior",
                       outcome="miss"))]
    counts = set()
    for params, want in cases:
        fragment = "&".join(f"{k}={v}" for k, v in params.items())
        dom, err = chromium(f"{url}#{fragment}", "--dump-dom")
        assert visible(dom) == (want, want), (fragment, visible(dom), want)
        assert "Uncaught" not in err
        if "model" in params:  # other models' panels are hidden inside the shown cards
            others = re.findall(r'<div class="panel hidden" data-model="([^"]+)"', dom)
            assert others and params["model"] not in others
        counts.add(want)
    assert len(counts) >= 2 and 0 < max(counts) < total, "the filters must change what is shown"


def test_paper_form_tables_are_included(report, tmp_path):
    from xbench.outputs.tables import write_paper_tables

    written = write_paper_tables(report["out"])
    text = build_report(report["out"], tmp_path / "r.html", max_cases_per_class=1).read_text()
    assert text.count("Paper-form table:") == sum(1 for p in written if p.suffix == ".md") >= 2


def test_a_table_written_under_several_names_is_shown_once(report, tmp_path):
    from xbench.outputs.tables import write_paper_tables

    written = write_paper_tables(report["out"])
    table1 = next(p for p in written if p.name == "table1_grounding.csv")
    copies = []
    for name in ("paper_table1", "paper_table1_significant"):  # what notebook 01 writes: the same table
        for suffix in (".csv", ".md"):
            copies.append(Path(shutil.copy(table1.with_suffix(suffix), report["out"] / "tables" / f"{name}{suffix}")))
    try:
        text = build_report(report["out"], tmp_path / "r.html", max_cases_per_class=1).read_text()
    finally:
        for p in copies:
            p.unlink()
    assert text.count("Paper-form table:") == sum(1 for p in written if p.suffix == ".md")
    assert "also written as paper_table1, paper_table1_significant" in text
