"""Randomised proof that the GPU preprocessing kernels (xbench/inference/gpu_preprocess.py) are bit-identical to the CPU path.

Each case draws an image (64–3,072 px per side, independently: up- and down-scales, non-square), a content kind
(noise, constant, gradient, 0/255 spikes, smooth blobs) and a source kind (8-bit file, 16-bit file, windowed
DICOM-like float, MONOCHROME1-inverted float), or one of the two real NIH PNGs when ``--samples`` is given, and one
target, and compares the kernel on ``--device`` with the CPU reference:

* ``pillow``: :func:`resize_pillow` to a random size 8–1,024 with a random filter vs ``PIL.Image.resize``;
* ``area``: :func:`resize_area` to a random smaller size vs :func:`xbench.models.carzero.resize_area`;
* an adapter (``medklip``, ``mavl``, ``kad``, ``kad_512``, ``devide``, ``clip``, ``carzero``): the plan's codes
  gathered through the adapter's table vs the adapter's own CPU ``preprocess`` (``torch.equal``).

Work is spread over ``--workers`` processes (each generates its cases from the case seed, runs the CPU reference
and the kernel, and reports mismatches); the JSON report lists counts per target and every mismatch.

    python benchmarks/bench_gpu_preprocess.py --cases 10000 --workers 16 --device cuda --out docs/perf/gpu_preprocess_exact_h100.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

TARGETS = ("pillow", "area", "medklip", "mavl", "kad", "kad_512", "devide", "clip", "carzero")
CONTENTS = ("noise", "constant", "gradient", "spikes", "blobs")
SOURCES = ("uint8", "uint16", "dicom_float", "monochrome1")


def make_image(rng: np.random.Generator, h: int, w: int, content: str, source: str) -> np.ndarray:
    """An XBench float image ``(h, w)`` in [0, 1] as a reader would return it for ``source``."""
    top = 65535 if source == "uint16" else 255
    if content == "noise":
        v = rng.integers(0, top + 1, (h, w))
    elif content == "constant":
        v = np.full((h, w), int(rng.integers(0, top + 1)))
    elif content == "gradient":
        v = (np.add.outer(np.arange(h) * int(rng.integers(1, 50)), np.arange(w) * int(rng.integers(1, 50)))) % (top + 1)
    elif content == "spikes":
        v = np.where(rng.random((h, w)) < 0.05, top, 0)
    else:  # smooth blobs: a coarse noise grid repeated
        cell = int(rng.integers(4, 64))
        coarse = rng.integers(0, top + 1, (h // cell + 1, w // cell + 1))
        v = np.repeat(np.repeat(coarse, cell, 0), cell, 1)[:h, :w]
    if source == "uint8":
        return (v.astype(np.float32) / np.float32(255.0))
    if source == "uint16":
        return (v.astype(np.float64) / 65535.0).astype(np.float32)
    x = np.clip(v.astype(np.float64) / 255.0 + rng.normal(0, 1e-3, (h, w)), 0, 1)  # windowed: off the 8-bit levels
    return (1.0 - x if source == "monochrome1" else x).astype(np.float32)


def run_cases(rank: int, world: int, args: dict[str, Any], queue: Any) -> None:
    import torch
    from PIL import Image

    from xbench.datasets.images import read_image
    from xbench.inference.gpu_preprocess import check_plan, plan_for, preprocess_standins, resize_area, resize_pillow, source_array
    from xbench.models.carzero import resize_area as resize_area_cpu

    torch.set_num_threads(1)
    device = torch.device(args["device"])
    standins = preprocess_standins()
    plans = {name: plan_for(a) for name, a in standins.items()}
    tables = {name: check_plan(a, plans[name], device) for name, a in standins.items()}
    luts = {name: torch.from_numpy(t).to(device) for name, t in tables.items() if t is not None}
    samples = [read_image(p) for p in args["samples"]]
    filters = (Image.BICUBIC, Image.BILINEAR, Image.BOX)
    out: dict[str, Any] = {"cases": 0, "by_target": {}, "mismatches": [], "unplanned": sorted(set(standins) - set(luts))}
    for case in range(rank, args["cases"], world):
        if time.time() > args["deadline"]:
            out["stopped_by_budget"] = True
            break
        rng = np.random.default_rng([args["seed"], case])
        target = TARGETS[int(rng.integers(len(TARGETS)))]
        if samples and case % 50 == 0:
            image, what = samples[(case // 50) % len(samples)], f"nih{(case // 50) % len(samples)}"
        else:
            h, w = (int(v) for v in rng.integers(64, 3073, 2))
            content, source = CONTENTS[int(rng.integers(len(CONTENTS)))], SOURCES[int(rng.integers(len(SOURCES)))]
            if target == "carzero" and max(h, w) < 256:
                h = 256
            image, what = make_image(rng, h, w, content, source), f"{content}/{source}"
        h, w = image.shape
        src = source_array(image)
        if target == "pillow":
            oh, ow, f = int(rng.integers(8, 1025)), int(rng.integers(8, 1025)), filters[int(rng.integers(3))]
            want = np.asarray(Image.fromarray(src if src.dtype == np.uint8 else (src >> 8).astype(np.uint8)).resize((ow, oh), f))
            u8 = src if src.dtype == np.uint8 else (src >> 8).astype(np.uint8)
            got = resize_pillow(torch.from_numpy(u8).to(device), (oh, ow), f).cpu().numpy()
            same, detail = bool(np.array_equal(got, want)), f"-> {oh}x{ow} filter {f}"
        elif target == "area":
            oh, ow = int(rng.integers(1, h + 1)), int(rng.integers(1, w + 1))
            if case % 3 == 0:  # integer factors (2x2 and others) too
                k = int(rng.integers(2, 5))
                oh, ow = max(h // k, 1), max(w // k, 1)
            u8 = src if src.dtype == np.uint8 else (src >> 8).astype(np.uint8)
            want = resize_area_cpu(u8, oh, ow)
            got = resize_area(torch.from_numpy(u8).to(device), oh, ow).cpu().numpy()
            same, detail = bool(np.array_equal(got, want)), f"-> {oh}x{ow}"
        else:
            if target not in luts:
                continue
            want = torch.as_tensor(np.asarray(standins[target].preprocess(image), dtype=np.float32))
            codes = plans[target](torch.from_numpy(src).to(device))
            got = luts[target][:, codes.long()].cpu()
            same, detail = bool(torch.equal(got, want)), ""
        out["cases"] += 1
        row = out["by_target"].setdefault(target, {"cases": 0, "mismatches": 0})
        row["cases"] += 1
        if not same:
            row["mismatches"] += 1
            out["mismatches"].append(f"case {case} {target} {what} {h}x{w} {detail}")
    queue.put(out)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cases", type=int, default=10000)
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    p.add_argument("--device", default="cuda")
    p.add_argument("--seed", type=int, default=22)
    p.add_argument("--samples", nargs="*", default=[], help="real images (the NIH PNGs) used every 50th case")
    p.add_argument("--budget", type=float, default=1e9, help="seconds after which no new case starts")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    import multiprocessing as mp

    import PIL
    import torch

    started = time.perf_counter()
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    shared = {"cases": args.cases, "device": args.device, "seed": args.seed, "samples": [str(s) for s in args.samples],
              "deadline": time.time() + args.budget}
    procs = [ctx.Process(target=run_cases, args=(r, args.workers, shared, queue)) for r in range(args.workers)]
    for proc in procs:
        proc.start()
    parts = [queue.get() for _ in procs]
    for proc in procs:
        proc.join()
    report: dict[str, Any] = {"cases": sum(x["cases"] for x in parts), "by_target": {}, "mismatches": [],
                              "unplanned": sorted({n for x in parts for n in x["unplanned"]}),
                              "seconds": round(time.perf_counter() - started, 1),
                              "args": {k: str(v) for k, v in vars(args).items()},
                              "environment": {"python": sys.version.split()[0], "torch": torch.__version__,
                                              "pillow": PIL.__version__, "numpy": np.__version__,
                                              "device": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"}}
    for x in parts:
        report["mismatches"].extend(x["mismatches"])
        for t, row in x["by_target"].items():
            agg = report["by_target"].setdefault(t, {"cases": 0, "mismatches": 0})
            agg["cases"] += row["cases"]
            agg["mismatches"] += row["mismatches"]
    report["stopped_by_budget"] = any(x.get("stopped_by_budget") for x in parts)
    report["all_identical"] = not report["mismatches"] and not report["unplanned"] and report["cases"] > 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    print(json.dumps({k: v for k, v in report.items() if k != "mismatches"}, indent=1))
    print(f"mismatches: {len(report['mismatches'])}", *report["mismatches"][:20], sep="\n")
    return report


if __name__ == "__main__":
    main()
