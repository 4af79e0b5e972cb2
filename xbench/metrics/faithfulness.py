"""Faithfulness and sanity metrics of saliency maps: does the map show what the model uses?

Plausibility (:mod:`~xbench.metrics.grounding`) asks whether a map falls on the annotated region; these functions
ask whether it is *faithful* to the model. They take a ``score_fn`` — a callable from a batch of model inputs
``(M, C, H, W)`` (float32 NumPy) to one class score per input ``(M,)`` — the inputs ``images (N, C, H, W)`` and the
maps ``saliency (N, h, w)`` at any grid.

On the model's device: a ``score_fn`` with a ``device`` attribute (a :class:`torch.device`) is a *device score*
(:class:`DeviceScore`): it is called as ``score_fn(x, rows)`` with ``x`` a float32 tensor on that device and
``rows`` the index of the image each input comes from (so one call can score different classes per row) and
returns a tensor ``(M,)``. The perturbed inputs are then made there by torch operations, ``batch_size`` at a time
(a rank mask per input, no per-image loop, no host copy of the images); the values are the same as the NumPy path's.

Conventions (shared by every function here)

* A map at another grid than the image is resized to ``(H, W)`` bilinearly (``align_corners=False``); pixels are
  ranked by descending map value, ties in row-major order (a stable sort). A pixel is perturbed in every channel.
* Perturbation counts: after a fraction ``f`` of the ``P = H·W`` pixels, ``⌊f·P⌋`` pixels are changed (truncation,
  not rounding: f = 0.15 of P = 16,384 changes 2,457 pixels; ``f·P`` is first rounded to 9 decimals so that float
  noise such as 0.1·30 = 3.0000000000000004 does not count).
* ``baseline``: what removed pixels become — a number, a per-channel vector ``(C,)``, an image ``(C, H, W)`` or one
  image per input ``(N, C, H, W)`` (XBench passes the model's preprocessing of a black image,
  :func:`xbench.explain.methods.black_baseline`).

Conventions that differ from the cited papers:

* Deletion / insertion (credited to RISE, Petsiuk et al., BMVC 2018): XBench deletes to, and inserts from, the same
  ``baseline`` (the preprocessed black image). RISE deletes to zeros of the *normalised* input and inserts starting
  from a **blurred** copy of the image. The two conventions can rank maps differently; for numbers comparable with
  RISE's, pass ``baseline=blurred(images)`` (:func:`blurred`: RISE's Gaussian kernel, size 11, σ = 5) to
  :func:`insertion_auc` and ``baseline=0.0`` to :func:`deletion_auc`.
* ROAD (Rong et al., ICML 2022): :func:`road_gap` is mean(LeRF) − mean(MoRF) over the fractions, which is **2 ×**
  pytorch-grad-cam's ``ROADCombined`` (that averages ``(LeRF − MoRF) / 2``), and uses class scores, not the arg-max
  agreement of the ROAD paper's accuracy curves.
* Areas are trapezoids over the fraction axis [0, 1], so an AUC lies in the score's range.

Direction: ``deletion_auc`` lower is better (removing the most salient pixels first should drop the score fast);
``insertion_auc``, ``road_gap`` higher is better; ``randomisation_similarity`` lower is better (a sane map changes
when the model's weights are randomised; Adebayo et al., NeurIPS 2018).

Differences from Quantus 0.6 (tests check the shared parts against it on the same inputs):
``PixelFlipping`` has no point for the unperturbed input and integrates with ``dx = 1`` per step (``np.trapz``,
which NumPy 2.4 no longer has); here the curve starts at the unperturbed input and the area is over the fraction in
[0, 1]. Quantus ``ROAD`` reports per fraction whether the arg-max class is unchanged (single-label); here the class
score itself (multi-label models). Quantus ``MPRT`` randomises layers of a torch model in place (cascading); XBench
builds the whole model with seeded random weights (independent randomisation of all layers at once).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

import numpy as np
import torch
import torch.nn.functional as F
from scipy.sparse import coo_matrix
from scipy.sparse.linalg import spsolve
from scipy.stats import pearsonr, spearmanr

@runtime_checkable
class DeviceScore(Protocol):
    """A score function on a torch device (module docstring): ``(x (M, C, H, W) on device, rows (M,)) -> (M,)``."""

    device: torch.device

    def __call__(self, x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor: ...


#: ``(M, C, H, W)`` float32 NumPy inputs → ``(M,)`` scores, or a :class:`DeviceScore`
ScoreFn = Callable[[np.ndarray], np.ndarray] | DeviceScore


def _on_device(score_fn: object) -> bool:
    return isinstance(getattr(score_fn, "device", None), torch.device)

#: neighbour offsets and weights of ROAD's noisy linear imputation (Rong et al., ICML 2022)
_ROAD_NEIGHBOURS = (((1, 1), 1 / 12), ((0, 1), 1 / 6), ((-1, 1), 1 / 12), ((1, -1), 1 / 12), ((0, -1), 1 / 6),
                    ((-1, -1), 1 / 12), ((1, 0), 1 / 6), ((-1, 0), 1 / 6))


def _check(images: np.ndarray, saliency: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    images = np.asarray(images, dtype=np.float32)
    saliency = np.asarray(saliency, dtype=np.float64)
    if images.ndim != 4:
        raise ValueError(f"images must be (N, C, H, W), got shape {images.shape}")
    if saliency.ndim != 3 or len(saliency) != len(images):
        raise ValueError(f"saliency must be (N, h, w) with N = {len(images)}, got shape {saliency.shape}")
    if not np.isfinite(saliency).all():
        raise ValueError("saliency has non-finite values")
    return images, saliency


def pixel_order(saliency: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Flat pixel indices ``(N, H·W)`` of each map resized to ``size``, most salient first (ties row-major).

    >>> pixel_order(np.array([[[0.0, 2.0], [1.0, 2.0]]]), (2, 2)).tolist()
    [[1, 3, 2, 0]]
    """
    s = torch.as_tensor(np.asarray(saliency, dtype=np.float64))
    if tuple(s.shape[1:]) != tuple(size):
        s = F.interpolate(s[:, None], size=size, mode="bilinear", align_corners=False)[:, 0]
    return np.argsort(-s.reshape(len(s), -1).numpy(), axis=1, kind="stable")


def _counts(fractions: np.ndarray, n_pixels: int) -> np.ndarray:
    """Pixels changed after each fraction: ``⌊f·P⌋`` of ``f·P`` rounded to 9 decimals (module docstring)."""
    return np.array([int(np.floor(round(f * n_pixels, 9))) for f in fractions])


def blurred(images: np.ndarray, size: int = 11, sigma: float = 5.0) -> np.ndarray:
    """Each image ``(N, C, H, W)`` blurred per channel by RISE's Gaussian kernel (``size`` × ``size``, ``sigma``;
    Petsiuk et al.'s ``gkern(11, 5)``, zero padding as their ``conv2d``): the start image of RISE's insertion.

    Examples
    --------
    >>> img = np.zeros((1, 1, 11, 11), np.float32); img[0, 0, 5, 5] = 1.0
    >>> b = blurred(img)
    >>> round(float(b.sum()), 5), bool(b[0, 0, 5, 5] == b.max())
    (1.0, True)
    """
    images = np.asarray(images, dtype=np.float32)
    half = size // 2
    axis = np.arange(size) - half
    g = np.exp(-(axis[:, None] ** 2 + axis[None, :] ** 2) / (2 * sigma**2))
    kernel = torch.from_numpy((g / g.sum()).astype(np.float32))[None, None]
    n, c, h, w = images.shape
    x = torch.from_numpy(images).reshape(n * c, 1, h, w)
    return F.conv2d(x, kernel, padding=half).reshape(n, c, h, w).numpy()


def _baseline_image(baseline: float | np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    b = np.asarray(baseline, dtype=np.float32)
    if b.ndim == 1:
        b = b[:, None, None]
    return np.broadcast_to(b, shape).astype(np.float32)


def _score_all(score_fn: ScoreFn, batch: np.ndarray, batch_size: int,
               rows: np.ndarray | None = None) -> np.ndarray:
    """Scores of ``batch`` (float32 NumPy), ``batch_size`` inputs per call; ``rows``: each input's image (a device
    score's second argument)."""
    device = _on_device(score_fn)
    rows = np.arange(len(batch)) if rows is None else rows
    out = []
    for i in range(0, len(batch), batch_size):
        if device:
            x = torch.from_numpy(np.ascontiguousarray(batch[i:i + batch_size])).to(score_fn.device)  # type: ignore[union-attr]
            out.append(_as_scores(score_fn(x, torch.from_numpy(rows[i:i + batch_size]).to(score_fn.device))))  # type: ignore[call-arg, union-attr]
        else:
            out.append(np.asarray(score_fn(batch[i:i + batch_size]), dtype=np.float64).reshape(-1))  # type: ignore[call-arg]
    scores = np.concatenate(out)
    if len(scores) != len(batch):
        raise ValueError(f"score_fn returned {len(scores)} scores for {len(batch)} inputs")
    return scores


def _as_scores(scores: torch.Tensor | np.ndarray) -> np.ndarray:
    if isinstance(scores, torch.Tensor):
        scores = scores.detach().double().cpu().numpy()
    return np.asarray(scores, dtype=np.float64).reshape(-1)


def _curve_scores(score_fn: ScoreFn, images: np.ndarray, order: np.ndarray, counts: np.ndarray,
                  mode: str, baseline: float | np.ndarray, batch_size: int) -> np.ndarray:
    """Scores ``(N, len(counts))`` of each image with its ``counts[k]`` first pixels of ``order`` replaced
    (deletion: by the baseline; insertion: the baseline with those pixels of the image). The inputs are made
    ``batch_size`` at a time by torch operations on the score's device (the CPU for a NumPy ``score_fn``): a pixel's
    rank in its image's order below the count selects the replacement."""
    n, c, h, w = images.shape
    device = score_fn.device if _on_device(score_fn) else torch.device("cpu")  # type: ignore[union-attr]
    imgs = torch.from_numpy(images).to(device).reshape(n, c, h * w)
    if np.ndim(baseline) == 4:
        base = torch.from_numpy(np.ascontiguousarray(baseline, np.float32)).to(device).reshape(n, c, h * w)
    else:
        base = torch.from_numpy(_baseline_image(baseline, (c, h, w))).to(device).reshape(1, c, h * w).expand(n, -1, -1)
    src, dst = (imgs, base) if mode == "deletion" else (base, imgs)
    order_t = torch.from_numpy(order).to(device)
    rank = torch.empty_like(order_t).scatter_(1, order_t, torch.arange(h * w, device=device).expand(n, -1))
    count_t = torch.from_numpy(counts).to(device)
    k = len(counts)
    out = []
    for start in range(0, n * k, batch_size):
        flat = torch.arange(start, min(n * k, start + batch_size), device=device)
        image, step = flat // k, flat % k
        chosen = (rank[image] < count_t[step][:, None])[:, None, :]  # (M, 1, P)
        x = torch.where(chosen, dst[image], src[image]).reshape(-1, c, h, w)
        if _on_device(score_fn):
            scores = _as_scores(score_fn(x, image))  # type: ignore[call-arg]
        else:
            scores = np.asarray(score_fn(x.numpy()), dtype=np.float64).reshape(-1)  # type: ignore[call-arg]
        if len(scores) != len(x):
            raise ValueError(f"score_fn returned {len(scores)} scores for {len(x)} inputs")
        out.append(scores)
    return np.concatenate(out).reshape(n, k)


def perturbation_curve(score_fn: ScoreFn, images: np.ndarray, saliency: np.ndarray, *, mode: str = "deletion",
                       steps: int = 20, baseline: float | np.ndarray = 0.0, batch_size: int = 64
                       ) -> tuple[np.ndarray, np.ndarray]:
    """Scores while the most salient pixels are removed (``"deletion"``) or revealed (``"insertion"``).

    Parameters
    ----------
    score_fn : callable
        ``(M, C, H, W)`` float32 inputs → ``(M,)`` class scores, or a :class:`DeviceScore` (module docstring: the
        perturbed inputs are then made on its device).
    images : ndarray of shape (N, C, H, W)
        Model inputs (after the model's preprocessing).
    saliency : ndarray of shape (N, h, w)
        One map per image (resized to ``(H, W)``; module docstring).
    mode : {"deletion", "insertion"}, default="deletion"
        Deletion starts from the image and replaces pixels by ``baseline``; insertion starts from ``baseline`` and
        puts the image's pixels back, most salient first (Petsiuk et al., RISE, BMVC 2018).
    steps : int, default=20
        Number of equal steps; the curve has ``steps + 1`` points, fraction 0 (no pixel changed) to 1 (all).
    baseline : float or ndarray, default=0.0
        Value of removed pixels (module docstring); ``(N, C, H, W)``: one per image (RISE's insertion:
        :func:`blurred` of the images).
    batch_size : int, default=64
        Inputs per ``score_fn`` call.

    Returns
    -------
    fractions : ndarray of shape (steps + 1,)
    scores : ndarray of shape (N, steps + 1)

    Examples
    --------
    >>> images = np.zeros((1, 1, 2, 2), np.float32); images[0, 0, 0, 0] = 1.0
    >>> brightness = lambda x: x.reshape(len(x), -1).sum(1)
    >>> f, s = perturbation_curve(brightness, images, np.array([[[1.0, 0.0], [0.0, 0.0]]]), steps=4)
    >>> f.tolist(), s.tolist()
    ([0.0, 0.25, 0.5, 0.75, 1.0], [[1.0, 0.0, 0.0, 0.0, 0.0]])
    """
    if mode not in ("deletion", "insertion"):
        raise ValueError(f"mode must be 'deletion' or 'insertion', got {mode!r}")
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    images, saliency = _check(images, saliency)
    n, c, h, w = images.shape
    order = pixel_order(saliency, (h, w))
    fractions = np.linspace(0.0, 1.0, steps + 1)
    counts = _counts(fractions, h * w)
    if np.ndim(baseline) == 4 and np.shape(baseline) != images.shape:
        raise ValueError(f"a per-image baseline must have the images' shape {images.shape}; got {np.shape(baseline)}")
    scores = _curve_scores(score_fn, images, order, counts, mode, baseline, batch_size)
    return fractions, scores


def deletion_auc(score_fn: ScoreFn, images: np.ndarray, saliency: np.ndarray, *, steps: int = 20,
                 baseline: float | np.ndarray = 0.0, batch_size: int = 64) -> np.ndarray:
    """Area under the deletion curve per image, ``(N,)``; lower is more faithful (see :func:`perturbation_curve`).

    Examples
    --------
    >>> images = np.zeros((1, 1, 2, 2), np.float32); images[0, 0, 0, 0] = 1.0
    >>> brightness = lambda x: x.reshape(len(x), -1).sum(1)
    >>> good, bad = np.array([[[1.0, 0], [0, 0]]]), np.array([[[0.0, 1], [1, 1]]])
    >>> float(deletion_auc(brightness, images, good, steps=4)[0]), float(deletion_auc(brightness, images, bad, steps=4)[0])
    (0.125, 0.875)
    """
    f, s = perturbation_curve(score_fn, images, saliency, mode="deletion", steps=steps, baseline=baseline,
                              batch_size=batch_size)
    return np.trapezoid(s, f, axis=1)


def insertion_auc(score_fn: ScoreFn, images: np.ndarray, saliency: np.ndarray, *, steps: int = 20,
                  baseline: float | np.ndarray = 0.0, batch_size: int = 64) -> np.ndarray:
    """Area under the insertion curve per image, ``(N,)``; higher is more faithful (see :func:`perturbation_curve`).

    Examples
    --------
    >>> images = np.zeros((1, 1, 2, 2), np.float32); images[0, 0, 0, 0] = 1.0
    >>> brightness = lambda x: x.reshape(len(x), -1).sum(1)
    >>> float(insertion_auc(brightness, images, np.array([[[1.0, 0], [0, 0]]]), steps=4)[0])
    0.875
    """
    f, s = perturbation_curve(score_fn, images, saliency, mode="insertion", steps=steps, baseline=baseline,
                              batch_size=batch_size)
    return np.trapezoid(s, f, axis=1)


def noisy_linear_imputation(image: np.ndarray, pixels: np.ndarray, *, noise: float = 0.01,
                            rng: np.random.Generator | None = None) -> np.ndarray:
    """ROAD's imputation (Rong et al., ICML 2022): removed pixels become the solution of a sparse linear system
    in which each equals the weighted mean of its 8 neighbours (weights 1/6 edge, 1/12 corner), plus Gaussian noise
    of standard deviation ``noise``. Same system as Quantus' ``noisy_linear_imputation`` (tests compare at noise 0).

    Parameters
    ----------
    image : ndarray of shape (C, H, W)
    pixels : ndarray of int
        Flat indices (into ``H·W``) of the pixels to impute.
    noise : float, default=0.01
    rng : numpy Generator, optional
        Source of the noise (default: ``np.random.default_rng(0)``).

    Examples
    --------
    >>> img = np.array([[[1.0, 1.0, 1.0], [1.0, 9.0, 1.0], [1.0, 1.0, 1.0]]])
    >>> noisy_linear_imputation(img, np.array([4]), noise=0.0)[0, 1, 1]
    np.float64(1.0)
    """
    image = np.asarray(image, dtype=np.float64)
    c, h, w = image.shape
    pixels = np.unique(np.asarray(pixels, dtype=np.int64))
    flat = image.reshape(c, -1).copy()
    if not len(pixels):
        return flat.reshape(c, h, w)
    unknown = np.zeros(h * w, bool)
    unknown[pixels] = True
    var = np.full(h * w, -1)
    var[pixels] = np.arange(len(pixels))
    rows, cols, vals = [], [], []
    rhs = np.zeros((len(pixels), c))
    diag = np.zeros(len(pixels))
    y, x = pixels // w, pixels % w
    for (dy, dx), weight in _ROAD_NEIGHBOURS:
        ny, nx = y + dy, x + dx
        ok = (ny >= 0) & (nx >= 0) & (ny < h) & (nx < w)
        diag[ok] += weight
        idx = np.where(ok)[0]
        nb = ny[ok] * w + nx[ok]
        known = ~unknown[nb]
        rhs[idx[known]] -= weight * flat[:, nb[known]].T
        rows += idx[~known].tolist()
        cols += var[nb[~known]].tolist()
        vals += [weight] * int((~known).sum())
    rows += list(range(len(pixels)))
    cols += list(range(len(pixels)))
    vals += (-diag).tolist()
    a = coo_matrix((vals, (rows, cols)), shape=(len(pixels), len(pixels))).tocsc()
    solution = np.asarray(spsolve(a, rhs)).reshape(len(pixels), c).T
    generator = rng if rng is not None else np.random.default_rng(0)
    flat[:, pixels] = solution + noise * generator.standard_normal(solution.shape)
    return flat.reshape(c, h, w)


def road_curve(score_fn: ScoreFn, images: np.ndarray, saliency: np.ndarray, *,
               fractions: Sequence[float] = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9), order: str = "morf",
               noise: float = 0.01, seed: int = 0, batch_size: int = 64) -> np.ndarray:
    """Scores after imputing (ROAD, :func:`noisy_linear_imputation`) the most (``"morf"``) or least (``"lerf"``)
    salient fraction of pixels, ``(N, len(fractions))``. Imputation from the neighbours avoids the
    out-of-distribution inputs that a constant baseline makes (Rong et al., ICML 2022).

    Examples
    --------
    >>> img = np.ones((1, 1, 4, 4), np.float32); img[0, 0, 1, 1] = 9.0
    >>> peak = lambda x: x.reshape(len(x), -1).max(1)
    >>> sal = np.zeros((1, 4, 4)); sal[0, 1, 1] = 1.0
    >>> road_curve(peak, img, sal, fractions=[1 / 16], noise=0.0).round(3).tolist()
    [[1.0]]
    """
    if order not in ("morf", "lerf"):
        raise ValueError(f"order must be 'morf' or 'lerf', got {order!r}")
    images, saliency = _check(images, saliency)
    n, c, h, w = images.shape
    ranked = pixel_order(saliency, (h, w))
    if order == "lerf":
        ranked = ranked[:, ::-1]
    counts = _counts(np.asarray(fractions, dtype=np.float64), h * w)
    rng = np.random.default_rng(seed)
    batch = np.stack([noisy_linear_imputation(images[i], ranked[i, :m], noise=noise, rng=rng)
                      for i in range(n) for m in counts]).astype(np.float32)
    rows = np.repeat(np.arange(n), len(counts))
    return _score_all(score_fn, batch, batch_size, rows).reshape(n, len(counts))


def road_gap(score_fn: ScoreFn, images: np.ndarray, saliency: np.ndarray, *,
             fractions: Sequence[float] = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9), noise: float = 0.01,
             seed: int = 0, batch_size: int = 64) -> np.ndarray:
    """Mean LeRF score minus mean MoRF score over ``fractions`` per image, ``(N,)``; higher is more faithful
    (removing the least salient pixels should hurt less than removing the most salient). 0 for a map unrelated
    to the score. Twice pytorch-grad-cam's ``ROADCombined`` (which averages ``(LeRF − MoRF) / 2``).

    Examples
    --------
    >>> img = np.ones((1, 1, 4, 4), np.float32); img[0, 0, 1, 1] = 9.0
    >>> peak = lambda x: x.reshape(len(x), -1).max(1)
    >>> sal = np.zeros((1, 4, 4)); sal[0, 1, 1] = 1.0
    >>> road_gap(peak, img, sal, fractions=[1 / 16], noise=0.0).round(3).tolist()
    [8.0]
    """
    kw = dict(fractions=fractions, noise=noise, seed=seed, batch_size=batch_size)
    return (road_curve(score_fn, images, saliency, order="lerf", **kw).mean(1)
            - road_curve(score_fn, images, saliency, order="morf", **kw).mean(1))


def randomisation_similarity(maps: np.ndarray, random_maps: np.ndarray, *, measure: str = "spearman") -> np.ndarray:
    """Similarity of each map with the map of the same input and class from the randomised model, ``(N,)``.

    Model-parameter randomisation test (Adebayo et al., "Sanity checks for saliency maps", NeurIPS 2018): a map
    that does not change when the weights are randomised does not depend on what the model learned; lower is
    better. ``measure``: ``"spearman"`` (rank correlation of the flattened maps, the paper's main measure, as
    Quantus' ``correlation_spearman``) or ``"pearson"``. Constant maps have no correlation: 1.0 when both maps are
    constant and equal (nothing changed), else NaN.

    Examples
    --------
    >>> a = np.array([[[0.0, 1.0], [2.0, 3.0]]])
    >>> randomisation_similarity(a, a).tolist(), randomisation_similarity(a, -a).tolist()
    ([1.0], [-1.0])
    """
    maps = np.asarray(maps, dtype=np.float64).reshape(len(maps), -1)
    random_maps = np.asarray(random_maps, dtype=np.float64).reshape(len(random_maps), -1)
    if maps.shape != random_maps.shape:
        raise ValueError(f"maps {maps.shape} and random_maps {random_maps.shape} must have the same shape")
    if measure not in ("spearman", "pearson"):
        raise ValueError(f"measure must be 'spearman' or 'pearson', got {measure!r}")
    corr = spearmanr if measure == "spearman" else pearsonr
    out = np.empty(len(maps))
    for i, (a, b) in enumerate(zip(maps, random_maps)):
        if np.ptp(a) == 0 or np.ptp(b) == 0:
            out[i] = 1.0 if np.array_equal(a, b) else np.nan
        else:
            out[i] = float(corr(a, b)[0])
    return out
