"""Preflight: check everything a run needs before any model is built (``xbench check``).

:func:`preflight` looks, for a :class:`~xbench.spec.config.RunConfig`, at

* every dataset: the manifest's files under the root (SHA-256 where the manifest gives one), the loader
  opening with the config's options, image files present / missing (counted, case ids kept), one image
  decoded and its size compared to the manifest's ``image_size`` (else the case table's size; a uniform rescale is a note, another aspect ratio a problem), and every
  ``fit_split`` named by a model existing in the manifest;
* every model: its weight files (the ``weights:`` entries of its YAML, in the folder given by ``weights:`` /
  ``$XBENCH_WEIGHTS/<name>`` / the package's ``reference_weights/<name>``), or an explicit, labelled
  ``random_init`` — refused unless the run opts in (``allow_random_init: true``, or ``params: {random_init:
  true}`` on the entry); an ``optional: true`` model without weights is *left out* (a note, not a problem);
* the device (``cuda`` without CUDA is a problem).

Nothing is built on a device and no model weights are read. Missing images are a problem under
``on_missing_image: raise`` and a counted note under ``skip`` (a problem when no image at all is present).
Weight entries whose key starts with ``checkpoint`` (or is ``openai_archive``) are alternatives: one of
them suffices; every other entry is required.
"""
from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..datasets.checks import first_missing
from ..spec.config import DatasetSpec, ModelSpec, RunConfig
from ..core.errors import XBenchError
from ..spec.listing import where_to_get
from ..spec.registry import dataset_manifest, model_config

__all__ = ["preflight", "PreflightReport", "DatasetCheck", "ModelCheck", "PreflightError", "runnable_models"]

log = logging.getLogger(__name__)


class PreflightError(XBenchError):
    """The run cannot start: the message lists every problem found."""


@dataclass
class _Check:
    """What the preflight found about one dataset or model: its ``problems`` (each stops the run)."""

    name: str
    problems: list[str] = field(default_factory=list, kw_only=True)


@dataclass
class DatasetCheck(_Check):
    split: str
    root: str
    files: list[str] = field(default_factory=list)
    cases: int = 0
    images_present: int = 0
    images_missing: list[str] = field(default_factory=list)
    decoded: str | None = None
    notes: list[str] = field(default_factory=list)


@dataclass
class ModelCheck(_Check):
    status: str  # "weights", "fits on split '…' when the run starts", "none-needed", "random_init", "missing", "left-out"
    folder: str | None = None
    missing: list[str] = field(default_factory=list)


@dataclass
class PreflightReport:
    """What :func:`preflight` found; :attr:`problems` empty ⇔ the run can start."""

    source: str
    device: str
    datasets: list[DatasetCheck] = field(default_factory=list)
    models: list[ModelCheck] = field(default_factory=list)
    device_problem: str | None = None

    @property
    def problems(self) -> list[str]:
        out = [f"dataset {d.name} [{d.split}]: {p}" for d in self.datasets for p in d.problems]
        out += [f"model {m.name}: {p}" for m in self.models for p in m.problems]
        if self.device_problem:
            out.append(f"device: {self.device_problem}")
        return out

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def left_out(self) -> dict[str, str]:
        """Optional models left out of the run → why."""
        return {m.name: f"optional model left out: weight files absent ({', '.join(m.missing)})"
                for m in self.models if m.status == "left-out"}

    def format(self) -> str:
        """Plain-text report for the CLI."""
        lines = [f"preflight of {self.source}: {'OK' if self.ok else f'{len(self.problems)} PROBLEM(S)'}"]
        for d in self.datasets:
            total = d.images_present + len(d.images_missing)
            lines.append(f"dataset {d.name} [{d.split}] at {d.root or '(no root)'}: {d.cases} cases; image files {d.images_present} "
                         f"of {total} present, {len(d.images_missing)} missing")
            lines += [f"  {f}" for f in d.files]
            if d.decoded:
                lines.append(f"  decoded {d.decoded}")
            lines += [f"  note: {n}" for n in d.notes]
            lines += [f"  PROBLEM: {p}" for p in d.problems]
        for m in self.models:
            where = f" ({m.folder})" if m.folder else ""
            label = " (runs labelled 'random-init')" if m.status == "random_init" and not m.problems else ""
            lines.append(f"model {m.name}: {m.status}{label}{where}" + (f"; missing {', '.join(m.missing)}" if m.missing else ""))
            lines += [f"  PROBLEM: {p}" for p in m.problems]
        lines.append(f"device {self.device}: " + (f"PROBLEM: {self.device_problem}" if self.device_problem else "available"))
        return "\n".join(lines)

    def raise_for_problems(self, *, keep_going: bool = False) -> None:
        """A :class:`PreflightError` listing the problems; with ``keep_going`` (``--keep-going``) it also says that
        the preflight runs before it and how to let each failing pair be recorded instead (``--no-check``)."""
        if self.problems:
            hint = ("\n`--keep-going` acts once inference has started; the preflight stops a run before it. Fix the "
                    "problems above, or add `--no-check` to skip the preflight and let `--keep-going` record each "
                    "failure (a pair: `failed` in run_log.json) and go on.") if keep_going else ""
            raise PreflightError("preflight found problem(s); nothing was computed:\n  - " + "\n  - ".join(self.problems)
                                 + "\n(`xbench check --config CONFIG` prints the full report)" + hint)


# -- datasets ----------------------------------------------------------------------------------
def check_dataset(cfg: RunConfig, spec: DatasetSpec, *, hashes: bool = True, decode: bool = True) -> DatasetCheck:
    """Files, loader, image files and one decoded image of one dataset of ``cfg``, and its models' fit splits."""
    manifest = dataset_manifest(spec.name)
    split = spec.split or manifest.get("default_split", "test")
    out = DatasetCheck(name=spec.name, split=split, root=str(spec.root or ""))
    _check_files(cfg, spec, manifest, split, out, hashes=hashes, decode=decode)
    out.problems += _fit_split_problems(cfg, manifest, split)  # listed whatever stopped the data check
    return out


def _fit_split_problems(cfg: RunConfig, manifest: dict[str, Any], split: str) -> list[str]:
    problems = []
    for m in cfg.models:
        if m.fit_split is not None and m.fit_split not in (manifest.get("splits") or {}):
            problems.append(f"model {m.name!r} has fit_split {m.fit_split!r}, which dataset {manifest['name']!r} does not "
                            f"have (splits: {', '.join(sorted(manifest.get('splits') or {}))})")
        elif m.fit_split is not None and m.fit_split == split:
            problems.append(f"model {m.name!r}: fit_split {m.fit_split!r} is the evaluation split; a baseline "
                            "must be fitted on a disjoint split")
    return problems


def _check_files(cfg: RunConfig, spec: DatasetSpec, manifest: dict[str, Any], split: str, out: DatasetCheck, *,
                 hashes: bool, decode: bool) -> None:
    """The dataset part of the preflight: :func:`xbench.datasets.checks.check` (the one dataset checker) with the
    run's loader options, read into ``out``; then the fit splits' files and one decoded image."""
    from ..datasets import checks
    from ..datasets import data_root

    try:
        data_root(spec.name, spec.root, manifest)  # no root and no $XBENCH_DATA: that is the problem
    except XBenchError as exc:
        out.problems.append(str(exc))
        return
    report = checks.check(spec.name, spec.root, split, hashes=hashes, options=spec.options, measure=False)
    out.root = "" if report.root is None else str(report.root)
    _manifest_files(report.files, out)
    out.problems += _fit_split_files(checks.file_status, cfg.models, manifest, Path(out.root), split)
    if out.problems:
        return
    ds = report.dataset
    if ds is None:
        out.problems.append(f"loader failed: {report.error}")
        return
    out.root = str(ds.root) if ds.root is not None else out.root
    out.cases = len(ds)
    if not len(ds):
        out.problems.append("the dataset has no cases (check root, split and options)")
        return
    out.images_present, out.images_missing = report.images_present, report.images_missing
    if out.images_missing:
        _missing_images(ds, spec.name, split, cfg.on_missing_image, out)
    if decode and out.images_present:
        _decode_one(ds, manifest, out)


def _manifest_files(files: Sequence[Any], out: DatasetCheck) -> None:
    """A line per manifest file (the images are counted per case instead); a missing file or another checksum is a
    problem."""
    for f in files:
        if f.key == "images":
            continue
        if not f.exists:
            out.files.append(f"file {f.key}: {f.path}: MISSING")
            out.problems.append(f"missing {f.key} file {f.path}" + (f" (get it from {f.source})" if f.source else ""))
        elif f.sha256_actual is None:
            out.files.append(f"file {f.key}: {f.path}: present")
        elif f.ok:
            out.files.append(f"file {f.key}: {f.path}: present, sha256 ok")
        else:
            out.files.append(f"file {f.key}: {f.path}: present, sha256 DIFFERS")
            out.problems.append(f"{f.path}: sha256 {f.sha256_actual[:12]}… differs from the manifest's "
                                f"{(f.sha256_expected or '')[:12]}… (another release of the file?)")


def _fit_split_files(file_status: Any, models: Sequence[ModelSpec], manifest: dict[str, Any], root: Path,
                     split: str) -> list[str]:
    """Problems: the annotation files of a split that a model is fitted on, missing (a generated dataset has none)."""
    problems = []
    for m in () if manifest.get("generated") else models:
        if m.fit_split is None or m.fit_split == split or m.fit_split not in (manifest.get("splits") or {}):
            continue
        for f in file_status(manifest, root, m.fit_split, hashes=False):
            if f.key != "images" and not f.exists:
                problems.append(f"model {m.name!r} is fitted on split {m.fit_split!r}, whose {f.key} file "
                                f"{f.path} is missing")
    return problems


def _missing_images(ds: Any, name: str, split: str, on_missing_image: str, out: DatasetCheck) -> None:
    """Missing image files, named as the files looked for (:func:`~xbench.datasets.checks.first_missing`): a
    problem when none is present or the run raises on them, else a counted note."""
    cases = len(ds)
    source = ((dataset_manifest(name).get("files") or {}).get("images") or {}).get("source")
    where = f" (from {_with_split(source, split)})" if source else ""
    first = first_missing(ds, out.images_missing, out.root)
    if not out.images_present:
        out.problems.append(f"none of the {cases} image files is present; first missing: {first}. Place "
                            f"them there{where}")
    elif on_missing_image == "raise":
        out.problems.append(f"{len(out.images_missing)} of {cases} image files are missing (first: {first}); "
                            f"place them{where}, or set on_missing_image: skip to evaluate the present ones (counted)")
    else:
        out.notes.append(f"{len(out.images_missing)} of {cases} cases will be skipped (image missing; "
                         f"first: {first}) and inferred by a later run once present")


def _decode_one(ds: Any, manifest: dict[str, Any], out: DatasetCheck) -> None:
    """Decode the first present image and compare its size with the manifest's ``image_size`` (else the case
    table's): a uniform rescale is a note, another aspect ratio a problem."""
    missing = set(out.images_missing)
    row = next(i for i, c in enumerate(ds.cases["case_id"].astype(str)) if c not in missing)
    sample = ds[row]
    try:
        image = sample.image()
    except Exception as exc:
        out.problems.append(f"image of case {sample.case_id} cannot be decoded: {type(exc).__name__}: {exc}")
        return
    want = tuple(manifest["image_size"]) if manifest.get("image_size") else tuple(sample.size)
    out.decoded = f"{sample.case_id}: {image.shape[0]}x{image.shape[1]} (expected {want[0]}x{want[1]})"
    got = tuple(image.shape)
    if got != want and got[0] * want[1] == got[1] * want[0]:
        out.notes.append(f"image of case {sample.case_id} is {got[0]}x{got[1]}, a uniform rescale of the manifest's "
                         f"{want[0]}x{want[1]} grid: regions are placed relative to the image")
    elif got != want:
        out.problems.append(f"image of case {sample.case_id} is {got[0]}x{got[1]}, the manifest's grid is "
                            f"{want[0]}x{want[1]} (another aspect ratio): regions would land in the wrong place")


# -- models ------------------------------------------------------------------------------------
_ALTERNATIVES = ("checkpoint", "openai_archive")


def model_weights(spec: ModelSpec) -> tuple[Path | None, list[str], list[str]]:
    """``(folder, present, missing)`` of a model's declared weight files (alternatives collapsed to one)."""
    from ..models.base import weights_folder

    entries = model_config(spec.name).get("weights") or {}
    folder = weights_folder(spec.name, spec.weights)
    present, missing, alternatives = [], [], []
    for key, entry in entries.items():
        path = str(entry.get("path", key))
        exists = folder is not None and (folder / path).exists()
        if key.startswith(_ALTERNATIVES):
            alternatives.append((path, exists))
        elif exists:
            present.append(path)
        else:
            missing.append(path)
    if alternatives:
        found = [p for p, e in alternatives if e]
        if found:
            present.append(found[0])
        else:
            missing.insert(0, " or ".join(p for p, _ in alternatives))
    return folder, present, missing


def _with_split(text: str, split: str) -> str:
    """A manifest's source text with its ``{split}`` placeholder filled in (as its file paths are)."""
    return text.replace("{split}", split)


def check_model(cfg: RunConfig, spec: ModelSpec) -> ModelCheck:
    mc = model_config(spec.name)
    if spec.fit_split is not None:  # fitted when the run starts (or a stored fit of the same inputs reused)
        return ModelCheck(spec.label, f"fits on split {spec.fit_split!r} when the run starts", None)
    if not (mc.get("weights") or {}):
        return ModelCheck(spec.label, "none-needed", None)
    folder, _, missing = model_weights(spec)
    out = ModelCheck(spec.label, "weights", None if folder is None else str(folder), missing)
    if spec.weights is not None and not Path(spec.weights).exists():
        out.problems.append(f"weights folder {spec.weights} does not exist")
        out.status = "missing"
        return out
    if not missing:
        return out
    random_init = bool({**(mc.get("params") or {}), **spec.params}.get("random_init", False))
    if spec.optional:
        out.status = "left-out"
    elif random_init:
        out.status = "random_init"
        if not (cfg.allow_random_init or spec.params.get("random_init") is True):
            out.problems.append(
                "weight files absent, and the model would run random-init; this config does not allow random-init "
                f"models (set allow_random_init: true, or params: {{random_init: true}} on the entry, to run it labelled "
                f"'random-init'); place {', '.join(missing)} in {folder or '$XBENCH_WEIGHTS/' + spec.name}"
                + where_to_get(spec.name, missing))
    else:
        out.status = "missing"
        out.problems.append(f"weight files absent: {', '.join(missing)} in {folder or '$XBENCH_WEIGHTS/' + spec.name + ' (unset)'}"
                            + where_to_get(spec.name, missing))
    return out


def check_device(device: str) -> str | None:
    if device == "auto" or device == "cpu":
        return None
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            return f"{device!r} asked for but torch sees no CUDA device here (use --device cpu or auto)"
        index = torch.device(device).index
        if index is not None and index >= torch.cuda.device_count():
            return f"{device!r}: only {torch.cuda.device_count()} CUDA device(s) visible"
    if device == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        return "'mps' asked for but not available"
    return None


def preflight(cfg: RunConfig, *, hashes: bool = True, decode: bool = True) -> PreflightReport:
    """Check datasets, models and device of ``cfg`` without building any model (see the module docstring)."""
    report = PreflightReport(source=cfg.source or "<config>", device=cfg.device, device_problem=check_device(cfg.device))
    report.models = [check_model(cfg, m) for m in cfg.models]
    report.datasets = [check_dataset(cfg, d, hashes=hashes, decode=decode) for d in cfg.datasets]
    return report


def runnable_models(cfg: RunConfig, left_out: dict[str, str] | None = None, *,
                    announce: bool = True) -> tuple[list[ModelSpec], dict[str, str]]:
    """The models of ``cfg`` a run uses, and the optional ones left out (name → why; logged when ``announce``)."""
    if left_out is None:
        left_out = {m.label: f"optional model left out: weight files absent ({', '.join(model_weights(m)[2])})"
                    for m in cfg.models if m.optional and check_model(cfg, m).status == "left-out"}
    for name, why in left_out.items() if announce else ():
        log.warning("%s: %s", name, why)
    return [m for m in cfg.models if m.label not in left_out], left_out


def summary(report: PreflightReport) -> dict[str, Any]:
    """Counts for the run log: per dataset cases / images present / missing."""
    return {d.name: {"split": d.split, "cases": d.cases, "images_present": d.images_present,
                     "images_missing": len(d.images_missing)} for d in report.datasets}
