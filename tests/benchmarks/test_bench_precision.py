"""The precision benchmark's CPU version (``benchmarks/bench_precision.py --tiny``): fp32 twice and bf16 on the
phantom with the reference models; on CPU autocast does nothing, so every deviation from fp32 must be exactly 0."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_precision.py"


def test_tiny_precision_benchmark(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("bench_precision", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    result = bench.main(["--tiny", "--out", str(tmp_path / "r.json"), "--work", str(tmp_path / "runs")])
    assert json.loads(capsys.readouterr().out) == result == json.loads((tmp_path / "r.json").read_text())
    assert result["device"] == "cpu" and result["cases"] == 12
    assert list(result["precisions"]) == ["fp32", "fp32_repeat", "bf16"]
    assert result["precisions"]["fp32"]["passes_per_s"] > 0
    for name in ("fp32_repeat", "bf16"):
        row = result["precisions"][name]
        assert row["deviation_from_fp32"] == {"scores": 0.0, "maps": 0.0, "maps_rel": 0.0, "cases": 24}, row
        tables = row["tables_vs_fp32"]
        assert {"auc", "pointing", "dice@0.5"} <= set(tables), sorted(tables)
        assert all(m["max_abs_diff"] == 0.0 and m["rows"] > 0 for m in tables.values()), tables
        assert row["max_abs_table_diff"] == 0.0
    assert (tmp_path / "runs" / "bf16" / "tables" / "metrics.parquet").exists()


def test_table_deltas_sees_a_changed_value(tmp_path):
    """The per-metric comparison reports a planted difference (and only in its metric)."""
    import pandas as pd

    spec = importlib.util.spec_from_file_location("bench_precision", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    base = pd.DataFrame({"dataset": ["d"] * 3, "model": ["m"] * 3, "metric": ["auc", "auc", "pointing"],
                         "class": ["a", "b", "a"], "value": [0.5, 0.7, 0.25]})
    for name, values in (("a", [0.5, 0.7, 0.25]), ("b", [0.5, 0.73, 0.25])):
        (tmp_path / name / "tables").mkdir(parents=True)
        base.assign(value=values).to_parquet(tmp_path / name / "tables" / "metrics.parquet")
    deltas = bench.table_deltas(tmp_path / "a", tmp_path / "b")
    assert deltas["auc"] == {"max_abs_diff": 0.03, "rows": 2, "rows_differing_2dp": 1}
    assert deltas["pointing"] == {"max_abs_diff": 0.0, "rows": 1, "rows_differing_2dp": 0}
