"""The inference stage's parts: the run plan is plain frozen data whose shards partition the chunks, the parts take the
arguments they use (never the run config), the recorder's run-log keys and the pair's timing helper."""
from __future__ import annotations

import ast
import dataclasses
import json
import warnings
from pathlib import Path

import pytest
from conftest import tiny_run

from xbench.core.errors import XBenchWarning
from xbench.datasets.base import inference_order
from xbench.inference import recorder
from xbench.inference.plan import plan_run
from xbench.spec.config import RunConfig
from xbench.workflows.run import run

INFERENCE = Path(__file__).resolve().parents[2] / "xbench" / "inference"


def test_the_plan_is_frozen_and_its_shards_partition_the_chunks(tmp_path, phantom_cache):
    cfg = RunConfig.from_dict(tiny_run(tmp_path / "run", cases=22))
    plans = [plan_run(cfg, shard=(i, 2), check=False) for i in range(2)]
    assert sorted(k for p in plans for k in p.chunks[0]) == [0, 1, 2]  # 22 cases in chunks of 8, each taken once
    assert all(p.chunks[0] for p in plans)
    plan = plans[0]
    assert plan.order == tuple(inference_order(list(plan.opened)))
    assert [m.label for m in plan.models] == ["center_prior", "random_prior", "anatomical_prior"]
    assert (plan.knobs.chunk_size, plan.knobs.batch_size, plan.shard, plan.distributed) == (8, 3, (0, 2), False)
    assert plan.feed is not None and plan.feed.workers == cfg.num_workers and not plan.decode_ahead  # a CPU run
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.shard = (1, 2)  # type: ignore[misc]


def test_only_the_loop_and_the_plan_take_the_run_config():
    """Below ``infer_run`` (and ``merge_shards``) only ``plan_run`` reads the run config; every other part of the
    inference stage takes the fields it uses."""
    takes = []
    for path in sorted(INFERENCE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
                if any(a.arg == "cfg" or (a.annotation is not None and "RunConfig" in ast.unparse(a.annotation))
                       for a in args):
                    takes.append(f"{path.stem}.{node.name}")
    assert sorted(takes) == ["plan.plan_run", "runner.infer_run", "runner.merge_shards"]


def test_the_run_log_keys_and_their_order(tmp_path, phantom_cache):
    """Each inferred pair's run-log entry: the pair's counts, then what the recorder adds, in this order."""
    cfg = RunConfig.from_dict(tiny_run(tmp_path / "run", models=["center_prior"]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", XBenchWarning)
        run(cfg, progress=False, evaluate=False)
    (entry,) = json.loads((tmp_path / "run" / "run_log.json").read_text())
    assert list(entry) == [
        "dataset", "model", "chunks_total", "chunks_done_before", "chunks_written", "cases_inferred", "cases_retried",
        "cases_skipped", "skip_reasons", "seconds", "model_seconds", "decode_seconds", "skipped_examples",
        "build_seconds", "since_start_seconds", "run_started_unix", "dataset_skipped_records", "weights_label",
        "built_while_decoding", "built_since_start_seconds", "decode_once", "decode_profile", "preflight_images"]
    assert entry["cases_inferred"] == 22 and entry["chunks_written"] == 3
    assert abs(entry["seconds"] - entry["model_seconds"] - entry["decode_seconds"]) <= 0.002


def test_pair_times_split_waiting_from_working(monkeypatch):
    clock = iter([10.0, 10.5, 11.0, 13.25, 20.0, 20.125])
    monkeypatch.setattr(recorder.time, "perf_counter", lambda: next(clock))
    times = recorder.PairTimes()
    with times.waiting():
        pass  # 0.5 s waiting for inputs
    with times.working():
        pass  # 2.25 s in the pair's own step
    with times.waiting():
        pass  # 0.125 s
    assert times.counts() == {"seconds": 2.875, "model_seconds": 2.25, "decode_seconds": 0.625}
