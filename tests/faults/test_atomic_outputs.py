"""Issue 12 item 10 (outputs): a read-only output folder is a clear error naming it before any inference, and a
full disk while `evaluate` writes its tables leaves no truncated file (every table goes through
`xbench.core.atomic`). (Old main: a raw PermissionError / OSError, and `curves.csv` left truncated.)"""
from __future__ import annotations

import errno
import os
import shutil
import tempfile
import warnings
from pathlib import Path

import pandas as pd
import pytest
from conftest import tiny_run

from xbench.spec.config import RunConfig
from xbench.core.errors import OutputError, XBenchError, XBenchWarning
from xbench.evaluation.evaluate import evaluate_run
from xbench.models.priors import CenterPrior
from xbench.workflows.run import run

pytestmark = pytest.mark.usefixtures("phantom_cache")


def config(out: Path) -> RunConfig:
    return RunConfig.from_dict(tiny_run(out, cases=12, models=["center_prior"], bootstrap={"replicates": 0}))


@pytest.fixture()
def read_only(tmp_path, monkeypatch) -> Path:
    """A read-only folder. chmod does not stop root, so under root creating files in it is refused as the
    kernel would refuse it (EACCES from mkstemp / open / mkdir inside it)."""
    folder = tmp_path / "readonly"
    folder.mkdir()
    folder.chmod(0o555)
    if os.geteuid() == 0:
        def denied(path) -> bool:
            return Path(path).resolve() == folder.resolve() or folder.resolve() in Path(path).resolve().parents

        real_mkstemp, real_mkdir = tempfile.mkstemp, Path.mkdir

        def mkstemp(*args, dir=None, **kwargs):
            if dir is not None and denied(dir):
                raise PermissionError(errno.EACCES, "Permission denied", str(dir))
            return real_mkstemp(*args, dir=dir, **kwargs)

        def mkdir(self, *args, **kwargs):
            if denied(self) and self.resolve() != folder.resolve():
                raise PermissionError(errno.EACCES, "Permission denied", str(self))
            return real_mkdir(self, *args, **kwargs)

        monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
        monkeypatch.setattr(Path, "mkdir", mkdir)
    yield folder
    folder.chmod(0o755)


def test_read_only_output_dir_is_named_before_inference(read_only, monkeypatch):
    calls = []
    monkeypatch.setattr(CenterPrior, "predict", lambda self, *a: calls.append(1))
    with pytest.raises(OutputError, match=rf"output_dir is not writable: {read_only}") as err:
        run(config(read_only), progress=False)
    assert isinstance(err.value, XBenchError) and calls == []


def test_disk_full_during_evaluate_leaves_no_truncated_table(tmp_path, monkeypatch):
    out = tmp_path / "run"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", XBenchWarning)
        run(config(out), progress=False)
    tables = out / "tables"
    before = {p.name: p.read_bytes() for p in tables.iterdir() if p.is_file()}  # tables/paper/: a folder
    real_to_csv = pd.DataFrame.to_csv

    def full_disk(self, path=None, *args, **kwargs):
        if path is not None and "curves" in Path(path).name:
            Path(path).write_bytes(b"model,dataset,fin")  # what fitted before the disk filled up
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_to_csv(self, path, *args, **kwargs)

    monkeypatch.setattr(pd.DataFrame, "to_csv", full_disk)
    with pytest.raises(OutputError, match=r"curves\.csv \(No space left on device\)"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", XBenchWarning)
            evaluate_run(config(out), progress=False)
    after = {p.name: p.read_bytes() for p in tables.iterdir() if p.is_file()}
    assert after["curves.csv"] == before["curves.csv"]  # the previous complete file, not a truncated one
    assert set(after) == set(before)  # no temporary left behind
    shutil.rmtree(out)
