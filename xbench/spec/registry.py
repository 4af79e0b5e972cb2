"""Name → config registry (open_clip style): architectures and datasets are data.

Model configs are ``xbench/configs/models/<name>.yaml``; dataset manifests are
``data_manifests/<name>.yaml`` at the repository root (next to the package; an installed
wheel carries them as ``xbench/data_manifests/``).
Each file holds ``class: "module.path:ClassName"`` plus the entry's own keys.

Users add models and datasets without editing the package: a *config search path* of
folders, each holding ``models/*.yaml`` and/or ``datasets/*.yaml`` (and, optionally, the
Python modules their ``class:`` targets name — the folder is put on ``sys.path``). The
search path is: folders that installed packages declare under the entry-point group
``xbench.config_path`` (``mypkg = "mypkg"``: the package's folder), then ``$XBENCH_CONFIG_PATH``
(folders joined with ``os.pathsep``), then, on the command line, ``xbench --config-path DIR``
(repeatable). :func:`add_search_dir` does the same from Python, :func:`add_config_path` adds
one folder of one kind. A later folder overrides an earlier one (and the package) for the
same name.

Every file is checked at this door against its schema (:mod:`xbench.spec.schema`): a model YAML against
:class:`ModelYaml`, a dataset manifest against :class:`DatasetManifest` — unknown keys (with "did you
mean"), missing keys, wrong types and finding ids that are not canonical (:data:`xbench.spec.findings.CANONICAL`)
are one :class:`~xbench.core.errors.FormatError` naming file and field, raised when the name is looked up.
"""
from __future__ import annotations

import copy
import importlib
import importlib.metadata
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from ..core.errors import FormatError, UnknownNameError, XBenchError
from .findings import CANONICAL
from .schema import check_choice, did_you_mean, load as load_schema

PACKAGE_DIR = Path(__file__).resolve().parents[1]  # the xbench package (this module lives in xbench/spec/)
MODEL_CONFIG_DIRS: list[Path] = [PACKAGE_DIR / "configs" / "models"]
_SHIPPED_MANIFESTS = PACKAGE_DIR / "data_manifests"  # inside an installed wheel
MANIFEST_DIRS: list[Path] = [Path(os.environ.get("XBENCH_MANIFESTS", _SHIPPED_MANIFESTS if _SHIPPED_MANIFESTS.is_dir()
                                                 else PACKAGE_DIR.parent / "data_manifests"))]


# -- schemas of the two registered kinds ---------------------------------------------------------------
@dataclass
class WeightFile:
    """A ``weights:`` entry of a model YAML: a file (or folder, trailing ``/``) inside the weights folder."""

    path: str
    source: str | None = None  # the publisher
    random: Literal["required"] | None = None  # random init reads this file too (BiomedCLIP's config, tokenizer)
    alternative_to: str | None = None  # a fallback of that entry (CLIP's three checkpoint formats)
    note: str | None = None


@dataclass
class PaperEntry:
    """The ``paper:`` section of a model YAML: how arXiv 2510.19599 prints the model (read by :mod:`xbench.paper`)."""

    name: str  # display name in the paper's tables
    group: str  # pretraining group of Fig. 3 (paper §4.0.2)
    row: int  # row of the model in Tables 1-5


@dataclass
class ModelYaml:
    """Schema of ``configs/models/<name>.yaml``: every fact about a model (docs/extending.md)."""

    class_: str  # "module:Class" of the adapter
    title: str
    citation: str
    map_source: Literal["similarity", "cross-attention", "prior"]
    score_rule: Literal["probability", "logit", "constant", "random"]
    input_size: int
    grid: tuple[int, int]
    code: str | None = None
    weights: dict[str, WeightFile] | None = field(default_factory=dict)  # null or {}: no weight files
    bundled_weights: str | None = None  # a folder inside the package (the committed reference models)
    verified: bool = True
    params: dict[str, Any] | None = field(default_factory=dict)  # the declared parameter set, with defaults
    explain_layer: str | None = None  # module path of the layer a gradient explainer hooks (None: the adapter's)
    explain_attention: str | None = None  # module path of the attention blocks (attention explainers)
    paper: PaperEntry | None = None  # models of the paper only

    def _check(self, where: str | Path, prefix: str) -> None:
        for key, entry in (self.weights or {}).items():
            if entry.alternative_to is not None:
                check_choice(where, f"weights.{key}.alternative_to", entry.alternative_to,
                                    [k for k in (self.weights or {}) if k != key], "weights entry")


@dataclass
class ManifestFile:
    """A ``files:`` entry of a manifest (``{split}`` in ``path`` / ``source`` is the split name)."""

    path: str
    source: str | None = None
    sha256: str | None = None  # hex of the file as published; null: not compared
    splits: list[str] | None = None  # only these splits need it (default: every split)

    def _check(self, where: str | Path, prefix: str) -> None:
        digest = self.sha256
        if digest is not None and (len(digest) != 64 or any(ch not in "0123456789abcdef" for ch in digest)):
            raise FormatError(where, f"sha256 must be 64 lower-case hex digits or null, got {digest!r}",
                              field=f"{prefix}.sha256")


@dataclass
class ExpectedCounts:
    """Counts a split should measure (``xbench manifest check`` compares them); every key optional."""

    cases: int | None = None
    positive_cases: int | None = None
    negative_cases: int | None = None
    regions: int | None = None
    positives: dict[str, int] = field(default_factory=dict)
    region_counts: dict[str, int] = field(default_factory=dict)


@dataclass
class ManifestSplit:
    description: str | None = None
    expected: ExpectedCounts | None = None
    cases: int | None = None  # generated sources: cases to generate


@dataclass
class ManifestClass:
    """A class of a dataset: its own spelling, canonical finding id, prompt and display name."""

    name: str
    finding: str = field(metadata={"choices": CANONICAL, "what": "finding id (xbench.spec.findings.CANONICAL)"})
    prompt: str
    display: str
    localized: bool
    aliases: list[str] = field(default_factory=list)


@dataclass
class DatasetManifest:
    """Schema of ``data_manifests/<name>.yaml`` (described in :mod:`xbench.spec.manifests`)."""

    class_: str  # "module:Class" of the loader
    title: str
    default_split: str
    splits: dict[str, ManifestSplit]
    classes: list[ManifestClass]
    homepage: str | None = None  # the key is required unless generated (null: none)
    citation: str | None = None  # the key is required unless generated
    license: str | None = None  # the key is required unless generated
    files: dict[str, ManifestFile] | None = None  # the key is required unless generated
    image_size: tuple[int, int] | None = None
    generated: bool = False  # procedural sources (the phantom) create their own files
    generator: dict[str, Any] | None = None  # phantom: the generator's default keyword arguments
    lung_outline_labels: list[str] | None = None  # covid_rural: labels of lung outlines, not findings
    label_aliases: dict[str, str] | None = None  # vindr_cxr: spellings of its label CSVs → class name
    ignored_classes: list[str] | None = None  # vindr_cxr: labels that are not kept

    def _check(self, where: str | Path, prefix: str) -> None:
        if not self.splits:
            raise FormatError(where, "must be a non-empty mapping of split name → {description, expected}",
                              field="splits")
        if self.default_split not in self.splits:
            raise FormatError(where, f"{self.default_split!r} is not one of the splits {sorted(self.splits)}"
                              f"{did_you_mean(self.default_split, self.splits)}", field="default_split")
        if not self.classes:
            raise FormatError(where, "must be a non-empty list", field="classes")
        names: set[str] = set()
        for index, cls in enumerate(self.classes):
            if cls.name in names:
                raise FormatError(where, f"duplicate class name {cls.name!r}", field=f"classes[{index}].name")
            names.add(cls.name)
        for key, entry in (self.files or {}).items():
            for i, split in enumerate(entry.splits or []):
                check_choice(where, f"files.{key}.splits[{i}]", split, self.splits, "split")


def check_model_yaml(raw: dict[str, Any], where: str | Path) -> ModelYaml:
    """The typed :class:`ModelYaml` of a parsed model YAML (``name`` / ``config_path`` keys are ignored)."""
    return load_schema(ModelYaml, {k: v for k, v in raw.items() if k not in ("name", "config_path")}, where)


def check_manifest(raw: dict[str, Any], where: str | Path) -> DatasetManifest:
    """The typed :class:`DatasetManifest` of a parsed manifest (``name`` / ``config_path`` keys are ignored).

    ``homepage``, ``citation``, ``license`` and ``files`` must be present unless the source is ``generated``.
    """
    typed = load_schema(DatasetManifest, {k: v for k, v in raw.items() if k not in ("name", "config_path")}, where)
    for key in () if typed.generated else ("homepage", "citation", "license", "files"):
        if key not in raw:
            raise FormatError(where, "missing required key", field=key)
    return typed


def add_config_path(path: str | Path, kind: str = "models") -> None:
    """Register a user folder of model configs (``kind="models"``) or dataset manifests (``"datasets"``)."""
    folder = Path(path)
    if not folder.is_dir():
        raise NotADirectoryError(f"add_config_path: {folder} is not a folder")
    {"models": MODEL_CONFIG_DIRS, "datasets": MANIFEST_DIRS}[kind].append(folder)


def add_search_dir(path: str | Path) -> None:
    """Add a config search folder: its ``models/`` and ``datasets/`` subfolders (either may be absent) are
    registered and the folder goes on ``sys.path`` so that ``class:`` targets of modules inside it import."""
    folder = Path(path).expanduser().resolve()
    if not folder.is_dir():
        raise XBenchError(f"config search path ($XBENCH_CONFIG_PATH or --config-path): {folder} is not a folder")
    subs = [(folder / "models", "models"), (folder / "datasets", "datasets")]
    if not any(sub.is_dir() for sub, _ in subs):
        raise XBenchError(f"config search path: {folder} holds neither models/ nor datasets/ (see xbench.spec.registry)")
    for sub, kind in subs:
        if sub.is_dir() and sub not in {"models": MODEL_CONFIG_DIRS, "datasets": MANIFEST_DIRS}[kind]:
            add_config_path(sub, kind)
    if str(folder) not in sys.path:
        sys.path.append(str(folder))


_ENV_READ = False


def _env_search_path() -> None:
    """Add the folders of ``$XBENCH_CONFIG_PATH`` (once, on the first look-up, so a bad entry is a clear error
    where names are looked up rather than at import)."""
    global _ENV_READ
    if _ENV_READ:
        return
    _ENV_READ = True
    for ep in importlib.metadata.entry_points(group="xbench.config_path"):
        target = ep.load()  # a folder path, or a module whose folder holds models/ and/or datasets/
        add_search_dir(Path(target.__file__).parent if hasattr(target, "__file__") else target)
    for entry in filter(None, os.environ.get("XBENCH_CONFIG_PATH", "").split(os.pathsep)):
        add_search_dir(entry)


def _scan(dirs: list[Path]) -> dict[str, Path]:
    _env_search_path()
    found: dict[str, Path] = {}
    for folder in dirs:
        for file in sorted(folder.glob("*.yaml")):
            found[file.stem] = file
    return found


class _NoAliasLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses aliases (``*name``, ``<<: *name``): an alias repeats a node without its bytes,
    so a few hundred bytes can stand for billions of values ("billion laughs"). XBench's files never need one."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(
                None, None, f"found the alias *{event.anchor[:40]}: YAML aliases are not admitted in XBench files "
                "(write the value out)", event.start_mark)
        return super().compose_node(parent, index)


def load_yaml_text(text: str) -> Any:
    """``yaml.safe_load`` without aliases (:class:`_NoAliasLoader`); ``yaml.YAMLError`` for malformed text."""
    loader = _NoAliasLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def read_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping (aliases refused: :func:`load_yaml_text`); a malformed file raises :class:`FormatError`
    naming it."""
    path = Path(path)
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        raise FormatError(path, f"not UTF-8 text (byte {raw[exc.start:exc.start + 1]!r} at offset {exc.start}); "
                          "save the file as UTF-8", line=line) from None
    try:
        data = load_yaml_text(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise FormatError(path, f"invalid YAML: {exc}", line=mark.line + 1 if mark else None) from exc
    if not isinstance(data, dict):
        raise FormatError(path, f"expected a mapping at top level, got {type(data).__name__}")
    return data


#: Explainer name → ``"module:Class"`` of its implementation (:mod:`xbench.explain`), the names a run config's model
#: entry may give as ``explainer:``. Read here, where configs are checked, without importing the explainers (they
#: sit above the models); ``xbench.explain.EXPLAINERS`` is built from this table.
EXPLAINERS: dict[str, str] = {
    "gradcam": "xbench.explain.methods:GradCAM",
    "gradcampp": "xbench.explain.methods:GradCAMPlusPlus",
    "gradxinput": "xbench.explain.methods:GradientXInput",
    "ig": "xbench.explain.methods:IntegratedGradients",
    "attngrad": "xbench.explain.methods:AttentionGrad",
}


def list_models() -> list[str]:
    """Names of every registered model config."""
    return sorted(_scan(MODEL_CONFIG_DIRS))


def list_datasets() -> list[str]:
    """Names of every registered dataset manifest."""
    return sorted(_scan(MANIFEST_DIRS))


def model_config(name: str) -> dict[str, Any]:
    """The parsed config of model ``name`` (with ``name`` and ``config_path`` added)."""
    return _entry(name, MODEL_CONFIG_DIRS, "model", check_model_yaml)


def dataset_manifest(name: str) -> dict[str, Any]:
    """The parsed manifest of dataset ``name`` (with ``name`` and ``config_path`` added)."""
    return _entry(name, MANIFEST_DIRS, "dataset", check_manifest)


def _entry(name: str, dirs: list[Path], kind: str, check: Any) -> dict[str, Any]:
    """The parsed file of ``name``, checked against its schema (``check``) at this door."""
    from .names import check_name

    check_name(name, kind)
    files = _scan(dirs)
    if name not in files:
        raise UnknownNameError(kind, name, files)
    cfg = _checked_yaml(files[name], check)
    cfg.setdefault("name", name)
    check_name(cfg["name"], kind, f"{files[name]}, field 'name'")
    cfg["config_path"] = str(files[name])
    return cfg


_CHECKED: dict[tuple[str, int, int, int, Any], dict[str, Any]] = {}


def _checked_yaml(path: Path, check: Any) -> dict[str, Any]:
    """``read_yaml(path)`` passed through ``check``, parsed once per (file, size, mtime_ns, inode) in a process (a
    run asks for each model's config once per dataset and pair); each call gets its own deep copy."""
    stat = path.stat()
    key = (str(path), stat.st_size, stat.st_mtime_ns, stat.st_ino, check)
    if key not in _CHECKED:
        cfg = read_yaml(path)
        check(cfg, path)
        _CHECKED[key] = cfg
    return copy.deepcopy(_CHECKED[key])


def import_target(target: str) -> Any:
    """Import ``"package.module:Attr"``."""
    module, _, attr = target.partition(":")
    if not attr:
        raise ValueError(f"class target must look like 'module:Class', got {target!r}")
    return getattr(importlib.import_module(module), attr)
