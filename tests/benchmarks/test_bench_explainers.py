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
        if r["explainer"] != "native":  # the cost model: measured pass times, the limit and the fraction of it reached
            assert r["native_fraction"] > 0 and r["forward_seconds"] > 0 and r["backward_seconds"] > 0, r
            assert r["per_class_fallback"] is False, r  # one batched backward per chunk of classes
            # times are printed to 6 significant figures (relative error <= 5e-6 each), the fraction to 4
            passes = {"gradcam": r["forward_seconds"] + 2 * r["head_backward_seconds"],
                      "gradxinput": r["forward_seconds"] + 2 * r["backward_seconds"],
                      "ig": r["forward_seconds"] + 4 * (r["forward_seconds"] + 2 * r["backward_seconds"])}
            limit = passes.get(r["explainer"], passes["gradcam"])  # gradcampp: as gradcam
            assert abs(r["cost_model_seconds"] - limit) <= 2e-5 * limit, r
            assert abs(r["cost_model_fraction"] - r["cost_model_seconds"] / r["seconds_per_batch"]) <= 1e-3 * r["cost_model_fraction"], r


def _load(monkeypatch):
    import sys

    import xbench.spec.registry as registry

    monkeypatch.setattr(registry, "MANIFEST_DIRS", list(registry.MANIFEST_DIRS))  # the whole run swaps them
    monkeypatch.setitem(sys.modules, "bench_gpu", None)  # restored afterwards: the bench loads its own
    spec = importlib.util.spec_from_file_location("bench_explainers", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_tiny_whole_run(tmp_path, capsys, monkeypatch):
    """``--whole-run --tiny``: the GPU benchmark's stand-in generated, one explainer over it through ``xbench run``
    (entries ``explainer: gradcam``: decode, explain, store, evaluate) and the native run of the same cases; JSON like
    bench_gpu.py's."""
    import pytest

    pytest.importorskip("pydicom", reason="pydicom (a core dependency) is not installed")
    bench = _load(monkeypatch)  # imports the registry first: its manifest folders are read at import
    monkeypatch.setenv("XBENCH_MANIFESTS", str(tmp_path / "standin" / "manifests"))  # removed afterwards
    result = bench.main(["--whole-run", "--tiny", "--explainer", "gradcam", "--root", str(tmp_path / "standin"),
                         "--out", str(tmp_path / "w.json")])
    assert json.loads(capsys.readouterr().out) == json.loads(json.dumps(result)) == json.loads((tmp_path / "w.json").read_text())
    assert "errors" not in result, result.get("errors")
    assert result["args"]["explainer"] == "gradcam" and float(result["args"]["scale"]) == 0.002
    cases = result["generate"]["cases"]
    explained, native = result["explained"], result["native"]
    assert explained["per_model"]["ref_xattn+gradcam"]["cases"] == cases == native["per_model"]["ref_xattn"]["cases"]
    assert explained["whole_seconds"] > 0 and native["whole_seconds"] > 0
    assert explained["whole_vs_native"] == round(explained["whole_seconds"] / native["whole_seconds"], 3)
    stored = {p.parent.name for p in (tmp_path / "explain_runs" / "explained" / "store").glob("*/*/meta.json")}
    assert stored == {"ref_xattn+gradcam"}
    metrics = (tmp_path / "explain_runs" / "explained" / "tables" / "metrics.parquet")
    assert metrics.is_file()  # evaluated
