"""Hostile weights files through the commands users run: ``xbench weights check`` and ``xbench run``.

The reader-level cases are in ``test_bounded_work.py`` and ``test_checkpoint_payloads.py``; here each hostile file
is put where a model's weights are expected (CheXzero's ``chexzero.pt``, the reference model's
``model.safetensors``, CLIP's TorchScript ``ViT-B-16.pt``) and the command runs in the capped CLI worker of
``test_cli_errors.py`` (``RLIMIT_AS`` = its size after importing the CLI and the model libraries + 1.5 GiB, 60 s a
command).

* ``xbench run`` (the phantom, 4 cases): exit 2, one ``xbench: error:`` line naming the file, the archive member
  where the file is a torch archive, and the reason; no traceback.
* ``xbench weights check`` is a report: exit 1 ("the check found problems", as ``xbench check``), the file's line
  ``[  error] <file>: <reason>`` in the report (once, the path not repeated), one summary line on stderr, no
  traceback. A command error (an unknown model) is exit 2 with one ``xbench: error:`` line.
"""
from __future__ import annotations

import collections
import io
import json
import struct
import warnings
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

import hostile
from test_cli_errors import TIME_LIMIT_S, CliWorker
from xbench.cli import build_parser


@dataclass
class Weights:
    """A hostile weights file: ``write(folder)`` puts it under the name ``model`` expects; ``expect``: texts of the
    error (the file's name is always expected too); ``member``: the archive member named in ``xbench run``'s line."""

    id: str
    model: str
    file: str
    write: Callable[[Path], None]
    expect: tuple[str, ...]
    member: str | None = "archive/data.pkl"


def _archive(data_pkl: bytes, torchscript: bool = False) -> bytes:
    """A torch zip archive (stored members, as torch writes them) whose ``archive/data.pkl`` is ``data_pkl``."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("archive/data.pkl", data_pkl)
        if torchscript:
            archive.writestr("archive/constants.pkl", b"\x80\x02).")
        archive.writestr("archive/byteorder", "little")
        archive.writestr("archive/version", "3\n")
    return buf.getvalue()


def _bytes(name: str, payload: bytes) -> Callable[[Path], None]:
    return lambda folder: (folder / name).write_bytes(payload)


class _View:
    def __init__(self, *args):
        self.args = args

    def __reduce__(self):
        return (torch._utils._rebuild_tensor_v2, self.args)


def _zero_stride(folder: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # TypedStorage deprecation
        storage = torch.ones(4).storage()
    view = _View(storage, 0, (1, 1, 20000, 20000), (0, 0, 0, 0), False, collections.OrderedDict())
    torch.save({"visual.conv1.weight": view}, folder / "chexzero.pt")


def _quantized(folder: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # quantized tensor creation is deprecated in torch
        weight = torch.quantize_per_tensor(torch.rand(4), 0.1, 0, torch.qint8)
    torch.save({"visual.conv1.weight": weight}, folder / "chexzero.pt")


def _pid_doubling() -> bytes:
    body = [b"\x80\x02}", hostile._put(0), *hostile._doubling(1, 60), hostile._binunicode("w"), hostile._get(61),
            b"Q", b"s."]
    return b"".join(body)


def _safetensors(header: dict | None, length: int | None = None, data: bytes = b"\x00" * 4) -> bytes:
    text = json.dumps(header).encode() if header is not None else b"{}"
    return struct.pack("<Q", len(text) if length is None else length) + text + data


def _chexzero(payload: bytes) -> Callable[[Path], None]:
    return _bytes("chexzero.pt", payload)


WEIGHTS = [
    Weights("memo-reuse-codecs", "chexzero", "chexzero.pt", _chexzero(_archive(hostile.memo_reuse_pickle())),
            ("calling _codecs.encode", "exceed")),
    Weights("memo-reuse-bytearray-legacy", "chexzero", "chexzero.pt",
            _chexzero(hostile.memo_reuse_pickle(func=("builtins", "bytearray"))), ("calling builtins.bytearray",
                                                                                   "exceed"), member=None),
    Weights("memo-reuse-size", "chexzero", "chexzero.pt", _chexzero(_archive(hostile.memo_reuse_pickle(
        func=("torch", "Size"), second=None, as_list=True))), ("calling torch.Size", "exceed")),
    Weights("numpy-reconstruct-reuse", "chexzero", "chexzero.pt", _chexzero(_archive(hostile.numpy_reuse_pickle())),
            ("building numpy array", "exceed")),
    Weights("doubling-tuple-key", "chexzero", "chexzero.pt", _chexzero(_archive(hostile.doubling_tuple_pickle(60))),
            ("nested parts",)),
    Weights("str-of-doubling-tuple", "chexzero", "chexzero.pt",
            _chexzero(_archive(hostile.str_of_doubling_tuple_pickle(60))), ("str() of a tuple",)),
    Weights("doubling-persistent-id", "chexzero", "chexzero.pt", _chexzero(_archive(_pid_doubling())),
            ("persistent id", "is not a torch storage")),
    Weights("frame-length", "chexzero", "chexzero.pt", _chexzero(_archive(hostile.long_length_pickle("FRAME"))),
            ("passes the end of the pickle",)),
    Weights("binunicode8-length-legacy", "chexzero", "chexzero.pt",
            _chexzero(hostile.long_length_pickle("BINUNICODE8")), ("passes the end of the pickle",), member=None),
    Weights("zero-stride-view", "chexzero", "chexzero.pt", _zero_stride, ("(1, 1, 20000, 20000)", "storage holds 4"),
            member="chexzero/data.pkl"),  # torch.save names the archive's folder after the file
    Weights("qint8-dtype", "chexzero", "chexzero.pt", _chexzero(_archive(hostile.dtype_view_pickle(torch.qint8))),
            ("torch.qint8", "not supported")),
    Weights("bits8-dtype", "chexzero", "chexzero.pt", _chexzero(_archive(hostile.dtype_view_pickle(torch.bits8))),
            ("torch.bits8", "not supported")),
    Weights("quantized-tensor", "chexzero", "chexzero.pt", _quantized, ("quantized",), member="chexzero/data.pkl"),
    Weights("torchscript-memo-reuse", "clip", "ViT-B-16.pt",
            _bytes("ViT-B-16.pt", _archive(hostile.memo_reuse_pickle(), torchscript=True)),
            ("calling _codecs.encode", "exceed")),
    Weights("safetensors-header-length", "ref_xattn", "model.safetensors",
            _bytes("model.safetensors", _safetensors(None, length=2**40)), ("not a readable safetensors file",),
            member=None),
    Weights("safetensors-offsets-past-end", "ref_xattn", "model.safetensors",
            _bytes("model.safetensors", _safetensors({"w": {"dtype": "F32", "shape": [20000, 20000],
                                                            "data_offsets": [0, 1_600_000_000]}})),
            ("not a readable safetensors file",), member=None),
]
PRELOAD = ("xbench.models.chexzero", "xbench.models.clip", "xbench.models.reference", "xbench.workflows.run")
RUN = ("output_dir: {tmp}/out\ndatasets: [{{name: phantom, cases: 4}}]\n"
       "models: [{{name: {model}, weights: {tmp}/weights}}]\ngrid: [16, 16]\nbootstrap: {{replicates: 0}}\n")


@pytest.fixture(scope="module")
def cli(tmp_path_factory):
    home = tmp_path_factory.mktemp("cli-home")
    holder = {"worker": CliWorker(home, PRELOAD), "home": home}
    yield holder
    holder["worker"].close()


def _run(cli: dict, args: list[str], cwd: Path) -> dict:
    try:
        done = cli["worker"].run(args, cwd)
    except TimeoutError:
        cli["worker"] = CliWorker(cli["home"], PRELOAD)
        pytest.fail(f"xbench {' '.join(args)[:200]} ran past {TIME_LIMIT_S} s")
    assert "Traceback" not in done["stderr"] + done["stdout"], done["stderr"][-3000:]
    return done


def _weights_folder(tmp: Path, case: Weights) -> Path:
    folder = tmp / "weights"
    folder.mkdir()
    case.write(folder)
    return folder


@pytest.mark.parametrize("case", WEIGHTS, ids=[c.id for c in WEIGHTS])
def test_weights_check_reports_the_file_and_exits_1(tmp_path, case, cli):
    folder = _weights_folder(tmp_path, case)
    done = _run(cli, ["weights", "check", case.model, str(folder)], tmp_path)
    assert done["code"] == 1, (done["code"], done["stderr"][-2000:])
    errors = [line for line in done["stdout"].splitlines() if line.startswith("  [  error]")]
    assert len(errors) == 1, done["stdout"][-3000:]
    named = case.file + (f" (member {case.member})" if case.member else "")
    assert errors[0].startswith(f"  [  error] {named}: "), errors[0]
    assert str(folder) not in errors[0], errors[0]  # the report's first line names the folder; the path is not repeated
    for text in case.expect:
        assert text in errors[0], (text, errors[0])
    assert len(errors[0]) < 2000
    assert done["stdout"].rstrip().endswith("PROBLEMS: see the lines above")
    assert done["stderr"].strip().splitlines() == ["xbench: weights check: 1 problem(s), listed above"], done["stderr"]


@pytest.mark.parametrize("case", WEIGHTS, ids=[c.id for c in WEIGHTS])
def test_run_with_hostile_weights_gives_one_error_line(tmp_path, case, cli):
    _weights_folder(tmp_path, case)
    config = tmp_path / "run.yaml"
    config.write_text(RUN.format(tmp=tmp_path, model=case.model))
    done = _run(cli, ["run", "--config", str(config), "-q"], tmp_path)
    assert done["code"] == 2, (done["code"], done["stderr"][-2000:])
    lines = [line for line in done["stderr"].splitlines() if line.startswith("xbench: error:")]
    assert len(lines) == 1, done["stderr"][-2000:]
    named = str(tmp_path / "weights" / case.file) + (f" (member {case.member})" if case.member else "")
    for text in (named, *case.expect):
        assert text in lines[0], (text, lines[0])
    assert len(lines[0]) < 2000


class _Exec:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({str(self.marker)!r}, 'w').close()",))


READ_BUT_REFUSED = {  # read safely, refused by the strict load: (state, texts of the errors)
    "exec-payload": (lambda marker: {"visual.conv1.weight": torch.zeros(2), "hook": _Exec(marker)},
                     ("entry 'hook' is a exec, not a tensor",)),
    "integer-key": (lambda marker: {0: torch.zeros(2)}, ("key 0 is a int, not a string",)),
}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A worker with 4 GiB headroom: CheXzero's network is built (ViT-B/32, ~600 MB of float32 weights) before the
    strict load, more than the hostile cases' 1.5 GiB leaves after other commands."""
    home = tmp_path_factory.mktemp("cli-built")
    holder = {"worker": CliWorker(home, PRELOAD, headroom=4 << 30), "home": home}
    yield holder
    holder["worker"].close()


@pytest.mark.parametrize("name", sorted(READ_BUT_REFUSED))
def test_a_state_the_strict_load_refuses_is_one_line_and_never_runs(tmp_path, built, name):
    """A planted ``exec`` payload or a non-string key: read (the payload as an inert placeholder, named by the
    check), refused by the strict load naming the file and the entry, in the check's architecture line and in the
    run's error line; never called."""
    marker = tmp_path / "marker"
    state, expect = READ_BUT_REFUSED[name]
    folder = tmp_path / "weights"
    folder.mkdir()
    torch.save(state(marker), folder / "chexzero.pt")
    done = _run(built, ["weights", "check", "chexzero", str(folder)], tmp_path)
    errors = [line for line in done["stdout"].splitlines() if line.startswith("  [  error]")]
    assert done["code"] == 1 and len(errors) == 1 and errors[0].startswith("  [  error] architecture:"), done
    config = tmp_path / "run.yaml"
    config.write_text(RUN.format(tmp=tmp_path, model="chexzero"))
    run = _run(built, ["run", "--config", str(config), "-q"], tmp_path)
    lines = [line for line in run["stderr"].splitlines() if line.startswith("xbench: error:")]
    assert run["code"] == 2 and len(lines) == 1, run
    for text in (str(folder / "chexzero.pt"), *expect):
        assert text in errors[0] and text in lines[0], (text, errors[0], lines[0])
    assert not marker.exists()


def test_weights_check_command_errors_exit_2(tmp_path, cli):
    done = _run(cli, ["weights", "check", "no_such_model", str(tmp_path)], tmp_path)
    lines = [line for line in done["stderr"].splitlines() if line.startswith("xbench: error:")]
    assert done["code"] == 2 and len(lines) == 1 and "no_such_model" in lines[0], done


def test_weights_check_help_states_the_exit_status():
    parser = build_parser()
    text = " ".join(parser.get_default("_commands")["weights"].format_help().split())
    assert "exit status: 0 every file present and loading strictly; 1 problems found" in text, text
    assert "2 the command could not run" in text, text
