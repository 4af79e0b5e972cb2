"""Ranks get store chunks balanced by decode cost (pixels), not rotated by count (xbench.inference.runner.assign_chunks)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from xbench.inference.runner import assign_chunks, chunk_costs


class _Table:
    def __init__(self, cases: pd.DataFrame):
        self.cases = cases

    def __len__(self) -> int:
        return len(self.cases)


def test_chunk_costs_are_pixels_or_counts():
    sized = _Table(pd.DataFrame({"case_id": list("abcde"), "height": [10, 20, 30, 40, 50], "width": [1, 1, 2, 2, 3]}))
    assert chunk_costs(sized, 2) == [10.0 + 20.0, 60.0 + 80.0, 150.0]
    unsized = _Table(pd.DataFrame({"case_id": list("abcde")}))
    assert chunk_costs(unsized, 2) == [2.0, 2.0, 1.0]


@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
def test_every_chunk_once_and_loads_balanced(ranks):
    """The issue's failure: one rank got all of the large-image datasets. Here the loads differ by at most one
    chunk's cost (the LPT bound), every chunk has exactly one owner, and the answer is the same every time."""
    rng = np.random.default_rng(ranks)
    # a mix like the stand-ins: many 1024² chunks, a few 2880x2304 chunks, small partial last chunks
    costs = [[256 * 1024 * 1024] * 21 + [13 * 1024 * 1024], [256 * 2880 * 2304] * 11 + [96 * 2880 * 2304],
             [256 * 2500 * 2048] * 2 + [156 * 2500 * 2048], list(rng.integers(1, 10**8, 7).astype(float))]
    owner = assign_chunks(costs, ranks)
    assert sorted(owner) == sorted((d, k) for d, row in enumerate(costs) for k in range(len(row)))
    assert owner == assign_chunks(costs, ranks)
    load = np.zeros(ranks)
    for (d, k), rank in owner.items():
        load[rank] += costs[d][k]
    assert load.max() - load.min() <= max(max(row) for row in costs)
    if ranks > 1:
        # the count-rotation it replaces is far worse on this mix
        rotated = np.zeros(ranks)
        offset = 0
        for row in costs:
            for k, c in enumerate(row):
                rotated[(k + offset) % ranks] += c
            offset += len(row)
        assert load.max() <= rotated.max()
    with pytest.raises(ValueError):
        assign_chunks(costs, 0)
