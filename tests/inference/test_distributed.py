"""torchrun-style ranks (2 forked CPU processes on gloo): a crashed rank makes the others stop at the barrier
with an error naming the problem (no hang); running the same command again resumes and gives the tables of
a single-process run. The SLURM recipe (independent ``--shard i/n`` runs + ``merge``) through the CLI."""
from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import time
import traceback
import warnings
from pathlib import Path

import pytest
import torch
import yaml

from test_runner import MODELS, _free_port, assert_same_tables, quiet_run, run_log, tiny_config, tiny_raw
from xbench.spec.config import RunConfig
from xbench.workflows.run import run

pytestmark = [pytest.mark.usefixtures("phantom_cache"),
              pytest.mark.skipif(not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
                                 reason="torch.distributed with gloo is not available")]


def _rank(rank: int, port: int, config: str, cache: str, crash: bool, errors: str) -> None:
    code = 0
    try:
        os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                           "MASTER_PORT": str(port), "XBENCH_CACHE": cache, "XBENCH_BARRIER_TIMEOUT": "8"})
        warnings.simplefilter("ignore")
        if crash:  # this rank dies once its first model's chunk is written, before the barrier (as an OOM kill would)
            import xbench.inference.runner as runner

            real = runner._flush

            def dying(store, dataset_name, model, *args, **kw):
                if model != MODELS[0]:  # models are stepped in turn: the first model's chunk is complete first
                    os._exit(3)
                return real(store, dataset_name, model, *args, **kw)
            runner._flush = dying
        run(RunConfig.from_yaml(config), progress=False)
        torch.distributed.destroy_process_group()
    except BaseException:
        Path(errors, f"rank{rank}.txt").write_text(traceback.format_exc())  # a file: os._exit loses queue data
        code = 1
    finally:
        os._exit(code)


def _launch(config: Path, cache: Path, crash_rank: int | None) -> tuple[list[int | None], list[str], float]:
    ctx = multiprocessing.get_context("fork")
    errors = config.parent / f"errors-{time.monotonic_ns()}"
    errors.mkdir()
    port = _free_port()
    procs = [ctx.Process(target=_rank, args=(r, port, str(config), str(cache), r == crash_rank, str(errors))) for r in range(2)]
    started = time.monotonic()
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    elapsed = time.monotonic() - started
    hung = [p for p in procs if p.is_alive()]
    for p in hung:
        p.kill()
    messages = [f.read_text() for f in sorted(errors.iterdir())]
    return [None if p in hung else p.exitcode for p in procs], messages, elapsed


def test_a_crashed_rank_stops_the_others_with_an_error_and_a_rerun_resumes(tmp_path, phantom_cache):
    single = tmp_path / "single"
    quiet_run(tiny_config(single))
    out = tmp_path / "ddp"
    config = tmp_path / "ddp.yaml"
    config.write_text(yaml.safe_dump(tiny_raw(out)))

    codes, messages, elapsed = _launch(config, phantom_cache, crash_rank=1)
    assert codes == [1, 3], messages  # rank 0 failed with an error, not hung (None) and not success
    assert elapsed < 100
    assert len(messages) == 1 and "XBenchError" in messages[0] and "rank 0 of 2" in messages[0], messages
    assert "run the same command again to resume" in messages[0]
    assert not (out / "tables").exists()  # nothing evaluated from an incomplete store

    codes, messages, _ = _launch(config, phantom_cache, crash_rank=None)
    assert codes == [0, 0], messages
    logs = [run_log(out, f"run_log.shard{r}of2.json") for r in range(2)]
    assert [logs[0][m]["chunks_written"] for m in MODELS] == [0, 0, 0]  # rank 0 had finished: nothing redone
    assert [logs[1][m]["chunks_done_before"] for m in MODELS] == [1, 0, 0]  # rank 1 resumed after its first model
    assert [logs[1][m]["chunks_written"] for m in MODELS] == [0, 1, 1]
    assert_same_tables(out, single)


def test_slurm_recipe_shards_then_merge_through_the_cli(tmp_path, phantom_cache):
    """What an array job does: `xbench run --shard i/n --no-eval` per task (own folder), then `xbench merge`."""
    single = tmp_path / "single"
    quiet_run(tiny_config(single))
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(tiny_raw(tmp_path / "merged")))
    env = {**os.environ, "XBENCH_CACHE": str(phantom_cache), "PYTHONWARNINGS": "ignore"}
    tasks = [subprocess.Popen([sys.executable, "-m", "xbench.cli", "run", "--config", str(config), "--shard", f"{i}/3",
                               "--output-dir", str(tmp_path / f"task{i}"), "--quiet"], env=env)
             for i in range(3)]  # at once, as an array job's tasks run
    assert [task.wait(timeout=300) for task in tasks] == [0, 0, 0]
    subprocess.run([sys.executable, "-m", "xbench.cli", "merge", "--config", str(config), "--from",
                    *[str(tmp_path / f"task{i}") for i in range(3)]], check=True, env=env)
    assert_same_tables(tmp_path / "merged", single)


def test_a_ranks_gpu_is_named_by_index_for_the_decoding_and_building_threads(monkeypatch):
    """CUDA's current device is per thread (a new thread starts on GPU 0), so ``cuda`` alone would send a rank's
    device preprocessing (decoding thread) and network builds (building thread) to GPU 0. ``with_index`` names the
    main thread's current GPU (``LOCAL_RANK`` after ``_init_distributed``); other devices pass unchanged."""
    from xbench.inference.runner import with_index

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert with_index(torch.device("cuda")) == torch.device("cuda", 3)
    assert with_index(torch.device("cuda", 1)) == torch.device("cuda", 1)
    assert with_index(torch.device("cpu")) == torch.device("cpu")
