"""`reproduce --figures-dir` keeps a committed set whose numbers agree within tolerance, else writes and names the cells."""
from __future__ import annotations

import logging
import re
import shutil
from pathlib import Path

import pytest

from xbench.outputs.agreement import BOOTSTRAP_ATOL, VALUE_ATOL, compare_tables
from xbench.workflows.reproduce import copy_outputs

METRICS = ("model,dataset,finding,metric,value,ci_low,ci_high,n_pairs\n"
           "a,phantom,Nodule,pointing,0.8947368421052632,0.8088157071339174,0.9642857142857143,57\n"
           "b,phantom,Nodule,dice@best,0.4583136138856419,0.4484098906767261,0.4705858207194164,57\n")
PAPER = "Method,phantom / Point,phantom / Point / n_pairs\nCLIP,4.72,303\n"


def _run(tmp_path: Path, metrics: str = METRICS, paper: str = PAPER) -> Path:
    run = tmp_path / "run"
    shutil.rmtree(run, ignore_errors=True)
    (run / "tables").mkdir(parents=True)
    (run / "figures").mkdir()
    (run / "tables" / "metrics.csv").write_text(metrics)
    (run / "tables" / "paper_table1.csv").write_text(paper)
    (run / "tables" / "paper_table1.md").write_text(paper.replace(",", " | "))
    (run / "figures" / "fig.png").write_bytes(b"png of " + metrics.encode())
    return run


def _committed(tmp_path: Path) -> Path:
    figs = tmp_path / "figures"
    copy_outputs(_run(tmp_path), figs)
    return figs


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_a_run_within_tolerance_leaves_the_committed_files_and_says_so(tmp_path, caplog):
    figs = _committed(tmp_path)
    before = _snapshot(figs)
    changed = (METRICS.replace("0.8947368421052632", "0.8947508421052632")  # value moved 1.4e-5
               .replace("0.8088157071339174", "0.8185657071339174"))  # CI bound moved 0.00975
    with caplog.at_level(logging.INFO, logger="xbench"):
        written = copy_outputs(_run(tmp_path, changed, PAPER.replace("4.72", "4.73")), figs)
    assert written == [] and _snapshot(figs) == before
    line = [r.getMessage() for r in caplog.records if "kept the committed" in r.getMessage()]
    assert len(line) == 1 and "1.4e-05" in line[0] and "0.00975" in line[0], line


def test_a_run_beyond_tolerance_writes_every_file_and_names_the_cells(tmp_path, caplog):
    figs = _committed(tmp_path)
    changed = METRICS.replace("0.4583136138856419", "0.4593136138856419")  # 1e-3 > VALUE_ATOL
    with caplog.at_level(logging.INFO, logger="xbench"):
        written = copy_outputs(_run(tmp_path, changed), figs)
    assert {p.name for p in written} == {"metrics.csv", "paper_table1.csv", "paper_table1.md", "fig.png"}
    assert (figs / "metrics.csv").read_text() == changed
    msg = "\n".join(r.getMessage() for r in caplog.records)
    assert "metrics.csv: row 3, column 'value': 0.4583136138856419 → 0.4593136138856419" in msg


@pytest.mark.parametrize("old, new", [("303", "304"), ("CLIP", "KAD"), ("4.72", "4.74")])
def test_counts_and_text_must_be_equal_and_rounded_cells_move_one_unit_at_most(tmp_path, old, new):
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    a.write_text(PAPER)
    b.write_text(PAPER.replace(old, new))
    result = compare_tables({"t.csv": a}, {"t.csv": b})
    assert not result.ok and old in result.problems[0] and new in result.problems[0]


def test_tolerances_are_the_ones_the_readme_states():
    root = Path(__file__).resolve().parents[2]
    text = "\n".join(p.read_text() for p in [root / "README.md", *sorted((root / "docs").rglob("*.md"))])
    stated = re.search(r"\*\*([0-9.e-]+)\*\* absolute for a\s+value,\s+\*\*([0-9.e-]+)\*\* for a bootstrap", text)
    assert stated, "the tolerance paragraph (What identical means) is gone from README.md and docs/"
    assert (float(stated[1]), float(stated[2])) == (VALUE_ATOL, BOOTSTRAP_ATOL)


def test_a_new_folder_or_a_missing_committed_file_gets_every_file(tmp_path):
    figs = _committed(tmp_path)
    assert len(list(figs.iterdir())) == 4
    (figs / "fig.png").unlink()
    assert {p.name for p in copy_outputs(_run(tmp_path), figs)} == {"metrics.csv", "paper_table1.csv",
                                                                    "paper_table1.md", "fig.png"}
