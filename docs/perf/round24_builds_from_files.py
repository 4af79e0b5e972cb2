"""Seconds to build the six networks from their weight files, the path of a real run (``xbench.create_model``:
the checkpoint read and checked, the network built uninitialised, the strict load), on the CPU.

The weight files are the stand-ins' (``benchmarks/bench_gpu.py --phases none --weights files`` writes them under
``<root>/weights/<model>``). Run it from inside each tree to compare two codes; each build is timed after one
untimed build of every model (imports, page cache). Prints JSON: per model the median of ``--repeats`` builds.

    cd <tree> && PYTHONPATH=. HF_HUB_OFFLINE=1 python docs/perf/round24_builds_from_files.py <root>/weights --repeats 3
"""
import argparse
import json
import statistics
import time
from pathlib import Path

import torch

import xbench

MODELS = ["medklip", "kad", "mavl", "clip", "carzero", "devide"]

p = argparse.ArgumentParser()
p.add_argument("weights", type=Path)
p.add_argument("--repeats", type=int, default=3)
args = p.parse_args()
for name in MODELS:  # untimed: imports and the page cache
    xbench.create_model(name, weights=args.weights / name)
seconds: dict[str, list[float]] = {name: [] for name in MODELS}
for _ in range(args.repeats):
    for name in MODELS:
        started = time.perf_counter()
        xbench.create_model(name, weights=args.weights / name)
        seconds[name].append(time.perf_counter() - started)
median = {name: round(statistics.median(s), 3) for name, s in seconds.items()}
median["total"] = round(sum(median.values()), 3)
print(json.dumps({"xbench": xbench.__file__, "median_seconds": median, "repeats": args.repeats,
                  "threads": torch.get_num_threads()}))
