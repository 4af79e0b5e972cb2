"""Round 13, this 2-core machine: what one large pair's evaluation weighs when pickled (what a worker computing
the dataset's comparisons was shipped, against what it reads).
Usage (repo root, after round21_steps_local.py 12000 /tmp/steps12k): PYTHONPATH=$PWD python docs/perf/round21_pickle_sizes.py"""
import pickle
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, "tests")
from conftest import tiny_run  # noqa: E402

from xbench.datasets import open_dataset  # noqa: E402
from xbench.evaluation.ground_truth import cached_ground_truth  # noqa: E402
from xbench.evaluation.pair import evaluate_pair  # noqa: E402
from xbench.spec.config import RunConfig  # noqa: E402
from xbench.store.results import ResultStore  # noqa: E402

warnings.simplefilter("ignore")
d = Path("/tmp/steps12k/arm")
cfg = RunConfig.from_dict(tiny_run(d, cases=12000, models=["random_prior"], grid=[224, 224], chunk_size=256,
                                   batch_size=64, bootstrap={"replicates": 1000, "seed": 0}, num_workers=0,
                                   eval_workers=0))
ds = open_dataset(cfg.datasets[0])
gt = cached_ground_truth(ds, cfg.grid, d / "cache" / "ground_truth", options=cfg.datasets[0].options,
                         progress=False)[0]
r = evaluate_pair(cfg, ds, "random_prior", gt, ResultStore(d))
for name, obj in (("whole PairEvaluation", r), ("scored only", r.scored), ("rescore partial", r.rescore),
                  ("pairs rows", r.pairs)):
    t = time.perf_counter()
    b = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    t1 = time.perf_counter() - t
    t = time.perf_counter()
    pickle.loads(b)
    t2 = time.perf_counter() - t
    print(f"{name:22s} {len(b)/1e6:7.1f} MB  dumps {t1:.3f} s  loads {t2:.3f} s")
