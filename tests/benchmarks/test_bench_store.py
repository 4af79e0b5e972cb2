"""``benchmarks/bench_store.py`` on a small store: every layout bit-identical, the store's layout smaller than today's
on compressible maps, whole-store reads identical in both layouts, rewritten chunks byte-identical."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

from xbench.store.results import ResultStore

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_store.py"


def test_bench_store_on_a_small_store(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("bench_store", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    store = ResultStore(tmp_path / "run")
    rng = np.random.default_rng(0)
    for model in ("a", "b"):
        store.prepare("toy", model, {"findings": ["x", "y"], "grid": [14, 14], "chunk_size": 16, "params": {}})
        for chunk in range(2):
            smooth = np.cumsum(rng.random((16, 2, 14, 14)), axis=-1) / 14  # rising values: compressible high bytes
            store.write_chunk("toy", model, chunk, case_ids=[f"c{chunk}_{i}" for i in range(16)],
                              scores=rng.normal(size=(16, 2)), probs=rng.random((16, 2)), maps=smooth, skipped={})
    r = bench.main(["--store", f"toy={tmp_path / 'run'}", "--repeats", "1", "--baseline", "HEAD",
                    "--json", str(tmp_path / "out.json")])
    toy = r["sources"]["toy"]
    assert toy["pairs"] == 2 and toy["chunks"] == 4 and toy["case_model_pairs"] == 64
    assert all(layout["bit_identical"] for layout in toy["layouts"].values())
    assert toy["layouts"]["shuffle_zlib1"]["ratio_vs_today"] < 0.9 and toy["layouts"]["today"]["ratio_vs_today"] == 1
    assert toy["layouts"]["shuffle_zstd1"]["ratio_vs_today"] < 0.9 and "read_time_vs_today" in toy["layouts"]["shuffle_zstd1"]
    assert set(toy["per_model_ratio"]) == {"a", "b"} and max(toy["per_model_ratio"].values()) < 0.9
    read = toy["store_read"]
    assert read["arrays_identical"] and read["rewrite_gives_same_bytes"] and read["bytes_new"] < read["bytes_today"]
    assert read["bytes_zlib_layout"] < read["bytes_today"] and read["zlib_layout_s"] > 0
    assert (tmp_path / "out.json").exists() and '"toy"' in capsys.readouterr().out
