"""``benchmarks/bench_builds.py`` runs on the CPU: every network is built from a checkpoint in memory and timed."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_builds.py"


def test_builds_from_checkpoints_are_timed(capsys):
    pytest.importorskip("open_clip", reason="open_clip_torch (a core dependency) is not installed")
    spec = importlib.util.spec_from_file_location("bench_builds", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    result = module.main(["--repeats", "1"])
    assert set(result) == {"clip", "carzero", "bert_text_encoder", "total"}
    assert all(result[k] > 0 for k in ("clip", "carzero", "bert_text_encoder"))
    assert result["total"] == pytest.approx(result["clip"] + result["carzero"] + result["bert_text_encoder"], abs=2e-3)
    assert '"median_seconds"' in capsys.readouterr().out
