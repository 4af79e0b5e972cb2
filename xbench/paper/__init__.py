"""The paper's published numbers as reference data (arXiv 2510.19599, Tables 1–5).

:func:`load_reference` returns one row per published cell (tidy, like a run's
``metrics.csv`` but in **percent as printed**), with columns :data:`COLUMNS`:

``table``         1–5
``model``         registry name (``clip`` … ``devide``)
``dataset``       registry name (``covid_rural`` … ``nih_bbox``)
``finding``       the dataset's class name, or ``"(mean over classes)"``
                  (:data:`xbench.metrics.DATASET_LEVEL`) for Table 1 and the Mean columns
``paper_class``   the paper's column header (``ATE``, ``Air. Opac.``, ``Mean`` …)
``metric``        ``pointing``, ``dice@best``, ``iou@best``
``value``         percent as printed; ``printed``: the printed text (``9.8``, ``0.0`` kept)
``mark``          ``underline`` where the extracted text shows one (bold was lost in extraction)
``source_line``   line in ``paper_2510.19599.txt`` (the extracted text) the value was read from
``flag``          empty, or why the cell disagrees with another printed cell
                  (:func:`flag_inconsistencies`; the paper is kept as printed, never corrected)

:func:`implied_denominator` gives the smallest number of positive pairs for
which printed pointing values are ``k/n`` (rounded to 2 decimals), and
:func:`expected_positive_pairs` the counts the dataset manifests expect;
:func:`synthetic_results` builds a full 7-model × 7-dataset tidy result set from them.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from functools import lru_cache
from importlib import resources

import numpy as np
import pandas as pd

DATASET_LEVEL = "(mean over classes)"  # == xbench.metrics.DATASET_LEVEL (kept import-free)
_COUNTS = ("n_pairs", "n_cases", "n_labels", "n_classes")  # == xbench.metrics.COUNT_COLUMNS

COLUMNS = ("table", "model", "dataset", "finding", "paper_class", "metric", "value", "printed", "mark", "source_line",
           "flag")

# ``MODELS`` (registry name → the paper's display name, in the paper's row order) and ``GROUPS`` (registry name →
# pretraining group of Fig. 3, paper §4.0.2) are read from the ``paper:`` section of the model YAMLs
# (``paper: {name, group, row}``), the one place model facts are written; see :func:`paper_models`.
#: Registry name → Table 1 column group, in the paper's column order.
DATASETS = {"covid_rural": "COVID-19", "rsna_pneumonia": "RSNA Pneumonia", "siim_acr": "SIIM Pneumothorax",
            "chestx_det10": "CheXDet-10", "chexlocalize": "CheXlocalize", "vindr_cxr": "VinDr-CXR",
            "nih_bbox": "ChestX-ray14"}
#: Table → dataset of its per-class pointing values.
CLASS_TABLES = {2: "vindr_cxr", 3: "nih_bbox", 4: "chestx_det10", 5: "chexlocalize"}
#: Table → the paper's class header → the dataset's class name (manifest ``name``), in the paper's order.
TABLE_CLASSES: dict[int, dict[str, str]] = {
    2: {"Aortic enl.": "Aortic enlargement", "Atelectasis": "Atelectasis", "Calcif.": "Calcification",
        "Cardiomegaly": "Cardiomegaly", "Clav. fract.": "Clavicle fracture", "Consol.": "Consolidation",
        "Emphysema": "Emphysema", "Enl. PA": "Enlarged PA", "ILD": "ILD", "Infiltration": "Infiltration",
        "Lung Opac.": "Lung Opacity", "Lung cavity": "Lung cavity", "Lung cyst": "Lung cyst",
        "Mediast. shift": "Mediastinal shift", "Nodule/Mass": "Nodule/Mass", "Other lesion": "Other lesion",
        "Pleural eff.": "Pleural effusion", "Pleural thick.": "Pleural thickening", "Pneumothorax": "Pneumothorax",
        "Pulm. fibrosis": "Pulmonary fibrosis", "Rib fract.": "Rib fracture"},
    3: {"ATE": "Atelectasis", "CARD": "Cardiomegaly", "EFF": "Effusion", "INF": "Infiltrate", "MASS": "Mass",
        "NOD": "Nodule", "PNEU": "Pneumonia", "PTX": "Pneumothorax"},
    4: {"ATE": "Atelectasis", "CALC": "Calcification", "CONS": "Consolidation", "EFF": "Effusion",
        "EMPH": "Emphysema", "FIB": "Fibrosis", "FX": "Fracture", "MASS": "Mass", "NOD": "Nodule",
        "PTX": "Pneumothorax"},
    5: {"Air. Opac.": "Airspace Opacity", "ATE": "Atelectasis", "CARD": "Cardiomegaly", "CONS": "Consolidation",
        "EDEMA": "Edema", "Enl. CARD": "Enlarged Cardiomediastinum", "FX": "Fracture", "Lung Les.": "Lung Lesion",
        "EFF": "Pleural Effusion", "Ple. Oth.": "Pleural Other", "PNEU": "Pneumonia", "PTX": "Pneumothorax",
        "Sup. Dev.": "Support Devices"},
}
#: Single-class datasets of Table 1: the class behind the dataset-level value.
SINGLE_CLASS = {"covid_rural": "COVID-19 opacity", "rsna_pneumonia": "Pneumonia", "siim_acr": "Pneumothorax"}
#: Two printed percentages agree when they differ by at most this (each is rounded to 0.01, so a mean of
#: rounded values and a rounded mean may differ by up to 0.005 + 0.005).
TOLERANCE = 0.01

__all__ = ["COLUMNS", "MODELS", "GROUPS", "DATASETS", "CLASS_TABLES", "TABLE_CLASSES", "SINGLE_CLASS", "TOLERANCE",
           "load_reference", "flag_inconsistencies", "mean_checks", "implied_denominator", "fits", "denominator_table",
           "expected_positive_pairs", "synthetic_results", "paper_name", "paper_models"]


@lru_cache(maxsize=1)
def paper_models() -> tuple[dict[str, str], dict[str, str]]:
    """``(MODELS, GROUPS)`` from the ``paper:`` sections of the registered model YAMLs, ordered by ``row``.

    A section lacking ``name``, ``group`` or an integer ``row``, or two models on one row, raise
    :class:`~xbench.core.errors.FormatError` naming the YAML.

    Examples
    --------
    >>> models, groups = paper_models()
    >>> list(models.items())[:2], groups["carzero"]
    ([('clip', 'CLIP'), ('biomedclip', 'BiomedCLIP')], 'cross-attention')
    """
    from ..core.errors import FormatError
    from ..spec.registry import list_models, model_config

    rows: dict[int, tuple[str, str, str]] = {}
    for model in list_models():
        config = model_config(model)
        section = config.get("paper")
        if section is None:
            continue
        where = config["config_path"]
        if not isinstance(section, dict):
            raise FormatError(where, "expected a mapping {name, group, row}", field="paper")
        for key, kind in (("name", str), ("group", str), ("row", int)):
            if not isinstance(section.get(key), kind) or isinstance(section.get(key), bool):
                raise FormatError(where, f"expected {kind.__name__}, got {section.get(key)!r}", field=f"paper.{key}")
        row = section["row"]
        if row in rows:
            raise FormatError(where, f"row {row} is also model {rows[row][0]!r}'s", field="paper.row")
        rows[row] = (model, section["name"], section["group"])
    ordered = [rows[r] for r in sorted(rows)]
    return {m: name for m, name, _ in ordered}, {m: group for m, _, group in ordered}


def __getattr__(name: str) -> dict[str, str]:
    """``MODELS`` and ``GROUPS``, read from the model YAMLs on first use (:func:`paper_models`)."""
    if name == "MODELS":
        return dict(paper_models()[0])
    if name == "GROUPS":
        return dict(paper_models()[1])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@lru_cache(maxsize=1)
def _read() -> pd.DataFrame:
    with resources.files(__package__).joinpath("reference.csv").open() as f:
        return pd.read_csv(f, dtype={"printed": str, "mark": str, "flag": str}, keep_default_na=False,
                           na_values={"value": [""]})


def load_reference(tables: Iterable[int] | None = None) -> pd.DataFrame:
    """The paper's Tables 1–5 as one tidy frame (columns :data:`COLUMNS`, values in percent as printed).

    Examples
    --------
    >>> ref = load_reference()
    >>> ref[(ref.table == 3) & (ref.model == "carzero") & (ref.paper_class == "CARD")]["value"].item()
    99.32
    """
    ref = _read().copy()
    return ref[ref["table"].isin(list(tables))].reset_index(drop=True) if tables is not None else ref


def mean_checks(ref: pd.DataFrame) -> pd.DataFrame:
    """Every printed Mean (Tables 2–5) and Table 1 Point of a multi-class dataset against the mean of the printed
    class values of its per-class table.

    One row per (table, model): ``printed`` (the Mean or Point value), ``class_mean`` (mean of the printed class
    values), ``n_classes``, ``diff`` and ``consistent`` (``|diff| ≤`` :data:`TOLERANCE`).
    """
    rows = []
    for table, dataset in CLASS_TABLES.items():
        cls = ref[(ref["table"] == table) & (ref["finding"] != DATASET_LEVEL)]
        means = cls.groupby("model")["value"].agg(["mean", "size"])
        for source in (table, 1):
            printed = ref[(ref["table"] == source) & (ref["dataset"] == dataset) & (ref["finding"] == DATASET_LEVEL)
                          & (ref["metric"] == "pointing")]
            for _, r in printed.iterrows():
                m = means.loc[r["model"]]
                rows.append({"table": source, "dataset": dataset, "class_table": table, "model": r["model"],
                             "printed": r["value"], "class_mean": round(float(m["mean"]), 4),
                             "n_classes": int(m["size"])})
    out = pd.DataFrame(rows)
    out["diff"] = (out["printed"] - out["class_mean"]).round(4)
    out["consistent"] = out["diff"].abs() <= TOLERANCE + 1e-9
    return out


def flag_inconsistencies(ref: pd.DataFrame) -> pd.DataFrame:
    """``ref`` with ``flag`` filled where a printed value disagrees with other printed values (by more than
    :data:`TOLERANCE`): a Mean that is not the mean of its class columns; a Table 1 Point that is not the mean of
    the per-class table's classes, or not that table's printed Mean. Values are never changed."""
    out = ref.copy()
    out["flag"] = ""
    checks = mean_checks(out).set_index(["table", "dataset", "model"])
    key = out["finding"] == DATASET_LEVEL
    for i in out.index[key & (out["metric"] == "pointing")]:
        r = out.loc[i]
        if (r["table"], r["dataset"], r["model"]) not in checks.index:
            continue
        c = checks.loc[(r["table"], r["dataset"], r["model"])]
        notes = []
        if not c["consistent"]:
            notes.append(f"printed {r['printed']} ≠ {c['class_mean']:.2f}, the mean of the {c['n_classes']} printed "
                         f"class values of Table {c['class_table']}")
        other = 1 if r["table"] != 1 else c["class_table"]
        twin = out[(out["table"] == other) & (out["dataset"] == r["dataset"]) & (out["model"] == r["model"])
                   & key & (out["metric"] == "pointing")]
        if len(twin) and abs(twin["value"].item() - r["value"]) > TOLERANCE + 1e-9:
            notes.append(f"Table {r['table']} prints {r['printed']}, Table {other} prints {twin['printed'].item()}")
        out.at[i, "flag"] = "; ".join(notes)
    return out


def implied_denominator(values: Sequence[float], *, decimals: int = 2, max_n: int = 5000) -> int | None:
    """Smallest ``n ≤ max_n`` for which every percentage in ``values`` is ``100·k/n`` (some integer ``k``) rounded
    to ``decimals`` places, or None.

    Values of one (dataset, class) from different models share the denominator (the number of positive pairs), so
    passing them together narrows it; 0 and 100 constrain nothing.

    Examples
    --------
    >>> implied_denominator([15.62, 3.12, 53.12])   # COVID-19 Rural, Table 1
    32
    """
    v = np.asarray(values, dtype=float)
    tol = 0.5 * 10.0 ** -decimals + 1e-9
    for n in range(1, max_n + 1):
        k = np.round(v * n / 100.0)
        if np.all(np.abs(100.0 * k / n - v) <= tol):
            return n
    return None


def expected_positive_pairs(dataset: str) -> dict[str, int | None]:
    """Class → positive pairs (positive images with a region) the dataset manifest expects for its default split.

    Per class ``min(positives, region_counts)`` where both are given (exact when every positive has a region, as in
    ChestX-Det10, or each boxed image has one region of the class, as in ChestX-ray14), else the one given; a
    single-class dataset falls back to ``positive_cases``. None where the manifest has no count (VinDr-CXR,
    CheXlocalize, COVID-19 Rural).
    """
    from ..spec.registry import dataset_manifest

    manifest = dataset_manifest(dataset)
    expected = manifest["splits"][manifest["default_split"]].get("expected", {})
    classes = [c["name"] for c in manifest["classes"]]
    pos, reg = expected.get("positives", {}), expected.get("region_counts", {})
    out: dict[str, int | None] = {}
    for c in classes:
        counts = [d[c] for d in (pos, reg) if c in d]
        if not counts and len(classes) == 1 and "positive_cases" in expected:
            counts = [expected["positive_cases"]]
        out[c] = min(counts) if counts else None
    return out


def fits(values: Sequence[float], n: int, *, decimals: int = 2) -> np.ndarray:
    """Per value: whether it is ``100·k/n`` for some integer ``0 ≤ k ≤ n``, rounded to ``decimals`` places."""
    v = np.asarray(values, dtype=float)
    k = np.clip(np.round(v * n / 100.0), 0, n)
    return np.abs(100.0 * k / n - v) <= 0.5 * 10.0 ** -decimals + 1e-9


def denominator_table(ref: pd.DataFrame, observed: pd.DataFrame | None = None, *, max_n: int = 5000) -> pd.DataFrame:
    """Implied-denominator check of every published pointing cell of one class (Tables 1 single-class, 2–5).

    Per (dataset, class): ``implied_n``, the smallest ``n ≤ max_n`` making all seven printed values ``k/n``
    (None: no such n); ``implied_n_wo``/``left_out``, the smallest such n when one model is left out (the model whose
    omission gives the smallest n, reported where that is smaller than ``implied_n``: a model evaluated on other
    cases shows up here; where ``implied_n`` is a multiple of it, both are arithmetically possible and only the
    dataset's counts decide); ``expected_n``, the manifest's
    expected positive pairs (:func:`expected_positive_pairs`) and ``fit_expected``, how many of the seven values are
    ``k/expected_n``; with ``observed`` (a run's tidy table), ``run_n`` (the run's pointing ``n``) and ``fit_run``.
    Classes whose values are all 0 or 100 imply nothing (``implied_n`` 1).
    """
    rows = []
    point = ref[ref["metric"] == "pointing"]
    single = point[(point["table"] == 1) & point["dataset"].isin(list(SINGLE_CLASS))].assign(
        finding=lambda d: d["dataset"].map(SINGLE_CLASS))
    per_class = point[point["table"].isin(list(CLASS_TABLES)) & (point["finding"] != DATASET_LEVEL)]
    for (dataset, finding), sub in pd.concat([single, per_class]).groupby(["dataset", "finding"], sort=False):
        values = sub["value"].to_numpy()
        expected = expected_positive_pairs(dataset).get(finding)
        run_n = None
        if observed is not None:
            hit = observed[(observed["dataset"] == dataset) & (observed["finding"] == finding)
                           & (observed["metric"] == "pointing")]
            run_n = int(hit["n_pairs"].max()) if len(hit) and hit["n_pairs"].max() > 0 else None
        wo = {m: implied_denominator(values[sub["model"].to_numpy() != m], max_n=max_n) for m in sub["model"]}
        wo = {m: n for m, n in wo.items() if n is not None}
        implied = implied_denominator(values, max_n=max_n)
        left_out = min(wo, key=wo.get) if wo else None
        if left_out is not None and implied is not None and wo[left_out] >= implied:
            left_out = None  # leaving a model out does not narrow it
        rows.append({"dataset": dataset, "finding": finding, "table": int(sub["table"].iloc[0]),
                     "paper_class": sub["paper_class"].iloc[0], "values": " ".join(sub["printed"]),
                     "implied_n": implied, "implied_n_wo": wo.get(left_out), "left_out": left_out,
                     "expected_n": expected, "fit_expected": int(fits(values, expected).sum()) if expected else None,
                     "run_n": run_n, "fit_run": int(fits(values, run_n).sum()) if run_n else None,
                     "n_values": len(values)})
    return pd.DataFrame(rows)


def synthetic_results(models: Sequence[str] | None = None, datasets: Sequence[str] = tuple(DATASETS), *,
                      seed: int = 0, fallback_n: int = 50) -> pd.DataFrame:
    """A tidy result table (as ``metrics.csv``) for every model × dataset × class of the manifests, with ``n_pairs``
    (``n_cases`` for AUC) the manifests' expected positive pairs (``fallback_n`` where a manifest has none; the
    dataset level sums them and gives ``n_classes``), pointing ``k/n`` drawn with
    ``seed``, Dice/IoU at best and 0.5 τ, AUC, and bootstrap-like CIs (binomial normal approximation).

    Only for exercising tables, figures and the comparison: the numbers mean nothing.
    """
    from ..spec.registry import dataset_manifest

    models = list(paper_models()[0]) if models is None else models
    rng = np.random.default_rng(seed)
    rows = []
    for d in datasets:
        classes = [c["name"] for c in dataset_manifest(d)["classes"]]
        counts = expected_positive_pairs(d)
        for m in models:
            skill = rng.uniform(0.05, 0.6)
            per = {k: [] for k in ("pointing", "dice@best", "iou@best", "dice@0.5", "iou@0.5", "auc")}
            n_total = 0
            for c in classes:
                n = counts.get(c) or fallback_n
                n_total += n
                p = float(np.clip(rng.normal(skill, 0.1), 0, 1))
                k = rng.binomial(n, p)
                dice = float(np.clip(rng.normal(0.5 * skill + 0.05, 0.05), 0.01, 0.99))
                vals = {"pointing": k / n, "dice@best": dice, "iou@best": dice / (2 - dice),
                        "dice@0.5": dice * rng.uniform(0.6, 1.0), "auc": float(np.clip(0.5 + 0.6 * skill
                                                                                      + rng.normal(0, 0.03), 0, 1))}
                vals["iou@0.5"] = vals["dice@0.5"] / (2 - vals["dice@0.5"])
                for metric, v in vals.items():
                    half = 1.96 * math.sqrt(max(v * (1 - v), 1e-4) / n)
                    rows.append({"model": m, "dataset": d, "finding": c, "metric": metric, "value": v,
                                 "ci_low": max(0.0, v - half), "ci_high": min(1.0, v + half),
                                 "n_cases" if metric == "auc" else "n_pairs": n})
                    per[metric].append(v)
            for metric, vs in per.items():
                v = float(np.mean(vs))
                rows.append({"model": m, "dataset": d, "finding": DATASET_LEVEL, "metric": metric, "value": v,
                             "ci_low": max(0.0, v - 0.05), "ci_high": min(1.0, v + 0.05),
                             **({} if metric == "auc" else {"n_pairs": n_total}), "n_classes": len(vs)})
    columns = ["model", "dataset", "finding", "metric", "value", "ci_low", "ci_high", *_COUNTS]
    return pd.DataFrame(rows, columns=columns).astype({c: "Int64" for c in _COUNTS})


def paper_name(model: str) -> str:
    """The paper's display name of a registry model name (unknown names unchanged)."""
    return paper_models()[0].get(model, model)
