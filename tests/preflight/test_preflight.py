"""Configs say what they mean, and every late or raw error of a first real run is now an early, clear one.

Each test asserts the message and that nothing was computed on a wrong premise (no store, no predict call).
"""
from __future__ import annotations

import json
import os
import shutil
import stat
import warnings
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml

from conftest import tiny_run
from xbench.spec import registry
from xbench.cli import main
from xbench.spec.config import RunConfig
from xbench.core.errors import UnknownNameError, XBenchError, XBenchWarning
from xbench.models.priors import CenterPrior
from xbench.preflight import PreflightError, preflight
from xbench.workflows.run import run

REPO = Path(__file__).resolve().parents[2]
MINIMAL = {"output_dir": "out", "datasets": ["phantom"], "models": ["center_prior"]}

pytestmark = pytest.mark.usefixtures("phantom_cache")


@pytest.fixture()
def no_predict(monkeypatch):
    def refuse(self, pixels, prompts):
        raise AssertionError("a model predicted although the run should have been refused first")

    monkeypatch.setattr(CenterPrior, "predict", refuse)


def test_unknown_model_or_dataset_name_is_caught_when_the_config_is_read():
    with pytest.raises(UnknownNameError, match="Did you mean 'center_prior'"):
        RunConfig.from_dict({**MINIMAL, "models": ["centre_prior"]})
    with pytest.raises(UnknownNameError, match="Did you mean 'nih_bbox'"):
        RunConfig.from_dict({**MINIMAL, "datasets": ["nih_box"]})


def test_cli_reports_a_config_typo_in_one_line(tmp_path, capsys):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({**MINIMAL, "output_dir": str(tmp_path / "o"),
                                    "datasets": [{"name": "phantom", "spilt": "test"}]}))
    assert main(["run", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "did you mean 'split'" in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()


def test_an_empty_dataset_is_refused_before_any_model_runs(tmp_path, no_predict):
    cfg = RunConfig.from_dict(tiny_run(tmp_path / "o", models=["center_prior"],
                                       datasets=[{"name": "phantom", "split": "test", "cases": 0}]))
    with pytest.raises(PreflightError, match=r"loader failed: XBenchError: phantom: cases must be >= 1"):
        run(cfg, progress=False)
    assert not (tmp_path / "o").exists()


# -- late errors now found before any model is built -------------------------------------------------------
def test_fit_split_that_the_dataset_lacks_is_refused_before_any_model_runs(tmp_path, no_predict):
    cfg = RunConfig.from_dict({"output_dir": str(tmp_path / "o"), "datasets": [{"name": "nih_bbox", "root": str(tmp_path)}],
                               "models": ["center_prior", {"name": "anatomical_prior", "fit_split": "prior"}]})
    with pytest.raises(PreflightError, match="fit_split 'prior', which dataset 'nih_bbox' does not have"):
        run(cfg, progress=False)
    assert not (tmp_path / "o" / "store").exists()


def test_fit_split_without_its_annotation_file_is_refused_before_any_model_runs(tmp_path, no_predict):
    import shutil

    from conftest import shared_path

    root = tmp_path / "det10"
    root.mkdir()
    shutil.copy(shared_path("annotations", "chestx_det10", "test.json"), root / "test.json")
    cfg = RunConfig.from_dict({"output_dir": str(tmp_path / "o"), "datasets": [{"name": "chestx_det10", "root": str(root)}],
                               "models": ["center_prior", {"name": "anatomical_prior", "fit_split": "train"}],
                               "on_missing_image": "skip"})
    with pytest.raises(PreflightError, match=r"fitted on split 'train', whose annotations file .*train.json is missing"):
        run(cfg, progress=False)
    assert not (tmp_path / "o" / "store").exists()


def test_missing_checkpoint_is_found_before_earlier_models_run(tmp_path, no_predict, monkeypatch):
    monkeypatch.delenv("XBENCH_WEIGHTS", raising=False)
    cfg = RunConfig.from_dict(tiny_run(tmp_path / "o", models=["center_prior", "kad"]))
    with pytest.raises(PreflightError, match=r"model kad: weight files absent: best_valid.pt, Med-KEBERT/"):
        run(cfg, progress=False)
    assert not (tmp_path / "o" / "store").exists()


def test_cuda_without_cuda_is_a_clear_error(tmp_path, monkeypatch, capsys, no_predict):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(tiny_run(tmp_path / "o", models=["center_prior"])))
    assert main(["run", "--config", str(path), "--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert "device: 'cuda' asked for but torch sees no CUDA device" in err and "Traceback" not in err
    assert not (tmp_path / "o" / "store").exists()
    with pytest.raises(XBenchError, match="sees no CUDA device"):
        RunConfig.from_yaml(path, device="cuda").resolved_device()


def test_check_command_reports_and_exits_non_zero(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("XBENCH_WEIGHTS", raising=False)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(tiny_run(tmp_path / "o", models=["center_prior", "medklip"])))
    assert main(["check", "--config", str(path)]) == 1
    out = capsys.readouterr()
    assert "image files 22 of 22 present, 0 missing" in out.out and "model medklip: missing" in out.out
    assert "checkpoint_final.pth" in out.out and "checkpoint_final.pth" not in out.err and "problem(s)" in out.err  # once
    path.write_text(yaml.safe_dump(tiny_run(tmp_path / "o", models=["center_prior"])))
    assert main(["check", "--config", str(path)]) == 0
    assert not (tmp_path / "o").exists()  # a check computes and writes nothing


# -- random init only where a config opts in; optional models ---------------------------------------------
def test_paper_config_refuses_random_init_and_leaves_devide_out(monkeypatch):
    monkeypatch.delenv("XBENCH_WEIGHTS", raising=False)
    cfg = RunConfig.from_yaml(REPO / "xbench" / "configs" / "runs" / "paper.yaml")
    assert cfg.allow_random_init is False and [m.name for m in cfg.models if m.optional] == ["devide"]
    report = preflight(cfg, decode=False)
    assert any(p.startswith("model clip: weight files absent, and the model would run random-init") for p in report.problems)
    assert not any(p.startswith("model devide") for p in report.problems)
    assert "devide" in report.left_out


def test_random_init_needs_an_explicit_opt_in(tmp_path, monkeypatch):
    monkeypatch.delenv("XBENCH_WEIGHTS", raising=False)
    base = tiny_run(tmp_path / "o", models=["clip"])
    assert not preflight(RunConfig.from_dict(base), decode=False).ok
    assert preflight(RunConfig.from_dict({**base, "allow_random_init": True}), decode=False).ok
    opted = {**base, "models": [{"name": "clip", "params": {"random_init": True}}]}
    assert preflight(RunConfig.from_dict(opted), decode=False).ok
    phantom = RunConfig.from_yaml(REPO / "xbench" / "configs" / "runs" / "phantom.yaml")
    assert phantom.allow_random_init is True


def test_optional_model_without_weights_is_left_out_with_a_note(tmp_path, monkeypatch, caplog):
    monkeypatch.delenv("XBENCH_WEIGHTS", raising=False)
    cfg = RunConfig.from_dict(tiny_run(tmp_path / "o", models=["center_prior", {"name": "devide", "optional": True}]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", XBenchWarning)
        with caplog.at_level("WARNING", logger="xbench"):
            run(cfg, progress=False)
    assert sum("devide: optional model left out" in r.getMessage() for r in caplog.records) == 1
    models = pd.read_csv(tmp_path / "o" / "tables" / "models.csv")
    row = models[models["model"] == "devide"].iloc[0]
    assert row["weights"] == "absent" and "optional model left out" in row["note"]
    log = json.loads((tmp_path / "o" / "run_log.json").read_text())
    assert [e["model"] for e in log if e.get("left_out")] == ["devide"]
    assert not (tmp_path / "o" / "store" / "phantom" / "devide").exists()


# -- files follow the umask ----------------------------------------------------------------------------------
def test_output_files_follow_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", XBenchWarning)
            run(RunConfig.from_dict(tiny_run(tmp_path / "o", cases=8, models=["center_prior"])), progress=False)
    finally:
        os.umask(old)
    files = [p for p in (tmp_path / "o").rglob("*") if p.is_file()]
    names = {p.name for p in files}
    assert {"meta.json", "chunk-00000.npz", "run_log.json", "evaluation_log.json"} <= names
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in files}
    assert set(modes.values()) == {0o644}, modes


# -- reproduce --keep-going ----------------------------------------------------------------------------------
def _notebook(path: Path, source: str) -> None:
    import nbformat

    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell('config = ""\noutput_dir = ""\ndevice = "cpu"')
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, nbformat.v4.new_code_cell(source)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    nbformat.write(nb, path)


@pytest.mark.slow
def test_reproduce_keep_going_runs_the_rest_and_lists_failures(tmp_path):
    from xbench.workflows.reproduce import reproduce

    nbs = tmp_path / "nbs"
    nbs.mkdir()
    _notebook(nbs / "01_fails.ipynb", "raise RuntimeError('boom')")
    _notebook(nbs / "02_writes.ipynb", "from pathlib import Path\nPath(output_dir, 'done.txt').write_text('ok')")
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump(tiny_run(tmp_path / "o", models=["center_prior"])))
    with pytest.raises(XBenchError, match="notebook 01_fails.ipynb failed"):
        reproduce(cfg, output_dir=tmp_path / "stop", notebooks=nbs, progress=False, check=False)
    assert not (tmp_path / "stop" / "done.txt").exists()
    with pytest.raises(XBenchError, match=r"1 notebook\(s\) failed \(the others ran\):\n  - notebook 01_fails.ipynb "
                                          r"failed in cell \d+ \(RuntimeError: boom\)"):
        reproduce(cfg, output_dir=tmp_path / "go", notebooks=nbs, progress=False, keep_going=True, check=False)
    assert (tmp_path / "go" / "done.txt").read_text() == "ok"


def test_reproduce_preflights_before_any_notebook(tmp_path, monkeypatch):
    from xbench.workflows.reproduce import reproduce

    monkeypatch.delenv("XBENCH_WEIGHTS", raising=False)
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump(tiny_run(tmp_path / "o", models=["kad"])))
    with pytest.raises(PreflightError, match="model kad"):
        reproduce(cfg, output_dir=tmp_path / "o", notebooks=tmp_path / "none")
    assert not (tmp_path / "o").exists()


# -- config search path --------------------------------------------------------------------------------------
@pytest.fixture()
def user_configs(tmp_path, monkeypatch) -> Path:
    monkeypatch.setattr(registry, "MODEL_CONFIG_DIRS", list(registry.MODEL_CONFIG_DIRS))
    monkeypatch.setattr(registry, "MANIFEST_DIRS", list(registry.MANIFEST_DIRS))
    monkeypatch.setattr("sys.path", list(__import__("sys").path))
    folder = tmp_path / "mine"
    (folder / "models").mkdir(parents=True)
    (folder / "mypriors.py").write_text("from xbench.models.priors import CenterPrior\n\n\nclass WidePrior(CenterPrior):\n"
                                        "    pass\n")
    center = yaml.safe_load((REPO / "xbench" / "configs" / "models" / "center_prior.yaml").read_text())
    (folder / "models" / "wide_prior.yaml").write_text(yaml.safe_dump({**center, "class": "mypriors:WidePrior",
                                                                      "params": {"sigma": 0.5}}))
    return folder


def test_config_path_adds_user_models_without_editing_the_package(user_configs, tmp_path, capsys):
    assert main(["list", "models", "--config-path", str(user_configs)]) == 0
    assert "wide_prior" in capsys.readouterr().out.split()
    cfg = RunConfig.from_dict(tiny_run(tmp_path / "o", cases=8, models=[{"name": "wide_prior", "params": {"sigma": 0.4}}]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", XBenchWarning)
        run(cfg, progress=False)
    assert json.loads((tmp_path / "o" / "store" / "phantom" / "wide_prior" / "meta.json").read_text())["params"] == {"sigma": 0.4}


def test_config_path_env_var_and_bad_folder(user_configs, tmp_path):
    import subprocess
    import sys

    env = {**os.environ, "XBENCH_CONFIG_PATH": str(user_configs), "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-m", "xbench.cli", "list", "models"], env=env, capture_output=True, text=True)
    assert out.returncode == 0 and "wide_prior" in out.stdout.split()
    bad = {**env, "XBENCH_CONFIG_PATH": str(tmp_path / "nowhere")}
    out = subprocess.run([sys.executable, "-m", "xbench.cli", "list", "models"], env=bad, capture_output=True, text=True)
    assert out.returncode == 2 and "nowhere is not a folder" in out.stderr and "Traceback" not in out.stderr
    with pytest.raises(XBenchError, match="holds neither models/ nor datasets/"):
        registry.add_search_dir(tmp_path)


def test_installed_packages_add_config_folders_through_entry_points(user_configs, monkeypatch):
    import importlib.metadata

    ep = importlib.metadata.EntryPoint(name="mine", value="os.path:curdir", group="xbench.config_path")
    monkeypatch.setattr(ep.__class__, "load", lambda self: str(user_configs))
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: [ep] if group == "xbench.config_path" else [])
    monkeypatch.setattr(registry, "_ENV_READ", False)
    monkeypatch.delenv("XBENCH_CONFIG_PATH", raising=False)
    assert "wide_prior" in registry.list_models()


# -- logging and progress -----------------------------------------------------------------------------------
def test_progress_is_a_few_log_lines_when_not_a_terminal(caplog):
    from xbench.core.logs import progress_bar

    bar = progress_bar(total=1000, desc="m × d", unit="img")
    with caplog.at_level("INFO", logger="xbench"):
        for _ in range(100):
            bar.update(10)
        bar.close()
    lines = [r.getMessage() for r in caplog.records]
    assert 5 <= len(lines) <= 11 and lines[-1].startswith("m × d: 1000/1000 img")


def test_cli_warnings_are_one_line_without_source(tmp_path, capfd):
    import subprocess
    import sys

    path = tmp_path / "run.yaml"
    raw = tiny_run(tmp_path / "o", cases=8, models=["center_prior"])
    path.write_text(yaml.safe_dump(raw))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-m", "xbench.cli", "run", "--config", str(path)], env=env,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "warnings.warn(" not in out.stderr and "XBenchWarning:" in out.stderr  # rare-class bootstrap notes
    assert "\r" not in out.stderr  # no redrawn bars in a log
    quiet = subprocess.run([sys.executable, "-m", "xbench.cli", "run", "--config", str(path), "--quiet", "--overwrite"],
                           env=env, capture_output=True, text=True)
    assert quiet.returncode == 0 and "img/s" not in quiet.stderr


def test_keep_going_stopped_by_the_preflight_says_so_and_names_no_check(tmp_path, no_predict, caplog):
    cfg = RunConfig.from_dict(tiny_run(tmp_path / "o", models=["center_prior"],
                                       datasets=[{"name": "phantom", "split": "test", "cases": 0}]))
    with caplog.at_level("INFO", logger="xbench"), pytest.raises(PreflightError) as caught:
        run(cfg, progress=True, keep_going=True)
    assert "`--no-check`" in str(caught.value) and "--keep-going" in str(caught.value)
    assert not [r for r in caplog.records if "evaluate:" in r.getMessage()]  # no "evaluate: 0/N pair"
    with pytest.raises(PreflightError) as plain:
        run(cfg, progress=False)
    assert "--no-check" not in str(plain.value)  # the hint is for --keep-going only


def test_an_evaluation_bar_that_counted_nothing_prints_no_last_line(caplog):
    from xbench.core.logs import LineProgress

    with caplog.at_level("INFO", logger="xbench"):
        LineProgress(4, "evaluate", "pair").close()
        bar = LineProgress(4, "evaluate", "pair")
        bar.update(4)
        bar.close()
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == ["evaluate: 4/4 pair"]


@pytest.mark.shared
def test_check_names_missing_images_by_file_fills_split_and_lists_each_problem_once(tmp_path, capsys):
    """Real ChestX-Det10 annotations, no images: files with subfolder and extension, no raw {split}, no repeats."""
    from conftest import shared_path

    root = tmp_path / "cxd"
    root.mkdir()
    for name in ("test.json", "train.json"):
        shutil.copy(shared_path("annotations", "chestx_det10", name), root / name)
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({"output_dir": str(tmp_path / "out"), "datasets": [{"name": "chestx_det10",
                                      "root": str(root)}], "models": ["center_prior",
                                      {"name": "anatomical_prior", "fit_split": "train"}]}))
    assert main(["check", "--config", str(config), "--no-hash"]) == 1
    captured = capsys.readouterr()
    problem = [line for line in captured.out.splitlines() if "PROBLEM:" in line]
    assert len(problem) == 1 and "first missing: test_data/" in problem[0] and ".png" in problem[0]
    assert f"under {root}" in problem[0] and "{split}" not in captured.out and "test_data.zip" in problem[0]
    assert "test_data/" not in captured.err and "1 problem(s)" in captured.err  # listed once, on stdout
    assert "model anatomical_prior: fits on split 'train' when the run starts" in captured.out
    assert "anatomical_prior: fitted" not in captured.out  # nothing is fitted before the run
