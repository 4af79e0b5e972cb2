"""The compressed chunk layouts of the results store (xbench/store/results.py, issue 22): the zstd layout written now
(byte planes ``maps_z0``, ``maps_z1``, … as zstd frames) and the layouts written before it (shuffled-zlib planes
``maps_b*``; ``np.savez`` with ``maps``), all read, also mixed in one folder and from a store written by the previous
code; bit-identical round trips (NaN payloads, ±inf, −0.0, subnormals; Hypothesis over any bit patterns);
deterministic bytes; bounded and named errors for truncated / edited / inflating / inconsistent members and for
sizes declared beyond ``meta.json`` (Hypothesis mutations of whole files and of a frame alone); metric tables that do
not depend on the layout."""
from __future__ import annotations

import io
import json
import shutil
import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from xbench.core.errors import StoreError
from xbench.store import results
from xbench.store.fingerprint import file_sha256
from xbench.store.results import STORE_VERSION, ResultStore, encode_chunk, read_chunk_file

FINDINGS = ["Nodule", "Effusion", "Mass"]
GRID = [5, 7]
ORDER = ("case_ids", "scores", "probs", "maps", "sizes", "windows", "skipped_ids", "skipped_reasons")
LAYOUTS = ("zstd", "zlib", "savez")  # written now; the shuffled-zlib layout before it; np.savez before compression
DATA = Path(__file__).resolve().parents[1] / "data"


def _meta(**changes) -> dict:
    return {"dataset": "toy", "model": "m", "findings": FINDINGS, "grid": GRID, "chunk_size": 4, "params": {},
            "code_version": "0.1.0", "created": "2025-01-01T00:00:00", **changes}


@pytest.fixture()
def store(tmp_path) -> ResultStore:
    s = ResultStore(tmp_path / "run")
    s.prepare("toy", "m", _meta())
    return s


def _special_maps(dtype: type, n: int = 4, seed: int = 0) -> np.ndarray:
    """Random maps of ``dtype`` with every special bit pattern: NaNs (quiet, signalling-payload, negative), ±inf,
    −0.0, +0.0, subnormals, the largest finite values."""
    rng = np.random.default_rng(seed)
    maps = rng.normal(size=(n, len(FINDINGS), *GRID)).astype(dtype)
    bits = maps.view(np.uint16 if dtype == np.float16 else np.uint32).reshape(-1)
    info = np.finfo(dtype)
    specials = np.array([np.nan, -np.nan, np.inf, -np.inf, -0.0, 0.0, info.tiny / 4, -info.tiny / 2, info.max,
                         -info.max], dtype=dtype).view(bits.dtype)
    payload_nan = np.array([0x7C01 if dtype == np.float16 else 0x7F800001, 0xFE03 if dtype == np.float16 else 0xFFC00123],
                           dtype=bits.dtype)
    bits[: len(specials)] = specials
    bits[len(specials): len(specials) + 2] = payload_nan
    return maps


def _as_layout(store: ResultStore, path: Path, layout: str) -> None:
    """Rewrite a chunk that ``write_chunk`` wrote (zstd layout) in ``layout``, with a matching index."""
    if layout == "zstd":
        return
    arrays = read_chunk_file(path)
    arrays = {k: arrays[k] for k in ORDER}
    if layout == "zlib":
        path.write_bytes(encode_chunk(arrays, codec="zlib"))  # what the store wrote before zstd
    else:
        np.savez(path, **arrays)  # the writer before the compressed layouts
    store._write_index(path, store.meta("toy", "m"))


def _write(store: ResultStore, chunk: int, maps: np.ndarray, ids: list[str], layout: str = "zstd") -> Path:
    n = len(ids)
    scores = np.linspace(-3, 3, n * len(FINDINGS), dtype=np.float32).reshape(n, -1)
    scores[0, 0] = -0.0
    path = store.write_chunk("toy", "m", chunk, case_ids=ids, scores=scores, probs=1 / (1 + np.exp(-scores)),
                             maps=maps, skipped={"z9": "MissingFileError: gone"} if chunk == 0 else {},
                             sizes=np.full((n, 2), 512), windows=np.tile([0.0, 0.0, 512.0, 512.0], (n, 1)))
    _as_layout(store, path, layout)
    return path


def _members(path: Path) -> dict[str, zipfile.ZipInfo]:
    with zipfile.ZipFile(path) as archive:
        return {i.filename: i for i in archive.infolist()}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_maps_round_trip_bit_for_bit(store, dtype, layout):
    maps = _special_maps(dtype)
    path = _write(store, 0, maps, ["a", "b", "c", "d"], layout)
    got = store.read("toy", "m")
    assert got.maps.dtype == dtype and got.maps.shape == maps.shape
    assert got.maps.tobytes() == maps.tobytes()  # every bit, NaN payloads and signs included
    assert np.signbit(got.scores[0, 0]) and got.skipped == {"z9": "MissingFileError: gone"}
    assert read_chunk_file(path)["maps"].flags.writeable
    if layout == "savez":
        return
    itemsize, prefix = np.dtype(dtype).itemsize, {"zstd": "maps_z", "zlib": "maps_b"}[layout]
    with np.load(path, allow_pickle=False) as data:  # plain NumPy lists the members: maps as byte planes
        assert "maps" not in data.files and data["maps_shape"].tolist() == list(maps.shape)
        assert [f for f in data.files if f.startswith("maps_")] == ["maps_shape", *(f"{prefix}{k}" for k in range(itemsize))]
        planes = [data[f"{prefix}{k}"] for k in range(itemsize)]
    if layout == "zstd":  # each plane one zstd frame: decodable with zstandard alone
        planes = [np.frombuffer(zstandard.ZstdDecompressor().decompress(p.tobytes()), np.uint8) for p in planes]
    assert results.unshuffle_bytes(planes, np.dtype(dtype).newbyteorder("<"), maps.shape).tobytes() == maps.tobytes()


def test_frames_are_stored_with_checksum_and_noise_planes_stay_raw(store):
    rng = np.random.default_rng(1)
    smooth = np.broadcast_to(rng.random((1, len(FINDINGS), *GRID)), (4, len(FINDINGS), *GRID)).astype(np.float16)
    path = _write(store, 0, smooth, ["a", "b", "c", "d"])
    members = _members(path)
    assert {i.date_time for i in members.values()} == {(1980, 1, 1, 0, 0, 0)}
    assert {members[f"maps_z{k}.npy"].compress_type for k in range(2)} == {zipfile.ZIP_STORED}  # frames never deflated
    with np.load(path) as data:
        frames = [data[f"maps_z{k}"].tobytes() for k in range(2)]
    n = smooth.size
    assert all(zstandard.get_frame_parameters(f).has_checksum and zstandard.frame_content_size(f) == n for f in frames)
    noise = np.frombuffer(rng.bytes(2 * 20000), np.float16)  # the low byte of noise: kept raw (about its own size)
    low = zstandard.ZstdCompressor(level=results.ZSTD_LEVEL).compress(results.shuffle_bytes(noise)[0])
    assert len(low) >= noise.size
    wide = np.broadcast_to(smooth[:1], (400, len(FINDINGS), *GRID))
    assert len(encode_chunk({"maps": np.ascontiguousarray(wide)})) < 0.6 * wide.nbytes  # high byte planes shrink


@pytest.mark.parametrize("codec", results.MAPS_CODECS)
def test_same_arrays_give_the_same_bytes(tmp_path, codec):
    maps = _special_maps(np.float16)
    files = []
    for name in ("one", "two"):
        s = ResultStore(tmp_path / name)
        s.prepare("toy", "m", _meta(created=name))  # meta differs only in an uncompared key
        files.append(_write(s, 0, maps, ["a", "b", "c", "d"], codec).read_bytes())
    assert files[0] == files[1]
    arrays = read_chunk_file(tmp_path / "one" / "store" / "toy" / "m" / "chunk-00000.npz")
    assert encode_chunk(arrays, codec=codec) == encode_chunk({k: v.copy() for k, v in arrays.items()}, codec=codec)


def test_every_layout_is_read_in_one_folder(store):
    parts = [(_special_maps(np.float16, 4, 1), ["a", "b", "c", "d"]), (_special_maps(np.float16, 2, 2), ["e", "f"]),
             (_special_maps(np.float16, 3, 3), ["g", "h", "i"])]
    for chunk, ((maps, ids), layout) in enumerate(zip(parts, ("savez", "zlib", "zstd"))):
        _write(store, chunk, maps, ids, layout)
    with np.load(store.chunk_path("toy", "m", 0)) as data:
        assert "maps" in data.files and "maps_b0" not in data.files
    got = store.read("toy", "m", expected_chunks=3)
    assert got.case_ids.tolist() == list("abcdefghi")
    assert got.maps.tobytes() == np.concatenate([m for m, _ in parts]).tobytes()
    assert got.skipped == {"z9": "MissingFileError: gone"}


def _previous_store_arrays(chunk: int) -> dict:
    """The arrays of ``tests/data/store_previous`` chunk ``chunk`` (as ``write_chunk`` keyword arguments)."""
    rng = np.random.default_rng(100 + chunk)
    n = 4 if chunk == 0 else 3
    maps = _special_maps(np.float16, n, 100 + chunk)
    return {"case_ids": [f"c{chunk}_{i}" for i in range(n)], "scores": rng.normal(size=(n, 3)).astype(np.float32),
            "probs": rng.random((n, 3)).astype(np.float32), "maps": maps,
            "skipped": {f"s{chunk}": "MissingFileError: gone"}, "sizes": np.full((n, 2), 512),
            "windows": np.tile([0.0, 0.0, 512.0, 512.0], (n, 1))}


#: meta.json of tests/data/store_previous (written by the previous code: see test_a_store_written_before_...)
PREVIOUS_META = _meta(chunk_size=4)


def test_a_store_written_before_is_resumed_and_read(tmp_path):
    """``tests/data/store_previous``: chunk 0 written by the store of commit 15917f9 (``np.savez``), chunk 1 by commit
    25a2089 (shuffled planes, zlib), each with its index. Made by ``write_chunk`` of those commits' results.py with
    :func:`_previous_store_arrays` and :data:`PREVIOUS_META`. This code accepts the folder's meta.json on resume
    (``store_version`` unchanged), keeps both chunks, adds a zstd chunk, and reads all three bit for bit."""
    shutil.copytree(DATA / "store_previous", tmp_path / "run")
    s = ResultStore(tmp_path / "run")
    assert json.loads((s.folder("toy", "m") / "meta.json").read_text())["store_version"] == STORE_VERSION
    s.prepare("toy", "m", {**PREVIOUS_META, "created": "later", "code_version": "9.9"})  # resume: no refusal
    assert s.has_chunk("toy", "m", 0) and s.has_chunk("toy", "m", 1) and not s.has_chunk("toy", "m", 2)
    members = [sorted(_members(s.chunk_path("toy", "m", k))) for k in (0, 1)]
    assert "maps.npy" in members[0] and {"maps_b0.npy", "maps_b1.npy", "maps_shape.npy"} <= set(members[1])
    s.write_chunk("toy", "m", 2, **_previous_store_arrays(2))
    assert "maps_z1.npy" in _members(s.chunk_path("toy", "m", 2))
    got = s.read("toy", "m", expected_chunks=3)
    want = [_previous_store_arrays(k) for k in range(3)]
    assert got.case_ids.tolist() == [c for w in want for c in w["case_ids"]]
    for key in ("scores", "probs", "maps", "sizes", "windows"):
        assert getattr(got, key).tobytes() == np.concatenate([np.asarray(w[key], getattr(got, key).dtype)
                                                              for w in want]).tobytes(), key
    assert got.skipped == {f"s{k}": "MissingFileError: gone" for k in range(3)}


def _forge_index(store: ResultStore, path: Path) -> None:
    """The attacker (or a broken copy) also fixes the chunk's index, so only the reader's own checks remain."""
    index = store.index_path(path)
    entry = json.loads(index.read_text())
    entry.update(size=path.stat().st_size, sha256=file_sha256(path))
    index.write_text(json.dumps(entry))


def _rezip(path: Path, change) -> None:
    """Rewrite the chunk's zip with ``change(name, data) -> (name, data, compress_type) | None`` per member."""
    with zipfile.ZipFile(path) as archive:
        members = [(i.filename, archive.read(i.filename), i.compress_type) for i in archive.infolist()]
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as archive:
        for name, data, method in members:
            new = change(name, data, method)
            if new is not None:
                archive.writestr(new[0], new[1], compress_type=new[2])
    path.write_bytes(buf.getvalue())


def _npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, array)
    return buf.getvalue()


def _frame(data: bytes, **options) -> bytes:
    """``data`` as the .npy of a zstd frame member (``options``: ZstdCompressor's)."""
    return _npy(np.frombuffer(zstandard.ZstdCompressor(**{"write_checksum": True, **options}).compress(data), np.uint8))


@pytest.mark.parametrize("layout, member", [("zstd", "maps_z1.npy"), ("zstd", "maps_z0.npy"), ("zlib", "maps_b1.npy")])
def test_truncated_compressed_member_is_named(store, layout, member):
    path = _write(store, 0, _special_maps(np.float16), ["a", "b", "c", "d"], layout)
    data = bytearray(path.read_bytes())
    info = _members(path)[member]
    assert info.compress_type == (zipfile.ZIP_DEFLATED if layout == "zlib" else zipfile.ZIP_STORED)
    start = info.header_offset + 30 + len(info.filename) + len(info.extra)
    data[start + info.compress_size // 2: start + info.compress_size] = b"\0" * (info.compress_size - info.compress_size // 2)
    path.write_bytes(bytes(data))  # the member's data cut in half (zeros after), sizes unchanged
    with pytest.raises(StoreError, match=r"chunk-00000\.npz.*xbench run"):  # the index still catches it
        store.read("toy", "m")
    _forge_index(store, path)
    with pytest.raises(StoreError, match=rf"chunk-00000\.npz, field '{member}'.*xbench run"):
        store.read("toy", "m")
    path.write_bytes(bytes(data[: len(data) // 2]))  # the file cut in half
    _forge_index(store, path)
    with pytest.raises(StoreError, match=r"chunk-00000\.npz.*xbench run"):
        store.read("toy", "m")


@pytest.mark.parametrize("at", [0, 1, 2, -5, -1])
def test_one_flipped_bit_in_a_frame_is_caught(store, at):
    """The frames' CRC-32 is not computed (zstd's own checksum stands for it): a flipped bit anywhere in a frame —
    header, raw noise block, compressed block, checksum — is still refused, naming the member."""
    path = _write(store, 0, _special_maps(np.float16), ["a", "b", "c", "d"])
    for member in ("maps_z0.npy", "maps_z1.npy"):
        original = path.read_bytes()
        info = _members(path)[member]
        start = info.header_offset + 30 + len(info.filename) + len(info.extra) + 128  # after the .npy header
        pos = start + at if at >= 0 else start + info.compress_size - 128 + at
        if at == 2:  # the middle of the frame's blocks
            pos = start + (info.compress_size - 128) // 2
        data = bytearray(original)
        data[pos] ^= 0x10
        path.write_bytes(bytes(data))
        _forge_index(store, path)
        with pytest.raises(StoreError, match=rf"chunk-00000\.npz, field '{member}'.*xbench run"):
            store.read("toy", "m")
        path.write_bytes(original)
        _forge_index(store, path)


@pytest.mark.parametrize("member", ["maps_b1.npy", "maps_z1.npy"])
def test_inflating_member_is_refused_before_decompression(store, monkeypatch, member):
    layout = "zlib" if member.startswith("maps_b") else "zstd"
    path = _write(store, 0, _special_maps(np.float16), ["a", "b", "c", "d"], layout)
    n_max = 4 * len(FINDINGS) * GRID[0] * GRID[1]  # chunk_size x findings x grid
    bomb = _npy(np.zeros(64 * 2**20, np.uint8))  # 64 MiB of zeros: deflates to ~64 KiB
    _rezip(path, lambda name, data, method: (name, bomb if name == member else data, zipfile.ZIP_DEFLATED))
    assert path.stat().st_size < 2**20
    _forge_index(store, path)
    calls = []
    monkeypatch.setattr(results, "unshuffle_bytes", lambda *a: calls.append(a))
    limit = n_max if layout == "zlib" else results._zstd_bound(n_max)
    with pytest.raises(StoreError, match=rf"chunk-00000\.npz, field '{member}': member declares {len(bomb)} "
                                         rf"bytes; at most {limit} data bytes"):
        store.read("toy", "m")
    assert not calls


def test_a_frame_declaring_more_than_its_plane_is_refused_before_decompression(store, monkeypatch):
    """A frame of a few bytes declaring 100,000 (zeros: a zstd bomb within the member's size limit) and ``maps_shape``
    declaring more values than meta.json allows are both refused from their declared sizes: nothing is decompressed."""
    path = _write(store, 0, _special_maps(np.float16), ["a", "b", "c", "d"])
    original = path.read_bytes()
    bomb = _frame(bytes(100_000), level=1)
    assert len(bomb) < 200
    _rezip(path, lambda name, data, m: (name, bomb if name == "maps_z1.npy" else data, m))
    _forge_index(store, path)
    decoded = []
    real = results._zstd

    class Spy:  # zstandard, recording every decompression
        def __getattr__(self, name):
            return getattr(real(), name)

        def ZstdDecompressor(self):  # noqa: N802 - the name it stands for
            class D:
                def decompress(self, frame, **kw):
                    decoded.append(len(frame))
                    return real().ZstdDecompressor().decompress(frame, **kw)
            return D()

    monkeypatch.setattr(results, "_zstd", Spy)
    with pytest.raises(StoreError, match=r"chunk-00000\.npz, field 'maps_z1\.npy': the zstd frame declares 100000 "
                                         r"bytes .*maps_shape needs 420 bytes"):
        store.read("toy", "m")
    assert len(decoded) <= 1  # maps_z0 (420 bytes) at most, never the bomb
    path.write_bytes(original)
    _rezip(path, lambda name, data, m: (name, _npy(np.array([10**6, 3, 5, 7])) if name == "maps_shape.npy" else data, m))
    _forge_index(store, path)
    decoded.clear()
    with pytest.raises(StoreError, match=r"chunk-00000\.npz: maps_shape \[1000000, 3, 5, 7\] declares 105000000 values; "
                                         r"at most 420 are expected"):
        store.read("toy", "m")
    assert not decoded


def _declare_size(data: bytearray, member: str, size: int) -> None:
    """Set ``member``'s uncompressed size in the zip's central directory (what readers trust) to ``size``."""
    pos = data.find(b"PK\x01\x02")
    while pos != -1:
        name_len = struct.unpack("<H", data[pos + 28: pos + 30])[0]
        if data[pos + 46: pos + 46 + name_len] == member.encode():
            data[pos + 24: pos + 28] = struct.pack("<I", size)
        pos = data.find(b"PK\x01\x02", pos + 4)


@pytest.mark.parametrize("extra, message", [(20_000, "inflates to more than its declared"),
                                            (1_000_000, "compressed size .* does not fit its declared")])
@pytest.mark.parametrize("member", ["maps_b1.npy", "case_ids.npy"])
def test_member_that_expands_past_its_declared_size_is_refused(store, member, extra, message):
    """A deflated member whose stream inflates to ``extra`` bytes more than it declares: refused from its compressed
    size when that is beyond deflate's worst case for the declared size, else when inflating passes the size."""
    path = _write(store, 0, _special_maps(np.float16), ["a", "b", "c", "d"], "zlib" if "maps" in member else "zstd")
    with zipfile.ZipFile(path) as archive:
        npy = archive.read(member)
    longer = npy + b"\0" * extra  # the stream inflates to more than the size it declares
    _rezip(path, lambda name, data, method: (name, longer if name == member else data, zipfile.ZIP_DEFLATED))
    data = bytearray(path.read_bytes())
    _declare_size(data, member, len(npy))
    path.write_bytes(bytes(data))
    _forge_index(store, path)
    with pytest.raises(StoreError, match=rf"chunk-00000\.npz, field '{member}'.*{message}"):
        store.read("toy", "m")


def _replace(member: str, new) -> callable:
    return lambda name, data, m: (name, new, m) if name == member else (name, data, m)


N = 4 * len(FINDINGS) * GRID[0] * GRID[1]


@pytest.mark.parametrize("layout, change, message", [
    ("zlib", _replace("maps_shape.npy", _npy(np.array([4, 3, 5, 8]))), "do not fit together"),
    ("zlib", lambda name, data, m: None if name == "maps_b1.npy" else (name, data, m), "do not fit together"),
    ("zlib", _replace("maps_b0.npy", _npy(np.zeros(3, np.uint8))), "do not fit together"),
    ("zlib", lambda name, data, m: ("maps_b9.npy" if name == "maps_b1.npy" else name, data, m), "unexpected member"),
    ("zstd", _replace("maps_shape.npy", _npy(np.array([4, 3, 5, 6]))), "the zstd frame declares 420 bytes"),
    ("zstd", _replace("maps_shape.npy", _npy(np.array([4, 3, 5, 8]))), "declares 480 values; at most 420"),
    ("zstd", _replace("maps_shape.npy", _npy(np.array([4, 3, 5]))), "do not fit together"),
    ("zstd", _replace("maps_shape.npy", _npy(np.array([4, -3, 5, -7]))), "do not fit together"),
    ("zstd", lambda name, data, m: None if name == "maps_z1.npy" else (name, data, m), "do not fit together"),
    ("zstd", lambda name, data, m: None if name == "maps_shape.npy" else (name, data, m), "do not fit together"),
    ("zstd", _replace("maps_z0.npy", _frame(bytes(3))), "the zstd frame declares 3 bytes"),
    ("zstd", _replace("maps_z0.npy", _frame(bytes(N), write_checksum=False)), "without a checksum"),
    ("zstd", _replace("maps_z0.npy", _frame(bytes(N), write_content_size=False)), r"declares -1 bytes \(-1: unknown\)"),
    ("zstd", _replace("maps_z0.npy", _npy(np.frombuffer(_frame(bytes(N))[128:] + b"\0\0", np.uint8))),
     "not a readable zstd frame"),
    ("zstd", _replace("maps_z0.npy", _npy(np.zeros(8, np.uint16))), "must be a 1-d uint8 array"),
    ("zstd", lambda name, data, m: ("maps_z9.npy" if name == "maps_z1.npy" else name, data, m), "unexpected member"),
])
def test_inconsistent_map_members_are_named(store, layout, change, message):
    path = _write(store, 0, _special_maps(np.float16), ["a", "b", "c", "d"], layout)
    _rezip(path, change)
    _forge_index(store, path)
    with pytest.raises(StoreError, match=rf"chunk-00000\.npz.*{message}.*xbench run"):
        store.read("toy", "m")


def test_planes_of_both_codecs_in_one_chunk_are_refused(store):
    path = _write(store, 0, _special_maps(np.float16), ["a", "b", "c", "d"])
    with zipfile.ZipFile(path, "a") as archive:
        archive.writestr("maps_b0.npy", _npy(np.zeros(N, np.uint8)))
    _forge_index(store, path)
    with pytest.raises(StoreError, match=r"chunk-00000\.npz: map members \['maps_b0', 'maps_z0', 'maps_z1'\].*do not fit"):
        store.read("toy", "m")


def test_text_beyond_the_reader_bound_is_refused_or_cut_when_writing(store, monkeypatch):
    monkeypatch.setattr(results, "MAX_TEXT_CHARS", 60)
    with pytest.raises(StoreError, match=r"case_ids holds a text longer than 60 characters"):
        _write(store, 0, _special_maps(np.float16), ["a", "b", "c", "x" * 61])
    assert not store.chunk_path("toy", "m", 0).exists()
    reason = "DecodeError: " + "y" * 100  # a skip reason is diagnostic text: cut, its Type: prefix kept
    store.write_chunk("toy", "m", 0, case_ids=["a"], scores=np.zeros((1, 3)), probs=np.zeros((1, 3)),
                      maps=np.zeros((1, 3, *GRID), np.float16), skipped={"b": reason})
    got = store.read("toy", "m").skipped["b"]
    assert len(got) == 60 and got.startswith("DecodeError: yyy") and got.endswith("[113 characters, cut to fit the store]")


def test_expected_content_is_read_however_well_it_compresses(tmp_path, monkeypatch):
    """The generic .npz bound (XBENCH_MAX_EXPANSION × file size) does not refuse what meta.json allows."""
    monkeypatch.setenv("XBENCH_MIN_EXPANDED_BYTES", "1000")
    monkeypatch.setenv("XBENCH_MAX_EXPANSION", "2")
    s = ResultStore(tmp_path / "run")
    s.prepare("toy", "m", _meta(chunk_size=64))
    zeros = np.zeros((64, len(FINDINGS), *GRID), np.float32)  # 26,880 bytes of maps in a ~3 KB file
    path = s.write_chunk("toy", "m", 0, case_ids=[f"c{i}" for i in range(64)], scores=np.zeros((64, 3)),
                         probs=np.zeros((64, 3)), maps=zeros, skipped={})
    assert path.stat().st_size * 2 < zeros.nbytes
    assert s.read("toy", "m").maps.tobytes() == zeros.tobytes()


def test_without_meta_the_generic_bound_holds_for_frames(tmp_path, monkeypatch):
    """A chunk read without a meta.json (``read_chunk_file`` of a lone file): the frames' declared sizes are held to
    the generic ``.npz`` bound instead of meta.json's."""
    path = tmp_path / "chunk-00000.npz"
    path.write_bytes(encode_chunk({"case_ids": np.array(["a"]), "maps": np.zeros((1, 1, 64, 64), np.float16)}))
    assert read_chunk_file(path)["maps"].shape == (1, 1, 64, 64)
    monkeypatch.setenv("XBENCH_MIN_EXPANDED_BYTES", "1000")
    monkeypatch.setenv("XBENCH_MAX_EXPANSION", "2")
    with pytest.raises(StoreError, match=r"chunk-00000\.npz: maps_shape \[1, 1, 64, 64\] declares 4096 values; at most"):
        read_chunk_file(path)


def test_maps_larger_than_meta_allows_are_refused_when_writing(store):
    with pytest.raises(StoreError, match=r"maps of shape \(4, 3, 6, 7\) exceeds what meta.json allows"):
        _write(store, 0, np.zeros((4, len(FINDINGS), 6, 7), np.float16), ["a", "b", "c", "d"])
    assert not store.chunk_path("toy", "m", 0).exists()


# -- Hypothesis: any bit patterns round trip; mutated files are read unchanged or refused naming the file ---------
_HYPOTHESIS = settings(max_examples=60, derandomize=True, deadline=None, database=None,
                       suppress_health_check=list(HealthCheck))
_META = _meta(chunk_size=5, grid=[6, 6])


@_HYPOTHESIS
@given(itemsize=st.sampled_from([2, 4]), n=st.integers(0, 5), c=st.integers(1, 3), h=st.integers(1, 6),
       w=st.integers(1, 6), codec=st.sampled_from(results.MAPS_CODECS), seed=st.integers(0, 2**32 - 1),
       special=st.lists(st.sampled_from([0x7C01, 0xFE03, 0x8000, 0x7C00, 0xFC00, 0x0001, 0x7FFF, 0x7F800001,
                                         0xFFC00123, 0x80000000]), max_size=8))
def test_any_bit_patterns_round_trip_and_give_the_same_bytes(tmp_path_factory, itemsize, n, c, h, w, codec, seed,
                                                             special):
    rng = np.random.default_rng(seed)
    word = np.dtype(f"<u{itemsize}")
    bits = rng.integers(0, 2 ** (8 * itemsize), size=n * c * h * w, dtype=np.uint64).astype(word)
    bits[: len(special)] = np.array(special, np.uint64)[: bits.size] & (2 ** (8 * itemsize) - 1)
    maps = bits.view(f"<f{itemsize}").reshape(n, c, h, w)
    arrays = {"case_ids": np.array([f"c{i}" for i in range(n)], dtype=str), "scores": rng.random((n, c), np.float32),
              "maps": maps, "skipped_ids": np.array(["x"]), "skipped_reasons": np.array(["MissingFileError: gone"])}
    data = encode_chunk(arrays, codec=codec)
    assert encode_chunk({k: v.copy() for k, v in arrays.items()}, codec=codec) == data  # deterministic bytes
    path = tmp_path_factory.mktemp("rt") / "chunk-00000.npz"
    path.write_bytes(data)
    got = read_chunk_file(path, _META)
    assert set(got) == set(arrays)
    for key, want in arrays.items():
        assert got[key].dtype == want.dtype and got[key].shape == want.shape and got[key].tobytes() == want.tobytes()


_EDIT = st.tuples(st.integers(0, 2), st.integers(0, 1 << 16),
                  st.one_of(st.binary(min_size=1, max_size=8),
                            st.sampled_from([b"\xff" * 8, b"\x00" * 8, b"\x7f\xff\xff\xff", b"PK\x03\x04", b"(\xb5/\xfd"])))


def _mutate(data: bytes, edits: list[tuple[int, int, bytes]], cut: int | None, lo: int = 0, hi: int | None = None) -> bytes:
    """``data`` with overwrites / insertions / deletions at positions within [lo, hi), then cut at ``cut``."""
    out = bytearray(data)
    span = (len(out) if hi is None else hi) - lo
    for op, at, chunk in edits:
        i = lo + at % max(span, 1)
        if op == 0:
            out[i:i + len(chunk)] = chunk
        elif op == 1:
            out[i:i] = chunk
        else:
            del out[i:i + len(chunk)]
    return bytes(out[:cut] if cut is not None else out)


def _fuzz_chunk(tmp_path_factory) -> tuple[Path, dict, bytes]:
    folder = tmp_path_factory.mktemp("fuzz")
    s = ResultStore(folder)
    s.prepare("toy", "m", _meta())
    path = _write(s, 0, _special_maps(np.float16), ["a", "b", "c", "d"])
    return path, read_chunk_file(path), path.read_bytes()


def _read_or_refuse(path: Path, original: dict) -> str:
    try:
        got = read_chunk_file(path, _meta())
    except StoreError as exc:
        assert "chunk-00000.npz" in str(exc), exc
        return "refused"
    assert set(got) == set(original) and all(got[k].tobytes() == original[k].tobytes() for k in original)
    return "read"


def test_mutated_chunk_files_are_read_unchanged_or_refused(tmp_path_factory):
    """Hypothesis edits anywhere in a zstd-layout chunk (zip structure, headers, frames): every file is either read
    with every array unchanged or refused with a StoreError naming it — never another exception."""
    path, original, data = _fuzz_chunk(tmp_path_factory)
    seen: dict[str, int] = {}

    @_HYPOTHESIS
    @given(edits=st.lists(_EDIT, min_size=1, max_size=4), cut=st.one_of(st.none(), st.integers(0, len(data))))
    def check(edits, cut):
        path.write_bytes(_mutate(data, edits, cut))
        outcome = _read_or_refuse(path, original)
        seen[outcome] = seen.get(outcome, 0) + 1

    check()
    assert seen.get("refused", 0) > 0, seen


@pytest.mark.parametrize("member", ["maps_z0.npy", "maps_z1.npy"])
def test_mutated_frames_are_refused_without_the_zip_crc(tmp_path_factory, member):
    """Edits inside one frame (whose zip CRC-32 the reader skips): zstd's checks refuse every one that changes
    the maps (the zip sizes are kept consistent, so only the frame's own checks stand)."""
    path, original, data = _fuzz_chunk(tmp_path_factory)
    info = _members(path)[member]
    lo = info.header_offset + 30 + len(info.filename) + len(info.extra) + 128  # the frame, after its .npy header
    hi = lo + info.compress_size - 128
    seen: dict[str, int] = {}

    @_HYPOTHESIS
    @given(edits=st.lists(st.tuples(st.just(0), st.integers(0, 1 << 16), st.binary(min_size=1, max_size=8)),
                          min_size=1, max_size=4))
    def check(edits):
        mutated = _mutate(data, edits, None, lo, hi)[: len(data)]
        path.write_bytes(mutated[:hi] + data[hi:])  # overwrites only: sizes and offsets stay valid
        outcome = _read_or_refuse(path, original)
        seen[outcome] = seen.get(outcome, 0) + 1

    check()
    assert seen.get("refused", 0) > 0, seen


def test_tables_do_not_depend_on_the_chunk_layout(phantom_run, tmp_path):
    """The session phantom run (zstd layout) and copies whose chunks are rewritten in the shuffled-zlib and in the
    np.savez layouts give byte-identical metric tables."""
    from conftest import tiny_run

    from xbench.evaluation.evaluate import evaluate_run
    from xbench.spec.config import RunConfig

    copies = {}
    for name in LAYOUTS:
        out = tmp_path / name
        shutil.copytree(phantom_run / "store", out / "store")
        for extra in ("fitted",):
            if (phantom_run / extra).exists():
                shutil.copytree(phantom_run / extra, out / extra)
        copies[name] = out
    chunks = sorted(ResultStore(copies["zstd"]).root.rglob("chunk-*.npz"))
    assert chunks and all("maps_z0.npy" in zipfile.ZipFile(c).namelist() for c in chunks)
    for name in ("zlib", "savez"):
        other = ResultStore(copies[name])
        for chunk in sorted(other.root.rglob("chunk-*.npz")):
            arrays = read_chunk_file(chunk)
            arrays = {k: arrays[k] for k in ORDER}
            if name == "zlib":
                chunk.write_bytes(encode_chunk(arrays, codec="zlib"))
            else:
                np.savez(chunk, **arrays)
            other._write_index(chunk, other._read_meta(chunk.parent / "meta.json"))
    tables = {}
    for name, out in copies.items():
        evaluate_run(RunConfig.from_dict(tiny_run(out)), progress=False)
        tables[name] = {p.relative_to(out / "tables"): p.read_bytes() for p in sorted((out / "tables").rglob("*.csv"))}
    assert tables["zstd"] and tables["zstd"] == tables["zlib"] == tables["savez"]
