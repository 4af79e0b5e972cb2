"""Transcription of the paper's Tables 1–5 from its extracted text into the tidy reference CSV.

``python -m xbench.paper.transcribe PAPER_TXT OUT_CSV`` rewrites ``reference.csv``;
``tests/paper/test_paper.py`` re-runs it on ``../shared/research/paper_2510.19599.txt``
and asserts the committed CSV is exactly its output.

How each table is read (line numbers are those of the extracted text):

* Tables 1, 3, 4, 5: one tab-separated row per model; ``<u>…</u>`` marks an
  underlined value (the extraction kept underlines, lost bold).
* Table 2 (VinDr-CXR) is printed as two rows per model; the extraction writes
  each model as one line ``Mean  a1 b1  a2 b2 … a10 b10  a11``, i.e. the values of
  the upper class row (a) and lower class row (b) interleaved column by column.
  Upper row: Aortic enl. … Lung Opac. (11 classes); lower row: Lung cavity …
  Rib fract. (10). Model order is the paper's (CLIP … DeViDe), as in Table 1.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pandas as pd

from ..core.atomic import write_frame
from . import COLUMNS, DATASETS, MODELS, TABLE_CLASSES

_U = re.compile(r"<u>\s*([^<]*?)\s*</u>")


def _cell(text: str) -> tuple[str, str]:
    """Printed value and its visible mark ("underline" or "")."""
    m = _U.fullmatch(text.strip())
    return (m.group(1), "underline") if m else (text.strip(), "")


def _model(printed: str) -> str:
    name = re.sub(r"\[\d+\]$", "", printed.strip()).lower()
    if name not in MODELS:
        raise ValueError(f"unknown model {printed!r} in the paper text")
    return name


def _find(lines: list[str], pattern: str, start: int = 0) -> int:
    for i in range(start, len(lines)):
        if re.match(pattern, lines[i]):
            return i
    raise ValueError(f"no line matching {pattern!r} after line {start + 1}")


def transcribe(text: str) -> pd.DataFrame:
    """The tidy reference table (columns :data:`xbench.paper.COLUMNS`, flags empty) from the paper's text."""
    lines = text.splitlines()
    rows: list[dict] = []

    def add(table, model, dataset, paper_class, metric, printed, mark, line):
        finding = TABLE_CLASSES[table][paper_class] if paper_class != "Mean" else "(mean over classes)"
        rows.append({"table": table, "model": model, "dataset": dataset, "finding": finding,
                     "paper_class": paper_class, "metric": metric, "value": float(printed), "printed": printed,
                     "mark": mark, "source_line": line + 1})

    # Table 1: 7 datasets × (Point, Dice, IoU)
    start = _find(lines, r"^CLIP\[\d+\]\t")
    metrics = ("pointing", "dice@best", "iou@best")
    for i in range(start, start + 7):
        cells = lines[i].split("\t")
        model = _model(cells[0])
        values = cells[1:]
        if len(values) != 21:
            raise ValueError(f"Table 1 line {i + 1}: expected 21 values, got {len(values)}")
        for k, text in enumerate(values):
            printed, mark = _cell(text)
            add(1, model, list(DATASETS)[k // 3], "Mean", metrics[k % 3], printed, mark, i)

    # Table 2: VinDr-CXR, interleaved two-row layout
    upper, lower = list(TABLE_CLASSES[2])[:11], list(TABLE_CLASSES[2])[11:]
    start = _find(lines, r"^\d+\.\d+\t\d", _find(lines, r"^Mean\tAortic enl\."))
    for model, i in zip(MODELS, range(start, start + 7)):
        tokens = _U.sub(lambda m: m.group(1) + "@u", lines[i]).split()
        values = [(t.removesuffix("@u"), "underline" if t.endswith("@u") else "") for t in tokens]
        if len(values) != 22:
            raise ValueError(f"Table 2 line {i + 1}: expected Mean + 21 values, got {len(values)}")
        add(2, model, "vindr_cxr", "Mean", "pointing", *values[0], i)
        pairs = values[1:]
        for k, name in enumerate(upper):
            add(2, model, "vindr_cxr", name, "pointing", *pairs[2 * k], i)
        for k, name in enumerate(lower):
            add(2, model, "vindr_cxr", name, "pointing", *pairs[2 * k + 1], i)

    # Tables 3–5: Model, Mean, classes
    for table, dataset in ((3, "nih_bbox"), (4, "chestx_det10"), (5, "chexlocalize")):
        head = _find(lines, r"^Model\tMean\t" + r"\t".join(map(re.escape, list(TABLE_CLASSES[table])[:2])) + r"\t")
        header = lines[head].split("\t")[2:]
        if header != list(TABLE_CLASSES[table]):
            raise ValueError(f"Table {table} header on line {head + 1} is {header}, expected {list(TABLE_CLASSES[table])}")
        for i in range(head + 1, head + 8):
            cells = lines[i].split("\t")
            model = _model(cells[0])
            for name, text in zip(["Mean", *header], cells[1:], strict=True):
                add(table, model, dataset, name, "pointing", *_cell(text), i)
    out = pd.DataFrame(rows)
    out["flag"] = ""
    return out[list(COLUMNS)]


def main(argv: list[str] | None = None) -> None:
    from . import flag_inconsistencies

    paper, out = (argv or sys.argv[1:])[:2]
    table = flag_inconsistencies(transcribe(Path(paper).read_text()))
    write_frame(table, out)


if __name__ == "__main__":
    main()
