"""Prior baselines: saliency maps and scores that ignore the image content (``map_source: prior``).

They bound what a grounding metric rewards without looking at the image: a model that does not beat them is not
localising anything. Tables list them as baselines (``describe()["weights"] == "none"``).

* :class:`CenterPrior` — an isotropic Gaussian centred on the image, the same for every image and class.
  Score: constant 0.5 (``score_rule: constant``).
* :class:`AnatomicalPrior` — per prompt name, the mean radiologist region of the positive cases of a **fit split
  disjoint from the evaluation split** (:func:`fit_anatomical_prior`), the same for every image.
  Score: constant, the class's positive rate on the fit split (``score_rule: constant``).
* :class:`RandomPrior` — uniform random maps and scores (``score_rule: random``), drawn from a generator seeded
  per (case, prompt) from ``(seed, case id, prompt name)`` (:meth:`RandomPrior.predict_cases`, which the runner
  calls), so results do not depend on the pixels, batch composition, batch order, sharding, the machine or the
  other prompts of the call.

Conventions
-----------
Grid coordinates: cell ``(i, j)`` covers rows ``[i, i+1)·H/h`` and columns ``[j, j+1)·W/w`` of the image; the map is
at the native grid (``grid`` in the config, default 14×14) and the metrics upsample it like any model's map.
``preprocess`` keeps only a ``(3, S, S)`` thumbnail (``S = input_size``, default 32): the grey image area-averaged
(``torch.nn.functional.interpolate(mode="area")``, on CPU, float32) and replicated to 3 channels. The center and
anatomical priors read nothing from it but the batch size; so does the random prior when it is given case ids
(without them, :meth:`RandomPrior.predict` falls back to hashing the thumbnail's bytes).
Maps and scores are float32 on CPU.
"""
from __future__ import annotations

import hashlib
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from xbench.core.errors import FormatError, UnknownNameError, XBenchWarning
from xbench.core.safe_arrays import read_npz
from xbench.models._common import check_inputs
from xbench.models.base import Adapter, Prediction, require_file
from xbench.spec.registry import model_config


def prior_file() -> str:
    """The file :meth:`AnatomicalPrior.save` writes and :meth:`AnatomicalPrior.load` reads: the ``weights.maps.path``
    of ``anatomical_prior.yaml`` (also ``PRIOR_FILE``, read on first use)."""
    return str(model_config("anatomical_prior")["weights"]["maps"]["path"])


def __getattr__(name: str) -> str:
    if name == "PRIOR_FILE":
        return prior_file()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def thumbnail(image: np.ndarray, size: int) -> torch.Tensor:
    """Grey image ``(H, W)`` → ``(3, size, size)`` float32 area-averaged thumbnail (the priors' ``preprocess``)."""
    image = np.asarray(image, dtype=np.float32)
    if image.ndim != 2:
        raise ValueError(f"prior preprocess expects a grey (H, W) image, got shape {image.shape}")
    small = F.interpolate(torch.from_numpy(np.ascontiguousarray(image))[None, None], size=(size, size), mode="area")
    return small[0].expand(3, size, size).contiguous()


class _Prior(Adapter):
    """Shared plumbing of the prior baselines: thumbnail preprocessing, input checks, metadata."""

    def __init__(self, grid: Sequence[int] | None = None, input_size: int | None = None,
                 config: Mapping[str, Any] | None = None, device: str | torch.device = "cpu"):
        config = dict(config or {})  # explicit arguments are config entries (default: the YAML's)
        if grid is not None:
            if len(grid) != 2 or min(grid) < 1:
                raise ValueError(f"{type(self).__name__}: grid must be two positive ints, got {grid!r}")
            config["grid"] = [int(grid[0]), int(grid[1])]
        if input_size is not None:
            config["input_size"] = int(input_size)
        super().__init__(config, device)
        self.weights_label = "none"

    def preprocess(self, image: np.ndarray) -> torch.Tensor:
        """XBench image → ``(3, input_size, input_size)`` thumbnail (module docstring)."""
        return thumbnail(image, self.input_size)

    def _batch(self, pixels: torch.Tensor, prompts: Sequence[str]) -> tuple[int, list[str]]:
        check_inputs(pixels, prompts, None)
        return int(pixels.shape[0]), list(prompts)


# -- center -----------------------------------------------------------------------------
def center_gaussian(grid: Sequence[int], sigma: float) -> np.ndarray:
    """Isotropic Gaussian ``exp(-((x - ½)² + (y - ½)²) / (2σ²))`` at the cell centres of ``grid``, float32.

    ``x = (j + ½) / w`` and ``y = (i + ½) / h`` are cell centres in image-relative units, so ``sigma`` is a fraction
    of the side (of each side for a non-square image). On an odd grid the single centre cell is 1; on an even grid the
    four central cells tie for the maximum.
    """
    h, w = grid
    y = (np.arange(h) + 0.5) / h - 0.5
    x = (np.arange(w) + 0.5) / w - 0.5
    return np.exp(-(y[:, None] ** 2 + x[None, :] ** 2) / (2.0 * sigma ** 2)).astype(np.float32)


class CenterPrior(_Prior):
    """Centre Gaussian map (``sigma`` a fraction of the side, default 0.25) and constant score 0.5."""

    config_name = "center_prior"
    reads_pixels = False  # only the batch size (module docstring): the decode-once feed decodes nothing for it

    def __init__(self, sigma: float = 0.25, grid: Sequence[int] | None = None, input_size: int | None = None,
                 config: Mapping[str, Any] | None = None, device: str | torch.device = "cpu"):
        super().__init__(grid, input_size, config, device)
        if not sigma > 0:
            raise ValueError(f"CenterPrior: sigma must be > 0 (a fraction of the image side), got {sigma!r}")
        self.sigma = float(sigma)
        self.map = torch.from_numpy(center_gaussian(self.grid, self.sigma))

    @classmethod
    def _load(cls, files: Mapping[str, Path], config: Mapping[str, Any], device: str | torch.device) -> CenterPrior:
        """From the config's ``grid``, ``input_size`` and ``params.sigma`` (no files)."""
        return cls(config["params"].get("sigma", 0.25), config["grid"], config["input_size"], config, device)

    def predict(self, pixels: torch.Tensor, prompts: Sequence[str]) -> Prediction:
        """Scores ``(B, C)`` all 0.5; maps ``(B, C, h, w)`` all equal to :func:`center_gaussian`."""
        b, prompts = self._batch(pixels, prompts)
        return Prediction(scores=torch.full((b, len(prompts)), 0.5),
                          maps=self.map.expand(b, len(prompts), *self.grid).clone())


# -- anatomical -------------------------------------------------------------------------
def _checked_findings(dataset: Any, findings: Sequence[str] | None) -> list[str]:
    chosen = list(dataset.findings if findings is None else findings)
    for finding in chosen:
        if finding not in dataset.findings:
            raise UnknownNameError(f"finding of dataset {dataset.name!r}", finding, dataset.findings)
    return chosen


def fit_anatomical_prior(dataset: Any, grid: tuple[int, int] | None = None,
                         findings: Sequence[str] | None = None) -> dict[str, np.ndarray]:
    """Mean radiologist region per prompt name over the positive cases of ``dataset`` (no image is read).

    Parameters
    ----------
    dataset : xbench.datasets.base.BaseDataset
        The fit split; it must be disjoint from the split the prior is evaluated on.
    grid : (int, int), optional
        Grid of the maps (default: the ``grid`` of ``anatomical_prior.yaml``); each case contributes
        ``sample.mask(finding, grid)`` (bool).
    findings : list of str, optional
        Dataset findings to fit (default: all). Keys of the result are their prompt names
        (``dataset.prompts[finding]``); findings sharing a prompt name are pooled.

    Returns
    -------
    dict[str, np.ndarray]
        Prompt → float32 ``grid`` map in [0, 1]: per cell, the fraction of contributing cases whose mask covers it.

    Notes
    -----
    Cases contribute when the finding's label is 1.0 and at least one region is drawn for it; a positive case
    without regions carries no location and is skipped, with one :class:`~xbench.core.errors.XBenchWarning` giving
    the count. A prompt with no contributing case gets no map (the adapter then refuses it).
    """
    chosen = _checked_findings(dataset, findings)
    grid = tuple(grid if grid is not None else model_config(AnatomicalPrior.config_name)["grid"])
    labels = dataset.labels()
    columns = [dataset.findings.index(f) for f in chosen]
    sums: dict[str, np.ndarray] = {}
    counts: dict[str, int] = {}
    skipped = 0
    for row in np.flatnonzero((labels[:, columns] == 1.0).any(axis=1)):
        sample = dataset[int(row)]
        for finding, col in zip(chosen, columns):
            if labels[row, col] != 1.0:
                continue
            if not sample.regions.get(finding):
                skipped += 1
                continue
            prompt = dataset.prompts[finding]
            mask = np.asarray(sample.mask(finding, grid), dtype=np.float64)
            sums[prompt] = sums.get(prompt, 0.0) + mask
            counts[prompt] = counts.get(prompt, 0) + 1
    if skipped:
        warnings.warn(f"fit_anatomical_prior: {skipped} positive (case, finding) pairs of {dataset.name!r} have no "
                      "drawn region and were skipped", XBenchWarning, stacklevel=2)
    return {prompt: (total / counts[prompt]).astype(np.float32) for prompt, total in sums.items()}


def positive_rates(dataset: Any, findings: Sequence[str] | None = None) -> dict[str, float]:
    """Per prompt name, positives / labelled cases of ``dataset`` (NaN labels are not counted; NaN if none labelled)."""
    chosen = _checked_findings(dataset, findings)
    labels = dataset.labels()
    positives: dict[str, int] = {}
    labelled: dict[str, int] = {}
    for finding in chosen:
        column = labels[:, dataset.findings.index(finding)]
        prompt = dataset.prompts[finding]
        positives[prompt] = positives.get(prompt, 0) + int(np.sum(column == 1.0))
        labelled[prompt] = labelled.get(prompt, 0) + int(np.sum(~np.isnan(column)))
    return {p: positives[p] / labelled[p] if labelled[p] else float("nan") for p in positives}


class AnatomicalPrior(_Prior):
    """Fitted mean-region map per prompt, constant score = the prompt's positive rate on the fit split.

    Parameters
    ----------
    maps : dict[str, np.ndarray]
        Prompt → 2-D map (all the same shape, which becomes :attr:`grid`), as from :func:`fit_anatomical_prior`.
    rates : dict[str, float]
        Prompt → positive rate on the fit split (every prompt of ``maps`` needs one).
    """

    config_name = "anatomical_prior"
    reads_pixels = False  # only the batch size (module docstring)

    def __init__(self, maps: Mapping[str, np.ndarray], rates: Mapping[str, float],
                 input_size: int | None = None, config: Mapping[str, Any] | None = None,
                 device: str | torch.device = "cpu"):
        if not maps:
            raise ValueError("AnatomicalPrior: no fitted map (the fit split has no positive case with a region)")
        shapes = {np.shape(m) for m in maps.values()}
        if len(shapes) != 1 or len(next(iter(shapes))) != 2:
            raise ValueError(f"AnatomicalPrior: maps must be 2-D and share one shape, got shapes {sorted(shapes)}")
        missing = sorted(set(maps) - set(rates))
        if missing:
            raise ValueError(f"AnatomicalPrior: no positive rate for prompts {missing}")
        super().__init__(next(iter(shapes)), input_size, config, device)
        self.maps = {p: torch.as_tensor(np.asarray(m, dtype=np.float32)) for p, m in maps.items()}
        self.rates = {p: float(rates[p]) for p in maps}

    @classmethod
    def fit(cls, dataset: Any, grid: tuple[int, int] | None = None, findings: Sequence[str] | None = None,
            input_size: int | None = None) -> AnatomicalPrior:
        """Fit maps (:func:`fit_anatomical_prior`) and rates (:func:`positive_rates`) on ``dataset``."""
        return cls(fit_anatomical_prior(dataset, grid, findings), positive_rates(dataset, findings), input_size)

    def save(self, folder: str | Path) -> Path:
        """Write ``folder/anatomical_prior.npz``: ``prompts`` (P,), ``maps`` (P, h, w), ``positive_rate`` (P,)."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        prompts = sorted(self.maps)
        path = folder / prior_file()
        np.savez(path, prompts=np.array(prompts, dtype=str),
                 maps=np.stack([self.maps[p].numpy() for p in prompts]),
                 positive_rate=np.array([self.rates[p] for p in prompts], dtype=np.float64))
        return path

    @classmethod
    def load(cls, folder: str | Path, config: Mapping[str, Any] | None = None,
             device: str | torch.device = "cpu") -> AnatomicalPrior:
        """Read ``folder/anatomical_prior.npz`` written by :meth:`save` (no pickle)."""
        path = require_file(Path(folder), prior_file(), "anatomical prior maps (fit_anatomical_prior, then save)", None)
        return cls.read(path, config, device)

    @classmethod
    def read(cls, path: Path, config: Mapping[str, Any] | None = None,
             device: str | torch.device = "cpu") -> AnatomicalPrior:
        """Read an ``.npz`` written by :meth:`save` (no pickle); shapes are checked."""
        data = read_npz(path)  # plain dtypes, bounded decompression, CRC-checked (no pickle)
        absent = [k for k in ("prompts", "maps", "positive_rate") if k not in data]
        if absent:
            raise FormatError(path, f"missing arrays {absent}; found {sorted(data)}")
        prompts, maps, rates = data["prompts"].tolist(), data["maps"], data["positive_rate"]
        if maps.ndim != 3 or len(maps) != len(prompts) or rates.shape != (len(prompts),):
            raise FormatError(path, f"inconsistent shapes: prompts {len(prompts)}, maps {maps.shape}, "
                                    f"positive_rate {rates.shape}")
        input_size = dict(config or {}).get("input_size")
        return cls(dict(zip(prompts, maps)), dict(zip(prompts, rates.tolist())), input_size, config, device)

    @classmethod
    def _load(cls, files: Mapping[str, Path], config: Mapping[str, Any], device: str | torch.device) -> AnatomicalPrior:
        """The fitted prior of ``files["maps"]`` (the grid is the fitted one, read from the file)."""
        return cls.read(files["maps"], config, device)

    def predict(self, pixels: torch.Tensor, prompts: Sequence[str]) -> Prediction:
        """Scores ``(B, C)`` = positive rates, maps ``(B, C, h, w)`` = fitted maps.

        A prompt without a fitted map raises :class:`~xbench.core.errors.UnknownNameError` listing the fitted ones.
        """
        b, prompts = self._batch(pixels, prompts)
        for prompt in prompts:
            if prompt not in self.maps:
                raise UnknownNameError("prompt of the fitted anatomical prior", prompt, self.maps)
        scores = torch.tensor([self.rates[p] for p in prompts], dtype=torch.float32).expand(b, -1).clone()
        maps = torch.stack([self.maps[p] for p in prompts]).expand(b, -1, -1, -1).clone()
        return Prediction(scores=scores, maps=maps)


# -- random -----------------------------------------------------------------------------
def _digest(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=16).digest(), "little")


class RandomPrior(_Prior):
    """Uniform random maps and scores in [0, 1), reproducible per (seed, case, prompt).

    The generator of one case and prompt is ``np.random.default_rng(SeedSequence([seed, H(case id), H(prompt)]))``,
    ``H`` = 128-bit BLAKE2b of the UTF-8 string; it draws the score first, then the ``(h, w)`` map. The pixels are
    not read, so a changed grey level, decoder or machine redraws nothing. :meth:`predict` (no case ids) keeps the
    earlier key ``SeedSequence([H(thumbnail float32 bytes), H(prompt), seed])``.
    """

    config_name = "random_prior"

    def __init__(self, seed: int = 0, grid: Sequence[int] | None = None, input_size: int | None = None,
                 config: Mapping[str, Any] | None = None, device: str | torch.device = "cpu"):
        super().__init__(grid, input_size, config, device)
        if int(seed) < 0:
            raise ValueError(f"RandomPrior: seed must be >= 0, got {seed!r}")
        self.seed = int(seed)

    @classmethod
    def _load(cls, files: Mapping[str, Path], config: Mapping[str, Any], device: str | torch.device) -> RandomPrior:
        """From the config's ``grid``, ``input_size`` and ``params.seed`` (no files)."""
        return cls(config["params"].get("seed", 0), config["grid"], config["input_size"], config, device)

    def _draw(self, keys: Sequence[int], prompts: Sequence[str], by_case: bool) -> Prediction:
        scores = np.empty((len(keys), len(prompts)), dtype=np.float32)
        maps = np.empty((len(keys), len(prompts), *self.grid), dtype=np.float32)
        prompt_keys = [_digest(p.encode("utf-8")) for p in prompts]
        for i, key in enumerate(keys):
            for c, prompt_key in enumerate(prompt_keys):
                entropy = [self.seed, key, prompt_key] if by_case else [key, prompt_key, self.seed]
                rng = np.random.default_rng(np.random.SeedSequence(entropy))
                scores[i, c] = rng.random()
                maps[i, c] = rng.random(self.grid)
        return Prediction(scores=torch.from_numpy(scores), maps=torch.from_numpy(maps))

    def predict_cases(self, pixels: torch.Tensor, prompts: Sequence[str], case_ids: Sequence[str]) -> Prediction:
        """Scores ``(B, C)`` and maps ``(B, C, h, w)`` drawn per (seed, case id, prompt); the pixels are not read."""
        b, prompts = self._batch(pixels, prompts)
        if len(case_ids) != b:
            raise ValueError(f"RandomPrior: {len(case_ids)} case ids for a batch of {b} images")
        return self._draw([_digest(str(c).encode("utf-8")) for c in case_ids], prompts, by_case=True)

    def predict(self, pixels: torch.Tensor, prompts: Sequence[str]) -> Prediction:
        """Like :meth:`predict_cases`, each image keyed by its thumbnail's bytes (no case ids known)."""
        b, prompts = self._batch(pixels, prompts)
        images = pixels.detach().to("cpu", torch.float32).contiguous()
        return self._draw([_digest(image.numpy().tobytes()) for image in images], prompts, by_case=False)
