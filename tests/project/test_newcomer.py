"""A newcomer's first hour (issue 23): names, messages, quiet and fast CLI, skipped cases named, paper tables."""
from __future__ import annotations

import csv
import json
import logging
import os
import subprocess
import re
import sys
from pathlib import Path

import pytest
import yaml

import xbench
from xbench.cli import main
from xbench.spec.config import RunConfig
from xbench.core.errors import UnknownNameError, XBenchError, XBenchWarning
from xbench.core.logs import setup_logging

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], env=ENV, cwd=REPO, capture_output=True, text=True, timeout=120)


# -- 11: --help and usage errors without torch ----------------------------------------------------------------------
def test_help_and_usage_errors_import_no_torch_and_take_under_a_second():
    code = ("import sys, time, contextlib, io\nt = time.perf_counter()\nimport xbench.cli\n"
            "for argv in (['--help'], ['run'], ['list', 'modles']):\n"
            "    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
            "        try: xbench.cli.main(argv)\n"
            "        except SystemExit as e: assert e.code == (0 if argv == ['--help'] else 2), (argv, e.code)\n"
            "print(time.perf_counter() - t, 'torch' in sys.modules, 'numpy' in sys.modules)")
    result = _python(code)
    seconds, torch_loaded, numpy_loaded = result.stdout.split()
    assert result.returncode == 0, result.stderr
    assert torch_loaded == "False" and numpy_loaded == "False"
    assert float(seconds) < 1.0


def test_lazy_package_keeps_its_public_names():
    assert xbench.load_dataset is xbench.datasets.load_dataset
    assert callable(xbench.evaluate_maps) and xbench.metrics.__name__ == "xbench.metrics"
    assert set(xbench.__all__) <= set(dir(xbench))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        xbench.nope  # noqa: B018


# -- 2: shipped configs by name ---------------------------------------------------------------------------------------
def test_shipped_configs_by_name_and_unknown_name_lists_them(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # an empty folder, as after `pip install xbench`
    cfg = RunConfig.from_yaml("phantom")
    assert Path(cfg.source).name == "phantom.yaml" and Path(cfg.source).is_file()
    assert RunConfig.from_yaml("paper").datasets
    # the README's path, typed outside a checkout, is the shipped config
    assert Path(RunConfig.from_yaml("xbench/configs/runs/phantom.yaml").source).samefile(cfg.source)
    with pytest.raises(UnknownNameError, match=r"Did you mean 'phantom'\? Available: beyond, paper, phantom\."):
        RunConfig.from_yaml("phantm")
    assert main(["check", "--config", "nonesuch"]) == 2
    assert "Unknown run config 'nonesuch'. Available: beyond, paper, phantom." in capsys.readouterr().err
    assert main(["evaluate", "--config", str(tmp_path / "absent.yaml")]) == 2
    err = capsys.readouterr().err
    assert "Missing run config" in err and "Shipped configs, usable by name (--config NAME): beyond, paper, phantom." in err


# -- 3: list tables, sources in missing-file messages -----------------------------------------------------------------
def test_list_models_and_datasets_are_tables_from_the_yamls(capsys):
    assert main(["list", "models"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["NAME", "KIND", "WEIGHTS", "PUBLISHER", "PAPER_GROUP", "INPUT_SIZE"]
    kad = next(line for line in lines if line.startswith("kad "))
    assert "best_valid.pt, Med-KEBERT/" in kad and "https://github.com/xiaoman-zhang/KAD" in kad
    assert "cross-attention" in kad and kad.split()[-1] == "224"
    assert "VLM, unverified" in next(line for line in lines if line.startswith("devide "))
    assert main(["list", "datasets"]) == 0
    lines = capsys.readouterr().out.splitlines()
    nih = next(line for line in lines if line.startswith("nih_bbox "))
    assert "https://nihcc.app.box.com/v/ChestXray-NIHCC" in nih and "880 (test)" in nih and "NIH Clinical Center" in nih
    assert main(["list", "datasets", "--names"]) == 0
    assert capsys.readouterr().out.split() == xbench.list_datasets()


def test_missing_weights_problem_names_where_to_get_each_file(tmp_path, monkeypatch):
    from xbench.preflight import preflight

    monkeypatch.delenv("XBENCH_WEIGHTS", raising=False)
    monkeypatch.setenv("XBENCH_CACHE", str(tmp_path / "cache"))
    raw = {"output_dir": str(tmp_path / "o"), "datasets": [{"name": "phantom", "split": "test", "cases": 4}],
           "models": ["kad"]}
    problems = " ".join(preflight(RunConfig.from_dict(raw), decode=False).problems)
    assert "best_valid.pt ← https://drive.google.com/drive/folders/1xWVVJRfnm_wIgUpbn9ftsW4K5XKU0i0-" in problems
    assert "Med-KEBERT/ ← https://huggingface.co/xmcmic/Med-KEBERT" in problems


# -- 4, 8, 5, 12: skipped cases named, progress of work done, paper tables, --keep-going ------------------------------
@pytest.fixture()
def damaged_dataset(tmp_path, monkeypatch):
    """A private 10-case phantom split with one image deleted and one truncated (not decodable)."""
    monkeypatch.setenv("XBENCH_CACHE", str(tmp_path / "cache"))
    data = xbench.load_dataset("phantom", split="test", cases=10)
    paths = [Path(p) for p in data.cases["image_path"]]
    paths[1].unlink()
    paths[3].write_bytes(paths[3].read_bytes()[:40])
    ids = data.cases["case_id"].astype(str).tolist()
    raw = {"output_dir": str(tmp_path / "run"), "datasets": [{"name": "phantom", "split": "test", "cases": 10}],
           "models": ["center_prior", "random_prior"], "grid": [32, 32], "chunk_size": 4, "batch_size": 4,
           "bootstrap": {"replicates": 0}, "on_missing_image": "skip"}
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(raw))
    return {"config": config, "out": tmp_path / "run", "missing": (ids[1], paths[1]), "corrupt": (ids[3], paths[3])}


def test_skipped_cases_are_named_in_log_run_log_and_csv(damaged_dataset, capsys):
    d = damaged_dataset
    setup_logging(0)  # route warnings into logging before pytest.warns records them
    with pytest.warns(XBenchWarning) as warned:
        assert main(["run", "--config", str(d["config"]), "--no-check"]) == 0
    captured = capsys.readouterr()
    text = [str(w.message) for w in warned if "center_prior × phantom: skipped 2" in str(w.message)]
    for case_id, path in (d["missing"], d["corrupt"]):
        assert f"{case_id} {path}" in text[0]  # first case of each reason, with its file, in the log line
    entry = json.loads((d["out"] / "run_log.json").read_text())[0]
    examples = entry["skipped_examples"]
    assert set(examples) == {"MissingFileError", "FormatError"}
    assert examples["MissingFileError"][0]["case_id"] == d["missing"][0]
    assert examples["FormatError"][0]["file"] == str(d["corrupt"][1]) and examples["FormatError"][0]["message"]
    with open(d["out"] / "skipped_cases.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 4  # 2 cases × 2 models, each named
    assert {(r["model"], r["case_id"], r["reason"]) for r in rows} == {
        (m, c, r) for m in ("center_prior", "random_prior")
        for c, r in ((d["missing"][0], "MissingFileError"), (d["corrupt"][0], "FormatError"))}
    # progress counts work done, skips apart (8 of 10 images read by each of the 2 models, stepped in turn: one line
    # for the dataset, counting image-model passes)
    last = [line for line in captured.err.splitlines() if line.startswith("xbench: 2 models × phantom: ")][-1]
    assert re.match(r"xbench: 2 models × phantom: 16/20 pass done, 4 skipped \(\d", last), last
    # `xbench run` writes the paper-form tables beside the tidy ones
    for suffix in (".csv", ".md", ".tex"):
        assert (d["out"] / "tables" / "paper" / f"table1_grounding{suffix}").stat().st_size > 0
    assert "paper form in tables/paper" in captured.out


def test_check_deep_decodes_every_image_and_lists_unreadable(damaged_dataset, capsys):
    d = damaged_dataset
    assert main(["check", "--config", str(d["config"]), "--no-hash"]) == 0  # existence only: the truncated file passes
    capsys.readouterr()
    assert main(["check", "--config", str(d["config"]), "--no-hash", "--deep"]) == 1
    out = capsys.readouterr().out
    assert "decoded 8 of 9 present images, 1 unreadable" in out
    assert f"UNREADABLE {d['corrupt'][0]} {d['corrupt'][1]}: FormatError" in out


def test_run_keep_going_runs_the_other_pairs_and_lists_failures(damaged_dataset, monkeypatch, capsys):
    import xbench.workflows.run as pipeline
    import xbench.inference.runner as runner

    real = runner.PairRun.steps

    def failing(self):  # the pair fails at its first step, while the other model of the dataset is stepped on
        if self.mspec.name == "center_prior":
            raise XBenchError("boom in center_prior")
        yield from real(self)

    monkeypatch.setattr(runner.PairRun, "steps", failing)
    d = damaged_dataset
    assert main(["run", "--config", str(d["config"]), "--no-check", "--keep-going", "-q"]) == 2
    err = capsys.readouterr().err
    assert "1 model × dataset pair(s) failed (the others ran; no tables computed): - center_prior × phantom: boom" in err
    log = {e["model"]: e for e in json.loads((d["out"] / "run_log.json").read_text())}
    assert log["center_prior"]["failed"] == "boom in center_prior" and log["random_prior"]["chunks_written"] == 3
    with pytest.raises(XBenchError, match="boom"):  # without --keep-going the first failure stops the run
        pipeline.run(RunConfig.from_yaml(d["config"]), progress=False, check=False)


# -- 1, 6, 10, 12: reproduce writes under its output folder, relays progress, takes -p; quiet kernels ---------------
def _notebook(path: Path, source: str, params: str = 'config = ""\noutput_dir = ""\ndevice = "cpu"') -> None:
    import nbformat

    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell(params)
    cell.metadata["tags"] = ["parameters"]
    nb.cells = [cell, nbformat.v4.new_code_cell(source)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)


def test_reproduce_writes_relative_paths_under_output_dir_relays_progress_and_takes_parameters(tmp_path, capfd,
                                                                                              monkeypatch):
    from xbench.workflows.reproduce import reproduce

    nbs = tmp_path / "nbs"
    nbs.mkdir()
    _notebook(nbs / "01_write.ipynb",
              "import logging, xbench\nfrom pathlib import Path\nPath('rel.txt').write_text(f'{greeting} {repeat}')\n"
              "logging.getLogger('xbench.test').info('inside the notebook: %s', greeting)",
              params='config = ""\noutput_dir = ""\ndevice = "cpu"\ngreeting = "hello"\nrepeat = 1')
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump({"output_dir": "x", "datasets": ["phantom"], "models": ["center_prior"]}))
    monkeypatch.chdir(tmp_path)
    logging.getLogger("xbench").setLevel(logging.INFO)
    with pytest.raises(XBenchError, match="-p greting: no notebook declares this parameter. Did you mean 'greeting'"):
        reproduce(cfg, output_dir=tmp_path / "out", notebooks=nbs, check=False, parameters={"greting": 1})
    reproduce(cfg, output_dir=tmp_path / "out", notebooks=nbs, progress=False, check=False,
              parameters={"greeting": "bonjour", "repeat": 3})
    assert (tmp_path / "out" / "rel.txt").read_text() == "bonjour 3"  # relative writes land in the output folder
    assert not (nbs / "rel.txt").exists() and not (tmp_path / "rel.txt").exists()
    err = capfd.readouterr().err
    assert "xbench: inside the notebook: bonjour" in err  # the kernel's log lines, relayed while it runs
    assert "without encryption" not in err and "IPKernelApp" not in err


# -- 9: deterministic PDFs --------------------------------------------------------------------------------------------
def test_figures_are_byte_identical_and_carry_no_creation_date(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from xbench.outputs.figures import save_figure

    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    first = [p.read_bytes() for p in save_figure(fig, tmp_path / "a" / "f")]
    second = [p.read_bytes() for p in save_figure(fig, tmp_path / "b" / "f")]
    plt.close(fig)
    assert first == second and b"CreationDate" not in first[1]


# -- 10: -q silences third-party warnings, -v shows debug detail -----------------------------------------------------
def test_quiet_silences_third_party_warnings_but_not_xbench_ones():
    code = ("import logging, warnings\nfrom xbench.core.logs import setup_logging\nfrom xbench.core.errors import XBenchWarning\n"
            "setup_logging(-1)\nlogging.warning('No pretrained weights loaded')\n"
            "warnings.warn('third-party', FutureWarning)\nwarnings.warn('counted skip', XBenchWarning)\n")
    err = _python(code).stderr
    assert "No pretrained weights" not in err and "third-party" not in err and "counted skip" in err
    err = _python(code.replace("setup_logging(-1)", "setup_logging(0)")).stderr
    assert "No pretrained weights" in err  # the default still shows them


def test_verbose_adds_debug_detail(capsys):
    assert main(["list", "datasets", "--names"]) == 0
    quiet_err = capsys.readouterr().err
    assert main(["list", "datasets", "--names", "-v"]) == 0
    err = capsys.readouterr().err
    assert quiet_err == "" and "xbench: arguments: " in err and "dataset manifest folders" in err
    logging.getLogger("xbench").setLevel(logging.INFO)


# -- 13: [dev] installs what the tests import --------------------------------------------------------------------------
def test_dev_extra_holds_opencv_and_no_test_skips_for_it():
    dev = re.search(r"^dev = \[(.*?)\]", (REPO / "pyproject.toml").read_text(), re.M | re.S).group(1)
    assert '"opencv-python-headless' in dev  # tests/models/test_input_handling.py imports cv2 without a skip
    source = "\n".join(p.read_text() for p in (REPO / "tests").rglob("*.py") if p.name != "test_newcomer.py")
    assert 'importorskip("cv2")' not in source and "import cv2" in source


# -- 14: Table 2 in the paper's layout; the paper's own underline slip ------------------------------------------------
def test_table2_prints_two_rows_per_model_like_the_paper(tmp_path):
    from xbench.paper import TABLE_CLASSES, synthetic_results
    from xbench.outputs.tables import paper_class_table

    t = paper_class_table(synthetic_results(), "vindr_cxr")
    classes = list(TABLE_CLASSES[2])
    assert t.wrap == 12 and t.values.shape[1] == 22  # the data stay one row per model (CSV, HTML)
    lines = t.to_markdown().splitlines()
    assert lines[2] == "| Method | Mean | " + " | ".join(classes[:11]) + " |"
    assert lines[4] == "| |  | " + " | ".join(f"*{c}*" for c in classes[11:]) + " |  |"  # none under Mean, as printed
    clip = next(i for i, line in enumerate(lines) if line.startswith("| CLIP | "))
    assert lines[clip + 1].startswith("|  | ") and lines[clip + 1].count("|") == 14  # second row: the other 10
    tex = t.to_latex()
    assert r"\begin{tabular}{l" + "c" * 12 + "}" in tex and tex.count(r"\\") == 2 + 2 * len(t.values)
    assert paper_class_table(synthetic_results(), "nih_bbox").wrap is None  # Tables 3–5 fit one row


def test_papers_table3_underlines_devide_infiltration_though_medklip_is_higher():
    """docs/known-differences.md: the paper's own Table 3 marks DeViDe's 47.15 second best for Infiltration."""
    from xbench.paper import load_reference

    ref = load_reference()
    inf = ref[(ref["table"] == 3) & (ref["paper_class"] == "INF")].set_index("model")
    assert inf.at["devide", "mark"] == "underline" and inf.at["devide", "value"] == 47.15
    assert inf.at["medklip", "value"] == 51.22 and inf.at["carzero", "value"] == 74.8
    assert sorted(inf["value"], reverse=True)[1] == 51.22  # the second best is MedKLIP's


def test_keep_going_with_an_unreadable_image_lists_every_model_of_the_dataset(damaged_dataset, capsys):
    """``on_missing_image: raise``: the shared decoding meets the missing file; every model waiting for it fails
    with it (noted, not hung), the run log is written and the run ends with the failures listed."""
    d = damaged_dataset
    raw = yaml.safe_load(d["config"].read_text())
    raw["on_missing_image"] = "raise"
    d["config"].write_text(yaml.safe_dump(raw))
    assert main(["run", "--config", str(d["config"]), "--no-check", "--keep-going", "-q"]) == 2
    err = capsys.readouterr().err
    assert "2 model × dataset pair(s) failed" in err and "Missing image" in err
    log = {e["model"]: e for e in json.loads((d["out"] / "run_log.json").read_text())}
    assert set(log) == {"center_prior", "random_prior"}
    assert all(str(d["missing"][1]) in log[m]["failed"] for m in log), log
