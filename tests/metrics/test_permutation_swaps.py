"""The permutation test's swaps in closed form (xbench.metrics._swaps) against their definition.

The definition is the paired statistic ``a.statistic.paired(b.statistic)`` with weights ``[1 − s, s]`` (A') and
``[s, 1 − s]`` (B') — the whole table recomputed per swap. :func:`_reference_p_values` is that computation (the
permutation test as it was before the closed form, kept here as the reference): the closed form must give the same
rows to float summation order and **identical p-values** for the same seed, on random tables of every metric kind
with ties (Dice curves on a coarse grid, tied scores, exact best-τ ties), undefined rows (NaN pointing, unknown
labels, a class with no positive pair), in the exact (2^n ≤ n_perm) and the random mode.
"""
from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest

from xbench.metrics import scored_table
from xbench.metrics.compare import compare_models, compared_metrics, permutation_p_values
from xbench.metrics._swaps import SwappedPair

T = np.round(np.linspace(0.0, 1.0, 11), 2)


def _tables(rng: np.random.Generator, n: int, *, ties: bool, undefined: bool, models: str = "ab",
            relabel: bool = False):
    cases = pd.Index([f"c{i}" for i in range(n)])
    findings = ["f0", "f1", "f2", "empty"]
    labels = pd.DataFrame(rng.integers(0, 2, (n, 4)).astype(float), index=cases, columns=findings)
    if undefined:
        labels = labels.mask(rng.random(labels.shape) < 0.15)
    rows = [(i, f) for i in range(n) for f in findings[:3] if rng.random() < 0.6]
    out = {}
    for m in models:
        if relabel and m != models[0]:  # another model scored against other labels: other known cases per class
            labels = labels.mask(rng.random(labels.shape) < 0.1)
            labels.iloc[0, 0] = 1 - labels.iloc[0, 0] if labels.iloc[0, 0] in (0, 1) else 1
        score = rng.random((n, 4))
        d = rng.random((len(rows), T.size))
        if ties:  # few distinct values: tied scores, tied Dice means over τ (exact best-τ ties), tied statistics
            score, d = np.round(score * 4) / 4, np.round(d * 2) / 2
        pointing = (rng.random(len(rows)) < 0.5).astype(float)
        if undefined:
            pointing[rng.random(len(rows)) < 0.2] = np.nan
        iou = d / (2 - d)
        pairs = pd.DataFrame({"case_id": [cases[i] for i, _ in rows], "finding": [f for _, f in rows],
                              "pointing": pointing, "dice_fixed": d[:, 5], "iou_fixed": iou[:, 5],
                              "dice_curve": list(d), "iou_curve": list(iou)})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out[m] = scored_table(pairs, model=m, dataset="d", labels=labels, findings=findings, thresholds=T,
                                  scores=pd.DataFrame(score, index=cases, columns=findings), n_boot=0, cases=cases)
    return out


def _reference_p_values(a, b, rows, *, n_perm, seed, batch_size=100):
    """The permutation test by its definition: the paired statistic recomputed for every swap."""
    n = len(a.cases)
    joint = a.statistic.paired(b.statistic)

    def diff(swap):
        keep = 1.0 - swap
        return joint(np.hstack([keep, swap]))[:, rows] - joint(np.hstack([swap, keep]))[:, rows]

    with warnings.catch_warnings(), np.errstate(invalid="ignore", divide="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        observed = diff(np.zeros((1, n)))[0]
        exact = n < 63 and 2 ** n <= n_perm
        total = 2 ** n if exact else n_perm
        extreme, defined = np.zeros(len(rows)), np.zeros(len(rows))
        rng = np.random.default_rng(seed)
        tol = 1e-12 * np.maximum(1.0, np.abs(observed))
        for start in range(0, total, batch_size):
            m = min(batch_size, total - start)
            if exact:
                swap = ((np.arange(start, start + m)[:, None] >> np.arange(n)) & 1).astype(np.float64)
            else:
                swap = rng.integers(0, 2, size=(m, n)).astype(np.float64)
            t = diff(swap)
            ok = ~np.isnan(t)
            extreme += (ok & (np.abs(t) >= np.abs(observed) - tol)).sum(axis=0)
            defined += ok.sum(axis=0)
        p = extreme / defined if exact else (1 + extreme) / (1 + defined)
    return observed, np.where(np.isnan(observed), np.nan, np.minimum(p, 1.0))


@pytest.mark.parametrize("ties", [True, False])
@pytest.mark.parametrize("undefined", [True, False])
@pytest.mark.parametrize("relabel", [False, True])  # True: the two models' classes hold different known cases
def test_swapped_rows_equal_the_paired_statistic(ties, undefined, relabel):
    rng = np.random.default_rng([int(ties), int(undefined), int(relabel)])
    for _ in range(4):
        t = _tables(rng, 23, ties=ties, undefined=undefined, relabel=relabel)
        a, b = t["a"].statistic, t["b"].statistic
        s = rng.integers(0, 2, (150, 23)).astype(float)
        joint = a.paired(b)
        fast = SwappedPair(a, b, 23)(s)
        for slow, quick in zip((joint(np.hstack([1 - s, s])), joint(np.hstack([s, 1 - s]))), fast):
            assert quick.shape == slow.shape
            assert np.array_equal(np.isnan(quick), np.isnan(slow))
            np.testing.assert_allclose(quick, slow, rtol=0, atol=1e-13, equal_nan=True)


@pytest.mark.parametrize("n, n_perm", [(9, 512), (9, 600), (30, 300)])  # exact, exact with spare draws, random
@pytest.mark.parametrize("ties", [True, False])
def test_p_values_are_identical_to_the_definition(n, n_perm, ties):
    rng = np.random.default_rng([n, n_perm, int(ties)])
    for seed in range(3):
        t = _tables(rng, n, ties=ties, undefined=seed == 1)
        table = t["a"].table
        rows = np.flatnonzero(table["metric"].isin(compared_metrics(0.5) + ("f1", "accuracy", "hamming_accuracy",
                                                                                "best_tau")).to_numpy())
        diff, p = permutation_p_values(t["a"], t["b"], rows, n_perm=n_perm, seed=seed)
        ref_diff, ref_p = _reference_p_values(t["a"], t["b"], rows, n_perm=n_perm, seed=seed)
        np.testing.assert_allclose(diff, ref_diff, rtol=0, atol=1e-13, equal_nan=True)
        assert np.array_equal(p, ref_p, equal_nan=True), table.iloc[rows][p != ref_p]
        assert np.isfinite(p).sum() > len(rows) // 2  # most rows are defined: the comparison is not vacuous
        if ties:
            assert (p == 1).any()  # tied rows exist (e.g. a metric the swap cannot move)


def test_compare_models_uses_the_same_swaps_for_every_pair():
    """compare_models draws the swaps once; each pair's p equals permutation_p_values' on that pair."""
    rng = np.random.default_rng(5)
    t = _tables(rng, 20, ties=True, undefined=True, models="abc")
    comp, _ = compare_models(t, dataset="d", n_perm=300, seed=4)
    rows = np.flatnonzero(t["a"].table["metric"].isin(compared_metrics(0.5)).to_numpy())
    for x, y in (("a", "b"), ("a", "c"), ("b", "c")):
        p = _reference_p_values(t[x], t[y], rows, n_perm=300, seed=4)[1]
        got = comp[(comp["model_a"] == x) & (comp["model_b"] == y)]["p_value"].to_numpy()
        assert np.array_equal(got, p, equal_nan=True)
