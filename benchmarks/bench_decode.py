"""The decode stage alone: :class:`xbench.inference.input_feed.InputFeed` over every stand-in dataset of ``bench_gpu.py``,
with preprocess-only stand-ins of the ported adapters (no networks) plus the centre prior.

It answers "how fast can the decode stage feed the models?" apart from the models: images/s and the stage's own
profile (worker CPU seconds reading files and preprocessing on the CPU, device preprocessing seconds in this process,
wall). Stand-ins are made with ``benchmarks/bench_gpu.py --phases none`` (``--root``).

Usage::

    python benchmarks/bench_decode.py --root /tmp/data --workers 16 --device cuda      # GPU preprocessing
    python benchmarks/bench_decode.py --root /tmp/data --workers 16 --device cpu       # every resize in the workers
    python benchmarks/bench_decode.py --root /tmp/data --workers 2 --device torch-cpu  # the device kernels, on the CPU

``--prior-reads-pixels`` feeds the centre prior as a model that reads pixels (its thumbnail computed in the workers,
as before ``Adapter.reads_pixels``), for an A/B of the workers' CPU on the same cases.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

DATASETS = ["rsna_pneumonia", "siim_acr", "covid_rural", "chestx_det10", "chexlocalize", "nih_bbox", "vindr_cxr"]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--root", type=Path, required=True, help="stand-ins written by bench_gpu.py")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    p.add_argument("--device", default="cuda",
                   help="where ported resizes run; 'cpu': in the decode workers; 'torch-cpu': the device kernels on the CPU")
    p.add_argument("--prior-reads-pixels", action="store_true", help="feed the centre prior its thumbnails (A/B)")
    p.add_argument("--cache-dir", default=None, help="a cold decode cache folder (entries written as in a run)")
    p.add_argument("--datasets", default=",".join(DATASETS), help="comma-separated stand-ins to decode")
    args = p.parse_args(argv)
    os.environ["XBENCH_MANIFESTS"] = str(args.root / "manifests")
    import xbench
    import xbench.spec.registry as registry
    from xbench.inference.input_feed import InputFeed
    from xbench.inference.gpu_preprocess import preprocess_standins

    registry.MANIFEST_DIRS[:] = [args.root / "manifests"]
    standins = preprocess_standins()
    prior = xbench.create_model("center_prior")
    if args.prior_reads_pixels:
        prior.reads_pixels = True  # this object only: its thumbnails are decoded as for a model that reads pixels
    adapters = [standins[k] for k in ("clip", "medklip", "kad", "carzero", "devide")] + [prior]
    device = {"cpu": None, "torch-cpu": "cpu"}.get(args.device, args.device)
    total = {"read": 0.0, "cpu_prep": 0.0, "device_prep": 0.0, "wall": 0.0}
    per: dict[str, Any] = {}
    cases, started = 0, time.perf_counter()
    for name in args.datasets.split(","):
        data = xbench.load_dataset(f"standin_{name}", root=str(args.root / name))
        feed = InputFeed(data, adapters, workers=args.workers, preprocess_device=device,
                         cache_dir=f"{args.cache_dir}/{name}" if args.cache_dir else None)
        t = time.perf_counter()
        feed.ensure(range(len(data)))
        per[name] = {"cases": len(data), "seconds": round(time.perf_counter() - t, 2),
                     **{k: round(v, 2) for k, v in feed.profile.items()}}
        cases += len(data)
        for k in total:
            total[k] += feed.profile[k]
        print(name, json.dumps(per[name]), flush=True)
    wall = time.perf_counter() - started
    out = {"cases": cases, "wall": round(wall, 2), "img_s": round(cases / wall, 1), "workers": args.workers,
           "device": args.device, "prior_reads_pixels": args.prior_reads_pixels,
           "worker_cpu_ms_per_case": round(1000 * (total["read"] + total["cpu_prep"]) / max(cases, 1), 1), "cache": bool(args.cache_dir), **{k: round(v, 2) for k, v in total.items()},
           "per_dataset": per}
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
