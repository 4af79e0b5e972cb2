"""Issue 22 round 9: one process's CPU cost of reading a stand-in and preparing its upload, per format.

Run from the repository root: PYTHONPATH=$PWD python docs/perf/round17_worker_costs.py (writes a few stand-ins
with bench_gpu's own generator into /tmp/pd/files; best of 3 per file).
"""
import sys, time, numpy as np
from pathlib import Path
sys.path.insert(0, 'benchmarks')
import bench_gpu as bg
from xbench.datasets.images import read_source
from xbench.inference.gpu_preprocess import upload_array
out = Path('/tmp/pd/files'); out.mkdir(exist_ok=True)
cases = [("rsna", 0, "dicom-jpeg", 1024, 1024), ("det", 0, "png", 1024, 1024), ("chex", 0, "jpeg", 2828, 2320),
         ("vindr", 0, "dicom16", 3072, 3072), ("vindr", 9, "dicom16", 3072, 3072), ("vindr", 7, "dicom16", 2500, 2048)]
paths = []
for name, i, fmt, h, w in cases:
    folder = out / name; folder.mkdir(exist_ok=True)
    if not any(folder.glob(f"{i:05d}.*")):
        bg._write_case((name, i, fmt, h, w, folder, 3))
    paths.append(next(folder.glob(f"{i:05d}.*")))
for p in paths:
    ts = []
    for _ in range(3):
        t0 = time.perf_counter(); src = read_source(p); t1 = time.perf_counter()
        pres = src.present() if src.levels is not None else None; t2 = time.perf_counter()
        arr = upload_array(src); t3 = time.perf_counter()
        ts.append((t1 - t0, t2 - t1, t3 - t2))
    r, pr, up = np.min(ts, axis=0) * 1e3
    print(f"{p.parent.name}/{p.name}: read {r:.1f} ms, present {pr:.1f} ms, upload_array {up:.1f} ms (incl present), "
          f"values {src.values.dtype} {src.values.shape}, levels {None if src.levels is None else len(src.levels)}, out {arr.dtype}, occurring_known {src.occurring is not None}")
