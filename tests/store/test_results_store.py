"""The results store: atomic chunk round trip (dtypes), meta refusal / overwrite, missing chunks, write_table."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import zstandard

from xbench.core.atomic import atomic_write
from xbench.core.errors import XBenchError
from xbench.store import results
from xbench.store.results import STORE_VERSION, ResultStore, read_chunk_file, write_table

FINDINGS = ["Nodule", "Effusion"]


def meta(**changes) -> dict:
    base = {"dataset": "toy", "model": "m", "findings": FINDINGS, "grid": [3, 4], "params": {"sigma": 0.25},
            "chunk_size": 2, "code_version": "0.1.0", "created": "2025-01-01T00:00:00"}
    return {**base, **changes}


def chunk_arrays(n: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {"scores": rng.normal(size=(n, 2)), "probs": rng.random((n, 2)), "maps": rng.random((n, 2, 3, 4))}


@pytest.fixture()
def store(tmp_path) -> ResultStore:
    s = ResultStore(tmp_path / "run")
    s.prepare("toy", "m", meta())
    return s


def test_prepare_writes_meta_with_store_version(store, tmp_path):
    path = tmp_path / "run" / "store" / "toy" / "m" / "meta.json"
    data = json.loads(path.read_text())
    assert data["store_version"] == STORE_VERSION and data["findings"] == FINDINGS
    assert store.meta("toy", "m") == data
    assert store.folder("toy", "m") == path.parent
    assert store.chunk_path("toy", "m", 3).name == "chunk-00003.npz"


def test_chunk_round_trip_keeps_values_and_dtypes(store):
    a = chunk_arrays(2, 0)
    b = chunk_arrays(1, 1)
    # written out of order: read() concatenates in chunk order
    store.write_chunk("toy", "m", 1, case_ids=["c"], skipped={"d": "MissingFileError: gone"}, **b)
    store.write_chunk("toy", "m", 0, case_ids=["a", "b"], skipped={}, **a)
    got = store.read("toy", "m", expected_chunks=2)
    assert got.case_ids.tolist() == ["a", "b", "c"]
    assert got.scores.dtype == np.float32 and got.probs.dtype == np.float32 and got.maps.dtype == np.float16
    np.testing.assert_array_equal(got.scores, np.concatenate([a["scores"], b["scores"]]).astype(np.float32))
    np.testing.assert_array_equal(got.probs, np.concatenate([a["probs"], b["probs"]]).astype(np.float32))
    np.testing.assert_array_equal(got.maps, np.concatenate([a["maps"], b["maps"]]).astype(np.float16))
    assert got.maps.shape == (3, 2, 3, 4)
    assert got.skipped == {"d": "MissingFileError: gone"}
    assert got.meta["findings"] == FINDINGS
    assert store.has_chunk("toy", "m", 0) and not store.has_chunk("toy", "m", 2)


def test_chunk_files_are_plain_npz(store):
    arrays = chunk_arrays(2, 0)
    path = store.write_chunk("toy", "m", 0, case_ids=["a", "b"], skipped={}, **arrays)
    with np.load(path, allow_pickle=False) as data:  # plain NumPy lists the members; maps as zstd frames of byte planes
        assert data.files == ["case_ids", "scores", "probs", "maps_shape", "maps_z0", "maps_z1", "sizes", "windows",
                              "skipped_ids", "skipped_reasons"]
        assert data["maps_shape"].tolist() == [2, 2, 3, 4] and data["maps_z1"].dtype == np.uint8
        planes = [zstandard.ZstdDecompressor().decompress(data[f"maps_z{k}"].tobytes()) for k in range(2)]
    maps = np.frombuffer(b"".join(planes), np.uint8).reshape(2, -1).T.copy().view("<f2").reshape(2, 2, 3, 4)
    assert maps.tobytes() == arrays["maps"].astype(np.float16).tobytes()  # decodable by hand
    data = read_chunk_file(path)
    assert set(data) == {"case_ids", "scores", "probs", "maps", "sizes", "windows", "skipped_ids", "skipped_reasons"}
    assert data["skipped_ids"].shape == (0,)
    # without sizes / windows: "unknown size, whole image" markers the evaluation understands
    assert (data["sizes"] == -1).all() and np.isnan(data["windows"]).all()


def test_sizes_and_windows_round_trip(store):
    sizes, windows = np.array([[512, 512], [1024, 800]]), np.array([[0, 0, 512, 512], [111.0, 0, 911.0, 800]])
    store.write_chunk("toy", "m", 0, case_ids=["a", "b"], skipped={}, sizes=sizes, windows=windows, **chunk_arrays(2, 0))
    got = store.read("toy", "m")
    np.testing.assert_array_equal(got.sizes, sizes)
    np.testing.assert_array_equal(got.windows, windows)


def test_write_leaves_no_temporary_file(store):
    store.write_chunk("toy", "m", 0, case_ids=["a", "b"], skipped={}, **chunk_arrays(2, 0))
    assert sorted(p.name for p in store.folder("toy", "m").iterdir()) == ["chunk-00000.index.json", "chunk-00000.npz",
                                                                         "meta.json"]


def test_failed_write_leaves_neither_chunk_nor_temporary(store, monkeypatch):
    def broken(tmp):
        with open(tmp, "wb") as fh:
            fh.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(results, "atomic_write_bytes", lambda path, data: atomic_write(path, broken))
    with pytest.raises(OSError, match="disk full"):
        store.write_chunk("toy", "m", 0, case_ids=["a", "b"], skipped={}, **chunk_arrays(2, 0))
    assert sorted(p.name for p in store.folder("toy", "m").iterdir()) == ["meta.json"]
    assert not store.has_chunk("toy", "m", 0)


def test_rewriting_a_chunk_replaces_it(store):
    store.write_chunk("toy", "m", 0, case_ids=["a", "b"], skipped={}, **chunk_arrays(2, 0))
    new = chunk_arrays(2, 5)
    store.write_chunk("toy", "m", 0, case_ids=["x", "y"], skipped={}, **new)
    got = store.read("toy", "m")
    assert got.case_ids.tolist() == ["x", "y"]
    np.testing.assert_array_equal(got.scores, new["scores"].astype(np.float32))


def test_same_meta_again_is_accepted_and_keeps_chunks(store):
    store.write_chunk("toy", "m", 0, case_ids=["a", "b"], skipped={}, **chunk_arrays(2, 0))
    store.prepare("toy", "m", meta(code_version="9.9", created="later"))  # these two keys are not compared
    assert store.has_chunk("toy", "m", 0)
    assert store.meta("toy", "m")["created"] == "2025-01-01T00:00:00"  # the first meta is kept


@pytest.mark.parametrize("key, value", [("findings", ["Nodule", "Mass"]), ("params", {"sigma": 0.1}),
                                        ("grid", [7, 7])])
def test_meta_mismatch_is_refused_naming_the_key(store, key, value):
    with pytest.raises(XBenchError, match=rf"differs in {key}\b") as err:
        store.prepare("toy", "m", meta(**{key: value}))
    assert str(store.folder("toy", "m")) in str(err.value) and "overwrite" in str(err.value)


def test_overwrite_drops_old_chunks_and_rewrites_meta(store):
    store.write_chunk("toy", "m", 0, case_ids=["a", "b"], skipped={}, **chunk_arrays(2, 0))
    store.write_chunk("toy", "m", 1, case_ids=["c"], skipped={}, **chunk_arrays(1, 1))
    store.prepare("toy", "m", meta(params={"sigma": 0.1}), overwrite=True)
    assert store.chunks("toy", "m") == []
    assert store.meta("toy", "m")["params"] == {"sigma": 0.1}


def test_indexed_says_whether_every_chunk_has_its_index(store):
    """What rank 0's evaluation polls: chunks 0..n-1 each with their index; a chunk whose index is not yet written
    (it is written after the chunk) does not count."""
    store.write_chunk("toy", "m", 1, case_ids=["c"], skipped={}, **chunk_arrays(1, 1))
    assert not store.indexed("toy", "m", 2) and store.indexed("toy", "m", 0)
    store.write_chunk("toy", "m", 0, case_ids=["a", "b"], skipped={}, **chunk_arrays(2, 0))
    assert store.indexed("toy", "m", 2) and not store.indexed("toy", "m", 3)
    store.index_path(store.chunk_path("toy", "m", 0)).unlink()
    assert not store.indexed("toy", "m", 2)


def test_missing_chunk_error_names_the_chunks(store):
    store.write_chunk("toy", "m", 1, case_ids=["c"], skipped={}, **chunk_arrays(1, 1))
    with pytest.raises(XBenchError, match=r"chunks \[0, 2\] of 3 are missing") as err:
        store.read("toy", "m", expected_chunks=3)
    assert str(store.folder("toy", "m")) in str(err.value)
    assert store.read("toy", "m").case_ids.tolist() == ["c"]  # without expected_chunks: whatever is there


def test_read_without_chunks_gives_empty_arrays_of_the_right_shape(store):
    got = store.read("toy", "m")
    assert got.case_ids.shape == (0,) and got.scores.shape == (0, 2) and got.probs.shape == (0, 2)
    assert got.maps.shape == (0, 2, 3, 4) and got.maps.dtype == np.float16 and got.skipped == {}


def test_meta_of_an_absent_pair_is_an_error(tmp_path):
    with pytest.raises(XBenchError, match=r"No results for dataset 'toy' × model 'zz'"):
        ResultStore(tmp_path).meta("toy", "zz")


def test_write_table_writes_csv_and_parquet_atomically(tmp_path):
    df = pd.DataFrame({"model": ["a", "b"], "value": [0.25, np.nan]})
    paths = write_table(df, tmp_path / "tables" / "metrics")
    assert [p.name for p in paths] == ["metrics.csv", "metrics.parquet"]
    pd.testing.assert_frame_equal(pd.read_parquet(paths[1]), df)
    pd.testing.assert_frame_equal(pd.read_csv(paths[0]), df)
    assert not list((tmp_path / "tables").glob("*.tmp"))
