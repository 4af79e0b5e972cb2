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
(:mod:`xbench.models.windows`, :func:`xbench.metrics.upsample_maps`, :func:`xbench.metrics.normalize_maps`);
images and regions are read from the dataset named in the store's ``meta.json``.
"""
from __future__ import annotations

import base64
import hashlib
import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..core.atomic import atomic_write_text
from ..evaluation.comparisons import comparisons_blocks
from ..core.errors import XBenchError
from .exports import maps_at_grid, open_run_dataset, run_grid

__all__ = ["build_report", "SIZE_EDGES"]

#: Lesion-size bins of the browser: GT area as a fraction of the image, right-closed ``(lo, hi]``.
SIZE_EDGES = (0.0, 0.01, 0.05, 0.15, 1.0)


def _summary_metrics(present: set[str]) -> list[str]:
    """Dataset-level metrics of the summary table in metric-table order; Hamming accuracy and pointing
    margins (``pointing@Npx``) last, sorted."""
    from ..metrics import HAMMING_ACCURACY, METRIC_TABLE
    from ..metrics.table import metric

    def row(name: str) -> object:
        try:
            return metric(name)
        except KeyError:
            return None

    first = [n for m in METRIC_TABLE if m.name != HAMMING_ACCURACY for n in sorted(present) if row(n) is m]
    return first + sorted(n for n in present if n.startswith("pointing@") or n == HAMMING_ACCURACY)


def build_report(run_dir: str | Path, out: str | Path | None = None, *, max_cases_per_class: int = 24,
                 thumb: int = 112, grid: tuple[int, int] | None = None, progress: bool = False) -> Path:
    """Write the HTML report of an evaluated run (see the module docstring); returns its path.

    ``max_cases_per_class``: the browser shows the first that many positive cases (in dataset
    order) of each (dataset, class); the page states how many of how many are shown.
    ``grid``: the run's evaluation grid; by default recovered from ``pairs`` (``gt_area /
    area_fraction`` = H·W, square grids), an error asks for it otherwise.
    """
    from ..evaluation.evaluate import load_tables, read_evaluation_log
    from ..store.results import ResultStore

    run_dir = Path(run_dir)
    t = load_tables(run_dir)
    out = Path(out) if out is not None else run_dir / "report.html"
    metas = {(p.parent.parent.name, p.parent.name): ResultStore._read_meta(p)  # checked: regular, bounded, typed
             for p in sorted((run_dir / "store").glob("*/*/meta.json"))}
    if not metas:
        raise XBenchError(f"{run_dir} has no store/<dataset>/<model>/meta.json: not a run folder")
    log = read_evaluation_log(run_dir / "tables" / "evaluation_log.json")
    run_log = _read_json(run_dir / "run_log.json")
    grid = tuple(grid) if grid is not None else run_grid(t["pairs"])
    cards, note = _cards(run_dir, t["pairs"], t["metrics"], metas, grid, max_cases_per_class, thumb, progress)
    sections = [
        ("Tables", _tables_blocks(t["metrics"]) + _paper_tables_blocks(run_dir)),
        ("Which differences are real", comparisons_blocks(run_dir)),
        ("Per-case browser", [{"kind": "p", "text": note}, _browser_block(cards, metas)]),
        ("Figures", _figures_blocks(run_dir)),
        ("Models and weights", [_models_table(t["models"])]),
        ("Evaluation log", _log_blocks(log, run_log)),
        ("Run configuration", _config_blocks(metas)),
    ]
    from ..explain.report_section import explain_sections

    sections[4:4] = [(title, [{"kind": "p", "text": note}, _frame_table(frame, "explain")])  # after Figures, when
                     for title, note, frame in explain_sections(run_dir)]  # notebook 11 ran
    page = render_page(f"XBench report — {run_dir.name}", sections)
    out.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write_text(out, page)


def _read_json(path: Path) -> Any:
    from ..core.errors import FormatError
    from ..core.files import read_regular

    try:
        return json.loads(read_regular(path, within=path.parent, limit=64 << 20).decode("utf-8"))
    except FileNotFoundError:
        return None
    except (ValueError, RecursionError) as exc:
        raise FormatError(path, f"not JSON ({type(exc).__name__}: {str(exc)[:120]})") from None


# -- tables: data only; every string reaches the page through the autoescaping template ------------------
def _fmt(v: float, lo: float, hi: float) -> dict[str, str]:
    """A cell: ``v`` (sort key), ``text`` and ``ci`` ("[lo, hi]" when both are finite)."""
    if not np.isfinite(v):
        return {"v": "", "text": "–", "ci": ""}
    ci = f"[{lo:.3f}, {hi:.3f}]" if np.isfinite(lo) and np.isfinite(hi) else ""
    return {"v": repr(float(v)), "text": f"{v:.3f}", "ci": ci}


def _text(value: Any) -> dict[str, str]:
    return {"v": "", "text": str(value), "ci": ""}


def _number(value: Any) -> dict[str, str]:
    return {"v": repr(float(value)), "text": str(value), "ci": ""}


_MISSING = {"v": "", "text": "–", "ci": ""}


def _sortable(index_name: str, rows: list[tuple[str, list[dict[str, str]]]], columns: list[str], kind: str) -> dict:
    return {"kind": "table", "table_kind": kind, "columns": [index_name, *columns], "rows": rows}


def _tables_blocks(tidy: pd.DataFrame) -> list[dict]:
    from ..metrics import DATASET_LEVEL

    blocks: list[dict] = [{"kind": "intro"}]
    for ds, sub in tidy.groupby("dataset", sort=False):
        level = sub[sub["finding"] == DATASET_LEVEL]
        metrics = _summary_metrics(set(level["metric"]))
        rows = []
        for model, msub in level.groupby("model", sort=False):
            by = msub.set_index("metric")
            rows.append((str(model), [_fmt(by.at[m, "value"], by.at[m, "ci_low"], by.at[m, "ci_high"])
                                      if m in by.index else _MISSING for m in metrics]))
        blocks += [{"kind": "h3", "text": f"{ds}: mean over classes"}, _sortable("model", rows, metrics, "summary")]
        classes = [f for f in dict.fromkeys(sub["finding"]) if not str(f).startswith("(")]
        for metric in ("pointing", "dice@best"):
            models = [str(m) for m in dict.fromkeys(sub["model"])]
            rows = []
            for f in classes:
                cell = sub[(sub["finding"] == f) & (sub["metric"] == metric)].set_index("model")
                if cell.empty:
                    continue
                rows.append((str(f), [_fmt(cell.at[m, "value"], cell.at[m, "ci_low"], cell.at[m, "ci_high"])
                                      if m in cell.index else _MISSING for m in models]))
            if rows:
                blocks += [{"kind": "h3", "text": f"{ds}: {metric} per class"}, _sortable("class", rows, models, metric)]
    return blocks


def _paper_tables_blocks(run_dir: Path) -> list[dict]:
    """Every paper-form table of the run folder, rendered from its CSV (``tables/**/<stem>.csv`` next to a
    ``.md``): value [CI] cells for :func:`xbench.outputs.tables.write_table` tables, the CSV's cells as text otherwise
    (:meth:`xbench.outputs.tables.PaperTable.write`). Their ``.html`` files are never pasted into the page."""
    blocks: list[dict] = []
    same: dict[bytes, list[str]] = {}  # one table written under several names (tables/paper/, notebooks) shows once
    for path in sorted((run_dir / "tables").rglob("*.csv")):
        if path.with_suffix(".md").exists():
            same.setdefault(path.read_bytes(), []).append(str(path.relative_to(run_dir / "tables").with_suffix("")))
    for path in sorted((run_dir / "tables").rglob("*.csv")):
        if not path.with_suffix(".md").exists():
            continue
        names = same[path.read_bytes()]
        if names[0] != str(path.relative_to(run_dir / "tables").with_suffix("")):
            continue
        frame = pd.read_csv(path, index_col=0, dtype=str, keep_default_na=False)
        name = names[0] + (f" (also written as {', '.join(names[1:])})" if len(names) > 1 else "")
        cells = [c.rsplit(" / ", 1)[0] for c in frame.columns if c.endswith(" / value")]
        rows = []
        if cells:
            for idx, r in frame.iterrows():
                rows.append((str(idx), [_fmt(*(_float(r.get(f"{c} / {k}", "")) for k in ("value", "ci_low", "ci_high")))
                                        for c in cells]))
        else:
            cells = [str(c) for c in frame.columns]
            for idx, r in frame.iterrows():
                rows.append((str(idx), [_number(v) if _is_number(v) else _text(v) for v in r.tolist()]))
        blocks += [{"kind": "h3", "text": f"Paper-form table: {name}"},
                   _sortable(str(frame.index.name or ""), rows, cells, "paper")]
    return blocks


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return float("nan")


def _is_number(text: str) -> bool:
    return bool(np.isfinite(_float(text)))


def _frame_table(frame: pd.DataFrame, kind: str) -> dict:
    """A sortable table block of ``frame`` (first column as the row name; every cell escaped by the template)."""
    rows = [(str(r.iloc[0]), [_text(v) for v in r.iloc[1:]]) for _, r in frame.iterrows()]
    return _sortable(str(frame.columns[0]), rows, [str(c) for c in frame.columns[1:]], kind)


def _models_table(models: pd.DataFrame) -> dict:
    first = [c for c in ("model", "weights") if c in models.columns]
    return _frame_table(models[first + [c for c in models.columns if c not in first]], "models")


def _figures_blocks(run_dir: Path) -> list[dict]:
    pngs = sorted((run_dir / "figures").glob("*.png"))
    if not pngs:
        return [{"kind": "nofigures"}]
    return [{"kind": "figure", "alt": p.stem, "caption": p.name,
             "src": "data:image/png;base64," + base64.b64encode(p.read_bytes()).decode()} for p in pngs]


def _log_blocks(log: Any, run_log: Any) -> list[dict]:
    if not log:
        return [{"kind": "p", "text": "No evaluation_log.json."}]
    rows = []
    for entry in log:
        for finding, c in entry.get("pairs", {}).items():
            skipped = entry.get("cases_skipped_at_inference", 0)
            rows.append((f'{entry["dataset"]} × {entry["model"]}', [
                _text(finding), _number(c["evaluated"]), _number(c["missing_prediction"]),
                _number(c["positive_without_region"]), _number(skipped)]))
    blocks = [_sortable("dataset × model", rows, ["class", "pairs evaluated", "excluded: no prediction",
                                                 "excluded: positive without region", "cases skipped at inference"], "log")]
    if run_log:
        blocks.append({"kind": "details", "summary": "run_log.json", "text": json.dumps(run_log, indent=1)})
    return blocks


def _config_blocks(metas: dict[tuple[str, str], dict]) -> list[dict]:
    return [{"kind": "details", "summary": f"{d} × {m}", "text": json.dumps(meta, indent=1, sort_keys=True)}
            for (d, m), meta in metas.items()]


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
    from ..core.logs import progress_iter

    from ..store.results import ResultStore

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
    note = (f"Showing {shown_total} of {all_total} positive (case, class) pairs: the first {per_class} of each "
            "class in dataset order. Red outline: ground truth; white cross: the map's argmax at the evaluation grid; "
            "Dice at the class's best τ.")
    return cards, note


def _browser_block(cards: list[dict], metas: dict) -> dict:
    classes = list(dict.fromkeys(c["cls"] for c in cards))
    sizes = [f"{lo:.0%}–{hi:.0%}" for lo, hi in zip(SIZE_EDGES[:-1], SIZE_EDGES[1:])]
    filters = [("dataset", "dataset", sorted({c["dataset"] for c in cards}), "all"), ("class", "class", classes, "all"),
               ("model", "model", list(dict.fromkeys(m for (_, m) in metas)), "all models"),
               ("outcome", "pointing", ["hit", "miss"], "hit or miss"), ("size", "lesion size", sizes, "all")]
    shown = []
    for c in cards:
        hits = " ".join(f'{m["model"]}={"hit" if m["hit"] else "miss"}' for m in c["models"] if m["hit"] is not None)
        panels = []
        for m in c["models"]:
            res = ("hit" if m["hit"] else "miss") if m["hit"] is not None else "–"
            dice = "–" if m["dice"] is None else f'{m["dice"]:.3f}'
            tau = "" if m["tau"] is None else f' (τ={m["tau"]:.2f})'
            panels.append({"model": m["model"], "img": m["img"], "res": res, "text": f"{res} · Dice {dice}{tau}"})
        shown.append({**c, "hits": hits, "panels": panels, "title": f'{c["dataset"]} · {c["case"]} · {c["cls"]} · '
                                                                    f'GT area {c["area"]:.1%}'})
    return {"kind": "browser", "filters": filters, "cards": shown}


#: Every page is rendered by this template with autoescaping on: no string from a run folder (class names from
#: a manifest, model names, CSV cells, JSON) can become markup. Only the constant stylesheet and script are
#: marked safe, and the Content-Security-Policy admits exactly that script (by its SHA-256) and no other.
_TEMPLATE = """{% macro block(b) -%}
{%- if b.kind == "table" -%}
<table class="sortable" data-kind="{{ b.table_kind }}"><thead><tr>{% for c in b.columns %}<th>{{ c }}</th>{% endfor %}</tr></thead><tbody>
{%- for name, cells in b.rows %}<tr><td data-v="{{ name }}">{{ name }}</td>{% for c in cells %}<td data-v="{{ c.v }}">{{ c.text }}{% if c.ci %} <span class="ci">{{ c.ci }}</span>{% endif %}</td>{% endfor %}</tr>{% endfor -%}
</tbody></table>
{%- elif b.kind == "h3" %}<h3>{{ b.text }}</h3>
{%- elif b.kind == "p" %}<p>{{ b.text }}</p>
{%- elif b.kind == "intro" %}<p>Click a column header to sort. Cells: value [95 % bootstrap CI]. Pointing at margin 0 (argmax inside the region); other margins are named <code>pointing@Npx</code>.</p>
{%- elif b.kind == "nofigures" %}<p>No figures in this run folder (the notebooks write them to <code>figures/</code>).</p>
{%- elif b.kind == "figure" %}<figure><img alt="{{ b.alt }}" src="{{ b.src }}"><figcaption>{{ b.caption }}</figcaption></figure>
{%- elif b.kind == "details" %}<details><summary>{{ b.summary }}</summary><pre>{{ b.text }}</pre></details>
{%- elif b.kind == "browser" -%}
<div class="filters">{% for key, label, values, everything in b.filters %}<label>{{ label }} <select id="f-{{ key }}" data-key="{{ key }}"><option value="">{{ everything }}</option>{% for v in values %}<option value="{{ v }}">{{ v }}</option>{% endfor %}</select></label>{% endfor %} <span>shown: <b id="shown">{{ b.cards|length }}</b> of {{ b.cards|length }}</span></div>
<div id="cards">
{% for c in b.cards %}<div class="card" data-dataset="{{ c.dataset }}" data-class="{{ c.cls }}" data-size="{{ c.size }}" data-hits="{{ c.hits }}"><div class="title">{{ c.title }}</div><div class="panel gt"><img src="{{ c.img }}" alt="image"><div>image + GT</div></div>{% for m in c.panels %}<div class="panel" data-model="{{ m.model }}"><img src="{{ m.img }}" alt="{{ m.model }}"><div>{{ m.model }}</div><div class="{{ m.res }}">{{ m.text }}</div></div>{% endfor %}</div>
{% endfor %}</div>
{%- else %}{{ raise_unknown(b.kind) }}{% endif -%}
{%- endmacro -%}
<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{{ csp }}">
<title>{{ title }}</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>{{ css }}</style></head>
<body><h1>{{ title }}</h1><nav>{% for name, _ in sections %}{% if not loop.first %} · {% endif %}<a href="#sec-{{ loop.index0 }}">{{ name }}</a>{% endfor %}</nav><pre id="js-errors" class="errors"></pre>
{% for name, blocks in sections %}<section id="sec-{{ loop.index0 }}"><h2>{{ name }}</h2>{% for b in blocks %}{{ block(b) }}{% endfor %}</section>
{% endfor %}<script>{{ js }}</script></body></html>
"""


def _raise_unknown(kind: str) -> None:
    raise XBenchError(f"report: unknown block kind {kind!r}")


def render_page(title: str, sections: list[tuple[str, list[dict]]]) -> str:
    """The report page from ``sections`` (name, blocks) through the autoescaping :data:`_TEMPLATE` (control and bidi
    characters of every value shown as ``\\uXXXX``: :func:`xbench.core.summary.visible`), with a
    Content-Security-Policy that admits only the page's own inline script and stylesheet (by hash) and
    ``data:`` images: no other script, no network."""
    import jinja2
    from markupsafe import Markup

    from ..core.summary import visible

    def shown(value: Any) -> Any:  # control and bidi characters of run data shown as \uXXXX, never applied
        return visible(value, keep="\n\t") if isinstance(value, str) and not isinstance(value, Markup) else value

    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined, finalize=shown)
    digest = lambda text: base64.b64encode(hashlib.sha256(text.encode()).digest()).decode()  # noqa: E731
    csp = (f"default-src 'none'; script-src 'sha256-{digest(_JS)}'; style-src 'sha256-{digest(_CSS)}'; "
           "img-src data:; base-uri 'none'; form-action 'none'")
    template = env.from_string(_TEMPLATE)
    return template.render(title=title, sections=sections, csp=csp, css=Markup(_CSS), js=Markup(_JS),
                           raise_unknown=_raise_unknown)


_CSS = """
body{font-family:system-ui,sans-serif;margin:1.2em;color:#222}
h1{font-size:1.4em} h2{border-bottom:1px solid #ccc;margin-top:1.5em} h3{font-size:1em;margin:1em 0 .3em}
table{border-collapse:collapse;font-size:12px;margin-bottom:.8em} th,td{border:1px solid #ddd;padding:2px 6px}
th{background:#f2f2f2;cursor:pointer;user-select:none} th.asc:after{content:" ▲"} th.desc:after{content:" ▼"}
.ci{color:#888;font-size:10px} #js-errors:empty{display:none} .errors{color:#b3261e} pre{font-size:11px;background:#f7f7f7;padding:.5em;overflow:auto;max-height:30em}
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
