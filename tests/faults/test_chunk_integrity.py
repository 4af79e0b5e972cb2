"""Issue 12 item 5: a truncated, emptied or object-array chunk, or a broken meta.json, is detected (size + sha256 in
the chunk index), reported by file name and recomputed on rerun — never a raw BadZipFile / EOFError /
JSONDecodeError, and never unpickled. (Old main: `has_chunk` checked existence only, every rerun crashed.)"""
from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import tiny_run

from xbench.spec.config import RunConfig
from xbench.core.errors import XBenchError, XBenchWarning
from xbench.evaluation.evaluate import evaluate_run
from xbench.store.fingerprint import file_sha256
from xbench.models.priors import RandomPrior
from xbench.store.results import ResultStore
from xbench.workflows.run import run

pytestmark = pytest.mark.usefixtures("phantom_cache")


def config(out: Path) -> RunConfig:
    return RunConfig.from_dict(tiny_run(out, models=["center_prior", "random_prior"], bootstrap={"replicates": 0}))


def quiet_run(cfg: RunConfig) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", XBenchWarning)
        run(cfg, progress=False)


@pytest.fixture(scope="module")
def base(tmp_path_factory, phantom_cache) -> Path:
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("chunks-base")
    quiet_run(config(out))
    return out


def copy(base: Path, tmp_path: Path) -> Path:
    shutil.copytree(base, tmp_path / "run")
    return tmp_path / "run"


def metrics(out: Path) -> pd.DataFrame:
    return pd.read_parquet(out / "tables" / "metrics.parquet")


def object_chunk(path: Path) -> None:
    """Rewrite a chunk with an object array (a pickle inside the .npz)."""
    with np.load(path) as data:
        arrays = {k: data[k] for k in data.files}
    arrays["case_ids"] = np.array(arrays["case_ids"].tolist(), dtype=object)
    np.savez(path, allow_pickle=True, **arrays)


DAMAGE = {
    "truncated": lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]),
    "empty": lambda p: p.write_bytes(b""),
    "object array": object_chunk,
}


@pytest.mark.parametrize("kind", DAMAGE)
def test_damaged_chunk_is_named_and_recomputed_on_rerun(base, tmp_path, kind):
    out = copy(base, tmp_path)
    chunk = out / "store" / "phantom" / "center_prior" / "chunk-00001.npz"
    DAMAGE[kind](chunk)
    with pytest.raises(XBenchError, match=r"chunk-00001\.npz.*xbench run"):  # evaluate alone: named, no raw error
        evaluate_run(config(out), progress=False)
    with pytest.warns(XBenchWarning, match=r"chunk-00001\.npz.*recomputed"):
        run(config(out), progress=False)
    pd.testing.assert_frame_equal(metrics(out), metrics(base))


def test_object_array_with_a_forged_index_is_refused_without_unpickling(base, tmp_path):
    out = copy(base, tmp_path)
    store = ResultStore(out)
    chunk = store.chunk_path("phantom", "center_prior", 0)
    object_chunk(chunk)
    index = store.index_path(chunk)
    entry = json.loads(index.read_text())
    entry.update(size=chunk.stat().st_size, sha256=file_sha256(chunk))  # the attacker also fixes the index
    index.write_text(json.dumps(entry))
    with pytest.raises(XBenchError, match=r"chunk-00000\.npz.*(cannot be read|dtype object)"):
        store.read("phantom", "center_prior")


def test_broken_meta_is_named_then_rewritten_keeping_intact_chunks(base, tmp_path, monkeypatch):
    out = copy(base, tmp_path)
    meta = out / "store" / "phantom" / "random_prior" / "meta.json"
    meta.write_text(meta.read_text()[:40])
    with pytest.raises(XBenchError, match=r"random_prior/meta\.json is damaged"):
        evaluate_run(config(out), progress=False)
    calls = []
    original = RandomPrior.predict_cases
    monkeypatch.setattr(RandomPrior, "predict_cases", lambda self, *a: calls.append(1) or original(self, *a))
    with pytest.warns(XBenchWarning, match=r"meta\.json is damaged"):
        run(config(out), progress=False)
    assert calls == []  # the chunks' index names the same inputs: nothing recomputed
    pd.testing.assert_frame_equal(metrics(out), metrics(base))
