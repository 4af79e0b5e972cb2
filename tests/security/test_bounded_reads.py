"""Issue 20 items 3–6: no allocation a file asks for, bounded decompression, bounded nesting, named errors.

Every file is crafted by the test into ``tmp_path``. On a7aa795: sized constructors in a pickle allocated what they
asked (``torch.ByteTensor(n)``, ``numpy.ndarray(shape)``; ``bytearray(n)`` in a legacy file) and loaded as a state
dict; compressed archive members were inflated in full; 5,000 nested TorchScript modules gave a raw
``RecursionError``; ``xbench score`` passed numpy / safetensors errors through without the file."""
from __future__ import annotations

import io
import json
import pickle
import struct
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from xbench.core.errors import CheckpointError, FormatError, XBenchError
from xbench.models.base import load_checkpoint
from xbench.models.checkpoint import read_torchscript_state_dict
from xbench.workflows.score import load_maps


class Sized:
    def __init__(self, func, *args):
        self.func, self.args = func, args

    def __reduce__(self):
        return (self.func, self.args)


# -- item 3: allocations sized by the file --------------------------------------------------------------
@pytest.mark.parametrize("func,args", [(torch.ByteTensor, (2 * 10**9,)), (torch.FloatTensor, (10**9,)),
                                       (np.ndarray, ((10**9,),))], ids=["ByteTensor", "FloatTensor", "ndarray"])
def test_sized_constructors_in_an_archive_allocate_nothing(tmp_path, func, args):
    """Refused (an admitted marker such as ``numpy.ndarray`` is never callable) or kept as an inert placeholder
    (a name outside the allowlist): never a tensor or array of the asked size."""
    from xbench.models.checkpoint import CheckpointWarning, Placeholder

    path = tmp_path / "bomb.pth"
    torch.save({"w": torch.ones(2), "x": Sized(func, *args)}, path)
    try:
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            got = load_checkpoint(path)
    except CheckpointError as exc:
        assert "bomb.pth" in str(exc) and "is not admitted" in str(exc)
    else:
        assert isinstance(got["x"], Placeholder), type(got["x"])
        assert any(issubclass(w.category, CheckpointWarning) and func.__name__ in str(w.message) for w in record)


def test_legacy_checkpoint_bytearray_and_oversized_storage_are_refused(tmp_path):
    path = tmp_path / "legacy.pt"
    torch.save({"w": torch.ones(2), "x": Sized(bytearray, 10**8)}, path, _use_new_zipfile_serialization=False)
    with pytest.raises(CheckpointError, match=r"legacy\.pt.*bytearray from a int"):
        load_checkpoint(path)
    # a storage declaring more elements than the file holds: refused before anything is allocated
    good = tmp_path / "good.pt"
    torch.save({"w": torch.arange(4.0)}, good, _use_new_zipfile_serialization=False)
    data = good.read_bytes()
    forged = data.replace(b"K\x04N", b"J\x00\x00\x00\x40N", 1)  # numel 4 → 2**30 in the storage's persistent id
    assert forged != data
    (tmp_path / "forged.pt").write_bytes(forged)
    with pytest.raises(CheckpointError, match=r"forged\.pt.*bytes are left in the file"):
        load_checkpoint(tmp_path / "forged.pt")
    assert torch.equal(load_checkpoint(good)["w"], torch.arange(4.0))  # the legacy format itself still loads


def test_chexlocalize_nested_legacy_bytearray_is_refused(tmp_path):
    """A cheXlocalize pickle whose nested ``_load_from_bytes`` payload asks for ``bytearray(n)``."""
    from xbench.workflows.score import read_chexlocalize_pickle

    inner = io.BytesIO()
    torch.save(Sized(bytearray, 10**8), inner, _use_new_zipfile_serialization=False)
    path = tmp_path / "cxr_Edema_map.pkl"
    path.write_bytes(pickle.dumps({"map": Sized(torch.storage._load_from_bytes, inner.getvalue())}))
    with pytest.raises(FormatError, match=r"cxr_Edema_map\.pkl.*bytearray from a int"):
        read_chexlocalize_pickle(path)


# -- item 4: decompression bombs --------------------------------------------------------------------------
def _recompress(src: Path, dst: Path) -> None:
    with zipfile.ZipFile(src) as a, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as b:
        for info in a.infolist():
            b.writestr(info.filename, a.read(info))


def test_compressed_torch_archive_is_refused_before_inflating(tmp_path):
    torch.save({"w": torch.zeros(16 * 2**20)}, tmp_path / "plain.pth")  # 64 MiB of zeros
    _recompress(tmp_path / "plain.pth", tmp_path / "bomb.pth")
    assert (tmp_path / "bomb.pth").stat().st_size < 2**20
    with pytest.raises(CheckpointError, match=r"bomb\.pth.*compressed"):
        load_checkpoint(tmp_path / "bomb.pth")


def test_npz_bomb_is_refused_before_decompressing(tmp_path):
    path = tmp_path / "maps.npz"
    np.savez_compressed(path, maps=np.zeros((64, 1, 1024, 1024), np.float32), case_ids=np.array([f"c{i}" for i in range(64)]),
                        classes=np.array(["Nodule"]))  # 256 MiB in a few hundred kB
    assert path.stat().st_size < 2**20
    with pytest.raises(FormatError, match=r"maps\.npz.*expand to more than"):
        load_maps(path)


# -- item 5: nesting depth ---------------------------------------------------------------------------------
def test_deeply_nested_torchscript_modules_are_refused(tmp_path):
    depth = 5000
    body = b"\x80\x02" + b"c__torch__\nM\n)\x81}X\x05\x00\x00\x00child" * depth + b"N" + b"sb" * depth + b"."
    path = tmp_path / "ViT-B-16.pt"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", body)
        z.writestr("archive/constants.pkl", pickle.dumps((), protocol=2))
    with pytest.raises(CheckpointError, match=r"ViT-B-16\.pt.*nesting deeper than"):
        read_torchscript_state_dict(path)


# -- item 6: xbench score names the file for every numpy / safetensors error -------------------------------
def _npy_header(shape: tuple, descr: str = "<f4") -> bytes:
    header = repr({"descr": descr, "fortran_order": False, "shape": shape}).encode()
    header += b" " * (63 - (len(header) + 10) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header


CASES = {
    "object.npy": lambda p: np.save(p, np.array([[[None]]], dtype=object), allow_pickle=True),
    "huge.npy": lambda p: p.write_bytes(_npy_header((1, 2**21, 2**21)) + b"\0" * 64),  # 2**42 × 4 bytes = 16 TiB
    "short.npy": lambda p: p.write_bytes(_npy_header((1, 8, 8)) + b"\0" * 10),
    "member.npz": lambda p: p.write_bytes(_zip_with_lying_member()),
    "bad.safetensors": lambda p: p.write_bytes(struct.pack("<Q", 10**12) + b"{}"),
    "offsets.safetensors": lambda p: p.write_bytes(_safetensors({"Nodule": {"dtype": "F32", "shape": [4, 4],
                                                                            "data_offsets": [0, 10**9]}})),
}


def _zip_with_lying_member() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        z.writestr("Nodule.npy", _npy_header((8, 8)) + b"\0" * 256)
    data = bytearray(buf.getvalue())
    at = data.rfind(b"PK\x01\x02")  # central directory entry: uncompressed size at +24
    data[at + 24:at + 28] = struct.pack("<I", 2**32 - 1)
    data[at + 20:at + 24] = struct.pack("<I", 2**32 - 1)
    return bytes(data)


def _safetensors(header: dict) -> bytes:
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + b"\0" * 64


@pytest.mark.parametrize("name", sorted(CASES))
def test_score_errors_name_the_file(tmp_path, name):
    folder = tmp_path / "maps"
    folder.mkdir()
    CASES[name](folder / name)
    with pytest.raises(XBenchError, match=name.replace(".", r"\.")):
        load_maps(folder, classes=["Nodule"])


def _archive_with_two_tensors(tmp_path: Path) -> tuple[Path, dict[str, zipfile.ZipInfo]]:
    path = tmp_path / "two.pt"
    torch.save({"a": torch.arange(4096, dtype=torch.float32), "b": torch.ones(4096)}, path)
    with zipfile.ZipFile(path) as archive:
        infos = {i.filename.split("/", 1)[1]: i for i in archive.infolist()}
    return path, infos


def _data_offset(raw: bytes, info: zipfile.ZipInfo) -> int:
    name_len, extra_len = struct.unpack("<HH", raw[info.header_offset + 26: info.header_offset + 30])
    return info.header_offset + 30 + name_len + extra_len


def test_checkpoint_members_are_read_whole_and_a_damaged_or_misnamed_member_is_refused(tmp_path):
    """Members are read from their local header's data offset: the state loads bit for bit; one flipped byte of a
    tensor fails its CRC-32, and a local header naming another member is refused, each naming the member."""
    path, infos = _archive_with_two_tensors(tmp_path)
    state = load_checkpoint(path)
    assert torch.equal(state["a"], torch.arange(4096, dtype=torch.float32)) and torch.equal(state["b"], torch.ones(4096))

    raw = bytearray(path.read_bytes())
    damaged = bytearray(raw)
    damaged[_data_offset(raw, infos["data/1"]) + 100] ^= 0x01
    (tmp_path / "damaged.pt").write_bytes(damaged)
    with pytest.raises(CheckpointError, match=r"damaged\.pt: archive member .*data/1 is unreadable .*CRC-32"):
        load_checkpoint(tmp_path / "damaged.pt")

    misnamed = bytearray(raw)
    start = infos["data/1"].header_offset + 30
    name = bytes(misnamed[start: start + len(infos["data/1"].filename)])
    misnamed[start: start + len(name)] = name[:-1] + b"7"
    (tmp_path / "misnamed.pt").write_bytes(misnamed)
    with pytest.raises(CheckpointError, match=r"data/1 is unreadable \(its local header names another member\)"):
        load_checkpoint(tmp_path / "misnamed.pt")


def test_checkpoint_member_running_past_the_end_of_the_file_is_refused(tmp_path):
    """A member whose bytes would run past the end of the file (its local header's extra field made long) is refused
    before its buffer is filled."""
    path, infos = _archive_with_two_tensors(tmp_path)
    raw = bytearray(path.read_bytes())
    at = infos["data/1"].header_offset + 28
    raw[at: at + 2] = struct.pack("<H", 0xFFFF)
    (tmp_path / "long.pt").write_bytes(raw)
    with pytest.raises(CheckpointError, match=r"data/1 is unreadable \(its 16384 bytes from offset \d+ pass the end"):
        load_checkpoint(tmp_path / "long.pt")
