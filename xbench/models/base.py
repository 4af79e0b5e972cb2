"""The adapter contract every model follows, and the one factory door.

An adapter wraps one model's *inference path* and exposes

* ``preprocess(image) -> (3, S, S) float tensor`` — the model's official
  resolution, normalisation and grey→RGB handling, from an XBench image
  (float32 ``(H, W)`` in [0, 1] at original size);
* ``predict(pixels, prompts) -> Prediction`` — class scores ``(B, C)`` and raw
  saliency maps ``(B, C, h, w)`` at the model's native grid, in one forward pass;
* ``scores`` / ``saliency`` — thin views of ``predict``;
* ``to_probability(scores)`` — how a score becomes a probability for F1 / accuracy
  (identity for probability heads, sigmoid for raw logits);
* ``reads_pixels`` (class attribute, default True) — False only for a model whose ``predict`` reads nothing of
  ``pixels`` but the batch size (the centre and anatomical priors); the decode-once feed then decodes nothing for
  it and passes zeros of its input shape;
* facts, copied from the model's YAML (``xbench/configs/models/<name>.yaml``, the only
  place they are written): ``name``, ``map_source`` (``"similarity"``, ``"cross-attention"``
  or ``"prior"``), ``score_rule`` (``"probability"``, ``"logit"``, ``"constant"``,
  ``"random"``), ``input_size``, ``grid``, ``verified``, ``citation`` and ``weights_source``.

Building: :meth:`Adapter.from_config` is the one builder (final). It resolves the weight
files the YAML names, chooses official weights / explicit random init / a
:class:`MissingFileError` naming file and publisher, and calls the two hooks every adapter
implements, ``_load(files, config, device)`` and ``_random(files, config, device)``
(``docs/extending.md``). :meth:`Adapter.from_checkpoint` is the one in-memory constructor (a loaded
checkpoint object → adapter); facts are never restated or overwritten in an adapter's code, and where the
network fixes one (a patch grid) the adapter checks it with :meth:`Adapter.check_fact`.

``prompts`` are the prompt names that a dataset manifest gives for its classes
(``"pleural effusion"``); each adapter turns them into its own official text
input (templates, entity lookup) and documents how it handles unseen classes.

Weights are local only: ``create_model(name, weights=DIR)``; without ``weights``
the folder ``$XBENCH_WEIGHTS/<name>`` is used. Checkpoints are read with
:mod:`xbench.models.checkpoint` (safetensors, or a restricted unpickler for torch archives), never
by executing pickled code.
"""
from __future__ import annotations

import logging
import os
import warnings
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, final

import numpy as np
import torch

from ..core.errors import CheckpointError, FormatError, MissingFileError, XBenchError
from ..spec.registry import PACKAGE_DIR, import_target, list_models, model_config


@dataclass
class Prediction:
    """Output of :meth:`Adapter.predict`: ``scores (B, C)`` and ``maps (B, C, h, w)`` float32 on CPU."""

    scores: torch.Tensor
    maps: torch.Tensor


class Adapter(ABC):
    """Base class of model adapters (see the module docstring for the contract).

    Facts (``name``, ``map_source``, ``score_rule``, ``input_size``, ``grid``, ``verified``, ``citation``,
    ``weights_source``) are instance attributes copied from the model's YAML by :meth:`__init__`; they are
    never written in the adapter's code. An adapter built directly (tests, :meth:`from_checkpoint`)
    with a partial config gets the missing facts from the YAML named by its class's :attr:`config_name`.
    """

    config_name: ClassVar[str] = ""  # registry entry whose YAML describes this class when built directly
    #: False when ``predict`` / ``predict_cases`` read nothing of ``pixels`` but the batch size (the center and
    #: anatomical priors): the decode-once feed then computes no input for the model and passes zeros of its
    #: ``preprocess`` output's shape (stores are the same bytes; the model's maps and scores ignore the pixels).
    reads_pixels: ClassVar[bool] = True
    #: The GPU kernel that computes :meth:`preprocess` from the image's 8- or 16-bit codes: ``"square"`` (resize to
    #: ``input_size`` with the module's ``resize_uint8``, then normalise), ``"carzero"``, ``"gloria"`` (CARZero's
    #: pipeline at the adapter's ``resize``) or ``"open_clip"`` (read off the adapter's transform). None: preprocessing stays on the CPU. A declared kernel is used only once it is
    #: proven equal to :meth:`preprocess` (:func:`xbench.inference.gpu_preprocess.check_plan`).
    gpu_preprocess: ClassVar[str | None] = None

    def __init_subclass__(cls, **kwargs: Any):
        super().__init_subclass__(**kwargs)
        if "from_config" in vars(cls):
            raise TypeError(f"{cls.__name__} overrides Adapter.from_config; implement _load / _random instead")

    def __init__(self, config: Mapping[str, Any] | None = None, device: str | torch.device = "cpu"):
        self.config: dict[str, Any] = with_yaml_facts(type(self).config_name, config)
        facts = self.config
        self.name: str = str(facts.get("name", ""))
        self.map_source: str = str(facts.get("map_source", ""))
        self.score_rule: str = str(facts.get("score_rule", "probability"))
        self.input_size: int = int(facts.get("input_size", 224))
        self.grid: tuple[int, int] = tuple(int(g) for g in facts.get("grid", (14, 14)))  # type: ignore[assignment]
        self.verified: bool = bool(facts.get("verified", True))
        self.citation: str = str(facts.get("citation", ""))
        self.weights_source: str | None = weights_source(facts)
        self.device = torch.device(device)
        self.weights_label = "unknown"  # "official", "random-init", "xbench-reference", "user-checkpoint", "none"

    def check_fact(self, key: str, value: Any, why: str) -> None:
        """Raise :class:`FormatError` (naming the YAML and the key) unless fact ``key`` equals ``value``, what the
        network or its files fix (``why``). Adapters check facts; they never overwrite them."""
        stated = getattr(self, key)
        if stated != value:
            where = self.config.get("config_path") or f"model config of {type(self).__name__}"
            raise FormatError(where, f"states {key} {stated!r}, but {why} gives {value!r}; facts are written in the "
                                     "model YAML only: correct it there", field=key)

    # -- the one builder -------------------------------------------------------------------
    @classmethod
    @final
    def from_config(cls, config: Mapping[str, Any], weights_dir: str | Path | None,
                    device: str | torch.device = "cpu") -> Adapter:
        """Build from a model YAML (as :func:`~xbench.spec.registry.model_config` returns it) and a weights folder.

        The folder is ``weights_dir``, else the YAML's ``bundled_weights`` (a folder inside the package).
        Files are the YAML's ``weights:`` entries (``path`` inside the folder, ``source`` = publisher;
        ``alternative_to: KEY`` makes an entry a fallback of ``KEY``, looked up in YAML order).

        * ``params.random_init`` true and no folder given → :meth:`_random` with the entries marked
          ``random: required`` (a model whose random init needs files from the folder, like BiomedCLIP's
          config and tokenizer, is also built at random from a given folder); labelled ``"random-init"``.
        * a folder → every entry resolved (:class:`MissingFileError` naming the first absent file and its
          publisher), then :meth:`_load`; labelled ``"official"`` unless the hook set another label.
        * no weight entries (the centre / random priors) → :meth:`_load` with no files.
        * otherwise → :class:`MissingFileError` naming the first file, its publisher and the whole list.
        """
        config = with_yaml_facts(cls.config_name, config)
        params = config.get("params") or {}
        entries = weight_entries(config)
        folder, needs_folder = _random_init_files(config, weights_dir)
        if params.get("random_init") and (weights_dir is None or needs_folder):
            files = resolve_weight_files(config, folder, needs_folder)
            adapter, label = cls._random(files, config, device), "random-init"
        elif folder is not None or not entries:
            files = resolve_weight_files(config, folder, list(entries)) if entries else {}
            adapter = cls._load(files, config, device)
            label = adapter.weights_label if adapter.weights_label != "unknown" else "official"
        else:
            raise missing_weights(config, random_init=cls._random.__func__ is not Adapter._random.__func__)
        adapter.weights_label = label
        return adapter

    @classmethod
    def from_checkpoint(cls, checkpoint: Any, *parts: Any, **options: Any) -> Adapter:
        """The in-memory constructor, one name for every adapter: the adapter from a *loaded* checkpoint object.

        ``parts`` are what the model needs besides its weights (text encoder, tokenizer, vocabulary, network
        config; see each adapter), ``options`` at least ``config`` (a partial config gets its missing facts from
        the YAML, :func:`with_yaml_facts`) and ``device``. Adapters whose weights come from files implement it and
        their ``_load`` reads the files and calls it; a mismatching checkpoint raises
        :class:`~xbench.core.errors.CheckpointError` listing the keys.
        """
        raise NotImplementedError(f"{cls.__name__} has no in-memory constructor (its weights are not a checkpoint)")

    @classmethod
    def from_official_checkpoint(cls, checkpoint: Any, *parts: Any, **options: Any) -> Adapter:
        """Deprecated spelling of :meth:`from_checkpoint` (MedKLIP, MAVL, KAD and CARZero used it until 2026-11)."""
        warnings.warn(f"{cls.__name__}.from_official_checkpoint is deprecated; use {cls.__name__}.from_checkpoint "
                      "(the same arguments)", DeprecationWarning, stacklevel=2)
        return cls.from_checkpoint(checkpoint, *parts, **options)

    @classmethod
    def _load(cls, files: Mapping[str, Path], config: Mapping[str, Any], device: str | torch.device) -> Adapter:
        """Hook: the adapter from its resolved weight files (``{YAML weights key: existing path}``)."""
        raise NotImplementedError(f"{cls.__name__} implements no _load hook")

    @classmethod
    def _random(cls, files: Mapping[str, Path], config: Mapping[str, Any], device: str | torch.device) -> Adapter:
        """Hook: the full-size adapter with weights seeded by ``params.seed`` (``files``: the ``random: required``
        entries, usually none)."""
        raise NotImplementedError(f"{cls.__name__} has no random init")

    # -- contract --------------------------------------------------------------------------
    @abstractmethod
    def preprocess(self, image: np.ndarray) -> torch.Tensor:
        """XBench image (float32 ``(H, W)`` in [0, 1]) → model input ``(3, S, S)``."""

    @abstractmethod
    def predict(self, pixels: torch.Tensor, prompts: Sequence[str]) -> Prediction:
        """Scores ``(B, C)`` and native-grid maps ``(B, C, h, w)`` for a batch of preprocessed images."""

    def predict_cases(self, pixels: torch.Tensor, prompts: Sequence[str], case_ids: Sequence[str]) -> Prediction:
        """:meth:`predict` for a batch whose case ids are known (the runner's call). Only adapters whose output is
        keyed by the case rather than the pixels (the random prior) override it."""
        return self.predict(pixels, prompts)

    def scores(self, pixels: torch.Tensor, prompts: Sequence[str]) -> torch.Tensor:
        return self.predict(pixels, prompts).scores

    def saliency(self, pixels: torch.Tensor, prompts: Sequence[str]) -> torch.Tensor:
        return self.predict(pixels, prompts).maps

    def input_window(self, size: tuple[int, int]) -> tuple[float, float, float, float]:
        """The part of an original ``(H, W)`` image that the model input — and so its map — covers.

        ``(y0, x0, y1, x1)`` in original pixels; it may reach outside the image where the
        official transform pads. Default: the whole image (plain resize). Adapters whose
        transform crops (CLIP, BiomedCLIP, CARZero) override it, and the evaluation places
        their maps into this window of the evaluation grid (:mod:`xbench.models.windows`).
        """
        return (0.0, 0.0, float(size[0]), float(size[1]))

    def to_probability(self, scores: torch.Tensor | np.ndarray) -> np.ndarray:
        """Scores → probabilities in [0, 1] (sigmoid for ``score_rule == "logit"``)."""
        s = np.asarray(scores, dtype=np.float64)
        return 1.0 / (1.0 + np.exp(-s)) if self.score_rule == "logit" else s

    def describe(self) -> dict[str, Any]:
        """Metadata row for README / tables."""
        return {
            "model": self.name,
            "map_source": self.map_source,
            "score_rule": self.score_rule,
            "input_size": self.input_size,
            "grid": f"{self.grid[0]}x{self.grid[1]}",
            "weights": self.weights_label,
            "verified": self.verified,
        }


def resize_crop_window(size: tuple[int, int], crop: int, mode: str = "shortest") -> tuple[float, float, float, float]:
    """Window of torchvision/open_clip ``Resize`` + ``CenterCrop(crop)`` in original pixels.

    ``mode`` as open_clip's ``resize_mode``: ``"shortest"`` (shorter side to ``crop``, then centre
    crop: the window is a centred square of the shorter side), ``"longest"`` (longer side to
    ``crop``, then centre pad: a centred square of the longer side, reaching into the padding) or
    ``"squash"`` (both sides to ``crop``: the whole image). Crop offsets use torchvision's
    ``int(round((resized - crop) / 2))`` in resized pixels.
    """
    h, w = float(size[0]), float(size[1])
    if mode == "squash":
        return (0.0, 0.0, h, w)
    side = min(h, w) if mode == "shortest" else max(h, w)
    if mode not in ("shortest", "longest"):
        raise ValueError(f"resize mode must be shortest, longest or squash, got {mode!r}")
    out = []
    for extent in (h, w):
        resized = int(crop * extent / side) if extent != side else crop
        offset = int(round((resized - crop) / 2.0)) * extent / resized if resized else 0.0
        out.append(offset)
    y0, x0 = out
    return (y0, x0, y0 + side, x0 + side)


# -- weights ---------------------------------------------------------------------------
def weights_dir(name: str, weights: str | Path | None) -> Path | None:
    """The local weights folder for ``name``: ``weights`` if given, else ``$XBENCH_WEIGHTS/<name>`` if it exists."""
    if weights is not None:
        return Path(weights)
    root = os.environ.get("XBENCH_WEIGHTS")
    if root and (Path(root) / name).exists():
        return Path(root) / name
    return None


def weights_folder(name: str, weights: str | Path | None) -> Path | None:
    """The folder a model's weights are read from: :func:`weights_dir`'s, else the package's
    ``reference_weights/<name>`` when it exists, else None."""
    folder = weights_dir(name, weights)
    if folder is None and (PACKAGE_DIR / "reference_weights" / name).is_dir():
        folder = PACKAGE_DIR / "reference_weights" / name
    return folder


def weight_files(name: str, weights: str | Path | None) -> list[Path]:
    """The existing files a model's config ``weights:`` entries name inside its :func:`weights_folder` (a folder
    entry contributes every file below it; no entries: every file of the folder), sorted per entry."""
    folder = weights_folder(name, weights)
    if folder is None:
        return []
    entries = (model_config(name).get("weights") or {}).values()
    named = [folder / str(e["path"]) for e in entries if isinstance(e, dict) and e.get("path")]
    return [f for p in named for f in files_under(p)] if named else files_under(folder)


def files_under(path: Path) -> list[Path]:
    """``[path]`` for a file, every file below a folder (sorted), ``[]`` when absent."""
    if path.is_file():
        return [path]
    if path.is_dir():
        return sorted(p for p in path.rglob("*") if p.is_file())
    return []


def require_file(folder: Path, relative: str, what: str, source: str | None) -> Path:
    """``folder/relative`` if it exists, else :class:`MissingFileError` naming it and its publisher."""
    path = folder / relative
    if not path.exists():
        raise MissingFileError(path, what, source)
    return path


FACT_KEYS = ("map_source", "score_rule", "input_size", "grid", "verified", "citation", "title")


def _agrees(yaml_config: Mapping[str, Any], config: Mapping[str, Any]) -> bool:
    """Whether every fact and ``params`` entry of ``config`` that ``yaml_config`` also states has the same value."""
    def same(a: Any, b: Any) -> bool:
        return list(a) == list(b) if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) else a == b

    yaml_params = yaml_config.get("params") or {}
    return (all(same(yaml_config[k], v) for k, v in config.items() if k in FACT_KEYS and k in yaml_config)
            and all(same(yaml_params[k], v) for k, v in (config.get("params") or {}).items() if k in yaml_params))


def with_yaml_facts(config_name: str, config: Mapping[str, Any] | None) -> dict[str, Any]:
    """``config`` over a registered YAML of the class (top-level keys of ``config`` win, ``params`` as a whole).

    The YAML is ``config_name``'s when ``config`` agrees with it, else the first other registered YAML of the same
    class that it agrees with (``{"input_size": 512, "params": {"trunk": "layer4"}}`` for the KAD adapter is
    ``kad_512``, whose grid is 16x16; agreeing with several is an :class:`XBenchError`), else ``config_name``'s. A config that came from the registry (it has
    ``class``) or a class without ``config_name`` is used as is.
    """
    config = dict(config or {})
    if "class" in config or not config_name:
        return config
    base = model_config(config_name)
    if not _agrees(base, config):
        variants = [v for v in map(model_config, list_models()) if v["name"] != config_name
                    and v.get("class") == base.get("class") and _agrees(v, config)]
        if len(variants) > 1:
            raise XBenchError(f"partial config {config} agrees with several model YAMLs "
                              f"({', '.join(v['name'] for v in variants)}); give the facts that tell them apart")
        base = variants[0] if variants else base
    return {**base, **config}


def weight_entries(config: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The YAML's ``weights:`` entries ``{key: {path, source, ...}}`` (empty for models without files)."""
    return {key: dict(entry or {}) for key, entry in (config.get("weights") or {}).items()}


def weights_source(config: Mapping[str, Any]) -> str | None:
    """Publisher of the model's first weight file (its checkpoint), or None."""
    return next((e.get("source") for e in weight_entries(config).values() if e.get("source")), None)


def bundled_weights(config: Mapping[str, Any]) -> Path | None:
    """The package folder named by the YAML's ``bundled_weights`` (committed weights), if any."""
    relative = config.get("bundled_weights")
    return PACKAGE_DIR / relative if relative else None


def _describe_file(config: Mapping[str, Any], key: str) -> str:
    return f"{config.get('title') or config.get('name', 'model')} file '{key}'"


def _group(entries: Mapping[str, Mapping[str, Any]], key: str) -> list[str]:
    """``key`` and the entries that are ``alternative_to`` it, in YAML order."""
    return [key, *(k for k, e in entries.items() if e.get("alternative_to") == key)]


def _random_init_files(config: Mapping[str, Any], weights_dir: str | Path | None) -> tuple[Path | None, list[str]]:
    """The weights folder (``weights_dir``, else the YAML's ``bundled_weights``) and the YAML entries a random-init
    build reads from it (``random: required``)."""
    folder = Path(weights_dir) if weights_dir is not None else bundled_weights(config)
    return folder, [k for k, e in weight_entries(config).items() if e.get("random") == "required"]


def resolve_weight_files(config: Mapping[str, Any], folder: Path | None, keys: Sequence[str]) -> dict[str, Path]:
    """``{key: folder/path}`` of the YAML entries ``keys``; an entry with ``alternative_to: K`` fills ``K`` when
    ``K``'s own file is absent. An absent file raises :class:`MissingFileError` naming it and its publisher."""
    entries = weight_entries(config)
    if not keys:
        return {}
    if folder is None:
        raise missing_weights(config, keys)
    files: dict[str, Path] = {}
    for key in keys:
        entry = entries[key]
        target = entry.get("alternative_to")
        if target:
            continue
        group = _group(entries, key)
        found = next((folder / entries[k]["path"] for k in group if (folder / entries[k]["path"]).exists()), None)
        if found is None:
            names = " or ".join(str(entries[k]["path"]) for k in group)
            raise MissingFileError(folder / entry["path"], f"{_describe_file(config, key)} ({names})",
                                   entry.get("source"))
        files[key] = found
    return files


def missing_weights(config: Mapping[str, Any], keys: Sequence[str] | None = None,
                    random_init: bool = False) -> MissingFileError:
    """The error of a model built without its weights folder: first file, publisher, and every file expected."""
    entries = weight_entries(config)
    keys = list(keys if keys is not None else entries)
    first = entries[keys[0]]
    name = config.get("name", "model")
    listing = ", ".join(" or ".join(str(entries[g]["path"]) for g in _group(entries, k))
                        for k in keys if not entries[k].get("alternative_to"))
    random = ", or use random_init=True" if random_init else ""
    release = "" if first.get("source") else " (no official release exists: supply your own)"
    note = f"; {first['note']}" if first.get("note") else ""
    return MissingFileError(
        Path("$XBENCH_WEIGHTS") / name / first["path"],
        f"{config.get('title') or name} weights{release}: a folder holding {listing} "
        f"(pass create_model({name!r}, weights=DIR) or set XBENCH_WEIGHTS to a folder holding {name}/{random}){note}",
        first.get("source"),
    )


def load_checkpoint(path: str | Path) -> Any:
    """Load a ``.pt/.pth/.ckpt/.bin`` or ``.safetensors`` file on CPU without running any code from it.

    Delegates to :func:`xbench.models.checkpoint.read_checkpoint`: safetensors, else the restricted
    unpickler for torch archives (numpy scalars, ``Namespace``, config objects as inert placeholders,
    reported by a warning; legacy non-zip files through the same unpickler, sizes counted first). A file that cannot be read safely
    raises :class:`CheckpointError` naming it.
    """
    from .checkpoint import read_checkpoint

    return read_checkpoint(path)


def load_state_strict(module: torch.nn.Module, state: Mapping[str, torch.Tensor], where: str) -> None:
    """``load_state_dict(strict=True)`` with an error that lists missing / unexpected / mis-shaped keys.

    A non-string key or a non-tensor value raises :class:`CheckpointError` naming ``where`` and the key.

    The checkpoint's tensors become the module's (``assign=True``) instead of being copied into the memory the module
    was built with, once each is in the module tensor's dtype and device and contiguous (converted where it is not,
    which is the copy a plain load makes). The module's values are the same bytes either way; the copy of every
    weight is saved (883 MB for CARZero's checkpoint). The
    checkpoint's tensors are therefore not to be changed after the load.
    """
    from .checkpoint import require_tensor_state

    state = require_tensor_state(state, where)
    own = module.state_dict()
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    shapes = [f"{k}: checkpoint {tuple(state[k].shape)} vs model {tuple(own[k].shape)}"
              for k in own if k in state and tuple(state[k].shape) != tuple(own[k].shape)]
    if missing or unexpected or shapes:
        def cut(items: list[str]) -> str:
            return ", ".join(items[:8]) + (f" … (+{len(items) - 8})" if len(items) > 8 else "")
        raise CheckpointError(
            f"{where}: checkpoint does not match the architecture — "
            f"missing {len(missing)} [{cut(missing)}]; unexpected {len(unexpected)} [{cut(unexpected)}]; "
            f"shape mismatches {len(shapes)} [{cut(shapes)}]"
        )
    module.load_state_dict({k: _like(v, own[k]) for k, v in state.items()}, strict=True, assign=True)


def _like(tensor: torch.Tensor, own: torch.Tensor) -> torch.Tensor:
    """``tensor`` in ``own``'s dtype and device, contiguous: itself when it already is."""
    return tensor.to(dtype=own.dtype, device=own.device).contiguous()


# -- factory ---------------------------------------------------------------------------
def create_model(name: str, weights: str | Path | None = None, device: str | torch.device = "cpu", **params: Any) -> Adapter:
    """Build a registered model: the one door (``xbench.create_model("kad", weights="/w/kad")``).

    ``name`` is a file stem of ``xbench/configs/models``; ``params`` override the
    config's ``params`` section; :meth:`Adapter.from_config` builds it.
    """
    cfg = model_config(name)
    cls = import_target(cfg["class"])
    config = {**cfg, "params": {**cfg.get("params", {}), **params}}
    return cls.from_config(config, weights_dir(name, weights), device)


def input_twin(name: str, weights: str | Path | None = None, **params: Any) -> Adapter | None:
    """A network-less copy of ``create_model(name, weights, **params)`` for its inputs alone, or None.

    The copy is the class's random-init build (:meth:`Adapter._random`, with only the files marked ``random:
    required``; a checkpoint is never read) made under ``torch.device("meta")``: its networks have shapes but no
    memory and no initialisation, so it costs the imports and little else. Its ``preprocess``, ``input_window`` and
    facts are the real adapter's (the runner still compares the two inputs' calibration, :func:`~xbench.inference.
    cache.model_input`, before using anything decoded for the copy); its ``predict`` cannot run. None for a class
    without a ``_random`` hook, or when the copy cannot be built (the caller then builds the real model first: a
    real problem is reported by that build).

    >>> twin = input_twin("kad")
    >>> next(twin.network.parameters()).device.type, tuple(twin.preprocess(np.zeros((40, 30), np.float32)).shape)
    ('meta', (3, 224, 224))
    """
    cfg = model_config(name)
    cls = import_target(cfg["class"])
    if getattr(cls._random, "__func__", None) is Adapter._random.__func__:
        return None
    config = with_yaml_facts(cls.config_name, {**cfg, "params": {**cfg.get("params", {}), **params, "random_init": True}})
    folder, needs = _random_init_files(config, weights_dir(name, weights))
    try:
        with warnings.catch_warnings(), torch.device("meta"):
            warnings.simplefilter("ignore")  # the real build warns once (e.g. DeViDe's unverified architecture)
            twin = cls._random(resolve_weight_files(config, folder, needs), config, "meta")
    except Exception as exc:  # an optimisation only; the real build reports what is wrong
        logging.getLogger(__name__).debug("no input twin of %s: %s: %s", name, type(exc).__name__, exc)
        return None
    twin.weights_label = "input-twin"
    return twin
