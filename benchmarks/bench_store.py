"""Results-store chunk layouts compared on real stores (issue 22, item 4): bytes per case, write and read time
per chunk, bit identity, and a whole-store read through ``ResultStore.read`` in today's layout, the store's and the
shuffled-zlib layout written before it (``store_read``: ``today_s``, ``new_s``, ``zlib_layout_s``).

Sources (``--phantom``, ``--gpu-tiny``; each is a run folder, made here when it has no ``store/`` yet):

* ``phantom``  — the two reference models trained by XBench (``ref_xattn``, ``ref_patchsim``: meaningful maps)
  on the phantom test split (300 cases, ``chunk_size`` 256 as in the GPU benchmark's runs);
* ``gpu_tiny`` — ``benchmarks/bench_gpu.py --tiny --phases default``: stand-ins of all seven datasets and
  the seven models of the GPU benchmark, random-init full-size networks (their real native grids and class lists).
* ``--store LABEL=RUN_DIR`` adds any other run folder (e.g. a full-scale GPU run).

Layouts, each written from the same arrays of every chunk (all in one run, equal work):

* ``today``            — ``np.savez`` (uncompressed), read with ``np.load`` (the store before this change);
* ``savez_compressed`` — ``np.savez_compressed`` (zlib level 6 on every member, maps unshuffled);
* ``shuffle_zstd{L}``  — :func:`xbench.store.results.encode_chunk` (``codec="zstd"``) at zstd level ``L``
  (``--zstd-levels``): each of the maps' byte planes one zstd frame, read with
  :func:`xbench.store.results.read_chunk_file` (bounded reader); level 1 is the store's layout;
* ``shuffle_zlib{L}``  — ``encode_chunk(..., codec="zlib")`` at zlib level ``L`` (``--levels``; maps
  byte-shuffled, each plane deflated unless deflate cannot shrink it): the layout before, still read; level 1 is
  what the store wrote before zstd. ``..._every_member_deflated``: the same with every member deflated;
* ``today_read_by_new_reader`` — today's files read by the new (bounded) reader.

Times are the fastest of ``--repeats`` per chunk (the least disturbed on a shared machine), summed over chunks; reads
are timed round-robin (every layout's chunks in turn, ``--repeats`` rounds), so that a drift of the machine during
the run (neighbours, the heap's growth) touches every layout alike. ``full_scale_mb`` applies each layout's
byte ratio to the 257 MB extrapolated for today's layout (20.6 MB measured at 1,033 cases × 7
models on one H100 with the uncompressed layout, × 12.5); ``per_model_ratio`` is the store's layout against today's, per model. Prints JSON and writes
it to ``--json``.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import platform
import shutil
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
TODAY_FULL_SCALE_MB = 257.0  # 20.6 MB measured at 1,033 cases x 7 models (uncompressed layout), x 12.5 to 12,880


def make_phantom(out: Path) -> None:
    """Run the two trained reference models on the phantom test split into ``out`` (CPU, no bootstrap)."""
    from xbench.spec.config import RunConfig
    from xbench.workflows.run import run

    raw = {"output_dir": str(out), "datasets": [{"name": "phantom", "split": "test"}],
           "models": [{"name": "ref_xattn"}, {"name": "ref_patchsim"}], "grid": [224, 224], "chunk_size": 256,
           "batch_size": 32, "num_workers": 0, "precision": "fp32", "device": "cpu",
           "bootstrap": {"replicates": 0, "seed": 0}}
    run(RunConfig.from_dict(raw), progress=False, evaluate=False)


def make_gpu_tiny(out: Path) -> None:
    """``bench_gpu.py --tiny --phases default`` into ``out`` (its store is ``out/default``)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_gpu", REPO / "benchmarks" / "bench_gpu.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_gpu"] = module  # its worker function is pickled by name
    spec.loader.exec_module(module)
    module.main(["--tiny", "--root", str(out / "data"), "--out", str(out), "--workers", "1", "--gen-workers", "1",
                 "--phases", "default", "--bootstrap", "2"])


def _best_s(fn: Callable[[], Any], repeats: int) -> float:
    """Fastest of ``repeats`` calls: on a shared machine the least disturbed one is the closest to the work's cost."""
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def _best_interleaved(fns: dict[Any, Callable[[], Any]], repeats: int) -> dict[Any, float]:
    """Fastest of ``repeats`` calls of each function, the functions called in turn (round-robin), so that a drift of
    the machine (neighbours, the heap's growth, caches) touches every arm alike instead of the first or last one."""
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(repeats):
        for name, fn in fns.items():
            t = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t)
    return best


def _same_bits(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return set(a) == set(b) and all(a[k].dtype == b[k].dtype and a[k].shape == b[k].shape
                                    and a[k].tobytes() == b[k].tobytes() for k in a)


def _layouts(levels: list[int], zstd_levels: list[int]) -> dict[str, tuple[Callable[[Path, dict], None],
                                                                            Callable[[Path, dict], dict]]]:
    """name -> (write(path, arrays), read(path, meta) -> arrays)."""
    from xbench.store.results import encode_chunk, read_chunk_file

    def np_read(path: Path, meta: dict) -> dict[str, np.ndarray]:
        with np.load(path, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}

    out = {"today": (lambda p, a: np.savez(p, **a), np_read),
           "savez_compressed": (lambda p, a: np.savez_compressed(p, **a), np_read)}
    for level in zstd_levels:
        out[f"shuffle_zstd{level}"] = (lambda p, a, lv=level: p.write_bytes(encode_chunk(a, lv, codec="zstd")),
                                       read_chunk_file)
    for level in levels:
        out[f"shuffle_zlib{level}"] = (lambda p, a, lv=level: p.write_bytes(encode_chunk(a, lv, codec="zlib")),
                                       read_chunk_file)

    def every_member_deflated(path: Path, arrays: dict) -> None:  # the store's layout without the stored planes
        from xbench.store import results

        saved, results._DEFLATE_BELOW = results._DEFLATE_BELOW, 2.0
        try:
            path.write_bytes(encode_chunk(arrays, levels[0], codec="zlib"))
        finally:
            results._DEFLATE_BELOW = saved

    out[f"shuffle_zlib{levels[0]}_every_member_deflated"] = (every_member_deflated, read_chunk_file)
    out["today_read_by_new_reader"] = (lambda p, a: np.savez(p, **a), read_chunk_file)
    return out


def measure_source(run_dir: Path, levels: list[int], zstd_levels: list[int], repeats: int, work: Path,
                   baseline: str) -> dict[str, Any]:
    """Every layout on every chunk of ``run_dir``'s store, then whole-store reads in today's and the new layout."""
    from xbench.store.results import ResultStore, read_chunk_file

    store = ResultStore(run_dir)
    pairs = sorted((m.parent.parent.name, m.parent.name) for m in store.root.glob("*/*/meta.json"))
    chunks = [(d, m, f) for d, m in pairs for f in store.chunks(d, m)]
    originals = {f: read_chunk_file(f) for _, _, f in chunks}
    cases = sum(len(a["case_ids"]) for a in originals.values())
    map_bytes = sum(a["maps"].nbytes for a in originals.values())
    result: dict[str, Any] = {"run_dir": str(run_dir), "pairs": len(pairs), "chunks": len(chunks),
                              "case_model_pairs": cases, "map_bytes_raw": map_bytes,
                              "map_dtypes": sorted({str(a["maps"].dtype) for a in originals.values()}),
                              "map_shapes": sorted({str(a["maps"].shape[1:]) for a in originals.values()}),
                              "layouts": {}}
    layouts = _layouts(levels, zstd_levels)
    metas = {(d, m): store.meta(d, m) for d, m in pairs}
    reads: dict[tuple[str, int], Callable[[], Any]] = {}
    for name, (write, read) in layouts.items():
        folder = work / name
        folder.mkdir(parents=True)
        size = write_s = 0.0
        identical = True
        for i, (d, m, f) in enumerate(chunks):
            arrays, meta = originals[f], metas[d, m]
            path = folder / f"chunk-{i:05d}.npz"
            write_s += _best_s(lambda w=write, p=path, a=arrays: w(p, a), repeats)
            size += path.stat().st_size
            identical &= _same_bits(read(path, meta), arrays)
            reads[name, i] = lambda r=read, p=path, m=meta: r(p, m)
        result["layouts"][name] = {"bytes": int(size), "bytes_per_case": round(size / cases, 1),
                                   "write_ms_per_chunk": round(1e3 * write_s / len(chunks), 3), "bit_identical": identical}
    read_best = _best_interleaved(reads, repeats)  # every layout's chunks read in turn, repeats times
    for name, entry in result["layouts"].items():
        read_s = sum(read_best[name, i] for i in range(len(chunks)))
        result["layouts"][name] = {"bytes": entry["bytes"], "bytes_per_case": entry["bytes_per_case"],
                                   "write_ms_per_chunk": entry["write_ms_per_chunk"],
                                   "read_ms_per_chunk": round(1e3 * read_s / len(chunks), 3),
                                   "bit_identical": entry["bit_identical"]}
    today = result["layouts"]["today"]
    for entry in result["layouts"].values():
        entry["ratio_vs_today"] = round(entry["bytes"] / today["bytes"], 4)
        entry["read_time_vs_today"] = round(entry["read_ms_per_chunk"] / today["read_ms_per_chunk"], 3)
        entry["write_time_vs_today"] = round(entry["write_ms_per_chunk"] / today["write_ms_per_chunk"], 3)
        entry["full_scale_mb"] = round(TODAY_FULL_SCALE_MB * entry["ratio_vs_today"], 1)
    # maps alone: raw vs the shuffled planes deflated / zstd-compressed at the store's levels, vs plain deflate
    import zstandard

    from xbench.store.results import ZLIB_LEVEL, ZSTD_LEVEL, encode_chunk, shuffle_bytes

    plain = sum(len(zlib.compress(a["maps"].tobytes(), ZLIB_LEVEL)) for a in originals.values())
    shuffled = sum(len(zlib.compress(b"".join(p.tobytes() for p in shuffle_bytes(a["maps"])), ZLIB_LEVEL))
                   for a in originals.values())
    zstd_shuffled = sum(len(zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress(p))  # one frame per plane
                        for a in originals.values() for p in shuffle_bytes(a["maps"]))
    result["maps_only"] = {"zlib_ratio": round(plain / map_bytes, 4), "shuffle_zlib_ratio": round(shuffled / map_bytes, 4),
                           "level": ZLIB_LEVEL, "shuffle_zstd_ratio": round(zstd_shuffled / map_bytes, 4),
                           "zstd_level": ZSTD_LEVEL}
    per_model: dict[str, list[int]] = {}  # model -> [today's bytes, the store's bytes]
    for _, m, f in chunks:
        buf = io.BytesIO()
        np.savez(buf, **originals[f])
        sizes = per_model.setdefault(m, [0, 0])
        sizes[0] += len(buf.getvalue())
        sizes[1] += len(encode_chunk(originals[f]))
    result["per_model_ratio"] = {m: round(new / old, 4) for m, (old, new) in sorted(per_model.items())}
    result["store_read"] = whole_store_read(store, pairs, originals, chunks, repeats, work / "stores", baseline)
    return result


def today_module(commit: str, folder: Path) -> Any:
    """``xbench/store/results.py`` as of ``commit`` (the store before this change), written to ``folder`` and
    imported as a sibling module."""
    import importlib.util
    import subprocess

    source = subprocess.run(["git", "-C", str(REPO), "show", f"{commit}:xbench/store/results.py"], check=True,
                            capture_output=True, text=True).stdout
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "results_today.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("xbench.store._results_today", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks itself up there
    spec.loader.exec_module(module)
    return module


def whole_store_read(store: Any, pairs: list[tuple[str, str]], originals: dict[Path, dict], chunks: list,
                     repeats: int, work: Path, baseline: str) -> dict[str, Any]:
    """``ResultStore.read`` of every pair (index, sha256, decode, concatenation) in today's layout (``np.savez``
    files, read by ``ResultStore.read`` of commit ``baseline``: ``np.load``, one chunk after another), in the store's
    layout (``write_chunk``, read by this code) and in the shuffled-zlib layout written before it (read by this code)."""
    from xbench.store.results import ResultStore, encode_chunk

    old, new, zl = ResultStore(work / "today"), ResultStore(work / "new"), ResultStore(work / "zlib")
    for d, m in pairs:
        meta = {k: v for k, v in store.meta(d, m).items() if k != "store_version"}
        for target in (old, new, zl):
            target.prepare(d, m, meta)
    for d, m, f in chunks:
        a, index = originals[f], int(f.stem.split("-")[1])
        kw = {k: a[k] for k in ("scores", "probs", "maps", "sizes", "windows")}
        skipped = dict(zip(a["skipped_ids"].tolist(), a["skipped_reasons"].tolist()))
        new.write_chunk(d, m, index, case_ids=a["case_ids"].tolist(), skipped=skipped, **kw)
        path = old.chunk_path(d, m, index)
        np.savez(path, **a)  # today's writer
        old._write_index(path, old.meta(d, m))
        path = zl.chunk_path(d, m, index)
        path.write_bytes(encode_chunk(a, codec="zlib"))  # the layout written before zstd
        zl._write_index(path, zl.meta(d, m))

    today_store = today_module(baseline, work / "code").ResultStore(work / "today")  # today's code on today's files

    def today_read() -> None:
        for d, m in pairs:
            today_store.read(d, m)

    def new_read(target: Any) -> Callable[[], None]:
        return lambda: [target.read(d, m) for d, m in pairs]

    best = _best_interleaved({"today": today_read, "new": new_read(new), "new_on_old": new_read(old),
                              "zlib": new_read(zl)}, repeats)
    t_today, t_new, t_new_on_old, t_zlib = best["today"], best["new"], best["new_on_old"], best["zlib"]
    keys = ("case_ids", "scores", "probs", "maps")
    same = all(_same_bits({k: getattr(old.read(d, m), k) for k in keys}, {k: getattr(new.read(d, m), k) for k in keys})
               and _same_bits({k: getattr(old.read(d, m), k) for k in keys}, {k: getattr(zl.read(d, m), k) for k in keys})
               for d, m in pairs)
    size = {name: sum(p.stat().st_size for p in (work / name).rglob("chunk-*.npz")) for name in ("today", "new", "zlib")}
    # deterministic bytes: the same arrays written again give the same file
    d, m, f = chunks[0]
    first = new.chunk_path(d, m, int(f.stem.split("-")[1])).read_bytes()
    a = originals[f]
    new.write_chunk(d, m, int(f.stem.split("-")[1]), case_ids=a["case_ids"].tolist(),
                    skipped=dict(zip(a["skipped_ids"].tolist(), a["skipped_reasons"].tolist())),
                    **{k: a[k] for k in ("scores", "probs", "maps", "sizes", "windows")})
    return {"today_s": round(t_today, 4), "new_s": round(t_new, 4), "new_reader_on_today_files_s": round(t_new_on_old, 4),
            "zlib_layout_s": round(t_zlib, 4), "new_vs_today": round(t_new / t_today, 3),
            "zlib_layout_vs_today": round(t_zlib / t_today, 3), "bytes_today": size["today"], "bytes_new": size["new"],
            "bytes_zlib_layout": size["zlib"],
            "ratio": round(size["new"] / size["today"], 4), "arrays_identical": same,
            "rewrite_gives_same_bytes": new.chunk_path(d, m, int(f.stem.split("-")[1])).read_bytes() == first}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--phantom", type=Path, help="run folder of the trained reference models (made if it has no store)")
    p.add_argument("--gpu-tiny", type=Path, help="out folder of bench_gpu.py --tiny (made if absent); store in default/")
    p.add_argument("--store", action="append", default=[], help="LABEL=RUN_DIR of another run folder")
    p.add_argument("--levels", default="1,3,6", help="zlib levels of the shuffled-zlib layout (the layout before)")
    p.add_argument("--zstd-levels", default="1,3", help="zstd levels of the shuffled-zstd layout (the store's: 1)")
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--baseline", default="15917f9", help="commit whose ResultStore.read times today's layout "
                   "(default: the commit this change starts from)")
    p.add_argument("--json", type=Path, help="also write the JSON here")
    args = p.parse_args(argv)
    sources: dict[str, Path] = {}
    if args.phantom:
        if not (args.phantom / "store").is_dir():
            make_phantom(args.phantom)
        sources["phantom_trained"] = args.phantom
    if args.gpu_tiny:
        if not (args.gpu_tiny / "default" / "store").is_dir():
            make_gpu_tiny(args.gpu_tiny)
        sources["gpu_tiny_random_init"] = args.gpu_tiny / "default"
    for item in args.store:
        label, _, folder = item.partition("=")
        sources[label] = Path(folder)
    import zstandard

    import xbench

    result: dict[str, Any] = {
        "command": "python benchmarks/bench_store.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "environment": {"python": sys.version.split()[0], "numpy": np.__version__, "zlib": zlib.ZLIB_RUNTIME_VERSION,
                        "zstandard": zstandard.__version__, "zstd": ".".join(map(str, zstandard.ZSTD_VERSION)),
                        "machine": platform.machine(), "cpus": os.cpu_count(), "xbench": xbench.__file__},
        "repeats": args.repeats, "baseline_commit": args.baseline, "sources": {}}
    levels = [int(x) for x in args.levels.split(",")]
    zstd_levels = [int(x) for x in args.zstd_levels.split(",")]
    with tempfile.TemporaryDirectory(prefix="bench_store.") as tmp:
        for label, folder in sources.items():
            result["sources"][label] = measure_source(folder, levels, zstd_levels, args.repeats, Path(tmp) / label,
                                                      args.baseline)
            shutil.rmtree(Path(tmp) / label, ignore_errors=True)
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")
    return result


if __name__ == "__main__":
    main()
