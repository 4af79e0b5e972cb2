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
results store; ground truth is a random box per pair at 224×224; probabilities
are random, shifted up for positives.

For each (dataset, model) it times what :func:`xbench.evaluation.evaluate.evaluate_pair`
does after reading the store: ``grounding_scores`` of every pair (upsample,
normalise, pointing, Dice/IoU at τ = 0.5 and over the 101-point grid) and
``score_table`` (class / dataset / pooled values, best τ per class, 1,000
paired bootstrap replicates with τ re-chosen in each). Ground-truth
rasterisation (once per dataset, in the loaders) is not included.

With ``--compare`` it also times the paired model comparisons of each dataset
(:func:`xbench.metrics.compare_models` on the replicates the tables' CIs used, and writing
them as CSV, as ``evaluate_run`` does) and prints their cost as a fraction of the evaluation
time of the same run; ``--json PATH`` writes the timings.

The tables' SHA-256 is printed, so two versions of the code can be checked to give
identical tables. Models are independent, so ``--models k`` measures ``k`` of them and the
total for 7 is extrapolated linearly (printed as such).

Usage::

    python benchmarks/bench_evaluate.py --models 2                 # 2 of 7 models, extrapolated to 7
    python benchmarks/bench_evaluate.py --models 7                 # the full paper scale
    python benchmarks/bench_evaluate.py --datasets nih_bbox --models 1 --replicates 200   # a quick check
    python benchmarks/bench_evaluate.py --models 7 --compare --json docs/perf/compare.json   # comparisons' cost
"""
from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import platform
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from threadpoolctl import threadpool_info

from xbench.core.errors import XBenchWarning
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


def make_set(spec: SetSpec, seed: int) -> dict:
    """Labels, per-pair rows / boxes of one synthetic dataset (shared by all models)."""
    rng = np.random.default_rng(seed)
    case_ids = np.array([f"{spec.name}-{i:05d}" for i in range(spec.cases)])
    labels = np.zeros((spec.cases, spec.classes))
    rows, boxes = [], []
    for c, n in enumerate(spec.pairs):
        pos = np.sort(rng.choice(spec.cases, size=min(n, spec.cases), replace=False))
        labels[pos, c] = 1
        rows.append(pos)
        size = rng.integers(8, 112, size=(len(pos), 2))
        corner = rng.integers(0, GRID[0] - size + 1)
        boxes.append(np.concatenate([corner, corner + size], axis=1))
    for c in range(len(spec.pairs), spec.classes):  # recognition-only classes
        labels[rng.random(spec.cases) < 0.1, c] = 1
    return {"case_ids": case_ids, "labels": labels, "rows": rows, "boxes": boxes}


def masks_of(boxes: np.ndarray) -> np.ndarray:
    yy = np.arange(GRID[0])[None, :, None]
    xx = np.arange(GRID[1])[None, None, :]
    b = boxes[:, :, None, None]
    return (yy >= b[:, 0]) & (yy < b[:, 2]) & (xx >= b[:, 1]) & (xx < b[:, 3])


def write_predictions(folder: Path, spec: SetSpec, data: dict, model: int) -> Path:
    """Stored-format predictions of one model: float16 maps (cases, classes, 14, 14), float32 probabilities."""
    rng = np.random.default_rng([model, spec.cases])
    maps = rng.random((spec.cases, spec.classes, *NATIVE), dtype=np.float32).astype(np.float16)
    probs = np.clip(rng.random((spec.cases, spec.classes)) * 0.8 + 0.2 * data["labels"], 0, 1).astype(np.float32)
    path = folder / f"{spec.name}-model{model}.npz"
    np.savez(path, case_ids=data["case_ids"], maps=maps, probs=probs)
    return path


def evaluate_one(path: Path, spec: SetSpec, data: dict, n_boot: int) -> ScoredTable:
    """What evaluate_pair does after the store: grounding of every pair, then score_table (with its replicates)."""
    with np.load(path) as z:
        maps, probs = z["maps"], z["probs"]
    findings = [f"class{c}" for c in range(spec.classes)]
    frames = []
    for c, (rows, boxes) in enumerate(zip(data["rows"], data["boxes"])):
        s = grounding_scores(maps[rows, c].astype(np.float32), masks_of(boxes), grid=GRID)
        frames.append(s.to_frame(list(data["case_ids"][rows]), findings[c]))
    labels = pd.DataFrame(data["labels"], index=data["case_ids"], columns=findings)
    scores = pd.DataFrame(probs, index=labels.index, columns=findings)
    return scored_table(pd.concat(frames, ignore_index=True), model="m", dataset=spec.name, labels=labels,
                        scores=scores, findings=findings, n_boot=n_boot, seed=0)


def compare_set(spec: SetSpec, scored: dict[str, ScoredTable]) -> tuple[int, int]:
    """What evaluate_run does per dataset after its models: paired comparisons and ranks, written as CSV."""
    comparisons, ranks = compare_models(scored, dataset=spec.name)
    for frame in (comparisons, ranks):
        frame.to_csv(io.StringIO(), index=False)
    return len(comparisons), len(ranks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=2, help="models to evaluate (default 2; 7 in the paper)")
    parser.add_argument("--replicates", type=int, default=1000, help="bootstrap replicates (default 1000)")
    parser.add_argument("--datasets", nargs="*", help="subset of the seven sets (default all)")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's default)")
    parser.add_argument("--compare", action="store_true", help="also time the paired model comparisons per dataset")
    parser.add_argument("--json", type=Path, help="write the timings to this JSON file")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore", XBenchWarning)  # dropped replicates of rare classes are expected here
    specs = paper_sets(args.datasets)
    load_start = os.getloadavg()
    libs = ", ".join(f"{i['internal_api']} {i['num_threads']}" for i in threadpool_info())
    print(f"{os.cpu_count()} CPUs; torch {torch.__version__} intra-op threads {torch.get_num_threads()}; {libs}")
    print(f"{'dataset':16s} {'cases':>6s} {'classes':>7s} {'pairs':>6s} {'counts':>8s}")
    for s in specs:
        print(f"{s.name:16s} {s.cases:6d} {s.classes:7d} {sum(s.pairs):6d} {s.source:>8s}")
    print(f"total: {sum(s.cases for s in specs)} cases, {sum(sum(s.pairs) for s in specs)} pairs per model, "
          f"{args.replicates} replicates, {args.models} of {MODELS_IN_PAPER} models")

    wall = cpu = cmp_wall = cmp_cpu = 0.0
    rows = cmp_rows = 0
    digest = hashlib.sha256()
    per_set = []
    with tempfile.TemporaryDirectory() as tmp:
        for s in specs:
            data = make_set(s, seed=len(s.name))
            scored, set_wall = {}, 0.0
            for m in range(args.models):
                path = write_predictions(Path(tmp), s, data, m)
                w, c = time.perf_counter(), time.process_time()
                result = evaluate_one(path, s, data, args.replicates)
                dw, dc = time.perf_counter() - w, time.process_time() - c
                table = result.table
                wall, cpu, rows, set_wall = wall + dw, cpu + dc, rows + len(table), set_wall + dw
                digest.update(table.to_csv(index=False).encode())
                print(f"  {s.name:16s} model {m}: {dw:7.2f} s wall {dc:7.2f} s CPU ({len(table)} rows)")
                path.unlink()
                if args.compare:
                    scored[f"model{m}"] = result
            entry = {"dataset": s.name, "cases": s.cases, "classes": s.classes, "evaluate_wall_s": round(set_wall, 3)}
            if args.compare:
                w, c = time.perf_counter(), time.process_time()
                n_comp, n_rank = compare_set(s, scored)
                dw, dc = time.perf_counter() - w, time.process_time() - c
                cmp_wall, cmp_cpu, cmp_rows = cmp_wall + dw, cmp_cpu + dc, cmp_rows + n_comp
                entry.update(compare_wall_s=round(dw, 3), comparison_rows=n_comp, rank_rows=n_rank)
                print(f"  {s.name:16s} comparisons of {len(scored)} models: {dw:7.2f} s wall {dc:7.2f} s CPU "
                      f"({n_comp} comparison rows, {n_rank} rank rows)")
            per_set.append(entry)
    load_end = os.getloadavg()
    scale = MODELS_IN_PAPER / args.models
    print(f"load average (1/5/15 min) at start {load_start[0]:.2f}/{load_start[1]:.2f}/{load_start[2]:.2f}, "
          f"at end {load_end[0]:.2f}/{load_end[1]:.2f}/{load_end[2]:.2f}")
    print(f"measured, {args.models} model(s): {wall:.1f} s wall, {cpu:.1f} s CPU ({rows} table rows, "
          f"sha256 of the tables {digest.hexdigest()[:16]})")
    if args.models != MODELS_IN_PAPER:
        print(f"extrapolated to {MODELS_IN_PAPER} models (x{scale:.2f}): {wall * scale:.1f} s wall, {cpu * scale:.1f} s CPU")
    if args.compare:
        print(f"comparisons: {cmp_wall:.1f} s wall, {cmp_cpu:.1f} s CPU ({cmp_rows} rows) = "
              f"{100 * cmp_wall / wall:.1f} % of the evaluation's wall time, {100 * cmp_cpu / cpu:.1f} % of its CPU time "
              f"(measured in this run, {args.models} models)")
    if args.json:
        record = {"command": "python benchmarks/bench_evaluate.py " + " ".join(sys.argv[1:]),
                  "machine": {"platform": platform.platform(), "processor": platform.processor(), "cpus": os.cpu_count(),
                              "torch_threads": torch.get_num_threads(), "blas": libs},
                  "load_average_start": load_start, "load_average_end": load_end,
                  "models": args.models, "replicates": args.replicates, "cases": sum(s.cases for s in specs),
                  "evaluate": {"wall_s": round(wall, 3), "cpu_s": round(cpu, 3), "table_rows": rows,
                               "tables_sha256": digest.hexdigest()},
                  "per_dataset": per_set}
        if args.compare:
            record["compare"] = {"wall_s": round(cmp_wall, 3), "cpu_s": round(cmp_cpu, 3), "comparison_rows": cmp_rows,
                                 "wall_fraction_of_evaluate": round(cmp_wall / wall, 4),
                                 "cpu_fraction_of_evaluate": round(cmp_cpu / cpu, 4)}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(record, indent=1) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
