"""Round 13, this 2-core machine: the pieces of one large pair's evaluation timed one by one, in this process
(what a step costs: reading the store, the ground-truth file, grounding per group, the score table, a batch of
replicates; what the whole dataset weighs as a job argument).
Usage (repo root, after round21_steps_local.py 12000 /tmp/steps12k): PYTHONPATH=$PWD python docs/perf/round21_steps_profile.py"""
import pickle
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, "tests")
from conftest import tiny_run  # noqa: E402

from xbench.core.workers import one_blas_thread  # noqa: E402
from xbench.datasets import open_dataset  # noqa: E402
from xbench.evaluation import pair as P  # noqa: E402
from xbench.evaluation import steps as S  # noqa: E402
from xbench.evaluation.ground_truth import cached_ground_truth, shippable  # noqa: E402
from xbench.spec.config import RunConfig  # noqa: E402
from xbench.store.results import ResultStore  # noqa: E402

warnings.simplefilter("ignore")
one_blas_thread().__enter__()
d = Path("/tmp/steps12k/arm")
cfg = RunConfig.from_dict(tiny_run(d, cases=12000, models=["random_prior"], grid=[224, 224], chunk_size=256,
                                   batch_size=64, bootstrap={"replicates": 1000, "seed": 0}, num_workers=0,
                                   eval_workers=0))
ds = open_dataset(cfg.datasets[0])
gt, gt_file, gt_key, _ = cached_ground_truth(ds, cfg.grid, d / "cache" / "ground_truth",
                                             options=cfg.datasets[0].options, progress=False)
view, state, model = P.DatasetView.of(ds), shippable(ds)[0], "random_prior"


def timed(label, f, *a):
    t = time.perf_counter()
    r = f(*a)
    print(f"{label:32s} {time.perf_counter() - t:6.3f} s", flush=True)
    return r


preds = timed("read the store", P.read_predictions, cfg, view, model, ResultStore(cfg.output_dir))
frame, _ = timed("grounding, all findings", P.ground_rows, cfg, view, preds, gt, range(len(view.findings)))
prepared, _ = timed("prepare the score table", P.prepared_score, cfg, view, model, preds, frame)
timed("one batch of 100 replicates", prepared.replicates, 0)
timed("all 1,000 replicates", prepared.all_replicates)
P._GT_MEMO.clear()
timed("ground truth, all findings", P.worker_ground_truth, gt_file, gt_key)
P._GT_MEMO.clear()
timed("ground truth, one finding", P.worker_ground_truth, gt_file, gt_key, view.findings[:1])
folder = Path(tempfile.mkdtemp())
groups = S.finding_groups(ds, {f: len(g.rows) for f, g in gt.items()})  # pairs per finding (round 14 signature)
for k, g in enumerate(groups):
    timed(f"grounding step {g}", S._ground_job, state, view, cfg, model, gt_file, gt_key, g, folder / f"g{k}.npz")
parts = [folder / f"g{k}.npz" for k in range(len(groups))]
timed("head step", S._head_job, state, ds, cfg, model, parts, {})
for first, n in S._batch_ranges(10):
    S._PREPARED.clear()
    timed(f"replicates step, batches {first}-{first + n - 1}", S._replicates_job, state, view, cfg, model, parts, first, n)
blob = timed("pickle the dataset", pickle.dumps, ds)
print(f"dataset pickle {len(blob) / 1e6:.1f} MB; its view {len(pickle.dumps(view)) / 1e6:.1f} MB")
