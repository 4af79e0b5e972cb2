"""``xbench weights check NAME DIR``: verify a local weights folder before a run.

For each file the model's config names (``weights:`` of ``xbench/configs/models/<name>.yaml``):

* present, under the publisher's name (a missing one is reported with where it is published);
* checkpoints read safely (:func:`xbench.models.checkpoint.read_checkpoint_report`: how it was read,
  how many tensors, which pickled types were kept as inert placeholders);
* tokenizer folders (``*/`` entries holding ``vocab.txt``) load as a BERT WordPiece tokenizer;
* then the adapter is built from the folder exactly as a run builds it (``create_model(NAME,
  weights=DIR)``): strict key and shape match of every checkpoint and text encoder against the
  architecture. Its error, if any, is printed as is.

When a config lists several checkpoint files (CLIP: ``.bin``, ``.safetensors`` or OpenAI's ``.pt``),
one of them is enough. The report's :attr:`WeightsReport.ok` is the exit status of the command: 0 when every file
is present and loads strictly, 1 when the check found problems (:attr:`WeightsReport.problems` lines, also counted
on stderr), as ``xbench check``; a command that cannot run (an unknown model) is an error, exit 2. A file's error
line names it by its name in the folder (``chexzero.pt (member archive/data.pkl): …``), not by its full path again.
"""
from __future__ import annotations

import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..core.errors import XBenchError
from ..spec.registry import model_config

__all__ = ["WeightsReport", "check_weights"]

CHECKPOINT_SUFFIXES = (".pt", ".pth", ".ckpt", ".bin", ".safetensors")


@dataclass
class WeightsReport:
    """Per-file lines (``status`` ``ok`` / ``missing`` / ``error`` / ``skipped``) and the build result."""

    name: str
    folder: Path
    lines: list[tuple[str, str, str]] = field(default_factory=list)  # (status, file, detail)
    build: tuple[str, str] | None = None  # (status, detail)

    @property
    def problems(self) -> int:
        """Lines that are neither ``ok`` nor ``skipped`` (the architecture line included)."""
        return sum(s not in ("ok", "skipped") for s, _, _ in self.lines) + (self.build is not None
                                                                            and self.build[0] == "error")

    @property
    def ok(self) -> bool:
        return self.problems == 0

    def format(self) -> str:
        out = [f"weights check: {self.name} in {self.folder}"]
        out += [f"  [{status:>7}] {name}: {detail}" for status, name, detail in self.lines]
        if self.build is not None:
            out.append(f"  [{self.build[0]:>7}] architecture: {self.build[1]}")
        out.append("OK: the folder is complete and loads strictly" if self.ok else "PROBLEMS: see the lines above")
        return "\n".join(out)


def _count_tensors(obj: object) -> int:
    if isinstance(obj, torch.Tensor):
        return 1
    if isinstance(obj, dict):
        return sum(_count_tensors(v) for v in obj.values())
    if isinstance(obj, list | tuple):
        return sum(_count_tensors(v) for v in obj)
    return 0


def _short(path: Path, rel: str, text: str) -> tuple[str, str]:
    """``(name, detail)`` of a reader's message about ``path``: its leading ``<path>[ (member M)]: `` becomes the
    line's name ``rel[ (member M)]`` (the report's header names the folder already).

    >>> _short(Path("/w/a.pt"), "a.pt", "/w/a.pt (member archive/data.pkl): refused")
    ('a.pt (member archive/data.pkl)', 'refused')
    >>> _short(Path("/w/a.pt"), "a.pt", "something else")
    ('a.pt', 'something else')
    """
    found = re.match(rf"{re.escape(str(path))}( \(member [^)]*\))?: ", text)
    return (rel + (found.group(1) or ""), text[found.end():]) if found else (rel, text)


def _check_checkpoint(path: Path) -> tuple[str, str]:
    from .checkpoint import read_checkpoint_report, read_torchscript_state_dict

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if path.name == "ViT-B-16.pt":
                state, report = read_torchscript_state_dict(path)
                return "ok", f"{len(state)} tensors; {report.describe()}"
            obj, report = read_checkpoint_report(path)
    except XBenchError as exc:
        return "error", str(exc)
    return "ok", f"{_count_tensors(obj)} tensors; read with {report.describe()}"


def _check_tokenizer(folder: Path, source: str | None) -> tuple[str, str]:
    """The folder's tokenizer as its adapter builds it: CXR-BERT folders (``config.json`` of the remote-code type
    ``cxr-bert``, BioViL) from their ``vocab.txt`` alone, any other with :func:`~xbench.models.text.load_bert_tokenizer`."""
    from .text import load_bert_tokenizer, read_json

    try:
        if (folder / "config.json").is_file() and read_json(folder / "config.json").get("model_type") == "cxr-bert":
            from .biovil import cxr_bert_tokenizer

            tokenizer = cxr_bert_tokenizer(folder, source)
        else:
            tokenizer = load_bert_tokenizer(folder, source=source)
    except XBenchError as exc:
        return "error", str(exc)
    present = sorted(p.name for p in folder.iterdir() if p.is_file())
    return "ok", f"BERT WordPiece tokenizer, {len(tokenizer.get_vocab())} tokens (files: {', '.join(present)})"


def check_weights(name: str, folder: str | Path) -> WeightsReport:
    """Verify ``folder`` as the weights folder of model ``name`` (module docstring); never raises for bad files."""
    from .base import create_model

    folder = Path(folder)
    report = WeightsReport(name, folder)
    config = model_config(name)
    entries = dict(config.get("weights") or {})
    if not entries:
        report.lines.append(("skipped", "-", f"model {name!r} takes no weights files"))
        return report
    checkpoints = [k for k, e in entries.items() if str(e.get("path", "")).endswith(CHECKPOINT_SUFFIXES)]
    alternatives = len(checkpoints) > 1
    for key, entry in entries.items():
        rel = str(entry.get("path", ""))
        path = folder / rel
        source = entry.get("source")
        if not path.exists():
            if alternatives and key in checkpoints and any((folder / entries[k]["path"]).exists() for k in checkpoints):
                report.lines.append(("skipped", rel, "absent; another of the alternative checkpoint files is present"))
            else:
                where = f" (published at {source})" if source else ""
                report.lines.append(("missing", rel, f"expected at {path}{where}"))
            continue
        if key in checkpoints:
            status, detail = _check_checkpoint(path)
            report.lines.append((status, *_short(path, rel, detail)))
        elif rel.endswith("/") and (path / "vocab.txt").exists():
            status, detail = _check_tokenizer(path, source)
            report.lines.append((status, rel, detail))
        elif rel.endswith("/"):
            report.lines.append(("missing", rel + "vocab.txt", f"tokenizer vocabulary expected at {path / 'vocab.txt'}"
                                 + (f" (published at {source})" if source else "")))
        else:
            report.lines.append(("ok", rel, f"present, {path.stat().st_size} bytes"))
    if any(s in ("missing", "error") for s, _, _ in report.lines):
        report.build = ("skipped", "not built: fix the files above first")
        return report
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            adapter = create_model(name, weights=folder)
    except Exception as exc:  # noqa: BLE001 - any failure of the build is reported by its message
        report.build = ("error", f"{type(exc).__name__}: {exc}")
        return report
    detail = (f"{type(adapter).__name__} built from the folder; every checkpoint and text encoder "
              f"matched the architecture strictly (weights label {adapter.weights_label!r})")
    report.build = ("ok", detail)
    return report
