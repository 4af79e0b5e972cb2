"""Procedural phantom chest radiographs with exactly known finding regions.

The phantom is XBench's embedded default dataset: it needs no download, is
generated in seconds from a seed, and exercises the real on-disk path (a
ChestX-Det style JSON plus PNGs read back by :class:`~xbench.datasets.chestx_det.ChestXDet`).

Image model
-----------
A square grey radiograph of ``size`` pixels (default 256), built as an additive
attenuation image (X-ray densities add up): soft-tissue body outline, two
air-filled lung fields (ellipses whose lower edges are the diaphragm domes, the
abdomen below stays dense), mediastinum and spine, a heart silhouette low and to
the image right (patient's left), posterior ribs, vascular lung markings, then the
findings. Then a per-case exposure (gain, offset, gamma), a Gaussian blur
(sigma 0.8 px at 256, scaled with ``size``) and Gaussian noise; quantised to 8-bit
(``round(255 * v)``) or 16-bit (``round(65535 * v)``) PNG. Bright = dense.

Findings (class name in the JSON / manifest, regime of the paper)
-----------------------------------------------------------------
========================  =================  =================================================
name                      regime             what is drawn (region = exact polygon)
========================  =================  =================================================
Cardiomegaly              large, defined     heart ellipse enlarged x1.35-1.6 wide, x1.15-1.3 tall
Pleural Effusion          large, defined     dense basal lung cap under a meniscus (1 or 2 sides)
Consolidation             medium             lobulated dense blob (radius 5-8 % of size) in a lung
Nodule                    small              dense disc, diameter 5-15 px at 256 (1 or 2)
Pneumothorax              thin               lucent apical/lateral rim 4-10 px, no markings, pleural line
Interstitial Pattern      diffuse            reticular texture over the lower 60 % of 1 or 2 lungs
========================  =================  =================================================

Each finding occurs independently with probability ``prevalence`` (default
0.18), so about 30 % of cases are negatives and many are multi-label. Regions are
polygons with integer vertices; the pixels of a finding are drawn through the
mask that PIL ``ImageDraw.polygon(points, fill=1, outline=1)`` rasterises from
those very vertices (the convention of :func:`xbench.datasets.regions.rasterize`),
so the ground truth is exact at original size. Boxes are the xyxy bounds of that
mask with exclusive maxima. A finding with several regions (bilateral effusion,
two nodules) has one ``syms``/``boxes``/``polygons`` entry per region, as in
ChestX-Det.

Files and determinism
---------------------
One split lives in one folder: ``annotations.json`` (list of ``{file_name, syms,
boxes, polygons}``), ``images/<split>_<index:05d>.png`` and ``phantom.json`` (the
generator parameters). Case ``i`` of split ``s`` uses
``np.random.default_rng([seed, SPLIT_STREAMS[s], i])``: splits are disjoint
streams, a case does not depend on how many cases are generated, and the same
parameters give byte-identical files (for a fixed Pillow / zlib build).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw
from scipy.ndimage import gaussian_filter, zoom

from ..core.errors import UnknownNameError, XBenchError
from .chestx_det import ChestXDet

GENERATOR_VERSION = 1  #: bump when the drawing changes (it is part of the cache hash)
FINDINGS = ("Cardiomegaly", "Pleural Effusion", "Consolidation", "Nodule", "Pneumothorax", "Interstitial Pattern")
SPLIT_STREAMS = {"train": 1, "test": 2, "prior": 3}  #: split → independent random stream id


@dataclass(frozen=True)
class PhantomParams:
    """Everything that fixes the bytes of one generated split.

    Parameters
    ----------
    split : {"train", "test", "prior"}
        Which independent random stream to draw cases from.
    cases : int
        Number of cases.
    size : int, default=256
        Height and width of the square images in pixels (all geometry scales with it).
    bit_depth : {8, 16}, default=8
        PNG sample depth.
    seed : int, default=0
        Master seed.
    prevalence : float, default=0.18
        Independent probability of each finding per case.
    """

    split: str
    cases: int
    size: int = 256
    bit_depth: int = 8
    seed: int = 0
    prevalence: float = 0.18

    def __post_init__(self) -> None:
        if self.split not in SPLIT_STREAMS:
            raise ValueError(f"phantom split must be one of {sorted(SPLIT_STREAMS)}, got {self.split!r}")
        if self.bit_depth not in (8, 16):
            raise ValueError(f"bit_depth must be 8 or 16, got {self.bit_depth!r}")
        if self.size < 64:
            raise ValueError(f"size must be at least 64 px, got {self.size}")
        if self.cases < 1:
            raise ValueError(f"cases must be positive, got {self.cases}")
        if not 0.0 <= self.prevalence <= 1.0:
            raise ValueError(f"prevalence must be in [0, 1], got {self.prevalence}")

    def digest(self) -> str:
        """12-hex-digit hash of the parameters and :data:`GENERATOR_VERSION` (the cache key)."""
        blob = json.dumps({**asdict(self), "version": GENERATOR_VERSION}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    def folder_name(self) -> str:
        """``<split>-<cases>-<digest>``: the folder one split is written to."""
        return f"{self.split}-{self.cases}-{self.digest()}"


# -- geometry helpers -----------------------------------------------------------------------
def _ellipse(cx: float, cy: float, ax: float, ay: float, n: int = 48) -> np.ndarray:
    t = np.linspace(0.0, 2.0 * np.pi, n, endpoint=False)
    return np.stack([cx + ax * np.cos(t), cy + ay * np.sin(t)], axis=1)


def _rasterize(points: np.ndarray, size: int) -> np.ndarray:
    """Bool mask of a polygon with PIL's ``polygon(fill=1, outline=1)`` (the ground-truth rule)."""
    canvas = Image.new("L", (size, size), 0)
    ImageDraw.Draw(canvas).polygon([tuple(p) for p in points.tolist()], fill=1, outline=1)
    return np.asarray(canvas, dtype=bool)


def _bbox(mask: np.ndarray) -> list[int]:
    rows, cols = np.nonzero(mask)
    return [int(cols.min()), int(rows.min()), int(cols.max()) + 1, int(rows.max()) + 1]


def _slice_polygon(lung: tuple[float, float, float, float], upper: np.ndarray, xs: np.ndarray) -> np.ndarray | None:
    """Part of a lung ellipse below the curve ``upper(x)`` (sampled at ``xs``) as a polygon."""
    cx, cy, ax, ay = lung
    half = ay * np.sqrt(np.clip(1.0 - ((xs - cx) / ax) ** 2, 0.0, 1.0))
    top = np.maximum(upper, cy - half)
    bottom = cy + half
    keep = bottom - top > 1.0
    if keep.sum() < 3:
        return None
    xs, top, bottom = xs[keep], top[keep], bottom[keep]
    return np.concatenate([np.stack([xs, top], 1), np.stack([xs[::-1], bottom[::-1]], 1)])


def _inside(lung: tuple[float, float, float, float], x: float, y: float, margin: float) -> bool:
    cx, cy, ax, ay = lung
    return ((x - cx) / (ax - margin)) ** 2 + ((y - cy) / (ay - margin)) ** 2 <= 1.0


def _point_in_lung(rng: np.random.Generator, lung: tuple[float, float, float, float], margin: float,
                   avoid: np.ndarray) -> tuple[float, float]:
    """A point at least ``margin`` inside the lung and outside the ``avoid`` mask (rejection sampling)."""
    cx, cy, ax, ay = lung
    for _ in range(200):
        x, y = cx + rng.uniform(-ax, ax), cy + rng.uniform(-ay, ay)
        if _inside(lung, x, y, margin) and not avoid[int(y), int(x)]:
            return x, y
    return cx, cy - 0.3 * ay  # upper lung centre: always inside and clear of the heart


# -- one case -------------------------------------------------------------------------------
def render_case(rng: np.random.Generator, size: int = 256, prevalence: float = 0.18
                ) -> tuple[np.ndarray, list[tuple[str, np.ndarray]]]:
    """Draw one phantom radiograph and its finding regions.

    Parameters
    ----------
    rng : numpy.random.Generator
        The case's own generator (all randomness comes from it, in a fixed order).
    size : int, default=256
        Height and width in pixels.
    prevalence : float, default=0.18
        Probability of each finding.

    Returns
    -------
    image : ndarray of float32, shape (size, size)
        Values in [0, 1], bright = dense.
    regions : list of (str, ndarray (P, 2) of int)
        One ``(finding, polygon vertices (x, y))`` per region, in :data:`FINDINGS` order.
    """
    s = float(size)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) + 0.5
    present = {f: bool(rng.random() < prevalence) for f in FINDINGS}
    jitter = rng.uniform(-0.02, 0.02, size=6) * s

    body = (s * 0.5 + jitter[0], s * 0.53, s * (0.45 + rng.uniform(-0.02, 0.02)), s * 0.52)
    lungs = [(s * 0.29 + jitter[1], s * 0.44 + jitter[2], s * 0.145, s * 0.29),
             (s * 0.71 + jitter[1], s * 0.44 + jitter[3], s * 0.14, s * 0.28)]
    heart_scale = (rng.uniform(1.35, 1.6), rng.uniform(1.15, 1.3)) if present["Cardiomegaly"] else (1.0, 1.0)
    heart_c = (s * 0.56 + jitter[4], s * 0.67 + jitter[5])
    heart_axes = (s * 0.12 * heart_scale[0], s * 0.085 * heart_scale[1])

    def ellipse_mask(cx: float, cy: float, ax: float, ay: float) -> np.ndarray:
        return ((xx - cx) / ax) ** 2 + ((yy - cy) / ay) ** 2 <= 1.0

    body_m = ellipse_mask(*body)
    lung_m = [ellipse_mask(*lung) for lung in lungs]
    heart_poly = np.round(_ellipse(*heart_c, *heart_axes, n=64)).astype(int)
    heart_m = _rasterize(heart_poly, size)

    # anatomy: additive attenuation
    att = np.full((size, size), 0.05, np.float32)
    att += 0.42 * body_m
    markings = zoom(rng.normal(0.0, 1.0, (24, 24)).astype(np.float32), size / 24.0, order=1)[:size, :size]
    air = np.zeros((size, size), np.float32)
    for m in lung_m:
        air += m
    att += 0.07 * (np.abs(xx - s * 0.5) < s * 0.035) * body_m  # spine
    rib_zone = (air > 0) | ((np.abs(xx - s * 0.5) > s * 0.12) & body_m & (yy < s * 0.75))
    for k in range(9):
        for side in (-1.0, 1.0):
            y_k = s * (0.17 + 0.068 * k) + 0.9 * (xx - s * 0.5) ** 2 / s
            band = (np.abs(yy - y_k) < s * 0.009) & (side * (xx - s * 0.5) > s * 0.04) & rib_zone
            att += 0.05 * band
    pneumo_m = np.zeros((size, size), bool)
    regions: list[tuple[str, np.ndarray]] = []
    findings_att = np.zeros((size, size), np.float32)

    if present["Cardiomegaly"]:
        regions.append(("Cardiomegaly", heart_poly))
    if present["Pleural Effusion"]:
        sides = [0, 1] if rng.random() < 0.35 else [int(rng.integers(2))]
        for side in sides:
            cx, cy, ax, ay = lungs[side]
            xs = np.linspace(cx - ax, cx + ax, 40)
            lateral = (cx - xs) / (2 * ax) + 0.5 if side == 0 else (xs - cx) / (2 * ax) + 0.5  # 0 medial … 1 lateral
            level = cy + ay - s * rng.uniform(0.08, 0.15)
            upper = level - s * rng.uniform(0.03, 0.06) * lateral ** 2  # meniscus climbs laterally
            poly = _slice_polygon(lungs[side], upper, xs)
            if poly is not None:
                poly = np.round(poly).astype(int)
                regions.append(("Pleural Effusion", poly))
                findings_att += 0.24 * _rasterize(poly, size)
    if present["Consolidation"]:
        lung = lungs[int(rng.integers(2))]
        r0 = s * rng.uniform(0.05, 0.08)
        x, y = _point_in_lung(rng, lung, 1.3 * r0, heart_m)
        t = np.linspace(0.0, 2.0 * np.pi, 40, endpoint=False)
        r = r0 * (1.0 + sum(rng.uniform(0.0, 0.12) * np.cos(k * t + rng.uniform(0, 2 * np.pi)) for k in (2, 3, 5)))
        poly = np.round(np.stack([x + r * np.cos(t), y + r * np.sin(t)], 1)).astype(int)
        regions.append(("Consolidation", poly))
        mottle = 0.8 + 0.4 * rng.random((size, size)).astype(np.float32)
        findings_att += 0.2 * _rasterize(poly, size) * mottle
    if present["Nodule"]:
        for _ in range(1 if rng.random() < 0.75 else 2):
            lung = lungs[int(rng.integers(2))]
            radius = s / 256.0 * rng.uniform(2.5, 7.5)
            x, y = _point_in_lung(rng, lung, radius + s * 0.02, heart_m)
            poly = np.round(_ellipse(x, y, radius, radius, n=24)).astype(int)
            regions.append(("Nodule", poly))
            findings_att += 0.26 * _rasterize(poly, size)
    if present["Pneumothorax"]:
        side = int(rng.integers(2))
        cx, cy, ax, ay = lungs[side]
        arc = np.linspace(-0.92 * np.pi, -0.35 * np.pi, 32) if side == 0 else np.linspace(-0.65 * np.pi, -0.08 * np.pi, 32)
        outer = np.stack([cx + ax * np.cos(arc), cy + ay * np.sin(arc)], 1)
        normal = np.stack([np.cos(arc) / ax, np.sin(arc) / ay], 1)
        normal /= np.linalg.norm(normal, axis=1, keepdims=True)
        depth = s / 256.0 * rng.uniform(4.0, 10.0) * np.sin(np.linspace(0.0, np.pi, arc.size)) ** 0.5
        inner = outer - depth[:, None] * normal
        poly = np.round(np.concatenate([outer, inner[::-1]])).astype(int)
        regions.append(("Pneumothorax", poly))
        pneumo_m = _rasterize(poly, size)
        findings_att -= 0.06 * pneumo_m
        line = Image.new("L", (size, size), 0)
        ImageDraw.Draw(line).line([tuple(p) for p in np.round(inner[2:-2]).tolist()], fill=1, width=1)
        findings_att += 0.12 * np.asarray(line, dtype=np.float32)
    if present["Interstitial Pattern"]:
        texture = gaussian_filter(rng.random((size, size)).astype(np.float32), 0.8 * s / 256.0)
        reticular = (texture > np.quantile(texture, 0.62)).astype(np.float32)
        for side in ([0, 1] if rng.random() < 0.6 else [int(rng.integers(2))]):
            cx, cy, ax, ay = lungs[side]
            xs = np.linspace(cx - ax, cx + ax, 40)
            poly = _slice_polygon(lungs[side], np.full_like(xs, cy - 0.2 * ay), xs)
            poly = np.round(poly).astype(int)
            regions.append(("Interstitial Pattern", poly))
            findings_att += 0.11 * _rasterize(poly, size) * reticular

    vessels = 0.025 * markings * (air > 0) * ~pneumo_m
    att += -0.27 * np.clip(air, 0, 1) + vessels + 0.2 * heart_m + findings_att
    att = gaussian_filter(att, 0.8 * s / 256.0)

    gain, offset, gamma = rng.uniform(0.85, 1.15), rng.uniform(-0.05, 0.05), rng.uniform(0.8, 1.25)
    image = np.clip(gain * att + offset, 0.0, 1.0) ** gamma
    image = image + rng.normal(0.0, 0.012, image.shape)
    regions.sort(key=lambda r: FINDINGS.index(r[0]))
    return np.clip(image, 0.0, 1.0).astype(np.float32), regions


# -- one split on disk ------------------------------------------------------------------------
def _write_png(path: Path, image: np.ndarray, bit_depth: int) -> None:
    if bit_depth == 8:
        Image.fromarray(np.round(image * 255.0).astype(np.uint8), mode="L").save(path, compress_level=6)
    else:
        Image.fromarray(np.round(image * 65535.0).astype(np.uint16)).save(path, compress_level=6)


def write_split(folder: str | Path, params: PhantomParams, progress: bool = False) -> Path:
    """Generate one split into ``folder`` (which must not exist yet) and return it.

    Writes ``annotations.json`` (ChestX-Det style list of ``{file_name, syms, boxes,
    polygons}``; boxes xyxy with exclusive maxima, polygons ``[[x, y], ...]`` integer
    vertices), ``images/<split>_<i:05d>.png`` and ``phantom.json`` (the parameters).
    Files are first written to a temporary sibling folder that is then renamed, so
    a reader never sees a half-written split; if another process wins the race the
    existing folder is kept.
    """
    from ..core.logs import progress_iter

    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        (tmp / "images").mkdir()
        records = []
        for i in progress_iter(range(params.cases), desc=f"phantom {params.split}", unit="image", disable=not progress):
            rng = np.random.default_rng([params.seed, SPLIT_STREAMS[params.split], i])
            image, regions = render_case(rng, params.size, params.prevalence)
            name = f"{params.split}_{i:05d}.png"
            _write_png(tmp / "images" / name, image, params.bit_depth)
            records.append({
                "file_name": name,
                "syms": [finding for finding, _ in regions],
                "boxes": [_bbox(_rasterize(poly, params.size)) for _, poly in regions],
                "polygons": [poly.tolist() for _, poly in regions],
            })
        (tmp / "annotations.json").write_text(json.dumps(records, separators=(",", ":")))
        (tmp / "phantom.json").write_text(json.dumps({**asdict(params), "version": GENERATOR_VERSION}, indent=1))
        try:
            os.rename(tmp, folder)
        except OSError:
            if not (folder / "phantom.json").exists():
                raise
            shutil.rmtree(tmp)  # another process generated the same split first
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return folder


def cache_root() -> Path:
    """``$XBENCH_CACHE/phantom`` if set, else ``~/.cache/xbench/phantom``."""
    base = os.environ.get("XBENCH_CACHE")
    return (Path(base) if base else Path.home() / ".cache" / "xbench") / "phantom"


def ensure_split(params: PhantomParams, root: str | Path | None = None, progress: bool = False) -> Path:
    """The folder of a generated split under ``root`` (default :func:`cache_root`), generating it once.

    The folder is ``<root>/<split>-<cases>-<digest>``; an existing folder is reused
    (idempotent) after checking that its ``phantom.json`` matches ``params``.
    """
    folder = Path(root if root is not None else cache_root()) / params.folder_name()
    if not folder.exists():
        return write_split(folder, params, progress)
    recorded = folder / "phantom.json"
    expected = {**asdict(params), "version": GENERATOR_VERSION}
    if not recorded.exists() or json.loads(recorded.read_text()) != expected:
        raise XBenchError(f"{folder} exists but does not hold the phantom split {expected}; delete it or choose another root")
    return folder


# -- loader -------------------------------------------------------------------------------------
class Phantom(ChestXDet):
    """The phantom as an XBench dataset (generated on first use, then read from disk).

    The split folder is read by :class:`~xbench.datasets.chestx_det.ChestXDet`
    (polygons as regions), through the manifest's ``files`` section, exactly as a
    real ChestX-Det download would be. :attr:`params` holds the generator
    parameters and :attr:`root` the split folder.

    Parameters
    ----------
    root : path or None
        Folder holding generated splits; None → :func:`cache_root`.
    split : {"train", "test", "prior"}
    manifest : dict
        ``data_manifests/phantom.yaml`` (``generator`` gives the defaults, ``splits.<split>.cases`` the size).
    cases, size, bit_depth, seed, prevalence : optional
        Override the manifest (e.g. ``cases=60`` for a quick test split).
    on_error : {"raise", "skip"}
    """

    def __init__(self, root: str | Path | None, split: str = "test", *, manifest: dict[str, Any],
                 on_error: str = "raise", cases: int | None = None, size: int | None = None,
                 bit_depth: int | None = None, seed: int | None = None, prevalence: float | None = None):
        gen = dict(manifest.get("generator") or {})
        splits = manifest.get("splits") or {}
        if split not in splits:
            raise UnknownNameError("split of dataset 'phantom'", split, splits)
        given = {"size": size, "bit_depth": bit_depth, "seed": seed, "prevalence": prevalence}
        gen.update({k: v for k, v in given.items() if v is not None})
        if cases is not None and cases < 1:  # 0 used to fall back to the split's default size silently
            raise XBenchError(f"phantom: cases must be >= 1 (an empty dataset has nothing to evaluate), got {cases!r}")
        self.params = PhantomParams(split=split, cases=int(cases if cases is not None else splits[split]["cases"]), **gen)
        folder = ensure_split(self.params, root)
        manifest = {**manifest, "image_size": [self.params.size, self.params.size]}
        super().__init__(folder, split, manifest=manifest, on_error=on_error)

