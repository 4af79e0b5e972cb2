"""Small readers shared by the loaders: CSV rows with their 1-based line numbers.

Line numbers are those of the file as a text editor shows them: the header is
line 1, the first data row line 2 (a quoted field spanning lines counts from the
line where its row starts). Fields are stripped of surrounding whitespace.
"""
from __future__ import annotations

import csv
from pathlib import Path

from ..core.errors import FormatError

__all__ = ["csv_records"]


def csv_records(path: str | Path) -> tuple[list[str], list[tuple[int, list[str]]]]:
    """Header and data rows of a CSV file, each row with its 1-based line number.

    Blank lines are dropped. Rows are returned as read (possibly with a wrong
    number of fields) so that the loader can raise or skip with the line.

    Raises
    ------
    FormatError
        The file is empty, not UTF-8 text, or not parseable as CSV.
    """
    path = Path(path)
    rows: list[tuple[int, list[str]]] = []
    try:
        with open(path, newline="", encoding="utf-8-sig") as handle:
            reader = csv.reader(handle)
            line = 1
            for row in reader:
                if any(cell.strip() for cell in row):
                    rows.append((line, [cell.strip() for cell in row]))
                line = reader.line_num + 1
    except (UnicodeDecodeError, csv.Error) as exc:
        raise FormatError(path, f"not a readable CSV file: {exc}") from exc
    if not rows:
        raise FormatError(path, "empty file: expected a header line", line=1)
    return rows[0][1], rows[1:]
