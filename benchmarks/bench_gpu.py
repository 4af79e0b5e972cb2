"""GPU benchmark of the whole XBench run on synthetic stand-ins of the seven datasets (issues 15 and 16).

Stand-ins (``generate``): the case counts of the paper's test sets and the image sizes and formats of
the releases — NIH and ChestX-Det10: 8-bit PNG 1024²; RSNA and SIIM: 8-bit DICOM 1024², JPEG Baseline
transfer syntax (compressed); VinDr-CXR: 16-bit DICOM (12 bits stored, window, 1 in 10 MONOCHROME1) of
2,048–3,072 px, uncompressed, 1 in 20 JPEG 2000 Lossless; COVID-19 Rural and CheXlocalize: JPEG
(2,000–2,828 px). Smooth radiograph-like content plus noise; random boxes for ~30 % positives of each of
the real class lists (``data_manifests/``). Written in parallel (``--gen-workers``) and timed separately.

Phases (``--phases``, in this order; results go to ``<out>/bench_gpu.json`` after every phase):

* ``paper``   — the paper setting on ``--paper-fraction`` of every dataset: batch 8, fp32, decode per
  model (``decode_once: false``), 4 loader workers, no cache.
* ``default`` — XBench's default on everything: decode once (``--workers`` processes, a cold disk
  cache), batch ``--batch-size``, fp32, the evaluation (``--bootstrap`` replicates) included as ``xbench run`` does it
  (each dataset evaluated while the next infers): ``whole_seconds`` end to end, ``infer_seconds`` the run log's
  inference wall, ``eval_seconds`` the evaluation left after it.
  Max deviation of scores / maps from ``paper`` on the shared cases.
* ``multi``   — ``torchrun --nproc_per_node G`` for each G of ``--gpus`` (NCCL; NVLink multicast off) of
  the default config with its own cold cache and ``--workers`` decode processes per rank, run as ``xbench run`` under
  torchrun (rank 0 evaluates after the barrier; the ranks import the XBench this process imported, not one in the
  working folder: ``xbench.core.workers.same_imports_env``); each rank's timings (start-up from the launch included), and
  identity of every stored array and of the metric tables with ``default``. The speed-up is against ``multi_1`` when
  ``--gpus`` includes 1 (one GPU launched the same way: equal start-up), else against ``default``'s whole run, which
  runs inside the bench process and so does not pay the imports.
* ``cached``  — the default run again into a new store from the warm decode cache, evaluation included.
* ``profile`` — CPU milliseconds per image of each decode step (file read, each model's preprocess).
* ``options`` — speed options (tf32, bf16, fp16, channels_last) against fp32 on ``--paper-fraction``:
  images/s, max score / map deviation, metric tables (bootstrap off) equal to 2 decimals or not.

Weights (``--weights``): ``files`` (default) writes each model's seeded random-init network once, in the layout of its
official files, under ``<root>/weights`` (``benchmarks/standin_weights.py``), and the runs load them as a real run
does; ``random`` builds the seeded networks in every process instead (rounds 1-6 of issue 22). Models without files
(priors, reference models) run as configured. ``--tiny`` is the CPU version run by the tests.
"""
from __future__ import annotations

import argparse
import io
import json
import math
import os
import shutil
import subprocess
import sys
import time
import traceback
import warnings
import zlib
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

DATASETS: dict[str, dict[str, Any]] = {  # name -> stand-in spec (cases = the paper's test set)
    "rsna_pneumonia": {"cases": 5337, "format": "dicom-jpeg", "sizes": [(1024, 1024)]},
    "siim_acr": {"cases": 2409, "format": "dicom-jpeg", "sizes": [(1024, 1024)]},
    "covid_rural": {"cases": 44, "format": "jpeg", "sizes": [(2000, 2000), (2500, 2048), (2828, 2320)]},
    "chestx_det10": {"cases": 542, "format": "png", "sizes": [(1024, 1024)]},
    "chexlocalize": {"cases": 668, "format": "jpeg", "sizes": [(2828, 2320), (2320, 2828), (2500, 2048)]},
    "nih_bbox": {"cases": 880, "format": "png", "sizes": [(1024, 1024)]},
    "vindr_cxr": {"cases": 3000, "format": "dicom16", "sizes": [(3072, 3072), (2836, 2336), (2880, 2304), (2500, 2048)]},
}
MODELS = ["clip", "medklip", "kad", "mavl", "carzero", "devide", "chexzero", "gloria", "center_prior"]  # chexzero,
# gloria: beyond the paper
RANDOM_INIT = {"clip", "medklip", "kad", "mavl", "carzero", "devide", "biomedclip", "chexzero", "gloria"}
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


# -- stand-in data -------------------------------------------------------------------------------
def _image(seed: int, h: int, w: int, levels: int) -> np.ndarray:
    """Radiograph-like integer image: a smooth random field, two darker 'lungs', mild noise."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    coarse = rng.random((9, 9)).astype(np.float32)
    field = np.asarray(Image.fromarray(coarse, mode="F").resize((w, h), Image.BICUBIC))
    yy, xx = np.ogrid[:h, :w]
    lungs = sum(np.exp(-(((yy - 0.45 * h) / (0.25 * h)) ** 2 + ((xx - cx * w) / (0.15 * w)) ** 2)) for cx in (0.3, 0.7))
    img = 0.55 + 0.25 * (field - 0.5) - 0.3 * lungs + rng.normal(0, 0.01, (h, w)).astype(np.float32)
    return np.clip(img * (levels - 1), 0, levels - 1).astype(np.uint16 if levels > 256 else np.uint8)


def _dicom(path: Path, pixels: np.ndarray, syntax: str, *, bits_stored: int, photometric: str = "MONOCHROME2",
           encoded: bytes | None = None) -> None:
    import pydicom.uid as uid
    from pydicom.dataset import Dataset, FileMetaDataset
    from pydicom.encaps import encapsulate

    meta = FileMetaDataset()
    meta.TransferSyntaxUID = getattr(uid, syntax)
    meta.MediaStorageSOPClassUID = uid.SecondaryCaptureImageStorage
    meta.MediaStorageSOPInstanceUID = uid.generate_uid()
    ds = Dataset()
    ds.file_meta = meta
    ds.SOPClassUID, ds.SOPInstanceUID = meta.MediaStorageSOPClassUID, meta.MediaStorageSOPInstanceUID
    ds.Modality = "DX"
    ds.Rows, ds.Columns = pixels.shape
    ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, photometric
    ds.BitsAllocated = 8 * pixels.dtype.itemsize
    ds.BitsStored, ds.HighBit, ds.PixelRepresentation = bits_stored, bits_stored - 1, 0
    if bits_stored > 8:
        ds.WindowCenter, ds.WindowWidth = 2 ** (bits_stored - 1), 2 ** bits_stored - 512
    if encoded is None:
        ds.PixelData = pixels.tobytes()
    else:
        ds.PixelData = encapsulate([encoded])
    ds["PixelData"].VR = "OB" if encoded is not None or ds.BitsAllocated == 8 else "OW"
    ds.save_as(path, enforce_file_format=True)


def _write_case(task: tuple[str, int, str, int, int, Path, int]) -> dict[str, Any]:
    name, i, fmt, h, w, folder, n_classes = task
    from PIL import Image

    seed = zlib.crc32(f"{name}/{i}".encode())
    if fmt == "png":
        path = folder / f"{i:05d}.png"
        Image.fromarray(_image(seed, h, w, 256)).save(path)
    elif fmt == "jpeg":
        path = folder / f"{i:05d}.jpg"
        Image.fromarray(_image(seed, h, w, 256)).save(path, quality=95)
    elif fmt == "dicom-jpeg":
        path = folder / f"{i:05d}.dcm"
        buf = io.BytesIO()
        Image.fromarray(_image(seed, h, w, 256)).save(buf, "JPEG", quality=95)
        _dicom(path, np.zeros((h, w), np.uint8), "JPEGBaseline8Bit", bits_stored=8, encoded=buf.getvalue())
    else:  # dicom16
        path = folder / f"{i:05d}.dicom"
        px = _image(seed, h, w, 4096)
        photometric = "MONOCHROME1" if i % 10 == 9 else "MONOCHROME2"
        if i % 20 == 7:
            buf = io.BytesIO()
            Image.frombuffer("I;16", (w, h), px.tobytes(), "raw", "I;16", 0, 1).save(
                buf, "JPEG2000", irreversible=False, no_jp2=True)
            _dicom(path, px, "JPEG2000Lossless", bits_stored=12, photometric=photometric, encoded=buf.getvalue())
        else:
            _dicom(path, px, "ExplicitVRLittleEndian", bits_stored=12, photometric=photometric)
    labels, boxes = labels_and_boxes(name, i, h, w, n_classes)
    return {"i": i, "image": str(path.relative_to(folder.parent)), "height": h, "width": w,
            "labels": labels, "boxes": boxes, "bytes": path.stat().st_size}


def labels_and_boxes(name: str, i: int, h: int, w: int, n_classes: int) -> tuple[list[int], dict[int, list[list[float]]]]:
    """Case ``i`` of stand-in ``name``: its labels (each class positive with probability 0.3) and one box per
    positive class, in pixels of an ``h`` × ``w`` image; drawn from the case's own seed, whatever its image."""
    rng = np.random.default_rng(zlib.crc32(f"{name}/{i}".encode()) + 1)
    labels = (rng.random(n_classes) < 0.3).astype(int)
    boxes = {}
    for c in np.flatnonzero(labels):
        bw, bh = rng.uniform(0.05, 0.3) * w, rng.uniform(0.05, 0.3) * h
        x0, y0 = rng.uniform(0, w - bw), rng.uniform(0, h - bh)
        boxes[int(c)] = [[round(x0, 1), round(y0, 1), round(x0 + bw, 1), round(y0 + bh, 1)]]
    return labels.tolist(), boxes


def generate(root: Path, *, scale: float = 1.0, size_div: int = 1, workers: int = 8,
             datasets: dict[str, dict[str, Any]] = DATASETS) -> dict[str, Any]:
    """Write every stand-in under ``root/<name>/`` plus ``root/manifests/standin_<name>.yaml``; returns counts."""
    import yaml

    from xbench.spec.registry import dataset_manifest

    started = time.perf_counter()
    (root / "manifests").mkdir(parents=True, exist_ok=True)
    tasks, classes = [], {}
    for name, spec in datasets.items():
        classes[name] = [{k: c[k] for k in ("name", "finding", "prompt", "display", "localized")}
                         for c in dataset_manifest(name)["classes"]]
        folder = root / name / "images"
        folder.mkdir(parents=True, exist_ok=True)
        n = max(1, math.ceil(spec["cases"] * scale))
        for i in range(n):
            h, w = spec["sizes"][i % len(spec["sizes"])]
            tasks.append((name, i, spec["format"], h // size_div, w // size_div, folder, len(classes[name])))
    rows: dict[str, list[dict[str, Any]]] = {n: [] for n in datasets}
    with ProcessPoolExecutor(workers) as pool:
        for task, row in zip(tasks, pool.map(_write_case, tasks, chunksize=4)):
            rows[task[0]].append(row)
    total = 0
    for name, found in rows.items():
        names = [c["name"] for c in classes[name]]
        lines = ["case_id,image,height,width,boxes," + ",".join(f"label:{c}" for c in names)]
        for r in sorted(found, key=lambda r: r["i"]):
            boxes = json.dumps({names[c]: b for c, b in r["boxes"].items()}).replace('"', '""')
            lines.append(f"{name}-{r['i']:05d},{r['image']},{r['height']},{r['width']},\"{boxes}\","
                         + ",".join(map(str, r["labels"])))
            total += r["bytes"]
        (root / name / "cases.csv").write_text("\n".join(lines) + "\n")
        manifest = {"class": "xbench.datasets.standin:CaseTable", "title": f"stand-in of {name}",
                    "homepage": None, "citation": "XBench benchmarks/bench_gpu.py stand-in", "license": "generated",
                    "files": {"cases": {"path": "cases.csv"}}, "default_split": "test",
                    "splits": {"test": {"expected": {"cases": len(found)}}}, "classes": classes[name]}
        (root / "manifests" / f"standin_{name}.yaml").write_text(yaml.safe_dump(manifest, sort_keys=False))
    return {"seconds": round(time.perf_counter() - started, 2), "cases": len(tasks), "bytes": total,
            "workers": workers, "per_dataset": {n: len(r) for n, r in rows.items()}}


def _standin_weights() -> Any:
    """``benchmarks/standin_weights.py`` (this folder is not a package; the bench also runs as a loaded file)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("standin_weights", Path(__file__).with_name("standin_weights.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# -- runs ----------------------------------------------------------------------------------------
def _model_entry(name: str, weights: dict[str, Path] | None) -> dict[str, Any]:
    """A config's model entry: from its stand-in weight folder when ``weights`` has one (as a real run loads), else
    seeded random weights built in the process (``random_init``), else the model as configured (priors)."""
    if weights and name in weights:
        return {"name": name, "weights": str(weights[name])}
    return {"name": name, "params": {"random_init": True}} if name in RANDOM_INIT else {"name": name}


def run_config(root: Path, out: Path, *, fraction: float = 1.0, models: list[str],
               weights: dict[str, Path] | None = None, **changes: Any) -> dict[str, Any]:
    datasets = []
    for name in DATASETS:
        table = root / name / "cases.csv"
        n = sum(1 for _ in table.open()) - 1
        datasets.append({"name": f"standin_{name}", "root": str(root / name), "cases": max(1, math.ceil(n * fraction))})
    return {"output_dir": str(out), "datasets": datasets,
            "models": [_model_entry(m, weights) for m in models],
            "grid": [224, 224], "chunk_size": 256, "bootstrap": {"replicates": 0, "seed": 0}, **changes}


def _build_seconds(log: list[dict[str, Any]]) -> float:
    """Seconds spent building models (each model's cumulative ``build_seconds``, last entry per model, summed)."""
    last = {e["model"]: e.get("build_seconds", 0.0) for e in log if "model" in e}
    return round(sum(last.values()), 2)


def rank_timings(out: Path, launched_unix: float | None = None) -> list[dict[str, float]]:
    """Per rank of a sharded run (``run_log.shard<i>of<n>.json``; a one-process run's ``run_log.json``): its wall to
    the end of its last dataset, its model builds, and its models' own seconds (decode waits excluded), so an imbalance
    between ranks can be seen; with ``launched_unix`` (when the launcher started) also its start-up: the seconds from
    the launch to the start of its run (process start, imports, distributed set-up)."""
    found = []
    logs = sorted(out.glob("run_log.shard*of*.json")) or sorted(out.glob("run_log.json"))
    for path in logs:
        log = json.loads(path.read_text())
        started = [e["run_started_unix"] for e in log if "run_started_unix" in e]
        startup = ({"startup_seconds": round(min(started) - launched_unix, 2)}
                   if launched_unix is not None and started else {})
        found.append({"log": path.name, **startup,
                      "wall_seconds": round(max((e.get("since_start_seconds", 0.0) for e in log), default=0.0), 2),
                      "build_seconds": _build_seconds(log),
                      "model_seconds": round(sum(e.get("seconds", 0.0) - e.get("decode_seconds", 0.0) for e in log), 2),
                      "decode_wait_seconds": round(sum(e.get("decode_seconds", 0.0) for e in log), 2),
                      "cases": int(sum(e.get("cases_inferred", 0) for e in log))})
    return found


def _decode_profile(log: list[dict[str, Any]]) -> dict[str, float]:
    """Decode-stage seconds summed over datasets (each dataset's last, cumulative, run-log entry)."""
    last = {e["dataset"]: e["decode_profile"] for e in log if "decode_profile" in e}
    keys = {k for p in last.values() for k in p}
    return {k: round(sum(p.get(k, 0.0) for p in last.values()), 2) for k in sorted(keys)}


def timed_run(raw: dict[str, Any], *, evaluate: bool) -> dict[str, Any]:
    """``xbench.run``; with ``evaluate`` the whole run as a user runs it (each dataset evaluated while the next one
    infers), timed end to end, else inference alone. Inference wall = the run log's last ``since_start_seconds``
    (from the start of ``infer_run``, preflight included); per-model rates from the run log."""
    from xbench.spec.config import RunConfig
    from xbench.workflows.run import run

    cfg = RunConfig.from_dict(raw)
    shutil.rmtree(cfg.output_dir, ignore_errors=True)
    started = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run(cfg, progress=False, evaluate=evaluate)
    whole_s = time.perf_counter() - started
    log = json.loads((Path(cfg.output_dir) / "run_log.json").read_text())
    infer_s = max(e.get("since_start_seconds", 0.0) for e in log) if evaluate else whole_s
    eval_s = round(whole_s - infer_s, 2) if evaluate else None  # the evaluation left after inference
    log = json.loads((Path(cfg.output_dir) / "run_log.json").read_text())
    per_model: dict[str, dict[str, float]] = {}
    decode = 0.0
    for e in log:
        m = per_model.setdefault(e["model"], {"cases": 0, "seconds": 0.0, "gpu_peak_gb": 0.0})
        m["cases"] += e["cases_inferred"]
        m["seconds"] += e.get("seconds", 0.0) - e.get("decode_seconds", 0.0)
        m["gpu_peak_gb"] = max(m["gpu_peak_gb"], e.get("gpu_peak_bytes", 0) / 2**30)
        decode += e.get("decode_seconds", 0.0)
    for m in per_model.values():
        m["img_s"] = round(m["cases"] / max(m["seconds"], 1e-9), 1)
        m["seconds"] = round(m["seconds"], 2)
        m["gpu_peak_gb"] = round(m["gpu_peak_gb"], 2)
    passes = sum(m["cases"] for m in per_model.values())
    model_seconds = sum(m["seconds"] for m in per_model.values())
    return {"infer_seconds": round(infer_s, 2), "eval_seconds": eval_s, "whole_seconds": round(whole_s, 2),
            "decode_seconds": round(decode, 2), "image_model_passes": passes,
            "passes_per_s": round(passes / infer_s, 1), "per_model": per_model,
            "gpu_alone_passes_per_s": round(passes / max(model_seconds, 1e-9), 1),  # model time only, decoding out
            "decode_profile": _decode_profile(log),
            "build_seconds": _build_seconds(log),
            # models whose networks were built while their first dataset decoded (input twins)
            "built_while_decoding": sorted({e["model"] for e in log if e.get("built_while_decoding")}),
            # when each network was built, seconds since the run started (the twinned ones in the background, while
            # the models built before them already ran)
            "built_since_start": {e["model"]: e["built_since_start_seconds"] for e in log
                                  if e.get("built_since_start_seconds") is not None},
            "preprocessed_on": sorted({json.dumps(e["preprocessed_on"]) for e in log if "preprocessed_on" in e}),
            "store_mb": round(sum(f.stat().st_size for f in (Path(cfg.output_dir) / "store").rglob("*.npz")) / 2**20, 1),
            "eval_timeline": eval_timeline(Path(cfg.output_dir), min((e["run_started_unix"] for e in log
                                                                       if "run_started_unix" in e), default=None))
            if evaluate else None}


def eval_timeline(out: Path, since_unix: float | None) -> dict[str, Any] | None:
    """The evaluation's steps (``evaluation_timing.json``), in seconds since ``since_unix`` (a run's
    ``run_started_unix``, or when a multi-GPU launcher started), with the evaluation's worker count; None without the
    file."""
    path = out / "evaluation_timing.json"
    if not path.is_file() or since_unix is None:
        return None
    doc = json.loads(path.read_text())
    shift = doc["created_unix"] - since_unix
    return {"workers": doc["workers"], "created": round(shift, 2),
            "events": {k: {e: round(v + shift, 2) for e, v in ev.items()} for k, ev in doc["events"].items()}}


def stores(out: Path) -> dict[tuple[str, str], dict[str, np.ndarray]]:
    """(dataset, model) → {case_id: (scores, maps)} of a run's store."""
    from xbench.store.results import ResultStore

    found = {}
    root = ResultStore(out)
    for meta in sorted((out / "store").glob("*/*/meta.json")):
        d, m = meta.parent.parent.name, meta.parent.name
        p = root.read(d, m)
        found[(d, m)] = {"ids": p.case_ids, "scores": p.scores, "maps": p.maps.astype(np.float32)}
    return found


def deviation(a: Path, b: Path) -> dict[str, Any]:
    """Max |score| and |map| difference over the cases both stores hold, and the relative map error."""
    sa, sb = stores(a), stores(b)
    worst = {"scores": 0.0, "maps": 0.0, "maps_rel": 0.0, "cases": 0}
    for key in sa.keys() & sb.keys():
        ia = {c: i for i, c in enumerate(sa[key]["ids"])}
        rows = [(ia[c], j) for j, c in enumerate(sb[key]["ids"]) if c in ia]
        if not rows:
            continue
        x, y = zip(*rows)
        x, y = list(x), list(y)
        worst["cases"] += len(rows)
        ds, dm = np.abs(sa[key]["scores"][x] - sb[key]["scores"][y]), np.abs(sa[key]["maps"][x] - sb[key]["maps"][y])
        worst["scores"] = max(worst["scores"], float(ds.max()))
        worst["maps"] = max(worst["maps"], float(dm.max()))
        scale = np.abs(sa[key]["maps"][x]).max(axis=(-1, -2), keepdims=True)
        worst["maps_rel"] = max(worst["maps_rel"], float((dm / np.maximum(scale, 1e-12)).max()))
    return {k: (v if k == "cases" else float(f"{v:.3g}")) for k, v in worst.items()}


def tables_equal(a: Path, b: Path, decimals: int = 2) -> dict[str, Any]:
    import pandas as pd

    ta, tb = (pd.read_parquet(p / "tables" / "metrics.parquet") for p in (a, b))
    keys = [c for c in ta.columns if c not in ("value", "ci_low", "ci_high")]
    both = ta.merge(tb, on=keys, suffixes=("_a", "_b"))
    diff = (both["value_a"] - both["value_b"]).abs()
    same = (both["value_a"].round(decimals) == both["value_b"].round(decimals)) | (both["value_a"].isna() & both["value_b"].isna())
    return {"rows": len(both), "max_abs_diff": float(diff.max()) if len(diff) else 0.0,
            f"equal_to_{decimals}_decimals": bool(same.all()), "rows_differing": int((~same).sum())}


def identical_stores(a: Path, b: Path) -> dict[str, Any]:
    """Every array of every chunk equal (np.array_equal), chunk by chunk, and the same chunk files."""
    from xbench.store.results import read_chunk_file

    fa = {p.relative_to(a) for p in (a / "store").rglob("chunk-*.npz")}
    fb = {p.relative_to(b) for p in (b / "store").rglob("chunk-*.npz")}
    differing = []
    for rel in sorted(fa & fb):
        x, y = read_chunk_file(a / rel), read_chunk_file(b / rel)  # either chunk layout
        if set(x) != set(y) or not all(np.array_equal(x[k], y[k]) for k in x):
            diff = {k: float(np.abs(x[k].astype(np.float64) - y[k].astype(np.float64)).max())
                    for k in ("scores", "maps") if k in x and k in y}
            differing.append(f"{rel} {diff}")
    return {"chunks": len(fa), "same_chunk_files": fa == fb, "chunks_differing": differing[:10],
            "identical": fa == fb and not differing}


def profile_decode(root: Path, models: list[str], per_dataset: int = 3) -> dict[str, dict[str, float]]:
    """CPU milliseconds per image of the decode stage, by step (one process): reading the file, then each
    model's ``preprocess`` on the decoded image — where the decode-once stage spends its time."""
    import warnings as _w

    import xbench
    from xbench.datasets.images import read_image

    with _w.catch_warnings():
        _w.simplefilter("ignore")
        adapters = {m: xbench.create_model(m, **({"random_init": True} if m in RANDOM_INIT else {})) for m in models}
    out: dict[str, dict[str, float]] = {}
    for name in DATASETS:
        rows = (root / name / "cases.csv").read_text().splitlines()[1: per_dataset + 1]
        steps: dict[str, float] = {}
        for line in rows:
            path = root / name / line.split(",")[1]
            t = time.perf_counter()
            image = read_image(path)
            steps["read"] = steps.get("read", 0.0) + time.perf_counter() - t
            for m, a in adapters.items():
                t = time.perf_counter()
                a.preprocess(image)
                steps[m] = steps.get(m, 0.0) + time.perf_counter() - t
        out[name] = {k: round(1000 * v / len(rows), 1) for k, v in steps.items()}
        out[name]["size"] = list(image.shape)
    return out


# -- main ----------------------------------------------------------------------------------------
def environment() -> dict[str, Any]:
    import torch

    import xbench

    env = {"python": sys.version.split()[0], "torch": torch.__version__, "numpy": np.__version__,
           "cpus": os.cpu_count(), "cuda": torch.cuda.is_available(),
           # whether imported sources are compiled again by every process (PYTHONDONTWRITEBYTECODE, no __pycache__)
           "bytecode": {"dont_write": bool(sys.flags.dont_write_bytecode), "pycache_prefix": sys.pycache_prefix},
           "xbench": str(Path(xbench.__file__).resolve().parent)}  # which tree the phases ran
    try:
        import pydicom
        import PIL

        env.update(pydicom=pydicom.__version__, pillow=PIL.__version__)
    except ImportError:
        pass
    if torch.cuda.is_available():
        env.update(gpus=[torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
                   cuda_runtime=torch.version.cuda, cudnn=torch.backends.cudnn.version())
    env.update(cpu_info())
    return env


def cpu_info(path: str = "/proc/cpuinfo") -> dict[str, Any]:
    """The host CPU's model name and whether it has the SHA extensions (``sha_ni``: the decode cache's SHA-256
    content key runs on them), from ``/proc/cpuinfo``; empty where that file is absent (not Linux)."""
    try:
        text = Path(path).read_text()
    except OSError:
        return {}
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    return {"cpu_model": fields.get("model name"), "sha_ni": "sha_ni" in fields.get("flags", "").split()}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--root", type=Path, required=True, help="folder of the stand-in data (generated if absent)")
    p.add_argument("--out", type=Path, required=True, help="folder of stores, caches and bench_gpu.json")
    p.add_argument("--phases", default="paper,default,cpu_preprocess,multi,cached,profile,options")
    p.add_argument("--scale", type=float, default=1.0, help="fraction of every dataset's cases to generate")
    p.add_argument("--size-div", type=int, default=1, help="divide every image side by this (tests)")
    p.add_argument("--paper-fraction", type=float, default=0.1, help="fraction run in the paper setting and options")
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="decode processes (default: all cores)")
    p.add_argument("--gen-workers", type=int, default=os.cpu_count() or 1)
    p.add_argument("--bootstrap", type=int, default=1000, help="replicates of the timed evaluation")
    p.add_argument("--device", default="cuda")
    p.add_argument("--gpus", default="2", help="comma-separated GPU counts of the multi phase, e.g. 1,2,4 (1: the baseline)")
    p.add_argument("--decode-ahead", default="auto", choices=["auto", "true", "false"],
                   help="the run option decode_ahead of the default, cached and multi phases")
    p.add_argument("--weights", default="files", choices=["files", "random"],
                   help="files: the networks load stand-in weight files, written once under <root>/weights (what a real "
                        "run does); random: seeded random weights built in every process (rounds 1-6)")
    p.add_argument("--budget", type=float, default=1e9, help="seconds: phases that would start after this are skipped")
    p.add_argument("--tiny", action="store_true", help="CPU smoke version: 0.2 %% of cases, image sides / 4")
    return p


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = build_parser().parse_args(argv)
    if args.tiny:
        args.scale, args.size_div, args.paper_fraction, args.bootstrap = min(args.scale, 0.002), 4, 1.0, 5
        args.device, args.batch_size = "cpu", 8  # the paper setting's batch: stores comparable bit for bit
    t0 = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    models = args.models.split(",")
    result: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}, "environment": environment()}
    report = args.out / "bench_gpu.json"

    def save() -> None:
        report.write_text(json.dumps(result, indent=1, default=str))

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t0:7.1f}s] {msg}", flush=True)

    if not (args.root / "manifests").is_dir():
        log(f"generating stand-ins under {args.root} ...")
        result["generate"] = generate(args.root, scale=args.scale, size_div=args.size_div, workers=args.gen_workers)
        log(f"generated: {result['generate']}")
        save()
    os.environ["XBENCH_MANIFESTS"] = str(args.root / "manifests")
    import xbench.spec.registry as registry

    registry.MANIFEST_DIRS[:] = [args.root / "manifests"]
    weights = None
    if args.weights == "files" and any(m in RANDOM_INIT for m in models):
        started = time.perf_counter()
        weights = _standin_weights().write_weight_folders(models, args.root / "weights")
        result["weights"] = {"seconds": round(time.perf_counter() - started, 2), "models": sorted(weights),
                             "folder": str(args.root / "weights")}
        log(f"stand-in weight files: {result['weights']}")
    common = {"device": args.device, "precision": "fp32", "models": models, "weights": weights}
    paper = run_config(args.root, args.out / "paper", fraction=args.paper_fraction, batch_size=8, num_workers=4,
                       decode_once=False, **common)
    default = run_config(args.root, args.out / "default", batch_size=args.batch_size, num_workers=args.workers,
                         decode_once=True, cache_dir=str(args.out / "cache"),
                         decode_ahead={"auto": "auto", "true": True, "false": False}[args.decode_ahead], **common)
    default["bootstrap"] = {"replicates": args.bootstrap, "seed": 0}
    phases = args.phases.split(",")

    def due(name: str) -> bool:
        if name not in phases:
            return False
        if time.perf_counter() - t0 > args.budget:
            result.setdefault("skipped_phases", []).append(name)
            log(f"skipping {name}: budget of {args.budget:g} s spent")
            return False
        log(f"phase {name}")
        return True

    if due("paper"):
        try:
            result["paper"] = timed_run(paper, evaluate=False)
            log(json.dumps(result["paper"]))
            save()
        except Exception as exc:  # report and go on with the next phase
            result.setdefault("errors", {})["paper"] = f"{type(exc).__name__}: {exc}"
            log(f"phase paper failed: {traceback.format_exc()}")
            save()
    if due("default"):
        try:
            shutil.rmtree(args.out / "cache", ignore_errors=True)
            result["default"] = timed_run(default, evaluate=True)
            if "paper" in result:
                result["default"]["speedup_vs_paper_passes_per_s"] = round(
                    result["default"]["passes_per_s"] / result["paper"]["passes_per_s"], 2)
                result["default"]["deviation_from_paper_setting"] = deviation(args.out / "paper", args.out / "default")
            log(json.dumps(result["default"]))
            save()
        except Exception as exc:  # report and go on with the next phase
            result.setdefault("errors", {})["default"] = f"{type(exc).__name__}: {exc}"
            log(f"phase default failed: {traceback.format_exc()}")
            save()
    if due("cpu_preprocess"):  # the default on the CPU preprocessing path: same cases, cold cache of its own
        try:
            raw = {**default, "output_dir": str(args.out / "cpu_preprocess"), "preprocess_device": "cpu",
                   "cache_dir": str(args.out / "cache_cpu_preprocess")}
            shutil.rmtree(args.out / "cache_cpu_preprocess", ignore_errors=True)
            result["cpu_preprocess"] = timed_run(raw, evaluate=False)
            if "default" in result:
                result["cpu_preprocess"]["identity_vs_default"] = identical_stores(args.out / "default",
                                                                                   args.out / "cpu_preprocess")
            log(json.dumps(result["cpu_preprocess"]))
            save()
        except Exception as exc:  # report and go on with the next phase
            result.setdefault("errors", {})["cpu_preprocess"] = f"{type(exc).__name__}: {exc}"
            log(f"phase cpu_preprocess failed: {traceback.format_exc()}")
            save()
    if due("multi") and args.device == "cuda":
        import torch
        import yaml

        from xbench.core.workers import same_imports_env

        counts = sorted({int(g) for g in str(args.gpus).split(",") if int(g) <= torch.cuda.device_count()})
        for gpus in counts:  # 1 first when asked: the baseline launched the same way (its own imports counted too)
            if time.perf_counter() - t0 > args.budget:
                result.setdefault("skipped_phases", []).append(f"multi_{gpus}")
                break
            try:
                tag = f"multi_{gpus}"
                raw = {**default, "output_dir": str(args.out / tag), "cache_dir": str(args.out / f"cache_{tag}"),
                       "num_workers": args.workers}  # --workers decode processes per rank (per GPU)
                shutil.rmtree(args.out / tag, ignore_errors=True)
                shutil.rmtree(args.out / f"cache_{tag}", ignore_errors=True)
                config = args.out / f"{tag}.yaml"
                config.write_text(yaml.safe_dump(raw))
                env = {**os.environ, **MULTICAST_OFF, "XBENCH_MANIFESTS": str(args.root / "manifests"),
                       "PYTHONWARNINGS": "ignore", **same_imports_env()}  # the ranks import this process's XBench
                started, launched = time.perf_counter(), time.time()  # the user's command: ranks infer, rank 0 evaluates
                proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                                       f"--nproc_per_node={gpus}", "-m", "xbench.cli", "run", "--config", str(config),
                                       "--quiet"], env=env, capture_output=True, text=True)
                wall = time.perf_counter() - started
                ranks = rank_timings(args.out / tag, launched)
                infer_wall = max((r["wall_seconds"] for r in ranks), default=float("nan"))  # slowest rank
                ends = [r["startup_seconds"] + r["wall_seconds"] for r in ranks if "startup_seconds" in r]
                multi: dict[str, Any] = {"gpus": gpus, "returncode": proc.returncode, "wall_seconds": round(wall, 2),
                                         "infer_wall_seconds": round(infer_wall, 2), "ranks": ranks,
                                         # from the last rank's end of inference to the launcher's exit: evaluation
                                         # after the barrier, tables, process exits
                                         "after_inference_seconds": round(wall - max(ends), 2) if ends else None,
                                         "stderr_tail": proc.stderr[-1500:] if proc.returncode else "",
                                         # rank 0's evaluation, in seconds since the launch
                                         "eval_timeline": eval_timeline(args.out / tag, launched)}
                # the baseline: one GPU launched the same way when it ran (equal start-up), else the in-process default
                base = result.get("multi_1") if gpus > 1 and result.get("multi_1", {}).get("returncode") == 0 else None
                if proc.returncode == 0 and (base is not None or "default" in result):
                    base_wall = base["wall_seconds"] if base else result["default"]["whole_seconds"]
                    base_infer = base["infer_wall_seconds"] if base else result["default"]["infer_seconds"]
                    multi["baseline"] = "multi_1" if base else "default (in the bench process: its imports not counted)"
                    multi["one_gpu_wall_seconds"] = base_wall
                    multi["speedup"] = round(base_wall / wall, 2)
                    multi["infer_speedup"] = round(base_infer / infer_wall, 2)
                if proc.returncode == 0 and "default" in result:
                    multi["identity"] = identical_stores(args.out / "default", args.out / tag)
                    multi["tables"] = tables_equal(args.out / "default", args.out / tag, decimals=12)
                result[tag] = multi
                log(json.dumps(multi))
                save()
            except Exception as exc:  # report and go on
                result.setdefault("errors", {})[f"multi_{gpus}"] = f"{type(exc).__name__}: {exc}"
                log(f"multi {gpus} failed: {traceback.format_exc()}")
                save()
    if due("cached"):
        try:
            raw = {**default, "output_dir": str(args.out / "cached")}
            result["cached"] = timed_run(raw, evaluate=True)
            log(json.dumps(result["cached"]))
            save()
        except Exception as exc:  # report and go on with the next phase
            result.setdefault("errors", {})["cached"] = f"{type(exc).__name__}: {exc}"
            log(f"phase cached failed: {traceback.format_exc()}")
            save()
    if due("profile"):
        try:
            result["profile"] = profile_decode(args.root, models, per_dataset=3)
            log(json.dumps(result["profile"]))
            save()
        except Exception as exc:
            result.setdefault("errors", {})["profile"] = f"{type(exc).__name__}: {exc}"
            log(f"phase profile failed: {traceback.format_exc()}")
    if due("options"):
        try:
            opts: dict[str, Any] = {}
            base = None
            for name, change in [("fp32", {}), ("fp32_repeat", {}), ("bf16", {"precision": "bf16"}),
                                 ("channels_last", {"channels_last": True}), ("fp16", {"precision": "fp16"}),
                                 ("tf32", {"precision": "tf32"})]:
                if time.perf_counter() - t0 > args.budget:
                    break
                raw = run_config(args.root, args.out / f"opt_{name}", fraction=args.paper_fraction, batch_size=args.batch_size,
                                 num_workers=args.workers, cache_dir=str(args.out / "cache"), **{**common, **change})
                try:
                    opts[name] = timed_run(raw, evaluate=True)
                except Exception as exc:  # an option unsupported on this device is reported, not fatal
                    opts[name] = {"error": f"{type(exc).__name__}: {exc}"}
                    continue
                if name == "fp32":
                    base = args.out / "opt_fp32"
                elif base is not None:
                    opts[name]["deviation_from_fp32"] = deviation(base, args.out / f"opt_{name}")
                    opts[name]["tables_vs_fp32"] = tables_equal(base, args.out / f"opt_{name}")
                log(f"option {name}: {json.dumps(opts[name])}")
            result["options"] = opts
            save()
        except Exception as exc:  # report and go on with the next phase
            result.setdefault("errors", {})["options"] = f"{type(exc).__name__}: {exc}"
            log(f"phase options failed: {traceback.format_exc()}")
            save()
    result["total_seconds"] = round(time.perf_counter() - t0, 1)
    save()
    print(summary(result), flush=True)
    return result


def summary(r: dict[str, Any]) -> str:
    lines = ["", "| phase | cases×models | infer s | decode s | eval s | passes/s | store MB |", "|---|---|---|---|---|---|---|"]
    for name in ("paper", "default", "cpu_preprocess", "cached"):
        if name in r:
            x = r[name]
            lines.append(f"| {name} | {x['image_model_passes']} | {x['infer_seconds']} | {x['decode_seconds']} | "
                         f"{x['eval_seconds']} | {x['passes_per_s']} | {x['store_mb']} |")
    for name in ("paper", "default"):
        if name in r:
            lines.append(f"{name} per model img/s: " + ", ".join(f"{m} {v['img_s']} ({v['gpu_peak_gb']} GB)"
                                                              for m, v in r[name]["per_model"].items()))
    if "default" in r and "deviation_from_paper_setting" in r["default"]:
        lines.append(f"deviation default vs paper: {r['default']['deviation_from_paper_setting']}")
    for name, x in r.get("options", {}).items():
        lines.append(f"option {name}: passes/s {x.get('passes_per_s')} dev {x.get('deviation_from_fp32')} "
                     f"tables {x.get('tables_vs_fp32')} {x.get('error', '')}")
    for key in sorted(k for k in r if k.startswith("multi_")):
        lines.append(f"{key}: {r[key]}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
