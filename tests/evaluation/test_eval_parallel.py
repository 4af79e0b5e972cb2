"""Evaluation in parallel: the same bytes as serially, and the ground-truth cache (hit, miss, stale, damaged).

* the session's phantom run evaluated serially (``eval_workers: 0``) and by two worker processes writes
  byte-identical tables (every file evaluate_run writes);
* ground truth rasterised by a process pool over chunks of rows equals the serial loop bit for bit;
* the cache is served only when its key and payload digest match; a stale or damaged file is recomputed,
  rewritten and never served;
* an error in a worker names the (dataset, model); ``eval_workers`` is checked by the config schema.
"""
from __future__ import annotations

import functools
import json
import os
import time
import pickle
import shutil
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from conftest import copy_run, tiny_run
from xbench.core.errors import FormatError, XBenchError, XBenchWarning
from xbench.core.workers import process_pool, resolve_workers
from xbench.datasets import open_dataset
from xbench.evaluation import ground_truth as gtm
from xbench.evaluation.evaluate import PairError, _evaluate_pair_job, evaluate_run
from xbench.spec.config import RunConfig

pytestmark = pytest.mark.usefixtures("phantom_cache")

GRID = (64, 64)


def _evaluate(run_dir: Path, to: Path, workers: int | str, **changes) -> dict[str, bytes]:
    """Evaluate a copy of ``run_dir`` (tables and caches removed first) with ``workers`` (and config ``changes``);
    its tables' bytes."""
    out = copy_run(run_dir, to)
    shutil.rmtree(out / "tables", ignore_errors=True)
    shutil.rmtree(out / "cache" / "ground_truth", ignore_errors=True)
    (out / "evaluation_timing.json").unlink(missing_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", XBenchWarning)
        evaluate_run(RunConfig.from_dict(tiny_run(out, eval_workers=workers, **changes)), progress=False)
    return {str(p.relative_to(out / "tables")): p.read_bytes() for p in sorted((out / "tables").rglob("*")) if p.is_file()}


def test_serial_and_two_workers_write_byte_identical_tables(phantom_run, tmp_path):
    serial = _evaluate(phantom_run, tmp_path / "serial", 0)
    parallel = _evaluate(phantom_run, tmp_path / "parallel", 2)
    expected = {"metrics.csv", "metrics.parquet", "pairs.parquet", "curves.csv", "models.csv", "evaluation_log.json",
                "comparisons.csv", "ranks.csv"}
    assert expected <= set(serial) and set(serial) == set(parallel)
    differ = [name for name in serial if serial[name] != parallel[name]]
    assert differ == [], f"tables differ between serial and 2 workers: {differ}"
    # and the session run (eval_workers: auto) wrote the same bytes
    for name in ("metrics.csv", "curves.csv", "comparisons.csv", "ranks.csv", "evaluation_log.json"):
        assert (phantom_run / "tables" / name).read_bytes() == serial[name], name
    log = json.loads(serial["evaluation_log.json"])
    assert [e["model"] for e in log] == ["center_prior", "random_prior", "anatomical_prior"]
    for arm in ("serial", "parallel"):  # evaluate_run writes its timeline once, beside tables/ (never in it)
        events = json.loads((tmp_path / arm / "evaluation_timing.json").read_text())["events"]
        assert events["run"]["gathered"] <= events["run"]["tables_written"] and "ground_truth_done" in events["phantom"]


def test_pairs_evaluated_in_steps_write_the_serial_bytes(phantom_run, tmp_path, monkeypatch):
    """A large pair is split over the pool: grounding by groups of findings, the bootstrap by ranges of batches of
    replicates (each batch's case weights drawn anew in its worker). Forced here on the phantom's small pairs, with
    750 replicates (8 batches: ranges of 3, 3, 2): every table is the serial bytes, and the steps' files are gone
    after."""
    import tempfile

    import xbench.evaluation.evaluate as ev
    import xbench.evaluation.steps as st

    groups = []
    real = ev.pair_steps

    def recorded(*args, **kwargs):
        groups.append(args[6])
        return real(*args, **kwargs)

    serial = _evaluate(phantom_run, tmp_path / "serial", 0, bootstrap={"replicates": 750, "seed": 3})
    monkeypatch.setattr(st, "SPLIT_PAIRS", 1)
    monkeypatch.setattr(st, "PAIRS_PER_STEP", 6)
    monkeypatch.setattr(ev, "pair_steps", recorded)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    steps = _evaluate(phantom_run, tmp_path / "steps", 4, bootstrap={"replicates": 750, "seed": 3})
    assert len(groups) == 3 and all(len(g) > 1 for g in groups), groups  # every model's pair, in several steps
    assert all(sum(g, []) == list(range(6)) for g in groups)
    assert set(steps) == set(serial) and [n for n in serial if serial[n] != steps[n]] == []
    assert list((tmp_path / "tmp").iterdir()) == []  # the steps' private folder is removed
    groups.clear()
    assert _evaluate(phantom_run, tmp_path / "busy", 3, bootstrap={"replicates": 750, "seed": 3}) == serial
    assert groups == []  # as many pairs as workers: each pair is one job


def test_a_pair_in_steps_without_replicates_has_no_bootstrap_step(phantom_run, tmp_path, monkeypatch):
    """``bootstrap.replicates: 0`` in steps: grounding steps, then the head step alone (no replicates step); the
    tables, CIs empty, are the serial bytes."""
    import xbench.evaluation.steps as st

    serial = _evaluate(phantom_run, tmp_path / "serial", 0, bootstrap={"replicates": 0, "seed": 0})
    submitted = []
    real = st._replicates_job

    def counted(*args):
        submitted.append(args[-2:])
        return real(*args)

    monkeypatch.setattr(st, "SPLIT_PAIRS", 1)
    monkeypatch.setattr(st, "_replicates_job", counted)  # a local function: a replicates step would fail to pickle
    steps = _evaluate(phantom_run, tmp_path / "steps", 4, bootstrap={"replicates": 0, "seed": 0})
    assert [n for n in serial if serial[n] != steps[n]] == [] and set(steps) == set(serial)
    assert submitted == [] and st._batch_ranges(0) == []


def _same_rows(frame, back) -> None:
    """``back`` holds ``frame``'s columns, dtypes, and each value with its type (NaN equal to NaN)."""
    assert list(back.columns) == list(frame.columns) and list(back.dtypes) == list(frame.dtypes)
    for name in frame.columns:
        for a, b in zip(frame[name], back[name]):
            same = a == b if isinstance(a, str) else np.array_equal(a, b, equal_nan=np.asarray(a).dtype.kind == "f")
            assert type(a) is type(b) and same, (name, a, b)


def test_grounding_rows_round_trip_through_plain_arrays(tmp_path):
    """A grounding step's rows go to disk as plain arrays (no pickle) and come back as the same frame; a column of
    another kind is refused, not written approximately."""
    import pandas as pd

    from xbench.evaluation.steps import read_rows, write_rows

    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"case_id": ["a", "bb", "c"], "finding": ["Nodule"] * 3, "pointing": [1.0, np.nan, 0.0],
                          "gt_area": np.array([3, 0, 7]), "dice_curve": list(rng.random((3, 101))),
                          "hit": [True, False, True]})
    write_rows(tmp_path / "rows.npz", frame)
    _same_rows(frame, read_rows(tmp_path / "rows.npz"))
    for bad in ([None, "x", 1], ["a", "b\0", "c"], [np.zeros(2), np.zeros(3), np.zeros(2)]):
        with pytest.raises(TypeError, match="'note' holds values other than numbers, text or arrays of one shape"):
            write_rows(tmp_path / "bad.npz", frame.assign(note=bad))


def test_an_error_in_a_step_is_the_error_of_the_one_job_pair(phantom_run, tmp_path, monkeypatch):
    """A step that fails (here on a store chunk cut short, found by the grounding steps) fails the run with the
    error a one-job pair raises, naming the file; no table is written."""
    import xbench.evaluation.steps as st

    out = copy_run(phantom_run, tmp_path / "run")
    shutil.rmtree(out / "tables")
    chunk = out / "store" / "phantom" / "random_prior" / "chunk-00001.npz"
    chunk.write_bytes(chunk.read_bytes()[:40])
    messages = []
    for split in (10**9, 1):
        monkeypatch.setattr(st, "SPLIT_PAIRS", split)
        with warnings.catch_warnings(), pytest.raises(XBenchError, match=r"phantom/random_prior: chunk-00001") as err:
            warnings.simplefilter("ignore", XBenchWarning)
            evaluate_run(RunConfig.from_dict(tiny_run(out, eval_workers=4)), progress=False)
        messages.append(str(err.value))
        assert not (out / "tables" / "metrics.csv").exists()
    assert messages[0] == messages[1]


@pytest.fixture(scope="module")
def phantom(phantom_cache):
    return open_dataset(RunConfig.from_dict(tiny_run("unused")).datasets[0])


def _same(a: dict, b: dict) -> None:
    assert list(a) == list(b)
    for f in a:
        assert a[f].rows.dtype == b[f].rows.dtype and np.array_equal(a[f].rows, b[f].rows), f
        assert a[f].masks.dtype == bool and a[f].masks.shape == b[f].masks.shape, f
        assert np.array_equal(a[f].masks, b[f].masks) and a[f].no_region == b[f].no_region, f


def test_ground_truth_in_a_pool_equals_the_serial_loop_bit_for_bit(phantom, monkeypatch):
    serial = gtm.ground_truth(phantom, GRID, progress=False)
    assert sum(len(g.rows) for g in serial.values()) > 10  # there is something to compare
    monkeypatch.setattr(gtm, "MIN_CHUNK", 3)  # several chunks of the 22 cases
    with process_pool(2, preload=(gtm.__name__,)) as pool:
        pooled = gtm.ground_truth(phantom, GRID, progress=False, pool=pool, workers=2)
    _same(pooled, serial)


def _arrays_of(path: Path) -> dict:
    with np.load(path, allow_pickle=False) as z:
        return {name: z[name] for name in z.files}


def test_the_ground_truth_file_is_made_from_packed_chunks_with_the_serial_arrays(phantom, tmp_path, monkeypatch):
    """With a pool, ground_truth_file joins the workers' bit-packed chunks into the file that the serial loop
    writes (every array, key and digest equal) and never unpacks a mask in the calling process, made or found."""
    serial, serial_path, key, _ = gtm.cached_ground_truth(phantom, GRID, tmp_path / "serial", progress=False)
    monkeypatch.setattr(gtm, "MIN_CHUNK", 3)  # several chunks of the 22 cases
    monkeypatch.setattr(gtm, "_unpack_masks", lambda *a: pytest.fail("the calling process unpacked masks"))
    with process_pool(2, preload=(gtm.__name__,)) as pool:
        pairs, path, key2, status = gtm.ground_truth_file(phantom, GRID, tmp_path / "pool", pool=pool, workers=2,
                                                          progress=False)
    assert status == "miss" and key2 == key and path.name == serial_path.name
    assert pairs == {f: len(g.rows) for f, g in serial.items()} and sum(pairs.values()) > 10
    made, expected = _arrays_of(path), _arrays_of(serial_path)
    assert list(made) == list(expected)
    for name in expected:
        assert made[name].dtype == expected[name].dtype and np.array_equal(made[name], expected[name]), name
    assert gtm.ground_truth_file(phantom, GRID, tmp_path / "pool", progress=False)[::3] == (pairs, "hit")


def test_a_cache_file_whose_arrays_do_not_fit_the_grid_is_recomputed(phantom, tmp_path):
    """A file with a valid digest whose masks are not one packed row per grounding pair of the grid (what a bug
    writing it would leave) is damaged: recomputed, not served, with or without unpacking."""
    fresh, path, key, _ = gtm.cached_ground_truth(phantom, GRID, tmp_path, progress=False)
    arrays = gtm._arrays(fresh, packed=False)
    first = next(n for n in arrays if n.startswith("masks") and len(arrays[n]))
    gtm._write_arrays(path, key, {**arrays, first: arrays[first][:, :-1]})
    pairs, _, _, status = gtm.ground_truth_file(phantom, GRID, tmp_path, progress=False)
    assert status == "damaged" and pairs == {f: len(g.rows) for f, g in fresh.items()}
    gtm._write_arrays(path, key, {**arrays, first: arrays[first][1:]})
    served, _, _, status = gtm.cached_ground_truth(phantom, GRID, tmp_path, progress=False)
    assert status == "damaged"
    _same(served, fresh)


def test_cache_miss_then_hit_without_rasterising(phantom, tmp_path, monkeypatch):
    fresh, path, key, status = gtm.cached_ground_truth(phantom, GRID, tmp_path, options={"cases": 22}, progress=False)
    assert status == "miss" and path.is_file() and path.parent == tmp_path
    monkeypatch.setattr(gtm, "_rasterise_rows", lambda *a: pytest.fail("a cache hit must not rasterise"))
    served, path2, key2, status = gtm.cached_ground_truth(phantom, GRID, tmp_path, options={"cases": 22}, progress=False)
    assert status == "hit" and path2 == path and key2 == key
    _same(served, fresh)
    # another grid or other options: another file, computed (not served from this one)
    assert gtm.cache_file(tmp_path, phantom, (32, 32), {"cases": 22}) != path
    assert gtm.cache_file(tmp_path, phantom, GRID, {"cases": 23}) != path


def test_cache_round_trip_keeps_findings_without_pairs(tmp_path):
    """A finding with no grounding pair (0 rows) and an odd grid (bits not a multiple of 8) survive the cache."""
    rng = np.random.default_rng(0)
    grid = (5, 7)
    gt = {"A": gtm.GroundTruth(np.array([1, 4, 9]), rng.random((3, *grid)) < 0.5, 2),
          "B": gtm.GroundTruth(np.zeros(0, int), np.zeros((0, *grid), bool), 4)}
    key = {"grid": list(grid), "dataset": "x"}
    path = gtm.write_cache(tmp_path / "gt.npz", key, gt)
    _same(gtm.read_cache(path, key), gt)


@pytest.mark.parametrize("change", ["annotations", "code", "classes", "cases"])
def test_stale_cache_is_recomputed_not_served(phantom, tmp_path, change):
    fresh, path, key, _ = gtm.cached_ground_truth(phantom, GRID, tmp_path, progress=False)
    # a file made from other inputs, with other masks: what a stale file would serve
    other = {f: g._replace(masks=~g.masks) for f, g in fresh.items()}
    gtm.write_cache(path, {**key, change: "something else"}, other)
    with pytest.raises(gtm.CacheUnusable, match=rf"stale: .*{change} changed"):
        gtm.read_cache(path, key)
    served, _, _, status = gtm.cached_ground_truth(phantom, GRID, tmp_path, progress=False)
    assert status == "stale"
    _same(served, fresh)
    assert gtm.cached_ground_truth(phantom, GRID, tmp_path, progress=False)[3] == "hit"  # rewritten


def _flip_payload_byte(path: Path) -> None:
    """Change one byte of a mask array's data inside the (uncompressed) npz, keeping its length."""
    data = bytearray(path.read_bytes())
    with np.load(path) as z:
        packed = next(z[n] for n in z.files if n.startswith("masks") and z[n].size)
    at = bytes(data).find(packed.tobytes()[:64])
    assert at > 0
    data[at + 10] ^= 0xFF
    path.write_bytes(bytes(data))


DAMAGE = {
    "truncated": lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]),
    "empty": lambda p: p.write_bytes(b""),
    "not a zip": lambda p: p.write_bytes(b"hello" * 100),
    "flipped byte": _flip_payload_byte,
}


@pytest.mark.parametrize("kind", DAMAGE)
def test_damaged_cache_is_recomputed_not_served(phantom, tmp_path, kind):
    fresh, path, key, _ = gtm.cached_ground_truth(phantom, GRID, tmp_path, progress=False)
    DAMAGE[kind](path)
    with pytest.raises(gtm.CacheUnusable, match="damaged"):
        gtm.read_cache(path, key)
    served, _, _, status = gtm.cached_ground_truth(phantom, GRID, tmp_path, progress=False)
    assert status == "damaged"
    _same(served, fresh)
    assert gtm.cached_ground_truth(phantom, GRID, tmp_path, progress=False)[3] == "hit"


def test_evaluate_run_uses_and_repairs_the_run_cache(phantom_run, tmp_path):
    """A damaged cache file in a run folder: evaluate_run recomputes it and the tables do not change."""
    out = copy_run(phantom_run, tmp_path / "run")
    files = sorted((out / "cache" / "ground_truth").glob("phantom-test-64x64-*.npz"))
    assert len(files) == 1  # written by the session run
    files[0].write_bytes(files[0].read_bytes()[:100])
    before = (out / "tables" / "metrics.csv").read_bytes()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", XBenchWarning)
        evaluate_run(RunConfig.from_dict(tiny_run(out, eval_workers=0)), progress=False)
    assert (out / "tables" / "metrics.csv").read_bytes() == before
    phantom = open_dataset(RunConfig.from_dict(tiny_run(out)).datasets[0])
    assert gtm.cached_ground_truth(phantom, GRID, files[0].parent, options={"cases": 22}, progress=False)[3] == "hit"


def test_an_error_in_a_worker_names_dataset_and_model(phantom_run, phantom, tmp_path):
    cfg = RunConfig.from_dict(tiny_run(phantom_run))
    key = gtm.ground_truth_key(phantom, GRID, {"cases": 22})
    with pytest.raises(PairError, match=r"phantom × center_prior: FileNotFoundError") as err:
        _evaluate_pair_job(*gtm.shippable(phantom), cfg, "phantom", "center_prior", tmp_path / "absent.npz", key)
    copy = pickle.loads(pickle.dumps(err.value))  # what the parent receives from the worker
    assert isinstance(copy, XBenchError) and (copy.dataset, copy.model) == ("phantom", "center_prior")
    assert str(copy) == str(err.value)


def test_eval_workers_setting():
    assert RunConfig.from_dict(tiny_run("x")).eval_workers == "auto"
    assert RunConfig.from_dict(tiny_run("x", eval_workers=3)).eval_workers == 3
    for bad in ("many", -1, 1.5):
        with pytest.raises(FormatError, match="eval_workers"):
            RunConfig.from_dict(tiny_run("x", eval_workers=bad))
    assert resolve_workers("auto", 1) == 1 and resolve_workers(0, 5) == 1 and resolve_workers(8, 3) == 3


def test_a_script_without_a_main_guard_runs_once(tmp_path):
    """Pool workers do not import the caller's ``__main__``: an unguarded script is not run again in them."""
    import subprocess
    import sys

    script = tmp_path / "unguarded.py"
    script.write_text(
        "import os\n"
        "from xbench.core.workers import process_pool\n"
        "print('script body ran', flush=True)\n"
        "with process_pool(2) as pool:\n"
        "    pids = {f.result() for f in [pool.submit(os.getpid) for _ in range(4)]}\n"
        "print('workers', len(pids), 'parent' if os.getpid() in pids else 'separate', flush=True)\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("script body ran") == 1 and "separate" in done.stdout, done.stdout


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie, ended but not yet reaped, is not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


@pytest.mark.skipif(sys.version_info < (3, 11), reason="PYTHONSAFEPATH is Python 3.11+")
def test_workers_import_the_callers_code_not_a_checkout_in_the_working_folder(tmp_path):
    """A run started in a folder holding another `xbench` package: the fork server preloads the caller's XBench
    (it gets the caller's module path), not the folder's, so the workers run the caller's code. On the old code
    the server imported the folder's package first, and its workers kept it."""
    import subprocess

    here = tmp_path / "elsewhere"
    (here / "xbench").mkdir(parents=True)
    (here / "xbench" / "__init__.py").write_text("WRONG = True\n")
    script = tmp_path / "script" / "pool.py"
    script.parent.mkdir()
    script.write_text("import xbench\n"
                      "from xbench.core.workers import process_pool\n"
                      "if __name__ == '__main__':\n"
                      "    with process_pool(2, preload=('xbench.core.workers',)) as pool:\n"
                      "        print(xbench.__file__, pool.submit(eval, \"__import__('xbench').__file__\").result())\n")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    env.pop("PYTHONSAFEPATH", None)
    done = subprocess.run([sys.executable, str(script)], cwd=here, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    parent, worker = done.stdout.split()
    assert parent == worker == str(Path(__file__).resolve().parents[2] / "xbench" / "__init__.py")


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_workers_end_when_the_pools_owner_dies_without_shutting_it_down(tmp_path):
    """A process that dies with its pool open (killed, ``os._exit``, out of memory: a crashed rank) leaves no
    worker behind: the fork server's workers are not its children, and used to wait for jobs forever."""
    import subprocess
    import sys

    script = tmp_path / "dies.py"
    script.write_text(
        "import os, threading\n"
        "from xbench.core.workers import process_pool\n"
        "pool = process_pool(2, nice=1)\n"
        "jobs = [pool.submit(threading.Event().wait, 0.5) for _ in range(2)]  # two jobs at once: two workers\n"
        "print(*pool._processes, pool.submit(os.getppid).result(), flush=True)  # the workers, the fork server\n"
        "os._exit(0)\n")
    # Files, not pipes: workers left behind would hold a pipe open. Stderr apart: the resource tracker may report
    # the dead owner's semaphores there, at a moment of its own (the CI run of b994b9d read its line as a pid).
    with (tmp_path / "out.txt").open("w") as out, (tmp_path / "err.txt").open("w") as err:
        done = subprocess.run([sys.executable, str(script)], stdout=out, stderr=err, timeout=120,
                              cwd=Path(__file__).resolve().parents[2])
    printed = (tmp_path / "out.txt").read_text()
    assert done.returncode == 0, (printed, (tmp_path / "err.txt").read_text())
    pids = [int(x) for x in printed.split()]  # the workers and the fork server
    assert len(pids) == 3
    for _ in range(200):
        if not any(_running(pid) for pid in pids):
            break
        time.sleep(0.1)
    assert [pid for pid in pids if _running(pid)] == []


@pytest.mark.skipif(os.name != "posix", reason="the polling watch is POSIX-only")
def test_without_a_pidfd_a_worker_polls_for_its_owner(tmp_path):
    """Where ``os.pidfd_open`` is missing, the watch checks every second that the owner exists, and ends the
    worker once it is gone (here: this script plays the worker, a short ``sleep`` the owner)."""
    import subprocess
    import sys

    script = tmp_path / "poll.py"
    script.write_text(
        "import os, signal, subprocess, time\n"
        "from xbench.core import workers\n"
        "signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the owner is reaped at once, not left as a zombie\n"
        "del os.pidfd_open\n"
        "owner = subprocess.Popen(['sleep', '1']).pid\n"
        "workers._end_with(owner)\n"
        "time.sleep(30)\n"
        "print('still running', flush=True)\n")
    started = time.monotonic()
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 1 and "still running" not in done.stdout, (done.stdout, done.stderr)
    assert time.monotonic() - started < 25


def test_a_dataset_that_cannot_be_pickled_is_evaluated_in_process(phantom_run, tmp_path, monkeypatch, caplog):
    """A user loader holding a lambda cannot cross to a worker: its pairs run here, with a log line; same bytes."""
    import logging

    import xbench.evaluation.evaluate as ev

    real_open = ev.open_dataset

    def unpicklable(spec):
        dataset = real_open(spec)
        dataset.hook = lambda: None
        return dataset

    monkeypatch.setattr(ev, "open_dataset", unpicklable)
    with caplog.at_level(logging.INFO, logger="xbench.evaluation"):
        tables = _evaluate(phantom_run, tmp_path / "run", 2)
    assert "cannot be pickled" in caplog.text
    for name in ("metrics.csv", "curves.csv", "comparisons.csv", "ranks.csv", "evaluation_log.json"):
        assert (phantom_run / "tables" / name).read_bytes() == tables[name], name


def test_a_metric_registered_at_run_time_reaches_the_workers(phantom_run, tmp_path, monkeypatch):
    """docs/extending.md's metric function in a user module (on a folder added to sys.path after the fork server
    started), registered by a call at run time: the workers get the metric table and write the serial bytes."""
    import importlib
    import re
    import sys

    from xbench.metrics import table as metric_table

    with process_pool(1) as pool:  # the fork server runs before the folder is on sys.path
        pool.submit(int).result()
    doc = Path(__file__).resolve().parents[2] / "docs" / "extending.md"
    (code,) = re.findall(r"```python energy_pointing\.py\n(.*?)```", doc.read_text(), flags=re.S)
    function, call = code.split("\n\nENERGY = ")
    folder = tmp_path / "user_code"
    folder.mkdir()
    (folder / "xb_energy_metric.py").write_text(function + "\n")  # the function only: importing registers nothing
    monkeypatch.syspath_prepend(str(folder))
    saved = list(metric_table.METRIC_TABLE)
    try:
        module = importlib.import_module("xb_energy_metric")
        eval(call, vars(module))  # the doc's register(Metric(...)) call, made here at run time
        serial = _evaluate(phantom_run, tmp_path / "serial", 0)
        parallel = _evaluate(phantom_run, tmp_path / "parallel", 2)
    finally:
        metric_table.METRIC_TABLE[:] = saved
        sys.modules.pop("xb_energy_metric", None)
    assert b"energy_pointing" in serial["metrics.csv"]
    assert [n for n in serial if serial[n] != parallel[n]] == []


def _errors():
    import errno

    from xbench.core import errors as e

    return [e.FormatError("a.csv", "bad value", line=3, field="x"), e.MissingFileError("a.png", "image", "https://x"),
            e.UnknownNameError("model", "clp", ["clip"]), e.OutputError("/out/t.csv", OSError(errno.ENOSPC, "full")),
            e.StoreError("store/x/meta.json is damaged"), e.CheckpointError("missing keys"), XBenchError("plain")]


@pytest.mark.parametrize("error", _errors(), ids=lambda err: type(err).__name__)
def test_every_xbench_error_crosses_a_process_boundary_as_itself(error):
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error) and str(copy) == str(error) and copy.args == error.args
    assert copy.__dict__ == error.__dict__ and getattr(copy, "errno", None) == getattr(error, "errno", None)


def test_a_ground_truth_job_error_names_the_dataset_when_it_cannot_cross(phantom, monkeypatch):
    class Odd(Exception):  # a constructor that pickling cannot call again
        def __init__(self, a, b):
            super().__init__(f"{a}/{b}")

    def broken(*args):
        raise Odd(1, 2)

    monkeypatch.setattr(gtm, "_rasterise_rows", broken)
    with pytest.raises(XBenchError, match=r"phantom: ground truth of dataset rows 0–5: Odd: 1/2"):
        gtm._rasterise_job(*gtm.shippable(phantom), "phantom", np.arange(6), GRID, phantom.findings)


def test_a_run_evaluates_each_dataset_as_soon_as_it_is_inferred(tmp_path, monkeypatch):
    """``run`` hands each dataset to the evaluation (worker pool) from inside inference, before ``infer_run``
    returns; its model comparisons are computed by a worker once its pairs are done; the tables (comparisons
    included) are the bytes of evaluating the finished store afterwards, serially."""
    import os

    import xbench.workflows.run as workflow
    from xbench.evaluation.evaluate import RunEvaluation

    events: list[tuple] = []
    real_ready, real_infer, real_compare = RunEvaluation.ready, workflow.infer_run, RunEvaluation._submit_comparisons

    def compare(self):
        before = set(self.compared)
        real_compare(self)
        events.extend(("compared by a worker", i) for i in sorted(set(self.compared) - before))

    def ready(self, index):
        events.append(("ready", index, self.pool is not None))
        return real_ready(self, index)

    def infer(*args, **kwargs):
        got = real_infer(*args, **kwargs)
        events.append(("inferred",))
        return got

    monkeypatch.setattr(RunEvaluation, "ready", ready)
    monkeypatch.setattr(RunEvaluation, "_submit_comparisons", compare)
    monkeypatch.setattr(workflow, "infer_run", infer)
    out = tmp_path / "run"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", XBenchWarning)
        workflow.run(RunConfig.from_dict(tiny_run(out, eval_workers=2)), progress=False)
    assert events[:2] == [("ready", 0, True), ("inferred",)]
    assert ("compared by a worker", 0) in events
    overlapped = {p.name: p.read_bytes() for p in sorted((out / "tables").glob("*")) if p.is_file()}
    serial = _evaluate(out, tmp_path / "serial", 0)
    assert [n for n in serial if serial[n] != overlapped.get(n)] == []
    with process_pool(1, nice=3) as pool:  # the overlapped evaluation's workers yield the CPU to inference
        assert pool.submit(os.nice, 0).result() == os.nice(0) + 3
    timing = json.loads((out / "evaluation_timing.json").read_text())  # when each step happened, for profiles
    assert timing["workers"] == 2 and timing["created_unix"] > 0
    run_events, names = timing["events"].pop("run"), [d["name"] for d in tiny_run(out)["datasets"]]
    assert sorted(timing["events"]) == sorted(names)
    for name, ev in timing["events"].items():
        steps = ["ground_truth_started", "ground_truth_done", "pairs_submitted", "pairs_done", "comparisons_submitted",
                 "comparisons_done"]
        assert [s for s in steps if s in ev] == steps, name
        assert [ev[s] for s in steps] == sorted(ev[s] for s in steps), name
        assert ev["ready"] <= ev["pairs_submitted"] and ev["comparisons_done"] <= run_events["gathered"], name
    order = ["inference_done", "finish_called", "gathered", "tables_written", "paper_tables_written"]
    assert [run_events[s] for s in order] == sorted(run_events[s] for s in order)
    assert "evaluation_timing.json" not in {p.name for p in (out / "tables").iterdir()}  # timings stay out of tables


def test_paper_tables_written_by_workers_are_the_same_bytes_in_the_same_order(phantom_run, tmp_path, monkeypatch):
    """``write_paper_tables(pool=...)``: a worker makes and writes each table; the files are the bytes the serial
    writer gives (and the run wrote), the paths come back in the serial order, and each table's warnings are raised
    here, in table order."""
    from xbench.core import workers
    from xbench.outputs import tables

    out = copy_run(phantom_run, tmp_path / "run")
    paper = out / "tables" / "paper"
    by_run = {p.name: p.read_bytes() for p in sorted(paper.iterdir())}
    shutil.rmtree(paper)
    serial = tables.write_paper_tables(out)
    assert {p.name: p.read_bytes() for p in sorted(paper.iterdir())} == by_run and len(serial) == len(by_run) >= 12
    shutil.rmtree(paper)
    replayed = []
    real = workers.replay_warnings
    monkeypatch.setattr(workers, "replay_warnings",
                        lambda caught, registry=None: replayed.append(caught) or real(caught, registry))
    with process_pool(2) as pool:
        parallel = tables.write_paper_tables(out, pool=pool)
    assert parallel == serial
    assert {p.name: p.read_bytes() for p in sorted(paper.iterdir())} == by_run
    assert len(replayed) == len(serial) // 4  # one replay per table (4 files each)


def test_the_timeline_is_written_while_callbacks_still_mark_it(tmp_path):
    """Futures' callbacks mark the timeline from the pool's threads, possibly while ``write_timing`` runs: the
    file is written from a copy taken under a lock, so it is always whole JSON and marking never fails."""
    import threading

    from xbench.evaluation.evaluate import RunEvaluation

    evaluation = RunEvaluation(RunConfig.from_dict(tiny_run(tmp_path / "run", eval_workers=0)), progress=False)
    (tmp_path / "run").mkdir()
    stop, errors = threading.Event(), []

    def marker(k: int) -> None:
        try:
            i = 0
            while not stop.is_set():
                evaluation.mark(f"event_{i}", f"dataset_{k}_{i % 50}")
                evaluation._pair_done(f"dataset_{k}")
                i += 1
        except Exception as exc:  # pragma: no cover - what the test fails on
            errors.append(exc)

    threads = [threading.Thread(target=marker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    try:
        for _ in range(30):
            evaluation.write_timing()
            json.loads((tmp_path / "run" / "evaluation_timing.json").read_text())
    finally:
        stop.set()
        for t in threads:
            t.join()
        evaluation.close()
    assert errors == [] and len(evaluation.timing) > 4


def _two_dataset_config(two_datasets: list[dict], out: Path, workers: int) -> RunConfig:
    """Two priors on the phantom (10 cases) and phantom_b (12 cases, the larger), run order phantom first."""
    small, large = {**two_datasets[0], "cases": 10}, {**two_datasets[1], "cases": 12}
    return RunConfig.from_dict(tiny_run(out, models=["center_prior", "random_prior"], datasets=[small, large],
                                        num_workers=0, eval_workers=workers))


def test_rank_0_evaluates_the_largest_dataset_first_and_each_as_soon_as_its_store_is_full(tmp_path, two_datasets):
    """Rank 0 of a distributed run evaluates while the ranks infer (``watch_store``): ground truth is rasterised
    in the order the ranks infer in (``inference_order``: of two datasets of one image size the larger leads), and a
    dataset whose store is full has its pairs submitted
    right after its own ground truth, before the next dataset's is rasterised. The tables are the bytes of evaluating
    the same store serially."""
    from xbench.evaluation.evaluate import RunEvaluation
    from xbench.workflows.run import run

    config = functools.partial(_two_dataset_config, two_datasets)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", XBenchWarning)
        run(config(tmp_path / "run", 0), evaluate=False, progress=False)  # every rank's chunks are in the store
        serial = copy_run(tmp_path / "run", tmp_path / "serial")
        evaluate_run(config(serial, 0), progress=False)
        evaluation = RunEvaluation(config(tmp_path / "run", 2), progress=False, watch_store=True)
        try:
            evaluation.start()
            for _ in range(600):  # both datasets submitted by the background thread alone (finish readies the rest)
                if len(evaluation.items) == 2 or evaluation._thread is None or not evaluation._thread.is_alive():
                    break
                time.sleep(0.1)
            assert sorted(evaluation.items) == [0, 1]
            evaluation.finish()
            evaluation.write_timing()
        finally:
            evaluation.close()
    events = json.loads((tmp_path / "run" / "evaluation_timing.json").read_text())["events"]
    first, second = events["phantom_b"], events["phantom"]
    assert first["ground_truth_done"] <= first["pairs_submitted"] <= second["ground_truth_started"]
    tables = {p.name: p.read_bytes() for p in sorted((tmp_path / "run" / "tables").glob("*")) if p.is_file()}
    want = {p.name: p.read_bytes() for p in sorted((serial / "tables").glob("*")) if p.is_file()}
    assert tables.keys() == want.keys() and [n for n in want if tables[n] != want[n]] == []


def test_evaluate_run_with_a_pool_starts_the_largest_dataset_first(tmp_path, two_datasets):
    """``xbench evaluate`` (no thread ahead of it) with workers rasterises ground truth and submits pairs largest
    dataset first, so that the longest pairs start first; its tables are gathered in run order, the serial bytes.
    Serially the run order is kept (each dataset's tables are gathered as soon as its pairs are done)."""
    from xbench.workflows.run import run

    config = functools.partial(_two_dataset_config, two_datasets)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", XBenchWarning)
        run(config(tmp_path / "run", 0), evaluate=False, progress=False)
        serial = copy_run(tmp_path / "run", tmp_path / "serial")
        evaluate_run(config(serial, 0), progress=False)
        evaluate_run(config(tmp_path / "run", 2), progress=False)
    for out, first, second in ((tmp_path / "run", "phantom_b", "phantom"), (serial, "phantom", "phantom_b")):
        events = json.loads((out / "evaluation_timing.json").read_text())["events"]
        assert events[first]["pairs_submitted"] <= events[second]["ground_truth_started"], out.name
    tables = {p.name: p.read_bytes() for p in sorted((tmp_path / "run" / "tables").glob("*")) if p.is_file()}
    want = {p.name: p.read_bytes() for p in sorted((serial / "tables").glob("*")) if p.is_file()}
    assert tables.keys() == want.keys() and [n for n in want if tables[n] != want[n]] == []


def test_any_frame_of_numbers_text_and_arrays_round_trips_exactly(tmp_path_factory):
    """Fuzzed: grounding-row frames of numbers (with NaN and infinities), text (any characters but a trailing NUL)
    and per-row arrays of one shape come back from disk column for column, values, types and dtypes."""
    import pandas as pd
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as hs
    from hypothesis.extra import numpy as hnp

    from xbench.evaluation.steps import read_rows, write_rows

    folder = tmp_path_factory.mktemp("rows")
    text = hs.text(max_size=12).filter(lambda v: not v.endswith("\0"))

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(n=hs.integers(1, 6), data=hs.data())
    def check(n, data):
        floats = data.draw(hnp.arrays(np.float64, n, elements=hs.floats(allow_nan=True, allow_infinity=True)))
        ints = data.draw(hnp.arrays(np.int64, n, elements=hs.integers(-2**40, 2**40)))
        width = data.draw(hs.integers(0, 5))
        curves = data.draw(hnp.arrays(np.float64, (n, width), elements=hs.floats(allow_nan=True)))
        frame = pd.DataFrame({"case_id": data.draw(hs.lists(text, min_size=n, max_size=n)), "value": floats,
                              "area": ints, "flag": floats > 0, "curve": list(curves)})
        write_rows(folder / "rows.npz", frame)
        _same_rows(frame, read_rows(folder / "rows.npz"))

    check()


@pytest.mark.skipif(sys.version_info < (3, 11), reason="PYTHONSAFEPATH is Python 3.11+")
def test_a_process_started_with_same_imports_env_imports_this_xbench_not_the_working_folders(tmp_path):
    """What bench_gpu's torchrun ranks get: `python -m` / `-c` put the working folder first on the path; under
    same_imports_env a process started in a folder holding another `xbench` imports this one."""
    import subprocess

    import xbench
    from xbench.core.workers import same_imports_env

    (tmp_path / "xbench").mkdir()
    (tmp_path / "xbench" / "__init__.py").write_text("WRONG = True\n")
    probe = [sys.executable, "-c", "import xbench; print(xbench.__file__)"]
    plain = subprocess.run(probe, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert plain.stdout.strip() == str(tmp_path / "xbench" / "__init__.py")  # the hazard itself
    env = {**os.environ, **same_imports_env()}
    fixed = subprocess.run(probe, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert fixed.returncode == 0, fixed.stderr
    assert fixed.stdout.strip() == xbench.__file__
