"""The decode cache's content key, BLAKE2b-128 (before round 10) against SHA-256 (round 10), on the same files.

Every file under ``--root`` (the stand-ins of ``benchmarks/bench_gpu.py``) is hashed by both functions in turn,
``--repeats`` times, one process, files read from the page cache after a first untimed read. Prints one JSON line:
seconds per function, bytes, GB/s and the ratio, plus the CPU's model and SHA extensions.

    python docs/perf/round18_content_hash.py --root /tmp/sd --repeats 3
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from bench_gpu import cpu_info  # noqa: E402

from xbench.inference.cache import content_hash  # noqa: E402  (SHA-256 since round 10)


def blake2b_128(path: Path) -> str:  # the key of xbench/inference/cache.py before round 10
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--root", type=Path, required=True)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    files = sorted(f for f in args.root.rglob("*") if f.is_file() and "images" in f.parts)
    for f in files:  # into the page cache
        f.read_bytes()
    seconds = {"blake2b_128": 0.0, "sha256": 0.0}
    for _ in range(args.repeats):
        for f in files:
            for name, fn in (("blake2b_128", blake2b_128), ("sha256", content_hash)):
                t = time.perf_counter()
                fn(f)
                seconds[name] += time.perf_counter() - t
    size = sum(f.stat().st_size for f in files) * args.repeats
    print(json.dumps({"files": len(files), "repeats": args.repeats, "bytes": size,
                      "seconds": {k: round(v, 3) for k, v in seconds.items()},
                      "gb_per_s": {k: round(size / v / 1e9, 3) for k, v in seconds.items()},
                      "blake2b_over_sha256": round(seconds["blake2b_128"] / seconds["sha256"], 2),
                      "ms_per_file": {k: round(1000 * v / len(files) / args.repeats, 2) for k, v in seconds.items()},
                      **cpu_info()}))


if __name__ == "__main__":
    main()
