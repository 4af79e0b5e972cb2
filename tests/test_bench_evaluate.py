"""The paper-scale evaluation benchmark: its dataset sizes follow the manifests, and a tiny run completes."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
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


def test_tiny_run_prints_measured_and_extrapolated_times():
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_evaluate.py"), "--datasets", "covid_rural", "--models", "1",
         "--replicates", "20"],
        capture_output=True, text=True, check=True, cwd=ROOT,
    ).stdout
    assert "covid_rural" in out and "measured, 1 model(s)" in out and "extrapolated to 7 models" in out
