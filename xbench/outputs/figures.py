"""Paper-style figures (seaborn/matplotlib) from the tidy tables; each returns a Figure.

:func:`save_figure` writes PNG (150 dpi) and PDF. Titles name the dataset(s) the
numbers come from, so phantom results are never mistaken for real ones.
Importing this module leaves the matplotlib backend alone: notebooks show the
figures inline, and a headless process (no display) uses matplotlib's default
non-interactive backend, so :func:`save_figure` works there too.

The paper's figures: :func:`paper_fig3` (AUC vs pointing, one point per model),
:func:`visual_comparison` (Fig. 2) and :func:`calibration` (Fig. 4); the others
are XBench's extra views.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from ..metrics.table import display
from .analysis import MIN_POINTS_TO_FIT, calibration_by_model, fit_line, metric_pairs, model_correlation, size_bins
from ..paper import DATASETS, MODELS, paper_name
from ..core.atomic import atomic_write

if TYPE_CHECKING:
    from ..datasets import BaseDataset

#: Perceptually uniform colormap of the saliency maps (Fig. 2).
MAP_CMAP = "inferno"
#: Fig. 2's default findings (the paper's): the first of them present in the dataset are shown.
FIG2_FINDINGS = ("Pneumothorax", "Consolidation", "Lung Opacity")
_GROUP_STYLE = {"direct contrastive": ("tab:blue", "o"), "structured alignment": ("tab:orange", "s"),
                "cross-attention": ("tab:green", "^"), "other": ("tab:gray", "D")}


def _model_order(models: Sequence[str]) -> list[str]:
    """The paper's models in its order, then the others in their given order."""
    return [m for m in MODELS if m in models] + [m for m in models if m not in MODELS]


def save_figure(fig: plt.Figure, stem: str | Path) -> list[Path]:
    """Write ``<stem>.png`` and ``<stem>.pdf``; returns the paths.

    Both files are byte-for-byte deterministic: the PDF carries no ``/CreationDate`` (so a re-run leaves a
    committed figure unchanged) and the PNG no time stamp. The text is drawn with matplotlib's own DejaVu fonts
    (:func:`matplotlib_fonts`), so the bytes do not depend on the fonts installed on the machine either.
    """
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = [stem.with_suffix(".png"), stem.with_suffix(".pdf")]
    with matplotlib_fonts():
        atomic_write(paths[0], lambda tmp: fig.savefig(tmp, dpi=150, bbox_inches="tight"))
        atomic_write(paths[1], lambda tmp: fig.savefig(tmp, bbox_inches="tight", metadata={"CreationDate": None}))
    return paths


@contextmanager
def matplotlib_fonts() -> Iterator[None]:
    """Within the block, matplotlib's bundled DejaVu fonts (``mpl-data/fonts/ttf``) come before any other file of the
    same family (a system ``/usr/share/fonts/.../DejaVuSans.ttf``, say). Another copy of a font numbers its glyphs
    otherwise, and the PDF's font-subset tag is derived from those numbers, so a figure's bytes would depend on
    the machine's fonts. The font list's order is restored afterwards.
    """
    from matplotlib import font_manager

    manager = font_manager.fontManager
    bundled = Path(matplotlib.get_data_path(), "fonts", "ttf")
    listed = {entry.fname for entry in manager.ttflist}
    for path in sorted(bundled.glob("DejaVu*.ttf")):
        if str(path) not in listed:
            manager.addfont(str(path))
    before = list(manager.ttflist)
    forget = getattr(font_manager.FontManager, "_findfont_cached", None)  # findfont's memo (private to matplotlib)
    manager.ttflist.sort(key=lambda entry: Path(entry.fname).parent != bundled)  # stable: bundled first
    if forget is not None:
        forget.cache_clear()
    try:
        yield
    finally:
        manager.ttflist[:] = before
        if forget is not None:
            forget.cache_clear()


def _fit_text(fit) -> str:
    """R² and Spearman ρ of a fit, its CI only where defined (never 'nan')."""
    if fit is None or not np.isfinite(fit.r2):
        return f"no fit (fewer than {MIN_POINTS_TO_FIT} points)" if fit is None else "no fit (constant x)"
    ci = f" [{fit.spearman_low:.2f}, {fit.spearman_high:.2f}]" if np.isfinite(fit.spearman_low) else ""
    rho = f", Spearman ρ = {fit.spearman:.2f}{ci}" if np.isfinite(fit.spearman) else ""
    return f"R² = {fit.r2:.2f}{rho}"


def auc_vs_pointing(tidy: pd.DataFrame, *, level: str, title: str) -> plt.Figure:
    """AUC (x) vs pointing (y), one point per model × dataset (``level`` = the dataset level) or model × class
    (``"per-class"``); least-squares line, R² and Spearman ρ only with ≥ :data:`~xbench.outputs.analysis.MIN_POINTS_TO_FIT`
    points. The paper's Fig. 3 (one point per model) is :func:`paper_fig3`."""
    pts = metric_pairs(tidy, "auc", "pointing", level=level).dropna(subset=["x", "y"])
    fit = fit_line(pts["x"].to_numpy(), pts["y"].to_numpy()) if len(pts) >= MIN_POINTS_TO_FIT else None
    fig, ax = plt.subplots(figsize=(6, 4.5))
    sns.scatterplot(data=pts, x="x", y="y", hue="model", style="dataset", s=70, ax=ax)
    if fit is not None and np.isfinite(fit.slope):
        xs = np.linspace(pts["x"].min(), pts["x"].max(), 50)
        ax.plot(xs, fit.slope * xs + fit.intercept, "k--", lw=1)
    ax.set_xlabel("classification AUC")
    ax.set_ylabel("pointing game accuracy")
    ax.set_title(f"{title}\n{_fit_text(fit)}, n = {len(pts)}", fontsize=10)
    ax.legend(fontsize=7, bbox_to_anchor=(1.02, 1), loc="upper left")
    return fig


def paper_fig3(tidy: pd.DataFrame, *, title: str, baselines: Sequence[str] = ()) -> plt.Figure:
    """Fig. 3 as the paper: one point per model — AUC and pointing each the dataset-level value averaged over the
    datasets where both are defined (:func:`~xbench.outputs.analysis.dataset_means`) — marker and colour by pretraining group,
    the least-squares line with R² and each model's residual (only with ≥ 4 models), percent axes."""
    models = [m for m in _model_order(list(dict.fromkeys(tidy["model"]))) if m not in baselines]
    pts, fit = model_correlation(tidy, models=models)
    fig, ax = plt.subplots(figsize=(6, 4.8))
    for group, sub in pts.groupby("group", sort=False):
        color, marker = _GROUP_STYLE.get(group, _GROUP_STYLE["other"])
        ax.scatter(100 * sub["x"], 100 * sub["y"], c=color, marker=marker, s=70, label=group, zorder=3)
    for _, r in pts.iterrows():
        label = paper_name(r["model"]) + (f" ({100 * r['residual']:+.1f})" if np.isfinite(r["residual"]) else "")
        ax.annotate(label, (100 * r["x"], 100 * r["y"]), xytext=(4, 3), textcoords="offset points", fontsize=7)
    if fit is not None:
        xs = np.linspace(pts["x"].min(), pts["x"].max(), 50)
        ax.plot(100 * xs, 100 * (fit.slope * xs + fit.intercept), "k--", lw=1)
    ax.set_xlabel("classification AUC (%), mean over datasets")
    ax.set_ylabel("pointing game accuracy (%), mean over datasets")
    n_sets = sorted(set(pts["n_datasets"])) if len(pts) else [0]
    ax.set_title(f"{title}\n{_fit_text(fit)}, {len(pts)} models; residual (points) in brackets; "
                 f"datasets per model: {', '.join(map(str, n_sets))}", fontsize=9)
    ax.legend(fontsize=7, title="pretraining", title_fontsize=7, loc="best")
    return fig


def calibration(tidy: pd.DataFrame, *, fixed: str, best: str, title: str) -> plt.Figure:
    """Fig. 4 as the paper: per model the Dice at the fixed τ and at the best τ (percent), ΔDice labelled.

    Averaging rule (stated on the figure): a model's Dice is its dataset-level value (mean over classes, the best τ
    chosen per class) averaged over the datasets where both are defined (:func:`~xbench.outputs.analysis.calibration_by_model`).
    """
    order = _model_order(list(dict.fromkeys(tidy["model"])))
    per_model = calibration_by_model(tidy, fixed, best, models=order)
    names = [paper_name(m) for m in per_model["model"]]
    long = pd.DataFrame({"model": names * 2, "threshold": [fixed] * len(names) + [best] * len(names),
                         "dice": 100 * np.r_[per_model["fixed"], per_model["best"]]})
    fig, ax = plt.subplots(figsize=(max(5, 0.9 * len(per_model) + 2), 4))
    sns.barplot(data=long, x="model", y="dice", hue="threshold", order=names, ax=ax)
    for i, (_, row) in enumerate(per_model.iterrows()):
        ax.text(i, 100 * max(row["fixed"], row["best"]) + 0.5, f"Δ{100 * row['delta']:+.1f}", ha="center", fontsize=8)
    ax.set_ylabel("Dice (%)")
    ax.set_xlabel("")
    ax.set_title(f"{title}\nper model: mean over datasets of the mean over classes (best τ chosen per class); "
                 "Δ = best − fixed, points", fontsize=9)
    ax.tick_params(axis="x", rotation=30)
    return fig


def discrepancy(tidy: pd.DataFrame, *, dataset: str, title: str) -> plt.Figure:
    """Per-class AUC vs pointing on one dataset, one panel per model, classes labelled (§4.0.4)."""
    pts = metric_pairs(tidy[tidy["dataset"] == dataset], "auc", "pointing", level="per-class")
    models = sorted(pts["model"].unique())
    cols = min(3, len(models)) or 1
    rows = int(np.ceil(len(models) / cols)) or 1
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.6 * rows), squeeze=False, sharex=True, sharey=True)
    for ax, model in zip(axes.flat, models):
        sub = pts[pts["model"] == model]
        ax.scatter(sub["x"], sub["y"], s=25)
        placed = sub.dropna(subset=["x", "y"]).assign(kx=lambda d: d["x"].round(2), ky=lambda d: d["y"].round(2))
        for (kx, ky), same in placed.groupby(["kx", "ky"]):  # classes on one spot share one label
            ax.annotate("\n".join(same["finding"].astype(str)), (same["x"].iloc[0], same["y"].iloc[0]), fontsize=6,
                        xytext=(3, -2), textcoords="offset points", va="top")
        ax.set_title(model, fontsize=9)
        ax.set_xlabel("AUC")
        ax.set_ylabel("pointing")
    for ax in list(axes.flat)[len(models):]:
        ax.axis("off")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def lesion_size(pairs: pd.DataFrame, *, title: str, metrics: Sequence[str] = ("pointing", "dice@best")) -> plt.Figure:
    """Grounding by ground-truth area bin, one line per model, one panel per metric."""
    bins = size_bins(pairs)
    fig, axes = plt.subplots(1, len(metrics), figsize=(5.2 * len(metrics), 3.8), squeeze=False)
    for ax, metric in zip(axes.flat, metrics):
        sns.pointplot(data=bins, x="size_bin", y=metric, hue="model", ax=ax, markersize=4)
        ax.set_xlabel("GT area (fraction of image)")
        ax.set_ylabel(metric)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def threshold_curves(curves: pd.DataFrame, *, title: str) -> plt.Figure:
    """Mean Dice vs τ per model (mean over the classes of every dataset), the best τ marked."""
    mean = curves.groupby(["model", "tau"])["mean_dice"].mean().reset_index()
    fig, ax = plt.subplots(figsize=(6, 4))
    sns.lineplot(data=mean, x="tau", y="mean_dice", hue="model", ax=ax)
    for model, sub in mean.groupby("model"):
        best = sub.loc[sub["mean_dice"].idxmax()]
        ax.plot(best["tau"], best["mean_dice"], "k.", ms=6)
    ax.axvline(0.5, color="grey", lw=0.8, ls=":")
    ax.set_xlabel("threshold τ on the min–max normalised map")
    ax.set_ylabel("mean Dice")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7)
    return fig


def overlay_grid(images: Sequence[np.ndarray], maps: Sequence[Sequence[np.ndarray]], masks: Sequence[np.ndarray],
                 *, row_labels: Sequence[str], col_labels: Sequence[str], title: str,
                 stats: Sequence[Sequence[str]] | None = None, cmap: str = MAP_CMAP) -> plt.Figure:
    """Fig. 2: rows = cases, columns = models; each panel the image, the map (``cmap``, α 0.5), the GT outline in
    blue, the map's argmax (cyan ×) and ``stats[i][j]`` (e.g. hit and Dice) in the corner; one colour bar.

    ``maps[i][j]`` is model j's map for case i, already at the image size and min–max normalised.
    """
    n_rows, n_cols = len(images), len(col_labels) + 1
    fig, axes = plt.subplots(n_rows, n_cols, figsize=(2.1 * n_cols + 0.6, 2.2 * n_rows), squeeze=False)
    shown = None
    for i, image in enumerate(images):
        panels = [None, *maps[i]]
        for j, heat in enumerate(panels):
            ax = axes[i, j]
            ax.imshow(image, cmap="gray", vmin=0, vmax=1)
            if heat is not None:
                shown = ax.imshow(heat, cmap=cmap, alpha=0.5, vmin=0, vmax=1)
                if np.isfinite(heat).any() and np.ptp(heat) > 0:
                    y, x = np.unravel_index(int(np.argmax(heat)), heat.shape)
                    ax.plot(x, y, "x", color="cyan", ms=7, mew=1.8)
            if masks[i].any():
                ax.contour(masks[i], levels=[0.5], colors="blue", linewidths=1.0)
            if stats is not None and j > 0 and stats[i][j - 1]:
                ax.text(0.02, 0.02, stats[i][j - 1], transform=ax.transAxes, fontsize=6, color="white", va="bottom",
                        bbox={"facecolor": "black", "alpha": 0.6, "pad": 1, "lw": 0})
            ax.set_xticks([])
            ax.set_yticks([])
            if i == 0:
                ax.set_title("image + GT (blue)" if j == 0 else col_labels[j - 1], fontsize=8)
            if j == 0:
                ax.set_ylabel(row_labels[i], fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    if shown is not None:
        fig.colorbar(shown, ax=axes.ravel().tolist(), fraction=0.02, pad=0.01, label="normalised saliency")
    return fig


def data_label(datasets: Sequence[str]) -> str:
    """Title fragment naming the datasets; the phantom is flagged as synthetic."""
    names = [f"{d} (synthetic phantom, not patient data)" if d == "phantom" else d for d in datasets]
    return "Data: " + ", ".join(names)


def _choose_cases(dataset: "BaseDataset", evaluated: set[str], findings: Sequence[str], case_ids: Sequence | None,
                  seed: int) -> list[tuple[int, str]]:
    """(row, finding) per requested finding: the given case id, else one drawn with ``seed`` among the evaluated
    positive cases that have a region of that finding."""
    labels = dataset.labels()
    ids = dataset.cases["case_id"].astype(str).tolist()
    rng = np.random.default_rng(seed)
    chosen = []
    for k, finding in enumerate(findings):
        c = dataset.findings.index(finding)
        wanted = None if case_ids is None or k >= len(case_ids) else case_ids[k]
        if wanted is not None:
            if str(wanted) not in ids:
                raise ValueError(f"case {wanted!r} is not in {dataset.name}/{dataset.split}")
            if str(wanted) not in evaluated:
                raise ValueError(f"case {wanted!r} of {dataset.name} was not evaluated (skipped at inference)")
            chosen.append((ids.index(str(wanted)), finding))
            continue
        rows = [int(r) for r in np.flatnonzero(labels[:, c] == 1) if ids[r] in evaluated]
        rows = [r for r in rows if dataset[r].regions.get(finding) and (r, finding) not in chosen]
        if rows:
            chosen.append((int(rng.choice(rows)), finding))
    return chosen


def visual_comparison(output_dir: str | Path, dataset: "BaseDataset", models: Sequence[str], *,
                      findings: Sequence[str] | None = None, case_ids: Sequence[str | None] | None = None,
                      n_cases: int | None = None, seed: int = 0, grid: tuple[int, int] = (224, 224),
                      threshold: float = 0.5, taus: Mapping[tuple[str, str], float] | None = None) -> plt.Figure:
    """Fig. 2 from a run's store: one row per finding (default the paper's Pneumothorax, Consolidation, Lung Opacity
    — those present, else the dataset's first ``n_cases`` findings), one column per model.

    ``case_ids[k]`` picks the case of ``findings[k]`` (None or missing: one drawn with ``seed`` among the positive
    cases with a region). Only **evaluated** cases are drawn: cases every model has in the store (a case skipped
    at inference is never shown). Each map is placed in the model's input window (cropping models,
    :mod:`xbench.models.windows`), upsampled bilinearly to the image and min–max normalised for display; the panel states
    the pointing hit and the Dice computed as the metrics do (at ``grid``; at the class's best τ from ``taus``
    ``{(model, finding): τ}`` when given, else at ``threshold``).
    """
    from ..store.results import ResultStore

    store = ResultStore(output_dir)
    preds = {m: store.read(dataset.name, m) for m in models}
    position = {m: {c: i for i, c in enumerate(p.case_ids.tolist())} for m, p in preds.items()}
    evaluated = set.intersection(*(set(p) for p in position.values())) if position else set()
    findings = _fig2_findings(dataset, findings, n_cases)
    chosen = _choose_cases(dataset, evaluated, findings, case_ids, seed)
    images, maps, masks, row_labels, stats = [], [], [], [], []
    for r, finding in chosen:
        sample = dataset[r]
        image = sample.image()
        c = dataset.findings.index(finding)
        gt = sample.mask(finding, grid)[None]
        row, text = [], []
        for m in models:
            shown, said = _panel(preds[m], position[m][sample.case_id], c, image, gt, grid, threshold,
                                 (taus or {}).get((m, finding)))
            row.append(shown)
            text.append(said)
        images.append(image)
        maps.append(row)
        masks.append(sample.mask(finding))
        row_labels.append(f"{finding}\n{sample.case_id}")
        stats.append(text)
    col_labels = [paper_name(m) + ("\n(random-init weights)" if preds[m].meta["model_info"].get("weights") == "random-init"
                                   else "") for m in models]
    return overlay_grid(images, maps, masks, row_labels=row_labels, col_labels=col_labels, stats=stats,
                        title=f"Saliency maps vs radiologist regions — {data_label([dataset.name])}")


def _fig2_findings(dataset: "BaseDataset", findings: Sequence[str] | None, n_cases: int | None) -> list[str]:
    """Fig. 2's rows: ``findings`` (at most ``n_cases``), default the paper's that ``dataset`` has, else its first
    ``n_cases`` (3); a finding that is not a class of the dataset is a ``ValueError``."""
    if findings is None:
        present = [f for f in FIG2_FINDINGS if f in dataset.findings]
        findings = present or list(dataset.findings)[: (n_cases or 3)]
    elif n_cases is not None:
        findings = list(findings)[:n_cases]
    unknown = [f for f in findings if f not in dataset.findings]
    if unknown:
        raise ValueError(f"findings {unknown} are not classes of {dataset.name}: {dataset.findings}")
    return list(findings)


def _panel(pred: Any, i: int, c: int, image: np.ndarray, gt: np.ndarray, grid: tuple[int, int], threshold: float,
           tau: float | None) -> tuple[np.ndarray, str]:
    """One panel of Fig. 2: stored map ``pred.maps[i, c]`` placed in its input window on the image, upsampled and
    min–max normalised for display, and its caption (pointing hit, Dice at ``tau`` when given, else at
    ``threshold``, scored at ``grid`` as the metrics do)."""
    from ..metrics import THRESHOLDS, grounding_scores, normalize_maps, upsample_maps
    from ..models.windows import is_whole_image, place_maps

    native, window, size = pred.maps[i, c].astype(np.float32)[None], pred.windows[i], pred.sizes[i]
    cropped = np.isfinite(window).all() and not is_whole_image(window[None], np.array([image.shape]))[0]
    shown = place_maps(native, window[None], np.array([image.shape]), image.shape) if cropped else \
        upsample_maps(native, image.shape)
    scored = place_maps(native, window[None], size[None], grid) if cropped else native
    g = grounding_scores(scored, gt, grid=grid, threshold=threshold)
    if tau is not None and np.isfinite(tau):
        dice, at = g.dice_curves[0][int(np.argmin(np.abs(np.asarray(THRESHOLDS) - tau)))], f"τ*={tau:.2f}"
    else:
        dice, at = g.dice[0], f"τ={threshold:g}"
    return normalize_maps(shown)[0], f"hit {'✓' if g.pointing[0] == 1 else '✗'}  Dice {dice:.2f} ({at})"


def difference_heatmap(comparison: pd.DataFrame, *, title: str) -> plt.Figure:
    """Heat map of ``run − paper`` (points) per published cell (:func:`xbench.outputs.analysis.compare_with_paper`): one panel
    per paper table, rows = models, columns = the table's cells; a diverging colormap centred on 0, grey = no value."""
    tables = sorted(comparison.loc[comparison["diff"].notna(), "table"].unique())
    if not tables:  # nothing of this run matches a published cell
        fig, ax = plt.subplots(figsize=(8, 1.5))
        ax.axis("off")
        ax.text(0.5, 0.5, "No run value matches a published cell (no dataset or model of the paper in this run).",
                ha="center", va="center", fontsize=9)
        fig.suptitle(title, fontsize=10)
        return fig
    fig, axes = plt.subplots(len(tables), 1, figsize=(16, 1.9 * len(tables) + 0.8), squeeze=False)
    lim = float(np.nanmax(np.abs(comparison["diff"]))) if comparison["diff"].notna().any() else 1.0
    for ax, t in zip(axes[:, 0], tables):
        sub = comparison[comparison["table"] == t].copy()
        sub["cell"] = (sub["dataset"].map(lambda d: DATASETS.get(d, d)) + " " + sub["metric"].map(display)) if t == 1 \
            else sub["paper_class"]
        grid = sub.pivot_table(index="model", columns="cell", values="diff", aggfunc="first", dropna=False)
        grid = grid.reindex(index=[m for m in MODELS if m in grid.index],
                            columns=list(dict.fromkeys(sub["cell"])))
        grid.index = [paper_name(m) for m in grid.index]
        sns.heatmap(grid, ax=ax, cmap="RdBu_r", center=0, vmin=-lim, vmax=lim, cbar_kws={"label": "run − paper (points)"},
                    linewidths=0.3, linecolor="white", mask=grid.isna())
        ax.set_facecolor("#cccccc")
        ax.set_title(f"Table {t}", fontsize=9, loc="left")
        ax.set_xlabel("")
        ax.tick_params(axis="x", labelsize=6, rotation=90)
        ax.tick_params(axis="y", labelsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig
