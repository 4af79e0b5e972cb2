"""Score your own saliency maps on a dataset: the same tables, best τ and CIs as a model run.

:func:`evaluate_maps` writes the maps into a results store as a pseudo-model (``name``, default
``"user_maps"``) and runs the very evaluation a model run uses (:func:`xbench.evaluation.evaluate.evaluate_run`),
so fed a run's own stored maps it reproduces that run's tables exactly (tested).

Accepted maps:

* an array-like ``(N, C, h, w)`` with ``case_ids`` (N) and ``classes`` (C; default: the dataset's
  classes in order), any native grid — maps are bilinearly resized to the evaluation grid as
  every model's are;
* a :class:`MapSet` (from :func:`load_maps` or :func:`read_chexlocalize`);
* a path: a folder of per-case files named ``<case_id>.npy`` (one ``(C, h, w)`` array in
  ``classes`` order), ``<case_id>.npz`` or ``<case_id>.safetensors`` (one ``(h, w)`` array per
  class, keyed by class name), with an optional ``probs.csv`` (column ``case_id`` + one column
  per class) for recognition; or one ``.npz`` file holding ``maps``, ``case_ids``, ``classes``
  and optionally ``probs``. Pickles are never read here (``allow_pickle=False``); cheXlocalize's
  ``*_map.pkl`` folders go through :func:`read_chexlocalize` (a restricted unpickler).

Conventions: class names are the dataset's (manifest ``name`` or an ``aliases`` entry); every
class with regions (``localized``) needs a map, recognition-only classes may be left out.
Dataset cases without a map are counted in the evaluation log (``cases_skipped_at_inference``,
reason ``no map supplied``), never silently scored. Without ``probs`` the recognition rows are
left out of the tables. The store keeps maps as float16 (its format): maps that float16 does not
hold exactly are min–max normalised per map first (the metrics are invariant to that) and a
warning says so.
"""
from __future__ import annotations

import json
import math
import re
import shutil
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..core.atomic import atomic_write_text
from ..spec.config import DatasetSpec, ModelSpec, RunConfig
from ..core.errors import CheckpointError, FormatError, OutputError, XBenchError, XBenchWarning
from ..core.files import contained_folder, regular_size
from ..core.lock import output_lock
from ..metrics import ACCURACY, AUC, AUPRC, F1, HAMMING_ACCURACY
from ..store.results import ResultStore
from ..core.safe_arrays import read_npy, read_npz, read_safetensors
from ..core.summary import brief

__all__ = ["MapSet", "load_maps", "read_chexlocalize", "evaluate_maps", "RECOGNITION_METRICS"]

RECOGNITION_METRICS = (AUC, AUPRC, F1, ACCURACY, HAMMING_ACCURACY)


@dataclass
class MapSet:
    """Saliency maps of some cases: ``maps (N, C, h, w)`` float32, ``case_ids`` (N), ``classes`` (C),
    optional ``probs (N, C)`` (NaN = not given)."""

    maps: np.ndarray
    case_ids: list[str]
    classes: list[str]
    probs: np.ndarray | None = None

    def __post_init__(self) -> None:
        self.maps = _numeric(self.maps, "maps")
        self.case_ids = [str(c) for c in self.case_ids]
        self.classes = [str(c) for c in self.classes]
        if self.maps.ndim != 4:
            raise XBenchError(f"maps must have shape (N, C, h, w); got {self.maps.shape}")
        n, c, h, w = self.maps.shape
        if h == 0 or w == 0:
            raise XBenchError(f"maps have an empty {h} x {w} grid; each map needs at least one pixel")
        if len(self.case_ids) != n:
            raise XBenchError(f"{n} maps but {len(self.case_ids)} case ids")
        if len(self.classes) != c:
            raise XBenchError(f"maps have {c} classes but {len(self.classes)} class names were given: {self.classes}")
        for what, names in (("case id", self.case_ids), ("class", self.classes)):
            dup = sorted({x for x in names if names.count(x) > 1})
            if dup:
                raise XBenchError(f"duplicate {what}(s): {dup[:5]}")
        bad = ~np.isfinite(self.maps)
        if bad.any():
            i, j = (int(k) for k in np.argwhere(bad.any(axis=(2, 3)))[0])
            raise XBenchError(f"the map of case {self.case_ids[i]!r}, class {self.classes[j]!r} holds NaN or inf "
                              f"({int(bad[i, j].sum())} pixels); scoring needs finite maps: replace them (e.g. "
                              "numpy.nan_to_num) or leave the case out")
        if self.probs is not None:
            self.probs = _numeric(self.probs, "probs")
            if self.probs.shape != (n, c):
                raise XBenchError(f"probs must have shape {(n, c)} (cases × classes); got {self.probs.shape}")


def _numpy(x: Any) -> np.ndarray:
    if hasattr(x, "detach"):  # torch tensor
        from ..models.checkpoint import PLAIN_TORCH_DTYPES

        if x.dtype not in PLAIN_TORCH_DTYPES:
            raise XBenchError(f"a tensor of dtype {x.dtype} (quantized / bit-packed) cannot be scored; "
                              "convert it to float first")
        return x.detach().float().cpu().numpy()
    return np.asarray(x)


def _numeric(x: Any, what: str) -> np.ndarray:
    """``x`` as a float32 array; a non-numeric dtype (text, object, ...) is an :class:`XBenchError` naming ``what``."""
    arr = _numpy(x)
    if arr.dtype.kind not in "biuf":
        raise XBenchError(f"{what} have dtype {arr.dtype} ({'text' if arr.dtype.kind in 'US' else 'not numbers'}); "
                          "numeric maps are needed")
    return arr.astype(np.float32, copy=False)


# -- reading maps ---------------------------------------------------------------------------------------------
def load_maps(path: str | Path, classes: Sequence[str] | None = None) -> MapSet:
    """Maps from a folder of per-case ``.npy`` / ``.npz`` / ``.safetensors`` files or from one ``.npz`` file.

    See the module docstring for the layouts. ``classes`` gives the class order of ``.npy`` files
    (required for them) and selects/orders the keys of ``.npz`` / ``.safetensors`` files
    (default: the keys of the first file, in stored order).
    """
    path = Path(path)
    if path.is_file():
        return _maps_file(path)
    if not path.is_dir():
        raise XBenchError(f"{path} is neither a maps folder nor an .npz file")
    files = _map_files(path, classes)
    maps, names = [], list(classes) if classes is not None else None
    for p in files:
        if p.suffix == ".npy":
            arr = _numeric_file(read_npy(p), p, None)
            if arr.ndim != 3 or arr.shape[0] != len(names):
                raise FormatError(p, f"expected a ({len(names)}, h, w) array (one map per class); got {arr.shape}")
        else:
            names, arr = _named_maps(p, names)
        if maps and arr.shape != maps[0].shape:
            raise FormatError(p, f"map shape {arr.shape} differs from {files[0].name}'s {maps[0].shape}: "
                                 "all cases need one native grid")
        maps.append(arr.astype(np.float32))
    ids = [p.stem for p in files]
    probs = _read_probs(path / "probs.csv", ids, names) if (path / "probs.csv").exists() else None
    return MapSet(np.stack(maps), ids, names, probs)


def _maps_file(path: Path) -> MapSet:
    """One ``.npz`` file holding ``maps``, ``case_ids``, ``classes`` and optionally ``probs``."""
    if path.suffix != ".npz":
        raise XBenchError(f"{path}: a single maps file must be .npz (maps, case_ids, classes[, probs])")
    z = read_npz(path)
    missing = [k for k in ("maps", "case_ids", "classes") if k not in z]
    if missing:
        raise FormatError(path, f"missing array(s) {missing}; found {sorted(z)}")
    return MapSet(z["maps"], z["case_ids"].tolist(), z["classes"].tolist(), z.get("probs"))


def _map_files(path: Path, classes: Sequence[str] | None) -> list[Path]:
    """The per-case map files of a folder, sorted: one kind of file, ``.npy`` only with ``classes`` given."""
    files = sorted(p for p in path.iterdir() if p.suffix in (".npy", ".npz", ".safetensors"))
    if not files:
        raise XBenchError(f"{path}: no .npy, .npz or .safetensors map files")
    kinds = {p.suffix for p in files}
    if len(kinds) > 1:
        raise XBenchError(f"{path}: mixed map file types {sorted(kinds)}; use one")
    if ".npy" in kinds and classes is None:
        raise XBenchError(f"{path}: .npy files hold (C, h, w) arrays: pass classes=[...] to name their C classes")
    return files


def _named_maps(path: Path, names: list[str] | None) -> tuple[list[str], np.ndarray]:
    """The ``(C, h, w)`` maps of one ``.npz`` / ``.safetensors`` case file in ``names`` order (default: its keys in
    stored order), with those names; each class map 2-D and all of one shape."""
    table = _read_named_arrays(path)
    names = names or list(table)
    absent = [c for c in names if c not in table]
    if absent:
        raise FormatError(path, f"no map for class(es) {absent}; the file holds {sorted(table)}")
    planes = [_numeric_file(table[c], path, c) for c in names]
    for c, plane in zip(names, planes):
        if plane.ndim != 2 or plane.shape != planes[0].shape:
            raise FormatError(path, f"each class map must be 2-D (h, w) and all of one shape; this one is "
                                    f"{plane.shape}, {names[0]!r}'s is {planes[0].shape}", field=c)
    return names, np.stack(planes)


def _numeric_file(arr: np.ndarray, path: Path, field: str | None) -> np.ndarray:
    """A map array read from ``path`` as float32; text arrays are a :class:`FormatError` naming the file."""
    if arr.dtype.kind not in "biuf":
        raise FormatError(path, f"holds {'text' if arr.dtype.kind in 'US' else 'non-numeric'} values (dtype "
                                f"{arr.dtype}), not a map", field=field)
    return arr.astype(np.float32, copy=False)


def _read_named_arrays(path: Path) -> dict[str, np.ndarray]:
    return read_npz(path) if path.suffix == ".npz" else read_safetensors(path)


def _read_probs(path: Path, case_ids: list[str], classes: list[str]) -> np.ndarray:
    try:
        table = pd.read_csv(path, dtype={"case_id": str})
    except (ValueError, UnicodeDecodeError, pd.errors.ParserError) as exc:
        raise FormatError(path, f"not a readable CSV table ({type(exc).__name__}: {exc})") from None
    if "case_id" not in table.columns:
        raise FormatError(path, "needs a case_id column and one column per class", field="case_id")
    absent = [c for c in classes if c not in table.columns]
    if absent:
        raise FormatError(path, f"no column for class(es) {absent}")
    table = table.set_index("case_id")
    missing = [c for c in case_ids if c not in table.index]
    if missing:
        raise FormatError(path, f"no row for case(s) {missing[:5]} ({len(missing)} in all)", field="case_id")
    table = table.loc[case_ids, classes]
    for c in classes:
        values = pd.to_numeric(table[c], errors="coerce")
        wrong = values.isna() & table[c].notna()
        if wrong.any():
            case = wrong.index[int(np.argmax(wrong.to_numpy()))]
            raise FormatError(path, f"case {case!r}: {brief(table[c][wrong].iloc[0], 40)} is not a number",
                              field=c)
        table[c] = values
    return table.to_numpy(np.float32)


#: CheXpert's 14 labels in their standard order (index of a 14-vector ``prob`` in cheXlocalize pickles).
CHEXPERT_TASKS = ("No Finding", "Enlarged Cardiomediastinum", "Cardiomegaly", "Lung Lesion", "Airspace Opacity",
                  "Edema", "Consolidation", "Pneumonia", "Atelectasis", "Pneumothorax", "Pleural Effusion",
                  "Pleural Other", "Fracture", "Support Devices")

_CHEXLOCALIZE_NAME = re.compile(r"^(?P<cxr>.+)_(?P<task>[^_]+)_map\.pkl$")


def read_chexlocalize_pickle(path: str | Path) -> dict[str, Any]:
    """One cheXlocalize ``{cxr_id}_{task}_map.pkl`` as a dict (``map`` (1, 1, h, w), ``prob``, ``task``, ``gt``,
    ``cxr_img``, ``cxr_dims`` = (w, h)), read with a restricted unpickler: no code from the file runs."""
    from ..models.checkpoint import load_pickle, read_torch_bytes

    path = Path(path)
    where = f"{path} (nested torch storage)"
    # a tensor pickled with plain ``pickle`` stores its storage as ``torch.storage._load_from_bytes(<torch.save
    # bytes>)``: those bytes go through the same reader as a checkpoint (never torch.load)
    nested = {"torch.storage._load_from_bytes": lambda data: read_torch_bytes(data, where)}
    try:
        with open(path, "rb") as fh:
            out, replaced = load_pickle(fh, str(path), extra=nested)
    except CheckpointError as exc:  # anything the restricted unpickler refuses, truncated files, ...
        raise FormatError(path, f"not a readable cheXlocalize map pickle ({exc})") from None
    if replaced:
        raise FormatError(path, f"refusing: pickles objects other than tensors, arrays and plain values "
                                f"({', '.join(replaced)}; kept as inert placeholders, never called)")
    if not isinstance(out, dict) or "map" not in out:
        raise FormatError(path, "expected a dict with a 'map' entry (cheXlocalize layout)")
    import torch

    prob = out.get("prob")
    if isinstance(prob, list | tuple) and len(prob) <= 64 and all(isinstance(p, float | int) for p in prob):
        out["prob"] = np.asarray(prob, np.float32)  # a plain list of probabilities (at most 14 in cheXlocalize)
    for key, kinds in (("map", (torch.Tensor, np.ndarray)), ("prob", (torch.Tensor, np.ndarray, np.generic, float, int))):
        if key in out and not isinstance(out[key], kinds):
            raise FormatError(path, f"must be a tensor or an array{' or a number' if key == 'prob' else ''}, got a "
                                    f"{type(out[key]).__name__} ({brief(out[key], 60)})", field=key)
    return out


def read_chexlocalize(map_dir: str | Path, classes: Sequence[str] | None = None) -> MapSet:
    """cheXlocalize's saliency folder (``**/{cxr_id}_{task}_map.pkl``, as its ``eval.py --map_dir`` reads) → :class:`MapSet`.

    Maps are the pickles' ``map`` tensors (squeezed to ``(h, w)``, same native grid for all);
    ``prob`` (a float, or a 14-vector in CheXpert label order) becomes ``probs``. ``classes``
    (default: the tasks found, sorted) selects tasks; a (case, task) without a pickle is an error
    naming it.
    """
    found: dict[tuple[str, str], Path] = {}
    for p in sorted(Path(map_dir).rglob("*_map.pkl")):
        m = _CHEXLOCALIZE_NAME.match(p.name)
        if m is None:
            raise FormatError(p, "expected a name {cxr_id}_{task}_map.pkl")
        found[(m["cxr"], m["task"])] = p
    if not found:
        raise XBenchError(f"{map_dir}: no *_map.pkl files (cheXlocalize layout)")
    tasks = list(classes) if classes is not None else sorted({t for _, t in found})
    cxrs = sorted({c for c, _ in found})
    maps, probs = [], np.full((len(cxrs), len(tasks)), np.nan, np.float32)
    for i, cxr in enumerate(cxrs):
        row = []
        for j, task in enumerate(tasks):
            if (cxr, task) not in found:
                raise XBenchError(f"{map_dir}: no map for {cxr} × {task} ({cxr}_{task}_map.pkl)")
            item = read_chexlocalize_pickle(found[(cxr, task)])
            row.append(np.asarray(_numpy(item["map"]), np.float32).squeeze())
            prob = np.asarray(_numpy(item.get("prob", np.nan)), np.float32).ravel()
            probs[i, j] = prob[0] if prob.size == 1 else (prob[CHEXPERT_TASKS.index(task)]
                                                          if prob.size == 14 and task in CHEXPERT_TASKS else np.nan)
        maps.append(np.stack(row))
    return MapSet(np.stack(maps), cxrs, tasks, None if np.isnan(probs).all() else probs)


# -- scoring --------------------------------------------------------------------------------------------------
def evaluate_maps(
    maps: Any,
    *,
    dataset: str,
    split: str | None = None,
    root: str | Path | None = None,
    case_ids: Sequence[str] | None = None,
    classes: Sequence[str] | None = None,
    probs: Any = None,
    name: str = "user_maps",
    output_dir: str | Path | None = None,
    grid: tuple[int, int] = (224, 224),
    fixed_threshold: float = 0.5,
    pointing_ties: str = "first",
    bootstrap: int = 1000,
    seed: int = 0,
    chunk_size: int = 256,
    dataset_options: dict[str, Any] | None = None,
    pointing_margins: Sequence[int] = (),
    progress: bool = False,
    compare_with: str | Path | None = None,
) -> dict[str, pd.DataFrame]:
    """Score saliency maps on ``dataset``; returns the run tables (``metrics``, ``pairs``, ``curves``, ``models``).

    Parameters
    ----------
    maps : array-like (N, C, h, w), MapSet, or path
        See the module docstring. Torch tensors are accepted.
    dataset, split, root, dataset_options
        The dataset as ``xbench.load_dataset(dataset, root=root, split=split, **dataset_options)``.
    case_ids, classes, probs
        For array-like ``maps``: case id of each row (required), class of each channel (default:
        the dataset's classes), probabilities ``(N, C)`` for recognition (optional).
    name : str, default="user_maps"
        Model name in the tables (a folder name: :data:`xbench.spec.names.SAFE_NAME`, no ``..``).
    output_dir : path, optional
        Where the store and ``tables/`` go (default ``results/<name>-<dataset>``); it is
        replaced on every call.
    grid, fixed_threshold, pointing_ties, bootstrap, seed, chunk_size
        As the run config keys of the same meaning (``bootstrap`` = replicates).
    pointing_margins : sequence of int, default=()
        Also score the tolerance pointing game at these margins (grid pixels): metric rows
        ``pointing@{m}px`` (:func:`xbench.outputs.exports.pointing_tolerance_table`).
    compare_with : path, optional
        A run folder whose results store holds this dataset (same split and classes): its stored
        models are copied into this output's store and evaluated with the maps under the same
        settings, so ``tables/comparisons.csv`` compares the maps with every model of that run,
        paired on the cases all of them cover (:mod:`xbench.evaluation.comparisons`). Default: the maps alone
        (``comparisons.csv`` then has no rows; ``ranks.csv`` has the maps' rows).

    Returns
    -------
    dict of pandas.DataFrame
        As :func:`xbench.evaluation.evaluate.load_tables`: ``metrics`` (tidy, with ``best_tau`` rows and
        95 % CIs), ``pairs``, ``curves``, ``models``; the files are under ``<output_dir>/tables``.
    """
    from ..datasets import load_dataset
    from ..evaluation.evaluate import load_tables
    from ..spec.names import check_name

    check_name(name, "model")  # becomes a folder name: xbench.spec.names.SAFE_NAME, no '..'
    if dataset_options:
        from ..spec.config import check_dataset_options

        check_dataset_options(dataset, dict(dataset_options), "dataset options (--option)")
    data = load_dataset(dataset, root=root, split=split, **(dataset_options or {}))
    mapset = _as_mapset(maps, case_ids=case_ids, classes=classes if classes is not None else data.findings, probs=probs)
    index = _class_index(data, mapset.classes)
    out = Path(output_dir) if output_dir is not None else Path("results") / f"{name}-{data.name}"
    if ((out / "store").exists() or (out / "tables").exists()) and not (out / "score_inputs.json").exists():
        raise XBenchError(f"{out} holds a results store or tables that evaluate_maps did not write (a model run?); "
                          "choose another output_dir — evaluate_maps replaces its output folder's store and tables")
    with output_lock(out, "score"):  # one XBench process per output folder (xbench.core.lock)
        _empty_output(out, name, data.name)
        others = _run_models(compare_with, data, name) if compare_with is not None else {}
        cfg = RunConfig(output_dir=str(out), datasets=[DatasetSpec(name=dataset, root=None if root is None else str(root),
                                                                   split=data.split, options=dict(dataset_options or {}))],
                        models=[ModelSpec(name=name), *(ModelSpec(name=m) for m in others)],
                        grid=tuple(int(g) for g in grid), fixed_threshold=float(fixed_threshold),
                        pointing_ties=pointing_ties, bootstrap_replicates=int(bootstrap), bootstrap_seed=int(seed),
                        # the copied stores were written in the run's chunks
                        chunk_size=int(next(iter(others.values()))["chunk_size"] if others else chunk_size))
        cfg.validate()
        _write_store(cfg, data, mapset, index, name)
        for model in others:
            _copy_store_folder(ResultStore(compare_with).root / data.name / model, ResultStore(out), data.name, model)
        _evaluate(cfg, progress, probs_given=mapset.probs is not None, pointing_margins=pointing_margins)
        return load_tables(out)


def _empty_output(out: Path, name: str, dataset: str) -> None:
    """``out`` made, marked as being written by evaluate_maps, its ``store/`` and ``tables/`` removed (real folders
    inside it only: a link is refused)."""
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "score_inputs.json", json.dumps({"name": name, "dataset": dataset, "state": "writing"}))
    for sub in ("store", "tables"):
        if contained_folder(out, sub, create=False).exists():
            try:
                shutil.rmtree(out / sub)
            except OSError as exc:
                raise OutputError(out / sub, exc, what="cannot replace") from exc


def _evaluate(cfg: RunConfig, progress: bool, *, probs_given: bool, pointing_margins: Sequence[int]) -> None:
    """The run's own evaluation and table writing (:func:`xbench.evaluation.evaluate.evaluate_run`, then the paper
    tables), every table written once: without probabilities the placeholder recognition rows are left out of the
    metrics, comparisons and ranks; the tolerance pointing rows join the metric table."""
    from ..evaluation.evaluate import evaluate_run
    from ..outputs.tables import write_paper_tables

    extra = None
    if any(pointing_margins):
        from ..outputs.exports import pointing_tolerance_table

        def extra(pairs: pd.DataFrame) -> pd.DataFrame:
            return pointing_tolerance_table(cfg.output_dir, list(pointing_margins), grid=cfg.grid, ties=cfg.pointing_ties,
                                            n_boot=cfg.bootstrap_replicates, seed=cfg.bootstrap_seed, pairs=pairs)
    with warnings.catch_warnings():
        if not probs_given:  # constant placeholder probabilities: their recognition rows are left out
            warnings.filterwarnings("ignore", category=XBenchWarning, message=".*(AUC|AUPRC|label).*")
        evaluate_run(cfg, progress=progress, leave_out=() if probs_given else RECOGNITION_METRICS, extra_rows=extra)
    write_paper_tables(cfg.output_dir)


def _run_models(run_dir: str | Path, data: Any, name: str) -> dict[str, dict]:
    """Model → store meta of the run ``run_dir`` for ``data``'s dataset, checked to be comparable with the maps."""
    folder = ResultStore(run_dir).root / data.name
    metas = {p.parent.name: ResultStore._read_meta(p) for p in sorted(folder.glob("*/meta.json"))}
    if not metas:
        raise XBenchError(f"compare_with={str(run_dir)!r}: no stored model for dataset {data.name!r} (looked in {folder})")
    if name in metas:
        raise XBenchError(f"compare_with: the run has a model named {name!r}; give the maps another name")
    for model, meta in metas.items():
        if meta.get("split") != data.split or meta.get("findings") != data.findings or meta.get("n_cases") != len(data):
            raise XBenchError(f"compare_with: {folder / model} holds split {meta.get('split')!r} with "
                              f"{meta.get('n_cases')} cases and classes {meta.get('findings')}; the maps are scored on "
                              f"split {data.split!r} with {len(data)} cases and classes {data.findings}")
    sizes = {meta.get("chunk_size") for meta in metas.values()}
    if len(sizes) != 1:
        raise XBenchError(f"compare_with: the stores under {folder} use different chunk sizes {sorted(sizes)}")
    return metas



def _copy_store_folder(source: Path, store: ResultStore, dataset: str, model: str) -> None:
    """Copy the files of another run's store folder into ``store``: regular files inside ``source`` only (a FIFO, a
    device or a link out is refused naming it, before a byte is copied), into a real folder of ``store``."""
    target = store.writable_folder(dataset, model)
    for file in sorted(source.iterdir()):
        regular_size(file, within=source)
        try:
            shutil.copyfile(file, target / file.name)
        except OSError as exc:
            raise OutputError(target / file.name, exc) from exc


def _as_mapset(maps: Any, *, case_ids, classes, probs) -> MapSet:
    if isinstance(maps, MapSet):
        return maps
    if isinstance(maps, (str, Path)):
        loaded = load_maps(maps, classes=classes if Path(maps).is_dir() else None)
        return loaded
    if case_ids is None:
        raise XBenchError("array maps need case_ids=[...] naming the case of each row")
    return MapSet(maps, list(case_ids), list(classes), probs)


def _class_index(data: Any, classes: list[str]) -> dict[str, int]:
    """Dataset finding → column of the map set; localized classes must all be present."""
    alias = {}
    for c in data.manifest.get("classes", []):
        for a in [c["name"], *c.get("aliases", [])]:
            alias[a] = c["name"]
    unknown = [c for c in classes if c not in alias]
    if unknown:
        raise XBenchError(f"class(es) {unknown} are not classes of {data.name} (classes: {data.findings})")
    index = {alias[c]: j for j, c in enumerate(classes)}
    localized = [c["name"] for c in data.manifest.get("classes", []) if c.get("localized", True)]
    missing = [c for c in localized if c not in index]
    if missing:
        raise XBenchError(f"no maps for class(es) {missing} of {data.name}: every class with regions needs a map")
    return index


def _to_float16(maps: np.ndarray) -> np.ndarray:
    half = maps.astype(np.float16)
    if np.array_equal(half.astype(np.float32), maps, equal_nan=True):
        return half
    flat = maps.reshape(len(maps), -1).astype(np.float64)
    lo, hi = flat.min(axis=1, keepdims=True), flat.max(axis=1, keepdims=True)
    span = np.where(hi > lo, hi - lo, 1.0)
    warnings.warn("maps were min–max normalised per map and stored as float16 (the results store's format): "
                  "normalised values move by ≤ 2^-11 relative, so a pixel that close to a threshold may change "
                  "sides", XBenchWarning, stacklevel=3)
    return ((flat - lo) / span).reshape(maps.shape).astype(np.float16)


def _write_store(cfg: RunConfig, data: Any, mapset: MapSet, index: dict[str, int], name: str) -> None:
    ids = data.cases["case_id"].astype(str).tolist()
    known = set(ids)
    extra = [c for c in mapset.case_ids if c not in known]
    if extra:
        raise XBenchError(f"{len(extra)} map case id(s) are not cases of {data.name} ({data.split}): {extra[:5]}")
    row_of = {c: i for i, c in enumerate(mapset.case_ids)}
    n_cls, (h, w) = len(data.findings), mapset.maps.shape[2:]
    cols = [index.get(f, -1) for f in data.findings]
    store = ResultStore(cfg.output_dir)
    info = {"model": name, "map_source": "user maps", "score_rule": "user probabilities" if mapset.probs is not None
            else "none (recognition not scored)", "input_size": "", "grid": f"{h}x{w}", "weights": "user maps",
            "verified": True}
    store.prepare(data.name, name, {"dataset": data.name, "split": data.split, "n_cases": len(data),
                                     "findings": data.findings, "model": name, "model_info": info, "grid": [h, w],
                                     "chunk_size": cfg.chunk_size, "source": "xbench.evaluate_maps"}, overwrite=True)
    half = _to_float16(mapset.maps.reshape(-1, h, w)).reshape(mapset.maps.shape)
    absent = 0
    for k in range(math.ceil(len(ids) / cfg.chunk_size)):
        chunk_ids = ids[k * cfg.chunk_size:(k + 1) * cfg.chunk_size]
        have = [c for c in chunk_ids if c in row_of]
        rows = [row_of[c] for c in have]
        maps = np.zeros((len(rows), n_cls, h, w), np.float16)
        probs = np.full((len(rows), n_cls), 0.5, np.float32)
        for i, j in enumerate(cols):
            if j >= 0:
                maps[:, i] = half[rows, j]
                if mapset.probs is not None:
                    probs[:, i] = mapset.probs[rows, j]
        skipped = {c: "no map supplied" for c in chunk_ids if c not in row_of}
        absent += len(skipped)
        store.write_chunk(data.name, name, k, case_ids=have, scores=probs, probs=probs,
                          maps=maps, skipped=skipped)
    if absent:
        warnings.warn(f"{absent} of {len(ids)} cases of {data.name} have no map: they are left out of every metric "
                      "and counted in the evaluation log", XBenchWarning, stacklevel=3)
    atomic_write_text(Path(cfg.output_dir) / "score_inputs.json", json.dumps(
        {"name": name, "dataset": data.name, "split": data.split, "cases_with_maps": len(ids) - absent,
         "cases_without_maps": absent, "classes": mapset.classes, "probs_given": mapset.probs is not None}, indent=1))
