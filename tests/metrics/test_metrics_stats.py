"""Aggregation, paired bootstrap CIs and the tidy results table."""
from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest

from xbench.core.errors import XBenchWarning
from xbench.metrics import (
    DATASET_LEVEL,
    METRICS,
    POOLED,
    TIDY_COLUMNS,
    best_threshold,
    bootstrap_ci,
    grounding_scores,
    recognition_scores,
    score_table,
)
from xbench.metrics.stats import _best_weighted, _draw_weights, bootstrap_batches, scored_table

T3 = np.array([0.0, 0.5, 1.0])


def mean_stat(x):
    return lambda w: (w @ x / w.sum(axis=1))[:, None]


# -- bootstrap_ci ----------------------------------------------------------------------


def test_bootstrap_is_seeded_deterministic_and_bounds_are_percentiles_of_replicates():
    x = np.random.default_rng(0).random(30)
    a = bootstrap_ci(mean_stat(x), 30, n_boot=300, seed=11)
    b = bootstrap_ci(mean_stat(x), 30, n_boot=300, seed=np.random.default_rng(11))
    c = bootstrap_ci(mean_stat(x), 30, n_boot=300, seed=12)
    assert (a.low, a.high) == (b.low, b.high) and a.low != c.low
    # the same draws by hand: one batch of 300 resamples of 30 cases
    draws = np.random.default_rng(11).integers(0, 30, size=(300, 30))
    reps = x[draws].mean(axis=1)
    np.testing.assert_allclose([a.low[0], a.high[0]], np.percentile(reps, [2.5, 97.5]), rtol=1e-12)
    assert a.value[0] == pytest.approx(x.mean())  # point estimate, not the mean of replicates
    assert a.low[0] <= a.value[0] <= a.high[0]
    # batching does not change the stream of replicates
    d = bootstrap_ci(mean_stat(x), 30, n_boot=300, seed=11, batch_size=300)
    np.testing.assert_array_equal([d.low, d.high], [a.low, a.high])


def test_bootstrap_drops_and_counts_undefined_replicates():
    x = np.arange(10.0)
    stat = lambda w: np.where(w[:, :1] > 0, (w @ x / w.sum(1))[:, None], np.nan)  # noqa: E731
    ci = bootstrap_ci(stat, 10, n_boot=500, seed=3)
    draws = np.random.default_rng(3).integers(0, 10, size=(100, 10))  # first batch of 100
    first_batch_missing = int((~(draws == 0).any(axis=1)).sum())
    assert ci.n_dropped[0] >= first_batch_missing > 0
    assert np.isfinite(ci.low[0]) and ci.low[0] <= ci.high[0]
    none = bootstrap_ci(mean_stat(x), 10, n_boot=0)
    assert np.isnan(none.low[0]) and none.value[0] == 4.5 and none.n_boot == 0


def test_best_weighted_with_unit_weights_equals_best_threshold():
    rng = np.random.default_rng(2)
    d, j = rng.random((8, 3)), rng.random((8, 3))
    d[:, 2] = d[:, 1]  # ties between τ = 0.5 and 1.0 → smallest
    out = _best_weighted(np.ones((1, 8)), d, j, T3)[0]
    best = best_threshold(d, j, T3)
    assert out[2] == best.tau
    assert out[0] == pytest.approx(best.dice) and out[1] == pytest.approx(best.iou)


def test_replicates_break_exact_best_tau_ties_like_the_point_value():
    """Columns τ = 0.2 and 0.7 tie exactly (pair 0 gains 1/806 what pair 1 loses) but their float sums favour 0.7:
    the point value takes 0.2 (exact rule), and so must every replicate that keeps the tie (w0 == w1) — in the
    table's bootstrap (scored_table) as in the weighted chooser."""
    from fractions import Fraction

    d = np.array([[0.5769230769230769, 0.5781637717121588], [0.9354838709677419, 0.93424317617866],
                  [0.2708333333333333, 0.2708333333333333], [0.8378378378378378, 0.8378378378378378],
                  [0.6875, 0.6875], [0.0, 0.0]])
    exact = [sum(Fraction(x).limit_denominator(10**7) for x in d[:, c]) for c in range(2)]
    assert exact[0] == exact[1] and (np.ones(6) @ d)[1] > (np.ones(6) @ d)[0]  # the float trap
    t = np.array([0.2, 0.7])
    assert best_threshold(d, d, t).tau == 0.2
    rng = np.random.default_rng(5)
    w = rng.integers(0, 4, size=(300, 6)).astype(float)
    w[:, 1] = w[:, 0]  # the tie holds in every row
    w[0] = 1.0
    taus = _best_weighted(w, d, d, t)[:, 2]
    assert (taus[w[:, 0] > 0] == 0.2).all(), np.unique(taus, return_counts=True)
    pairs = pd.DataFrame({"case_id": [f"c{i}" for i in range(6)], "finding": "A", "pointing": 1.0, "dice_fixed": 0.5,
                          "iou_fixed": 0.5, "dice_curve": list(d), "iou_curve": list(d)})
    # two cases only: a resample that draws both c0 and c1 equally often keeps the tie; all others do not
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", XBenchWarning)
        scored = scored_table(pairs, model="m", dataset="d", thresholds=t, n_boot=400, seed=1)
    tau_row = scored.table.index[(scored.table.finding == "A") & (scored.table.metric == "best_tau")][0]
    rng = np.random.default_rng(1)  # the table's draws, batch by batch
    weights = np.concatenate([_draw_weights(rng, b, 6) for _, b in bootstrap_batches(400)])
    tied = weights[:, 0] == weights[:, 1]
    assert tied.sum() > 50 and (scored.replicates[tied, tau_row] == 0.2).all()


# -- score_table -----------------------------------------------------------------------


def hand_pairs() -> pd.DataFrame:
    """Findings A (3 pairs, one with empty GT → NaN) and B (1 pair), curves over T3."""
    nan3 = np.full(3, np.nan)
    return pd.DataFrame(
        {
            "case_id": ["c1", "c2", "c3", "c1"],
            "finding": ["A", "A", "A", "B"],
            "pointing": [1.0, 0.0, np.nan, 1.0],
            "dice_fixed": [0.6, 0.2, np.nan, 0.5],
            "iou_fixed": [0.4, 0.1, np.nan, 0.3],
            "dice_curve": [np.array([0.2, 0.6, 0.1]), np.array([0.4, 0.2, 0.3]), nan3, np.array([0.1, 0.5, 0.9])],
            "iou_curve": [np.array([0.1, 0.4, 0.0]), np.array([0.2, 0.1, 0.2]), nan3, np.array([0.0, 0.3, 0.8])],
        }
    )


def value(table, finding, metric):
    row = table[(table.finding == finding) & (table.metric == metric)]
    assert len(row) == 1, (finding, metric)
    return row.iloc[0]


def test_score_table_point_values_by_hand():
    t = score_table(hand_pairs(), model="m", dataset="d", thresholds=T3, n_boot=0)
    assert tuple(t.columns) == TIDY_COLUMNS and (t.model == "m").all() and (t.dataset == "d").all()
    assert set(t.metric) <= set(METRICS)
    # class A: pointing (1 + 0) / 2; class B: 1; dataset level: (0.5 + 1) / 2; pooled: 2 / 3
    assert value(t, "A", "pointing").value == 0.5 and value(t, "A", "pointing").n_pairs == 2
    assert value(t, "B", "pointing").value == 1.0
    assert value(t, DATASET_LEVEL, "pointing").value == 0.75
    # counts, one meaning per column: 2 classes averaged over 3 pairs in all; pooled: the 3 pairs
    assert value(t, DATASET_LEVEL, "pointing").n_classes == 2 and value(t, DATASET_LEVEL, "pointing").n_pairs == 3
    assert value(t, POOLED, "pointing").value == pytest.approx(2 / 3) and value(t, POOLED, "pointing").n_pairs == 3
    assert t["n_cases"].isna().all() and t["n_labels"].isna().all()  # no labels: no recognition counts
    assert t.loc[t.finding != DATASET_LEVEL, "n_classes"].isna().all()
    assert value(t, "A", "dice@0.5").value == pytest.approx(0.4)
    assert value(t, POOLED, "iou@0.5").value == pytest.approx(0.8 / 3)
    # best τ: A means (0.3, 0.4, 0.2) → τ 0.5, Dice 0.4, IoU 0.25; B → τ 1.0, Dice 0.9, IoU 0.8
    assert value(t, "A", "best_tau").value == 0.5 and value(t, "A", "dice@best").value == pytest.approx(0.4)
    assert value(t, "A", "iou@best").value == pytest.approx(0.25)
    assert value(t, "B", "best_tau").value == 1.0 and value(t, "B", "dice@best").value == pytest.approx(0.9)
    assert value(t, DATASET_LEVEL, "dice@best").value == pytest.approx(0.65)
    assert value(t, DATASET_LEVEL, "best_tau").value == pytest.approx(0.75)
    # pooled: one τ over all three curves: means (0.2333, 0.4333, 0.4333) → tie → τ 0.5
    assert value(t, POOLED, "best_tau").value == 0.5
    assert value(t, POOLED, "dice@best").value == pytest.approx(1.3 / 3)
    assert np.isnan(t.ci_low).all() and np.isnan(t.ci_high).all()


def random_inputs(seed=0, n_cases=40, findings=("A", "B", "C")):
    rng = np.random.default_rng(seed)
    cases = [f"img{i}" for i in range(n_cases)]
    frames = []
    for f in findings:
        pos = rng.random(n_cases) < 0.5
        n = int(pos.sum())
        maps = rng.random((n, 4, 4)).astype(np.float32)
        masks = rng.random((n, 16, 16)) < 0.3
        frames.append(grounding_scores(maps, masks).to_frame(list(np.array(cases)[pos]), f))
    labels = pd.DataFrame((rng.random((n_cases, len(findings))) < 0.4).astype(float), index=cases, columns=findings)
    labels.iloc[:3, 0] = np.nan
    scores = pd.DataFrame(rng.random((n_cases, len(findings))), index=cases, columns=findings)
    return pd.concat(frames, ignore_index=True), labels, scores


def test_score_table_recognition_rows_equal_recognition_scores_and_ci_behaviour():
    pairs, labels, scores = random_inputs()
    t = score_table(pairs, model="m", dataset="d", labels=labels, scores=scores, n_boot=200, seed=5)
    rec = recognition_scores(labels.to_numpy(), scores.to_numpy())
    for c, f in enumerate(labels.columns):
        assert value(t, f, "auc").value == pytest.approx(rec.auc[c])
        assert value(t, f, "f1").value == pytest.approx(rec.f1[c])
        assert value(t, f, "auc").n_cases == labels[f].notna().sum() and pd.isna(value(t, f, "auc").n_pairs)
    assert value(t, DATASET_LEVEL, "auc").n_classes == 3 and pd.isna(value(t, DATASET_LEVEL, "auc").n_cases)
    hamming = value(t, DATASET_LEVEL, "hamming_accuracy")
    assert hamming.n_labels == labels.notna().sum().sum() and hamming.n_cases == len(labels)
    assert value(t, DATASET_LEVEL, "auprc").value == pytest.approx(rec.macro["auprc"])
    assert value(t, DATASET_LEVEL, "hamming_accuracy").value == pytest.approx(rec.hamming_accuracy)
    assert (t.ci_low <= t.ci_high).all()
    # means of pairs: the percentile interval holds the point estimate
    means = t[t.metric.isin(["pointing", "dice@0.5", "auc"])]
    assert ((means.ci_low <= means.value) & (means.value <= means.ci_high)).all()
    # seeded: the same table twice, a different one with another seed
    again = score_table(pairs, model="m", dataset="d", labels=labels, scores=scores, n_boot=200, seed=5)
    pd.testing.assert_frame_equal(t, again)
    other = score_table(pairs, model="m", dataset="d", labels=labels, scores=scores, n_boot=200, seed=6)
    assert not np.allclose(t.ci_low, other.ci_low, equal_nan=True)


def test_score_table_best_tau_ci_reflects_reselection():
    pairs, _, _ = random_inputs(seed=1)
    t = score_table(pairs, model="m", dataset="d", n_boot=100, seed=0)
    tau = value(t, POOLED, "best_tau")
    assert tau.ci_low <= tau.ci_high and 0 <= tau.ci_low and tau.ci_high <= 1
    dice_best = value(t, "A", "dice@best")
    assert dice_best.ci_low <= dice_best.ci_high


def test_score_table_warns_about_dropped_replicates_and_validates_inputs():
    pairs = hand_pairs()
    with pytest.warns(XBenchWarning, match="replicates dropped"):
        score_table(pairs, model="m", dataset="d", thresholds=T3, n_boot=50)  # B has one case
    with pytest.raises(ValueError, match="lacks columns"):
        score_table(pairs.drop(columns="iou_curve"), model="m", dataset="d", thresholds=T3)
    with pytest.raises(ValueError, match="go together"):
        score_table(pairs, model="m", dataset="d", thresholds=T3, labels=pd.DataFrame())
    with pytest.raises(ValueError, match="must have 101 values .*got 3"):
        score_table(pairs, model="m", dataset="d", n_boot=0)  # curves of 3 vs the 101-point grid


def test_score_table_recognition_only_and_metric_table():
    _, labels, scores = random_inputs(seed=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", XBenchWarning)
        t = score_table(None, model="m", dataset="d", labels=labels, scores=scores, n_boot=20)
    assert set(t.metric) == {"auc", "auprc", "f1", "accuracy", "hamming_accuracy"}
    assert POOLED not in set(t.finding)
    assert METRICS["pointing"].higher_is_better is True and METRICS["best_tau"].higher_is_better is None
