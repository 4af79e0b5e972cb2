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
    num_workers: 0                  # decoding processes (forked, a pipe each; 0: in this process)
    eval_workers: auto              # evaluation processes: auto = min(CPUs, 8 × dataset × model pairs) | 0 or 1: serial
    precision: fp32                 # fp32 | tf32 | fp16 | bf16 (fp32: TF32 off on CUDA; fp16/bf16: autocast, CUDA only)
    device: cpu                     # cpu | cuda | cuda:1 | auto
    chunk_size: 256                 # cases per store chunk (resume granularity)
    on_missing_image: raise         # raise | skip (counted in run_log.json)
    decode_once: true               # decode each image once for all models (xbench/inference/input_feed.py); false: per model
    cache_dir: null                 # persistent decode cache folder (null: in memory for the run)
    preprocess_device: auto         # auto: the run device if CUDA, else cpu | cpu | device: where models' resizes run
    decode_ahead: auto              # auto: on if the run device is CUDA | true | false: decode while networks build / the previous dataset infers
    eval_process: auto              # auto: on if the run device is CUDA | true | false: the overlapped evaluation runs in a process of its own
    map_dtype: float16              # float16 | float32 storage of the native-grid maps
    channels_last: false            # NHWC layout for CNN trunks (speed option)
    bootstrap: {replicates: 1000, seed: 0}
    allow_random_init: false        # true: models without weights may run random-init (labelled); the phantom opts in

Every key is typed and checked when the file is read, by the one schema mechanism of every XBench
YAML (:mod:`xbench.spec.schema`; :class:`~xbench.core.errors.FormatError` naming file and field, unknown keys
with "did you mean"): integers must be integers (``batch_size: 4.7`` is an error, not 4),
``fixed_threshold`` a number, ``datasets`` / ``models`` non-empty lists, ``output_dir`` a
non-empty path. Dataset keys other than ``name, root, split`` are the loader's keyword options:
an unknown one is an error with "did you mean"; a model's ``params`` must be keys of its YAML's
``params:`` section (the declared parameter set). A model entry may say ``explainer: NAME`` (the saliency method of its maps) and ``optional: true``: when
its weights are absent it is left out of the run (one log line, a note in ``models.csv``) instead
of failing it. ``explainer: gradcam`` (one of :data:`xbench.spec.registry.EXPLAINERS`) replaces the model's own maps by
a post-hoc explainer's; the entry is stored and reported as ``<name>+<explainer>`` (``kad+gradcam``), beside a
plain ``{name: kad}`` entry if there is one. A model that would run random-init (no weights, ``random_init`` in its params) is
refused unless the run sets ``allow_random_init: true`` or the entry sets ``params: {random_init: true}``.

``eval_workers`` is the number of processes that rasterise ground truth and evaluate the (dataset, model)
pairs (spawned, one BLAS / torch thread each; ``auto``: ``min(os.cpu_count(), 8 × pairs)``, room for a large
pair's steps; ``0`` or ``1``: serial, in the calling process). The tables are byte-identical for every value (:func:`xbench.evaluation.evaluate.evaluate_run`).

``eval_process``: where the evaluation that overlaps inference (:func:`xbench.workflows.run.run`) is coordinated.
``true``: in a process of its own (:class:`xbench.workflows.evaluation_process.EvaluationProcess`), so its threads do
not share the interpreter lock of the process that feeds the GPU; ``false``: in threads of the run's process;
``auto`` (default): a process of its own when the run device is CUDA. The tables are the same bytes either way.

Relative ``output_dir`` and dataset ``root`` paths are resolved against the
current working directory.
"""
from __future__ import annotations

import inspect
import re
import typing
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..core.errors import FormatError, XBenchError
from ..core.summary import brief
from .registry import EXPLAINERS, dataset_manifest, import_target, model_config, read_yaml
from .schema import check_type, check_value, did_you_mean, fields_of, load as load_schema, unknown_keys

_DEVICE = re.compile(r"^(cpu|auto|mps|cuda(:\d+)?)$")
#: Largest side of the evaluation grid: maps are held as (cases × classes × height × width) arrays in memory and in
#: the store; 4096² float16 maps are already 32 MiB per class and case.
MAX_GRID_SIDE = 4096


@dataclass
class DatasetSpec:
    name: str
    root: str | None = field(default=None, metadata={"kind": "path"})
    split: str | None = None
    options: dict[str, Any] = field(default_factory=dict, metadata={"internal": True})



@dataclass
class ModelSpec:
    """A model of a run. ``fit_split`` (baselines with a ``fit`` method, e.g. the anatomical prior):
    fit on that split of each dataset — it must differ from the evaluation split. ``optional``: left out
    of the run (with a note) when its weights are absent, instead of failing the run. ``explainer``:
    the saliency method used for this model's maps (None: the model's own map)."""

    __schema_what__ = "model key(s)"

    name: str
    weights: str | None = field(default=None, metadata={"kind": "path"})
    params: dict[str, Any] = field(default_factory=dict)
    fit_split: str | None = None
    optional: bool = False
    explainer: str | None = None

    @property
    def label(self) -> str:
        """The name the run stores and reports this entry under: ``name``, or ``name+explainer`` when a post-hoc
        explainer (:mod:`xbench.explain`) makes the maps (``kad+gradcam``)."""
        return f"{self.name}+{self.explainer}" if self.explainer else self.name


def dataset_options(name: str) -> dict[str, inspect.Parameter]:
    """Keyword options a dataset's loader takes (beyond ``root``, ``split``, ``manifest``), with their defaults."""
    cls = import_target(dataset_manifest(name)["class"])
    params = inspect.signature(cls.__init__).parameters
    return {k: p for k, p in params.items()
            if k not in ("self", "root", "split", "manifest") and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}


def _typed_like(where: str, field_name: str, value: Any, default: Any) -> None:
    """A value must have the type of a declared default (bool ↔ bool, int ↔ int, number ↔ number, str ↔ str); a
    mapping default takes a mapping of its own keys, each value typed like the default's; a list default takes a
    list whose items are typed like the default's first item."""
    if default is None or value is None:
        return
    if isinstance(default, dict):
        if not isinstance(value, dict):
            raise FormatError(where, f"must be a mapping like {default!r}, got a {type(value).__name__}",
                              field=field_name)
        unknown = sorted(map(str, set(value) - set(default)))
        if unknown:
            raise unknown_keys(where, f"key(s) of {field_name}:", unknown, sorted(map(str, default)), field_name)
        for k, v in value.items():
            _typed_like(where, f"{field_name}.{k}", v, default[k])
        return
    if isinstance(default, (list, tuple)):
        if not isinstance(value, list):
            raise FormatError(where, f"must be a list, got a {type(value).__name__}", field=field_name)
        for i, v in enumerate(value):
            _typed_like(where, f"{field_name}[{i}]", v, default[0] if default else None)
        return
    kind = "bool" if isinstance(default, bool) else "int" if isinstance(default, int) else \
        "float" if isinstance(default, float) else "str" if isinstance(default, str) else None
    if kind == "str" and isinstance(value, str):
        return
    if kind is not None:
        check_type(where, field_name, value, kind)


def _loader_hints(name: str) -> dict[str, Any]:
    """Resolved annotations of a dataset loader's ``__init__`` ({} when they cannot be resolved)."""
    try:
        return typing.get_type_hints(import_target(dataset_manifest(name)["class"]).__init__)
    except Exception:  # annotations naming types the module does not import at run time
        return {}


def _entry(where: str, item: Any, field_name: str) -> dict[str, Any]:
    """A ``datasets`` / ``models`` list entry as a dict: a bare name is ``{name: ...}``; no name is an error."""
    if isinstance(item, str) and item:
        item = {"name": item}
    if not isinstance(item, dict) or "name" not in item:
        raise FormatError(where, f"each entry needs a 'name', got {item!r}", field=field_name)
    return item


def check_dataset_options(name: str, options: dict[str, Any], where: str) -> None:
    """Keyword ``options`` of dataset ``name`` checked as a run config's dataset entry is (names, types);
    :class:`FormatError` naming ``where`` and the option."""
    _dataset_spec(where, {"name": name, **options}, 0, key="")


def _dataset_spec(where: str, item: Any, index: int, key: str | None = None) -> DatasetSpec:
    key = f"datasets[{index}]" if key is None else key
    item = _entry(where, item, "datasets")
    name = check_type(where, f"{key}.name", item["name"], "str")
    dataset_manifest(name)  # unknown name → UnknownNameError with "did you mean"
    keys = fields_of(DatasetSpec)
    options = {k: v for k, v in item.items() if k not in keys}
    declared = dataset_options(name)
    unknown = sorted(set(options) - set(declared))
    if unknown:
        raise unknown_keys(where, f"key(s) of dataset {name!r}:", unknown, [*keys, *sorted(declared)], key)
    hints = _loader_hints(name)
    for k, v in options.items():
        try:
            check_value(where, f"{key}.{k}".lstrip("."), v, hints[k])
        except (KeyError, TypeError):  # no usable annotation: the default's type
            default = declared[k].default
            _typed_like(where, f"{key}.{k}".lstrip("."), v, None if default is inspect.Parameter.empty else default)
    spec = load_schema(DatasetSpec, {k: v for k, v in item.items() if k in keys}, where, key)
    splits = dataset_manifest(name).get("splits") or {}
    if spec.split is not None and spec.split not in splits:
        raise FormatError(where, f"dataset {name!r} has no split {spec.split!r}{did_you_mean(spec.split, sorted(splits))}; "
                          f"splits: {', '.join(sorted(splits))}", field=f"{key}.split")
    spec.root = None if spec.root is None else str(spec.root)
    spec.options = options
    return spec


def _model_spec(where: str, item: Any, index: int) -> ModelSpec:
    key = f"models[{index}]"
    item = _entry(where, item, "models")
    if item.get("params", {}) is None:  # `params:` with nothing after it: none
        item = {**item, "params": {}}
    spec = load_schema(ModelSpec, item, where, key)
    declared = model_config(spec.name).get("params") or {}  # unknown name → UnknownNameError with "did you mean"
    unknown = sorted(set(spec.params) - set(declared))
    if unknown:
        raise unknown_keys(where, f"param(s) of model {spec.name!r}:", unknown, sorted(declared), f"{key}.params")
    for k, v in spec.params.items():
        _typed_like(where, f"{key}.params.{k}", v, declared[k])
    spec.weights = None if spec.weights is None else str(spec.weights)
    if spec.explainer is not None:
        if spec.explainer not in EXPLAINERS:
            raise unknown_keys(where, "explainer", [spec.explainer], sorted(EXPLAINERS), f"{key}.explainer")
    return spec


def _entries(parse: Any, what: str, example: str) -> Any:
    """A schema ``parse`` for the ``datasets`` / ``models`` lists: non-empty, each entry through ``parse``."""
    def parse_list(where: str, field_name: str, value: Any) -> list[Any]:
        if not isinstance(value, list) or not value:
            raise FormatError(where, f"must be a non-empty list of {what} (e.g. [{example}]), got {value!r}",
                              field=field_name)
        return [parse(where, item, i) for i, item in enumerate(value)]
    return parse_list


@dataclass
class RunConfig:
    """A run config; its fields are the YAML's keys (``bootstrap_*``: the ``bootstrap:`` mapping), read by
    :func:`xbench.load_schema` (unknown keys with "did you mean", missing keys, types)."""

    output_dir: str = field(metadata={"kind": "path"})
    datasets: list[DatasetSpec] = field(metadata={"parse": _entries(_dataset_spec, "datasets", "phantom")})
    models: list[ModelSpec] = field(metadata={"parse": _entries(_model_spec, "models", "center_prior")})
    grid: tuple[int, int] = (224, 224)
    fixed_threshold: float = 0.5
    pointing_ties: str = "first"
    batch_size: int = 32
    num_workers: int = 0
    eval_workers: int | str = "auto"
    precision: str = "fp32"
    device: str = "cpu"
    chunk_size: int = 256
    on_missing_image: str = "raise"
    decode_once: bool = True
    cache_dir: str | None = field(default=None, metadata={"kind": "path"})
    preprocess_device: str = "auto"
    decode_ahead: bool | str = "auto"
    eval_process: bool | str = "auto"
    map_dtype: str = "float16"
    channels_last: bool = False
    bootstrap_replicates: int = field(default=1000, metadata={"key": "bootstrap.replicates"})
    bootstrap_seed: int = field(default=0, metadata={"key": "bootstrap.seed"})
    allow_random_init: bool = False
    source: str | None = field(default=None, metadata={"internal": True})

    @classmethod
    def from_yaml(cls, path: str | Path, **overrides: Any) -> "RunConfig":
        from .run_configs import resolve_run_config

        path = resolve_run_config(path)  # a path, or a shipped config's name (``phantom``, ``paper``)
        raw = read_yaml(path)
        raw.update({k: v for k, v in overrides.items() if v is not None})
        return cls.from_dict(raw, source=str(path))

    @classmethod
    def from_dict(cls, raw: dict[str, Any], source: str | None = None) -> "RunConfig":
        cfg = load_schema(cls, raw, source or "<config>")
        cfg.output_dir = str(cfg.output_dir)
        cfg.cache_dir = None if cfg.cache_dir is None else str(cfg.cache_dir)
        cfg.source = source
        cfg.validate()
        return cfg

    def validate(self) -> None:
        where = self.source or "<config>"
        checks = [
            (self.pointing_ties in ("first", "any"), "pointing_ties", "must be 'first' or 'any'"),
            (self.precision in ("fp32", "tf32", "fp16", "bf16"), "precision", "must be fp32, tf32, fp16 or bf16"),
            (self.map_dtype in ("float16", "float32"), "map_dtype", "must be float16 or float32"),
            (self.preprocess_device in ("auto", "cpu", "device"), "preprocess_device", "must be 'auto', 'cpu' or 'device'"),
            (self.decode_ahead in (True, False, "auto"), "decode_ahead", "must be auto, true or false"),
            (self.eval_process in (True, False, "auto"), "eval_process", "must be auto, true or false"),
            (self.on_missing_image in ("raise", "skip"), "on_missing_image", "must be 'raise' or 'skip'"),
            (0.0 <= self.fixed_threshold <= 1.0, "fixed_threshold", "must lie in [0, 1]"),
            (len(self.grid) == 2 and 0 < min(self.grid) and max(self.grid) <= MAX_GRID_SIDE, "grid",
             f"must be [height, width], each in 1..{MAX_GRID_SIDE}"),
            (self.batch_size > 0, "batch_size", "must be > 0"),
            (self.chunk_size > 0, "chunk_size", "must be > 0"),
            (self.num_workers >= 0, "num_workers", "must be >= 0"),
            (self.eval_workers == "auto" or (isinstance(self.eval_workers, int) and self.eval_workers >= 0),
             "eval_workers", "must be 'auto' or an integer >= 0"),
            (bool(_DEVICE.match(self.device)), "device", "must be cpu, cuda, cuda:N, mps or auto"),
            (self.bootstrap_replicates >= 0, "bootstrap_replicates", "bootstrap replicates must be >= 0"),
        ]
        for key in ("output_dir", "cache_dir"):
            value = getattr(self, key)
            if value is not None and "\x00" in str(value):
                checks.append((False, key, "a path may not hold a NUL character"))
        if self.cache_dir is not None and Path(self.cache_dir).exists() and not Path(self.cache_dir).is_dir():
            checks.append((False, "cache_dir", "must name a folder (or a path to create one); it is not a folder"))
        for ok, key, msg in checks:
            if not ok:
                raise FormatError(where, f"{msg}, got {brief(getattr(self, key))}", field=key)

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
