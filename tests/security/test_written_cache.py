"""What XBench wrote is never read back unverified: the decode cache (``cache_dir``).

A tampered cache — an entry with a byte flipped, an entry swapped for another image's, an index record edited, an
entry whose ``.npy`` header claims 60000 × 60000, an entry that is a link to ``/dev/zero`` or a FIFO — is never served:
the row is decoded again (equal to a fresh decode), the file is counted (``InputFeed.damaged``) and logged as one
warning line. An image rewritten with other bytes of the same size and mtime (``cp -p`` / ``rsync -a``) is read
again, not served from its old entry. (Old main served the first three and the rewrite; it allocated 3.35 GiB for
the header and hung on the FIFO.)"""
from __future__ import annotations

import logging
import os
import threading
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import xbench
from conftest import Files
from xbench.inference.input_feed import InputFeed


@pytest.fixture(scope="module")
def prior():
    return xbench.create_model("random_prior")  # a cheap model that reads pixels


def _pngs(folder: Path, n: int, seed: int = 3) -> list[Path]:
    """Uncompressed PNGs (``compress_level=0``): equal dimensions give equal file sizes, whatever the pixels."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    paths = []
    for i in range(n):
        path = folder / f"img{i}.png"
        Image.fromarray(rng.integers(0, 256, (48, 40), dtype=np.uint8)).save(path, compress_level=0)
        paths.append(path)
    return paths


def _fresh(prior, paths: list[Path]) -> InputFeed:
    feed = InputFeed(Files(paths), [prior])
    feed.ensure(range(len(paths)))
    return feed


def _rows(feed: InputFeed, prior) -> list[np.ndarray]:
    key = feed.specs[id(prior)].key
    return [feed.rows[r][1][key] for r in sorted(feed.rows)]


def _cached(prior, paths: list[Path], cache: Path) -> InputFeed:
    feed = InputFeed(Files(paths), [prior], cache_dir=cache)
    feed.ensure(range(len(paths)))
    return feed


def _entries(cache: Path) -> list[Path]:
    return sorted((cache / "entries").rglob("*.npy"))


def _entry_of(feed: InputFeed, prior, path: Path) -> Path:
    rec = feed.cache.lookup(path)
    return feed.cache.entry(feed.specs[id(prior)].key, rec["content"])


def _same(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


def test_a_flipped_byte_in_an_entry_is_recomputed_logged_and_counted(prior, tmp_path, caplog):
    paths, cache = _pngs(tmp_path / "img", 3), tmp_path / "cache"
    first = _cached(prior, paths, cache)
    entry = _entry_of(first, prior, paths[1])
    data = bytearray(entry.read_bytes())
    data[len(data) // 2] ^= 0x55  # inside the array's values
    entry.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="xbench.inference.disk_cache"):
        again = _cached(prior, paths, cache)
    assert _same(_rows(again, prior), _rows(_fresh(prior, paths), prior))
    assert getattr(again, "damaged", 0) == 1
    lines = [r.getMessage() for r in caplog.records if "not served" in r.getMessage()]
    assert len(lines) == 1 and entry.name in lines[0] and "\n" not in lines[0]


def test_an_entry_swapped_for_another_images_is_not_served(prior, tmp_path):
    paths, cache = _pngs(tmp_path / "img", 2), tmp_path / "cache"
    first = _cached(prior, paths, cache)
    a, b = _entry_of(first, prior, paths[0]), _entry_of(first, prior, paths[1])
    b.write_bytes(a.read_bytes())  # image 1 would be given image 0's input
    again = _cached(prior, paths, cache)
    assert _same(_rows(again, prior), _rows(_fresh(prior, paths), prior))
    assert again.stats["decoded"] == 1


def test_an_edited_index_record_is_not_served(prior, tmp_path):
    """The record of image 1 edited to name image 0's content hash: image 1 must not get image 0's input."""
    paths, cache = _pngs(tmp_path / "img", 2), tmp_path / "cache"
    first = _cached(prior, paths, cache)
    rec0, rec1 = first.cache.lookup(paths[0]), first.cache.lookup(paths[1])
    index = first.cache._index_file(paths[1])
    raw = index.read_bytes()
    index.write_bytes(raw.replace(rec1["content"].encode(), rec0["content"].encode()))
    again = _cached(prior, paths, cache)
    assert _same(_rows(again, prior), _rows(_fresh(prior, paths), prior))


def test_an_image_rewritten_with_the_same_size_and_mtime_is_read_again(prior, tmp_path):
    paths, cache = _pngs(tmp_path / "img", 2), tmp_path / "cache"
    _cached(prior, paths, cache)
    st = paths[0].stat()
    other = _pngs(tmp_path / "other", 1, seed=99)[0]
    paths[0].write_bytes(other.read_bytes())  # a re-export copied with `cp -p`: other bytes, same size and mtime
    os.utime(paths[0], ns=(st.st_atime_ns, st.st_mtime_ns))
    assert paths[0].stat().st_size == st.st_size and paths[0].stat().st_mtime_ns == st.st_mtime_ns
    again = _cached(prior, paths, cache)
    assert _same(_rows(again, prior), _rows(_fresh(prior, paths), prior))
    assert again.stats == {"decoded": 1, "from_cache": 1, "skipped": 0}


def _sealed(data: bytes, context: str) -> bytes:
    try:
        from xbench.core.files import seal
    except ImportError:  # old main: entries are plain .npy files
        return data
    return seal(data, context)


def test_an_entry_header_claiming_60000_squared_is_refused_before_allocating(prior, tmp_path):
    """A sealed entry (its digest recomputed: a seal is a checksum, not a signature) whose header declares
    60000 × 60000 uint8 over 64 bytes of data: refused from the header, nothing near 3.35 GiB allocated."""
    paths, cache = _pngs(tmp_path / "img", 1), tmp_path / "cache"
    first = _cached(prior, paths, cache)
    entry = _entry_of(first, prior, paths[0])
    key, content = entry.parent.parent.name, entry.name.split(".")[0]
    header = "{'descr': '|u1', 'fortran_order': False, 'shape': (60000, 60000), }"
    header += " " * (118 - len(header)) + "\n"
    npy = b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode() + bytes(64)
    entry.write_bytes(_sealed(npy, f"{key}/{content}"))
    tracemalloc.start()
    try:
        again = _cached(prior, paths, cache)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 256 << 20
    assert _same(_rows(again, prior), _rows(_fresh(prior, paths), prior))


def test_an_entry_that_is_a_fifo_is_refused_without_hanging(prior, tmp_path):
    paths, cache = _pngs(tmp_path / "img", 1), tmp_path / "cache"
    first = _cached(prior, paths, cache)
    entry = _entry_of(first, prior, paths[0])
    entry.unlink()
    os.mkfifo(entry)
    done: list[InputFeed] = []
    thread = threading.Thread(target=lambda: done.append(_cached(prior, paths, cache)), daemon=True)
    thread.start()
    thread.join(30)
    if thread.is_alive():  # old main blocks in open(): unblock it so the test process can end
        with open(entry, "wb"):
            pass
        thread.join(10)
    assert done, "reading a FIFO entry hung"
    assert _same(_rows(done[0], prior), _rows(_fresh(prior, paths), prior))


def test_an_entry_linked_to_dev_zero_or_out_of_the_cache_is_not_served(prior, tmp_path):
    paths, cache = _pngs(tmp_path / "img", 2), tmp_path / "cache"
    first = _cached(prior, paths, cache)
    a, b = _entry_of(first, prior, paths[0]), _entry_of(first, prior, paths[1])
    outside = tmp_path / "outside.npy"
    outside.write_bytes(a.read_bytes())
    a.unlink()
    a.symlink_to("/dev/zero")
    b.unlink()
    b.symlink_to(outside)
    again = _cached(prior, paths, cache)
    assert again.stats["decoded"] == 2
    assert _same(_rows(again, prior), _rows(_fresh(prior, paths), prior))


def test_a_fitted_folder_whose_file_changed_is_refitted_with_one_warning(tmp_path, caplog):
    """A fitted baseline's folder (the anatomical prior's maps) is served only while every file hashes to what its
    ``fit.json`` records; a flipped byte (size and mtime restored) is one warning line and a refit. Old main served it."""
    from xbench.store.fingerprint import fitted_is_current, refit

    key = {"model": "anatomical_prior", "fit_split": "prior", "n_cases": 3}
    folder = tmp_path / "fitted" / "phantom" / "anatomical_prior"
    refit(folder, lambda tmp: (tmp / "anatomical_prior.npz").write_bytes(bytes(range(256)) * 4), key)
    assert fitted_is_current(folder, key)
    maps = folder / "anatomical_prior.npz"
    st = maps.stat()
    data = bytearray(maps.read_bytes())
    data[100] ^= 1
    maps.write_bytes(bytes(data))
    os.utime(maps, ns=(st.st_atime_ns, st.st_mtime_ns))
    with caplog.at_level(logging.WARNING, logger="xbench.store.fingerprint"):
        assert not fitted_is_current(folder, key)
    lines = [r.getMessage() for r in caplog.records if "refitting" in r.getMessage()]
    assert len(lines) == 1 and "anatomical_prior.npz" in lines[0]
