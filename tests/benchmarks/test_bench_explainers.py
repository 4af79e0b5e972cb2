"""The explainer benchmark's CPU version (``benchmarks/bench_explainers.py --tiny``) prints one JSON with a rate
per (model, explainer) that applies, and lists what does not."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_explainers.py"


def test_tiny_explainer_benchmark(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("bench_explainers", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    result = bench.main(["--tiny", "--out", str(tmp_path / "r.json")])
    assert json.loads(capsys.readouterr().out) == result == json.loads((tmp_path / "r.json").read_text())
    done = {(r["model"], r["explainer"]) for r in result["results"]}
    for model in ("ref_xattn", "ref_patchsim"):
        assert {(model, m) for m in ("native", "gradcam", "gradcampp", "gradxinput", "ig")} <= done
        assert {"model": model, "explainer": "attngrad", "reason": "no explain_attention in the model YAML"} in result["skipped"]
    for r in result["results"]:  # 2 classes per image
        assert r["images_per_s"] > 0 and abs(r["image_classes_per_s"] - 2 * r["images_per_s"]) < 0.01, r
