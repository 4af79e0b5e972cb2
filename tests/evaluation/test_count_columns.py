"""One meaning per count column of the tidy table (issue 23 item 7), on the session's phantom run."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from xbench.evaluation.evaluate import load_tables
from xbench.metrics import BEST_TAU, COUNT_COLUMNS, DATASET_LEVEL, HAMMING_ACCURACY, POOLED, TIDY_COLUMNS
from xbench.metrics.table import is_grounding_score
from xbench.outputs.tables import paper_table1

pytestmark = pytest.mark.usefixtures("phantom_cache")


@pytest.fixture(scope="module")
def run(phantom_run) -> dict:
    return load_tables(phantom_run)


def test_tidy_table_has_no_ambiguous_n(run):
    tidy = run["metrics"]
    assert "n" not in tidy.columns and set(COUNT_COLUMNS) <= set(tidy.columns)
    assert tuple(tidy.columns[: len(TIDY_COLUMNS)]) == TIDY_COLUMNS


def test_each_count_column_means_one_thing(run):
    tidy, pairs = run["metrics"], run["pairs"]
    grounding = tidy["metric"].map(lambda m: is_grounding_score(m) or m == BEST_TAU).astype(bool)
    point = tidy[tidy["metric"] == "pointing"]
    assert len(point) and grounding.any()
    for model, sub in point.groupby("model"):
        mp = pairs[(pairs["model"] == model) & pairs["pointing"].notna()]
        per_class = sub[~sub["finding"].astype(str).str.startswith("(")].set_index("finding")
        # n_pairs of a class row: its positive pairs with a pointing value
        assert per_class["n_pairs"].to_dict() == mp.groupby("finding").size().reindex(per_class.index).to_dict()
        level = sub[sub["finding"] == DATASET_LEVEL].iloc[0]
        # n_classes of a mean-over-classes row: the classes with a value; its n_pairs: all pairs behind them
        assert level["n_classes"] == np.isfinite(per_class["value"]).sum() > 1
        assert level["n_pairs"] == len(mp) == sub[sub["finding"] == POOLED].iloc[0]["n_pairs"]
        # Table 1 (paper form) prints the same pairs, not the number of classes
        t1 = paper_table1(tidy[tidy["model"] == model])
        assert t1.n.iloc[0].dropna().unique().tolist() == [len(mp)]
    # one meaning per column: class counts only on mean-over-classes rows, pair counts only on grounding rows
    # (hamming_accuracy sits on the dataset level but is no mean over classes: it counts n_labels and n_cases)
    level_rows = (tidy["finding"] == DATASET_LEVEL) & (tidy["metric"] != HAMMING_ACCURACY)
    assert tidy.loc[~level_rows, "n_classes"].isna().all() and tidy.loc[level_rows, "n_classes"].notna().all()
    assert tidy.loc[~grounding, "n_pairs"].isna().all() and tidy.loc[grounding, "n_pairs"].notna().all()
    assert tidy.loc[grounding, "n_cases"].isna().all() and tidy.loc[grounding, "n_labels"].isna().all()


def test_recognition_rows_count_cases(run):
    """Recognition rows count labelled cases, never pairs; their mean over classes counts classes only."""
    tidy = run["metrics"]
    model = tidy.loc[tidy["metric"] == "auc", "model"].iloc[0]  # the phantom run's priors give probabilities
    tidy = tidy[tidy["model"] == model]
    rec = tidy[tidy["metric"] == "auc"]
    per_class = rec[rec["finding"] != DATASET_LEVEL]
    assert len(per_class) > 1 and per_class["n_cases"].notna().all() and rec["n_pairs"].isna().all()
    level = rec[rec["finding"] == DATASET_LEVEL].iloc[0]
    assert level["n_classes"] == np.isfinite(per_class["value"]).sum() and pd.isna(level["n_cases"])
    hamming = tidy[tidy["metric"] == HAMMING_ACCURACY].iloc[0]
    assert hamming["n_labels"] >= hamming["n_cases"] > 0 and pd.isna(hamming["n_classes"])
