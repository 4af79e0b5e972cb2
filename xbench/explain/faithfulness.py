"""Faithfulness and randomisation sanity of any adapter's maps over a dataset: one row per (case, finding).

:func:`faithfulness_table` runs the metrics of :mod:`xbench.metrics.faithfulness` with the adapter's own class score
as ``score_fn`` (its probability, as stored), the adapter's maps (native or an explainer's) as saliency, and the
adapter's preprocessing of a black image as the deletion / insertion baseline. Rows are the (case, finding) pairs
whose label is positive (a model has evidence to remove only where the finding is present).

Randomisation (``randomised=True``): the same model built by XBench with seeded random weights
(``create_model(name, random_init=True)``; every layer at once, "independent" in Adebayo et al.'s terms), with the
same explainer; a model without learned weights (the prior baselines) is its own randomisation, so its maps are
unchanged by construction (similarity 1: it fails the sanity check, as it should).
"""
from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch

from ..datasets import BaseDataset
from ..core.errors import XBenchError, XBenchWarning
from ..metrics.faithfulness import blurred, deletion_auc, insertion_auc, randomisation_similarity, road_gap
from ..models import Adapter, create_model
from ..models.base import weight_entries
from .base import ExplainedAdapter
from .methods import black_baseline

#: columns of :func:`faithfulness_table` (metric columns: lower ``deletion_auc`` / ``randomisation_similarity``
#: is better, higher ``insertion_auc`` / ``road_gap``)
COLUMNS = ("model", "dataset", "case_id", "finding", "score", "deletion_auc", "insertion_auc", "road_gap",
           "randomisation_similarity")


def randomised(adapter: Adapter, seed: int = 0) -> Adapter:
    """The same model with XBench's seeded random weights (and the same explainer); the adapter itself when the
    model has no weights to randomise (module docstring)."""
    inner = adapter.inner if isinstance(adapter, ExplainedAdapter) else adapter
    if not weight_entries(inner.config):
        return adapter
    params = {k: v for k, v in (inner.config.get("params") or {}).items() if k not in ("random_init", "seed")}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", XBenchWarning)
        rand = create_model(inner.name, device=inner.device, **params, random_init=True, seed=seed)
    return ExplainedAdapter(rand, adapter.explainer) if isinstance(adapter, ExplainedAdapter) else rand


def score_function(adapter: Adapter, prompts: Sequence[str], index: int):
    """``score_fn`` for the metrics: model inputs ``(M, 3, S, S)`` → the adapter's score of class ``index``."""
    model = adapter.inner if isinstance(adapter, ExplainedAdapter) else adapter

    def score(x: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return model.predict(torch.from_numpy(np.ascontiguousarray(x)).to(model.device), prompts).scores[:, index].numpy()

    return score


def faithfulness_table(adapter: Adapter, dataset: BaseDataset, *, cases: int | None = None, steps: int = 10,
                       road: bool = True, road_fractions: Sequence[float] = (0.1, 0.3, 0.5, 0.7, 0.9),
                       randomise: bool = True, seed: int = 0, batch_size: int = 32,
                       insertion_start: str = "baseline") -> pd.DataFrame:
    """Per (positive case, finding): score, deletion / insertion AUC (``steps`` steps, black-image baseline),
    ROAD gap (at ``road_fractions``, noise 0.01; NaN unless ``road``) and randomisation similarity (Spearman;
    NaN unless ``randomise``), for the first ``cases`` cases of ``dataset`` (all when None).

    ``insertion_start``: what insertion starts from — ``"baseline"`` (XBench's convention: the preprocessed black
    image, the one deletion ends at) or ``"blur"`` (RISE's, Petsiuk et al. BMVC 2018: each preprocessed image
    blurred by :func:`~xbench.metrics.faithfulness.blurred`, Gaussian kernel 11 × 11, σ = 5). Deletion always ends
    at the black baseline (RISE's zeros of the normalised input: ``deletion_auc(..., baseline=0.0)``). Both count
    ``⌊f·P⌋`` changed pixels after a fraction ``f`` (:mod:`xbench.metrics.faithfulness`)."""
    if insertion_start not in ("baseline", "blur"):
        raise XBenchError(f"insertion_start must be 'baseline' or 'blur'; got {insertion_start!r}")
    n = len(dataset) if cases is None else min(cases, len(dataset))
    prompts = [dataset.prompts[f] for f in dataset.findings]
    labels = dataset.labels()[:n]
    pixels = torch.stack([adapter.preprocess(dataset[i].image()) for i in range(n)])
    preds = [adapter.predict(pixels[i:i + batch_size], prompts) for i in range(0, n, batch_size)]
    scores = torch.cat([p.scores for p in preds]).numpy()
    maps = torch.cat([p.maps for p in preds]).float().numpy()
    if randomise:
        rand = randomised(adapter, seed)
        rand_maps = torch.cat([rand.predict(pixels[i:i + batch_size], prompts).maps
                               for i in range(0, n, batch_size)]).float().numpy()
    base = black_baseline(adapter.inner if isinstance(adapter, ExplainedAdapter) else adapter).numpy()
    images = pixels.numpy()
    rows = []
    for c, finding in enumerate(dataset.findings):
        idx = np.where(labels[:, c] == 1)[0]
        if not len(idx):
            continue
        fn = score_function(adapter, prompts, c)
        kw = dict(steps=steps, baseline=base, batch_size=batch_size)
        col = {"deletion_auc": deletion_auc(fn, images[idx], maps[idx, c], **kw),
               "insertion_auc": insertion_auc(fn, images[idx], maps[idx, c], **{
                   **kw, "baseline": blurred(images[idx]) if insertion_start == "blur" else base}),
               "road_gap": road_gap(fn, images[idx], maps[idx, c], fractions=road_fractions, seed=seed,
                                         batch_size=batch_size) if road
               else np.full(len(idx), np.nan),
               "randomisation_similarity": randomisation_similarity(maps[idx, c], rand_maps[idx, c]) if randomise
               else np.full(len(idx), np.nan)}
        for j, i in enumerate(idx):
            rows.append({"model": adapter.name, "dataset": dataset.name, "case_id": dataset[int(i)].case_id,
                         "finding": finding, "score": float(scores[i, c]), **{k: float(v[j]) for k, v in col.items()}})
    return pd.DataFrame(rows, columns=list(COLUMNS))
