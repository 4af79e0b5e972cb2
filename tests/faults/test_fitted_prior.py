"""Issue 12 item 3: the anatomical prior is refitted when what it was fitted on changes, and on `--overwrite`.

(Old main reused `fitted/<dataset>/<model>/` whenever it existed: after changing the dataset options, an
overwritten run still scored the old prior.)"""
from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
from conftest import tiny_run

import xbench
from xbench.spec.config import RunConfig
from xbench.core.errors import XBenchWarning
from xbench.models.priors import PRIOR_FILE, AnatomicalPrior
from xbench.workflows.run import run

pytestmark = pytest.mark.usefixtures("phantom_cache")


def config(out: Path, **options) -> RunConfig:
    raw = tiny_run(out, cases=12, models=[{"name": "anatomical_prior", "fit_split": "prior"}], bootstrap={"replicates": 0})
    raw["datasets"][0].update(options)
    return RunConfig.from_dict(raw)


def fitted(out: Path) -> dict:
    with np.load(out / "fitted" / "phantom" / "anatomical_prior" / PRIOR_FILE) as data:
        return {"maps": data["maps"], "rate": data["positive_rate"]}


def quiet_run(cfg: RunConfig, **kwargs) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", XBenchWarning)
        run(cfg, progress=False, **kwargs)


@pytest.mark.parametrize("overwrite", [True, False])
def test_changed_dataset_options_refit_the_prior(tmp_path, overwrite):
    out = tmp_path / "run"
    quiet_run(config(out))
    before = fitted(out)
    changed = config(out, prevalence=0.6)
    if overwrite:
        quiet_run(changed, overwrite=True)
    else:  # another run folder's store is fresh, but the fitted folder is shared by path: it must not be reused
        (out / "store").rename(tmp_path / "old-store")
        quiet_run(changed)
    after = fitted(out)
    expected = AnatomicalPrior.fit(xbench.load_dataset("phantom", split="prior", cases=12, prevalence=0.6))
    expected.save(tmp_path / "fresh")
    with np.load(tmp_path / "fresh" / PRIOR_FILE) as data:
        np.testing.assert_array_equal(after["maps"], data["maps"])
        np.testing.assert_array_equal(after["rate"], data["positive_rate"])
    assert not np.array_equal(before["rate"], after["rate"])


def test_unchanged_inputs_reuse_the_fit(tmp_path, monkeypatch):
    out = tmp_path / "run"
    quiet_run(config(out))
    calls = []
    monkeypatch.setattr(AnatomicalPrior, "fit", classmethod(lambda cls, *a, **k: calls.append(1)))
    quiet_run(config(out))
    assert calls == []
