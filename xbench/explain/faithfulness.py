"""Faithfulness and randomisation sanity of any adapter's maps over a dataset: one row per (case, finding).

:func:`faithfulness_table` runs the metrics of :mod:`xbench.metrics.faithfulness` with the adapter's own class score
as ``score_fn`` (its probability, as stored), the adapter's maps (native or an explainer's) as saliency, and the
adapter's preprocessing of a black image as the deletion / insertion baseline. Rows are the (case, finding) pairs
whose label is positive (a model has evidence to remove only where the finding is present).

Randomisation (``randomised=True``): the same model built by XBench with seeded random weights
(``create_model(name, random_init=True)``; every layer at once, "independent" in Adebayo et al.'s terms), with the
same explainer; a model without learned weights (the prior baselines) is its own randomisation, so its maps are
unchanged by construction (similarity 1: it fails the sanity check, as it should).

On the model's device: the score functions are device scores (:class:`xbench.metrics.faithfulness.DeviceScore`), so
the perturbed inputs are made there; deletion and insertion take the (case, finding) pairs of every finding in one
stream of batches (each input scored for its own finding), ROAD one finding at a time (its imputation is a sparse
solve on the CPU, seeded per finding). Passes per case: ``docs/explainers.md``.
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


class _Scores:
    """A device score (:class:`xbench.metrics.faithfulness.DeviceScore`): inputs on the model's device → the
    adapter's score of class ``classes[row]`` for each input's image ``row``."""

    def __init__(self, adapter: Adapter, prompts: Sequence[str], classes: np.ndarray):
        self.model = adapter.inner if isinstance(adapter, ExplainedAdapter) else adapter
        self.prompts, self.device = list(prompts), torch.device(self.model.device)
        self.classes = torch.as_tensor(np.asarray(classes, dtype=np.int64))

    def __call__(self, x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            scores = self.model.predict(x, self.prompts).scores
        return scores[torch.arange(len(x), device=scores.device), self.classes.to(scores.device)[rows.to(scores.device)]]


def score_function(adapter: Adapter, prompts: Sequence[str], index: int) -> _Scores:
    """``score_fn`` for the metrics: model inputs ``(M, 3, S, S)`` on the model's device → the adapter's score of
    class ``index`` (a device score: the metrics make their perturbed inputs on that device; called with a NumPy
    batch alone it returns NumPy scores, as a plain ``score_fn``)."""
    return _ClassScore(adapter, prompts, index)


class _ClassScore(_Scores):
    """One class for every image (:func:`score_function`)."""

    def __init__(self, adapter: Adapter, prompts: Sequence[str], index: int):
        super().__init__(adapter, prompts, np.zeros(0, np.int64))
        self.index = int(index)

    def __call__(self, x: torch.Tensor | np.ndarray, rows: torch.Tensor | None = None) -> torch.Tensor | np.ndarray:
        """Scores of class ``index``; NumPy inputs (a plain ``score_fn``) give NumPy scores."""
        tensor = torch.from_numpy(np.ascontiguousarray(x)).to(self.device) if isinstance(x, np.ndarray) else x
        with torch.no_grad():
            scores = self.model.predict(tensor, self.prompts).scores[:, self.index]
        return scores.float().cpu().numpy() if isinstance(x, np.ndarray) else scores


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
    # every positive (case, finding) pair, finding by finding (the table's row order)
    pairs = [(int(i), c) for c in range(len(dataset.findings)) for i in np.where(labels[:, c] == 1)[0]]
    if not pairs:
        return pd.DataFrame([], columns=list(COLUMNS))
    case, cls = (np.array(v, dtype=np.int64) for v in zip(*pairs))
    fn = _Scores(adapter, prompts, cls)  # deletion / insertion: all findings in one stream of batches
    kw = dict(steps=steps, baseline=base, batch_size=batch_size)
    col = {"deletion_auc": deletion_auc(fn, images[case], maps[case, cls], **kw),
           "insertion_auc": insertion_auc(fn, images[case], maps[case, cls], **{
               **kw, "baseline": blurred(images[case]) if insertion_start == "blur" else base}),
           "road_gap": np.full(len(pairs), np.nan),
           "randomisation_similarity": randomisation_similarity(maps[case, cls], rand_maps[case, cls]) if randomise
           else np.full(len(pairs), np.nan)}
    if road:  # one finding at a time: its imputations seeded as one call
        for c in np.unique(cls):
            at = np.where(cls == c)[0]
            col["road_gap"][at] = road_gap(score_function(adapter, prompts, int(c)), images[case[at]],
                                           maps[case[at], c], fractions=road_fractions, seed=seed,
                                           batch_size=batch_size)
    rows = [{"model": adapter.name, "dataset": dataset.name, "case_id": dataset[int(i)].case_id,
             "finding": dataset.findings[c], "score": float(scores[i, c]), **{k: float(v[j]) for k, v in col.items()}}
            for j, (i, c) in enumerate(zip(case, cls))]
    return pd.DataFrame(rows, columns=list(COLUMNS))
