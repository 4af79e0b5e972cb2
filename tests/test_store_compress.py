"""The compressed chunk layout of the results store (xbench/store/results.py, issue 22 item 4): bit-identical round
trips (NaN payloads, ±inf, −0.0, subnormals), the old ``np.savez`` layout still read (also mixed in one folder),
deterministic bytes, bounded and named errors for truncated / inflated / inconsistent members, and metric tables
that do not depend on the layout."""
from __future__ import annotations

import io
import json
import shutil
import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest

from xbench.core.errors import StoreError
from xbench.store import results
from xbench.store.fingerprint import file_sha256
from xbench.store.results import ResultStore, encode_chunk, read_chunk_file

FINDINGS = ["Nodule", "Effusion", "Mass"]
GRID = [5, 7]


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


def _write(store: ResultStore, chunk: int, maps: np.ndarray, ids: list[str]) -> Path:
    n = len(ids)
    scores = np.linspace(-3, 3, n * len(FINDINGS), dtype=np.float32).reshape(n, -1)
    scores[0, 0] = -0.0
    return store.write_chunk("toy", "m", chunk, case_ids=ids, scores=scores, probs=1 / (1 + np.exp(-scores)),
                             maps=maps, skipped={"z9": "MissingFileError: gone"} if chunk == 0 else {},
                             sizes=np.full((n, 2), 512), windows=np.tile([0.0, 0.0, 512.0, 512.0], (n, 1)))


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_maps_round_trip_bit_for_bit(store, dtype):
    maps = _special_maps(dtype)
    path = _write(store, 0, maps, ["a", "b", "c", "d"])
    got = store.read("toy", "m")
    assert got.maps.dtype == dtype and got.maps.shape == maps.shape
    assert got.maps.tobytes() == maps.tobytes()  # every bit, NaN payloads and signs included
    assert np.signbit(got.scores[0, 0]) and got.skipped == {"z9": "MissingFileError: gone"}
    with np.load(path, allow_pickle=False) as data:  # plain NumPy still lists the byte planes
        planes = [data[f"maps_b{k}"] for k in range(np.dtype(dtype).itemsize)]
        assert "maps" not in data.files and data["maps_shape"].tolist() == list(maps.shape)
    assert results.unshuffle_bytes(planes, np.dtype(dtype).newbyteorder("<"), maps.shape).tobytes() == maps.tobytes()


def test_maps_are_compressed_and_noise_planes_stored(store):
    rng = np.random.default_rng(1)
    smooth = np.broadcast_to(rng.random((1, len(FINDINGS), *GRID)), (4, len(FINDINGS), *GRID)).astype(np.float16)
    path = _write(store, 0, smooth, ["a", "b", "c", "d"])
    with zipfile.ZipFile(path) as archive:
        methods = {i.filename: i.compress_type for i in archive.infolist()}
        assert {i.date_time for i in archive.infolist()} == {(1980, 1, 1, 0, 0, 0)}
    assert methods["maps_b1.npy"] == zipfile.ZIP_DEFLATED
    noise = np.frombuffer(rng.bytes(2 * 4 * 3 * 5 * 7 * 400), np.float16)  # a plane deflate cannot shrink: stored
    assert not results._deflates(np.ascontiguousarray(results.shuffle_bytes(noise)[0]).tobytes(), 1)
    assert results._deflates(results.shuffle_bytes(smooth)[1].tobytes(), 1)


def test_same_arrays_give_the_same_bytes(tmp_path):
    maps = _special_maps(np.float16)
    files = []
    for name in ("one", "two"):
        s = ResultStore(tmp_path / name)
        s.prepare("toy", "m", _meta(created=name))  # meta differs only in an uncompared key
        files.append(_write(s, 0, maps, ["a", "b", "c", "d"]).read_bytes())
    assert files[0] == files[1]
    arrays = read_chunk_file(tmp_path / "one" / "store" / "toy" / "m" / "chunk-00000.npz")
    assert encode_chunk(arrays) == encode_chunk({k: v.copy() for k, v in arrays.items()})


def test_old_uncompressed_chunks_still_load_next_to_new_ones(store):
    old_maps, new_maps = _special_maps(np.float16, 4, 1), _special_maps(np.float16, 2, 2)
    _write(store, 1, new_maps, ["e", "f"])
    path = _write(store, 0, old_maps, ["a", "b", "c", "d"])
    arrays = read_chunk_file(path)
    np.savez(path, **arrays)  # the writer before the compressed layout
    with np.load(path) as data:
        assert "maps" in data.files and "maps_b0" not in data.files
    store._write_index(path, store.meta("toy", "m"))
    got = store.read("toy", "m", expected_chunks=2)
    assert got.case_ids.tolist() == ["a", "b", "c", "d", "e", "f"]
    assert got.maps.tobytes() == np.concatenate([old_maps, new_maps]).tobytes()
    assert got.skipped == {"z9": "MissingFileError: gone"}


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


def test_truncated_compressed_member_is_named(store):
    path = _write(store, 0, _special_maps(np.float16), ["a", "b", "c", "d"])
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo("maps_b1.npy")
    assert info.compress_type == zipfile.ZIP_DEFLATED
    start = info.header_offset + 30 + len(info.filename) + len(info.extra)
    data[start + info.compress_size // 2: start + info.compress_size] = b"\0" * (info.compress_size - info.compress_size // 2)
    path.write_bytes(bytes(data))  # the deflate stream cut in half (zeros after), sizes unchanged
    with pytest.raises(StoreError, match=r"chunk-00000\.npz.*xbench run"):  # the index still catches it
        store.read("toy", "m")
    _forge_index(store, path)
    with pytest.raises(StoreError, match=r"chunk-00000\.npz, field 'maps_b1\.npy'.*xbench run"):
        store.read("toy", "m")
    path.write_bytes(bytes(data[: len(data) // 2]))  # the file cut in half
    _forge_index(store, path)
    with pytest.raises(StoreError, match=r"chunk-00000\.npz.*xbench run"):
        store.read("toy", "m")


def test_inflating_member_is_refused_before_decompression(store, monkeypatch):
    path = _write(store, 0, _special_maps(np.float16), ["a", "b", "c", "d"])
    n_max = 4 * len(FINDINGS) * GRID[0] * GRID[1]  # chunk_size x findings x grid
    bomb = _npy(np.zeros(64 * 2**20, np.uint8))  # 64 MiB of zeros: deflates to ~64 KiB
    _rezip(path, lambda name, data, method: (name, bomb if name == "maps_b1.npy" else data, zipfile.ZIP_DEFLATED))
    assert path.stat().st_size < 2**20
    _forge_index(store, path)
    calls = []
    monkeypatch.setattr(results, "unshuffle_bytes", lambda *a: calls.append(a))
    with pytest.raises(StoreError, match=rf"chunk-00000\.npz, field 'maps_b1\.npy': member declares {len(bomb)} "
                                         rf"bytes; at most {n_max} data bytes"):
        store.read("toy", "m")
    assert not calls


def _declare_size(data: bytearray, member: str, size: int) -> None:
    """Set ``member``'s uncompressed size in the zip's central directory (what readers trust) to ``size``."""
    pos = data.find(b"PK\x01\x02")
    while pos != -1:
        name_len = struct.unpack("<H", data[pos + 28: pos + 30])[0]
        if data[pos + 46: pos + 46 + name_len] == member.encode():
            data[pos + 24: pos + 28] = struct.pack("<I", size)
        pos = data.find(b"PK\x01\x02", pos + 4)


def test_member_that_expands_past_its_declared_size_is_refused(store):
    path = _write(store, 0, _special_maps(np.float16), ["a", "b", "c", "d"])
    with zipfile.ZipFile(path) as archive:
        planes_npy = archive.read("maps_b1.npy")
    longer = planes_npy + b"\0" * 1_000_000  # the stream inflates to 1 MB more than the size it declares
    _rezip(path, lambda name, data, method: (name, longer if name == "maps_b1.npy" else data, zipfile.ZIP_DEFLATED))
    data = bytearray(path.read_bytes())
    _declare_size(data, "maps_b1.npy", len(planes_npy))
    path.write_bytes(bytes(data))
    _forge_index(store, path)
    with pytest.raises(StoreError, match=r"chunk-00000\.npz, field 'maps_b1\.npy'.*CRC"):
        store.read("toy", "m")


@pytest.mark.parametrize("change, message", [
    (lambda name, data, m: (name, _npy(np.array([4, 3, 5, 8])), m) if name == "maps_shape.npy" else (name, data, m),
     "do not fit together"),
    (lambda name, data, m: None if name == "maps_b1.npy" else (name, data, m), "do not fit together"),
    (lambda name, data, m: (name, _npy(np.zeros(3, np.uint8)), m) if name == "maps_b0.npy" else (name, data, m),
     "do not fit together"),
    (lambda name, data, m: ("maps_b9.npy" if name == "maps_b1.npy" else name, data, m), "unexpected member"),
])
def test_inconsistent_map_members_are_named(store, change, message):
    path = _write(store, 0, _special_maps(np.float16), ["a", "b", "c", "d"])
    _rezip(path, change)
    _forge_index(store, path)
    with pytest.raises(StoreError, match=rf"chunk-00000\.npz.*{message}"):
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


def test_maps_larger_than_meta_allows_are_refused_when_writing(store):
    with pytest.raises(StoreError, match=r"maps of shape \(4, 3, 6, 7\) exceeds what meta.json allows"):
        _write(store, 0, np.zeros((4, len(FINDINGS), 6, 7), np.float16), ["a", "b", "c", "d"])
    assert not store.chunk_path("toy", "m", 0).exists()


def test_tables_do_not_depend_on_the_chunk_layout(phantom_run, tmp_path):
    """The session phantom run (new layout) and a copy whose chunks are rewritten in the old np.savez layout give
    byte-identical metric tables."""
    from conftest import tiny_run

    from xbench.evaluation.evaluate import evaluate_run
    from xbench.spec.config import RunConfig

    copies = {}
    for name in ("new", "old"):
        out = tmp_path / name
        shutil.copytree(phantom_run / "store", out / "store")
        for extra in ("fitted",):
            if (phantom_run / extra).exists():
                shutil.copytree(phantom_run / extra, out / extra)
        copies[name] = out
    old = ResultStore(copies["old"])
    chunks = sorted(old.root.rglob("chunk-*.npz"))
    assert chunks and all("maps_b0.npy" in zipfile.ZipFile(c).namelist() for c in chunks)
    for chunk in chunks:
        np.savez(chunk, **read_chunk_file(chunk))
        old._write_index(chunk, old._read_meta(chunk.parent / "meta.json"))
    tables = {}
    for name, out in copies.items():
        evaluate_run(RunConfig.from_dict(tiny_run(out)), progress=False)
        tables[name] = {p.relative_to(out / "tables"): p.read_bytes() for p in sorted((out / "tables").rglob("*.csv"))}
    assert tables["new"] and tables["new"] == tables["old"]
