"""What verifying the decode cache costs a warm run on this CPU: :class:`xbench.inference.input_feed.InputFeed` over the
stand-ins of ``bench_gpu.py`` (``--root``, made with ``bench_gpu.py --phases none``), the preprocess-only stand-ins of
the ported adapters plus the centre prior (as ``bench_decode.py``), once cold into a fresh ``cache_dir`` and then
``--repeats`` times warm from it, in this process (``--workers 0``: the warm rows are read in the feed's own thread,
as a run reads them). Prints per dataset and in all: warm seconds and milliseconds per image (the median of the
repeats), and what hashing every image file (SHA-256, :func:`~xbench.inference.disk_cache.content_hash`) would add per
warm run — the cost of keying by content on every run, which the cache does not pay (it keys by the file's identity:
size, mtime, ctime, inode, device).

Run with the tree to measure first on ``PYTHONPATH``; alternate old and new trees for an A/B::

    PYTHONPATH=<tree> python benchmarks/bench_cache_verify.py --root /tmp/sd --cache /tmp/cv --repeats 5
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import time
from pathlib import Path

from bench_decode import DATASETS


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--root", type=Path, required=True, help="stand-ins written by bench_gpu.py --phases none")
    p.add_argument("--cache", type=Path, required=True, help="a folder for the decode caches (emptied first)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--datasets", default=",".join(DATASETS))
    args = p.parse_args(argv)
    os.environ["XBENCH_MANIFESTS"] = str(args.root / "manifests")
    import xbench
    import xbench.spec.registry as registry
    from xbench.inference.disk_cache import content_hash
    from xbench.inference.input_feed import InputFeed
    from xbench.inference.gpu_preprocess import preprocess_standins

    registry.MANIFEST_DIRS[:] = [args.root / "manifests"]
    standins = preprocess_standins()
    adapters = [standins[k] for k in ("clip", "medklip", "kad", "carzero", "devide")] + [xbench.create_model("center_prior")]
    shutil.rmtree(args.cache, ignore_errors=True)
    out: dict = {"xbench": xbench.__file__, "per_dataset": {}}
    warm_total, hash_total, cases = 0.0, 0.0, 0
    for name in args.datasets.split(","):
        data = xbench.load_dataset(f"standin_{name}", root=str(args.root / name))
        cache = args.cache / name
        InputFeed(data, adapters, cache_dir=cache).ensure(range(len(data)))  # cold: writes the cache
        warm = []
        for _ in range(args.repeats):
            feed = InputFeed(data, adapters, cache_dir=cache)
            t = time.perf_counter()
            feed.ensure(range(len(data)))
            warm.append(time.perf_counter() - t)
            assert feed.stats["from_cache"] == len(data), feed.stats
        t = time.perf_counter()
        for row in range(len(data)):
            content_hash(data[row].image_path)
        hashed = time.perf_counter() - t
        w = statistics.median(warm)
        out["per_dataset"][name] = {"cases": len(data), "warm_s": round(w, 3), "warm_ms_per_image": round(1000 * w / len(data), 2),
                                    "sha256_ms_per_image": round(1000 * hashed / len(data), 2)}
        warm_total, hash_total, cases = warm_total + w, hash_total + hashed, cases + len(data)
        print(name, json.dumps(out["per_dataset"][name]), flush=True)
    out.update(cases=cases, warm_s=round(warm_total, 3), warm_ms_per_image=round(1000 * warm_total / cases, 2),
               sha256_s=round(hash_total, 3), sha256_ms_per_image=round(1000 * hash_total / cases, 2))
    print(json.dumps({k: v for k, v in out.items() if k != "per_dataset"}))
    return out


if __name__ == "__main__":
    main()
