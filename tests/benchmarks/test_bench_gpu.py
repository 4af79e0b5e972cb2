"""The GPU benchmark's CPU version (``benchmarks/bench_gpu.py --tiny``): stand-ins of all seven datasets in
their formats (PNG, JPEG, 8-bit JPEG-compressed and 16-bit DICOM incl. JPEG 2000) are generated and read,
the paper setting and the decode-once default give identical stores, and the cached re-run reads every
image from the cache."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_gpu.py"


@pytest.fixture()
def bench(monkeypatch):
    import xbench.spec.registry as registry

    monkeypatch.setattr(registry, "MANIFEST_DIRS", list(registry.MANIFEST_DIRS))  # the bench swaps them
    spec = importlib.util.spec_from_file_location("bench_gpu", BENCH)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "bench_gpu", module)  # its worker function is pickled by name
    spec.loader.exec_module(module)
    return module


def test_tiny_cpu_benchmark(bench, tmp_path, monkeypatch):
    pytest.importorskip("pydicom", reason="pydicom (a core dependency) is not installed")
    # the bench points XBENCH_MANIFESTS at its stand-ins; set here so that monkeypatch removes it afterwards
    monkeypatch.setenv("XBENCH_MANIFESTS", str(tmp_path / "data" / "manifests"))
    r = bench.main(["--tiny", "--root", str(tmp_path / "data"), "--out", str(tmp_path / "out"), "--workers", "2",
                    "--gen-workers", "2", "--phases", "paper,default,cached", "--models", "center_prior,ref_xattn",
                    "--bootstrap", "5"])
    formats = {p.suffix for p in (tmp_path / "data").rglob("images/*")}
    assert formats == {".png", ".jpg", ".dcm", ".dicom"}
    assert r["generate"]["per_dataset"] == {"rsna_pneumonia": 11, "siim_acr": 5, "covid_rural": 1, "chestx_det10": 2,
                                            "chexlocalize": 2, "nih_bbox": 2, "vindr_cxr": 6}
    cases = sum(r["generate"]["per_dataset"].values())
    assert r["paper"]["image_model_passes"] == r["default"]["image_model_passes"] == 2 * cases
    assert r["default"]["deviation_from_paper_setting"] == {"scores": 0.0, "maps": 0.0, "maps_rel": 0.0, "cases": 2 * cases}
    log = json.loads((tmp_path / "out" / "cached" / "run_log.json").read_text())
    assert sum(e["decode_once"]["from_cache"] for e in log if e["model"] == "ref_xattn") == cases
    assert sum(e["decode_once"]["decoded"] for e in log) == 0
    assert bench.identical_stores(tmp_path / "out" / "default", tmp_path / "out" / "cached")["identical"]
    assert bench.tables_equal(tmp_path / "out" / "default", tmp_path / "out" / "cached", decimals=12)[
        "equal_to_12_decimals"]
    assert (tmp_path / "out" / "default" / "tables" / "metrics.parquet").exists()
    timeline = r["default"]["eval_timeline"]  # the evaluation's steps, in seconds since the run started
    assert timeline["workers"] >= 1 and set(timeline["events"]) == {"run", *(f"standin_{d}" for d in r["generate"]["per_dataset"])}
    assert 0 <= timeline["created"] <= timeline["events"]["run"]["inference_done"] <= r["default"]["whole_seconds"]
    assert r["paper"].get("eval_timeline") is None


def test_rank_timings_read_each_ranks_log(bench, tmp_path):
    """The multi-GPU phase reports each rank's wall, builds, model and wait seconds from its own run log."""
    def entry(model, build, since, seconds, wait, cases):
        return {"dataset": "d", "model": model, "build_seconds": build, "since_start_seconds": since,
                "seconds": seconds, "decode_seconds": wait, "cases_inferred": cases}

    (tmp_path / "run_log.shard0of2.json").write_text(json.dumps([entry("a", 2.0, 10.0, 5.0, 1.0, 7),
                                                                 entry("b", 3.0, 10.0, 4.0, 0.5, 7)]))
    (tmp_path / "run_log.shard1of2.json").write_text(json.dumps([entry("a", 2.5, 20.0, 9.0, 2.0, 9)]))
    (tmp_path / "run_log.json").write_text("[]")  # not a rank's log
    assert bench.rank_timings(tmp_path) == [
        {"log": "run_log.shard0of2.json", "wall_seconds": 10.0, "build_seconds": 5.0, "model_seconds": 7.5,
         "decode_wait_seconds": 1.5, "cases": 14},
        {"log": "run_log.shard1of2.json", "wall_seconds": 20.0, "build_seconds": 2.5, "model_seconds": 7.0,
         "decode_wait_seconds": 2.0, "cases": 9}]


def test_rank_timings_give_each_ranks_start_up_from_the_launch(bench, tmp_path):
    """With the launch time, each rank's start-up is its run's start (``run_started_unix``) minus the launch; a
    one-process run (``--gpus 1``, the baseline) is read from ``run_log.json``."""
    def entry(start):
        return {"dataset": "d", "model": "a", "build_seconds": 1.0, "since_start_seconds": 4.0, "seconds": 2.0,
                "decode_seconds": 0.5, "cases_inferred": 3, "run_started_unix": start}

    (tmp_path / "run_log.shard0of2.json").write_text(json.dumps([entry(1000.0 + 7.25)]))
    (tmp_path / "run_log.shard1of2.json").write_text(json.dumps([entry(1000.0 + 9.5)]))
    assert [r["startup_seconds"] for r in bench.rank_timings(tmp_path, 1000.0)] == [7.25, 9.5]
    assert "startup_seconds" not in bench.rank_timings(tmp_path)[0]
    alone = tmp_path / "alone"
    alone.mkdir()
    (alone / "run_log.json").write_text(json.dumps([entry(1003.0)]))
    assert bench.rank_timings(alone, 1000.0) == [
        {"log": "run_log.json", "startup_seconds": 3.0, "wall_seconds": 4.0, "build_seconds": 1.0,
         "model_seconds": 1.5, "decode_wait_seconds": 0.5, "cases": 3}]


def test_the_evaluation_timeline_is_shifted_to_the_launch(bench, tmp_path):
    """A multi-GPU run's timeline (rank 0's ``evaluation_timing.json``) is reported in seconds since the launcher
    started, like the ranks' start-ups; without the file, or without a start, there is none."""
    doc = {"created_unix": 1005.5, "workers": 3, "events": {"run": {"gathered": 10.0}, "d": {"ready": 1.25}}}
    (tmp_path / "evaluation_timing.json").write_text(json.dumps(doc))
    assert bench.eval_timeline(tmp_path, 1000.0) == {"workers": 3, "created": 5.5,
                                                     "events": {"run": {"gathered": 15.5}, "d": {"ready": 6.75}}}
    assert bench.eval_timeline(tmp_path, None) is None and bench.eval_timeline(tmp_path / "none", 1000.0) is None


def test_model_entries_load_weight_folders_when_given(bench, tmp_path):
    """``--weights files``: a model with a stand-in folder is configured to load it; the others as before."""
    folders = {"kad": tmp_path / "weights" / "kad"}
    entries = {m: bench._model_entry(m, folders) for m in ("kad", "clip", "center_prior")}
    assert entries == {"kad": {"name": "kad", "weights": str(folders["kad"])},
                       "clip": {"name": "clip", "params": {"random_init": True}},
                       "center_prior": {"name": "center_prior"}}


def test_the_environment_record_names_the_cpu_and_its_sha_extensions(bench, tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: Example CPU @ 2.00GHz\nflags\t\t: fpu avx2 sha_ni\n\n"
                    "processor\t: 1\nmodel name\t: Example CPU @ 2.00GHz\nflags\t\t: fpu avx2 sha_ni\n")
    assert bench.cpu_info(str(info)) == {"cpu_model": "Example CPU @ 2.00GHz", "sha_ni": True}
    info.write_text("model name\t: Older CPU\nflags\t\t: fpu avx2 sha\n")  # "sha" alone is not sha_ni
    assert bench.cpu_info(str(info)) == {"cpu_model": "Older CPU", "sha_ni": False}
    assert bench.cpu_info(str(tmp_path / "absent")) == {}


@pytest.mark.slow
def test_tiny_benchmark_runs_the_models_beyond_the_paper(bench, tmp_path, monkeypatch):
    """The models beyond the paper are in the benchmark's list (added with --models) and load from their stand-in
    weight folders. One case of each of the seven stand-in datasets (``--scale 0.0001``; ``--tiny`` alone makes 29):
    every image format still reaches the four models, whose builds and weight files are most of the time."""
    pytest.importorskip("pydicom", reason="pydicom (a core dependency) is not installed")
    monkeypatch.setenv("XBENCH_MANIFESTS", str(tmp_path / "data" / "manifests"))
    beyond = list(bench.BEYOND_MODELS)
    assert set(beyond) <= bench.RANDOM_INIT and not set(beyond) & set(bench.MODELS)  # added on request only
    r = bench.main(["--tiny", "--scale", "0.0001", "--root", str(tmp_path / "data"), "--out", str(tmp_path / "out"),
                    "--workers", "0", "--gen-workers", "2", "--phases", "default", "--models", ",".join(beyond),
                    "--bootstrap", "0"])
    assert "errors" not in r, r.get("errors")
    assert r["weights"]["models"] == sorted(beyond)
    assert list(r["generate"]["per_dataset"].values()) == [1] * 7  # one case of each dataset
    cases = sum(r["generate"]["per_dataset"].values())
    assert r["default"]["image_model_passes"] == len(beyond) * cases
    log = json.loads((tmp_path / "out" / "default" / "run_log.json").read_text())
    assert {e["model"] for e in log} == set(beyond) and {e["weights_label"] for e in log} == {"official"}
