"""The overlapped evaluation coordinated in a process of its own (``eval_process``,
:mod:`xbench.workflows.evaluation_process`): the same tables, its warnings and errors raised in the run's process,
a child that ends with its run."""
from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import torch

from conftest import tiny_run
from xbench.core.errors import FormatError, XBenchError, XBenchWarning
from xbench.evaluation.evaluate import RunEvaluation
from xbench.spec.config import RunConfig
from xbench.workflows.evaluation_process import EvaluationProcess, apart, finish_here
from xbench.workflows.run import run


def _tables(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((out / "tables").glob("*")) if p.is_file()}


def test_a_run_evaluated_in_a_process_of_its_own_writes_the_bytes_of_the_in_process_run(tmp_path, phantom_run):
    """The session's run (evaluated in its own process) again with ``eval_process: true``: every table the same
    bytes; the timeline names the process that coordinated (a child, or the run's own); the child's warnings are
    raised in the run's process."""
    with pytest.warns(XBenchWarning, match="undefined bootstrap replicates dropped"):  # recorded in the child
        run(RunConfig.from_dict(tiny_run(tmp_path / "apart", eval_workers=2, eval_process=True)), progress=False)
    apart_tables, here_tables = _tables(tmp_path / "apart"), _tables(phantom_run)
    assert len(here_tables) >= 6 and apart_tables == here_tables
    for folder, in_this_process in ((tmp_path / "apart", False), (phantom_run, True)):
        timing = json.loads((folder / "evaluation_timing.json").read_text())
        assert (timing["process"] == os.getpid()) is in_this_process, folder
        assert {"inference_done", "gathered", "paper_tables_written"} <= set(timing["events"]["run"]), folder


def test_an_error_of_the_evaluation_in_its_process_is_raised_as_itself(tmp_path, phantom_cache):
    """An empty store: the child's error is the in-process error, type and message."""
    cfg = RunConfig.from_dict(tiny_run(tmp_path / "empty", eval_workers=0))
    here = RunEvaluation(cfg, progress=False)
    with pytest.raises(XBenchError) as expected:
        finish_here(here)
    here.close()
    child = EvaluationProcess(cfg, progress=False)
    try:
        with pytest.raises(type(expected.value)) as got:
            child.complete()
    finally:
        child.close()
    assert str(got.value) == str(expected.value) and "No results for dataset 'phantom'" in str(got.value)
    assert child.pid != os.getpid() and not child._process.is_alive()


def test_a_killed_evaluation_process_is_a_clear_error_and_close_stops_a_live_one(tmp_path, phantom_cache):
    cfg = RunConfig.from_dict(tiny_run(tmp_path / "run", eval_workers=0))
    child = EvaluationProcess(cfg, progress=False)
    os.kill(child.pid, signal.SIGKILL)
    with pytest.raises(XBenchError, match=r"evaluation process ended \(exit code -9\) before it wrote the tables"):
        child.complete()
    child.close()
    alive = EvaluationProcess(cfg, progress=False)
    alive.ready(0)  # messages before close are taken; close ends the child without tables
    alive.close()
    assert alive._process.exitcode == 0 and not (tmp_path / "run" / "tables").exists()


def test_eval_process_setting(tmp_path):
    def config(value):
        return RunConfig.from_dict(tiny_run(tmp_path / "x", eval_process=value))

    assert [apart(config(v)) for v in (True, False, "auto")] == [True, False, False]  # auto: CUDA runs only
    with pytest.raises(FormatError, match="eval_process"):
        config("sometimes")
    if torch.cuda.is_available():
        assert apart(RunConfig.from_dict(tiny_run(tmp_path / "x", device="cuda")))
