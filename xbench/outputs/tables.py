"""Tables from the tidy metric table: XBench's rich form (CSV + Markdown + LaTeX) and the paper's form.

Rich form: :func:`wide` takes the tidy table (one row per model × dataset × finding × metric with
``value, ci_low, ci_high`` and the count columns ``n_pairs``, ``n_cases``, ``n_labels``, ``n_classes``) and
returns a wide DataFrame of numbers; :func:`write_table` renders it,
marking the best value of each column in **bold** and the second best underlined (higher is better for
every metric shown, except ``best_tau`` which is not ranked), with the 95 % CI and, given
:func:`cell_counts`, the number of positive pairs (the tidy ``n_pairs``) of every cell, printed ``n=…``.

Paper form (:func:`paper_table1`, :func:`paper_class_table` → :class:`PaperTable`): the rows, columns,
order and abbreviations of the paper's Tables 1–5, percent with 2 decimals, written as CSV + Markdown +
LaTeX (a full ``table`` environment with caption) + styled HTML.

Ranking rule (both forms): baseline models (priors) are listed but never ranked; a cell resting on
fewer than :data:`MIN_PAIRS_TO_RANK` positive pairs is not ranked; rows of unverified models carry a dagger.
Given the run's paired comparisons (``comparisons=``, :mod:`xbench.evaluation.comparisons`), the paper form marks best /
second only where the order is significant (:data:`SIGNIFICANCE_RULE`, printed under the table).
"""
from __future__ import annotations

import hashlib
import html
from collections.abc import Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..core.atomic import atomic_write_text, write_frame
from ..core.summary import visible
from ..metrics import DICE_BEST, IOU_BEST, POINTING
from ..metrics import table as metric_table

#: A value is ranked (bold / underline) only when it rests on at least this many positive pairs: below it one pair
#: moves a pointing value by more than 3.3 points, so a best/second mark would rank noise.
MIN_PAIRS_TO_RANK = 30
_TABLE1_METRICS = {m: metric_table.display(m) for m in (POINTING, DICE_BEST, IOU_BEST)}  # the paper's Table 1 (Point / Dice / IoU)
#: The marking rule of paper-form tables given the run's comparisons (stated in their legend).
SIGNIFICANCE_RULE = ("Marks only where the order is significant (paired bootstrap over shared images, Holm-corrected "
                     "p < 0.05 within each column's model pairs; tables/comparisons.csv): bold if the best is "
                     "significantly above every other ranked model, underlined if the second is significantly below the "
                     "best and above every ranked model under it.")



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


def _column_ranks(values: pd.DataFrame, n: pd.DataFrame, ranked: pd.Series) -> pd.DataFrame:
    """:func:`_ranks` of every column (values rounded as shown), among ``ranked`` rows with ≥ MIN_PAIRS_TO_RANK pairs."""
    out = pd.DataFrame(0, index=values.index, columns=values.columns)
    for col in values.columns:
        out[col] = _ranks(values[col].round(2), ranked & (n[col].fillna(0) >= MIN_PAIRS_TO_RANK))
    return out


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


_MD_SPECIAL = str.maketrans({c: "\\" + c for c in "\\`*[]|"})  # ``_`` only emphasises at word edges: kept


def md_text(text: Any) -> str:
    """``text`` (a class, model or dataset name from a file) as literal Markdown table text: HTML special characters
    as entities (a trusted notebook output renders HTML inside Markdown), Markdown's ``\\ ` * [ ] |``
    backslash-escaped, control and bidi characters shown as ``\\uXXXX``.

    >>> md_text("Nodule <img src=x onerror=alert(1)> | *x*")
    'Nodule &lt;img src=x onerror=alert(1)&gt; \\\\| \\\\*x\\\\*'
    >>> md_text("Pleural Effusion")
    'Pleural Effusion'
    """
    return visible(html.escape(str(text), quote=False).translate(_MD_SPECIAL))


def render(table: pd.DataFrame, *, fmt: str, baselines: Sequence[str] = (), unverified: Sequence[str] = (),
           models_on: str = "rows", notes: Mapping[str, str] | None = None, digits: int = 3,
           counts: pd.DataFrame | None = None) -> str:
    """Markdown (``fmt="md"``) or LaTeX (``fmt="tex"``) text of a :func:`wide` table: ``value [low, high]`` cells.

    ``models_on="rows"`` (Table 1, recognition): models are the rows and each column is ranked;
    ``models_on="columns"`` (per-class Tables 2–5): models are the first column level and each
    row is ranked across models. ``notes`` adds a parenthesised note to a model's name
    (:func:`model_notes`: random-init weights). ``counts`` (:func:`cell_counts`): the positive pairs
    behind each cell, shown as ``n=…``; a cell with fewer than :data:`MIN_PAIRS_TO_RANK` is not ranked.
    """
    notes = dict(notes or {})
    if models_on not in ("rows", "columns"):
        raise ValueError(f"models_on must be 'rows' or 'columns', got {models_on!r}")
    value_cols = [c for c in table.columns if c[-1] == "value"]
    ranks = _cell_ranks(table, value_cols, baselines, models_on, counts)
    cells = pd.DataFrame(index=table.index)
    for col in value_cols:
        base = col[:-1]
        cells[" / ".join([_mark(base[0], baselines, unverified, notes) if models_on == "columns" else str(base[0]),
                          *map(str, base[1:])])] = [_cell_text(table, idx, col, ranks.at[idx, col], fmt, digits, counts)
                                                    for idx in table.index]
    if models_on == "rows":
        cells.index = [_mark(i, baselines, unverified, notes) for i in cells.index]
    if fmt == "md":
        return _markdown(table, cells, counts, unverified)
    return _latex(table, cells)


def _cell_ranks(table: pd.DataFrame, value_cols: list[tuple], baselines: Sequence[str], models_on: str,
                counts: pd.DataFrame | None) -> pd.DataFrame:
    """Rank (1 = best) of each ranked cell among the models (0: not ranked): per column with models on the rows, per
    row with models on the columns; baselines and cells with fewer than :data:`MIN_PAIRS_TO_RANK` pairs are left out."""
    def enough(idx, col) -> bool:
        return counts is None or not np.isfinite(counts.at[idx, col]) or counts.at[idx, col] >= MIN_PAIRS_TO_RANK

    ranks = pd.DataFrame(0, index=table.index, columns=pd.MultiIndex.from_tuples(value_cols))
    if models_on == "rows":
        eligible = ~table.index.to_series().isin(baselines)
        for col in value_cols:
            if metric_table.is_ranked(col[-2]):
                ranks[col] = _ranks(table[col], eligible & pd.Series([enough(i, col) for i in table.index], index=table.index))
        return ranks
    ranked = [c for c in value_cols if metric_table.is_ranked(c[-2])]
    eligible = pd.Series([c[0] not in baselines for c in ranked], index=pd.MultiIndex.from_tuples(ranked))
    for idx in table.index:
        row = pd.Series([table.at[idx, c] for c in ranked], index=eligible.index, dtype=float)
        ok = eligible & pd.Series([enough(idx, c) for c in ranked], index=eligible.index)
        for c, r in _ranks(row, ok).items():
            ranks.at[idx, c] = r
    return ranks


def _cell_text(table: pd.DataFrame, idx: Any, col: tuple, rank: int, fmt: str, digits: int,
               counts: pd.DataFrame | None) -> str:
    """One cell: ``value [low, high] n=…``, the best in bold and the second underlined; ``–`` for no value."""
    base = col[:-1]
    v = table.at[idx, col]
    lo, hi = table.at[idx, (*base, "ci_low")], table.at[idx, (*base, "ci_high")]
    if not np.isfinite(v):
        return "–"
    s = f"{v:.{digits}f}"
    if rank == 1:
        s = f"**{s}**" if fmt == "md" else rf"\textbf{{{s}}}"
    elif rank == 2:
        s = f"<u>{s}</u>" if fmt == "md" else rf"\underline{{{s}}}"
    if np.isfinite(lo) and np.isfinite(hi):
        s += f" [{lo:.{digits}f}, {hi:.{digits}f}]"
    if counts is not None and np.isfinite(counts.at[idx, col]):
        s += f" n={int(counts.at[idx, col])}"
    return s


def _markdown(table: pd.DataFrame, cells: pd.DataFrame, counts: pd.DataFrame | None,
              unverified: Sequence[str]) -> str:
    head = "| " + " | ".join(md_text(c) for c in [table.index.name or "", *cells.columns]) + " |"
    sep = "|" + "---|" * (len(cells.columns) + 1)
    body = ["| " + " | ".join([md_text(idx), *row]) + " |" for idx, row in zip(cells.index, cells.to_numpy())]
    note = "\n\nBold: best; underlined: second best (baselines not ranked). [95 % bootstrap CI]."
    if counts is not None:
        note += f" n = n_pairs, the positive pairs behind the value; cells with n < {MIN_PAIRS_TO_RANK} are not ranked."
    if unverified:
        note += " †: unverified re-implementation (no public code or weights)."
    return "\n".join([head, sep, *body]) + note + "\n"


def _latex(table: pd.DataFrame, cells: pd.DataFrame) -> str:
    esc = lambda t: str(t).replace("_", r"\_").replace("%", r"\%").replace("†", r"$^\dagger$")  # noqa: E731
    lines = [r"\begin{tabular}{l" + "c" * len(cells.columns) + "}", r"\toprule",
             " & ".join([esc(table.index.name or "")] + [esc(c) for c in cells.columns]) + r" \\", r"\midrule"]
    lines += [" & ".join([esc(idx), *row]) + r" \\" for idx, row in zip(cells.index, cells.to_numpy())]
    lines += [r"\bottomrule", r"\end{tabular}"]
    return "\n".join(lines) + "\n"


def write_table(table: pd.DataFrame, stem: str | Path, *, baselines: Sequence[str] = (), unverified: Sequence[str] = (),
                models_on: str = "rows", notes: Mapping[str, str] | None = None, caption: str = "",
                counts: pd.DataFrame | None = None, footnote: str = "") -> list[Path]:
    """Write ``<stem>.csv`` (numbers), ``<stem>.md`` and ``<stem>.tex``; returns the paths.

    ``counts`` (:func:`cell_counts`) adds ``n=…`` to the Markdown/LaTeX cells and the ranking rule; ``footnote``
    (e.g. :func:`skipped_note`) is appended to the Markdown."""
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    flat = table.copy()
    flat.columns = [" / ".join(str(p) for p in c) for c in flat.columns]
    write_frame(flat, stem.with_suffix(".csv"), index=True)
    opts = {"baselines": baselines, "unverified": unverified, "models_on": models_on, "notes": notes, "counts": counts}
    atomic_write_text(stem.with_suffix(".md"), (f"**{caption}**\n\n" if caption else "") + render(table, fmt="md", **opts)
                      + (f"\n{footnote}\n" if footnote else ""))
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


# -- the paper's form (arXiv 2510.19599, Tables 1–5) -------------------------------------------------------------------



def pair_counts(tidy: pd.DataFrame) -> pd.Series:
    """Positive pairs behind each (model, dataset, finding) pointing value; the dataset level (and the pooled row)
    gets the sum over its classes. Index ``(model, dataset, finding)``."""
    from ..metrics import DATASET_LEVEL, POOLED

    point = tidy[tidy["metric"] == "pointing"]
    cls = point[~point["finding"].astype(str).str.startswith("(")]
    counts = cls.set_index(["model", "dataset", "finding"])["n_pairs"].astype(int)
    total = cls.groupby(["model", "dataset"])["n_pairs"].sum().astype(int)
    levels = [total.rename(lambda i: i).to_frame().assign(finding=f).set_index("finding", append=True)["n_pairs"]
              for f in (DATASET_LEVEL, POOLED)]
    return pd.concat([counts, *levels]).sort_index()


def cell_counts(table: pd.DataFrame, tidy: pd.DataFrame, *, dataset: str | None = None,
                finding: str | None = None) -> pd.DataFrame:
    """Positive pairs behind every value cell of a :func:`wide` table (rows × value columns, NaN where unknown).

    Model, dataset and finding of a cell come from the table's row index name, its column levels, and the
    ``dataset`` / ``finding`` the table was filtered with; grounding metrics only (others NaN).
    """
    pairs = pair_counts(tidy)
    value_cols = [c for c in table.columns if c[-1] == "value"]
    names = list(table.columns.names[:-1])
    out = pd.DataFrame(np.nan, index=table.index, columns=pd.MultiIndex.from_tuples(value_cols))
    for col in value_cols:
        keys = dict(zip(names, col[:-1]))
        if not metric_table.is_grounding_score(str(keys.get("metric", ""))):
            continue
        for idx in table.index:
            k = {"dataset": dataset, "finding": finding, **keys, table.index.name: idx}
            out.at[idx, col] = pairs.get((k["model"], k["dataset"], k["finding"]), np.nan)
    return out


def skipped_note(log: Sequence[Mapping], datasets: Sequence[str] | None = None) -> str:
    """One line naming the cases skipped at inference per dataset (from ``evaluation_log.json``)."""
    skipped = skipped_cases(log)
    parts = [f"{d}: {k} of {n}" for d, (k, n) in skipped.items() if datasets is None or d in datasets]
    return ("Cases skipped at inference (missing/unreadable images), left out of every value: "
            + (", ".join(parts) if parts else "none recorded") + ".")


def undefined_note(tidy: pd.DataFrame, metrics: Sequence[str]) -> str:
    """One line naming, per dataset, the metrics whose dataset-level value is undefined (NaN) for every model —
    e.g. AUC, AUPRC, F1 and accuracy on COVID-19 Rural, where every image is positive (Hamming accuracy, the share
    of images scored ≥ 0.5, stays defined)."""
    from ..metrics import DATASET_LEVEL

    level = tidy[(tidy["finding"] == DATASET_LEVEL) & tidy["metric"].isin(metrics)]
    undefined = level.groupby(["dataset", "metric"], sort=False)["value"].apply(lambda v: bool(v.isna().all()))
    parts = [f"{d}: {', '.join(m for (dd, m), u in undefined.items() if dd == d and u)}"
             for d in dict.fromkeys(level["dataset"]) if any(u for (dd, _), u in undefined.items() if dd == d)]
    return ("Undefined (a class needs both positive and negative labels), left out: " + "; ".join(parts) + "."
            if parts else "Every recognition metric is defined on every dataset of this run.")


def skipped_cases(log: Sequence[Mapping]) -> dict[str, tuple[int, int]]:
    """Dataset → (cases skipped at inference, cases) from a run's ``evaluation_log.json`` (largest over models)."""
    out: dict[str, tuple[int, int]] = {}
    for entry in log:
        skipped, cases = int(entry.get("cases_skipped_at_inference", 0)), int(entry.get("cases", 0))
        old = out.get(entry["dataset"], (0, cases))
        out[entry["dataset"]] = (max(old[0], skipped), cases)
    return out


@dataclass
class PaperTable:
    """A table in the paper's form: ``values`` (percent) and ``n`` (positive pairs) with the same rows (display
    names of models) and columns; ``ranked`` rows take part in bold/underline; ``separator`` is the first row of the
    second group (models not in the paper, baselines), or None."""

    values: pd.DataFrame
    n: pd.DataFrame
    ranked: pd.Series
    caption: str
    notes: list[str]
    separator: str | None = None
    confirmed: pd.DataFrame | None = None  # bool per cell: its best / second mark is backed by significance
    #: columns per printed row in Markdown / LaTeX (the paper's Table 2 spans two rows per model: Mean + 11
    #: classes, then the other 10); None: one row per model. CSV and HTML keep one row per model.
    wrap: int | None = None

    def _blocks(self, cells: pd.DataFrame) -> list[tuple[list[str], list[list[str]]]]:
        """``(heads, rows)`` per printed block of columns: one block, or :attr:`wrap` columns each; a later, shorter
        block starts under the first class (the paper leaves the cell under Mean empty) and every block is padded to
        the first one's width."""
        step = self.wrap or cells.shape[1]
        heads = [" ".join(str(p) for p in c) if isinstance(c, tuple) else str(c) for c in cells.columns]
        blocks = []
        for i in range(0, cells.shape[1], step):
            lead = 1 if i and cells.shape[1] - i < step else 0
            fill = lambda items, lead=lead: [""] * lead + list(items) + [""] * (step - lead - len(items))  # noqa: E731
            blocks.append((fill(heads[i:i + step]), [fill(row.iloc[i:i + step]) for _, row in cells.iterrows()]))
        return blocks

    def ranks(self) -> pd.DataFrame:
        """1 = best, 2 = second best per column among ranked rows whose cell has ≥ :data:`MIN_PAIRS_TO_RANK` pairs;
        with :attr:`confirmed` (tables given ``comparisons``), only the marks whose order is significant."""
        out = _column_ranks(self.values, self.n, self.ranked)
        return out.where(self.confirmed, 0) if self.confirmed is not None else out

    def _cells(self, bold: str, underline: str, with_n: bool) -> pd.DataFrame:
        ranks = self.ranks()
        cells = pd.DataFrame("", index=self.values.index, columns=self.values.columns, dtype=object)
        for col in self.values.columns:
            for idx in self.values.index:
                v = self.values.at[idx, col]
                s = "–" if not np.isfinite(v) else f"{v:.2f}"
                if np.isfinite(v) and ranks.at[idx, col] in (1, 2):
                    s = (bold if ranks.at[idx, col] == 1 else underline).format(s)
                if with_n and np.isfinite(v):
                    s += f" ({int(self.n.at[idx, col])})" if np.isfinite(self.n.at[idx, col]) else ""
                cells.at[idx, col] = s
        return cells

    def _legend(self) -> str:
        text = (f"Percent, 2 decimals; (n) = n_pairs, the positive pairs behind the value. Bold: best, underlined: second best among "
                f"the paper's models and other non-baseline models, ranked only where n ≥ {MIN_PAIRS_TO_RANK}.")
        return text if self.confirmed is None else f"{text} {SIGNIFICANCE_RULE}"

    def to_markdown(self) -> str:
        cells = self._cells("**{}**", "<u>{}</u>", with_n=True)
        if self.wrap:
            return self._wrapped_markdown(cells)
        heads = [md_text(" ".join(str(p) for p in c) if isinstance(c, tuple) else c) for c in cells.columns]
        lines = [f"**{md_text(self.caption)}**", "", "| Method | " + " | ".join(heads) + " |",
                 "|---" * (len(heads) + 1) + "|"]
        for idx, row in cells.iterrows():
            if idx == self.separator:
                lines.append("| *other models and baselines* |" + " |" * len(heads))
            lines.append(f"| {md_text(idx)} | " + " | ".join(row) + " |")
        return "\n".join(lines + ["", self._legend(), *self.notes]) + "\n"

    def _wrapped_markdown(self, cells: pd.DataFrame) -> str:
        """Each model over several rows, as the paper prints Table 2; later header rows in italics."""
        blocks = self._blocks(cells)
        width = len(blocks[0][0])
        lines = [f"**{md_text(self.caption)}**", "", "| Method | " + " | ".join(map(md_text, blocks[0][0])) + " |",
                 "|---" * (width + 1) + "|"]
        lines += ["| | " + " | ".join(f"*{md_text(h)}*" if h else "" for h in heads) + " |" for heads, _ in blocks[1:]]
        for i, idx in enumerate(cells.index):
            if idx == self.separator:
                lines.append("| *other models and baselines* |" + " |" * width)
            for k, (_, rows) in enumerate(blocks):
                lines.append(f"| {md_text(idx) if k == 0 else ''} | " + " | ".join(rows[i]) + " |")
        return "\n".join(lines + ["", self._legend(), *self.notes]) + "\n"

    def to_latex(self) -> str:
        cells = self._cells(r"\textbf{{{}}}", r"\underline{{{}}}", with_n=False)
        esc = lambda t: str(t).replace("_", r"\_").replace("%", r"\%").replace("†", r"$^\dagger$").replace("&", r"\&")  # noqa: E731
        grouped = isinstance(cells.columns, pd.MultiIndex)
        lines = [r"\begin{table}[t]", r"\centering", r"\caption{" + esc(self.caption) + "}", r"\resizebox{\textwidth}{!}{%",
                 r"\begin{tabular}{l" + "c" * cells.shape[1] + "}", r"\toprule"]
        if grouped:
            groups = list(dict.fromkeys(cells.columns.get_level_values(0)))
            spans = [(g, sum(1 for c in cells.columns if c[0] == g)) for g in groups]
            lines.append(" & ".join(["Method"] + [rf"\multicolumn{{{k}}}{{c}}{{{esc(g)}}}" for g, k in spans]) + r" \\")
            lines.append(" & ".join([""] + [esc(c[1]) for c in cells.columns]) + r" \\")
        elif self.wrap:  # the paper's Table 2: each model over several rows
            blocks = self._blocks(cells)
            width = len(blocks[0][0])
            lines[4] = r"\begin{tabular}{l" + "c" * width + "}"
            for k, (heads, _) in enumerate(blocks):
                lines.append(" & ".join(["Method" if k == 0 else ""] + [esc(h) for h in heads]) + r" \\")
        else:
            lines.append(" & ".join(["Method"] + [esc(c) for c in cells.columns]) + r" \\")
        lines.append(r"\midrule")
        for i, (idx, row) in enumerate(cells.iterrows()):
            if idx == self.separator:
                lines.append(r"\midrule")
            if not self.wrap:
                lines.append(" & ".join([esc(idx), *row]) + r" \\")
                continue
            for k, (_, rows) in enumerate(blocks):
                lines.append(" & ".join([esc(idx) if k == 0 else "", *rows[i]]) + r" \\")
        lines += [r"\bottomrule", r"\end{tabular}}", r"\par\footnotesize " + esc(" ".join([self._legend(), *self.notes])),
                  r"\end{table}"]
        return "\n".join(lines) + "\n"

    def to_html(self) -> str:
        """A styled HTML table (pandas Styler): bold/underline marks, n in a tooltip, the second group set off."""
        ranks = self.ranks()
        shown = self.values.copy()
        shown.columns = [" ".join(map(str, c)) if isinstance(c, tuple) else str(c) for c in shown.columns]
        ranks.columns = shown.columns
        style = shown.style.format("{:.2f}", na_rep="–", escape="html")
        style = style.set_uuid(hashlib.sha256(self.caption.encode()).hexdigest()[:10])  # same bytes on every run
        style = style.format_index(escape="html", axis=0).format_index(escape="html", axis=1)
        style = style.apply(lambda col: ["font-weight: bold" if r == 1 else "text-decoration: underline" if r == 2
                                         else "" for r in ranks[col.name]], axis=0)
        if self.separator is not None:
            style = style.apply(lambda row: ["border-top: 2px solid #444" if row.name == self.separator else ""] * len(row),
                                axis=1)
        tips = self.n.copy()
        tips.columns = shown.columns
        style = style.set_tooltips(tips.map(lambda k: f"n_pairs = {int(k)} positive pairs" if np.isfinite(k) else ""))
        style = style.set_caption(html.escape(self.caption)).set_table_styles(
            [{"selector": "td, th", "props": "padding: 2px 6px; text-align: right"},
             {"selector": "caption", "props": "caption-side: top; font-weight: bold"}])
        foot = "".join(f"<p>{html.escape(t)}</p>" for t in [self._legend(), *self.notes])
        return style.to_html() + foot + "\n"

    def write(self, stem: str | Path) -> list[Path]:
        """``<stem>.csv`` (values and n, tidy-wide), ``.md``, ``.tex`` (a full ``table`` environment), ``.html``."""
        stem = Path(stem)
        stem.parent.mkdir(parents=True, exist_ok=True)
        flat = self.values.copy()
        flat.columns = [" / ".join(map(str, c)) if isinstance(c, tuple) else str(c) for c in flat.columns]
        n = self.n.copy()
        n.columns = [f"{c} / n_pairs" for c in flat.columns]
        both = pd.concat([flat.round(2), n.astype("Int64")], axis=1)
        both = both[[c for pair in zip(flat.columns, n.columns) for c in pair]]
        both.index.name = "Method"
        write_frame(both, stem.with_suffix(".csv"), index=True)
        atomic_write_text(stem.with_suffix(".md"), self.to_markdown())
        atomic_write_text(stem.with_suffix(".tex"), self.to_latex())
        atomic_write_text(stem.with_suffix(".html"), self.to_html())
        return [stem.with_suffix(s) for s in (".csv", ".md", ".tex", ".html")]


def _row_order(models: Sequence[str], baselines: Sequence[str]) -> tuple[list[str], str | None]:
    """The paper's models in its order, then every other model (non-baselines first), and the first of those."""
    from ..paper import MODELS

    paper = [m for m in MODELS if m in models]
    rest = [m for m in models if m not in MODELS and m not in baselines] + [m for m in models if m in baselines
                                                                          and m not in MODELS]
    return paper + rest, (rest[0] if rest and paper else None)


def _display(model: str, baselines: Sequence[str], unverified: Sequence[str], notes: Mapping[str, str]) -> str:
    from ..paper import paper_name

    return _mark(paper_name(model), [paper_name(b) for b in baselines], [paper_name(u) for u in unverified],
                 {paper_name(k): v for k, v in notes.items()})


def _table_notes(tidy: pd.DataFrame, datasets: Sequence[str], log: Sequence[Mapping] | None,
                 unverified: Sequence[str]) -> list[str]:
    notes = []
    if log is not None:
        notes.append(skipped_note(log, datasets))
    if unverified:
        notes.append("†: unverified re-implementation (no public code or weights).")
    return notes


def paper_table1(tidy: pd.DataFrame, *, baselines: Sequence[str] = (), unverified: Sequence[str] = (),
                 notes: Mapping[str, str] | None = None, log: Sequence[Mapping] | None = None,
                 caption: str = "Table 1. Grounding metrics across datasets (mean Pointing Game, best-τ Dice/IoU).",
                 comparisons: pd.DataFrame | None = None) -> PaperTable:
    """Table 1 in the paper's form: rows = models (the paper's seven in its order, then the others set apart),
    column groups = datasets (the paper's seven in its order, then the run's others), each Point / Dice / IoU at the
    best τ (dataset value = unweighted mean over classes), percent. ``log``: the run's ``evaluation_log.json``
    records, for the skipped-case note. ``comparisons``: the run's ``comparisons.csv``; given, best / second are
    marked only where the order is significant (:data:`SIGNIFICANCE_RULE`)."""
    from ..metrics import DATASET_LEVEL
    from ..paper import DATASETS

    present = list(dict.fromkeys(tidy["dataset"]))
    datasets = [d for d in DATASETS if d in present] + [d for d in present if d not in DATASETS]
    rows, separator = _row_order(list(dict.fromkeys(tidy["model"])), baselines)
    level = tidy[(tidy["finding"] == DATASET_LEVEL) & tidy["metric"].isin(list(_TABLE1_METRICS))]
    val = level.set_index(["model", "dataset", "metric"])["value"]
    counts = pair_counts(tidy)
    cols = pd.MultiIndex.from_tuples([(DATASETS.get(d, d), _TABLE1_METRICS[m]) for d in datasets for m in _TABLE1_METRICS])
    values = pd.DataFrame(np.nan, index=rows, columns=cols)
    n = pd.DataFrame(np.nan, index=rows, columns=cols)
    keys = {(DATASETS.get(d, d), label): (d, DATASET_LEVEL, metric) for d in datasets
            for metric, label in _TABLE1_METRICS.items()}
    for m in rows:
        for d in datasets:
            for metric, label in _TABLE1_METRICS.items():
                col = (DATASETS.get(d, d), label)
                values.at[m, col] = 100 * val.get((m, d, metric), np.nan)
                n.at[m, col] = counts.get((m, d, DATASET_LEVEL), np.nan)
    return _finish(values, n, rows, separator, baselines, unverified, notes, caption,
                   _table_notes(tidy, datasets, log, unverified), comparisons, keys)


def paper_class_table(tidy: pd.DataFrame, dataset: str, *, metric: str = "pointing", baselines: Sequence[str] = (),
                      unverified: Sequence[str] = (), notes: Mapping[str, str] | None = None,
                      log: Sequence[Mapping] | None = None, caption: str | None = None,
                      comparisons: pd.DataFrame | None = None) -> PaperTable:
    """Tables 2–5 in the paper's form: rows = models, columns = Mean then the classes in the paper's order with its
    abbreviations (datasets outside the paper: the run's class order and names), percent. ``comparisons``: as
    :func:`paper_table1`."""
    from ..metrics import DATASET_LEVEL
    from ..paper import CLASS_TABLES, DATASETS, TABLE_CLASSES

    sub = tidy[(tidy["dataset"] == dataset) & (tidy["metric"] == metric)]
    table_no = next((t for t, d in CLASS_TABLES.items() if d == dataset), None)
    if table_no is not None:
        classes = dict(TABLE_CLASSES[table_no])
    else:
        classes = {f: f for f in dict.fromkeys(sub["finding"]) if not str(f).startswith("(")}
    rows, separator = _row_order(list(dict.fromkeys(tidy["model"])), baselines)
    val = sub.set_index(["model", "finding"])["value"]
    counts = pair_counts(tidy)
    cols = ["Mean", *classes]
    values = pd.DataFrame(np.nan, index=rows, columns=cols)
    n = pd.DataFrame(np.nan, index=rows, columns=cols)
    for m in rows:
        for label, finding in [("Mean", DATASET_LEVEL), *classes.items()]:
            values.at[m, label] = 100 * val.get((m, finding), np.nan)
            n.at[m, label] = counts.get((m, dataset, finding), np.nan)
    name = DATASETS.get(dataset, dataset)
    caption = caption or (f"Table {table_no}. " if table_no else "") + f"Per-class {metric} on {name}."
    keys = {label: (dataset, finding, metric) for label, finding in [("Mean", DATASET_LEVEL), *classes.items()]}
    table = _finish(values, n, rows, separator, baselines, unverified, notes, caption,
                    _table_notes(tidy, [dataset], log, unverified), comparisons, keys)
    if table_no == 2:  # the paper prints Table 2 with two rows per model: Mean + 11 classes, then the other 10
        table.wrap = 12
    return table


def _confirmed(values: pd.DataFrame, n: pd.DataFrame, ranked: pd.Series, keys: Mapping, comparisons: pd.DataFrame,
               ) -> pd.DataFrame:
    """Per cell (rows = model names): does its best / second mark hold up (:data:`SIGNIFICANCE_RULE`)?"""
    sig = {}  # (dataset, finding, metric, a, b) → a is significantly above b
    for r in comparisons[comparisons["significant"].astype(bool)].itertuples():
        sig[(str(r.dataset), str(r.finding), r.metric, r.model_a, r.model_b)] = r.difference > 0
        sig[(str(r.dataset), str(r.finding), r.metric, r.model_b, r.model_a)] = r.difference < 0
    ranks = _column_ranks(values, n, ranked)
    out = pd.DataFrame(False, index=values.index, columns=values.columns)
    for col in values.columns:
        key = tuple(map(str, keys[col]))

        def above(a: str, b: str, key: tuple = key) -> bool:
            return sig.get((*key, a, b), False)

        order = ranks[col]
        best, second = list(order.index[order == 1]), list(order.index[order == 2])
        eligible = ranked & (n[col].fillna(0) >= MIN_PAIRS_TO_RANK) & np.isfinite(values[col].astype(float))
        others = list(values.index[eligible])
        if len(best) == 1:
            out.at[best[0], col] = all(above(best[0], o) for o in others if o != best[0])
        if len(best) == 1 and len(second) == 1:
            below = [o for o in others if o not in (best[0], second[0])]
            out.at[second[0], col] = above(best[0], second[0]) and all(above(second[0], o) for o in below)
    return out


def _finish(values, n, rows, separator, baselines, unverified, notes, caption, table_notes, comparisons=None,
            keys=None) -> PaperTable:
    notes = dict(notes or {})
    ranked = pd.Series([m not in baselines for m in rows], index=rows)
    confirmed = _confirmed(values, n, ranked, keys, comparisons) if comparisons is not None else None
    labels = {m: _display(m, baselines, unverified, notes) for m in rows}
    values.index = n.index = ranked.index = [labels[m] for m in rows]
    if confirmed is not None:
        confirmed.index = values.index
    return PaperTable(values, n, ranked, caption, table_notes, labels[separator] if separator else None, confirmed)


def write_paper_tables(output_dir: str | Path, pool: Executor | None = None) -> list[Path]:
    """Paper-form tables of a scored run under ``<output_dir>/tables/paper/`` (CSV, Markdown, LaTeX, HTML).

    Calls the paper-form writers of :mod:`xbench.outputs.tables` (:func:`~xbench.outputs.paper_table1` and
    :func:`~xbench.outputs.paper_class_table` for the pointing game and Dice at the best τ of each
    dataset) — the hook where further paper tables go. With the run's ``comparisons.csv``, best / second
    are marked only where the order is significant (:data:`SIGNIFICANCE_RULE`). With ``pool`` (a process pool, e.g.
    the run's evaluation workers) each table is made and written by a worker; the files are the same bytes, the
    returned paths in the same order, and the workers' warnings are raised here, in table order.
    """
    from ..core.workers import capture_warnings, replay_warnings

    context = _paper_context(output_dir)  # read once; the workers get it with their job
    jobs = [(None, "table1")] + [(ds, metric) for ds in context[0]["dataset"].unique()
                                 for metric in ("pointing", "dice@best")]
    if pool is None:
        return [path for ds, metric in jobs for path in _paper_table_job(output_dir, ds, metric, context)]
    written: list[Path] = []
    registry: dict = {}
    for future in [pool.submit(capture_warnings, _paper_table_job, str(output_dir), ds, metric, context)
                   for ds, metric in jobs]:
        paths, caught = future.result()
        replay_warnings(caught, registry)
        written += paths
    return written


def _paper_context(output_dir: str | Path) -> tuple[pd.DataFrame, dict[str, Any]]:
    """The tidy table and the flags every paper-form table of a run is made with."""
    from ..evaluation.comparisons import load_comparisons
    from ..evaluation.evaluate import load_tables

    t = load_tables(output_dir)
    log_path = Path(output_dir) / "tables" / "evaluation_log.json"
    from ..evaluation.evaluate import read_evaluation_log

    log = read_evaluation_log(log_path)
    baselines, unverified = model_flags(t["models"])
    flags = {"baselines": baselines, "unverified": unverified, "notes": model_notes(t["models"]), "log": log}
    compared = load_comparisons(output_dir)  # marks only significant orders when the run has comparisons
    flags["comparisons"] = compared[0] if compared is not None else None
    return t["metrics"], flags


def _paper_table_job(output_dir: str | Path, dataset: str | None, metric: str,
                     context: tuple[pd.DataFrame, dict[str, Any]]) -> list[Path]:
    """One paper-form table written (``context``: :func:`_paper_context`): Table 1 (``dataset`` None) or ``metric``'s
    per-class table of ``dataset``."""
    tidy, flags = context
    from ..core.files import contained_folder

    folder = contained_folder(output_dir, "tables", "paper")  # real folders inside the output folder, no link
    if dataset is None:
        return paper_table1(tidy, **flags).write(folder / "table1_grounding")
    stem = folder / f"per_class_{metric.replace('@', '_at_')}_{dataset}"
    return paper_class_table(tidy, dataset, metric=metric, **flags).write(stem)
