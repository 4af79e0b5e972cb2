"""DeviceStage (xbench/inference/device_stage.py): rows stacked by size give each row its own plan codes, each row is
finished exactly once, and partial stacks never hold rows back past the stage's limits."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from conftest import TEST_DEVICE

from xbench.inference.device_stage import DeviceStage
from xbench.inference.gpu_preprocess import plan_for, preprocess_standins

DEVICE = torch.device(TEST_DEVICE)


@dataclass
class Row:
    row: int
    source: torch.Tensor | None
    inputs: dict[str, np.ndarray] = field(default_factory=dict)


def _plans() -> dict[str, object]:
    ads = preprocess_standins()
    return {name: plan_for(ads[name]) for name in ("medklip", "mavl", "kad", "carzero", "clip")}


def _rows(rng: np.random.Generator) -> list[Row]:
    shapes = [(300, 257), (256, 256), (300, 257), (263, 301), (256, 256), (300, 257), (256, 256), (300, 257)]
    rows = []
    for i, (h, w) in enumerate(shapes * 2):
        values = (rng.integers(0, 65536, (h, w)).astype(np.uint16) if i % 5 == 4
                  else rng.integers(0, 256, (h, w)).astype(np.uint8))
        rows.append(Row(i, torch.from_numpy(values)))
    return rows


def test_stacks_give_each_row_its_own_codes():
    """16 rows of three sizes and two dtypes, stacks of at most 3: every row finished once, with the codes of its own
    image per key (equal plans shared), keys it already held left alone and not reported."""
    plans = _plans()
    rng = np.random.default_rng(7)
    rows = _rows(rng)
    want = {r.row: {k: plans[k](r.source.to(DEVICE)).cpu().numpy() for k in plans} for r in rows}
    held = np.zeros((224, 224), np.uint8)
    rows[3].inputs["kad"] = held  # from the disk cache
    finished: list[tuple[int, list[str]]] = []
    stage = DeviceStage(plans, DEVICE, lambda item, keys: finished.append((item.row, keys)), max_images=3, depth=1)
    for r in rows:
        stage.put(r)
        assert stage.held <= 2 * 3  # partial stacks are launched before more than 2 x max_images rows are held
    stage.drain()
    assert sorted(i for i, _ in finished) == list(range(len(rows)))  # each row exactly once
    assert stage.stacks >= len(rows) // 3 and not stage.groups and not stage.flight
    for r in rows:
        assert r.source is None
        keys = dict(finished)[r.row]
        assert keys == ([k for k in plans if k != "kad"] if r.row == 3 else list(plans))
        for k in plans:
            if r.row == 3 and k == "kad":
                assert r.inputs[k] is held
                continue
            assert np.array_equal(r.inputs[k], want[r.row][k]), (r.row, k)
        assert r.inputs["medklip"] is r.inputs["mavl"]  # one plan, computed once for both keys
    assert stage.device_inputs == sum(len({plans[k] for k in keys}) for _, keys in finished)


def test_pixel_budget_launches_large_images_alone():
    """A row as large as the pixel budget is launched on its own at once; smaller rows wait for their stack."""
    plans = {"kad": _plans()["kad"]}
    finished: list[int] = []
    stage = DeviceStage(plans, DEVICE, lambda item, keys: finished.append(item.row), max_images=8,
                        max_pixels=300 * 300, depth=0)
    stage.put(Row(0, torch.zeros((300, 300), dtype=torch.uint8)))
    assert finished == [0] and stage.held == 0
    stage.put(Row(1, torch.zeros((100, 100), dtype=torch.uint8)))
    assert finished == [0] and stage.held == 1
    stage.drain()
    assert finished == [0, 1]


def test_the_stage_times_its_steps_within_the_callers_time():
    """``DeviceStage.seconds``: one entry per step of ``STEPS``, none negative, their sum within the time the caller
    spent in put/drain; the ``done`` callbacks are counted under ``publish`` (here 5 ms per row)."""
    import time

    from xbench.inference.device_stage import STEPS

    plans = _plans()
    rows = _rows(np.random.default_rng(3))
    stage = DeviceStage(plans, DEVICE, lambda item, keys: time.sleep(0.005), max_images=3, depth=1)
    started = time.perf_counter()
    for r in rows:
        stage.put(r)
    stage.drain()
    spent = time.perf_counter() - started
    assert tuple(stage.seconds) == STEPS and min(stage.seconds.values()) >= 0.0
    assert stage.seconds["kernels"] > 0.0 and stage.seconds["publish"] >= 0.005 * len(rows)
    assert sum(stage.seconds.values()) <= spent
