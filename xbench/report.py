"""One self-contained HTML report of an evaluated run, built from the run folder alone (no inference).

:func:`build_report` (``xbench report --run DIR``) writes ``<run>/report.html``: sortable tables
(per dataset: every model's metrics, mean over classes, with 95 % CIs; per class: pointing and Dice
at the best τ), the run's figures (``<run>/figures/*.png``, embedded), the evaluation log (pairs
evaluated / excluded, skipped cases), the run configuration (each store ``meta.json``), model /
weights labels (``models.csv``), and a **per-case overlay browser**: one card per positive
(case, class) pair showing the image with the ground-truth outline and every model's map at the
evaluation grid (min–max normalised, jet colours) with its argmax (white cross), its pointing
hit/miss and its Dice at the class's best τ. Filters: dataset, class, model, hit/miss (of the
chosen model; with "all models", of any model), lesion-size bin (GT area as a fraction of the
image). Filters live in the URL hash (``report.html#class=Nodule&model=ref_xattn&outcome=miss``),
so a view can be linked. Images are JPEG thumbnails embedded as base64; the page uses plain
JavaScript and no network.

Maps are taken from the store and placed and resized exactly as the evaluation does
(:mod:`xbench.windows`, :func:`xbench.metrics.upsample_maps`, :func:`xbench.metrics.normalize_maps`);
images and regions are read from the dataset named in the store's ``meta.json``.
"""
from __future__ import annotations

import base64
import html
import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from .atomic import atomic_write_text
from .errors import XBenchError
from .exports import maps_at_grid, open_run_dataset, run_grid

__all__ = ["build_report", "SIZE_EDGES"]

#: Lesion-size bins of the browser: GT area as a fraction of the image, right-closed ``(lo, hi]``.
SIZE_EDGES = (0.0, 0.01, 0.05, 0.15, 1.0)
_SUMMARY_METRICS = ("pointing", "dice@0.5", "iou@0.5", "dice@best", "iou@best", "best_tau", "auc", "auprc", "f1",
                    "accuracy")


def build_report(run_dir: str | Path, out: str | Path | None = None, *, max_cases_per_class: int = 24,
                 thumb: int = 112, grid: tuple[int, int] | None = None, progress: bool = False) -> Path:
    """Write the HTML report of an evaluated run (see the module docstring); returns its path.

    ``max_cases_per_class``: the browser shows the first that many positive cases (in dataset
    order) of each (dataset, class); the page states how many of how many are shown.
    ``grid``: the run's evaluation grid; by default recovered from ``pairs`` (``gt_area /
    area_fraction`` = H·W, square grids), an error asks for it otherwise.
    """
    from .evaluate import load_tables

    run_dir = Path(run_dir)
    t = load_tables(run_dir)
    out = Path(out) if out is not None else run_dir / "report.html"
    metas = {(p.parent.parent.name, p.parent.name): json.loads(p.read_text())
             for p in sorted((run_dir / "store").glob("*/*/meta.json"))}
    if not metas:
        raise XBenchError(f"{run_dir} has no store/<dataset>/<model>/meta.json: not a run folder")
    log = _read_json(run_dir / "tables" / "evaluation_log.json")
    run_log = _read_json(run_dir / "run_log.json")
    grid = tuple(grid) if grid is not None else run_grid(t["pairs"])
    cards, note = _cards(run_dir, t["pairs"], t["metrics"], metas, grid, max_cases_per_class, thumb, progress)
    sections = [
        ("Tables", _tables_html(t["metrics"]) + _paper_tables_html(run_dir)),
        ("Per-case browser", note + _browser_html(cards, t["pairs"], metas)),
        ("Figures", _figures_html(run_dir)),
        ("Models and weights", _models_html(t["models"])),
        ("Evaluation log", _log_html(log, run_log)),
        ("Run configuration", _config_html(metas)),
    ]
    from .explain.report_section import explain_sections

    sections[3:3] = [(title, note + _frame_html(frame, "explain"))  # after Figures, when notebook 11 ran (issue 24)
                     for title, note, frame in explain_sections(run_dir)]
    nav = " · ".join(f'<a href="#sec-{i}">{html.escape(name)}</a>' for i, (name, _) in enumerate(sections))
    body = "\n".join(f'<section id="sec-{i}"><h2>{html.escape(name)}</h2>{content}</section>'
                     for i, (name, content) in enumerate(sections))
    title = f"XBench report — {run_dir.name}"
    page = _PAGE.format(title=html.escape(title), nav=nav, body=body, css=_CSS, js=_JS)
    out.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write_text(out, page)


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text()) if path.exists() else None


# -- tables -------------------------------------------------------------------------------------------------
def _fmt(v: float, lo: float, hi: float) -> str:
    if not np.isfinite(v):
        return "–"
    s = f"{v:.3f}"
    return s + (f' <span class="ci">[{lo:.3f}, {hi:.3f}]</span>' if np.isfinite(lo) and np.isfinite(hi) else "")


def _sortable(index_name: str, rows: list[tuple[str, list[tuple[float, str]]]], columns: list[str], kind: str) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in [index_name, *columns])
    body = []
    for name, cells in rows:
        tds = "".join(f'<td data-v="{"" if not np.isfinite(v) else repr(float(v))}">{text}</td>' for v, text in cells)
        body.append(f'<tr><td data-v="{html.escape(name)}">{html.escape(name)}</td>{tds}</tr>')
    return (f'<table class="sortable" data-kind="{kind}"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table>')


def _tables_html(tidy: pd.DataFrame) -> str:
    from .metrics import DATASET_LEVEL

    parts = ['<p>Click a column header to sort. Cells: value [95 % bootstrap CI]. Pointing at margin 0 '
             '(argmax inside the region); other margins are named <code>pointing@Npx</code>.</p>']
    for ds, sub in tidy.groupby("dataset", sort=False):
        level = sub[sub["finding"] == DATASET_LEVEL]
        metrics = [m for m in _SUMMARY_METRICS if m in set(level["metric"])]
        metrics += sorted(m for m in set(level["metric"]) if m.startswith("pointing@") or m == "hamming_accuracy")
        rows = []
        for model, msub in level.groupby("model", sort=False):
            by = msub.set_index("metric")
            rows.append((model, [(by.at[m, "value"], _fmt(by.at[m, "value"], by.at[m, "ci_low"], by.at[m, "ci_high"]))
                                 if m in by.index else (np.nan, "–") for m in metrics]))
        parts.append(f"<h3>{html.escape(ds)}: mean over classes</h3>" + _sortable("model", rows, metrics, "summary"))
        classes = [f for f in dict.fromkeys(sub["finding"]) if not str(f).startswith("(")]
        for metric in ("pointing", "dice@best"):
            models = list(dict.fromkeys(sub["model"]))
            rows = []
            for f in classes:
                cell = sub[(sub["finding"] == f) & (sub["metric"] == metric)].set_index("model")
                if cell.empty:
                    continue
                rows.append((f, [(cell.at[m, "value"], _fmt(cell.at[m, "value"], cell.at[m, "ci_low"],
                                                            cell.at[m, "ci_high"])) if m in cell.index else (np.nan, "–")
                                 for m in models]))
            if rows:
                parts.append(f"<h3>{html.escape(ds)}: {metric} per class</h3>" + _sortable("class", rows, models, metric))
    return "\n".join(parts)


def _paper_tables_html(run_dir: Path) -> str:
    """Every paper-form table of the run folder, sortable: ``tables/**/<stem>.html`` written by
    :meth:`xbench.tables.PaperTable.write` as is; tables written by :func:`xbench.tables.write_table`
    (``<stem>.csv`` next to ``<stem>.md``, no ``.html``) rendered from their CSV."""
    parts = []
    for path in sorted((run_dir / "tables").rglob("*.html")):
        name = str(path.relative_to(run_dir / "tables").with_suffix(""))
        parts.append(f'<h3>Paper-form table: {html.escape(name)}</h3><div class="paper">{path.read_text()}</div>')
    for path in sorted((run_dir / "tables").rglob("*.csv")):
        if not path.with_suffix(".md").exists() or path.with_suffix(".html").exists():
            continue
        frame = pd.read_csv(path, index_col=0)
        cells = [c.rsplit(" / ", 1)[0] for c in frame.columns if c.endswith(" / value")]
        if not cells:
            continue
        rows = []
        for idx, r in frame.iterrows():
            vals = []
            for c in cells:
                v, lo, hi = (float(r.get(f"{c} / {k}", np.nan)) for k in ("value", "ci_low", "ci_high"))
                vals.append((v, _fmt(v, lo, hi)))
            rows.append((str(idx), vals))
        name = str(path.relative_to(run_dir / "tables").with_suffix(""))
        parts.append(f"<h3>Paper-form table: {html.escape(name)}</h3>"
                     + _sortable(str(frame.index.name or ""), rows, cells, "paper"))
    return "\n".join(parts)


def _frame_html(frame: pd.DataFrame, kind: str) -> str:
    rows = [(str(r.iloc[0]), [(np.nan, html.escape(str(v))) for v in r.iloc[1:]]) for _, r in frame.iterrows()]
    return _sortable(str(frame.columns[0]), rows, [str(c) for c in frame.columns[1:]], kind)


def _models_html(models: pd.DataFrame) -> str:
    first = [c for c in ("model", "weights") if c in models.columns]
    return _frame_html(models[first + [c for c in models.columns if c not in first]], "models")


def _figures_html(run_dir: Path) -> str:
    pngs = sorted((run_dir / "figures").glob("*.png"))
    if not pngs:
        return "<p>No figures in this run folder (the notebooks write them to <code>figures/</code>).</p>"
    return "".join(f'<figure><img alt="{html.escape(p.stem)}" src="data:image/png;base64,'
                   f'{base64.b64encode(p.read_bytes()).decode()}"><figcaption>{html.escape(p.name)}</figcaption></figure>'
                   for p in pngs)


def _log_html(log: Any, run_log: Any) -> str:
    if not log:
        return "<p>No evaluation_log.json.</p>"
    rows = []
    for entry in log:
        for finding, c in entry.get("pairs", {}).items():
            rows.append((f'{entry["dataset"]} × {entry["model"]}', [
                (np.nan, html.escape(finding)), (c["evaluated"], str(c["evaluated"])),
                (c["missing_prediction"], str(c["missing_prediction"])),
                (c["positive_without_region"], str(c["positive_without_region"])),
                (entry.get("cases_skipped_at_inference", 0), str(entry.get("cases_skipped_at_inference", 0)))]))
    text = _sortable("dataset × model", rows, ["class", "pairs evaluated", "excluded: no prediction",
                                                "excluded: positive without region", "cases skipped at inference"], "log")
    if run_log:
        text += f"<details><summary>run_log.json</summary><pre>{html.escape(json.dumps(run_log, indent=1))}</pre></details>"
    return text


def _config_html(metas: dict[tuple[str, str], dict]) -> str:
    return "".join(f"<details><summary>{html.escape(d)} × {html.escape(m)}</summary>"
                   f"<pre>{html.escape(json.dumps(meta, indent=1, sort_keys=True))}</pre></details>"
                   for (d, m), meta in metas.items())


# -- per-case browser -----------------------------------------------------------------------------------------
def _size_bin(fraction: float) -> str:
    for lo, hi in zip(SIZE_EDGES[:-1], SIZE_EDGES[1:]):
        if fraction <= hi:
            return f"{lo:.0%}–{hi:.0%}"
    return f"{SIZE_EDGES[-2]:.0%}–{SIZE_EDGES[-1]:.0%}"


def _jpeg(rgb: np.ndarray) -> str:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="JPEG", quality=82)
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode()


def _resize(a: np.ndarray, size: int) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.fromarray(a.astype(np.float32), mode="F").resize((size, size), Image.BILINEAR))


def _gray(image: np.ndarray, size: int) -> np.ndarray:
    img = image if image.ndim == 2 else image.mean(axis=-1)
    g = _resize(img, size)
    g = (g - g.min()) / max(float(g.max() - g.min()), 1e-12)
    return np.repeat(g[..., None], 3, axis=2)


def _outline(mask: np.ndarray) -> np.ndarray:
    m = mask.astype(bool)
    inner = m.copy()
    inner[1:] &= m[:-1]
    inner[:-1] &= m[1:]
    inner[:, 1:] &= m[:, :-1]
    inner[:, :-1] &= m[:, 1:]
    return m & ~inner


def _thumb_mask(mask: np.ndarray, size: int) -> np.ndarray:
    return _resize(mask.astype(np.float32), size) >= 0.5


def _cards(run_dir: Path, pairs: pd.DataFrame, tidy: pd.DataFrame, metas: dict, grid: tuple[int, int],
           per_class: int, size: int, progress: bool) -> tuple[list[dict], str]:
    """One dict per shown (dataset, case, class): thumbnails and per-model results."""
    from matplotlib import colormaps
    from .logs import progress_iter

    from .results import ResultStore

    if pairs.empty:
        return [], "<p>No positive pairs in this run.</p>"
    jet = colormaps["jet"]
    store = ResultStore(run_dir)
    cards: list[dict] = []
    shown_total, all_total = 0, 0
    best_tau = tidy[tidy["metric"] == "best_tau"].set_index(["dataset", "model", "finding"])["value"]
    for ds, dpairs in pairs.groupby("dataset", sort=False):
        dmetas = {m: meta for (d, m), meta in metas.items() if d == ds}
        first = next(iter(dmetas.values()))
        data = open_run_dataset(first)
        row_of = {c: i for i, c in enumerate(data.cases["case_id"].astype(str))}
        preds = {m: store.read(ds, m) for m in dmetas}
        pos = {m: {c: i for i, c in enumerate(p.case_ids.tolist())} for m, p in preds.items()}
        result = {(m, str(c), f): (h, d) for m, c, f, h, d in zip(dpairs["model"], dpairs["case_id"], dpairs["finding"],
                                                                  dpairs["pointing"], dpairs["dice@best"])}
        chosen = []
        for finding, fp in dpairs.groupby("finding", sort=False):
            ids = list(dict.fromkeys(fp["case_id"].astype(str)))
            all_total += len(ids)
            ids = sorted(ids, key=lambda c: row_of.get(c, 0))[:per_class]
            shown_total += len(ids)
            chosen += [(c, finding) for c in ids]
        for case_id, finding in progress_iter(chosen, desc=f"report {ds}", unit="case", disable=not progress):
            sample = data[row_of[case_id]]
            image = sample.image()
            mask = sample.mask(finding, grid)
            base = _gray(image, size)
            tm = _thumb_mask(mask, size)
            gt = base.copy()
            gt[_outline(tm)] = (1.0, 0.15, 0.15)
            c = data.findings.index(finding)
            frac = float(mask.mean())
            card = {"dataset": ds, "case": case_id, "cls": finding, "size": _size_bin(frac), "area": round(frac, 4),
                    "img": _jpeg((gt * 255).astype(np.uint8)), "models": []}
            for model, p in preds.items():
                if case_id not in pos[model] or (model, case_id, finding) not in result:
                    continue
                hit, dice_best = result[(model, case_id, finding)]
                i = pos[model][case_id]
                up, norm = maps_at_grid(p.maps[i:i + 1, c], p.windows[i:i + 1], p.sizes[i:i + 1], grid)
                v = norm[0]
                y, x = np.unravel_index(int(np.argmax(up[0])), grid)
                heat = jet(np.nan_to_num(_resize(v, size)))[..., :3]
                rgb = 0.55 * base + 0.45 * heat
                ty, tx = int((y + 0.5) * size / grid[0]), int((x + 0.5) * size / grid[1])
                for d in range(-4, 5):
                    for yy, xx in ((ty + d, tx), (ty, tx + d)):
                        if 0 <= yy < size and 0 <= xx < size:
                            rgb[yy, xx] = 1.0
                rgb[_outline(tm)] = (1.0, 0.15, 0.15)
                tau = best_tau.get((ds, model, finding), np.nan)
                card["models"].append({"model": model, "img": _jpeg((np.clip(rgb, 0, 1) * 255).astype(np.uint8)),
                                       "hit": None if not np.isfinite(hit) else bool(hit),
                                       "dice": None if not np.isfinite(dice_best) else round(float(dice_best), 3),
                                       "tau": None if not np.isfinite(tau) else round(float(tau), 2)})
            cards.append(card)
    note = (f"<p>Showing {shown_total} of {all_total} positive (case, class) pairs: the first {per_class} of each "
            "class in dataset order. Red outline: ground truth; white cross: the map's argmax at the evaluation grid; "
            "Dice at the class's best τ.</p>")
    return cards, note


def _browser_html(cards: list[dict], pairs: pd.DataFrame, metas: dict) -> str:
    datasets = sorted({c["dataset"] for c in cards})
    classes = list(dict.fromkeys(c["cls"] for c in cards))
    models = list(dict.fromkeys(m for (_, m) in metas))
    sizes = [f"{lo:.0%}–{hi:.0%}" for lo, hi in zip(SIZE_EDGES[:-1], SIZE_EDGES[1:])]

    def select(name: str, label: str, values: list[str], everything: str) -> str:
        opts = f'<option value="">{everything}</option>' + "".join(
            f'<option value="{html.escape(v)}">{html.escape(v)}</option>' for v in values)
        return f'<label>{label} <select id="f-{name}" data-key="{name}">{opts}</select></label>'

    controls = (select("dataset", "dataset", datasets, "all") + select("class", "class", classes, "all")
                + select("model", "model", models, "all models") + select("outcome", "pointing", ["hit", "miss"], "hit or miss")
                + select("size", "lesion size", sizes, "all"))
    out = [f'<div class="filters">{controls} <span>shown: <b id="shown">{len(cards)}</b> of {len(cards)}</span></div>',
           '<div id="cards">']
    for c in cards:
        hits = " ".join(f'{m["model"]}={"hit" if m["hit"] else "miss"}' for m in c["models"] if m["hit"] is not None)
        panels = [f'<div class="panel gt"><img src="{c["img"]}" alt="image"><div>image + GT</div></div>']
        for m in c["models"]:
            res = ("hit" if m["hit"] else "miss") if m["hit"] is not None else "–"
            dice = "–" if m["dice"] is None else f'{m["dice"]:.3f}'
            tau = "" if m["tau"] is None else f' (τ={m["tau"]:.2f})'
            panels.append(f'<div class="panel" data-model="{html.escape(m["model"])}"><img src="{m["img"]}" '
                          f'alt="{html.escape(m["model"])}"><div>{html.escape(m["model"])}</div>'
                          f'<div class="{res}">{res} · Dice {dice}{tau}</div></div>')
        out.append(f'<div class="card" data-dataset="{html.escape(c["dataset"])}" data-class="{html.escape(c["cls"])}" '
                   f'data-size="{html.escape(c["size"])}" data-hits="{html.escape(hits)}">'
                   f'<div class="title">{html.escape(c["dataset"])} · {html.escape(c["case"])} · '
                   f'{html.escape(c["cls"])} · GT area {c["area"]:.1%}</div>{"".join(panels)}</div>')
    out.append("</div>")
    return "\n".join(out)


_CSS = """
body{font-family:system-ui,sans-serif;margin:1.2em;color:#222}
h1{font-size:1.4em} h2{border-bottom:1px solid #ccc;margin-top:1.5em} h3{font-size:1em;margin:1em 0 .3em}
table{border-collapse:collapse;font-size:12px;margin-bottom:.8em} th,td{border:1px solid #ddd;padding:2px 6px}
th{background:#f2f2f2;cursor:pointer;user-select:none} th.asc:after{content:" ▲"} th.desc:after{content:" ▼"}
.ci{color:#888;font-size:10px} #js-errors:empty{display:none} pre{font-size:11px;background:#f7f7f7;padding:.5em;overflow:auto;max-height:30em}
figure{display:inline-block;margin:.4em;vertical-align:top} figure img{max-width:520px}
figcaption{font-size:11px;color:#555}
.filters{position:sticky;top:0;background:#fff;padding:.4em 0;z-index:2;border-bottom:1px solid #eee}
.filters label{margin-right:1em;font-size:13px}
.card{border:1px solid #ccc;border-radius:4px;margin:.4em 0;padding:.3em;display:flex;flex-wrap:wrap;align-items:flex-start}
.card.hidden,.panel.hidden{display:none} .card .title{width:100%;font-size:12px;font-weight:600;margin-bottom:.2em}
.panel{margin:0 .25em;text-align:center;font-size:11px} .panel img{display:block}
.hit{color:#0a7a2f} .miss{color:#b3261e}
"""

_JS = r"""
(function(){
  var errors = [];
  window.addEventListener('error', function(e){ errors.push(String(e.message)); var el=document.getElementById('js-errors'); if(el){el.textContent=errors.join('\n');} });
  function state(){ var s={}; document.querySelectorAll('.filters select').forEach(function(x){ if(x.value){ s[x.dataset.key]=x.value; } }); return s; }
  function apply(){
    var s = state(), shown = 0;
    document.querySelectorAll('.card').forEach(function(card){
      var hits = {}; card.dataset.hits.split(' ').forEach(function(t){ if(t){ var i=t.lastIndexOf('='); hits[t.slice(0,i)]=t.slice(i+1); } });
      var ok = (!s.dataset || card.dataset.dataset===s.dataset) && (!s['class'] || card.dataset['class']===s['class'])
            && (!s.size || card.dataset.size===s.size);
      if(ok && s.model){ ok = s.model in hits || card.querySelector('.panel[data-model="'+s.model+'"]') !== null; }
      if(ok && s.outcome){ ok = s.model ? hits[s.model]===s.outcome : Object.keys(hits).some(function(k){ return hits[k]===s.outcome; }); }
      card.classList.toggle('hidden', !ok);
      card.querySelectorAll('.panel[data-model]').forEach(function(p){ p.classList.toggle('hidden', !!s.model && p.dataset.model!==s.model); });
      if(ok){ shown++; }
    });
    document.getElementById('shown').textContent = String(shown);
  }
  function fromHash(){
    var params = new URLSearchParams(location.hash.replace(/^#/, ''));
    document.querySelectorAll('.filters select').forEach(function(x){
      var v = params.get(x.dataset.key);
      x.value = (v !== null && Array.prototype.some.call(x.options, function(o){ return o.value===v; })) ? v : '';
    });
    apply();
  }
  function toHash(){
    var s = state(), p = new URLSearchParams();
    Object.keys(s).forEach(function(k){ p.set(k, s[k]); });
    history.replaceState(null, '', '#' + p.toString());
    apply();
  }
  function cellValue(cell){
    if(!cell){ return ''; }
    if(cell.dataset.v !== undefined){ return cell.dataset.v; }
    var t = cell.textContent.trim();
    return (t === '–' || t === '') ? '' : t;
  }
  function sortBy(th){
    var table = th.closest('table'), idx = Array.prototype.indexOf.call(th.parentNode.children, th);
    var asc = !th.classList.contains('asc');
    table.querySelectorAll('th').forEach(function(h){ h.classList.remove('asc','desc'); });
    th.classList.add(asc ? 'asc' : 'desc');
    var rows = Array.prototype.slice.call(table.tBodies[0].rows);
    rows.sort(function(a, b){
      var x = cellValue(a.cells[idx]), y = cellValue(b.cells[idx]);
      var nx = parseFloat(x), ny = parseFloat(y);
      var cmp = (x===''||x===undefined) ? 1 : (y===''||y===undefined) ? -1
              : (!isNaN(nx) && !isNaN(ny)) ? nx - ny : String(x).localeCompare(String(y));
      return (x===''||y==='') ? cmp : (asc ? cmp : -cmp);
    });
    rows.forEach(function(r){ table.tBodies[0].appendChild(r); });
  }
  document.addEventListener('DOMContentLoaded', function(){
    document.querySelectorAll('.paper table').forEach(function(t){ if(t.tHead && t.tBodies.length){ t.classList.add('sortable'); } });
    document.querySelectorAll('table.sortable').forEach(function(t){
      var last = t.tHead.rows[t.tHead.rows.length - 1];  // sort by the bottom header row (it lines up with body cells)
      Array.prototype.forEach.call(last.cells, function(th){ th.addEventListener('click', function(){ sortBy(th); }); });
    });
    document.querySelectorAll('.filters select').forEach(function(x){ x.addEventListener('change', toHash); });
    window.addEventListener('hashchange', fromHash);
    fromHash();
    document.body.dataset.ready = '1';
  });
})();
"""

_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>{css}</style></head>
<body><h1>{title}</h1><nav>{nav}</nav><pre id="js-errors" style="color:#b3261e"></pre>
{body}
<script>{js}</script></body></html>
"""
