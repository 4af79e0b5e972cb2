"""Issue 12 item 2: results of different inputs are never mixed.

ref_xattn shards made with different weights files are refused by `merge`, a resumed run after the weights
file changed is refused, and so is a store whose annotation file changed, each naming the differing fingerprint
key. (On the old main both were accepted silently:
`SHARD_KEYS` held no weights content and `meta.json` held the weights path only.)"""
from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import pytest
import torch
from conftest import tiny_run
from safetensors.torch import load_file, save_file

from xbench.spec.config import RunConfig
from xbench.datasets.chestx_det import ChestXDet10
from xbench.core.errors import XBenchError, XBenchWarning
from xbench.store.fingerprint import run_fingerprint
from xbench.spec.registry import dataset_manifest
from xbench.store.results import ResultStore
from xbench.workflows.run import merge, run

REFERENCE = Path(__file__).resolve().parents[2] / "xbench" / "reference_weights" / "ref_xattn"
KEY = "fingerprint.weights.model.safetensors"

pytestmark = pytest.mark.usefixtures("phantom_cache")


def weights_copy(folder: Path, *, perturb: bool) -> Path:
    """A copy of the committed ref_xattn weights; ``perturb`` shifts one tensor (another checkpoint)."""
    folder.mkdir(parents=True)
    shutil.copyfile(REFERENCE / "model.safetensors", folder / "model.safetensors")
    if perturb:
        perturb_in_place(folder / "model.safetensors")
    return folder


def perturb_in_place(path: Path) -> None:
    state = load_file(path)
    name = next(k for k, v in state.items() if v.is_floating_point())
    state[name] = state[name] + 0.5
    save_file(state, path)


def config(out: Path, weights: Path) -> RunConfig:
    return RunConfig.from_dict(tiny_run(out, cases=12, models=[{"name": "ref_xattn", "weights": str(weights)}],
                                        bootstrap={"replicates": 0}))


def quiet(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", XBenchWarning)
        return fn(*args, **kwargs)


def test_merge_refuses_shards_made_with_other_weights(tmp_path):
    torch.set_num_threads(1)
    a, b = weights_copy(tmp_path / "w_a", perturb=False), weights_copy(tmp_path / "w_b", perturb=True)
    quiet(run, config(tmp_path / "shard0", a), shard=(0, 2), progress=False)
    quiet(run, config(tmp_path / "shard1", b), shard=(1, 2), progress=False)
    with pytest.raises(XBenchError, match=rf"differs in {KEY}") as err:
        quiet(merge, config(tmp_path / "merged", a), [tmp_path / "shard0", tmp_path / "shard1"], progress=False)
    assert "shard1" in str(err.value)
    assert not (tmp_path / "merged" / "tables").exists()  # nothing evaluated from mixed shards


def test_resume_after_the_weights_file_changed_is_refused_unless_overwrite(tmp_path):
    torch.set_num_threads(1)
    weights = weights_copy(tmp_path / "w", perturb=False)
    cfg = config(tmp_path / "run", weights)
    quiet(run, cfg, shard=(0, 2), progress=False)  # interrupted: half the chunks
    perturb_in_place(weights / "model.safetensors")  # the checkpoint is replaced at the same path
    with pytest.raises(XBenchError, match=rf"differs in {KEY}.*--overwrite"):
        quiet(run, cfg, progress=False)
    quiet(run, cfg, progress=False, overwrite=True)  # recomputes every chunk with the new file
    assert (tmp_path / "run" / "tables" / "metrics.parquet").exists()


def test_a_changed_annotation_file_is_refused_by_the_store(tmp_path):
    def opened(syms: list[str]) -> ChestXDet10:
        boxes = [[1, 1, 4, 4]] * len(syms)
        (tmp_path / "test.json").write_text(json.dumps([{"file_name": "a.png", "syms": syms, "boxes": boxes}]))
        return ChestXDet10(tmp_path, "test", manifest={**dataset_manifest("chestx_det10"), "image_size": [8, 8]})

    def meta(ds) -> dict:
        return {"findings": ds.findings, "grid": [2, 2], "fingerprint": run_fingerprint(ds, "center_prior", None)}

    store = ResultStore(tmp_path / "run")
    store.prepare("chestx_det10", "center_prior", meta(opened([])))
    store.prepare("chestx_det10", "center_prior", meta(opened([])))  # same bytes: accepted
    with pytest.raises(XBenchError, match=r"differs in fingerprint\.annotations\.annotations"):
        store.prepare("chestx_det10", "center_prior", meta(opened(["Nodule"])))


def test_hashing_ahead_gives_the_same_sha256_once_and_a_changed_file_is_hashed_again(tmp_path, monkeypatch):
    """``hash_ahead`` hashes weight files in background threads; ``file_sha256`` takes that result (no second read),
    a file rewritten afterwards is hashed again, and an error of the thread is raised where the hash is asked for."""
    import hashlib
    import os

    from xbench.store import fingerprint

    files = [tmp_path / f"w{i}.bin" for i in range(3)]
    for i, f in enumerate(files):
        f.write_bytes(os.urandom(3 << 20) + bytes([i]))
    reads = []
    real_sha256 = fingerprint.sha256
    monkeypatch.setattr(fingerprint, "sha256", lambda path: reads.append(Path(path).name) or real_sha256(path))
    assert fingerprint.hash_ahead([*files, tmp_path / "absent.bin"]) == 3
    assert fingerprint.hash_ahead(files) == 0  # started already
    assert [fingerprint.file_sha256(f) for f in files] == [hashlib.sha256(f.read_bytes()).hexdigest() for f in files]
    assert sorted(reads) == ["w0.bin", "w1.bin", "w2.bin"]  # each file read once, by the threads
    assert fingerprint.hash_ahead(files) == 0  # hashed already

    files[0].write_bytes(b"another checkpoint")
    os.utime(files[0], ns=(1, 1))  # a new size and mtime: other bytes
    assert fingerprint.file_sha256(files[0]) == hashlib.sha256(b"another checkpoint").hexdigest()

    def unreadable(path):
        raise PermissionError(f"cannot read {path}")

    monkeypatch.setattr(fingerprint, "sha256", unreadable)
    bad = tmp_path / "bad.bin"
    bad.write_bytes(b"x")
    assert fingerprint.hash_ahead([bad]) == 1
    with pytest.raises(PermissionError, match="bad.bin"):
        fingerprint.file_sha256(bad)
