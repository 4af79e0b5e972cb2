"""Paired model comparisons (xbench.metrics.compare, xbench.evaluation.comparisons): known answers.

* null data: three correlated exchangeable models at n = 30 through scored_table + compare_models — the
  Holm-corrected permutation test's family-wise error is ≤ 5 % + 2 Monte-Carlo SE for every compared metric
  (benchmarks/bench_significance.py, smaller); the bootstrap CIs cover the true difference 93–97 % of the time,
  also for a known non-zero difference; the permutation p is exact for small n and seeded;
* a model against an exact copy of itself is never significant;
* on the phantom, a reference model beats the random prior significantly, and the run writes
  comparisons.csv / ranks.csv, the paper tables' marks and the report section.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from scipy.stats import norm

from conftest import tiny_run
from xbench.datasets import open_dataset
from xbench.evaluation.comparisons import compare_dataset, comparisons_blocks, load_comparisons, pairwise_matrix
from xbench.spec.config import RunConfig
from xbench.core.errors import XBenchError
from xbench.evaluation.evaluate import load_tables
from xbench.store.results import read_chunk_file
from xbench.metrics import DATASET_LEVEL, ScoredTable, bootstrap_ci, compare_models, scored_table
from xbench.metrics.compare import (COMPARISON_COLUMNS, RANK_COLUMNS, bootstrap_p_value, compared_metrics, holm,
                                    permutation_p_values, rank_intervals)
from xbench.workflows.run import run

N_CASES, N_BOOT, SIMS_PER_BLOCK = 150, 1000, 50  # each block of 50 simulations has its own resamples
BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_significance.py"


def _simulate(rng: np.random.Generator, shift: float, models: int, block: int) -> dict[str, ScoredTable]:
    """``SIMS_PER_BLOCK`` simulated datasets as the 'findings' of one table per model: per case a difficulty
    u ~ Beta(2, 2) shared by the models, a model's per-case score u + N(0, 0.25²) (model 1 shifted by −shift),
    the statistic the mean over cases; replicates from the library's bootstrap (one resample per replicate,
    shared by every model and simulation of the block). No statistic: the bootstrap's Wald test."""
    u = rng.beta(2, 2, size=(N_CASES, 1, SIMS_PER_BLOCK))
    x = u + rng.normal(0, 0.25, size=(N_CASES, models, SIMS_PER_BLOCK))
    x[:, 1] -= shift
    flat = x.reshape(N_CASES, -1)
    ci = bootstrap_ci(lambda w: (w @ flat) / w.sum(axis=1, keepdims=True), N_CASES, n_boot=N_BOOT, seed=block)
    reps = ci.replicates.reshape(N_BOOT, models, SIMS_PER_BLOCK)
    findings = [f"sim{block}-{s}" for s in range(SIMS_PER_BLOCK)]
    cases = pd.RangeIndex(N_CASES)
    return {f"m{m}": ScoredTable(pd.DataFrame({"finding": findings, "metric": "pointing", "value": ci.value.reshape(
        models, SIMS_PER_BLOCK)[m]}), reps[:, m], cases) for m in range(models)}


def _null_study(shift: float, models: int, blocks: int) -> pd.DataFrame:
    rng = np.random.default_rng(2026)
    return pd.concat([compare_models(_simulate(rng, shift, models, b), dataset="sim", metrics=["pointing"],
                                     test="bootstrap")[0] for b in range(blocks)], ignore_index=True)


def _bench():
    spec = importlib.util.spec_from_file_location("bench_significance", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_permutation_test_keeps_its_level_at_small_n_for_every_metric():
    """The paper tables' smallest n (30 images), three correlated exchangeable models, every compared metric
    through scored_table + compare_models: the family-wise error (Holm over the 3 pairs) of 300 null datasets is
    at most 5 % + 2 Monte-Carlo SE (≈ 2.5 points) per metric. A test rejecting 7.5 % or more fails this bound."""
    study = _bench().study(30, 3, 300, n_perm=200, seed=11, block=100)
    fwer = study.groupby("metric")["any"].mean()
    assert set(fwer.index) == set(compared_metrics()) and (study.groupby("metric").size() == 300).all()
    bound = 0.05 + 2 * np.sqrt(0.05 * 0.95 / 300)
    assert (fwer <= bound).all(), fwer.to_dict()
    assert fwer.mean() >= 0.01, fwer.to_dict()  # not trivially conservative either
    power = _bench().study(30, 3, 100, shift=1.0, n_perm=200, seed=12, block=100).groupby("metric")["true"].mean()
    assert (power >= 0.3).all(), power.to_dict()  # a shift of one SD (quality, score logit) is found at n = 30


def test_bootstrap_wald_test_keeps_its_cis_and_level_at_n_150():
    comp = _null_study(shift=0.0, models=3, blocks=20)  # 1,000 simulations: the rate's standard error ≈ 0.7 points
    assert len(comp) == 3 * SIMS_PER_BLOCK * 20 and (comp["family_size"] == 3).all()
    family_wise = comp.groupby("finding")["significant"].any().mean()  # any of the 3 pairs rejected (Holm)
    assert family_wise <= 0.05 + 2 * np.sqrt(0.05 * 0.95 / 1000), family_wise
    coverage = ((comp["ci_low"] <= 0) & (0 <= comp["ci_high"])).mean()  # true difference 0
    assert 0.93 <= coverage <= 0.97, coverage


def test_permutation_p_value_is_exact_for_small_n_and_seeded():
    """n = 8 images: all 2^8 swaps are enumerated; the p-value is the share of swaps at least as extreme."""
    labels = pd.DataFrame({"A": [1, 0] * 4}, index=[f"c{i}" for i in range(8)])
    rng = np.random.default_rng(0)
    tables = {m: scored_table(None, model=m, dataset="d", labels=labels, n_boot=0,
                              scores=pd.DataFrame({"A": rng.random(8)}, index=labels.index)) for m in "ab"}
    diff, p = permutation_p_values(tables["a"], tables["b"], np.array([0]), n_perm=256)
    sa, sb = tables["a"].statistic, tables["b"].statistic
    swaps = ((np.arange(256)[:, None] >> np.arange(8)) & 1).astype(float)
    joint = sa.paired(sb)
    t = joint(np.hstack([1 - swaps, swaps]))[:, 0] - joint(np.hstack([swaps, 1 - swaps]))[:, 0]
    assert diff[0] == pytest.approx(t[0]) and p[0] == pytest.approx(np.mean(np.abs(t) >= abs(t[0]) - 1e-12))
    again = permutation_p_values(tables["a"], tables["b"], np.array([0]), n_perm=100, seed=3)[1]
    assert again == permutation_p_values(tables["a"], tables["b"], np.array([0]), n_perm=100, seed=3)[1]
    with pytest.raises(XBenchError, match="statistic"):
        permutation_p_values(tables["a"]._replace(statistic=None), tables["b"], np.array([0]))


def test_zero_variance_bootstrap_gives_no_p_of_zero():
    assert bootstrap_p_value(np.full(500, 0.1), 0.1) == 1 / 501  # the smallest p of 500 one-sided replicates, not 0
    assert bootstrap_p_value(np.full(500, 0.0), 0.0) == 1.0  # identical models
    assert bootstrap_p_value(np.zeros(500), 0.0) == 1.0


def test_known_difference_is_covered_and_found():
    comp = _null_study(shift=0.1, models=2, blocks=10)  # model 0 − model 1 = +0.1 exactly
    pair = comp[(comp["model_a"] == "m0") & (comp["model_b"] == "m1")]
    coverage = ((pair["ci_low"] <= 0.1) & (0.1 <= pair["ci_high"])).mean()
    assert 0.93 <= coverage <= 0.97, coverage
    # power: the paired difference has sd 0.25·√2 per case, so z = 0.1 / (0.354 / √150) ≈ 3.5 → ≈ 93 % rejections
    assert 0.85 <= pair["significant"].mean() <= 0.99, pair["significant"].mean()


def test_holm_and_p_value_known_answers():
    assert holm(np.array([0.01, 0.04, 0.03, np.nan])).round(3).tolist()[:3] == [0.03, 0.06, 0.06]
    assert np.isnan(holm(np.array([0.01, np.nan]))[1])
    assert holm(np.array([[0.5, 0.001], [0.02, 0.02]]), axis=1).tolist() == [[0.5, 0.002], [0.04, 0.04]]
    d = np.r_[np.full(30, -0.1), np.full(70, 0.2)]
    assert bootstrap_p_value(d, 0.1, method="percentile") == pytest.approx(2 * 31 / 101)
    assert bootstrap_p_value(d, 0.1) == pytest.approx(2 * norm.sf(0.1 / d.std(ddof=1)))
    assert np.isnan(bootstrap_p_value(np.full(5, np.nan), 0.0))
    assert bootstrap_p_value(np.full(5, 0.3), 0.3) == 1 / 6  # a difference without any spread: 1 / (B + 1), not p = 0


def test_rank_intervals_known_answers():
    point = np.array([0.9, 0.5, 0.5])
    reps = np.array([[0.9, 0.9, 0.9, np.nan], [0.5, 0.6, 0.4, 0.5], [0.4, 0.5, 0.6, 0.5]])
    r = rank_intervals(point, reps)
    assert r["rank"].tolist() == [1, 2, 2]  # ties share the smaller rank
    assert r["n_dropped"] == 1  # the replicate where model 0 is undefined
    assert r["rank_low"].tolist() == [1, 2, 2] and r["rank_high"].tolist() == [1, 3, 3]
    assert r["p_first"].tolist() == [1.0, 0.0, 0.0]


@pytest.fixture(scope="module")
def phantom(tmp_path_factory, phantom_cache) -> dict:
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("compare-run")
    raw = tiny_run(out, cases=40, models=["ref_patchsim", "random_prior", "center_prior"],
                   bootstrap={"replicates": 200, "seed": 0})
    cfg = RunConfig.from_dict(raw)
    with pytest.warns(Warning):  # dropped replicates of the 40-case phantom's rarer classes
        run(cfg, progress=False)
    return {"out": out, "cfg": cfg, "raw": raw, "tables": load_tables(out), "compared": load_comparisons(out)}


def _row(comp: pd.DataFrame, a: str, b: str, metric: str, finding: str = DATASET_LEVEL) -> pd.Series:
    sel = comp[(comp["model_a"] == a) & (comp["model_b"] == b) & (comp["metric"] == metric)
               & (comp["finding"] == finding)]
    assert len(sel) == 1
    return sel.iloc[0]


def test_phantom_reference_model_beats_random_prior(phantom):
    comp, ranks = phantom["compared"]
    assert list(comp.columns) == list(COMPARISON_COLUMNS) and list(ranks.columns) == list(RANK_COLUMNS)
    for metric in ("pointing", "dice@best", "iou@best"):
        row = _row(comp, "ref_patchsim", "random_prior", metric)
        assert row["significant"] and row["difference"] > 0 and row["ci_low"] > 0, row.to_dict()
        assert row["n_cases"] == 40 and row["n_boot"] == 200 and row["family_size"] == 3
        # the difference is that of the metric table's values
        tidy = phantom["tables"]["metrics"].set_index(["model", "finding", "metric"])["value"]
        assert row["difference"] == pytest.approx(tidy[("ref_patchsim", DATASET_LEVEL, metric)]
                                                  - tidy[("random_prior", DATASET_LEVEL, metric)])
        best = ranks[(ranks["model"] == "ref_patchsim") & (ranks["metric"] == metric)
                     & (ranks["finding"] == DATASET_LEVEL)].iloc[0]
        assert (best["rank"], best["rank_low"], best["rank_high"], best["p_first"]) == (1, 1, 1, 1.0)
    # Holm: every adjusted p is at least the raw p, and the family is the three pairs of the cell
    assert (comp["p_holm"] >= comp["p_value"] - 1e-12).all()
    assert set(comp.groupby(["finding", "metric"]).size()) == {3}
    diff, p = pairwise_matrix(comp, dataset="phantom", metric="pointing")
    assert diff.loc["random_prior", "ref_patchsim"] == -diff.loc["ref_patchsim", "random_prior"] < 0


def _evaluated(phantom, model: str):
    """A stored model evaluated again by evaluate_pair (its scored table, replicates and rescore)."""
    from xbench.evaluation.evaluate import evaluate_pair, ground_truth
    from xbench.store.results import ResultStore

    cfg = phantom["cfg"]
    dataset = open_dataset(cfg.datasets[0])
    gt = ground_truth(dataset, cfg.grid, progress=False)
    with pytest.warns(Warning):
        return evaluate_pair(cfg, dataset, model, gt, ResultStore(cfg.output_dir))


def test_copy_of_a_model_is_never_significant(phantom):
    result = _evaluated(phantom, "ref_patchsim")
    comp, ranks = compare_models({"a": result.scored, "a_copy": result.scored}, dataset="phantom")
    assert len(comp) > 50
    assert (comp["difference"] == 0).all() and not comp["significant"].any()
    assert (comp["p_value"].dropna() == 1).all() and (comp["p_holm"].dropna() == 1).all()
    assert ((comp["ci_low"] == 0) & (comp["ci_high"] == 0) | comp["ci_low"].isna()).all()
    assert (ranks.dropna(subset=["rank"])["rank"] == 1).all()  # tied: both first


def test_runs_write_the_p_values_of_their_test(phantom):
    """A run's comparisons.csv (and so its tables' marks) holds the p-values of ``RUN_TEST``, not the other test's."""
    from xbench.evaluation.comparisons import RUN_TEST

    comp = phantom["compared"][0]
    scored = {m: _evaluated(phantom, m).scored for m in dict.fromkeys([*comp["model_a"], *comp["model_b"]])}
    keys = ["finding", "metric", "model_a", "model_b"]
    got = comp.assign(finding=comp["finding"].astype(str)).set_index(keys)["p_value"]
    for test in ("permutation", "bootstrap"):
        want = compare_models(scored, dataset="phantom", test=test)[0]
        want = want.assign(finding=want["finding"].astype(str)).set_index(keys)["p_value"].reindex(got.index)
        same = np.allclose(got, want, rtol=1e-12, atol=0, equal_nan=True)
        assert same == (test == RUN_TEST), test


@pytest.mark.filterwarnings("ignore::xbench.core.errors.XBenchWarning")  # dropped replicates of the small phantom
def test_models_on_different_cases_are_compared_on_the_shared_ones(phantom):
    a, b = _evaluated(phantom, "ref_patchsim"), _evaluated(phantom, "random_prior")
    keep = a.scored.cases[5:]  # model b "skipped" its first five cases at inference
    b = b._replace(scored=b.rescore(cases=keep))
    with pytest.raises(XBenchError, match="same cases"):
        compare_models({"a": a.scored, "b": b.scored}, dataset="phantom")
    comp, _ = compare_dataset("phantom", {"a": a, "b": b})
    assert (comp["n_cases"] == 35).all()
    row = _row(comp, "a", "b", "pointing")
    redone = {n: e.rescore(cases=keep) for n, e in (("a", a), ("b", b))}
    assert row["value_a"] == pytest.approx(redone["a"].table.set_index(["finding", "metric"]).loc[
        (DATASET_LEVEL, "pointing"), "value"])


@pytest.mark.filterwarnings("ignore::xbench.core.errors.XBenchWarning")
def test_comparisons_are_shipped_without_the_rows_they_do_not_read(phantom):
    """A worker computing a dataset's comparisons gets each model's scored table and ``rescore`` (its grounding
    rows: the permutation test's data), not the report's per-pair rows: the same frames as from the whole
    evaluations."""
    from xbench.evaluation.comparisons import for_comparison

    a, b = _evaluated(phantom, "ref_patchsim"), _evaluated(phantom, "random_prior")
    light = for_comparison({"a": a, "b": b})
    assert [e.rescore for e in light.values()] == [a.rescore, b.rescore]  # the permutation test's data
    for got, want in zip(compare_dataset("phantom", light), compare_dataset("phantom", {"a": a, "b": b})):
        pd.testing.assert_frame_equal(got, want)
    b = b._replace(scored=b.rescore(cases=a.scored.cases[5:]))
    light = for_comparison({"a": a, "b": b})
    assert light["a"].rescore is a.rescore and light["b"].rescore is b.rescore
    for got, want in zip(compare_dataset("phantom", light), compare_dataset("phantom", {"a": a, "b": b})):
        pd.testing.assert_frame_equal(got, want)


def test_paper_tables_mark_only_significant_orders(phantom):
    from xbench.outputs import tables

    tidy, comp = phantom["tables"]["metrics"], phantom["compared"][0]
    plain = tables.paper_table1(tidy)
    marked = tables.paper_table1(tidy, comparisons=comp)
    assert marked.confirmed is not None and tables.SIGNIFICANCE_RULE in marked.to_markdown()
    # a mark survives only where the plain table had it; ref_patchsim is significantly best on pointing (n ≥ 30)
    assert ((marked.ranks() == 0) | (marked.ranks() == plain.ranks())).all().all()
    col = ("phantom", "Point")
    if plain.n.at["ref_patchsim", col] >= tables.MIN_PAIRS_TO_RANK:
        assert marked.ranks().at["ref_patchsim", col] == 1
    # with no significant difference nothing is marked
    none = comp.assign(significant=False)
    assert (tables.paper_class_table(tidy, "phantom", comparisons=none).ranks() == 0).all().all()


def test_report_section(phantom, tmp_path):
    from xbench.outputs.report import build_report

    blocks = comparisons_blocks(phantom["out"])
    titles = [b["text"] for b in blocks if b["kind"] == "h3"]
    pairs = [cells[0]["text"] for b in blocks if b.get("table_kind") == "differences" for _, cells in b["rows"]]
    assert "ref_patchsim − random_prior" in pairs and any("rank [95 % interval]" in s for s in titles)
    page = build_report(phantom["out"], tmp_path / "report.html", max_cases_per_class=1, thumb=32).read_text()
    assert "Which differences are real" in page and "ref_patchsim − random_prior" in page
    assert all(s in page for s in titles)
    assert "evaluated before paired comparisons" in comparisons_blocks(tmp_path)[0]["text"]  # a run without them
    with pytest.raises(XBenchError, match="xbench evaluate"):
        load_comparisons(tmp_path, required=True)


def test_notebook_draws_a_pairwise_matrix_per_dataset(phantom, tmp_path):
    import nbformat
    import papermill as pm
    import yaml

    from xbench.workflows.reproduce import notebook_paths

    nb = next(p for p in notebook_paths() if p.name.startswith("12_"))
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(phantom["raw"]))
    pm.execute_notebook(str(nb), str(tmp_path / nb.name), kernel_name="python3", progress_bar=False, cwd=str(nb.parent),
                        parameters={"config": str(config), "output_dir": str(phantom["out"]), "device": "cpu"})
    assert (phantom["out"] / "figures" / "pairwise_phantom.png").stat().st_size > 1000
    marked = (phantom["out"] / "tables" / "paper_table1_significant.md").read_text()
    from xbench.outputs.tables import SIGNIFICANCE_RULE

    assert SIGNIFICANCE_RULE in marked
    executed = nbformat.read(tmp_path / nb.name, as_version=4)
    shown = "".join(str(o.get("data", {}).get("text/plain", "")) for c in executed.cells for o in c.get("outputs", []))
    assert "ref_patchsim" in shown and "random_prior" in shown


def test_score_compares_user_maps_with_a_runs_models(phantom, tmp_path):
    """`xbench score --compare-with RUN`: the maps of random_prior scored as user maps are an exact copy of that
    model (never significant, difference 0) and, like it, significantly below the reference model."""
    import warnings

    import xbench
    from xbench.core.errors import XBenchWarning

    files = sorted((phantom["out"] / "store" / "phantom" / "random_prior").glob("chunk-*.npz"))
    parts = [read_chunk_file(f) for f in files]
    st = {k: np.concatenate([p[k] for p in parts]) for k in ("case_ids", "probs", "maps")}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", XBenchWarning)
        xbench.evaluate_maps(st["maps"][5:], case_ids=st["case_ids"][5:].tolist(), probs=st["probs"][5:],
                             dataset="phantom", dataset_options={"cases": 40}, grid=(64, 64), bootstrap=200, seed=0,
                             output_dir=tmp_path / "scored", compare_with=phantom["out"])
    comp, ranks = load_comparisons(tmp_path / "scored")
    assert set(ranks["model"]) == {"user_maps", "ref_patchsim", "random_prior", "center_prior"}
    assert (comp["n_cases"] == 35).all()  # paired on the cases all four cover (the maps leave out five)
    copy = comp[(comp["model_a"] == "user_maps") & (comp["model_b"] == "random_prior")]
    assert len(copy) and (copy["difference"] == 0).all() and not copy["significant"].any()
    row = _row(comp, "user_maps", "ref_patchsim", "pointing")
    assert row["significant"] and row["difference"] < 0
    with pytest.raises(XBenchError, match="no stored model"):
        xbench.evaluate_maps(st["maps"], case_ids=st["case_ids"].tolist(), dataset="phantom",
                             dataset_options={"cases": 40}, grid=(64, 64), bootstrap=0, output_dir=tmp_path / "x",
                             compare_with=tmp_path / "nothing")


def test_cli_score_passes_compare_with_and_best_tau_is_refused():
    from xbench.cli import build_parser

    args = build_parser().parse_args(["score", "--maps", "m.npz", "--dataset", "phantom", "--compare-with", "runs/a"])
    assert args.compare_with == "runs/a"
    one = ScoredTable(pd.DataFrame({"finding": ["A"], "metric": ["best_tau"], "value": [0.3]}), np.zeros((3, 1)),
                      pd.RangeIndex(4))
    with pytest.raises(ValueError, match="setting, not a score"):
        compare_models({"a": one, "b": one}, dataset="d", metrics=["best_tau"])
