"""``xbench.core.safe_arrays.read_npz`` reads members in one piece and parses NumPy's own ``.npy`` headers without
``literal_eval`` (falling back to NumPy's parser for any other header): it gives what ``np.load`` gives for every
admitted dtype, order and format version, writable arrays of their own, and refuses zip members whose local header
disagrees with the central directory, that are encrypted, or whose CRC-32 is wrong (except for members the caller
checks itself)."""
from __future__ import annotations

import io
import struct
import zipfile

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from xbench.core import safe_arrays
from xbench.core.errors import FormatError
from xbench.core.safe_arrays import read_npz

ARRAYS = {
    "f2": np.array([[0.5, -0.0], [np.inf, np.nan]], np.float16),
    "big_endian": np.arange(6, dtype=">f4").reshape(2, 3),
    "fortran": np.asfortranarray(np.arange(12, dtype=np.int32).reshape(3, 4)),
    "scalar": np.array(3.25),
    "empty": np.zeros((0, 3), np.uint8),
    "text": np.array(["a", "bcd", ""]),
    "bytes": np.array([b"x", b"yz"]),
    "flags": np.array([True, False]),
    "complex": np.array([1 + 2j, -3j], np.complex64),
}


def _member(name: str, array: np.ndarray, version: tuple[int, int] | None = None) -> tuple[str, bytes]:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, array, version=version, allow_pickle=False)
    return f"{name}.npy", buf.getvalue()


def _zip(members: list[tuple[str, bytes]], method: int = zipfile.ZIP_STORED) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", method) as archive:
        for name, data in members:
            archive.writestr(name, data)
    return buf.getvalue()


@pytest.mark.parametrize("method", [zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED])
@pytest.mark.parametrize("version", [None, (2, 0)])
def test_read_npz_gives_what_np_load_gives(tmp_path, method, version):
    path = tmp_path / "a.npz"
    path.write_bytes(_zip([_member(k, v, version) for k, v in ARRAYS.items()], method))
    got = read_npz(path)
    with np.load(path, allow_pickle=False) as data:
        want = {k: data[k] for k in data.files}
    assert list(got) == list(want) == list(ARRAYS)
    for key, array in want.items():
        assert got[key].dtype == array.dtype and got[key].shape == array.shape, key
        assert got[key].tobytes() == array.tobytes(), key
        assert got[key].flags.writeable and got[key].flags.c_contiguous, key
    got["f2"][0, 0] = 7  # arrays of their own: writing one changes no other
    assert read_npz(path)["f2"][0, 0] == 0.5 and got["big_endian"][0, 1] == 1


@settings(max_examples=40, derandomize=True, deadline=None, database=None)
@given(array=hnp.arrays(st.sampled_from([np.uint8, np.int64, np.float16, np.float32, np.float64, np.dtype(">i2")]),
                        hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5)),
       method=st.sampled_from([zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED]))
def test_any_plain_array_round_trips(tmp_path_factory, array, method):
    path = tmp_path_factory.mktemp("npz") / "a.npz"
    path.write_bytes(_zip([_member("x", array)], method))
    got = read_npz(path)["x"]
    assert got.dtype == array.dtype and got.shape == array.shape and got.tobytes() == array.tobytes()


def test_a_header_numpy_would_not_write_goes_to_numpys_parser(tmp_path):
    header = b"{'shape': (2,), 'fortran_order': False, 'descr': '<i8'}"  # other key order: not the fast pattern
    header += b" " * (63 - (len(header) + 10) % 64) + b"\n"
    npy = b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header + np.array([5, 6], "<i8").tobytes()
    path = tmp_path / "a.npz"
    path.write_bytes(_zip([("x.npy", npy)]))
    assert safe_arrays._npy_header(header) is None
    assert read_npz(path)["x"].tolist() == [5, 6]
    object_header = header.replace(b"'<i8'}", b"'|O'} ")  # an object array: refused by either parser, before any data
    path.write_bytes(_zip([("x.npy", npy.replace(header, object_header))]))
    with pytest.raises(FormatError, match=r"a\.npz, field 'x\.npy'.*not admitted"):
        read_npz(path)


@pytest.mark.parametrize("edit, message", [
    (lambda d, at: d[:at + 30] + b"y" + d[at + 31:], "local file header differs"),  # the member's name
    (lambda d, at: d[:at + 6] + struct.pack("<H", 1) + d[at + 8:], "local file header differs"),  # encrypted flag
    (lambda d, at: d[:at + 8] + struct.pack("<H", 8) + d[at + 10:], "local file header differs"),  # method
    (lambda d, at: d[:at] + b"PK\x09\x09" + d[at + 4:], "bad magic number"),
    (lambda d, at: d[:at + 40] + bytes([d[at + 40] ^ 1]) + d[at + 41:], "bad CRC-32"),  # a data byte
])
def test_local_header_and_crc_are_checked(tmp_path, edit, message):
    data = _zip([_member("x", np.arange(40, dtype=np.uint8))])
    at = data.index(b"PK\x03\x04")
    path = tmp_path / "a.npz"
    path.write_bytes(edit(data, at))
    with pytest.raises(FormatError, match=rf"a\.npz, field 'x\.npy'.*{message}"):
        read_npz(path)


def test_self_checked_members_skip_only_the_crc(tmp_path):
    data = bytearray(_zip([_member("x", np.arange(40, dtype=np.uint8)), _member("y", np.arange(3, dtype=np.uint8))]))
    at = data.index(b"PK\x03\x04")
    data[at + 30 + len("x.npy") + 128 + 5] ^= 1  # a data byte of x: its CRC no longer matches
    path = tmp_path / "a.npz"
    path.write_bytes(bytes(data))
    with pytest.raises(FormatError, match=r"field 'x\.npy'.*bad CRC-32"):
        read_npz(path)
    assert read_npz(path, self_checked=("x",))["x"][5] == 4  # the caller checks x's content itself
    with pytest.raises(FormatError, match=r"field 'x\.npy'.*bad CRC-32"):
        read_npz(path, self_checked=("y",))
