"""The grounding numbers are the same bits under every BLAS configuration (threads, kernel).

Each setting runs in a fresh interpreter, because OpenBLAS reads ``OPENBLAS_NUM_THREADS`` and
``OPENBLAS_CORETYPE`` once, when it loads. The child reports the kernel and thread count
threadpoolctl sees, so a setting that did not take effect fails here instead of passing vacuously.
About 20 s on an idle 2-core machine (five interpreters that import torch, one pytest run).
"""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

import xbench

ROOT = Path(xbench.__file__).resolve().parents[1]

#: the numbers a table depends on: upsampled maps (several ratios, down-sampling too), Dice/IoU
#: curves (counts), the best τ, the pointing game, the fixed-τ Dice
_CHILD = r"""
import hashlib, json
import numpy as np
from threadpoolctl import threadpool_info
from xbench.metrics import best_threshold, dice_iou_curves, grounding_scores, upsample_maps
rng = np.random.default_rng(7)
h = hashlib.sha256()
for shape, size in (((33, 14, 14), (224, 224)), ((9, 13, 11), (224, 224)), ((5, 7, 7), (100, 60)), ((4, 9, 9), (4, 5))):
    h.update(upsample_maps(rng.normal(size=shape).astype(np.float32), size).tobytes())
maps = rng.random((40, 14, 14)).astype(np.float32)
masks = rng.random((40, 112, 112)) < 0.2
d, i = dice_iou_curves(maps, masks)
h.update(np.ascontiguousarray(d).tobytes() + np.ascontiguousarray(i).tobytes())
h.update(repr(best_threshold(d, i).tau).encode())
s = grounding_scores(maps, masks)
h.update(np.asarray(s.pointing).tobytes() + np.asarray(s.dice).tobytes())
blas = [(x["architecture"], x["num_threads"]) for x in threadpool_info() if x["internal_api"] == "openblas"]
print(json.dumps({"digest": h.hexdigest(), "blas": blas}))
"""

_X86 = platform.machine().lower() in {"x86_64", "amd64"}
#: threads 1, 2, 4 under the machine's own kernel; two kernels (AVX2 and AVX, which any x86-64 CPU
#: that runs these tests can execute) with several threads
#: (OpenBLAS runs at most one thread per core: 4 asked for on 2 cores run as 2)
SETTINGS = [{"OPENBLAS_NUM_THREADS": str(n), "OMP_NUM_THREADS": str(n)} for n in (1, 2, 4)]
if _X86:
    SETTINGS += [{"OPENBLAS_NUM_THREADS": "2", "OPENBLAS_CORETYPE": "Haswell"},
                 {"OPENBLAS_NUM_THREADS": "4", "OPENBLAS_CORETYPE": "Sandybridge"}]


def _env(setting: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENBLAS_", "OMP_", "MKL_"))}
    env.update(setting, PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]), HF_HUB_OFFLINE="1")
    return env


def _openblas_in_use() -> bool:
    import numpy  # noqa: F401  (loads NumPy's BLAS, which threadpoolctl then sees)
    from threadpoolctl import threadpool_info

    return any(x["internal_api"] == "openblas" for x in threadpool_info())


@pytest.mark.skipif(not _openblas_in_use(), reason="NumPy is not linked against OpenBLAS here")
def test_grounding_numbers_are_the_same_bits_under_every_blas_setting():
    seen = {}
    for setting in SETTINGS:
        done = subprocess.run([sys.executable, "-c", _CHILD], env=_env(setting), capture_output=True, text=True,
                              timeout=180)
        assert done.returncode == 0, f"{setting}: {done.stderr[-2000:]}"
        report = json.loads(done.stdout.strip().splitlines()[-1])
        arch, threads = report["blas"][0]
        if "OPENBLAS_CORETYPE" in setting:  # the kernel really changed
            assert arch.lower() == setting["OPENBLAS_CORETYPE"].lower(), (setting, report)
        assert threads == min(int(setting["OPENBLAS_NUM_THREADS"]), os.cpu_count() or 1), (setting, report)
        seen[json.dumps(setting, sort_keys=True)] = report["digest"]
    assert len(set(seen.values())) == 1, "results depend on the BLAS setting:\n" + json.dumps(seen, indent=1)


@pytest.mark.skipif(not (_X86 and _openblas_in_use()), reason="needs x86-64 OpenBLAS (OPENBLAS_CORETYPE)")
def test_chunk_and_thread_tests_pass_with_two_blas_threads_on_the_haswell_kernel():
    """The upsampling and sweep tests, run as written under a multi-threaded AVX2 BLAS."""
    tests = ROOT / "tests" / "metrics"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "upsample or chunk or thread",
         str(tests / "test_metrics_grounding.py"), str(tests / "test_metrics_threads.py")],
        env=_env({"OPENBLAS_NUM_THREADS": "2", "OMP_NUM_THREADS": "2", "OPENBLAS_CORETYPE": "Haswell"}),
        capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and " failed" not in done.stdout
