"""Recognition metrics: scikit-learn parity, NaN labels, skipped classes, Hamming accuracy."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from sklearn.metrics import accuracy_score, average_precision_score, f1_score, hamming_loss, roc_auc_score

from xbench.core.errors import XBenchWarning
from xbench.metrics import accuracy, auc, auprc, f1, hamming_accuracy, recognition_scores
from xbench.metrics.recognition import weighted_auc_ap, weighted_f1_accuracy


def random_labels(seed: int, n: int = 60, c: int = 5):
    rng = np.random.default_rng(seed)
    y = (rng.random((n, c)) < 0.4).astype(float)
    y[rng.random((n, c)) < 0.2] = np.nan  # unknown labels
    s = np.round(rng.random((n, c)), 1)  # coarse scores: many ties
    s[:5] = 0.5  # scores exactly on the F1 / accuracy threshold
    return y, s


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_per_class_metrics_equal_sklearn_on_known_labels_with_ties(seed):
    y, s = random_labels(seed)
    r = recognition_scores(y, s)
    for c in range(y.shape[1]):
        k = ~np.isnan(y[:, c])
        yc, sc = y[k, c], s[k, c]
        assert r.auc[c] == pytest.approx(roc_auc_score(yc, sc), abs=1e-12)
        assert r.auprc[c] == pytest.approx(average_precision_score(yc, sc), abs=1e-12)
        assert r.f1[c] == pytest.approx(f1_score(yc, sc >= 0.5), abs=1e-12)
        assert r.accuracy[c] == pytest.approx(accuracy_score(yc, sc >= 0.5), abs=1e-12)
    np.testing.assert_array_equal(auc(y, s), r.auc)
    np.testing.assert_array_equal(auprc(y, s), r.auprc)
    np.testing.assert_array_equal(f1(y, s), r.f1)
    np.testing.assert_array_equal(accuracy(y, s), r.accuracy)
    assert r.macro["auc"] == pytest.approx(np.mean(r.auc))


def test_threshold_is_greater_or_equal():
    # score exactly 0.5 is predicted positive: TP 1, FP 0, FN 1 → F1 = 2/3; accuracy 3/4
    y, s = [1, 1, 0, 0], [0.5, 0.49, 0.2, 0.1]
    assert f1(y, s)[0] == pytest.approx(2 / 3)
    assert accuracy(y, s)[0] == pytest.approx(0.75)
    assert f1(y, s, threshold=0.6)[0] == 0.0  # no predicted positive on a defined class


def test_classes_without_both_label_values_are_nan_counted_and_warned():
    y = np.array([[1, 0, 1, np.nan], [0, 0, 1, np.nan], [1, 0, 1, np.nan]])
    s = np.array([[0.9, 0.2, 0.3, np.nan], [0.1, 0.4, 0.6, 0.2], [0.7, 0.1, 0.8, 0.5]])
    with pytest.warns(XBenchWarning, match=r"3 of 4 classes .*'b', 'c', 'd'"):
        r = recognition_scores(y, s, class_names=["a", "b", "c", "d"])
    assert r.n_skipped == 3 and list(r.defined) == [True, False, False, False]
    for name in ("auc", "auprc", "f1", "accuracy"):
        values = getattr(r, name)
        assert not np.isnan(values[0]) and np.isnan(values[1:]).all()
    assert r.macro["auc"] == 1.0  # mean over the one defined class
    with pytest.warns(XBenchWarning, match="auc: 3 of 4"):
        auc(y, s)


def test_hamming_accuracy_over_known_entries_by_hand():
    y = [[1, 0, np.nan], [0, 1, 1]]
    s = [[0.8, 0.6, 0.9], [0.5, 0.7, 0.2]]
    # known entries: (0,0) ok, (0,1) wrong, (1,0) wrong (0.5 ≥ 0.5), (1,1) ok, (1,2) wrong → 2/5
    assert hamming_accuracy(y, s) == pytest.approx(2 / 5)
    yy = np.array([[1, 0], [0, 1], [1, 1]])
    ss = np.array([[0.7, 0.2], [0.6, 0.9], [0.1, 0.8]])
    assert hamming_accuracy(yy, ss) == pytest.approx(1 - hamming_loss(yy, ss >= 0.5))
    assert np.isnan(hamming_accuracy([[np.nan]], [[0.3]]))


def test_inputs_pandas_torch_and_1d_and_validation():
    y, s = random_labels(3)
    ref = auc(y, s)
    np.testing.assert_array_equal(auc(pd.DataFrame(y), pd.DataFrame(s)), ref)
    np.testing.assert_array_equal(auc(torch.tensor(y), torch.tensor(s)), ref)
    assert auc([0, 1, 1], [0.1, 0.7, 0.4]).shape == (1,)
    with pytest.raises(ValueError, match=r"y_score\[1, 0\]"):
        auc([[1], [0]], [[0.2], [np.nan]])
    with pytest.raises(ValueError, match="only 1"):
        auc([[2], [0]], [[0.2], [0.1]])
    with pytest.raises(ValueError, match="shape|must both"):
        auc(np.zeros((3, 2)), np.zeros((3, 3)))


def test_weighted_versions_equal_sklearn_sample_weight_and_duplication():
    rng = np.random.default_rng(7)
    y = (rng.random(40) < 0.5).astype(float)
    s = np.round(rng.random(40), 1)
    w = rng.integers(0, 4, size=(3, 40)).astype(float)
    w = np.vstack([np.ones(40), w])
    a, ap = weighted_auc_ap(y, s, w)
    f, acc = weighted_f1_accuracy(y, s, w, 0.5)
    for b in range(len(w)):
        assert a[b] == pytest.approx(roc_auc_score(y, s, sample_weight=w[b]), abs=1e-12)
        assert ap[b] == pytest.approx(average_precision_score(y, s, sample_weight=w[b]), abs=1e-12)
        assert f[b] == pytest.approx(f1_score(y, s >= 0.5, sample_weight=w[b]), abs=1e-12)
        assert acc[b] == pytest.approx(accuracy_score(y, s >= 0.5, sample_weight=w[b]), abs=1e-12)
    # duplication = integer weights
    rep = np.repeat(np.arange(40), w[1].astype(int))
    assert a[1] == pytest.approx(roc_auc_score(y[rep], s[rep]), abs=1e-12)
    # a weight row with no negative is undefined
    only_pos = np.where(y == 1, 1.0, 0.0)[None]
    assert np.isnan(weighted_auc_ap(y, s, only_pos)[0][0]) and np.isnan(weighted_f1_accuracy(y, s, only_pos, 0.5)[0][0])
