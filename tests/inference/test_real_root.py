"""First contact with a real-format root: the official NIH ChestX-ray14 annotation files with only some images.

The root holds the real ``BBox_List_2017.csv`` and ``Data_Entry_2017_v2020.csv`` (from ../shared) and the two
real NIH PNGs of ../shared/samples copied under the names of boxed cases. It shows: the preflight and
``manifest check`` count the missing images exactly; a run with ``on_missing_image: skip`` writes tables whose n
are those of the present images; after more images are added a re-run infers exactly the formerly skipped cases
that are now present, and its tables equal those of a single clean run; no present image → one clear message.
"""
from __future__ import annotations

import json
import shutil
import warnings
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest

import xbench
from conftest import shared_path
from xbench.spec.config import RunConfig
from xbench.core.errors import XBenchError, XBenchWarning
from xbench.models.priors import CenterPrior, RandomPrior
from xbench.preflight import preflight
from xbench.workflows.run import run

CASES = 880  # boxed images of the official BBox_List_2017.csv
MODELS = ["center_prior", "random_prior"]


@pytest.fixture()
def nih_root(tmp_path) -> tuple[Path, list[str], list[Path]]:
    """(root, boxed case ids in dataset order, the two real sample PNGs)."""
    ann = shared_path("annotations", "nih_chestxray14")
    samples = sorted(shared_path("samples").glob("*.png"))
    root = tmp_path / "nih"
    (root / "images").mkdir(parents=True)
    for name in ("BBox_List_2017.csv", "Data_Entry_2017_v2020.csv"):
        shutil.copy(ann / name, root / name)
    ids = xbench.load_dataset("nih_bbox", root=root).cases["case_id"].astype(str).tolist()
    return root, ids, samples


def place(root: Path, samples: list[Path], names: list[str]) -> None:
    for i, name in enumerate(names):
        shutil.copy(samples[i % len(samples)], root / "images" / name)


def config(root: Path, out: Path, **changes) -> RunConfig:
    return RunConfig.from_dict({
        "output_dir": str(out), "datasets": [{"name": "nih_bbox", "root": str(root)}], "models": MODELS,
        "grid": [32, 32], "chunk_size": 256, "batch_size": 16, "on_missing_image": "skip",
        "bootstrap": {"replicates": 10, "seed": 0}, **changes})


@pytest.fixture()
def predicted(monkeypatch) -> Counter:
    """Images passed to each prior's predict."""
    calls: Counter = Counter()
    for cls in (CenterPrior, RandomPrior):
        original = cls.predict_cases  # what the runner calls (the random prior draws by case id)

        def counting(self, pixels, prompts, case_ids, _original=original, _name=cls.__name__):
            calls[_name] += pixels.shape[0]
            return _original(self, pixels, prompts, case_ids)

        monkeypatch.setattr(cls, "predict_cases", counting)
    return calls


def quiet_run(cfg: RunConfig, **kwargs) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", XBenchWarning)
        return run(cfg, progress=False, **kwargs)


def tables(out: Path) -> dict[str, pd.DataFrame]:
    folder = out / "tables"
    return {"metrics": pd.read_parquet(folder / "metrics.parquet"), "pairs": pd.read_parquet(folder / "pairs.parquet"),
            "curves": pd.read_csv(folder / "curves.csv")}


def test_preflight_and_manifest_check_count_the_missing_images(nih_root):
    root, ids, samples = nih_root
    place(root, samples, ids[:2])
    report = preflight(config(root, root.parent / "out"))
    nih = report.datasets[0]
    assert (nih.cases, nih.images_present, len(nih.images_missing)) == (CASES, 2, CASES - 2)
    assert nih.images_missing == ids[2:]
    assert "image files 2 of 880 present, 878 missing" in report.format()
    assert "sha256 ok" in report.format()  # the real annotation files match the manifest's hashes
    assert report.ok  # on_missing_image: skip → counted, not a problem
    assert "878 of 880 cases will be skipped" in report.format()
    # the released PNGs are 1024², the samples a uniform 512² rescale: a note, not a problem
    assert "uniform rescale" in report.format()
    # under on_missing_image: raise the same gap is a problem, found before any model is built
    strict = preflight(config(root, root.parent / "out", on_missing_image="raise"))
    assert any("878 of 880 image files are missing" in p for p in strict.problems)

    from xbench.datasets.checks import check

    checked = check("nih_bbox", root)
    assert not checked.ok and "image files: 2 of 880 present, 878 missing" in checked.format()


def test_skip_then_add_images_infers_only_the_skipped_cases_and_equals_a_clean_run(nih_root, tmp_path, predicted):
    root, ids, samples = nih_root
    first, later = ids[:2], ids[2:5]
    place(root, samples, first)
    out = tmp_path / "resumed"
    quiet_run(config(root, out))
    log = {e["model"]: e for e in json.loads((out / "run_log.json").read_text())}
    for m in MODELS:
        assert (log[m]["cases_inferred"], log[m]["cases_skipped"], log[m]["cases_retried"]) == (2, CASES - 2, 0)
        assert log[m]["preflight_images"] == {"split": "test", "cases": CASES, "images_present": 2, "images_missing": CASES - 2}
    assert predicted == Counter({"CenterPrior": 2, "RandomPrior": 2})
    evaluation = json.loads((out / "tables" / "evaluation_log.json").read_text())
    assert {e["cases_skipped_at_inference"] for e in evaluation} == {CASES - 2}
    metrics = tables(out)["metrics"]
    data = xbench.load_dataset("nih_bbox", root=root)
    labels = data.labels()[:2]
    auc = metrics[(metrics["metric"] == "auc") & metrics["finding"].isin(data.findings)]
    # n_cases of a recognition cell = labelled cases among the 2 inferred ones (NIH labels every class)
    assert set(auc["n_cases"]) == {2} and len(auc) == 2 * len(data.findings)
    pairs = tables(out)["pairs"]
    assert set(pairs["case_id"]) <= set(first) and len(pairs) == 2 * sum(
        bool(s.regions.get(f)) for s in (data[0], data[1]) for f in data.findings if s.labels[f] == 1)
    assert (labels == 1).sum() >= 2

    # three more images arrive: the re-run infers exactly those three, nothing else
    place(root, samples, later)
    predicted.clear()
    quiet_run(config(root, out))
    assert predicted == Counter({"CenterPrior": 3, "RandomPrior": 3})
    log = {e["model"]: e for e in json.loads((out / "run_log.json").read_text())}
    for m in MODELS:
        assert (log[m]["cases_inferred"], log[m]["cases_skipped"], log[m]["cases_retried"]) == (3, CASES - 5, CASES - 2)

    # a single clean run with the same five images gives identical tables
    clean = tmp_path / "clean"
    quiet_run(config(root, clean))
    a, b = tables(out), tables(clean)
    for key in a:
        pd.testing.assert_frame_equal(a[key], b[key])
    stored = xbench.store.results.ResultStore(out).read("nih_bbox", "center_prior", expected_chunks=4)
    assert stored.case_ids.tolist() == ids[:5] and len(stored.skipped) == CASES - 5

    # a third run with nothing new infers nothing, and still reports the skipped cases truthfully
    predicted.clear()
    quiet_run(config(root, out))
    assert not predicted
    log = {e["model"]: e for e in json.loads((out / "run_log.json").read_text())}
    assert log["center_prior"]["cases_skipped"] == CASES - 5


def test_no_image_present_is_one_clear_message(nih_root, tmp_path):
    root, _, _ = nih_root
    cfg = config(root, tmp_path / "out")
    with pytest.raises(XBenchError, match="none of the 880 image files is present"):
        quiet_run(cfg)
    assert not (tmp_path / "out" / "store").exists()  # refused before any model was built
    # without the preflight: the store records 880 skips and the evaluation says so in one message
    with pytest.raises(XBenchError, match=r"nih_bbox × center_prior: no case can be evaluated — 880 of 880 cases were "
                                          r"skipped at inference \(MissingFileError"):
        quiet_run(cfg, check=False)
