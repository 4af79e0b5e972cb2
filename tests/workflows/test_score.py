"""xbench.evaluate_maps: fed a run's own stored maps it reproduces the run's tables exactly; folder inputs,
cheXlocalize pickles (restricted unpickler), missing probabilities / cases / classes."""
from __future__ import annotations

import os
import pickle
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import xbench
from xbench.core.errors import FormatError, XBenchError, XBenchWarning
from xbench.evaluation.evaluate import load_tables
from xbench.store.results import read_chunk_file
from xbench.workflows.score import RECOGNITION_METRICS, MapSet, load_maps, read_chexlocalize, read_chexlocalize_pickle

CASES = 22
pytestmark = pytest.mark.usefixtures("phantom_cache")


@pytest.fixture(scope="module")
def done(phantom_run) -> Path:
    """The session's phantom run (conftest), read only (scores are written to tmp_path)."""
    return phantom_run


def stored(out: Path, model: str) -> dict[str, np.ndarray]:
    files = sorted((out / "store" / "phantom" / model).glob("chunk-*.npz"))
    parts = [read_chunk_file(f) for f in files]
    return {k: np.concatenate([p[k] for p in parts]) for k in ("case_ids", "probs", "maps")}


def score(maps, tmp: Path, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", XBenchWarning)
        return xbench.evaluate_maps(maps, dataset="phantom", split="test", dataset_options={"cases": CASES},
                                    grid=(64, 64), bootstrap=20, seed=0, output_dir=tmp, **kw)


@pytest.mark.parametrize("model", ["anatomical_prior", "random_prior"])
def test_reproduces_the_run_tables_exactly(done, tmp_path, model):
    st = stored(done, model)
    got = score(st["maps"], tmp_path / "scored", case_ids=st["case_ids"].tolist(), probs=st["probs"], name=model)
    want = load_tables(done)
    for key in ("metrics", "pairs", "curves"):
        w = want[key][want[key]["model"] == model].reset_index(drop=True)
        assert len(w) > 0
        pd.testing.assert_frame_equal(got[key].reset_index(drop=True), w, check_exact=True)
    assert set(got["metrics"]["metric"]) >= {"best_tau", "dice@best", "pointing", "auc"}
    assert got["metrics"]["ci_low"].notna().any()
    assert (tmp_path / "scored" / "tables" / "paper" / "table1_grounding.md").exists()


def test_folder_of_npz_and_npy_equals_arrays_and_no_probs_drops_recognition(done, tmp_path):
    st = stored(done, "anatomical_prior")
    findings = xbench.load_dataset("phantom", split="test", cases=CASES).findings
    ids = st["case_ids"].tolist()
    a = score(st["maps"], tmp_path / "a", case_ids=ids)
    from safetensors.numpy import save_file

    for suffix in ("npz", "npy", "safetensors"):
        folder = tmp_path / f"maps-{suffix}"
        folder.mkdir()
        for cid, m in zip(ids, st["maps"]):
            if suffix == "npz":
                np.savez(folder / f"{cid}.npz", **{f: m[c] for c, f in enumerate(findings)})
            elif suffix == "safetensors":
                save_file({f: np.ascontiguousarray(m[c]) for c, f in enumerate(findings)}, str(folder / f"{cid}.safetensors"))
            else:
                np.save(folder / f"{cid}.npy", m)
        b = score(folder, tmp_path / f"b-{suffix}", classes=findings if suffix == "npy" else None)
        pd.testing.assert_frame_equal(a["metrics"], b["metrics"], check_exact=True)
    assert not a["metrics"]["metric"].isin(RECOGNITION_METRICS).any()
    assert a["metrics"]["metric"].eq("pointing").any()


def test_cases_without_maps_are_counted_and_bad_input_is_named(done, tmp_path):
    st = stored(done, "center_prior")
    ids = st["case_ids"].tolist()
    with pytest.warns(XBenchWarning, match="have no map"):
        xbench.evaluate_maps(st["maps"][:10], case_ids=ids[:10], dataset="phantom", dataset_options={"cases": CASES},
                             grid=(64, 64), bootstrap=0, output_dir=tmp_path / "part")
    import json

    log = json.loads((tmp_path / "part" / "tables" / "evaluation_log.json").read_text())
    assert log[0]["cases_skipped_at_inference"] == CASES - 10
    with pytest.raises(XBenchError, match="did not write"):
        score(st["maps"], done, case_ids=ids)  # never overwrite a model run's store
    assert (done / "store" / "phantom" / "center_prior").exists()
    with pytest.raises(XBenchError, match="not cases of phantom"):
        score(st["maps"][:2], tmp_path / "x", case_ids=["nope", ids[0]])
    findings = xbench.load_dataset("phantom", split="test", cases=CASES).findings
    with pytest.raises(XBenchError, match="no maps for class"):
        score(st["maps"][:, :2], tmp_path / "y", case_ids=ids, classes=findings[:2])
    with pytest.raises(XBenchError, match="case ids"):
        MapSet(st["maps"], ids[:3], findings)
    np.save(tmp_path / "bad.npy", np.zeros((2, 3)))
    (tmp_path / "bad").mkdir()
    np.save(tmp_path / "bad" / "c1.npy", np.zeros((2, 3)))
    with pytest.raises(FormatError, match="c1.npy"):
        load_maps(tmp_path / "bad", classes=findings)


def test_float_maps_outside_float16_are_normalised_with_a_warning(done, tmp_path):
    st = stored(done, "random_prior")
    ids = st["case_ids"].tolist()
    exact = score(st["maps"], tmp_path / "a", case_ids=ids)
    with pytest.warns(XBenchWarning, match="min–max normalised"):
        scaled = xbench.evaluate_maps(st["maps"].astype(np.float32) * 1e-9 + 3e-9, case_ids=ids, dataset="phantom",
                                      dataset_options={"cases": CASES}, grid=(64, 64), bootstrap=20,
                                      output_dir=tmp_path / "b")
    a = exact["metrics"].set_index(["finding", "metric"])["value"]
    b = scaled["metrics"].set_index(["finding", "metric"])["value"]
    pointing = a.index.get_level_values("metric") == "pointing"
    np.testing.assert_array_equal(a[pointing], b[pointing])
    np.testing.assert_allclose(a, b, atol=0.02)


def write_chexlocalize(folder: Path, ids, tasks, maps, probs) -> None:
    """Pickles as cheXlocalize writes them: dict with a (1, 1, h, w) tensor map, prob, task, gt, cxr_dims."""
    folder.mkdir(parents=True)
    for i, cid in enumerate(ids):
        for j, task in enumerate(tasks):
            item = {"map": torch.from_numpy(maps[i, j].astype(np.float32))[None, None], "prob": torch.tensor(probs[i, j]),
                    "task": task, "gt": 0, "cxr_dims": (64, 64)}
            with open(folder / f"{cid}_{task}_map.pkl", "wb") as fh:
                pickle.dump(item, fh)


def test_chexlocalize_pickles_read_safely(done, tmp_path):
    st = stored(done, "anatomical_prior")
    findings = xbench.load_dataset("phantom", split="test", cases=CASES).findings
    ids = st["case_ids"].tolist()
    write_chexlocalize(tmp_path / "pkl", ids, findings, st["maps"], st["probs"])
    ms = read_chexlocalize(tmp_path / "pkl", classes=findings)
    assert ms.case_ids == sorted(ids)
    order = [ids.index(c) for c in ms.case_ids]
    np.testing.assert_array_equal(ms.maps, st["maps"][order].astype(np.float32))
    np.testing.assert_array_equal(ms.probs, st["probs"][order])
    a = score(st["maps"], tmp_path / "a", case_ids=ids, probs=st["probs"])
    b = score(ms, tmp_path / "b")
    pd.testing.assert_frame_equal(a["metrics"], b["metrics"], check_exact=True)

    class Evil:
        def __reduce__(self):
            return (os.system, ("touch " + str(tmp_path / "pwned"),))

    with open(tmp_path / "evil_Cardiomegaly_map.pkl", "wb") as fh:
        pickle.dump({"map": Evil()}, fh)
    with pytest.raises(FormatError, match="refusing"):
        read_chexlocalize_pickle(tmp_path / "evil_Cardiomegaly_map.pkl")
    assert not (tmp_path / "pwned").exists()


def test_cli_score_single_npz(done, tmp_path, capsys):
    from xbench.cli import main

    st = stored(done, "anatomical_prior")
    findings = xbench.load_dataset("phantom", split="test", cases=CASES).findings
    np.savez(tmp_path / "maps.npz", maps=st["maps"], case_ids=st["case_ids"], classes=np.asarray(findings),
             probs=st["probs"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", XBenchWarning)
        rc = main(["score", "--maps", str(tmp_path / "maps.npz"), "--dataset", "phantom", "--option", f"cases={CASES}",
                   "--grid", "64", "64", "--bootstrap", "20", "--name", "anatomical_prior",
                   "--output-dir", str(tmp_path / "cli")])
    printed = capsys.readouterr().out
    assert rc == 0 and "dice@best" in printed
    assert printed.split("\n")[0].split()[-3:] == ["n_pairs", "n_cases", "n_classes"]  # which n, by name
    got = load_tables(tmp_path / "cli")["metrics"]
    want = load_tables(done)["metrics"]
    pd.testing.assert_frame_equal(got, want[want["model"] == "anatomical_prior"].reset_index(drop=True), check_exact=True)
    assert main(["score", "--maps", str(tmp_path / "nothing"), "--dataset", "phantom"]) == 2


def test_tolerance_margins_add_named_rows(done, tmp_path):
    st = stored(done, "center_prior")
    got = score(st["maps"], tmp_path / "m", case_ids=st["case_ids"].tolist(), probs=st["probs"], pointing_margins=(0, 6))
    m = got["metrics"]
    assert set(m["metric"]) >= {"pointing", "pointing@6px", "auc"} and not m["metric"].str.contains("@0px").any()
    base = m[m["metric"] == "pointing"].set_index("finding")["value"]
    wide = m[m["metric"] == "pointing@6px"].set_index("finding")["value"]
    assert (wide.reindex(base.index) >= base).all() and (wide > base).any()
    from xbench.outputs.exports import pointing_tolerance_table

    score(np.zeros_like(st["maps"]), tmp_path / "flat", case_ids=st["case_ids"].tolist())  # all pixels tied
    with pytest.raises(XBenchError, match="pointing_ties"):
        pointing_tolerance_table(tmp_path / "flat", [3], ties="any", n_boot=0)


@pytest.mark.usefixtures("phantom_cache")
def test_scoring_into_a_folder_another_process_holds_refuses(tmp_path):
    """`evaluate_maps` / `xbench score` take the output folder's lock like run, evaluate and merge: while another
    process holds it, scoring refuses before writing anything."""
    import subprocess
    import sys

    from xbench.core.lock import FolderLocked

    out = tmp_path / "scored"
    out.mkdir()
    code = ("import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
            "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", code, str(out / ".xbench.lock")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        ids = xbench.load_dataset("phantom", split="test", cases=CASES).cases["case_id"]
        maps = np.random.default_rng(0).random((CASES, 6, 8, 8), dtype=np.float32)
        with pytest.raises(FolderLocked, match="in use by another XBench process"):
            score(maps, out, case_ids=ids)
    finally:
        holder.kill()
        holder.wait()
    assert sorted(p.name for p in out.iterdir()) == [".xbench.lock"]  # nothing written


def test_every_table_is_written_once_through_the_run_evaluation(done, tmp_path, monkeypatch):
    """Maps without probabilities and with tolerance margins: the metric table, the comparisons and the ranks are
    each written once, by the run's own evaluation (recognition rows left out, tolerance rows added before writing),
    never rewritten after it; the rows are those a rewrite gave (no recognition metric anywhere, ``pointing@3px``)."""
    from xbench.core import atomic
    from xbench.evaluation import comparisons, evaluate
    from xbench.store import results

    written: list[str] = []

    def counting(module, name):
        real = getattr(module, name)

        def wrapper(frame, path, *args, **kw):
            written.append(Path(path).name)
            return real(frame, path, *args, **kw)

        monkeypatch.setattr(module, name, wrapper)

    for module in (evaluate, results):
        counting(module, "write_table")
    for module in (comparisons, atomic):
        counting(module, "write_frame")
    st = stored(done, "anatomical_prior")
    got = score(st["maps"], tmp_path / "m", case_ids=st["case_ids"].tolist(), compare_with=done, name="mine",
                pointing_margins=(3,))
    assert written.count("metrics") == 1 and written.count("comparisons.csv") == 1 and written.count("ranks.csv") == 1
    assert not got["metrics"]["metric"].isin(RECOGNITION_METRICS).any() and got["metrics"]["metric"].eq("pointing@3px").any()
    compared, ranks = comparisons.load_comparisons(tmp_path / "m", required=True)
    assert len(compared) and not compared["metric"].isin(RECOGNITION_METRICS).any()
    assert not ranks["metric"].isin(RECOGNITION_METRICS).any() and {"mine", "center_prior"} <= set(ranks["model"])
