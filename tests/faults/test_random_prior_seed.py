"""Issue 12 item 4: the random prior's draws are keyed by (seed, case id, class), not by the image bytes.

A decoder or library version that changes one grey level of one pixel (the phantom differed on 19 of 300 test
images between numpy/scipy versions) used to redraw every score of that case; now the stored draws of a run do
not depend on the pixels at all, so the committed phantom tables' random-prior rows are reproducible.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest

from conftest import tiny_run
from xbench.spec.config import RunConfig
from xbench.datasets.base import Sample
from xbench.core.errors import XBenchWarning
from xbench.store.results import ResultStore
from xbench.workflows.run import run

pytestmark = pytest.mark.usefixtures("phantom_cache")


def _stored(out):
    cfg = RunConfig.from_dict(tiny_run(out, cases=10, models=["random_prior"], chunk_size=16))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", XBenchWarning)
        run(cfg, progress=False, evaluate=False)
    return ResultStore(out).read("phantom", "random_prior", expected_chunks=1)


def test_a_changed_grey_level_redraws_nothing(tmp_path, monkeypatch):
    before = _stored(tmp_path / "a")
    original = Sample.image

    def one_level_brighter(self):
        image = original(self).copy()
        image[0, 0] = image[0, 0] + 1 / 255 if image[0, 0] < 0.5 else image[0, 0] - 1 / 255
        return image

    monkeypatch.setattr(Sample, "image", one_level_brighter)
    after = _stored(tmp_path / "b")
    assert after.case_ids.tolist() == before.case_ids.tolist()
    np.testing.assert_array_equal(after.scores, before.scores)
    np.testing.assert_array_equal(after.maps, before.maps)
