"""Do a run's tables agree with committed ones within the stated tolerances?

``xbench reproduce --figures-dir figures`` uses this to leave a committed set of tables and figures alone
when a new run on another machine gives the same numbers up to the floating-point differences that CPU
network inference has across instruction sets (the grounding metrics themselves are the same bits on
every machine; see :mod:`xbench.metrics.grounding`).

Tolerances (one rule per cell, read from the committed CSV as text):

* text and integers (names, counts, ``True``/``False``) must be equal;
* a number printed with few decimals (a rounded table: ``4.72``) may move by one unit of its last digit;
* a bootstrap quantity (a column named with ``ci_low``, ``ci_high``, ``run_low``, ``run_high``, ``p_value``,
  ``p_holm``, ``p_first``, ``rank_low``, ``rank_high``, ``mean_rank``) by :data:`BOOTSTRAP_ATOL` — a
  percentile or a tail count jumps from one replicate to the next when an input moves across another;
* any other number by :data:`VALUE_ATOL`.
"""
from __future__ import annotations

import io
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

__all__ = ["VALUE_ATOL", "BOOTSTRAP_ATOL", "TableAgreement", "compare_tables"]

#: a metric value, a difference, a calibration gap (largest seen across two CPUs: 1.4e-5)
VALUE_ATOL = 1e-4
#: a bootstrap CI bound, p-value or rank summary (largest seen across two CPUs: 0.00975)
BOOTSTRAP_ATOL = 0.02
_BOOTSTRAP_NAMES = ("ci_low", "ci_high", "run_low", "run_high", "p_value", "p_holm", "p_first", "rank_low",
                    "rank_high", "mean_rank")


@dataclass
class TableAgreement:
    """Outcome of :func:`compare_tables`: ``ok`` when every cell of every table is within tolerance."""

    max_value_diff: float = 0.0
    max_bootstrap_diff: float = 0.0
    n_rounded_moved: int = 0  #: rounded cells that moved by one unit of their last digit
    n_tables: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def _decimals(text: str) -> int | None:
    """Digits after the point of a plain decimal (``None`` for integers and exponent forms)."""
    if "." not in text or "e" in text.lower():
        return None
    return len(text.split(".", 1)[1])


def _cell_problem(column: str, old: str, new: str, out: TableAgreement) -> str | None:
    if old == new:
        return None
    try:
        a, b = float(old), float(new)
    except ValueError:
        return f"{old!r} → {new!r}"
    if "." not in old and "." not in new and "e" not in old.lower():
        return f"{old} → {new} (integers must be equal)"
    if a != a or b != b:  # NaN on one side only (both NaN compare equal as text)
        return f"{old} → {new}"
    diff = abs(a - b)
    bootstrap = any(name in column for name in _BOOTSTRAP_NAMES)
    d = _decimals(old)
    tol = BOOTSTRAP_ATOL if bootstrap else VALUE_ATOL
    if d is not None and d <= 4:  # a rounded cell: one unit of its last digit
        tol = max(tol, 10.0 ** -d + 1e-12)
        if diff <= tol:
            out.n_rounded_moved += 1
            return None
    if bootstrap:
        out.max_bootstrap_diff = max(out.max_bootstrap_diff, diff)
    else:
        out.max_value_diff = max(out.max_value_diff, diff)
    return None if diff <= tol else f"{old} → {new} (|Δ| = {diff:.3g} > {tol:.3g})"


def compare_tables(committed: dict[str, Path], new: dict[str, Path], limit: int = 5) -> TableAgreement:
    """Compare CSV tables by name (``committed[name]`` against ``new[name]``), cell by cell.

    A table present on one side only, or with other columns or rows, is a problem. At most ``limit``
    cells are listed per table (with the count of the rest).
    """
    out = TableAgreement()
    for name in sorted(set(committed) | set(new)):
        if name not in new or name not in committed:
            out.problems.append(f"{name}: {'not written by this run' if name not in new else 'new table'}")
            continue
        out.n_tables += 1
        if committed[name].read_bytes() == new[name].read_bytes():
            continue
        a = pd.read_csv(io.BytesIO(committed[name].read_bytes()), dtype=str, keep_default_na=False)
        b = pd.read_csv(io.BytesIO(new[name].read_bytes()), dtype=str, keep_default_na=False)
        if list(a.columns) != list(b.columns) or a.shape != b.shape:
            out.problems.append(f"{name}: shape/columns {a.shape} {list(a.columns)[:6]} → {b.shape} "
                                f"{list(b.columns)[:6]}")
            continue
        cells = []
        for col in a.columns:
            for row, (old, now) in enumerate(zip(a[col], b[col])):
                why = _cell_problem(col, old, now, out)
                if why:
                    cells.append(f"row {row + 2}, column {col!r}: {why}")
        if cells:
            more = f" (and {len(cells) - limit} more)" if len(cells) > limit else ""
            out.problems.append(f"{name}: " + "; ".join(cells[:limit]) + more)
    return out
