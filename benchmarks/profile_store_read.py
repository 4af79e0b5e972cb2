"""Where a results-store chunk read's time goes: the parts of the shuffled-zlib reader of commit ``--before`` (its
``xbench/store/results.py`` and ``xbench/core/safe_arrays.py`` from git) against ``np.load`` of the same arrays as
``np.savez`` files ("today") and the reader of this tree on the zstd layout, per chunk of ``RUN_DIR``'s store (mean
over its chunks of the fastest of ``--repeats`` calls). Used for docs/notes/store-compress.md::

    python benchmarks/profile_store_read.py /tmp/store_bench/phantom256
"""
from __future__ import annotations

import argparse
import hashlib
import importlib.util
import subprocess
import sys
import tempfile
import zipfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_store import _best_s  # noqa: E402  (fastest of n calls, as bench_store times)

REPO = Path(__file__).resolve().parents[1]


def _module(name: str, source: str, folder: Path) -> Any:
    path = folder / f"{name.rsplit('.', 1)[1]}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def old_reader(commit: str, folder: Path) -> tuple[Any, Any]:
    """(results, safe_arrays) modules of ``commit``, the first reading through the second."""
    def show(path: str) -> str:
        return subprocess.run(["git", "-C", str(REPO), "show", f"{commit}:{path}"], check=True, capture_output=True,
                              text=True).stdout

    safe = _module("xbench.core._safe_arrays_before", show("xbench/core/safe_arrays.py"), folder)
    results = show("xbench/store/results.py").replace("from ..core.safe_arrays import", "from ..core._safe_arrays_before import")
    return _module("xbench.store._results_before", results, folder), safe


def time_chunk(chunk: Path, old: Any, old_safe: Any, work: Path, repeats: int) -> dict[str, float]:
    """ms of each part for one chunk of a store (its arrays written in each layout under ``work``)."""
    from xbench.store import results as new

    meta = new.ResultStore._read_meta(chunk.parent / "meta.json")
    limits = new.chunk_limits(meta)
    arrays = new.read_chunk_file(chunk, meta)
    zl, zs, sv = work / "zlib.npz", work / "zstd.npz", work / "savez.npz"
    zl.write_bytes(new.encode_chunk(arrays, codec="zlib"))
    zs.write_bytes(new.encode_chunk(arrays))
    np.savez(sv, **arrays)
    data = zl.read_bytes()
    with zipfile.ZipFile(zl) as archive:
        high = archive.getinfo("maps_b1.npy")
        low_npy = archive.read("maps_b0.npy")
    start = high.header_offset + 30 + len(high.filename) + len(high.extra)
    stream = data[start:start + high.compress_size]
    high_npy = zlib.decompress(stream, -15) if high.compress_type == zipfile.ZIP_DEFLATED else stream
    planes = [np.frombuffer(low_npy[128:], np.uint8), np.frombuffer(high_npy[128:], np.uint8)]
    shape = arrays["maps"].shape

    def np_read() -> dict[str, np.ndarray]:
        with np.load(sv, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}

    timed = {
        "today: np.load of the np.savez file": np_read,
        "before: read_chunk_file (shuffled-zlib layout)": lambda: old.read_chunk_file(zl, meta),
        "  before: read_npz (members, .npy headers, CRC, inflate)": lambda: old_safe.read_npz(zl, limits=limits),
        "    inflate of the high byte plane alone": lambda: zlib.decompress(stream, -15),
        "    CRC-32 of both planes": lambda: (zlib.crc32(low_npy), zlib.crc32(high_npy)),
        "  before: unshuffle (strided copies)": lambda: old.unshuffle_bytes(planes, np.dtype("<f2"), shape),
        "sha256 of the file (check_chunk: whole-store read only)": lambda: hashlib.sha256(data).digest(),
        "now: read_chunk_file (shuffled-zlib layout)": lambda: new.read_chunk_file(zl, meta),
        "now: read_chunk_file (zstd layout)": lambda: new.read_chunk_file(zs, meta),
        "  now: read_npz (zstd layout)": lambda: new.read_npz(zs, limits=limits, self_checked=new._FRAMES),
        "  now: unshuffle": lambda: new.unshuffle_bytes(planes, np.dtype("<f2"), shape),
        "now: read_chunk_file of the np.savez file": lambda: new.read_chunk_file(sv, meta),
    }
    return {name: 1e3 * _best_s(fn, repeats) for name, fn in timed.items()}


def main(argv: list[str] | None = None) -> dict[str, float]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", type=Path)
    p.add_argument("--before", default="25a2089", help="commit of the shuffled-zlib reader (default: before zstd)")
    p.add_argument("--repeats", type=int, default=300)
    args = p.parse_args(argv)
    parts: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="profile_store.") as tmp:
        old, old_safe = old_reader(args.before, Path(tmp))
        for chunk in sorted((args.run_dir / "store").glob("*/*/chunk-*.npz")):
            for name, ms in time_chunk(chunk, old, old_safe, Path(tmp), args.repeats).items():
                parts.setdefault(name, []).append(ms)
    means = {name: round(float(np.mean(ms)), 3) for name, ms in parts.items()}
    for name, ms in means.items():
        print(f"{name:60s} {ms:7.3f} ms/chunk")
    return means


if __name__ == "__main__":
    main()
