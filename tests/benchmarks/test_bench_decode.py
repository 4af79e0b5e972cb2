"""The decode-stage benchmark runs on tiny stand-ins (CPU) and counts every case once.

The stand-ins are generated once for the module (``bench_gpu.py --tiny --phases none --weights random``: images and
manifests, no weight files, which this benchmark never reads); the benchmark runs in this process.
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def standins(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("decode-standins") / "data"
    subprocess.run([sys.executable, str(BENCH / "bench_gpu.py"), "--root", str(root), "--out", str(root.parent / "g"),
                    "--tiny", "--phases", "none", "--gen-workers", "1", "--weights", "random"], check=True,
                   env={**os.environ, "PYTHONWARNINGS": "ignore"}, capture_output=True)
    return root


@pytest.fixture()
def bench_decode(monkeypatch, standins):
    """``bench_decode.main``, with the manifest folders and ``XBENCH_MANIFESTS`` it swaps restored afterwards."""
    import xbench.spec.registry as registry

    monkeypatch.setattr(registry, "MANIFEST_DIRS", list(registry.MANIFEST_DIRS))
    monkeypatch.setenv("XBENCH_MANIFESTS", str(standins / "manifests"))
    spec = importlib.util.spec_from_file_location("bench_decode", BENCH / "bench_decode.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "bench_decode", module)
    spec.loader.exec_module(module)
    return lambda *args: module.main(["--root", str(standins), "--workers", "1", *args])


def test_decode_benchmark_on_tiny_standins(bench_decode, standins):
    made = sum(len(p.read_text().splitlines()) - 1 for p in standins.glob("*/cases.csv"))
    out = bench_decode("--device", "cpu")
    assert out["cases"] == made == sum(d["cases"] for d in out["per_dataset"].values()) and made >= 7
    assert out["read"] > 0 and out["device_prep"] == 0.0  # the CPU path: nothing on a device


def test_decode_benchmark_device_kernels_on_the_cpu_and_the_prior_ab(bench_decode):
    """``--device torch-cpu`` runs the device kernels in this process on the CPU (uploads from the workers);
    ``--prior-reads-pixels`` decodes the centre prior's thumbnails too: the same cases in both arms."""
    arms = [bench_decode("--device", "torch-cpu", "--datasets", "nih_bbox,vindr_cxr", *flag)
            for flag in ([], ["--prior-reads-pixels"])]
    assert [a["prior_reads_pixels"] for a in arms] == [False, True]
    assert arms[0]["cases"] == arms[1]["cases"] >= 2
    assert all(a["device_prep"] > 0 and a["worker_cpu_ms_per_case"] > 0 for a in arms)  # kernels ran here
