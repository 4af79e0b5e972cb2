"""Round 13: evaluation alone (no inference) of one full-scale run's store, timed, for one code and worker count.

Usage (on the device, after a bench_gpu.py multi run wrote <run>.yaml and <run>/store):
  PYTHONPATH=<code> python round21_eval_arm.py <run>.yaml <scratch dir> <eval_workers> <out.json>
The store is copied to <scratch dir>, its ground-truth cache left out (ground truth is rasterised again), and
``evaluate_run`` timed there; the JSON has the wall, each dataset's evaluation timeline and the tables' sha256."""
import hashlib
import json
import shutil
import sys
import time
import warnings
from pathlib import Path

import yaml

config, scratch, workers, out = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])
raw = yaml.safe_load(config.read_text())
source = Path(raw["output_dir"])
shutil.rmtree(scratch, ignore_errors=True)
scratch.mkdir(parents=True)
shutil.copytree(source / "store", scratch / "store")
raw.update(output_dir=str(scratch), eval_workers=workers)

from xbench.core.errors import XBenchWarning  # noqa: E402
from xbench.evaluation.evaluate import evaluate_run  # noqa: E402
from xbench.spec.config import RunConfig  # noqa: E402

cfg = RunConfig.from_dict(raw)
started = time.perf_counter()
with warnings.catch_warnings():
    warnings.simplefilter("ignore", XBenchWarning)
    evaluate_run(cfg, progress=False)
wall = time.perf_counter() - started
tables = {p.name: hashlib.sha256(p.read_bytes()).hexdigest()[:16] for p in sorted((scratch / "tables").glob("*"))
          if p.is_file() and p.suffix in (".csv", ".json")}
timing = json.loads((scratch / "evaluation_timing.json").read_text())
doc = {"code": sys.path[0] if False else str(Path(__import__("xbench").__file__).parent.parent), "eval_workers": workers,
       "wall_seconds": round(wall, 2), "tables_sha256": tables, "timing": timing}
out.write_text(json.dumps(doc, indent=1))
print(json.dumps({k: doc[k] for k in ("code", "eval_workers", "wall_seconds")}), json.dumps(timing["events"].get("vindr_cxr")))
