"""Run configuration: one YAML names datasets, models, grid, thresholds, batching and output.

Example (``xbench/configs/runs/phantom.yaml``)::

    output_dir: results/phantom
    datasets:
      - {name: phantom, split: test}
    models:
      - {name: ref_xattn}
      - {name: clip}                # weights: null → $XBENCH_WEIGHTS/clip or random-init (labelled)
      - {name: anatomical_prior, fit_split: prior}   # fitted on a disjoint split of each dataset
    grid: [224, 224]                # evaluation grid (GT rasterised here, maps upsampled here)
    fixed_threshold: 0.5
    pointing_ties: first            # first | any
    batch_size: 32
    num_workers: 0
    precision: fp32                 # fp32 | tf32 | fp16 | bf16 (fp32: TF32 off on CUDA; fp16/bf16: autocast, CUDA only)
    device: cpu                     # cpu | cuda | cuda:1 | auto
    chunk_size: 256                 # cases per store chunk (resume granularity)
    on_missing_image: raise         # raise | skip (counted in run_log.json)
    decode_once: true               # decode each image once for all models (xbench/cache.py); false: per model
    cache_dir: null                 # persistent decode cache folder (null: in memory for the run)
    preprocess_device: auto         # auto: the run device if CUDA, else cpu | cpu | device: where models' resizes run
    map_dtype: float16              # float16 | float32 storage of the native-grid maps
    channels_last: false            # NHWC layout for CNN trunks (speed option)
    bootstrap: {replicates: 1000, seed: 0}
    allow_random_init: false        # true: models without weights may run random-init (labelled); the phantom opts in

Every key is typed and checked when the file is read (:class:`~xbench.errors.FormatError`
naming file and field): integers must be integers (``batch_size: 4.7`` is an error, not 4),
``fixed_threshold`` a number, ``datasets`` / ``models`` non-empty lists, ``output_dir`` a
non-empty path. Dataset keys other than ``name, root, split`` are the loader's keyword options:
an unknown one is an error with "did you mean"; a model's ``params`` must be keys of its YAML's
``params:`` section (the declared parameter set). A model entry may say ``optional: true``: when
its weights are absent it is left out of the run (one log line, a note in ``models.csv``) instead
of failing it. A model that would run random-init (no weights, ``random_init`` in its params) is
refused unless the run sets ``allow_random_init: true`` or the entry sets ``params: {random_init: true}``.

Relative ``output_dir`` and dataset ``root`` paths are resolved against the
current working directory.
"""
from __future__ import annotations

import difflib
import inspect
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from .datasets import BaseDataset, load_dataset
from .errors import FormatError, MissingFileError, XBenchError
from .registry import dataset_manifest, import_target, model_config, read_yaml

#: keys of a run config and of its dataset / model entries
RUN_KEYS = ("output_dir", "datasets", "models", "grid", "fixed_threshold", "pointing_ties", "batch_size", "num_workers",
            "precision", "device", "chunk_size", "on_missing_image", "bootstrap", "allow_random_init",
            "decode_once", "cache_dir", "map_dtype", "channels_last", "preprocess_device")
DATASET_KEYS = ("name", "root", "split")
MODEL_KEYS = ("name", "weights", "params", "fit_split", "optional")
_DEVICE = re.compile(r"^(cpu|auto|mps|cuda(:\d+)?)$")


@dataclass
class DatasetSpec:
    name: str
    root: str | None = None
    split: str | None = None
    options: dict[str, Any] = field(default_factory=dict)

    def open(self, split: str | None = None) -> BaseDataset:
        """The dataset this spec names (``split`` overrides the spec's, e.g. a baseline's ``fit_split``)."""
        return load_dataset(self.name, root=self.root, split=split or self.split, **self.options)


@dataclass
class ModelSpec:
    """A model of a run. ``fit_split`` (baselines with a ``fit`` method, e.g. the anatomical prior):
    fit on that split of each dataset — it must differ from the evaluation split. ``optional``: left out
    of the run (with a note) when its weights are absent, instead of failing the run."""

    name: str
    weights: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    fit_split: str | None = None
    optional: bool = False


def _did_you_mean(word: str, known: list[str]) -> str:
    close = difflib.get_close_matches(word, known, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _unknown(where: str, what: str, keys: list[str], known: list[str], field_name: str) -> FormatError:
    hints = "; ".join(f"{k!r}{_did_you_mean(k, known)}" for k in keys)
    return FormatError(where, f"unknown {what} {hints}; known: {', '.join(known) or '(none)'}", field=field_name)


def _check_type(where: str, field_name: str, value: Any, kind: str) -> Any:
    """``value`` if it is of ``kind`` (int | float | bool | str | path), else FormatError naming the field."""
    ok = {
        "int": isinstance(value, int) and not isinstance(value, bool),
        "float": isinstance(value, (int, float)) and not isinstance(value, bool),
        "bool": isinstance(value, bool),
        "str": isinstance(value, str) and value != "",
        "path": isinstance(value, (str, Path)) and str(value).strip() != "",
    }[kind]
    if not ok:
        expected = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a non-empty string",
                    "path": "a non-empty path"}[kind]
        raise FormatError(where, f"must be {expected}, got {value!r} ({type(value).__name__})", field=field_name)
    return float(value) if kind == "float" else value


def dataset_options(name: str) -> dict[str, inspect.Parameter]:
    """Keyword options a dataset's loader takes (beyond ``root``, ``split``, ``manifest``), with their defaults."""
    cls = import_target(dataset_manifest(name)["class"])
    params = inspect.signature(cls.__init__).parameters
    return {k: p for k, p in params.items()
            if k not in ("self", "root", "split", "manifest") and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}


def _typed_like(where: str, field_name: str, value: Any, default: Any) -> None:
    """A value must have the type of a declared default (bool ↔ bool, int ↔ int, number ↔ number, str ↔ str)."""
    if default is None or value is None or isinstance(default, (list, dict)):
        return
    kind = "bool" if isinstance(default, bool) else "int" if isinstance(default, int) else \
        "float" if isinstance(default, float) else "str" if isinstance(default, str) else None
    if kind == "str" and isinstance(value, str):
        return
    if kind is not None:
        _check_type(where, field_name, value, kind)


_SIMPLE = {"int": "int", "float": "float", "bool": "bool", "str": "str", "Path": "path"}


def _annotation_allows(where: str, field_name: str, value: Any, annotation: Any) -> bool:
    """Check ``value`` against a simple annotation such as ``"int | None"``; False when it is not simple."""
    names = [n.strip() for n in str(annotation).split("|")] if isinstance(annotation, str) else []
    kinds = [n for n in names if n != "None"]
    if not names or any(n not in _SIMPLE for n in kinds):
        return False
    if value is None and "None" in names:
        return True
    for n in kinds:
        try:
            _check_type(where, field_name, value, _SIMPLE[n])
            return True
        except FormatError:
            continue
    if kinds:
        _check_type(where, field_name, value, _SIMPLE[kinds[0]])  # raises, naming the first expected type
    return True


def _entry(where: str, item: Any, field_name: str) -> dict[str, Any]:
    """A ``datasets`` / ``models`` list entry as a dict: a bare name is ``{name: ...}``; no name is an error."""
    if isinstance(item, str) and item:
        item = {"name": item}
    if not isinstance(item, dict) or "name" not in item:
        raise FormatError(where, f"each entry needs a 'name', got {item!r}", field=field_name)
    return item


def _dataset_spec(where: str, item: Any, index: int) -> DatasetSpec:
    key = f"datasets[{index}]"
    item = _entry(where, item, "datasets")
    name = _check_type(where, f"{key}.name", item["name"], "str")
    dataset_manifest(name)  # unknown name → UnknownNameError with "did you mean"
    options = {k: v for k, v in item.items() if k not in DATASET_KEYS}
    declared = dataset_options(name)
    unknown = sorted(set(options) - set(declared))
    if unknown:
        raise _unknown(where, f"key(s) of dataset {name!r}:", unknown, [*DATASET_KEYS, *sorted(declared)], key)
    for k, v in options.items():
        default = declared[k].default
        if not _annotation_allows(where, f"{key}.{k}", v, declared[k].annotation):
            _typed_like(where, f"{key}.{k}", v, None if default is inspect.Parameter.empty else default)
    for k in ("root", "split"):
        if item.get(k) is not None:
            _check_type(where, f"{key}.{k}", item[k], "path" if k == "root" else "str")
    split = item.get("split")
    splits = dataset_manifest(name).get("splits") or {}
    if split is not None and split not in splits:
        raise FormatError(where, f"dataset {name!r} has no split {split!r}{_did_you_mean(split, sorted(splits))}; "
                          f"splits: {', '.join(sorted(splits))}", field=f"{key}.split")
    return DatasetSpec(name=name, root=None if item.get("root") is None else str(item["root"]), split=split,
                       options=options)


def _model_spec(where: str, item: Any, index: int) -> ModelSpec:
    key = f"models[{index}]"
    item = _entry(where, item, "models")
    extra = sorted(set(item) - set(MODEL_KEYS))
    if extra:
        raise FormatError(where, f"unknown model key(s) {extra}" + "".join(_did_you_mean(k, list(MODEL_KEYS)) for k in extra)
                          + f"; known: {', '.join(MODEL_KEYS)}", field="models")
    name = _check_type(where, f"{key}.name", item["name"], "str")
    declared = model_config(name).get("params") or {}  # unknown name → UnknownNameError with "did you mean"
    params = item.get("params") or {}
    if not isinstance(params, dict):
        raise FormatError(where, f"params must be a mapping, got {params!r}", field=f"{key}.params")
    unknown = sorted(set(params) - set(declared))
    if unknown:
        raise _unknown(where, f"param(s) of model {name!r}:", unknown, sorted(declared), f"{key}.params")
    for k, v in params.items():
        _typed_like(where, f"{key}.params.{k}", v, declared[k])
    weights = item.get("weights")
    if weights is not None:
        _check_type(where, f"{key}.weights", weights, "path")
    fit_split = item.get("fit_split")
    if fit_split is not None:
        _check_type(where, f"{key}.fit_split", fit_split, "str")
    optional = _check_type(where, f"{key}.optional", item.get("optional", False), "bool")
    return ModelSpec(name=name, weights=None if weights is None else str(weights), params=dict(params),
                     fit_split=fit_split, optional=optional)


@dataclass
class RunConfig:
    output_dir: str
    datasets: list[DatasetSpec]
    models: list[ModelSpec]
    grid: tuple[int, int] = (224, 224)
    fixed_threshold: float = 0.5
    pointing_ties: str = "first"
    batch_size: int = 32
    num_workers: int = 0
    precision: str = "fp32"
    device: str = "cpu"
    chunk_size: int = 256
    on_missing_image: str = "raise"
    decode_once: bool = True
    cache_dir: str | None = None
    preprocess_device: str = "auto"
    map_dtype: str = "float16"
    channels_last: bool = False
    bootstrap_replicates: int = 1000
    bootstrap_seed: int = 0
    allow_random_init: bool = False
    source: str | None = None

    @classmethod
    def from_yaml(cls, path: str | Path, **overrides: Any) -> "RunConfig":
        if not Path(path).is_file():
            raise MissingFileError(path, "run config")
        raw = read_yaml(path)
        raw.update({k: v for k, v in overrides.items() if v is not None})
        return cls.from_dict(raw, source=str(path))

    @classmethod
    def from_dict(cls, raw: dict[str, Any], source: str | None = None) -> "RunConfig":
        where = source or "<config>"
        for key in ("output_dir", "datasets", "models"):
            if key not in raw:
                raise FormatError(where, "missing required key", field=key)
        unknown = sorted(set(raw) - set(RUN_KEYS))
        if unknown:
            raise _unknown(where, "key(s)", unknown, sorted(RUN_KEYS), unknown[0])
        for key in ("datasets", "models"):
            if not isinstance(raw[key], list) or not raw[key]:
                raise FormatError(where, f"must be a non-empty list of {key} (e.g. [{'phantom' if key == 'datasets' else 'center_prior'}]), "
                                  f"got {raw[key]!r}", field=key)
        boot = raw.get("bootstrap", {}) or {}
        if not isinstance(boot, dict) or set(boot) - {"replicates", "seed"}:
            raise FormatError(where, f"takes {{replicates, seed}}, got {boot!r}", field="bootstrap")
        grid = raw.get("grid", [224, 224])
        if not isinstance(grid, (list, tuple)):
            raise FormatError(where, f"must be [height, width] integers, got {grid!r}", field="grid")
        for g in grid:
            _check_type(where, "grid", g, "int")

        def get(key: str, default: Any, kind: str) -> Any:
            return _check_type(where, key, raw.get(key, default), kind)

        cfg = cls(
            output_dir=str(get("output_dir", None, "path")),
            datasets=[_dataset_spec(where, d, i) for i, d in enumerate(raw["datasets"])],
            models=[_model_spec(where, m, i) for i, m in enumerate(raw["models"])],
            grid=tuple(grid),
            fixed_threshold=get("fixed_threshold", 0.5, "float"),
            pointing_ties=get("pointing_ties", "first", "str"),
            batch_size=get("batch_size", 32, "int"),
            num_workers=get("num_workers", 0, "int"),
            precision=get("precision", "fp32", "str"),
            device=get("device", "cpu", "str"),
            chunk_size=get("chunk_size", 256, "int"),
            on_missing_image=get("on_missing_image", "raise", "str"),
            bootstrap_replicates=_check_type(where, "bootstrap", boot.get("replicates", 1000), "int"),
            bootstrap_seed=_check_type(where, "bootstrap", boot.get("seed", 0), "int"),
            allow_random_init=get("allow_random_init", False, "bool"),
            decode_once=get("decode_once", True, "bool"),
            cache_dir=None if raw.get("cache_dir") is None else str(get("cache_dir", None, "path")),
            preprocess_device=get("preprocess_device", "auto", "str"),
            map_dtype=get("map_dtype", "float16", "str"),
            channels_last=get("channels_last", False, "bool"),
            source=source,
        )
        cfg.validate()
        return cfg

    def validate(self) -> None:
        where = self.source or "<config>"
        checks = [
            (self.pointing_ties in ("first", "any"), "pointing_ties", "must be 'first' or 'any'"),
            (self.precision in ("fp32", "tf32", "fp16", "bf16"), "precision", "must be fp32, tf32, fp16 or bf16"),
            (self.map_dtype in ("float16", "float32"), "map_dtype", "must be float16 or float32"),
            (self.preprocess_device in ("auto", "cpu", "device"), "preprocess_device", "must be 'auto', 'cpu' or 'device'"),
            (self.on_missing_image in ("raise", "skip"), "on_missing_image", "must be 'raise' or 'skip'"),
            (0.0 <= self.fixed_threshold <= 1.0, "fixed_threshold", "must lie in [0, 1]"),
            (len(self.grid) == 2 and min(self.grid) > 0, "grid", "must be [height, width] > 0"),
            (self.batch_size > 0 and self.chunk_size > 0, "batch_size", "batch_size and chunk_size must be > 0"),
            (self.num_workers >= 0, "num_workers", "must be >= 0"),
            (bool(_DEVICE.match(self.device)), "device", "must be cpu, cuda, cuda:N, mps or auto"),
            (self.bootstrap_replicates >= 0, "bootstrap_replicates", "bootstrap replicates must be >= 0"),
        ]
        for ok, key, msg in checks:
            if not ok:
                raise FormatError(where, f"{msg}, got {getattr(self, key)!r}", field=key)

    def resolved_device(self) -> torch.device:
        """The torch device; ``cuda`` asked for on a machine without CUDA is a clear :class:`XBenchError`."""
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        device = torch.device(self.device)
        if device.type == "cuda":
            if not torch.cuda.is_available():
                raise XBenchError(f"device {self.device!r} was asked for ({self.source or 'config'} or --device) but torch "
                                  "sees no CUDA device here; use --device cpu (or auto)")
            if device.index is not None and device.index >= torch.cuda.device_count():
                raise XBenchError(f"device {self.device!r}: only {torch.cuda.device_count()} CUDA device(s) are visible")
        return device

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
