"""The paper-scale evaluation benchmark: its dataset sizes follow the manifests, and a tiny run completes."""
from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("bench_evaluate", ROOT / "benchmarks" / "bench_evaluate.py")
bench_evaluate = sys.modules["bench_evaluate"] = importlib.util.module_from_spec(_spec)  # dataclasses need it there
_spec.loader.exec_module(bench_evaluate)


def test_paper_sets_sum_to_the_papers_case_count_and_use_manifest_pair_counts():
    sets = {s.name: s for s in bench_evaluate.paper_sets()}
    assert sum(s.cases for s in sets.values()) == 12880 and len(sets) == 7
    assert max(s.classes for s in sets.values()) == 21
    assert sets["rsna_pneumonia"].pairs == [1218] and sets["siim_acr"].pairs == [515]
    # NIH: label positives exceed boxed cases; a pair needs a box, so the box counts bound it
    assert sum(sets["nih_bbox"].pairs) == 984 and sets["nih_bbox"].source == "manifest"
    assert sets["vindr_cxr"].source == "assumed"


def test_tiny_run_prints_measured_and_extrapolated_times_and_serial_equals_parallel():
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_evaluate.py"), "--datasets", "covid_rural", "--models", "2",
         "--replicates", "20", "--workers", "2"],
        capture_output=True, text=True, check=True, cwd=ROOT,
    ).stdout
    assert "covid_rural" in out and "measured, 2 model(s)" in out and "extrapolated to 7 models" in out
    serial = re.search(r"serial   total .*tables sha256 ([0-9a-f]{64})", out)
    parallel = re.search(r"parallel total \(2 workers.*tables sha256 ([0-9a-f]{64})", out)
    assert serial and parallel and serial.group(1) == parallel.group(1), out
    assert "tables identical: yes" in out and "speed-up on equal work" in out


def test_ground_truth_is_rasterised_at_full_size_and_pooled_in_order():
    """The stand-in regions are drawn at the set's full image size with the package's rasterize; a pool over
    chunks gives the serial masks (rows and bits) in the same order."""
    from xbench.core.workers import process_pool

    spec = bench_evaluate.SetSpec("covid_rural", 44, 1, [30], "assumed")
    data = bench_evaluate.make_set(spec, seed=1)
    assert data["size"] == bench_evaluate.FULL_SIZE["covid_rural"][0]
    region = data["regions"][0][0][0]
    assert isinstance(region, bench_evaluate.Polygon) and region.points.max() > 224  # full-size pixels, not grid
    serial = bench_evaluate.ground_truth_of(spec, data, None, 1)
    with process_pool(2) as pool:
        pooled = bench_evaluate.ground_truth_of(spec, data, pool, 8)  # 8 → chunks of 16 pairs: two jobs
    assert serial["class0"].masks.shape == (30, *bench_evaluate.GRID) and serial["class0"].masks.any()
    for a, b in zip(serial["class0"], pooled["class0"]):
        assert np.array_equal(a, b)
