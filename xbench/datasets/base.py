"""The one sample record every source yields, and the base class of the loaders.

torchxrayvision style: one loader class per source (``xbench/datasets/<name>.py``),
all yielding :class:`Sample`. A dataset is a pandas table of cases
(:attr:`BaseDataset.cases`, one row per image) plus lazy access to the image and
the regions of each case.

Coordinates are in pixels of the released image, origin top-left, x to the right,
y down. Regions are kept in their published form (boxes, polygons, encoded masks)
and rasterised on demand to any grid by :func:`xbench.datasets.regions.rasterize`.
"""
from __future__ import annotations

import math
import warnings
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..core.errors import FormatError, MissingFileError, UnknownNameError, XBenchWarning
from .images import ImageFolder, SourceImage, read_image, read_source
from .regions import Box, EncodedMask, Polygon, Region, rasterize

__all__ = ["Sample", "BaseDataset", "Box", "Polygon", "EncodedMask", "Region", "UNKNOWN", "largest_first", "case_pixels",
           "inference_order"]

UNKNOWN = math.nan  #: label value for "not annotated" (1.0 = positive, 0.0 = negative)


@dataclass
class Sample:
    """One case of any source.

    Attributes
    ----------
    case_id : str
        Identifier unique within the dataset (file stem, patientId, ImageId, ...).
    dataset : str
        Registry name of the source (``"chestx_det10"``).
    image_path : Path
        Where the image is read from (PNG, JPEG or DICOM).
    size : (int, int)
        ``(height, width)`` of the original image.
    view : str or None
        ``"PA"``, ``"AP"``, ... when the source says.
    labels : dict[str, float]
        Finding (the dataset's class name as listed in its manifest) → 1.0, 0.0 or NaN (unknown).
    regions : dict[str, list[Region]]
        Finding → its radiologist regions (empty list: none drawn).
    """

    case_id: str
    dataset: str
    image_path: Path
    size: tuple[int, int]
    view: str | None
    labels: dict[str, float]
    regions: dict[str, list[Region]] = field(default_factory=dict)
    reader: Callable[[Path], np.ndarray] | None = None

    def image(self) -> np.ndarray:
        """The image as float32 in [0, 1], shape ``(height, width)`` at original size."""
        return (self.reader or read_image)(self.image_path)

    def source(self) -> SourceImage:
        """The image as its file's integers (:func:`~xbench.datasets.images.read_source`); ``.image()`` equals
        :meth:`image`. A custom ``reader`` without a ``read_source`` twin gives its float image wrapped."""
        if self.reader is None:
            return read_source(self.image_path)
        func, owner = getattr(self.reader, "__func__", None), getattr(self.reader, "__self__", None)
        if func is BaseDataset.read_image or func is ImageFolder.read:  # the package's readers: their integer twins
            return owner.read_source(self.image_path)
        return SourceImage.from_image(self.reader(self.image_path))

    def mask(self, finding: str, grid: tuple[int, int] | None = None) -> np.ndarray:
        """Union of ``finding``'s regions as a bool mask on ``grid`` (default: original size)."""
        return rasterize(self.regions.get(finding, []), self.size, grid)


class BaseDataset(Sequence[Sample], ABC):
    """A table of cases plus lazy image/region access.

    Subclasses implement :meth:`_read_index` (the case table) and
    :meth:`_regions` (regions of one row). ``manifest`` is the parsed
    ``data_manifests/<name>.yaml``; its ``classes`` list fixes :attr:`findings`
    (class names as the dataset spells them) and :attr:`prompts` (class → prompt
    name given to the models).

    Parameters
    ----------
    root : path
        Folder holding the user's local copy, laid out as the manifest's ``files`` says.
    split : str, default="test"
        Evaluation split named in the manifest.
    manifest : dict
        Parsed manifest (``xbench.load_dataset`` passes it).
    on_error : {"raise", "skip"}, default="raise"
        Malformed rows raise :class:`~xbench.core.errors.FormatError` naming file and line,
        or are skipped and counted in :attr:`skipped`.

    The base owns what every loader shares: the split is checked against the manifest's
    ``splits`` (when it lists any) before :meth:`_read_index` runs; file paths come from :meth:`file` (annotation
    files), :meth:`folder` and :meth:`image_path` (files named by the annotations); images are read
    by :meth:`read_image` (``nested_images = True``: found by file name below the images folder).

    Root containment: every file a loader reads is resolved (symlinks too) and refused with a
    :class:`~xbench.core.errors.FormatError` when it lies outside the dataset root and outside every folder
    of the manifest's ``files`` (so ``../../x.png`` or an absolute path in an annotation is refused,
    while a root or an images folder that is itself a symlink to another disk is fine).
    """

    #: images live in nested folders and are found by file name (:class:`~xbench.datasets.images.ImageFolder`)
    nested_images: bool = False

    def __init__(self, root: str | Path, split: str = "test", *, manifest: dict[str, Any], on_error: str = "raise"):
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        self.root = Path(root)
        self.split = split
        self.manifest = manifest
        self.name: str = manifest["name"]
        self.on_error = on_error
        self.skipped: Counter[str] = Counter()
        classes = manifest.get("classes", [])
        self.findings: list[str] = [c["name"] for c in classes]
        self.prompts: dict[str, str] = {c["name"]: c.get("prompt", c["name"].lower()) for c in classes}
        splits = manifest.get("splits")
        if splits and split not in splits:  # a manifest without ``splits`` (an ad-hoc source) has one unnamed split
            raise UnknownNameError(f"split of dataset {self.name!r}", split, splits)
        self._bases: list[Path] | None = None
        self._image_folder: ImageFolder | None = None
        self.cases: pd.DataFrame = self._read_index()
        if self.skipped:
            warnings.warn(f"{self.name} ({split}): skipped {sum(self.skipped.values())} malformed records: "
                          f"{dict(self.skipped)}", XBenchWarning, stacklevel=2)

    # -- to implement ---------------------------------------------------------------
    @abstractmethod
    def _read_index(self) -> pd.DataFrame:
        """Case table: columns ``case_id, image_path, height, width, view`` and one
        ``label:<finding>`` column per finding (1.0 / 0.0 / NaN)."""

    @abstractmethod
    def _regions(self, row: pd.Series) -> dict[str, list[Region]]:
        """Regions of one case, keyed by finding."""

    # -- shared -------------------------------------------------------------------
    def skip(self, reason: str) -> None:
        """Count one skipped record (only used when ``on_error="skip"``)."""
        self.skipped[reason] += 1

    def fail(self, path: str | Path, message: str, *, line: int | None = None, field: str | None = None,
             reason: str | None = None) -> None:
        """One malformed record: raise :class:`~xbench.core.errors.FormatError` naming ``path``, ``line`` and
        ``field`` when ``on_error="raise"``, else count it under ``reason`` (default: ``message``)."""
        if self.on_error == "raise":
            raise FormatError(path, message, line=line, field=field)
        self.skip(reason or message)

    def folder(self, key: str = "images") -> Path:
        """Local path of the manifest's ``files[key]`` (``{split}`` filled in), whether or not it exists."""
        entry = (self.manifest.get("files") or {})[key]
        return self.root / str(entry["path"]).format(split=self.split)

    def file(self, key: str) -> Path:
        """Local path of the manifest's ``files[key]`` (``{split}`` in its path is filled in).

        Raises :class:`~xbench.core.errors.MissingFileError` naming the path and the entry's
        ``source`` (the publisher's page) when it does not exist.
        """
        path = self.folder(key)
        if not path.exists():
            entry = (self.manifest.get("files") or {})[key]
            title = self.manifest.get("title", self.name)
            raise MissingFileError(path, f"{title} file {key!r}", entry.get("source"))
        return self.contained(path)

    def image_path(self, name: str | Path, key: str = "images") -> Path:
        """``folder(key) / name`` for a file named by the annotations; refused when it leaves the root or holds a
        NUL byte or another control character (no file system path can)."""
        if any(ord(ch) < 32 for ch in str(name)):
            raise FormatError(self.folder(key), f"file name {str(name)!r} holds a control character (NUL, newline, ...)")
        return self.contained(self.folder(key) / name)

    def contained(self, path: str | Path) -> Path:
        """``path`` unchanged if it resolves (symlinks too) inside the root or a manifest folder, else
        :class:`~xbench.core.errors.FormatError` naming it (the one root-containment check of every loader)."""
        if self._bases is None:
            folders = [self.folder(key) for key in (self.manifest.get("files") or {})]
            self._bases = [p.resolve() for p in (self.root, *folders)]
        real = Path(path).resolve()
        if not any(real == base or base in real.parents for base in self._bases):
            raise FormatError(path, f"resolves to {real}, outside the dataset root {self.root}; XBench reads only "
                              "files inside the dataset root (or the manifest's folders)")
        return Path(path)

    def locate_image(self, path: str | Path) -> Path:
        """Where the image of a case table ``image_path`` is: the path itself, or with :attr:`nested_images`
        the file of that name below the images folder (:class:`~xbench.core.errors.MissingFileError` if none)."""
        if not self.nested_images:
            return Path(path)
        if self._image_folder is None:
            entry = (self.manifest.get("files") or {}).get("images") or {}
            self._image_folder = ImageFolder(self.folder("images"), entry.get("source"))
        return self._image_folder.locate(Path(path).name)

    def read_image(self, path: str | Path) -> np.ndarray:
        """Read the image of ``path`` (:meth:`locate_image`) after the root-containment check; the
        :attr:`Sample.reader` of every sample."""
        return read_image(self.contained(self.locate_image(path)))

    def read_source(self, path: str | Path) -> SourceImage:
        """:meth:`read_image` as the file's integers (:func:`~xbench.datasets.images.read_source`)."""
        return read_source(self.contained(self.locate_image(path)))

    def __len__(self) -> int:
        return len(self.cases)

    def __getitem__(self, index: int) -> Sample:  # type: ignore[override]
        row = self.cases.iloc[index]
        return Sample(
            case_id=str(row["case_id"]),
            dataset=self.name,
            image_path=Path(row["image_path"]),
            size=(int(row["height"]), int(row["width"])),
            view=None if pd.isna(row.get("view")) else str(row.get("view")),
            labels={f: float(row[f"label:{f}"]) for f in self.findings},
            regions=self._regions(row),
            reader=self.read_image,
        )

    def labels(self) -> np.ndarray:
        """``(N, C)`` float label matrix (1/0/NaN) in :attr:`findings` order."""
        return self.cases[[f"label:{f}" for f in self.findings]].to_numpy(dtype=float)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, split={self.split!r}, cases={len(self)}, findings={len(self.findings)})"


def largest_first(datasets: Sequence[Any]) -> list[int]:
    """Indices of ``datasets`` by decreasing cases × findings (ties in the given order): the most evaluation work
    first. The evaluation submits a run's remaining datasets in this order, and :func:`inference_order` follows it
    after its lead.

    >>> class D(list):
    ...     findings = ["effusion"]
    >>> largest_first([D(range(10)), D(range(300)), D(range(300)), D(range(40))])
    [1, 2, 3, 0]
    """
    return sorted(range(len(datasets)), key=lambda d: -len(datasets[d]) * max(1, len(datasets[d].findings)))


def case_pixels(dataset: Any) -> np.ndarray:
    """Pixels of each case's image (``height × width`` of the case table; 1 per case when the table has no sizes,
    0 where a size is missing): what decoding the case costs, up to a constant per format."""
    cases = dataset.cases
    if not {"height", "width"} <= set(cases.columns):
        return np.ones(len(dataset))
    return (cases["height"].astype(np.float64) * cases["width"].astype(np.float64)).fillna(0.0).to_numpy()


def inference_order(datasets: Sequence[Any]) -> list[int]:
    """Indices of ``datasets`` in the order a run infers them, and prepares their ground truth in: a *lead*, then
    the others by :func:`largest_first`.

    The lead is the dataset with the most cases per decoded pixel, weighted by its cases (largest
    ``cases² / pixels``, :func:`case_pixels`; ties in the given order). Decoding runs one dataset ahead of the models
    (:meth:`xbench.inference.input_feed.InputFeed.then`). While the models work through the lead's many small images, the
    dataset with the most evaluation work, typically also the slowest to decode per case (VinDr-CXR's 3,000² DICOMs),
    is decoded behind them. Its evaluation then runs while the other datasets are inferred. Led by that dataset
    instead (largest first alone), the models waited for its decoding once the networks were
    built (one H200, half-scale stand-ins, cold: 65.7 / 65.8 s with the lead against 67.5 / 68.7 s).

    >>> import pandas as pd
    >>> class D(list):
    ...     def __init__(self, n, side, findings):
    ...         super().__init__(range(n))
    ...         self.findings = ["f"] * findings
    ...         self.cases = pd.DataFrame({"height": [side] * n, "width": [side] * n})
    >>> # a large set of small images leads; then the most evaluation work (cases × findings) first
    >>> inference_order([D(40, 1024, 8), D(300, 3000, 21), D(500, 1024, 1), D(60, 2048, 10)])
    [2, 1, 3, 0]
    """
    if not datasets:
        return []
    weight = [len(d) ** 2 / max(float(case_pixels(d).sum()), 1.0) for d in datasets]
    lead = max(range(len(datasets)), key=lambda d: (weight[d], -d))
    return [lead] + [d for d in largest_first(datasets) if d != lead]
