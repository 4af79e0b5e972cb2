"""The reproduction driver runs every notebook through papermill, from an installed wheel, on a phantom slice.

The slice is the shipped phantom default (``xbench/configs/runs/phantom.yaml``: its models, grid, thresholds,
bootstrap) on a :data:`CASES`-case phantom test split instead of 300, written to a temporary folder: every notebook
runs and writes its tables and figures the same way in about half the CPU time (CLIP's pass over the cases is the
largest part; ``docs/perf/suite_durations_2core.txt``). This is the suite's one run of the notebooks; ``make reproduce``
runs them on the 300 cases and writes the committed ``figures/``. Tables are checked here on the produced CSVs, not
by comparing notebook outputs.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import NamedTuple

import nbformat
import pandas as pd
import pytest
import yaml

from xbench.spec.config import RunConfig
from xbench.metrics import DATASET_LEVEL
from xbench.workflows.reproduce import notebook_paths

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "xbench" / "configs" / "runs" / "phantom.yaml"
CASES = 60  # phantom test cases of the reproduction's slice (the default has 300)


def slice_config(folder: Path) -> Path:
    """The shipped phantom run config with its phantom test split cut to :data:`CASES` cases, written in ``folder``."""
    raw = yaml.safe_load(CONFIG.read_text())
    raw["datasets"] = [{**entry, "cases": CASES} for entry in raw["datasets"]]
    path = folder / "phantom_slice.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


class WheelReproduce(NamedTuple):
    """What one ``xbench reproduce`` of an installed wheel did (see :func:`wheel_reproduce`)."""
    out: Path
    made: set[str]  # files under ``out`` it wrote (new, or changed since it started)
    site_unchanged: bool  # site-packages as before the run
    work_left: list[str]  # what it left in its (empty) working folder
    stderr: str


def _snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def wheel_reproduce(tmp_path_factory) -> WheelReproduce:
    """The run every test of this module reads: the package's wheel is built and installed in a
    fresh virtual environment; there, from an empty working folder, ``xbench check --config phantom`` finds the shipped
    run config by name, and ``xbench reproduce`` runs the phantom slice (:func:`slice_config`; inference, evaluation,
    every notebook) into a fresh output folder. One reproduction serves both the installed-wheel checks and the tables /
    figures checks."""
    import os
    import subprocess
    import sys
    import sysconfig

    sys.path.insert(0, str(Path(__file__).parents[1] / "project"))
    from test_packaging import PIP, build_wheel

    tmp_path = tmp_path_factory.mktemp("wheel_reproduce")
    wheel, _ = build_wheel(tmp_path)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / ("Scripts" if os.name == "nt" else "bin") / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # a checkout on the path reads as installed
    subprocess.run([*PIP, "--python", str(python), "install", "--no-deps", "--no-index", "-q", str(wheel)], check=True,
                   capture_output=True, env=clean)
    assert (site / "xbench" / "notebooks").is_dir() and (python.parent / "xbench").is_file()
    # then torch & co. from this interpreter (after the install: pip would take an editable xbench there as installed)
    (site / "_test_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    work = tmp_path / "work"
    work.mkdir()
    out = tmp_path / "out"
    config = slice_config(tmp_path)
    before = _snapshot(site)
    env = {"PATH": f"{python.parent}{os.pathsep}/usr/bin{os.pathsep}/bin", "HOME": str(tmp_path / "home"),
           "HF_HUB_OFFLINE": "1",  # matplotlib's backend left to the kernels: their figures show inline
           "XBENCH_CACHE": os.environ.get("XBENCH_CACHE") or str(Path.home() / ".cache" / "xbench")}
    by_name = subprocess.run([str(python.parent / "xbench"), "check", "--config", "phantom", "--output-dir", str(out),
                              "--no-hash"], cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert by_name.returncode == 0, by_name.stderr[-4000:]
    shipped = site / "xbench" / "configs" / "runs" / "phantom.yaml"
    assert f"preflight of {shipped}: OK" in by_name.stdout + by_name.stderr, by_name.stdout[-2000:]
    seeded = _snapshot(out) if out.is_dir() else {}  # the check writes nothing; if it did, it is not counted below
    result = subprocess.run([str(python.parent / "xbench"), "reproduce", "--config", str(config), "--output-dir",
                             str(out), "--device", "cpu", "--timeout", "900", "-q"], cwd=work, env=env,
                            capture_output=True, text=True, timeout=1500)
    assert result.returncode == 0, result.stderr[-4000:]
    made = {k for k, v in _snapshot(out).items() if seeded.get(k) != v}
    return WheelReproduce(out, made, _snapshot(site) == before,
                          sorted(p.name for p in work.iterdir()), result.stderr)


@pytest.fixture(scope="module")
def reproduced(wheel_reproduce: WheelReproduce) -> Path:
    return wheel_reproduce.out


def test_every_notebook_has_a_parameters_cell_and_no_logic():
    for nb_path in notebook_paths():
        nb = nbformat.read(nb_path, as_version=4)
        tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
        assert len(tagged) == 1, f"{nb_path.name}: needs exactly one cell tagged 'parameters'"
        assert all(f"{name} =" in tagged[0].source for name in ("config", "output_dir", "device")), nb_path.name
        for cell in nb.cells:
            if cell.cell_type == "code":
                assert not re.search(r"^\s*(def|class)\s", cell.source, re.M), f"{nb_path.name}: logic belongs in xbench/"
                assert len(cell.source.splitlines()) <= 12, f"{nb_path.name}: a cell longer than 12 lines belongs in xbench/"


def test_notebook_defaults_name_the_phantom_run_from_the_notebooks_folder():
    """Opened in Jupyter from ``notebooks/``, each notebook's own defaults reach the shipped phantom config and its
    ``results/phantom`` on the CPU (the reproduction injects these three; every other default it runs as written)."""
    import ast

    for nb_path in notebook_paths():
        cell = next(c for c in nbformat.read(nb_path, as_version=4).cells if "parameters" in c.metadata.get("tags", []))
        values = {t.id: ast.literal_eval(node.value) for node in ast.parse(cell.source).body
                  if isinstance(node, ast.Assign) for t in node.targets}
        assert (nb_path.parent / values["config"]).resolve() == CONFIG, nb_path.name
        assert (nb_path.parent / values["output_dir"]).resolve() == REPO / "results" / "phantom", nb_path.name
        assert values["device"] == "cpu", nb_path.name


def test_reproduce_writes_every_table_and_figure(reproduced: Path):
    tables, figures = reproduced / "tables", reproduced / "figures"
    for stem in ("table1_grounding", "recognition", "per_class_pointing_phantom"):
        for suffix in (".csv", ".md", ".tex"):
            assert (tables / f"{stem}{suffix}").stat().st_size > 0, f"{stem}{suffix}"
    for stem in ("paper_table1", "paper_table_phantom"):  # the paper's form
        for suffix in (".csv", ".md", ".tex", ".html"):
            assert (tables / f"{stem}{suffix}").stat().st_size > 0, f"{stem}{suffix}"
    for stem in ("fig2_visual_comparison_phantom", "fig3_auc_vs_pointing", "fig3_auc_vs_pointing_per_class",
                 "fig3_paper_auc_vs_pointing", "fig4_calibration_gap", "fig4_threshold_curves", "discrepancy_phantom",
                 "lesion_size", "paper_difference_heatmap"):
        for suffix in (".png", ".pdf"):
            assert (figures / f"{stem}{suffix}").stat().st_size > 1000, f"{stem}{suffix}"
    executed = sorted(p.name for p in (reproduced / "notebooks").glob("*.ipynb"))
    assert executed == [p.name for p in notebook_paths()]


def test_tables_hold_every_model_with_sane_values(reproduced: Path):
    cfg = RunConfig.from_yaml(CONFIG)
    tidy = pd.read_csv(reproduced / "tables" / "metrics.csv")
    assert set(tidy["model"]) == {m.name for m in cfg.models}
    level = tidy[tidy["finding"] == DATASET_LEVEL]
    bounded = level[level["metric"].isin(["pointing", "dice@best", "iou@best", "dice@0.5", "auc", "accuracy"])]
    assert bounded["value"].between(0, 1).all()
    # the CI brackets its point estimate wherever both exist
    with_ci = tidy.dropna(subset=["ci_low", "ci_high"])
    assert ((with_ci["ci_low"] <= with_ci["value"] + 1e-12) & (with_ci["value"] <= with_ci["ci_high"] + 1e-12)).all()
    table1 = pd.read_csv(reproduced / "tables" / "table1_grounding.csv", index_col=0)
    assert set(table1.index) == {m.name for m in cfg.models}
    log = json.loads((reproduced / "tables" / "evaluation_log.json").read_text())
    assert all(sum(p["evaluated"] for p in entry["pairs"].values()) > 0 for entry in log)


def test_reference_models_beat_the_centre_prior_on_large_findings(reproduced: Path):
    tidy = pd.read_csv(reproduced / "tables" / "metrics.csv")
    pointing = tidy[tidy["metric"] == "pointing"].pivot_table(index="finding", columns="model", values="value")
    large = ["Cardiomegaly", "Pleural Effusion"]
    for model in ("ref_xattn", "ref_patchsim"):
        assert pointing.loc[large, model].mean() > pointing.loc[large, "center_prior"].mean() + 0.1, model
        assert pointing.loc[large, model].mean() > pointing.loc[["Nodule", "Pneumothorax"], model].mean(), model


def test_every_analysis_notebook_opens_the_run_with_one_call():
    """The notebooks call ``xbench.open_run`` instead of repeating the setup lines."""
    for nb_path in notebook_paths():
        if nb_path.name.startswith("00_"):
            continue  # the notebook that makes the run
        source = "\n".join(c.source for c in nbformat.read(nb_path, as_version=4).cells if c.cell_type == "code")
        assert "xbench.open_run(config" in source, nb_path.name
        assert "RunConfig.from_yaml" not in source and "load_tables(" not in source, nb_path.name


def test_figures_show_inline_and_tables_state_their_data(reproduced: Path):
    executed = reproduced / "notebooks"
    for name in ("04_fig2_visual_comparison", "05_fig3_auc_vs_pointing", "06_fig4_calibration_gap", "09_compare_with_paper"):
        nb = nbformat.read(executed / f"{name}.ipynb", as_version=4)
        images = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
        assert images, f"{name}: no inline figure"
    md = (reproduced / "tables" / "paper_table1.md").read_text()
    assert "Cases skipped at inference" in md and f"phantom: 0 of {CASES}" in md and "ranked only where n ≥ 30" in md
    per_class = (reproduced / "tables" / "per_class_pointing_phantom.md").read_text()
    assert " n=" in per_class and "cells with n < 30 are not ranked" in per_class


def test_comparison_notebook_on_the_phantom_says_no_value_comparison_is_meaningful(reproduced: Path):
    nb = nbformat.read(reproduced / "notebooks" / "09_compare_with_paper.ipynb", as_version=4)
    printed = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
                      if o.get("name") == "stdout")
    assert "No comparison of values is meaningful" in printed
    comparison = pd.read_csv(reproduced / "tables" / "paper_comparison.csv")
    assert len(comparison) == 539 and comparison["run"].isna().all()  # every published cell, none matched
    denominators = pd.read_csv(reproduced / "tables" / "paper_denominators.csv").set_index(["dataset", "finding"])
    assert denominators.loc[("rsna_pneumonia", "Pneumonia"), "expected_n"] == 1218  # from the manifests
    assert denominators["run_n"].isna().all()


def test_comparison_notebook_on_a_synthetic_7x7_result_set(tmp_path):
    """The comparison notebook on a synthetic 7-model x 7-dataset result set (manifests' expected counts)."""
    import papermill as pm

    nb = next(p for p in notebook_paths() if p.name.startswith("09_"))
    out = tmp_path / "synthetic"
    pm.execute_notebook(str(nb), str(tmp_path / nb.name), kernel_name="python3", progress_bar=False, cwd=str(nb.parent),
                        parameters={"config": str(CONFIG), "output_dir": str(out), "device": "cpu", "synthetic": True})
    comparison = pd.read_csv(out / "tables" / "paper_comparison.csv")
    assert len(comparison) == 539 and comparison["run"].notna().all()  # every published cell has a run value
    assert set(comparison["paper_in_ci"].dropna()) <= {True, False}
    denominators = pd.read_csv(out / "tables" / "paper_denominators.csv").set_index(["dataset", "finding"])
    nih = denominators.loc["nih_bbox"]
    assert (nih["run_n"] == nih["expected_n"]).all() and (nih["fit_run"] == 7).all()
    assert denominators.loc[("siim_acr", "Pneumothorax"), "fit_run"] == 1  # 515 positives fit 1 of 7 printed values
    assert (out / "figures" / "paper_difference_heatmap.png").stat().st_size > 1000
    executed = nbformat.read(tmp_path / nb.name, as_version=4)
    printed = "".join(o.get("text", "") for c in executed.cells for o in c.get("outputs", []) if o.get("name") == "stdout")
    assert "Synthetic result set" in printed


@pytest.mark.slow
def test_wheel_reproduce_by_name_writes_only_under_its_output_folder(wheel_reproduce: WheelReproduce):
    """The installed wheel's ``xbench reproduce`` (of the phantom slice; the shipped ``phantom`` found
    by name in the fixture), started in an empty folder, leaves site-packages unchanged and writes everything under
    ``--output-dir``."""
    assert wheel_reproduce.site_unchanged, "xbench reproduce wrote into site-packages"
    assert wheel_reproduce.work_left == [], "xbench reproduce wrote into its working folder"
    assert {"my_maps/tables/metrics.parquet", "tables/paper_table1.md", "notebooks/10_score_your_maps.ipynb",
            "figures/fig3_auc_vs_pointing.pdf", "report.html"} <= wheel_reproduce.made
    assert {f"notebooks/{p.name}" for p in notebook_paths()} <= wheel_reproduce.made  # every notebook ran
    stderr = wheel_reproduce.stderr
    assert "No pretrained weights" not in stderr and "without encryption" not in stderr  # -q, IPC kernels
