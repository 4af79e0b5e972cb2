"""The counts and section numbers that "Known differences from the paper" states, checked against the code and the paper."""
from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

import pytest

from conftest import shared_path
from xbench.spec.registry import dataset_manifest

ROOT = Path(__file__).resolve().parents[2]
PAPER_DATASETS = ["rsna_pneumonia", "siim_acr", "covid_rural", "chestx_det10", "chexlocalize", "nih_bbox", "vindr_cxr"]


def _docs() -> str:
    return "\n".join(p.read_text(encoding="utf-8") for p in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))])


def test_the_36_findings_sentence_counts_what_the_manifests_hold():
    names, ids = [], defaultdict(set)
    for d in PAPER_DATASETS:
        for c in dataset_manifest(d)["classes"]:
            names.append(c["name"])
            ids[c["finding"]].add(c["name"])
    stated = re.search(r"55 class entries \(([\d +]+),.*?36 distinct class names.*?to (\d+) distinct finding ids",
                       " ".join(_docs().split()))
    assert stated, "the '36 findings' paragraph is gone from README.md and docs/"
    assert [len(dataset_manifest(d)["classes"]) for d in PAPER_DATASETS] == [int(x) for x in stated[1].split("+")]
    assert (len(names), len(set(names)), len(ids)) == (55, 36, int(stated[2]))


@pytest.mark.shared
def test_cited_sections_are_the_papers_numbering():
    path = shared_path("research", "paper_2510.19599.txt")  # skips when ../shared is absent
    lines = path.read_text(encoding="utf-8").splitlines()
    headings = [(i + 1, int(m[1])) for i, line in enumerate(lines) if (m := re.match(r"(\d)\. [A-Z]{3}", line))]

    def section(line_no: int) -> int:
        return max(n for start, n in headings if start <= line_no)

    cited = re.findall(r"Sec\. (\d), line (\d+)", " ".join(_docs().split()))
    assert len(cited) >= 3
    for sec, line in cited:
        assert section(int(line)) == int(sec), f"Sec. {sec}, line {line}: that line is in Sec. {section(int(line))}"
