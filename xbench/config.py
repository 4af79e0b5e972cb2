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
    map_dtype: float16              # float16 | float32 storage of the native-grid maps
    channels_last: false            # NHWC layout for CNN trunks (speed option)
    bootstrap: {replicates: 1000, seed: 0}

Relative ``output_dir`` and dataset ``root`` paths are resolved against the
current working directory.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from .errors import FormatError, MissingFileError
from .registry import read_yaml


def _boolean(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    raise ValueError(value)


@dataclass
class DatasetSpec:
    name: str
    root: str | None = None
    split: str | None = None
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class ModelSpec:
    """A model of a run. ``fit_split`` (baselines with a ``fit`` method, e.g. the anatomical prior):
    fit on that split of each dataset — it must differ from the evaluation split."""

    name: str
    weights: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    fit_split: str | None = None


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
    map_dtype: str = "float16"
    channels_last: bool = False
    bootstrap_replicates: int = 1000
    bootstrap_seed: int = 0
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
        known = {"output_dir", "datasets", "models", "grid", "fixed_threshold", "pointing_ties", "batch_size", "num_workers",
                 "precision", "device", "chunk_size", "on_missing_image", "bootstrap",
                 "decode_once", "cache_dir", "map_dtype", "channels_last"}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise FormatError(where, f"unknown key(s) {unknown}; known: {sorted(known)}")

        def spec(item: Any, kind: type, key: str) -> Any:
            if isinstance(item, str):
                return kind(name=item)
            if not isinstance(item, dict) or "name" not in item:
                raise FormatError(where, f"each entry needs a 'name', got {item!r}", field=key)
            extra = {k: v for k, v in item.items() if k not in kind.__dataclass_fields__}
            base = {k: v for k, v in item.items() if k in kind.__dataclass_fields__}
            if kind is DatasetSpec:
                base.setdefault("options", {}).update(extra)
            elif extra:
                raise FormatError(where, f"unknown model key(s) {sorted(extra)}", field=key)
            return kind(**base)

        boot = raw.get("bootstrap", {}) or {}
        if not isinstance(boot, dict) or set(boot) - {"replicates", "seed"}:
            raise FormatError(where, f"takes {{replicates, seed}}, got {boot!r}", field="bootstrap")
        def typed(key: str, convert: Any, default: Any, value: Any = None, kind: str | None = None) -> Any:
            raw_value = raw.get(key, default) if value is None else value
            try:
                return convert(raw_value)
            except (TypeError, ValueError):
                raise FormatError(where, f"cannot read {raw_value!r} as {kind or convert.__name__}",
                                  field=key) from None

        cfg = cls(
            output_dir=str(raw["output_dir"]),
            datasets=[spec(d, DatasetSpec, "datasets") for d in raw["datasets"]],
            models=[spec(m, ModelSpec, "models") for m in raw["models"]],
            grid=typed("grid", lambda g: tuple(int(x) for x in g), (224, 224), kind="[height, width] integers"),
            fixed_threshold=typed("fixed_threshold", float, 0.5),
            pointing_ties=str(raw.get("pointing_ties", "first")),
            batch_size=typed("batch_size", int, 32),
            num_workers=typed("num_workers", int, 0),
            precision=str(raw.get("precision", "fp32")),
            device=str(raw.get("device", "cpu")),
            chunk_size=typed("chunk_size", int, 256),
            on_missing_image=str(raw.get("on_missing_image", "raise")),
            decode_once=typed("decode_once", _boolean, True, kind="true or false"),
            cache_dir=None if raw.get("cache_dir") is None else str(raw["cache_dir"]),
            map_dtype=str(raw.get("map_dtype", "float16")),
            channels_last=typed("channels_last", _boolean, False, kind="true or false"),
            bootstrap_replicates=typed("bootstrap", int, None, boot.get("replicates", 1000)),
            bootstrap_seed=typed("bootstrap", int, None, boot.get("seed", 0)),
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
            (self.on_missing_image in ("raise", "skip"), "on_missing_image", "must be 'raise' or 'skip'"),
            (0.0 <= self.fixed_threshold <= 1.0, "fixed_threshold", "must lie in [0, 1]"),
            (len(self.grid) == 2 and min(self.grid) > 0, "grid", "must be [height, width] > 0"),
            (self.batch_size > 0 and self.chunk_size > 0, "batch_size", "batch_size and chunk_size must be > 0"),
        ]
        for ok, key, msg in checks:
            if not ok:
                raise FormatError(where, f"{msg}, got {getattr(self, key)!r}", field=key)

    def resolved_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
