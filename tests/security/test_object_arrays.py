"""Issue 20 item 1: no numpy object array is ever built from a file (a forged pointer would be dereferenced).

A pickle whose numpy dtype state adds an object field to a ``V8`` dtype (flags saying "no list pickle") makes
numpy copy the array's 8 raw bytes in as a ``PyObject*``. On a7aa795 the cheXlocalize reader died with signal 11 and a checkpoint loaded the array
silently. Each case runs in a subprocess, so a crash fails the test instead of the test session."""
from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]


class ForgedDtype:
    """``numpy.dtype('V8')`` whose pickled state gives it an object field while its flags claim no list pickle."""

    def __reduce__(self):
        return (np.dtype, ("V8", False, True), (3, "|", None, ("a",), {"a": (np.dtype("O"), 0)}, 8, 1, 0))


class ForgedObjectArray:
    """Pickles as ``_reconstruct(ndarray, (0,), b'b')`` + BUILD ``(1, (1,), <forged dtype>, False, <address>)``:
    numpy copies the 8 raw bytes into the array as a ``PyObject*``."""

    def __reduce__(self):
        return (np._core.multiarray._reconstruct, (np.ndarray, (0,), b"b"),
                (1, (1,), ForgedDtype(), False, (0x4141414141414141).to_bytes(8, "little")))


def _run(code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)


def test_chexlocalize_pickle_with_a_forged_object_array_is_refused(tmp_path):
    path = tmp_path / "patient1_study1_view1_frontal_Edema_map.pkl"
    path.write_bytes(pickle.dumps({"map": ForgedObjectArray(), "prob": 0.5}, protocol=4))
    done = _run(f"from xbench.workflows.score import read_chexlocalize_pickle\nfrom xbench.core.errors import XBenchError\n"
                f"try:\n    read_chexlocalize_pickle({str(path)!r})\nexcept XBenchError as e:\n    print('REFUSED', e)\n")
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])  # -11 on a7aa795
    assert "REFUSED" in done.stdout and path.name in done.stdout and "is not admitted" in done.stdout, done.stdout


def test_checkpoint_with_a_forged_object_array_is_refused(tmp_path):
    path = tmp_path / "model.pth"
    torch.save({"w": torch.ones(2), "extra": ForgedObjectArray()}, path)
    done = _run(f"from xbench.models.base import load_checkpoint\nfrom xbench.core.errors import CheckpointError\n"
                f"try:\n    load_checkpoint({str(path)!r})\n    print('LOADED')\n"
                f"except CheckpointError as e:\n    print('REFUSED', e)\n")
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert "REFUSED" in done.stdout and "model.pth" in done.stdout and "is not admitted" in done.stdout, done.stdout


def test_plain_numeric_arrays_and_scalars_still_load(tmp_path):
    """What stays admitted: numeric arrays (C and Fortran order, big-endian, protocol 2 and 5) and scalars."""
    from xbench.models.checkpoint import load_pickle

    values = {"f": np.arange(6.0).reshape(2, 3), "F": np.asfortranarray(np.arange(6).reshape(2, 3)),
              "be": np.arange(3, dtype=">i4"), "c": np.array([1 + 2j]), "b": np.array([True, False]),
              "s": np.float32(2.5), "i": np.int64(-3)}
    for protocol in (2, 4, 5):
        path = tmp_path / f"p{protocol}.pkl"
        path.write_bytes(pickle.dumps(values, protocol=protocol))
        with open(path, "rb") as fh:
            got, replaced = load_pickle(fh, str(path))
        assert replaced == []
        for key, want in values.items():
            assert np.asarray(got[key]).dtype == np.asarray(want).dtype and np.array_equal(got[key], want), key
