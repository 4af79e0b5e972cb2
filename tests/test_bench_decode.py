"""The decode-stage benchmark runs on tiny stand-ins (CPU) and counts every case once."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def test_decode_benchmark_on_tiny_standins(tmp_path):
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    root = tmp_path / "data"
    subprocess.run([sys.executable, str(BENCH / "bench_gpu.py"), "--root", str(root), "--out", str(tmp_path / "g"),
                    "--tiny", "--phases", "none", "--gen-workers", "1"], check=True, env=env, capture_output=True)
    made = sum(len(p.read_text().splitlines()) - 1 for p in root.glob("*/cases.csv"))
    done = subprocess.run([sys.executable, str(BENCH / "bench_decode.py"), "--root", str(root), "--workers", "1",
                           "--device", "cpu"], check=True, env=env, capture_output=True, text=True)
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["cases"] == made == sum(d["cases"] for d in out["per_dataset"].values()) and made >= 7
    assert out["read"] > 0 and out["device_prep"] == 0.0  # the CPU path: nothing on a device


def test_decode_benchmark_device_kernels_on_the_cpu_and_the_prior_ab(tmp_path):
    """``--device torch-cpu`` runs the device kernels in this process on the CPU (uploads from the workers);
    ``--prior-reads-pixels`` decodes the centre prior's thumbnails too: the same cases in both arms."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    root = tmp_path / "data"
    subprocess.run([sys.executable, str(BENCH / "bench_gpu.py"), "--root", str(root), "--out", str(tmp_path / "g"),
                    "--tiny", "--phases", "none", "--gen-workers", "1"], check=True, env=env, capture_output=True)
    arms = []
    for flag in ([], ["--prior-reads-pixels"]):
        done = subprocess.run([sys.executable, str(BENCH / "bench_decode.py"), "--root", str(root), "--workers", "1",
                               "--device", "torch-cpu", "--datasets", "nih_bbox,vindr_cxr", *flag],
                              check=True, env=env, capture_output=True, text=True)
        arms.append(json.loads(done.stdout.strip().splitlines()[-1]))
    assert [a["prior_reads_pixels"] for a in arms] == [False, True]
    assert arms[0]["cases"] == arms[1]["cases"] >= 2
    assert all(a["device_prep"] > 0 and a["worker_cpu_ms_per_case"] > 0 for a in arms)  # kernels ran here
