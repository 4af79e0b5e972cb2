"""Paper-style tables from the tidy metric table, written as CSV + Markdown + LaTeX.

Every function takes the tidy table (one row per model × dataset × finding ×
metric with ``value, ci_low, ci_high, n``) and returns a wide DataFrame of
numbers; :func:`write_table` renders it, marking the best value of each column in
**bold** and the second best underlined (higher is better for every metric shown,
except ``best_tau`` which is not ranked). Baseline models (priors) are listed but
never ranked, and rows of unverified models carry a dagger.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from .atomic import atomic_write_text, write_frame

UNRANKED_METRICS = {"best_tau"}


def wide(tidy: pd.DataFrame, *, rows: str, columns: Sequence[str], metrics: Sequence[str], finding: str | None = None,
         dataset: str | None = None) -> pd.DataFrame:
    """Pivot ``value``/``ci_low``/``ci_high`` to rows × (columns…, metric) with a ``stat`` level.

    ``finding`` / ``dataset`` filter the tidy rows first.
    """
    sel = tidy[tidy["metric"].isin(metrics)]
    if finding is not None:
        sel = sel[sel["finding"] == finding]
    if dataset is not None:
        sel = sel[sel["dataset"] == dataset]
    table = sel.pivot_table(index=rows, columns=[*columns, "metric"], values=["value", "ci_low", "ci_high"], aggfunc="first")
    table = table.reorder_levels([*range(1, table.columns.nlevels), 0], axis=1).sort_index(axis=1)
    table.columns = table.columns.set_names([*columns, "metric", "stat"])
    # pivot_table drops all-NaN columns (e.g. every CI bound without bootstrap): keep value/ci_low/ci_high triplets
    cells = list(dict.fromkeys(c[:-1] for c in table.columns))
    table = table.reindex(columns=pd.MultiIndex.from_tuples(
        [(*c, s) for c in cells for s in ("value", "ci_low", "ci_high")], names=table.columns.names))
    metric_level = table.columns.get_level_values("metric")
    order = sorted(range(table.shape[1]), key=lambda i: (*table.columns[i][:-2], list(metrics).index(metric_level[i]),
                                                       ["value", "ci_low", "ci_high"].index(table.columns[i][-1])))
    return table.iloc[:, order]


def _ranks(values: pd.Series, eligible: pd.Series) -> pd.Series:
    """1 for the best, 2 for the second best among eligible finite values (ties share a rank), else 0."""
    v = values.where(eligible & np.isfinite(values.astype(float)))
    distinct = sorted(v.dropna().unique(), reverse=True)
    rank = pd.Series(0, index=values.index)
    for r, target in enumerate(distinct[:2], start=1):
        rank[v == target] = r
    return rank


def _mark(name: str, baselines: Sequence[str], unverified: Sequence[str], notes: Mapping[str, str]) -> str:
    text = f"{name}†" if name in unverified else (f"{name} (baseline)" if name in baselines else str(name))
    return f"{text} ({notes[name]})" if name in notes else text


def render(table: pd.DataFrame, *, fmt: str, baselines: Sequence[str] = (), unverified: Sequence[str] = (),
           models_on: str = "rows", notes: Mapping[str, str] | None = None, digits: int = 3) -> str:
    """Markdown (``fmt="md"``) or LaTeX (``fmt="tex"``) text of a :func:`wide` table: ``value [low, high]`` cells.

    ``models_on="rows"`` (Table 1, recognition): models are the rows and each column is ranked;
    ``models_on="columns"`` (per-class Tables 2–5): models are the first column level and each
    row is ranked across models. ``notes`` adds a parenthesised note to a model's name
    (:func:`model_notes`: random-init weights).
    """
    notes = dict(notes or {})
    if models_on not in ("rows", "columns"):
        raise ValueError(f"models_on must be 'rows' or 'columns', got {models_on!r}")
    value_cols = [c for c in table.columns if c[-1] == "value"]
    ranks = pd.DataFrame(0, index=table.index, columns=pd.MultiIndex.from_tuples(value_cols))
    if models_on == "rows":
        eligible = ~table.index.to_series().isin(baselines)
        for col in value_cols:
            if col[-2] not in UNRANKED_METRICS:
                ranks[col] = _ranks(table[col], eligible)
    else:
        ranked = [c for c in value_cols if c[-2] not in UNRANKED_METRICS]
        eligible = pd.Series([c[0] not in baselines for c in ranked], index=pd.MultiIndex.from_tuples(ranked))
        for idx in table.index:
            row = pd.Series([table.at[idx, c] for c in ranked], index=eligible.index, dtype=float)
            for c, r in _ranks(row, eligible).items():
                ranks.at[idx, c] = r
    cells = pd.DataFrame(index=table.index)
    for col in value_cols:
        base = col[:-1]
        texts = []
        for idx in table.index:
            v = table.at[idx, col]
            lo, hi = table.at[idx, (*base, "ci_low")], table.at[idx, (*base, "ci_high")]
            if not np.isfinite(v):
                texts.append("–")
                continue
            s = f"{v:.{digits}f}"
            if ranks.at[idx, col] == 1:
                s = f"**{s}**" if fmt == "md" else rf"\textbf{{{s}}}"
            elif ranks.at[idx, col] == 2:
                s = f"<u>{s}</u>" if fmt == "md" else rf"\underline{{{s}}}"
            if np.isfinite(lo) and np.isfinite(hi):
                s += f" [{lo:.{digits}f}, {hi:.{digits}f}]"
            texts.append(s)
        head = [_mark(base[0], baselines, unverified, notes) if models_on == "columns" else str(base[0]), *map(str, base[1:])]
        cells[" / ".join(head)] = texts
    if models_on == "rows":
        cells.index = [_mark(i, baselines, unverified, notes) for i in cells.index]
    if fmt == "md":
        head = "| " + " | ".join([table.index.name or "", *cells.columns]) + " |"
        sep = "|" + "---|" * (len(cells.columns) + 1)
        body = ["| " + " | ".join([str(idx), *row]) + " |" for idx, row in zip(cells.index, cells.to_numpy())]
        note = "\n\nBold: best; underlined: second best (baselines not ranked). [95 % bootstrap CI]."
        if unverified:
            note += " †: unverified re-implementation (no public code or weights)."
        return "\n".join([head, sep, *body]) + note + "\n"
    esc = lambda t: str(t).replace("_", r"\_").replace("%", r"\%").replace("†", r"$^\dagger$")  # noqa: E731
    lines = [r"\begin{tabular}{l" + "c" * len(cells.columns) + "}", r"\toprule",
             " & ".join([esc(table.index.name or "")] + [esc(c) for c in cells.columns]) + r" \\", r"\midrule"]
    lines += [" & ".join([esc(idx), *row]) + r" \\" for idx, row in zip(cells.index, cells.to_numpy())]
    lines += [r"\bottomrule", r"\end{tabular}"]
    return "\n".join(lines) + "\n"


def write_table(table: pd.DataFrame, stem: str | Path, *, baselines: Sequence[str] = (), unverified: Sequence[str] = (),
                models_on: str = "rows", notes: Mapping[str, str] | None = None, caption: str = "") -> list[Path]:
    """Write ``<stem>.csv`` (numbers), ``<stem>.md`` and ``<stem>.tex``; returns the paths."""
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    flat = table.copy()
    flat.columns = [" / ".join(str(p) for p in c) for c in flat.columns]
    write_frame(flat, stem.with_suffix(".csv"), index=True)
    opts = {"baselines": baselines, "unverified": unverified, "models_on": models_on, "notes": notes}
    atomic_write_text(stem.with_suffix(".md"), (f"**{caption}**\n\n" if caption else "") + render(table, fmt="md", **opts))
    atomic_write_text(stem.with_suffix(".tex"), render(table, fmt="tex", **opts))
    return [stem.with_suffix(s) for s in (".csv", ".md", ".tex")]


def model_flags(models: pd.DataFrame) -> tuple[list[str], list[str]]:
    """(baselines, unverified) model names from a run's ``models.csv`` (``map_source == "prior"``, ``verified`` false)."""
    baselines = models.loc[models["map_source"] == "prior", "model"].tolist()
    unverified = models.loc[~models["verified"].astype(bool), "model"].tolist()
    return baselines, unverified


def model_notes(models: pd.DataFrame) -> dict[str, str]:
    """Model → note for tables and figures: models run without trained weights are labelled ``random-init weights``."""
    return {m: "random-init weights" for m in models.loc[models["weights"] == "random-init", "model"]}


def pick_datasets(tidy: pd.DataFrame, wanted: Sequence[str]) -> list[str]:
    """The ``wanted`` datasets present in the run, or every dataset of the run when none is."""
    present = list(dict.fromkeys(tidy["dataset"]))
    return [d for d in wanted if d in present] or present


def per_class(tidy: pd.DataFrame, dataset: str, metric: str = "pointing") -> pd.DataFrame:
    """Tables 2–5: one row per class of ``dataset``, one column per model (aggregate rows dropped)."""
    table = wide(tidy, rows="finding", columns=["model"], metrics=[metric], dataset=dataset)
    return table.drop(index=[i for i in table.index if str(i).startswith("(")])
