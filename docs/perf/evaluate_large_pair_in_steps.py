"""On this 2-core machine: one large phantom pair evaluated as one job and in steps, on one store.

Usage (repo root): PYTHONPATH=$PWD python docs/perf/evaluate_large_pair_in_steps.py <cases> <folder>
Infers <cases> phantom cases with two prior baselines once (grid 224, 1,000 replicates), then evaluates the store
with 2 workers, alternating the arms twice after a warm-up: one model (one pair: steps use both cores, one job
uses one) and two models (two pairs for two workers: no room for steps, so both arms are one job per pair). Prints the wall of
each arm, the pairs' seconds from the timeline, and whether all arms wrote the same tables."""
import hashlib
import json
import shutil
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, "tests")
from conftest import tiny_run  # noqa: E402

import xbench.evaluation.steps as st  # noqa: E402
from xbench.core.errors import XBenchWarning  # noqa: E402
from xbench.evaluation.evaluate import evaluate_run  # noqa: E402
from xbench.spec.config import RunConfig  # noqa: E402
from xbench.workflows.run import run  # noqa: E402

cases, root = int(sys.argv[1]), Path(sys.argv[2])
MODELS = ["random_prior", "center_prior"]


def raw(out, models, workers):
    return tiny_run(out, cases=cases, models=models, grid=[224, 224], chunk_size=256, batch_size=64,
                    bootstrap={"replicates": 1000, "seed": 0}, num_workers=0, eval_workers=workers)


warnings.simplefilter("ignore", XBenchWarning)
if not (root / "run" / ".done").exists():
    t = time.perf_counter()
    run(RunConfig.from_dict(raw(root / "run", MODELS, 0)), evaluate=False, progress=False)
    (root / "run" / ".done").touch()
    print(f"inference of {cases} cases x {len(MODELS)} models: {time.perf_counter() - t:.1f} s", flush=True)
tables: dict[str, set] = {}
arms = [(MODELS[:1], "warm-up", 10**9)]  # rasterises the ground truth (cached for the arms) and starts the fork server
arms += [(models, arm, split) for models in (MODELS[:1], MODELS)
         for arm, split in (("one job", 10**9), ("steps", 1), ("one job", 10**9), ("steps", 1))]
for models, arm, split in arms:
    if True:
        d = root / "arm"
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
        shutil.copytree(root / "run" / "store", d / "store")
        shutil.copytree(root / "run" / "cache" / "ground_truth", d / "cache" / "ground_truth", dirs_exist_ok=True) \
            if (root / "run" / "cache" / "ground_truth").exists() else None
        st.SPLIT_PAIRS = split
        t = time.perf_counter()
        evaluate_run(RunConfig.from_dict(raw(d, models, 2)), progress=False)
        wall = time.perf_counter() - t
        ev = json.loads((d / "evaluation_timing.json").read_text())["events"]["phantom"]
        log = json.loads((d / "tables" / "evaluation_log.json").read_text())
        pairs = sum(v["evaluated"] for v in log[0]["pairs"].values())
        digest = hashlib.sha256(b"".join((d / "tables" / n).read_bytes() for n in
                                         ("metrics.csv", "curves.csv", "evaluation_log.json"))).hexdigest()[:16]
        if arm != "warm-up":
            tables.setdefault(len(models), set()).add(digest)
        print(f"{len(models)} model(s), {arm:7s}: wall {wall:6.2f} s, pairs {ev['pairs_done'] - ev['pairs_submitted']:6.2f} s"
              f" ({pairs} grounding pairs per model), tables {digest}", flush=True)
        if not (root / "run" / "cache" / "ground_truth").exists():
            shutil.copytree(d / "cache" / "ground_truth", root / "run" / "cache" / "ground_truth")
print("same tables within each model count:", all(len(v) == 1 for v in tables.values()))
