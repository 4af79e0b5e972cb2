"""The runner end to end on a small phantom split with the prior baselines (no weights):
tables written, resume after an interruption, no-op re-run, independent shards + merge,
torchrun-style data parallel (2 CPU processes, gloo), missing images (skip / raise), fit-split guard."""
from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import socket
import time
import traceback
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

import xbench
from conftest import tiny_run
from xbench.spec.config import RunConfig
from xbench.core.errors import MissingFileError, XBenchError, XBenchWarning
from xbench.models.priors import AnatomicalPrior, CenterPrior, RandomPrior
from xbench.store.results import ResultStore
from xbench.workflows.run import merge, run

CASES, CHUNK = 22, 8  # 3 chunks: rows 0-7, 8-15, 16-21 (a short last chunk); batch 3 does not divide the chunk
MODELS = ["center_prior", "random_prior", "anatomical_prior"]
TABLE_FILES = ["metrics.csv", "metrics.parquet", "pairs.parquet", "curves.csv", "models.csv", "evaluation_log.json"]


def tiny_raw(output_dir: Path) -> dict:
    return tiny_run(output_dir, cases=CASES)


def tiny_config(output_dir: Path, **changes) -> RunConfig:
    return RunConfig.from_dict({**tiny_raw(output_dir), **changes})


def quiet_run(cfg: RunConfig, **kwargs) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", XBenchWarning)  # dropped bootstrap replicates of rare classes
        return run(cfg, progress=False, **kwargs)


def run_log(out: Path, name: str = "run_log.json") -> dict[str, dict]:
    return {e["model"]: e for e in json.loads((out / name).read_text())}


def metrics(out: Path) -> pd.DataFrame:
    return pd.read_parquet(out / "tables" / "metrics.parquet")


def assert_same_tables(a: Path, b: Path) -> None:
    pd.testing.assert_frame_equal(metrics(a), metrics(b))
    pd.testing.assert_frame_equal(pd.read_parquet(a / "tables" / "pairs.parquet"),
                                  pd.read_parquet(b / "tables" / "pairs.parquet"))
    pd.testing.assert_frame_equal(pd.read_csv(a / "tables" / "curves.csv"), pd.read_csv(b / "tables" / "curves.csv"))


pytestmark = pytest.mark.usefixtures("phantom_cache")


@pytest.fixture(scope="module")
def base(tmp_path_factory, phantom_cache) -> dict:
    """An uninterrupted single-process run; tests copy it before changing anything."""
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("base-run")
    quiet_run(tiny_config(out))
    return {"out": out, "log": run_log(out)}


@pytest.fixture()
def predict_calls(monkeypatch) -> Counter:
    """Images passed to each prior's predict_cases (what the runner calls)."""
    calls: Counter = Counter()
    for cls in (CenterPrior, RandomPrior, AnatomicalPrior):
        def counted(self, pixels, prompts, case_ids, _orig=cls.predict_cases):
            calls[self.name] += len(pixels)
            return _orig(self, pixels, prompts, case_ids)
        monkeypatch.setattr(cls, "predict_cases", counted)
    return calls


def copy_run(base: dict, tmp_path: Path) -> Path:
    out = tmp_path / "run"
    shutil.copytree(base["out"], out)
    return out


# -- a full run -----------------------------------------------------------------------------------------
def test_run_writes_store_tables_fitted_prior_and_log(base):
    out, log = base["out"], base["log"]
    assert sorted(log) == sorted(MODELS)
    for model in MODELS:
        entry = log[model]
        assert (entry["chunks_total"], entry["chunks_written"], entry["chunks_done_before"]) == (3, 3, 0)
        assert (entry["cases_inferred"], entry["cases_skipped"], entry["weights_label"]) == (CASES, 0, "none")
        chunks = ResultStore(out).chunks("phantom", model)
        assert [c.name for c in chunks] == ["chunk-00000.npz", "chunk-00001.npz", "chunk-00002.npz"]
        with np.load(chunks[-1]) as last:
            assert last["case_ids"].tolist() == [f"test_{i:05d}" for i in range(16, CASES)]
    assert all((out / "tables" / name).stat().st_size > 0 for name in TABLE_FILES)
    assert (out / "fitted" / "phantom" / "anatomical_prior" / "anatomical_prior.npz").exists()
    assert set(metrics(out)["model"]) == set(MODELS)


def test_stored_predictions_match_the_adapter(base):
    """The store holds exactly what the model predicts for each case, in dataset order."""
    stored = ResultStore(base["out"]).read("phantom", "random_prior", expected_chunks=3)
    data = xbench.load_dataset("phantom", split="test", cases=CASES)
    model = xbench.create_model("random_prior")
    prompts = [data.prompts[f] for f in data.findings]
    rows = [0, 9, 21]
    pred = model.predict_cases(torch.stack([model.preprocess(data[r].image()) for r in rows]), prompts,
                               [data[r].case_id for r in rows])
    assert stored.case_ids.tolist() == data.cases["case_id"].tolist()
    np.testing.assert_array_equal(stored.scores[rows], pred.scores.numpy())
    np.testing.assert_array_equal(stored.maps[rows], pred.maps.numpy().astype(np.float16))
    np.testing.assert_allclose(stored.probs[rows], model.to_probability(pred.scores.numpy()), rtol=1e-6)
    assert stored.meta["chunk_size"] == CHUNK and stored.meta["grid"] == [14, 14]


# -- resume ---------------------------------------------------------------------------------------------
def test_resume_after_an_interrupted_run_computes_only_missing_chunks(base, tmp_path, monkeypatch, predict_calls):
    cfg = tiny_config(tmp_path / "run")
    real = ResultStore.write_chunk
    written: list = []

    def crash_after_two(self, dataset, model, chunk, **kw):
        if len(written) == 2:
            raise RuntimeError("simulated crash")
        written.append((model, chunk))
        return real(self, dataset, model, chunk, **kw)

    with monkeypatch.context() as m:
        m.setattr(ResultStore, "write_chunk", crash_after_two)
        with pytest.raises(RuntimeError, match="simulated crash"):
            quiet_run(cfg)
    # the models of a dataset are stepped in turn (a batch each), so the first two chunks are the models' chunk 0
    assert written == [("center_prior", 0), ("random_prior", 0)]
    assert not (tmp_path / "run" / "tables").exists()

    predict_calls.clear()
    quiet_run(cfg)
    log = run_log(tmp_path / "run")
    for model in ("center_prior", "random_prior"):
        assert (log[model]["chunks_done_before"], log[model]["chunks_written"]) == (1, 2)
        assert log[model]["cases_inferred"] == CASES - CHUNK
    assert log["anatomical_prior"]["chunks_written"] == 3
    assert predict_calls == {"center_prior": CASES - CHUNK, "random_prior": CASES - CHUNK, "anatomical_prior": CASES}
    assert_same_tables(tmp_path / "run", base["out"])


def test_a_failed_background_write_stops_its_pair_early(tmp_path, monkeypatch, predict_calls):
    """Chunks are written in a writer thread: a write that fails stops its pair at that pair's next batch (not at the
    end of the dataset); with keep_going the other pairs finish and every chunk they made is on disk."""
    from xbench.core.errors import StoreError
    from xbench.inference.runner import infer_run

    cfg = tiny_config(tmp_path / "run", batch_size=2)  # 4 batches per 8-case chunk
    real = ResultStore.write_chunk

    def full_for_random(self, dataset, model, chunk, **kw):
        if model == "random_prior":
            raise StoreError(f"simulated full disk writing {model} chunk {chunk}")
        return real(self, dataset, model, chunk, **kw)

    def slowed(self, *args, _counted=RandomPrior.predict_cases):  # a batch takes as long as a real model's would
        time.sleep(0.05)
        return _counted(self, *args)

    monkeypatch.setattr(ResultStore, "write_chunk", full_for_random)
    monkeypatch.setattr(RandomPrior, "predict_cases", slowed)
    with warnings.catch_warnings(), pytest.raises(XBenchError, match="1 model × dataset pair") as err:
        warnings.simplefilter("ignore", XBenchWarning)
        infer_run(cfg, progress=False, keep_going=True)
    assert "simulated full disk writing random_prior chunk 0" in str(err.value)
    assert predict_calls["random_prior"] < CASES - 2  # stopped within a few batches of its first chunk
    assert predict_calls["center_prior"] == predict_calls["anatomical_prior"] == CASES
    store = ResultStore(tmp_path / "run")
    for model in ("center_prior", "anatomical_prior"):
        assert len(store.chunks("phantom", model)) == 3
    assert not store.chunks("phantom", "random_prior")


def test_resume_after_deleting_a_chunk_recomputes_only_that_chunk(base, tmp_path, predict_calls):
    out = copy_run(base, tmp_path)
    (out / "store" / "phantom" / "random_prior" / "chunk-00001.npz").unlink()
    (out / "tables" / "metrics.parquet").unlink()
    quiet_run(tiny_config(out))
    assert predict_calls == {"random_prior": CHUNK}
    log = run_log(out)
    assert [log[m]["chunks_written"] for m in MODELS] == [0, 1, 0]
    assert_same_tables(out, base["out"])


def test_rerun_with_the_same_config_is_a_noop(base, tmp_path, predict_calls):
    out = copy_run(base, tmp_path)
    chunks = sorted((out / "store").rglob("chunk-*.npz"))
    stamps = [c.stat().st_mtime_ns for c in chunks]
    quiet_run(tiny_config(out))
    assert sum(predict_calls.values()) == 0
    log = run_log(out)
    assert all((log[m]["chunks_written"], log[m]["chunks_done_before"], log[m]["cases_inferred"]) == (0, 3, 0)
               for m in MODELS)
    assert [c.stat().st_mtime_ns for c in sorted((out / "store").rglob("chunk-*.npz"))] == stamps
    assert_same_tables(out, base["out"])


def test_changed_model_params_are_refused_unless_overwrite(base, tmp_path, predict_calls):
    out = copy_run(base, tmp_path)
    changed = tiny_config(out, models=[{"name": "center_prior", "params": {"sigma": 0.1}}])
    with pytest.raises(XBenchError, match="different configuration .*params"):
        quiet_run(changed)
    quiet_run(changed, overwrite=True)
    assert predict_calls == {"center_prior": CASES}
    assert run_log(out)["center_prior"]["chunks_written"] == 3
    assert ResultStore(out).meta("phantom", "center_prior")["params"] == {"sigma": 0.1}


def test_run_log_times_the_builds_and_the_rank(base):
    """Every entry says how long its model took to build (cumulative) and how far into the run its dataset ended."""
    log = base["log"]
    assert set(log) == set(MODELS)
    for entry in log.values():
        assert 0.0 <= entry["build_seconds"] <= entry["since_start_seconds"]
        assert entry["since_start_seconds"] >= entry["seconds"]  # the dataset's inference lies inside it
    assert len({e["since_start_seconds"] for e in log.values()}) == 1  # one dataset: one end for its models
    started = {e["run_started_unix"] for e in log.values()}  # the run's start on the wall clock: one for the run
    assert len(started) == 1 and time.time() - 3600 < started.pop() <= time.time()


def test_worker_processes_give_the_same_store(base, tmp_path):
    cfg = tiny_config(tmp_path / "run", models=["random_prior"], num_workers=2)
    quiet_run(cfg, evaluate=False)
    assert not (tmp_path / "run" / "tables").exists()
    got = ResultStore(tmp_path / "run").read("phantom", "random_prior", expected_chunks=3)
    want = ResultStore(base["out"]).read("phantom", "random_prior", expected_chunks=3)
    assert got.case_ids.tolist() == want.case_ids.tolist()
    np.testing.assert_array_equal(got.maps, want.maps)
    np.testing.assert_array_equal(got.scores, want.scores)


# -- sharding -------------------------------------------------------------------------------------------
def test_independent_shards_then_merge_equal_the_single_run(base, tmp_path):
    dirs = [tmp_path / "shard0", tmp_path / "shard1"]
    for i, d in enumerate(dirs):
        quiet_run(tiny_config(d), shard=(i, 2))
        assert not (d / "tables").exists()  # shards do not evaluate
    logs = [run_log(d, f"run_log.shard{i}of2.json") for i, d in enumerate(dirs)]
    assert [logs[0][m]["chunks_written"] for m in MODELS] == [2, 2, 2]  # chunks 0 and 2
    assert [logs[1][m]["chunks_written"] for m in MODELS] == [1, 1, 1]  # chunk 1
    assert sorted(p.name for p in (dirs[1] / "store" / "phantom" / "center_prior").glob("chunk-*.npz")) == \
        ["chunk-00001.npz"]

    with pytest.raises(XBenchError, match=r"chunks \[1\] of 3 are missing"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", XBenchWarning)
            merge(tiny_config(tmp_path / "partial"), [dirs[0]], progress=False)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", XBenchWarning)
        merge(tiny_config(tmp_path / "merged"), dirs, progress=False)
    assert_same_tables(tmp_path / "merged", base["out"])


def test_merge_from_a_folder_without_store_is_an_error(tmp_path):
    with pytest.raises(XBenchError, match="has no store/ folder"):
        merge(tiny_config(tmp_path / "merged"), [tmp_path / "empty"], progress=False)


@pytest.mark.parametrize("shard", [(2, 2), (-1, 2)])
def test_bad_shard_is_an_error(tmp_path, shard):
    with pytest.raises(XBenchError, match="0 <= i < n"):
        run(tiny_config(tmp_path / "run"), shard=shard, progress=False)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, port: int, config: str, cache: str, errors) -> None:
    """One torchrun-style rank in a forked child: the env variables torchrun sets, then an ordinary run()."""
    code = 0
    try:
        os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                           "MASTER_PORT": str(port), "XBENCH_CACHE": cache})
        warnings.simplefilter("ignore")
        run(RunConfig.from_yaml(config), progress=False)
        torch.distributed.destroy_process_group()
    except BaseException:  # report to the parent, which asserts
        errors.put(f"rank {rank}: {traceback.format_exc()}")
        code = 1
    finally:
        os._exit(code)  # skip pytest's exit handlers inherited through fork


@pytest.mark.skipif(not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
                    reason="torch.distributed with gloo is not available")
def test_torchrun_style_data_parallel_equals_single_process(base, tmp_path, phantom_cache):
    """Two CPU ranks on gloo (forked so they skip the imports; each sees RANK/WORLD_SIZE/MASTER_* as under
    torchrun): each rank infers its chunks, rank 0 evaluates after the barrier."""
    out = tmp_path / "ddp"
    config = tmp_path / "ddp.yaml"
    config.write_text(yaml.safe_dump(tiny_raw(out)))
    ctx = multiprocessing.get_context("fork")
    errors = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank_main, args=(rank, port, str(config), str(phantom_cache), errors))
             for rank in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    for p in procs:
        if p.is_alive():
            p.kill()
    messages = [errors.get(timeout=5) for p in procs if p.exitcode not in (0, None)]
    assert [p.exitcode for p in procs] == [0, 0], "\n".join(messages)
    assert "RANK" not in os.environ  # the parent is untouched
    logs = [run_log(out, f"run_log.shard{r}of2.json") for r in range(2)]
    assert [logs[0][m]["chunks_written"] for m in MODELS] == [2, 2, 2]
    assert [logs[1][m]["chunks_written"] for m in MODELS] == [1, 1, 1]
    assert not (out / "run_log.json").exists()
    assert_same_tables(out, base["out"])  # rank 0 evaluated after the barrier, over both ranks' chunks


# -- missing images, fit split ----------------------------------------------------------------------------
@pytest.fixture()
def holed_dataset(tmp_path, monkeypatch):
    """A private 10-case phantom split (own cache) with the image of its first positive case deleted."""
    monkeypatch.setenv("XBENCH_CACHE", str(tmp_path / "cache"))
    data = xbench.load_dataset("phantom", split="test", cases=10)
    row = int(np.flatnonzero((data.labels() == 1).any(axis=1))[0])
    path = Path(data.cases["image_path"].iloc[row])
    path.unlink()
    raw = {"output_dir": str(tmp_path / "run"), "datasets": [{"name": "phantom", "split": "test", "cases": 10}],
           "models": ["center_prior"], "grid": [32, 32], "chunk_size": 4, "batch_size": 4,
           "bootstrap": {"replicates": 0}}
    return data, data.cases["case_id"].iloc[row], path, raw


def test_missing_image_skip_is_counted_and_excluded(holed_dataset, tmp_path):
    data, case_id, path, raw = holed_dataset
    with pytest.warns(XBenchWarning, match="skipped 1 "):
        run(RunConfig.from_dict({**raw, "on_missing_image": "skip"}), progress=False)
    log = run_log(tmp_path / "run")["center_prior"]
    assert (log["cases_skipped"], log["cases_inferred"], log["skip_reasons"]) == (1, 9, {"MissingFileError": 1})
    stored = ResultStore(tmp_path / "run").read("phantom", "center_prior", expected_chunks=3)
    assert case_id not in stored.case_ids.tolist() and len(stored.case_ids) == 9
    assert str(path) in stored.skipped[case_id]
    evaluation = json.loads((tmp_path / "run" / "tables" / "evaluation_log.json").read_text())[0]
    assert evaluation["cases_skipped_at_inference"] == 1
    pairs = pd.read_parquet(tmp_path / "run" / "tables" / "pairs.parquet")
    assert case_id not in set(pairs["case_id"])
    tidy = metrics(tmp_path / "run")
    per_class = tidy[(tidy["metric"] == "auc") & tidy["finding"].isin(data.findings)]
    assert len(per_class) == len(data.findings) and set(per_class["n_cases"]) == {9}  # 9 labelled cases per class
    assert sum(v["missing_prediction"] for v in evaluation["pairs"].values()) >= 1


def test_missing_image_raise_names_the_file(holed_dataset, tmp_path):
    _, case_id, path, raw = holed_dataset
    # preflight: refused before any model is built, with the exact count and the case
    with pytest.raises(XBenchError, match=rf"1 of 10 image files are missing \(first: images/{case_id}\.png under .*\(cases {case_id}\)\)"):
        run(RunConfig.from_dict({**raw, "on_missing_image": "raise"}), progress=False)
    assert not (tmp_path / "run" / "store").exists()
    # without the preflight the inference itself names the file
    with pytest.raises(MissingFileError) as err:
        run(RunConfig.from_dict({**raw, "on_missing_image": "raise"}), progress=False, check=False)
    assert str(path) in str(err.value)


@pytest.mark.parametrize("split", ["test", None])
def test_fit_split_equal_to_the_evaluation_split_is_refused(tmp_path, split):
    dataset = {"name": "phantom", "cases": CASES, **({"split": split} if split else {})}
    cfg = tiny_config(tmp_path / "run", datasets=[dataset], models=[{"name": "anatomical_prior", "fit_split": "test"}])
    with pytest.raises(XBenchError, match="fit_split 'test' is the evaluation split"):
        run(cfg, progress=False)
