"""CPU seconds of the calling process (all its threads; the workers excluded) to make a dataset's ground-truth
cache file with a pool, as rank 0 of a run does: `RunEvaluation._prepare` calls `ground_truth_file` (round 14) or,
in older trees, `cached_ground_truth`. Run it with each tree on PYTHONPATH:

    PYTHONPATH=<tree> python docs/perf/round22_gt_parent_cpu.py <folder> [workers] [repeats]

The stand-ins' case tables (`benchmarks/bench_gpu.py`'s `generate` at scale 1.0, boxes and image sizes only, no
image written: the masks need neither) are made once under <folder>/tables; each repeat writes a fresh cache
under <folder>/cache (a miss) and reads it back (a hit). The pool is warmed up first, and one untimed call on ChestX-Det10 pays the first use's
imports. Prints one JSON line per dataset and repeat.
"""
from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path


BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def no_image(task: tuple) -> dict:
    """bench_gpu._write_case without the image: the same labels and boxes."""
    import bench_gpu

    name, i, fmt, h, w, folder, n_classes = task
    labels, boxes = bench_gpu.labels_and_boxes(name, i, h, w, n_classes)
    return {"i": i, "image": f"images/{i:05d}.png", "height": h, "width": w, "labels": labels, "boxes": boxes,
            "bytes": 0}


def tables(root: Path) -> None:
    """The stand-ins' cases.csv and manifests, as bench_gpu.generate writes them, without the images."""
    sys.path.insert(0, str(BENCH))
    import bench_gpu

    bench_gpu._write_case = no_image
    bench_gpu.generate(root, scale=1.0, workers=1)


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main() -> None:
    folder = Path(sys.argv[1])
    workers = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    repeats = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    root = folder / "tables"
    if not (root / "manifests").is_dir():  # in a child: xbench reads $XBENCH_MANIFESTS once, when imported
        subprocess.run([sys.executable, __file__, "--tables", str(root)], check=True)
    os.environ["XBENCH_MANIFESTS"] = str(root / "manifests")
    from xbench.core.workers import process_pool
    from xbench.datasets import load_dataset
    from xbench.evaluation import ground_truth as gtm

    make = getattr(gtm, "ground_truth_file", gtm.cached_ground_truth)
    with process_pool(workers, preload=("xbench.evaluation.evaluate",), nice=10) as pool:
        list(pool.map(abs, range(4 * workers)))  # workers started
        warm = load_dataset("standin_chestx_det10", root=root / "chestx_det10")  # first use's imports, not timed
        make(warm, (224, 224), folder / "warm", pool=pool, workers=workers, progress=False)
        shutil.rmtree(folder / "warm")
        for repeat in range(repeats):
            for name in ("vindr_cxr", "rsna_pneumonia", "chexlocalize"):
                dataset = load_dataset(f"standin_{name}", root=root / name)
                shutil.rmtree(folder / "cache", ignore_errors=True)
                for _ in ("made", "found"):  # the file made (a miss), then read back (a hit)
                    c, t = cpu(), time.perf_counter()
                    made = make(dataset, (224, 224), folder / "cache", pool=pool, workers=workers, progress=False)
                    print(json.dumps({"function": make.__name__, "dataset": name, "repeat": repeat, "status": made[3],
                                      "pairs": sum(len(g.rows) if hasattr(g, "rows") else g for g in made[0].values()),
                                      "caller_cpu_s": round(cpu() - c, 2), "wall_s": round(time.perf_counter() - t, 2)}),
                          flush=True)
                    del made

if __name__ == "__main__":
    if sys.argv[1] == "--tables":
        tables(Path(sys.argv[2]))
    else:
        main()
