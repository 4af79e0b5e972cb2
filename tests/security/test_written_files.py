"""Run folders read back (``evaluate``, ``report``, ``merge --from``, ``score --compare-with``), one lock per output
folder, and containment of the folders XBench writes: every hostile case is one ``xbench: error:`` line naming the
file and field, with no traceback, or is refused before work (old main: tracebacks, hangs, writes outside the
folder, two runs interleaved in one store).

Each command runs in a subprocess (``python -m xbench.cli``) under a time limit and an address-space cap, so a hang
or a large allocation fails the test instead of the machine."""
from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
import yaml

from conftest import copy_run, tiny_run

import xbench as _xbench

ROOT = Path(_xbench.__file__).resolve().parents[1]  # the subprocesses run the XBench this test imported
LIMIT_S = 120
AS_BYTES = 12 << 30  # torch's libraries reserve a few GiB of address space; 3 GiB allocations still fail


def _cap() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (AS_BYTES, AS_BYTES))


def xbench(*args: str, env: dict | None = None, timeout: float = LIMIT_S) -> subprocess.CompletedProcess:
    """``xbench ARGS`` in a subprocess of this checkout (capped, timed; a time-out is returned as rc None)."""
    environ = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", **(env or {})}
    try:
        return subprocess.run([sys.executable, "-m", "xbench.cli", *args], capture_output=True, text=True,
                              env=environ, timeout=timeout, preexec_fn=_cap, cwd=ROOT)
    except subprocess.TimeoutExpired as exc:
        return subprocess.CompletedProcess(exc.cmd, None, exc.stdout or "", f"TIMED OUT after {timeout} s")


def one_error_line(proc: subprocess.CompletedProcess, *words: str) -> str:
    """The command failed with exit 2 and exactly one stderr line ``xbench: error: …`` holding ``words``."""
    lines = [line for line in proc.stderr.splitlines() if line.strip() and "Warning" not in line
             and not line.startswith("  warnings.warn")]
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in lines if line.startswith("xbench: error: ")]
    assert len(errors) == 1, proc.stderr[-3000:]
    for word in words:
        assert word in errors[0], (word, errors[0])
    return errors[0]


@pytest.fixture()
def run_copy(phantom_run, tmp_path) -> dict:
    out = copy_run(phantom_run, tmp_path / "run")
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(tiny_run(out)))
    return {"out": out, "config": config, "folder": out / "store" / "phantom" / "center_prior"}


def _rewrite_meta(folder: Path, **changes) -> dict:
    """Edit a store folder's meta.json and re-index its chunks for it (as a forger would: the index is a checksum)."""
    from xbench.store.results import ResultStore

    meta = json.loads((folder / "meta.json").read_text())
    meta.update(changes)
    (folder / "meta.json").write_text(json.dumps(meta))
    store = ResultStore(folder.parents[2])
    for chunk in sorted(folder.glob("chunk-*.npz")):
        store._write_index(chunk, meta)
    return meta


# -- meta.json / evaluation_log.json of odd types: one line naming file and field -------------------------------
@pytest.mark.parametrize("field, value", [("grid", [64, "x"]), ("chunk_size", "eight"), ("findings", {"a": 1})])
def test_odd_meta_json_types_are_one_line_naming_file_and_field(run_copy, field, value):
    meta = json.loads((run_copy["folder"] / "meta.json").read_text())
    meta[field] = value
    (run_copy["folder"] / "meta.json").write_text(json.dumps(meta))
    proc = xbench("evaluate", "--config", str(run_copy["config"]), "--quiet")
    one_error_line(proc, "meta.json", f"'{field}'")


@pytest.mark.parametrize("log", [{"not": "a list"}, [{"dataset": "phantom", "model": "m", "pairs": {"Nodule": 3}}],
                                 [{"dataset": 5, "model": "m"}]])
def test_a_malformed_evaluation_log_is_one_line_naming_it(run_copy, log, tmp_path):
    (run_copy["out"] / "tables" / "evaluation_log.json").write_text(json.dumps(log))
    proc = xbench("report", "--run", str(run_copy["out"]), "--out", str(tmp_path / "r.html"), "--quiet")
    one_error_line(proc, "evaluation_log.json")


# -- sizes from meta.json bounded by the files; only regular files ---------------------------------------------
def test_a_huge_chunk_size_does_not_license_a_decompression_bomb(run_copy):
    """``chunk_size: 10⁹`` in the folder's own meta.json next to a chunk of a few KB whose zstd frames declare 8 MB of
    maps: refused from the frames' headers (file-size bound), one line naming the chunk."""
    from xbench.store.results import ResultStore, encode_chunk

    folder = run_copy["folder"]
    meta = _rewrite_meta(folder, chunk_size=10**9)
    chunk = folder / "chunk-00000.npz"
    n = 1000
    chunk.write_bytes(encode_chunk({
        "case_ids": np.array([f"c{i}" for i in range(n)]), "scores": np.zeros((n, len(meta["findings"])), np.float32),
        "probs": np.zeros((n, len(meta["findings"])), np.float32),
        "maps": np.zeros((n, len(meta["findings"]), *meta["grid"]), np.float16),
        "sizes": np.zeros((n, 2), np.int64), "windows": np.zeros((n, 4)), "skipped_ids": np.array([], "U1"),
        "skipped_reasons": np.array([], "U1")}))
    ResultStore(run_copy["out"])._write_index(chunk, meta)
    assert chunk.stat().st_size < 200_000
    proc = xbench("evaluate", "--config", str(run_copy["config"]), "--quiet",
                  env={"XBENCH_MIN_EXPANDED_BYTES": str(1 << 20)})
    one_error_line(proc, "chunk-00000.npz", "maps_shape")


@pytest.mark.parametrize("what", ["index fifo", "meta dev-zero", "chunk link out"])
def test_a_fifo_device_or_link_out_in_a_run_folder_is_refused_by_name(run_copy, tmp_path, what):
    folder = run_copy["folder"]
    if what == "index fifo":
        target = folder / "chunk-00001.index.json"
        target.unlink()
        os.mkfifo(target)
    elif what == "meta dev-zero":
        target = folder / "meta.json"
        target.unlink()
        target.symlink_to("/dev/zero")
    else:
        target = folder / "chunk-00001.npz"
        outside = tmp_path / "elsewhere.npz"
        outside.write_bytes(target.read_bytes())
        target.unlink()
        target.symlink_to(outside)
    proc = xbench("report", "--run", str(run_copy["out"]), "--out", str(tmp_path / "r.html"), "--quiet")
    one_error_line(proc, target.name)


def test_merge_from_a_folder_with_a_fifo_chunk_index_is_refused(run_copy, tmp_path):
    source = run_copy["out"]
    index = run_copy["folder"] / "chunk-00000.index.json"
    index.unlink()
    os.mkfifo(index)
    config = tmp_path / "merged.yaml"
    config.write_text(yaml.safe_dump(tiny_run(tmp_path / "merged")))
    proc = xbench("merge", "--config", str(config), "--from", str(source), "--quiet")
    one_error_line(proc, "chunk-00000.index.json")


def _bomb_npz(path: Path, declared: int) -> None:
    """An .npz whose one member is an .npy header of ``declared`` uint8 values and that many zero bytes, deflated
    (about 1/1000 of it on disk): a real decompression bomb."""
    header = "{'descr': '|u1', 'fortran_order': False, 'shape': (%d,), }" % declared
    header += " " * (118 - len(header)) + "\n"
    head = b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode()
    deflate, crc, raw = zlib.compressobj(1, zlib.DEFLATED, -15), zlib.crc32(head), bytearray()
    raw += deflate.compress(head)
    block = bytes(1 << 20)
    for _ in range(declared >> 20):
        crc = zlib.crc32(block, crc)
        raw += deflate.compress(block)
    raw += deflate.flush()
    name = b"masks0.npy"  # written by hand: local header, the deflated bytes as they are, central directory, end
    local = (b"PK\x03\x04" + (20).to_bytes(2, "little") + bytes(2) + (8).to_bytes(2, "little") + bytes(4)
             + crc.to_bytes(4, "little") + len(raw).to_bytes(4, "little") + (len(head) + declared).to_bytes(4, "little")
             + len(name).to_bytes(2, "little") + bytes(2) + name)
    central = (b"PK\x01\x02" + (20).to_bytes(2, "little") + (20).to_bytes(2, "little") + bytes(2)
               + (8).to_bytes(2, "little") + bytes(4) + crc.to_bytes(4, "little") + len(raw).to_bytes(4, "little")
               + (len(head) + declared).to_bytes(4, "little") + len(name).to_bytes(2, "little") + bytes(12) + bytes(4)
               + name)
    end = (b"PK\x05\x06" + bytes(4) + (1).to_bytes(2, "little") * 2 + len(central).to_bytes(4, "little")
           + (len(local) + len(raw)).to_bytes(4, "little") + bytes(2))
    path.write_bytes(local + bytes(raw) + central + end)


def test_a_ground_truth_cache_bomb_is_refused_before_allocating(tmp_path):
    """A cache file whose member inflates to 400 MB from ~400 KB: not served (damaged), nothing near that allocated."""
    import tracemalloc

    from xbench.evaluation.ground_truth import CacheUnusable, load_cache

    path = tmp_path / "phantom-test-64x64-0123456789.npz"
    _bomb_npz(path, 400 << 20)
    assert path.stat().st_size < 2 << 20
    tracemalloc.start()
    try:
        with pytest.raises(CacheUnusable) as err:
            load_cache(path, {"grid": [64, 64]})
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert err.value.reason == "damaged" and peak < 64 << 20


# -- one lock per output folder ---------------------------------------------------------------------------------
def _hold_lock(folder: Path) -> subprocess.Popen:
    folder.mkdir(parents=True, exist_ok=True)
    code = ("import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
            "fcntl.flock(fd, fcntl.LOCK_EX); os.write(fd, str(os.getpid()).encode()); print('held', flush=True); "
            "time.sleep(120)")
    holder = subprocess.Popen([sys.executable, "-c", code, str(folder / ".xbench.lock")], stdout=subprocess.PIPE,
                              text=True)
    assert holder.stdout.readline().strip() == "held"
    return holder


@pytest.mark.parametrize("command", ["evaluate", "run", "merge"])
def test_a_second_command_on_a_locked_folder_refuses_with_one_line(run_copy, command):
    holder = _hold_lock(run_copy["out"])
    try:
        extra = ["--from", str(run_copy["out"])] if command == "merge" else []
        proc = xbench(command, "--config", str(run_copy["config"]), "--quiet", *extra)
    finally:
        holder.kill()
        holder.wait()
    one_error_line(proc, str(run_copy["out"]), "in use by another XBench process", f"pid {holder.pid}")


@pytest.mark.parametrize("cases", [4, 24])
def test_two_runs_on_one_folder_one_refuses_and_the_store_holds_each_case_once(tmp_path, cases):
    """The probe's scenario: two `xbench run` started together on one folder (4 cases: both used to exit 0 with every
    case stored twice; 24: both used to fail with a misleading shape error). Now one runs, the other refuses."""
    out = tmp_path / "out"
    raw = tiny_run(out, cases=cases, models=["center_prior"])
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(raw))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    procs = [subprocess.Popen([sys.executable, "-m", "xbench.cli", "run", "--config", str(config), "--quiet"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
             for _ in range(2)]
    results = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
    codes = sorted(code for code, _ in results)
    refused = [err for code, err in results if code == 2]
    assert codes == [0, 2] or codes == [0, 0], results  # [0, 0]: the second started after the first had finished
    if codes == [0, 2]:
        assert "in use by another XBench process" in refused[0] and "Traceback" not in refused[0]
    from xbench.store.results import ResultStore

    preds = ResultStore(out).read("phantom", "center_prior")
    ids = preds.case_ids.tolist() + list(preds.skipped)
    assert len(ids) == len(set(ids)) == cases


# -- containment by real paths ----------------------------------------------------------------------------------
@pytest.mark.parametrize("sub", ["store", "tables"])
def test_a_written_folder_that_is_a_link_is_refused(tmp_path, sub):
    out, outside = tmp_path / "out", tmp_path / "outside"
    out.mkdir()
    outside.mkdir()
    (out / sub).symlink_to(outside)
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(tiny_run(out, cases=4, models=["center_prior"])))
    proc = xbench("run", "--config", str(config), "--quiet")
    one_error_line(proc, str(out / sub), "symbolic link")
    assert not any(outside.iterdir())


def test_an_exports_folder_that_is_a_link_is_refused(run_copy, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (run_copy["out"] / "exports").symlink_to(outside)
    proc = xbench("export", "--run", str(run_copy["out"]), "--quiet")
    one_error_line(proc, "exports", "symbolic link")
    assert not any(outside.iterdir())


def test_score_into_a_folder_whose_store_is_a_link_is_one_line(run_copy, tmp_path):
    out, outside = tmp_path / "scored", tmp_path / "outside"
    out.mkdir()
    outside.mkdir()
    (outside / "keep.txt").write_text("not XBench's")
    (out / "store").symlink_to(outside)
    (out / "score_inputs.json").write_text("{}")
    from xbench.store.results import ResultStore

    stored = ResultStore(run_copy["out"]).read("phantom", "anatomical_prior")
    findings = stored.meta["findings"]
    maps = tmp_path / "maps.npz"
    np.savez(maps, maps=stored.maps.astype(np.float32), case_ids=stored.case_ids, classes=np.asarray(findings),
             probs=stored.probs)
    proc = xbench("score", "--maps", str(maps), "--dataset", "phantom", "--option", "cases=22", "--grid", "64", "64",
                  "--name", "scored", "--output-dir", str(out), "--quiet")
    one_error_line(proc, "store", "symbolic link")
    assert (outside / "keep.txt").exists()


def test_overwrite_of_an_immutable_store_folder_is_one_line(run_copy):
    folder = run_copy["folder"]
    if subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not available here (needs root and a file system with attributes)")
    try:
        proc = xbench("run", "--config", str(run_copy["config"]), "--overwrite", "--quiet")
    finally:
        subprocess.run(["chattr", "-i", str(folder)], capture_output=True)
    one_error_line(proc, "center_prior", "--overwrite")
