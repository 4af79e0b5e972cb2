"""Builders of hostile input files (pickles, maps, YAML configs, images), shared by the CLI harness
(``test_cli_errors.py``), the reader-level tests and the fuzz seeds. Each builder writes into a folder and returns
the path it wrote; nothing here reads the files."""
from __future__ import annotations

import collections
import io
import pickle
import struct
import warnings
import zlib
from pathlib import Path

import numpy as np
import torch

PHANTOM_CLASSES = ["Cardiomegaly", "Pleural Effusion", "Consolidation", "Nodule", "Pneumothorax",
                   "Interstitial Pattern"]


# -- pickles, written opcode by opcode -----------------------------------------------------------------------------
def _binunicode(text: str) -> bytes:
    raw = text.encode("utf-8")
    return b"X" + struct.pack("<I", len(raw)) + raw


def _global(module: str, name: str) -> bytes:
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def _put(i: int) -> bytes:
    return b"r" + struct.pack("<I", i)  # LONG_BINPUT


def _get(i: int) -> bytes:
    return b"j" + struct.pack("<I", i)  # LONG_BINGET


def memo_reuse_pickle(calls: int = 3000, text_bytes: int = 2**20, func: tuple[str, str] = ("_codecs", "encode"),
                      second: str | None = "latin1", as_list: bool = False) -> bytes:
    """``{"map": [f(s[, second]), f(s[, second]), ...]}``: one memoised string of ``text_bytes`` (``as_list``: the
    list of its bytes as ints, built once) passed ``calls`` times to an admitted call, each result kept."""
    value = _binunicode("x" * text_bytes)
    if as_list:  # list(b"xxx…"): a list of ints
        value = _global("builtins", "list") + b"B" + struct.pack("<I", text_bytes) + b"x" * text_bytes + b"\x85R"
    body = [b"\x80\x02}", _put(0), value, _put(2), b"0", _global(*func), _put(3), b"0",
            _binunicode(second or ""), _put(4), b"0", _binunicode("map"), b"]", _put(1), b"("]
    one = _get(3) + _get(2) + (_get(4) + b"\x86" if second is not None else b"\x85") + b"R"
    body.append(one * calls)
    body.append(b"es.")  # APPENDS, SETITEM, STOP
    return b"".join(body)


def numpy_reuse_pickle(calls: int = 3000, nbytes: int = 2**20) -> bytes:
    """``{"w": [array, array, ...]}``: numpy ``_reconstruct`` + ``BUILD`` from one memoised bytes object of
    ``nbytes``, ``calls`` times (each a new float32 array of ``nbytes``)."""
    dtype = (_global("numpy", "dtype") + _binunicode("f4") + b"\x89\x88\x87R"  # dtype('f4', False, True)
             + b"(K\x03" + _binunicode("<") + b"NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00tb")
    body = [b"\x80\x02}", _put(0), b"B" + struct.pack("<I", nbytes) + b"\x00" * nbytes, _put(2), b"0",
            dtype, _put(3), b"0", _binunicode("w"), b"]", _put(1), b"("]
    one = (_global("numpy.core.multiarray", "_reconstruct") + _global("numpy", "ndarray") + b"K\x00\x85"
           + b"C\x01b\x87R" + b"(K\x01" + b"J" + struct.pack("<i", nbytes // 4) + b"\x85" + _get(3) + b"\x89"
           + _get(2) + b"tb")
    body.append(one * calls)
    body.append(b"es.")
    return b"".join(body)


def _doubling(first: int, levels: int) -> list[bytes]:
    """Memo ``first`` = ``(1,)``, memo ``first + i + 1`` = ``(t_i, t_i)``; nothing left on the stack."""
    body = [b"K\x01\x85", _put(first), b"0"]
    for i in range(levels):
        body += [_get(first + i), _get(first + i), b"\x86", _put(first + i + 1), b"0"]
    return body


def doubling_tuple_pickle(levels: int = 60, as_key: bool = True) -> bytes:
    """A tuple that doubles at each of ``levels`` levels (2**levels leaves through shared references, ~15 bytes a
    level), used as a dict key (hashed) or as the map's value."""
    body = [b"\x80\x02}", _put(0), *_doubling(1, levels)]
    top = 1 + levels
    if as_key:
        body += [_binunicode("map"), b"K\x00", b"s", _get(top), b"K\x01", b"s."]
    else:
        body += [_binunicode("map"), _get(top), b"s."]
    return b"".join(body)


def str_of_doubling_tuple_pickle(levels: int = 60) -> bytes:
    """``{"map": str(t)}`` with ``t`` a doubling tuple: ``str`` would walk 2**levels leaves."""
    body = [b"\x80\x02}", _put(0), *_doubling(1, levels), _binunicode("map"), _global("builtins", "str"),
            _get(1 + levels), b"\x85R", b"s."]
    return b"".join(body)


def long_length_pickle(opcode: str) -> bytes:
    """A protocol-4 pickle whose ``FRAME`` or ``BINUNICODE8`` declares 2**40 bytes in a file of a few bytes."""
    if opcode == "FRAME":
        return b"\x80\x04\x95" + struct.pack("<Q", 2**40) + b"}."
    return b"\x80\x04}" + _binunicode("map") + b"\x8d" + struct.pack("<Q", 2**40) + b"abc" + b"s."


def nested_list_map_pickle(levels: int = 40) -> bytes:
    """``{"map": l}`` with ``l = [l', l']`` doubling per level (shared lists): a nested list, not a tensor."""
    body = [b"\x80\x02}", _put(0), b"]K\x01a", _put(1), b"0"]
    for i in range(levels):
        body += [b"]", _get(1 + i), b"a", _get(1 + i), b"a", _put(2 + i), b"0"]
    body += [_binunicode("map"), _get(1 + levels), b"s."]
    return b"".join(body)


class _Reduce:
    def __init__(self, func, *args):
        self.func, self.args = func, args

    def __reduce__(self):
        return (self.func, self.args)


def zero_stride_view_pickle(side: int = 20000) -> bytes:
    """cheXlocalize layout whose ``map`` is a 1×1×side×side view of one float with zero strides (~1.7 KB)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # TypedStorage deprecation: plain pickle still writes them
        storage = torch.ones(1).storage()
    view = _Reduce(torch._utils._rebuild_tensor_v2, storage, 0, (1, 1, side, side), (0, 0, 0, 0), False,
                   collections.OrderedDict())
    return pickle.dumps({"map": view, "prob": 0.5, "task": "Nodule"}, protocol=2)


def dtype_view_pickle(dtype: torch.dtype) -> bytes:
    """cheXlocalize layout whose ``map`` is rebuilt (``_rebuild_tensor_v3``) with a quantized / bit-packed dtype."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        storage = torch.zeros(4, dtype=torch.uint8).storage()
    view = _Reduce(torch._utils._rebuild_tensor_v3, storage, 0, (1, 1, 2, 2), (4, 4, 2, 1), False,
                   collections.OrderedDict(), dtype)
    return pickle.dumps({"map": view, "prob": 0.5}, protocol=2)


def write_chexlocalize(folder: Path, payload: bytes, task: str = "Nodule") -> Path:
    """A cheXlocalize folder holding one map pickle ``test_00000_<task>_map.pkl``; returns the folder."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"test_00000_{task}_map.pkl").write_bytes(payload)
    return folder


# -- maps for ``xbench score`` ------------------------------------------------------------------------------------
def write_npz_maps(folder: Path, maps: dict[str, dict[str, np.ndarray]], probs_csv: str | None = None) -> Path:
    """A maps folder: one ``<case>.npz`` per entry of ``maps`` (class → array), optionally a ``probs.csv``."""
    folder.mkdir(parents=True, exist_ok=True)
    for case, arrays in maps.items():
        np.savez(folder / f"{case}.npz", **arrays)
    if probs_csv is not None:
        (folder / "probs.csv").write_text(probs_csv)
    return folder


def good_maps(shape: tuple[int, int] = (8, 8), cases: int = 4) -> dict[str, dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    return {f"test_{i:05d}": {c: rng.random(shape).astype(np.float32) for c in PHANTOM_CLASSES} for i in range(cases)}


# -- YAML -----------------------------------------------------------------------------------------------------------
def billion_laughs(levels: int = 9, width: int = 9) -> str:
    """A YAML alias bomb: ``width ** levels`` leaves from a few hundred bytes."""
    lines = ['a0: &a0 ["lol"]']
    for i in range(1, levels + 1):
        lines.append(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * width)}]")
    return "\n".join(lines)


# -- images ---------------------------------------------------------------------------------------------------------
def png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def png(extra: bytes = b"", width: int = 4, height: int = 4, idat_length: int | None = None,
        ihdr_length: int | None = None) -> bytes:
    """A greyscale PNG with ``extra`` chunks before its image data; ``idat_length`` / ``ihdr_length`` forge the
    length field of that chunk (a fuzzed file: Pillow reads the chunks with the forged length)."""
    raw = b"".join(b"\x00" + bytes(range(width)) for _ in range(height))
    idat = png_chunk(b"IDAT", zlib.compress(raw))
    if idat_length is not None:
        idat = struct.pack(">I", idat_length) + idat[4:]
    ihdr = png_chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
    if ihdr_length is not None:
        ihdr = struct.pack(">I", ihdr_length) + ihdr[4:]
    return b"\x89PNG\r\n\x1a\n" + ihdr + extra + idat + png_chunk(b"IEND", b"")


def ztxt_bomb(inflated: int = 8 * 2**20) -> bytes:
    """A zTXt chunk that inflates to ``inflated`` bytes (Pillow's own text-chunk bound is 1 MiB)."""
    return png_chunk(b"zTXt", b"Comment\x00\x00" + zlib.compress(b"A" * inflated, 9))


def iccp_bomb(inflated: int = 8 * 2**20) -> bytes:
    return png_chunk(b"iCCP", b"icc\x00\x00" + zlib.compress(b"\x00" * inflated, 9))


def deflated_dicom(path: Path, filler: int = 64 * 2**20, rows: int = 8, cols: int = 8) -> Path:
    """A DICOM with the Deflated Explicit VR Little Endian transfer syntax whose dataset inflates to more than
    ``filler`` bytes (a private OB element of zeros) around an 8×8 image."""
    from pydicom.dataset import Dataset, FileMetaDataset
    from pydicom.uid import DeflatedExplicitVRLittleEndian, SecondaryCaptureImageStorage, generate_uid

    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = SecondaryCaptureImageStorage
    meta.MediaStorageSOPInstanceUID = generate_uid()
    meta.TransferSyntaxUID = DeflatedExplicitVRLittleEndian
    ds = Dataset()
    ds.file_meta = meta
    ds.SOPClassUID, ds.SOPInstanceUID = meta.MediaStorageSOPClassUID, meta.MediaStorageSOPInstanceUID
    ds.Rows, ds.Columns, ds.SamplesPerPixel, ds.PhotometricInterpretation = rows, cols, 1, "MONOCHROME2"
    ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 16, 15, 0
    ds.add_new(0x00091010, "OB", b"\x00" * filler)
    ds.PixelData = np.arange(rows * cols, dtype=np.uint16).tobytes()
    buf = io.BytesIO()
    ds.save_as(buf, enforce_file_format=True)
    path.write_bytes(buf.getvalue())
    return path
