"""Benchmark: the evaluation of a run at the paper's scale, from stored maps and scores to the tidy table.

The paper evaluates 7 models on 7 datasets, 12,880 test cases (RSNA 5,337, SIIM
2,409, COVID-19 Rural 44, ChestX-Det10 542, CheXlocalize 668, NIH 880,
VinDr-CXR 3,000) with up to 21 classes. This script builds a synthetic stand-in
with those case and class counts and, per class, the number of grounding pairs
(positive cases with a region) the manifests give (the smaller of ``positives``
and ``region_counts`` of ``data_manifests/*.yaml``; RSNA/SIIM ``positive_cases``); where a manifest has no
per-class count (CheXlocalize, VinDr-CXR, COVID-19 Rural) a stated assumption is
used (see :data:`ASSUMED_PAIRS`). Maps are seeded random 14×14 float16 per case
and class, written and read back as one ``.npz`` per (dataset, model) like the
results store; probabilities are random, shifted up for positives. Ground truth
is a random region per pair at the set's full image size (:data:`FULL_SIZE`:
boxes for RSNA / NIH / VinDr-CXR, polygons for the others, standing in for
SIIM's and COVID-19 Rural's decoded masks), rasterised to 224×224 by the
package's :func:`~xbench.datasets.regions.rasterize` as the loaders do.

One *phase* is what :func:`xbench.evaluation.evaluate.evaluate_run` does: per
dataset its ground truth (rasterised, written to a cache file with
:func:`~xbench.evaluation.ground_truth.write_cache`), then for each model
``grounding_scores`` of every pair (upsample, normalise, pointing, Dice/IoU at
τ = 0.5 and over the 101-point grid) and ``score_table`` (class / dataset /
pooled values, best τ per class, 1,000 paired bootstrap replicates with τ
re-chosen in each), with one BLAS thread per process as ``evaluate_run``. The
serial phase always runs; ``--workers N`` (N > 1) runs the same work again in a
pool of N processes (:func:`xbench.core.workers.process_pool`, its start-up
inside the timing; ground truth in chunks of pairs, one job per (dataset,
model) reading the cache file, gathered in run order), prints the SHA-256 of
both phases' tables and the ratio of their walls, and exits with an error if
the tables differ.

With ``--compare`` it also times the paired model comparisons of each dataset
(:func:`xbench.metrics.compare_models` on the replicates the tables' CIs used, as
``evaluate_run`` does; ``--test`` picks the p-value, default the run's) and prints their cost as a fraction of the evaluation
time of the same run; ``--json PATH`` writes the timings.

Models are independent, so ``--models k`` measures ``k`` of them and the serial
evaluation time for 7 is extrapolated linearly (printed as such; ground truth is
once per dataset and not scaled).

Usage::

    python benchmarks/bench_evaluate.py --models 2                 # 2 of 7 models, extrapolated to 7
    python benchmarks/bench_evaluate.py --models 7                 # the full paper scale
    python benchmarks/bench_evaluate.py --datasets nih_bbox --models 1 --replicates 200   # a quick check
    python benchmarks/bench_evaluate.py --models 7 --compare --json docs/perf/compare_paper_scale_cpu.json   # comparisons' cost
    python benchmarks/bench_evaluate.py --models 7 --workers 16 --json docs/perf/evaluate_paper_scale_16cpu.json  # 16 cores
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import sys
import tempfile
import time
import warnings
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from threadpoolctl import threadpool_info

from xbench.core.errors import XBenchWarning
from xbench.core.workers import one_blas_thread, process_pool
from xbench.datasets.regions import Box, Polygon
from xbench.evaluation.comparisons import RUN_TEST
from xbench.evaluation.ground_truth import GroundTruth, rasterize_stack, read_cache, write_cache
from xbench.metrics import ScoredTable, compare_models, grounding_scores, scored_table
from xbench.spec.registry import dataset_manifest

GRID, NATIVE, MODELS_IN_PAPER = (224, 224), (14, 14), 7

#: (cases, classes) of the seven evaluation sets of the paper (test splits; manifests' expected cases).
PAPER_SETS = {
    "rsna_pneumonia": (5337, 1),
    "siim_acr": (2409, 1),
    "covid_rural": (44, 1),
    "chestx_det10": (542, 10),
    "chexlocalize": (668, 13),
    "nih_bbox": (880, 8),
    "vindr_cxr": (3000, 21),
}
#: Pairs per class where the manifest has no per-class count (assumptions, not data):
#: COVID-19 Rural: every test image has an opacity mask; CheXlocalize: 100 pairs for each of
#: its 10 localised classes (3 classes are recognition-only); VinDr-CXR: 75 per class (~1,600 pairs).
ASSUMED_PAIRS = {"covid_rural": [44], "chexlocalize": [100] * 10, "vindr_cxr": [75] * 21}


@dataclass
class SetSpec:
    name: str
    cases: int
    classes: int
    pairs: list[int]  # grounding pairs per localised class
    source: str  # "manifest" or "assumed"


def paper_sets(names: list[str] | None = None) -> list[SetSpec]:
    out = []
    for name, (cases, classes) in PAPER_SETS.items():
        if names and name not in names:
            continue
        split = dataset_manifest(name)["splits"][dataset_manifest(name).get("default_split", "test")]
        expected = split.get("expected", {})
        if "positives" in expected:  # a pair needs a positive label and a region: at most both counts
            regions = expected.get("region_counts", {})
            pairs = [min(n, regions.get(c, n)) for c, n in expected["positives"].items()]
            source = "manifest"
        elif "positive_cases" in expected:
            pairs, source = [int(expected["positive_cases"])], "manifest"
        else:
            pairs, source = ASSUMED_PAIRS[name], "assumed"
        out.append(SetSpec(name, cases, classes, pairs, source))
    return out


#: Full image size (height, width) and region kind of each stand-in set, as its loader would rasterise it
#: (assumptions stated here, typical of each source): boxes are rasterised on the grid by the pixel-centre rule,
#: polygons (and SIIM's / COVID-19 Rural's decoded masks, stood in for by polygons) are drawn at full size and
#: area-resampled (:func:`xbench.datasets.regions.rasterize`).
FULL_SIZE = {
    "rsna_pneumonia": ((1024, 1024), "box"),
    "siim_acr": ((1024, 1024), "polygon"),
    "covid_rural": ((2048, 2048), "polygon"),
    "chestx_det10": ((1024, 1024), "polygon"),
    "chexlocalize": ((2320, 2828), "polygon"),
    "nih_bbox": ((1024, 1024), "box"),
    "vindr_cxr": ((2500, 3000), "box"),
}


def make_set(spec: SetSpec, seed: int) -> dict:
    """Labels and, per localised class, the positive rows and their regions at full image size (shared by all
    models): a random box (8–112 grid pixels a side, scaled to the image) or a 12-vertex polygon inside it."""
    rng = np.random.default_rng(seed)
    (height, width), kind = FULL_SIZE.get(spec.name, ((1024, 1024), "box"))
    case_ids = np.array([f"{spec.name}-{i:05d}" for i in range(spec.cases)])
    labels = np.zeros((spec.cases, spec.classes))
    rows, regions = [], []
    for c, n in enumerate(spec.pairs):
        pos = np.sort(rng.choice(spec.cases, size=min(n, spec.cases), replace=False))
        labels[pos, c] = 1
        rows.append(pos)
        size = rng.integers(8, 112, size=(len(pos), 2))
        corner = rng.integers(0, GRID[0] - size + 1)
        sy, sx = height / GRID[0], width / GRID[1]
        boxes = np.concatenate([corner, corner + size], axis=1) * [sy, sx, sy, sx]  # (y0, x0, y1, x1) in pixels
        if kind == "box":
            regions.append([[Box(x0, y0, x1, y1)] for y0, x0, y1, x1 in boxes])
        else:
            angles = np.sort(rng.random((len(pos), 12)) * 2 * np.pi, axis=1)
            radius = 0.5 + 0.5 * rng.random((len(pos), 12))
            cy, cx = (boxes[:, 0] + boxes[:, 2]) / 2, (boxes[:, 1] + boxes[:, 3]) / 2
            ry, rx = (boxes[:, 2] - boxes[:, 0]) / 2, (boxes[:, 3] - boxes[:, 1]) / 2
            xs = cx[:, None] + rx[:, None] * radius * np.cos(angles)
            ys = cy[:, None] + ry[:, None] * radius * np.sin(angles)
            regions.append([[Polygon(np.stack([x, y], axis=1))] for x, y in zip(xs, ys)])
    for c in range(len(spec.pairs), spec.classes):  # recognition-only classes
        labels[rng.random(spec.cases) < 0.1, c] = 1
    return {"case_ids": case_ids, "labels": labels, "rows": rows, "regions": regions, "size": (height, width)}


def write_predictions(folder: Path, spec: SetSpec, data: dict, model: int) -> Path:
    """Stored-format predictions of one model: float16 maps (cases, classes, 14, 14), float32 probabilities."""
    rng = np.random.default_rng([model, spec.cases])
    maps = rng.random((spec.cases, spec.classes, *NATIVE), dtype=np.float32).astype(np.float16)
    probs = np.clip(rng.random((spec.cases, spec.classes)) * 0.8 + 0.2 * data["labels"], 0, 1).astype(np.float32)
    path = folder / f"{spec.name}-model{model}.npz"
    np.savez(path, case_ids=data["case_ids"], maps=maps, probs=probs)
    return path


def ground_truth_of(spec: SetSpec, data: dict, pool: Executor | None, workers: int) -> dict[str, GroundTruth]:
    """Class → :class:`GroundTruth` of one set, rasterised here (``pool`` None) or by ``pool`` in chunks of
    pairs, concatenated in order (as :func:`xbench.evaluation.ground_truth.ground_truth`); pairs whose mask
    vanishes at the grid are left out."""
    per_class: list[list[np.ndarray]] = [[] for _ in data["rows"]]
    if pool is None:
        for c, regions in enumerate(data["regions"]):
            per_class[c].append(rasterize_stack(regions, data["size"], GRID))
    else:
        total = sum(len(r) for r in data["regions"])
        size = max(16, -(-total // (4 * workers)))
        jobs = [(c, i) for c, regions in enumerate(data["regions"]) for i in range(0, len(regions), size)]
        futures = [pool.submit(rasterize_stack, data["regions"][c][i:i + size], data["size"], GRID) for c, i in jobs]
        for (c, _), future in zip(jobs, futures):
            per_class[c].append(future.result())
    out = {}
    for c, parts in enumerate(per_class):
        masks = np.concatenate(parts)
        keep = masks.reshape(len(masks), -1).any(axis=1)
        out[f"class{c}"] = GroundTruth(data["rows"][c][keep], masks[keep], int((~keep).sum()))
    return out


_GT_MEMO: dict[str, dict[str, GroundTruth]] = {}


def evaluate_one(path: Path, spec: SetSpec, data: dict, gt: dict[str, GroundTruth] | tuple[Path, dict],
                 n_boot: int) -> ScoredTable:
    """What evaluate_pair does after the store: grounding of every pair, then score_table (with its replicates).

    ``gt``: the set's ground truth, or ``(cache file, key)`` to read it as a worker does (kept for the next
    model of the same set in this process)."""
    if isinstance(gt, tuple):
        if str(gt[0]) not in _GT_MEMO:
            _GT_MEMO.clear()
            _GT_MEMO[str(gt[0])] = read_cache(*gt)
        gt = _GT_MEMO[str(gt[0])]
    with np.load(path) as z:
        maps, probs = z["maps"], z["probs"]
    findings = [f"class{c}" for c in range(spec.classes)]
    frames = []
    for c, finding in enumerate(findings[:len(data["rows"])]):
        rows, masks, _ = gt[finding]
        s = grounding_scores(maps[rows, c].astype(np.float32), masks, grid=GRID)
        frames.append(s.to_frame(list(data["case_ids"][rows]), finding))
    labels = pd.DataFrame(data["labels"], index=data["case_ids"], columns=findings)
    scores = pd.DataFrame(probs, index=labels.index, columns=findings)
    return scored_table(pd.concat(frames, ignore_index=True), model="m", dataset=spec.name, labels=labels,
                        scores=scores, findings=findings, n_boot=n_boot, seed=0)


def quiet(fn, *args):
    """``fn(*args)`` with XBench warnings (dropped replicates of rare classes, expected here) silenced."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", XBenchWarning)
        return fn(*args)


def prepare(specs: list[SetSpec], models: int, folder: Path) -> list[tuple[SetSpec, dict, list[Path]]]:
    """Every set's labels and regions, and each model's stored predictions (not timed)."""
    return [(s, data, [write_predictions(folder, s, data, m) for m in range(models)])
            for s in specs for data in [make_set(s, seed=len(s.name))]]


def run_phase(prepared: list, args: argparse.Namespace, folder: Path, workers: int) -> dict:
    """One evaluation of every set and model, as ``evaluate_run`` does it: per set its ground truth (rasterised,
    written to a cache file), its models' tables, then (``--compare``) its comparisons. ``workers`` > 1: in a
    pool of that many processes (:func:`xbench.core.workers.process_pool`, started inside the timing), ground
    truth in chunks of pairs and one job per (set, model) reading the cache file, gathered in run order."""
    started, cpu_started = time.perf_counter(), time.process_time()
    digest, compare_digest = hashlib.sha256(), hashlib.sha256()
    out = {"rows": 0, "ground_truth_wall_s": 0.0, "evaluate_wall_s": 0.0, "evaluate_cpu_s": 0.0, "compare_wall_s": 0.0,
           "compare_cpu_s": 0.0, "comparison_rows": 0, "per_dataset": []}
    pool = process_pool(workers, preload=("xbench.evaluation.evaluate",), main=True) if workers > 1 else None
    blas = one_blas_thread()  # as evaluate_run: one BLAS thread in every process (tables independent of cores)
    try:
        pending = []
        for spec, data, paths in prepared:
            w = time.perf_counter()
            gt = ground_truth_of(spec, data, pool, workers)
            key = {"set": spec.name, "grid": list(GRID), "phase": "pool" if pool else "serial"}
            cache = write_cache(folder / f"gt-{spec.name}-{key['phase']}.npz", key, gt)
            out["ground_truth_wall_s"] += time.perf_counter() - w
            if pool is not None:
                pending.append((spec, [pool.submit(quiet, evaluate_one, p, spec, data, (cache, key), args.replicates)
                                       for p in paths]))
                continue
            results, set_wall, set_started = [], time.perf_counter() - w, time.perf_counter()
            for m, path in enumerate(paths):
                w, c = time.perf_counter(), time.process_time()
                results.append(quiet(evaluate_one, path, spec, data, gt, args.replicates))
                dw, dc = time.perf_counter() - w, time.process_time() - c
                out["evaluate_wall_s"] += dw
                out["evaluate_cpu_s"] += dc
                print(f"  {spec.name:16s} model {m}: {dw:7.2f} s wall {dc:7.2f} s CPU ({len(results[-1].table)} rows)")
            out["per_dataset"].append({"dataset": spec.name, "cases": spec.cases, "classes": spec.classes,
                                       "pairs": int(sum(len(g.rows) for g in gt.values())),
                                       "ground_truth_wall_s": round(set_wall, 3),
                                       "evaluate_wall_s": round(time.perf_counter() - set_started, 3)})
            pending.append((spec, results))
        for spec, results in pending:
            scored = {}
            for m, result in enumerate(results):
                result = result.result() if pool is not None else result
                digest.update(result.table.to_csv(index=False).encode())
                out["rows"] += len(result.table)
                scored[f"model{m}"] = result
            if args.compare:
                w, c = time.perf_counter(), time.process_time()
                comparisons, ranks = compare_models(scored, dataset=spec.name, test=args.test)
                for frame in (comparisons, ranks):
                    compare_digest.update(frame.to_csv(index=False).encode())
                dw, dc = time.perf_counter() - w, time.process_time() - c
                out["compare_wall_s"] += dw
                out["compare_cpu_s"] += dc
                out["comparison_rows"] += len(comparisons)
                if pool is None:
                    print(f"  {spec.name:16s} comparisons of {len(scored)} models: {dw:7.2f} s wall {dc:7.2f} s CPU "
                          f"({len(comparisons)} comparison rows, {len(ranks)} rank rows)")
    finally:
        blas.restore_original_limits()
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
    out.update(wall_s=time.perf_counter() - started, parent_cpu_s=time.process_time() - cpu_started,
               tables_sha256=digest.hexdigest(), comparisons_sha256=compare_digest.hexdigest() if args.compare else None)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=2, help="models to evaluate (default 2; 7 in the paper)")
    parser.add_argument("--replicates", type=int, default=1000, help="bootstrap replicates (default 1000)")
    parser.add_argument("--datasets", nargs="*", help="subset of the seven sets (default all)")
    parser.add_argument("--workers", type=int, default=1,
                        help="also evaluate with this many worker processes, in the same run (default 1: serial only)")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's default)")
    parser.add_argument("--compare", action="store_true", help="also time the paired model comparisons per dataset")
    parser.add_argument("--test", choices=("permutation", "bootstrap"), default=RUN_TEST,
                        help="the comparisons' p-value (default: the run's, xbench.evaluation.comparisons.RUN_TEST)")
    parser.add_argument("--json", type=Path, help="write the timings to this JSON file")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    specs = paper_sets(args.datasets)
    load_start = os.getloadavg()
    libs = ", ".join(f"{i['internal_api']} {i['num_threads']}" for i in threadpool_info())
    print(f"{os.cpu_count()} CPUs; torch {torch.__version__} intra-op threads {torch.get_num_threads()}; {libs}")
    print(f"{'dataset':16s} {'cases':>6s} {'classes':>7s} {'pairs':>6s} {'counts':>8s} {'image':>11s} {'regions':>8s}")
    for s in specs:
        (h, w), kind = FULL_SIZE[s.name]
        print(f"{s.name:16s} {s.cases:6d} {s.classes:7d} {sum(s.pairs):6d} {s.source:>8s} {h:5d}x{w:<5d} {kind:>8s}")
    print(f"total: {sum(s.cases for s in specs)} cases, {sum(sum(s.pairs) for s in specs)} pairs per model, "
          f"{args.replicates} replicates, {args.models} of {MODELS_IN_PAPER} models")

    with tempfile.TemporaryDirectory() as tmp:
        prepared = prepare(specs, args.models, Path(tmp))
        print("serial (one process, as evaluate_run with eval_workers: 0):")
        serial = run_phase(prepared, args, Path(tmp), 1)
        parallel = None
        if args.workers > 1:
            print(f"parallel ({args.workers} worker processes, pool start-up included):")
            parallel = run_phase(prepared, args, Path(tmp), args.workers)
    load_end = os.getloadavg()
    wall, cpu, rows = serial["evaluate_wall_s"], serial["evaluate_cpu_s"], serial["rows"]
    scale = MODELS_IN_PAPER / args.models
    print(f"load average (1/5/15 min) at start {load_start[0]:.2f}/{load_start[1]:.2f}/{load_start[2]:.2f}, "
          f"at end {load_end[0]:.2f}/{load_end[1]:.2f}/{load_end[2]:.2f}")
    print(f"measured, {args.models} model(s): {wall:.1f} s wall, {cpu:.1f} s CPU ({rows} table rows, "
          f"sha256 of the tables {serial['tables_sha256'][:16]}); ground truth {serial['ground_truth_wall_s']:.1f} s wall "
          f"(once per dataset)")
    if args.models != MODELS_IN_PAPER:
        print(f"extrapolated to {MODELS_IN_PAPER} models (x{scale:.2f}): {wall * scale:.1f} s wall, {cpu * scale:.1f} s CPU "
              f"(+ ground truth {serial['ground_truth_wall_s']:.1f} s)")
    if args.compare:
        print(f"comparisons: {serial['compare_wall_s']:.1f} s wall, {serial['compare_cpu_s']:.1f} s CPU "
              f"({serial['comparison_rows']} rows) = {100 * serial['compare_wall_s'] / wall:.1f} % of the evaluation's "
              f"wall time, {100 * serial['compare_cpu_s'] / cpu:.1f} % of its CPU time (measured in this run, "
              f"{args.models} models)")
    print(f"serial   total (ground truth + evaluation{' + comparisons' if args.compare else ''}): "
          f"{serial['wall_s']:.1f} s wall; tables sha256 {serial['tables_sha256']}")
    identical = True
    if parallel is not None:
        identical = parallel["tables_sha256"] == serial["tables_sha256"] and \
            parallel["comparisons_sha256"] == serial["comparisons_sha256"]
        print(f"parallel total ({args.workers} workers, same work): {parallel['wall_s']:.1f} s wall; "
              f"tables sha256 {parallel['tables_sha256']}")
        if args.compare:
            print(f"comparisons sha256: serial {serial['comparisons_sha256']}, parallel {parallel['comparisons_sha256']}")
        print(f"tables identical: {'yes' if identical else 'NO'}; speed-up on equal work "
              f"{serial['wall_s'] / parallel['wall_s']:.2f}x ({serial['wall_s']:.1f} s serial / "
              f"{parallel['wall_s']:.1f} s with {args.workers} workers)")
    if args.json:
        record = {"command": "python benchmarks/bench_evaluate.py " + " ".join(sys.argv[1:]),
                  "machine": {"platform": platform.platform(), "processor": platform.processor(), "cpus": os.cpu_count(),
                              "torch_threads": torch.get_num_threads(), "blas": libs},
                  "load_average_start": load_start, "load_average_end": load_end,
                  "models": args.models, "replicates": args.replicates, "cases": sum(s.cases for s in specs),
                  "evaluate": {"wall_s": round(wall, 3), "cpu_s": round(cpu, 3), "table_rows": rows,
                               "tables_sha256": serial["tables_sha256"]},
                  "ground_truth": {"wall_s": round(serial["ground_truth_wall_s"], 3)},
                  "serial": {"wall_s": round(serial["wall_s"], 3)},
                  "per_dataset": serial["per_dataset"]}
        if args.compare:
            record["compare"] = {"test": args.test, "wall_s": round(serial["compare_wall_s"], 3), "cpu_s": round(serial["compare_cpu_s"], 3),
                                 "comparison_rows": serial["comparison_rows"],
                                 "wall_fraction_of_evaluate": round(serial["compare_wall_s"] / wall, 4),
                                 "cpu_fraction_of_evaluate": round(serial["compare_cpu_s"] / cpu, 4)}
        if parallel is not None:
            record["parallel"] = {"workers": args.workers, "wall_s": round(parallel["wall_s"], 3),
                                  "tables_sha256": parallel["tables_sha256"],
                                  "comparisons_sha256": parallel["comparisons_sha256"], "identical": identical,
                                  "speedup": round(serial["wall_s"] / parallel["wall_s"], 3)}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(record, indent=1) + "\n")
        print(f"wrote {args.json}")
    if not identical:
        sys.exit("tables differ between the serial and the parallel evaluation")


if __name__ == "__main__":
    main()
