"""Hypothesis fuzzing of the files XBench writes and reads back (:mod:`xbench.core.files`): a decode-cache entry
(its seal recomputed after each mutation, as a forger would: a seal is a checksum, not a signature), a ground-truth
cache file, a store ``meta.json`` next to an intact chunk (run folders of ``--compare-with`` / ``merge --from`` /
``report``) and an ``evaluation_log.json``. Each mutated file is read by a worker subprocess under the memory ceiling
and time limit of ``test_fuzz_inputs.py``; it must be read, or refused with an ``XBenchError`` — never a crash, a hang,
a large allocation, or a wrong-shaped input served."""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from test_fuzz_inputs import EDIT, EXAMPLES, ROOT, Worker, _mutate
from xbench.core.files import seal
from xbench.evaluation.ground_truth import _write_arrays
from xbench.store.results import encode_chunk


class WrittenWorker(Worker):
    def __init__(self):  # Worker's protocol, with fuzz_written_worker.py's readers
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("fuzz_written_worker.py"))],
                                     env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
        ready = self._answer(120)
        assert ready["status"] == "ready", ready
        self.count = 0


META = {"findings": ["Nodule", "Effusion", "Mass"], "grid": [5, 7], "chunk_size": 4, "n_cases": 4}


def _chunk() -> bytes:
    rng = np.random.default_rng(0)
    return encode_chunk({"case_ids": np.array(["a", "b", "c", "d"]), "scores": rng.random((4, 3), np.float32),
                         "probs": rng.random((4, 3), np.float32), "maps": rng.random((4, 3, 5, 7)).astype(np.float16),
                         "sizes": np.full((4, 2), 512), "windows": np.zeros((4, 4)), "skipped_ids": np.array(["e"]),
                         "skipped_reasons": np.array(["MissingFileError: gone"])})


def _seeds(folder: Path) -> dict[str, tuple[str, str, bytes]]:
    npy = io.BytesIO()
    np.save(npy, np.linspace(0, 1, 192, dtype=np.float32).reshape(3, 8, 8))
    gt = folder / "gt.npz"
    rows = np.array([0, 2], np.int64)
    _write_arrays(gt, {"grid": [8, 8], "dataset": "fuzz"},
                  {"findings": np.array(["Nodule"]), "rows0": rows, "masks0": np.full((2, 8), 7, np.uint8),
                   "no_region0": np.array(1)})
    log = [{"dataset": "phantom", "model": "m", "cases": 4, "cases_skipped_at_inference": 1,
            "pairs": {"Nodule": {"evaluated": 2, "missing_prediction": 0, "positive_without_region": 1}}}]
    return {"cache entry": ("cache entry", f"{'ab' * 32}.sealed.npy", npy.getvalue()),
            "ground truth": ("ground truth", "phantom-test-8x8-0123456789.npz", gt.read_bytes()),
            "meta": ("meta", "meta.json", json.dumps(META).encode()),
            "evaluation log": ("evaluation log", "evaluation_log.json", json.dumps(log).encode())}


@pytest.fixture(scope="module")
def worker():
    w = WrittenWorker()
    yield w
    w.close()


@pytest.mark.parametrize("seed", ["cache entry", "ground truth", "meta", "evaluation log"])
def test_mutated_written_files_end_in_a_result_or_an_xbench_error(seed, worker, tmp_path_factory):
    kind, name, data = _seeds(tmp_path_factory.mktemp("seeds"))[seed]
    folder = tmp_path_factory.mktemp("fuzz")
    where = folder / "entries" / ("k" * 20) / "ab" if kind == "cache entry" else folder
    where.mkdir(parents=True, exist_ok=True)
    chunk = _chunk()
    seen: dict[str, int] = {}

    @settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(edits=st.lists(EDIT, min_size=1, max_size=4), cut=st.one_of(st.none(), st.integers(0, len(data))))
    def check(edits, cut):
        path = where / name
        mutated = _mutate(data, edits, cut)
        path.write_bytes(seal(mutated, f"{'k' * 20}/{'ab' * 32}") if kind == "cache entry" else mutated)
        if kind == "meta":
            (where / "chunk-00000.npz").write_bytes(chunk)
        answer = worker.read(kind, path)
        assert answer["status"] in ("ok", "refused"), f"{seed} {edits} cut={cut}: {answer['detail']}"
        seen[answer["status"]] = seen.get(answer["status"], 0) + 1

    check()
    assert seen.get("refused", 0) > 0, seen  # the mutations do reach the readers' checks
