"""Paper-style figures (seaborn/matplotlib) from the tidy tables; each returns a Figure.

:func:`save_figure` writes PNG (150 dpi) and PDF. Titles name the dataset(s) the
numbers come from, so phantom results are never mistaken for real ones.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from .analysis import calibration_gap, fit_line, metric_pairs, size_bins  # noqa: E402
from .atomic import atomic_write  # noqa: E402

if TYPE_CHECKING:
    from .datasets import BaseDataset


def save_figure(fig: plt.Figure, stem: str | Path) -> list[Path]:
    """Write ``<stem>.png`` and ``<stem>.pdf``; returns the paths."""
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = [stem.with_suffix(".png"), stem.with_suffix(".pdf")]
    atomic_write(paths[0], lambda tmp: fig.savefig(tmp, dpi=150, bbox_inches="tight"))
    atomic_write(paths[1], lambda tmp: fig.savefig(tmp, bbox_inches="tight"))
    return paths


def auc_vs_pointing(tidy: pd.DataFrame, *, level: str, title: str) -> plt.Figure:
    """Fig. 3: recognition AUC (x) vs pointing accuracy (y), one point per model × dataset, fitted line, R², Spearman CI."""
    pts = metric_pairs(tidy, "auc", "pointing", level=level).dropna(subset=["x", "y"])
    fit = fit_line(pts["x"].to_numpy(), pts["y"].to_numpy())
    fig, ax = plt.subplots(figsize=(6, 4.5))
    sns.scatterplot(data=pts, x="x", y="y", hue="model", style="dataset", s=70, ax=ax)
    if np.isfinite(fit.slope):
        xs = np.linspace(pts["x"].min(), pts["x"].max(), 50)
        ax.plot(xs, fit.slope * xs + fit.intercept, "k--", lw=1)
    ax.set_xlabel("classification AUC")
    ax.set_ylabel("pointing game accuracy")
    ax.set_title(f"{title}\nR² = {fit.r2:.2f}, Spearman ρ = {fit.spearman:.2f} "
                 f"[{fit.spearman_low:.2f}, {fit.spearman_high:.2f}], n = {fit.n}", fontsize=10)
    ax.legend(fontsize=7, bbox_to_anchor=(1.02, 1), loc="upper left")
    return fig


def calibration(tidy: pd.DataFrame, *, fixed: str, best: str, title: str) -> plt.Figure:
    """Fig. 4: mean Dice at the fixed τ vs at the best τ per model (mean over classes), ΔDice annotated."""
    gap = calibration_gap(tidy, fixed, best)
    per_model = gap.groupby("model")[["fixed", "best"]].mean().sort_values("best", ascending=False)
    long = per_model.reset_index().melt(id_vars="model", var_name="threshold", value_name="dice")
    long["threshold"] = long["threshold"].map({"fixed": fixed, "best": best})
    fig, ax = plt.subplots(figsize=(max(5, 0.9 * len(per_model) + 2), 4))
    sns.barplot(data=long, x="model", y="dice", hue="threshold", ax=ax)
    for i, (_, row) in enumerate(per_model.iterrows()):
        ax.text(i, max(row["fixed"], row["best"]) + 0.01, f"Δ{row['best'] - row['fixed']:+.2f}", ha="center", fontsize=8)
    ax.set_ylabel("mean Dice over classes")
    ax.set_xlabel("")
    ax.set_title(title, fontsize=10)
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
                 *, row_labels: Sequence[str], col_labels: Sequence[str], title: str) -> plt.Figure:
    """Fig. 2: rows = cases, columns = models; each panel the image, the map (jet, α 0.45) and the GT outline.

    ``maps[i][j]`` is model j's map for case i, already upsampled to the image size and min–max normalised.
    """
    n_rows, n_cols = len(images), len(col_labels) + 1
    fig, axes = plt.subplots(n_rows, n_cols, figsize=(2.1 * n_cols, 2.2 * n_rows), squeeze=False)
    for i, image in enumerate(images):
        panels = [None, *maps[i]]
        for j, heat in enumerate(panels):
            ax = axes[i, j]
            ax.imshow(image, cmap="gray", vmin=0, vmax=1)
            if heat is not None:
                ax.imshow(heat, cmap="jet", alpha=0.45, vmin=0, vmax=1)
            if masks[i].any():
                ax.contour(masks[i], levels=[0.5], colors="lime", linewidths=0.9)
            ax.set_xticks([])
            ax.set_yticks([])
            if i == 0:
                ax.set_title("image + GT" if j == 0 else col_labels[j - 1], fontsize=8)
            if j == 0:
                ax.set_ylabel(row_labels[i], fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def data_label(datasets: Sequence[str]) -> str:
    """Title fragment naming the datasets; the phantom is flagged as synthetic."""
    names = [f"{d} (synthetic phantom, not patient data)" if d == "phantom" else d for d in datasets]
    return "Data: " + ", ".join(names)


def visual_comparison(output_dir: str | Path, dataset: "BaseDataset", models: Sequence[str], *, n_cases: int = 4,
                      seed: int = 0, findings: Sequence[str] | None = None) -> plt.Figure:
    """Fig. 2 from a run's store: ``n_cases`` positive (case, finding) pairs drawn with ``seed``, one per finding in turn.

    Each model's stored native-grid map is upsampled bilinearly to the image size (placed in its
    input window for cropping models, :mod:`xbench.windows`) and min–max normalised (the metric conventions), then overlaid on the image with the GT region outlined.
    """
    from .metrics import normalize_maps, upsample_maps
    from .results import ResultStore
    from .windows import is_whole_image, place_maps

    store = ResultStore(output_dir)
    preds = {m: store.read(dataset.name, m) for m in models}
    position = {m: {c: i for i, c in enumerate(p.case_ids.tolist())} for m, p in preds.items()}
    labels = dataset.labels()
    rng = np.random.default_rng(seed)
    wanted = list(findings) if findings else [f for f in dataset.findings]
    chosen: list[tuple[int, str]] = []
    for k in range(n_cases * 4):
        if len(chosen) == n_cases:
            break
        finding = wanted[k % len(wanted)]
        c = dataset.findings.index(finding)
        rows = [r for r in np.flatnonzero(labels[:, c] == 1) if (r, finding) not in chosen]
        rows = [r for r in rows if dataset[int(r)].regions.get(finding)]
        if rows:
            chosen.append((int(rng.choice(rows)), finding))
    images, maps, masks, row_labels = [], [], [], []
    for r, finding in chosen:
        sample = dataset[r]
        image = sample.image()
        c = dataset.findings.index(finding)
        row = []
        for m in models:
            i = position[m].get(sample.case_id)
            if i is None:
                row.append(np.zeros(image.shape, np.float32))
                continue
            native, window = preds[m].maps[i, c].astype(np.float32)[None], preds[m].windows[i]
            if np.isfinite(window).all() and not is_whole_image(window[None], np.array([image.shape]))[0]:
                placed = place_maps(native, window[None], np.array([image.shape]), image.shape)
            else:
                placed = upsample_maps(native, image.shape)
            row.append(normalize_maps(placed)[0])
        images.append(image)
        maps.append(row)
        masks.append(sample.mask(finding))
        row_labels.append(f"{sample.case_id}\n{finding}")
    col_labels = [f"{m}\n(random-init weights)" if preds[m].meta["model_info"].get("weights") == "random-init" else m
                  for m in models]
    return overlay_grid(images, maps, masks, row_labels=row_labels, col_labels=col_labels,
                        title=f"Saliency maps vs radiologist regions — {data_label([dataset.name])}")
