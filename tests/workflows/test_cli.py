"""The ``xbench`` command line: run / evaluate / merge / list, argument and config errors (exit code 2, stderr)."""
from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml

from xbench.cli import main
from xbench.core.errors import XBenchWarning
from xbench.spec.registry import list_datasets, list_models

CASES = 22


pytestmark = pytest.mark.usefixtures("phantom_cache")


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", XBenchWarning)
        yield


def write_config(folder: Path, output_dir: Path, **changes) -> Path:
    raw = {"output_dir": str(output_dir), "datasets": [{"name": "phantom", "split": "test", "cases": CASES}],
           "models": ["center_prior", "random_prior"], "grid": [32, 32], "chunk_size": 8, "batch_size": 8,
           "bootstrap": {"replicates": 10}, **changes}
    path = folder / "run.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory, phantom_cache) -> dict:
    """`xbench run --quiet` once for the module."""
    torch.set_num_threads(1)
    folder = tmp_path_factory.mktemp("cli")
    out = folder / "out"
    config = write_config(folder, out)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", XBenchWarning)
        code = main(["run", "--config", str(config), "--quiet"])
    return {"code": code, "config": config, "out": out, "folder": folder}


def test_run_writes_tables_and_exits_zero(cli_run):
    assert cli_run["code"] == 0
    tidy = pd.read_parquet(cli_run["out"] / "tables" / "metrics.parquet")
    assert set(tidy["model"]) == {"center_prior", "random_prior"}
    assert (cli_run["out"] / "run_log.json").exists()


def test_run_prints_where_the_results_are(tmp_path, capsys):
    config = write_config(tmp_path, tmp_path / "out", models=["center_prior"])
    assert main(["run", "--config", str(config), "--quiet", "--no-eval"]) == 0
    assert f"results in {tmp_path / 'out'}" in capsys.readouterr().out
    assert not (tmp_path / "out" / "tables").exists()  # --no-eval only fills the store


def test_output_dir_override(cli_run, tmp_path):
    other = tmp_path / "elsewhere"
    assert main(["run", "--config", str(cli_run["config"]), "--output-dir", str(other), "--quiet",
                 "--device", "cpu"]) == 0
    pd.testing.assert_frame_equal(pd.read_parquet(other / "tables" / "metrics.parquet"),
                                  pd.read_parquet(cli_run["out"] / "tables" / "metrics.parquet"))


def test_evaluate_rebuilds_the_tables_from_the_store(cli_run, tmp_path, capsys):
    out = tmp_path / "copy"
    shutil.copytree(cli_run["out"], out)
    shutil.rmtree(out / "tables")
    assert main(["evaluate", "--config", str(cli_run["config"]), "--output-dir", str(out)]) == 0
    assert f"tables in {out}/tables" in capsys.readouterr().out
    pd.testing.assert_frame_equal(pd.read_parquet(out / "tables" / "metrics.parquet"),
                                  pd.read_parquet(cli_run["out"] / "tables" / "metrics.parquet"))


def test_sharded_runs_then_merge(cli_run, tmp_path, capsys):
    config = str(cli_run["config"])
    for i in range(2):
        assert main(["run", "--config", config, "--shard", f"{i}/2", "--output-dir", str(tmp_path / f"s{i}"),
                     "--quiet"]) == 0
        assert (tmp_path / f"s{i}" / f"run_log.shard{i}of2.json").exists()
    merged = tmp_path / "merged"
    assert main(["merge", "--config", config, "--from", str(tmp_path / "s0"), str(tmp_path / "s1"),
                 "--output-dir", str(merged)]) == 0
    assert f"results in {merged}" in capsys.readouterr().out
    pd.testing.assert_frame_equal(pd.read_parquet(merged / "tables" / "metrics.parquet"),
                                  pd.read_parquet(cli_run["out"] / "tables" / "metrics.parquet"))
    # the merged folder has one run log and one skipped-cases table, as an unsharded run writes them
    import json

    merged_log = json.loads((merged / "run_log.json").read_text())
    shard_logs = [json.loads((tmp_path / f"s{i}" / f"run_log.shard{i}of2.json").read_text()) for i in range(2)]
    assert len(merged_log) == sum(map(len, shard_logs)) > 0
    assert {e["shard"] for e in merged_log} == {"0of2", "1of2"}
    assert (merged / "skipped_cases.csv").read_text().startswith("dataset,model,case_id,reason,file,message")


@pytest.mark.parametrize("what, expected", [("models", list_models), ("datasets", list_datasets)])
def test_list(capsys, what, expected):
    assert main(["list", what, "--names"]) == 0
    lines = capsys.readouterr().out.split()
    assert lines == expected()
    assert ("center_prior" if what == "models" else "phantom") in lines
    assert main(["list", what]) == 0  # the table: one row per name, under a header
    rows = capsys.readouterr().out.split("\n\n")[0].splitlines()
    assert rows[0].startswith("NAME ") and [r.split()[0] for r in rows[1:]] == expected()


@pytest.mark.parametrize("shard, message", [("1-2", "--shard takes i/n"), ("a/b", "--shard takes i/n"),
                                            ("2/2", "0 <= i < n"), ("-1/2", "0 <= i < n")])
def test_bad_shard_syntax_is_a_usage_error(tmp_path, capsys, shard, message):
    with pytest.raises(SystemExit) as exit_:
        main(["run", "--config", str(tmp_path / "x.yaml"), f"--shard={shard}"])
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_config_error_exits_2_with_a_message_on_stderr(tmp_path, capsys):
    config = write_config(tmp_path, tmp_path / "out", pointing_ties="all")
    assert main(["run", "--config", str(config), "--quiet"]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("xbench: error:")
    assert str(config) in captured.err and "pointing_ties" in captured.err
    assert captured.out == ""


def test_missing_config_file_exits_2(tmp_path, capsys):
    assert main(["evaluate", "--config", str(tmp_path / "absent.yaml")]) == 2
    err = capsys.readouterr().err
    assert "xbench: error: Missing run config" in err and "absent.yaml" in err


def test_evaluate_with_missing_chunks_exits_2_naming_them(cli_run, tmp_path, capsys):
    out = tmp_path / "copy"
    shutil.copytree(cli_run["out"], out)
    (out / "store" / "phantom" / "center_prior" / "chunk-00001.npz").unlink()
    assert main(["evaluate", "--config", str(cli_run["config"]), "--output-dir", str(out)]) == 2
    assert "chunks [1] of 3 are missing" in capsys.readouterr().err


def test_unknown_command_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["frobnicate"])
    assert exit_.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_manifest_check_and_build_through_the_cli(tmp_path, capsys):
    from conftest import shared_path

    os.symlink(shared_path("annotations", "chestx_det10", "test.json"), tmp_path / "test.json")
    assert main(["manifest", "check", "chestx_det10", "--root", str(tmp_path)]) == 1  # images/ are absent
    out = capsys.readouterr().out
    assert "MISSING" in out and "cases: 542 (expected 542)" in out
    assert main(["manifest", "build", "chestx_det10", "--root", str(tmp_path), "--out", str(tmp_path / "cases.csv")]) == 0
    assert len(pd.read_csv(tmp_path / "cases.csv")) == 542


def test_the_command_freezes_live_objects_before_exiting_with_mains_code(monkeypatch, capsys):
    """`xbench` (console) exits with main's code, the live objects frozen so the interpreter's last collection
    skips them; main alone, called in-process as here, leaves the collector as it was."""
    import gc

    import xbench.cli as cli

    frozen = gc.get_freeze_count()
    assert main(["list", "models", "--names"]) == 0
    assert gc.get_freeze_count() == frozen
    seen: list[int] = []
    monkeypatch.setattr(cli, "main", lambda: seen.append(gc.get_freeze_count()) or 3)
    try:
        with pytest.raises(SystemExit) as exit_:
            cli.console()
        assert exit_.value.code == 3
        assert seen == [frozen]  # main ran before the freeze
        assert gc.get_freeze_count() > frozen
    finally:
        gc.unfreeze()


def test_the_installed_command_and_the_module_run_the_console_entry():
    tomllib = pytest.importorskip("tomllib", reason="tomllib needs Python 3.11+")
    scripts = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["xbench"] == "xbench.cli:console"
    source = (Path(__file__).parents[2] / "xbench" / "cli.py").read_text()
    assert source.rstrip().endswith('if __name__ == "__main__":\n    console()')


def test_score_printout_names_the_model_of_each_row():
    """`xbench score --compare-with RUN` prints every model's dataset-level rows: each row says whose it is."""
    import pandas as pd

    from xbench.cli import _score_summary
    from xbench.metrics import DATASET_LEVEL

    rows = [{"model": m, "dataset": "phantom", "finding": f, "metric": k, "value": v, "ci_low": v - 0.1,
             "ci_high": v + 0.1, "n_pairs": 30, "n_cases": 40, "n_classes": 6}
            for m, v in (("ref_xattn", 0.5), ("user_maps", 0.25), ("center_prior", 0.125))
            for f in (DATASET_LEVEL, "Nodule") for k in ("pointing", "dice@best")]
    text = _score_summary(pd.DataFrame(rows), "user_maps").splitlines()
    assert text[0].split()[:3] == ["model", "metric", "value"] and len(text) == 1 + 6
    assert [line.split()[0] for line in text[1:]] == ["user_maps"] * 2 + ["center_prior"] * 2 + ["ref_xattn"] * 2


def test_an_unknown_option_shows_its_commands_usage_and_a_close_match(capsys):
    from xbench.cli import main

    with pytest.raises(SystemExit) as caught:
        main(["report", "--run", "somewhere", "--output", "r.html"])
    err = capsys.readouterr().err
    assert caught.value.code == 2 and err.startswith("usage: xbench report") and "did you mean --out?" in err


def test_every_reproduce_option_has_help_text():
    from xbench.cli import build_parser

    command = build_parser().get_default("_commands")["reproduce"]
    bare = [a.option_strings[0] for a in command._actions if a.option_strings and not a.help]
    assert not bare, f"options without help text: {bare}"
