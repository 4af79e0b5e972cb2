"""Real training checkpoints pickle more than tensors (issue 11): a numpy scalar, an ``argparse.Namespace``,
an optimizer and a scheduler's state next to the weights, as the official training scripts of MedKLIP,
MAVL and KAD save them. Each must load through the adapter's own path, with the weights exact.

Before the shared safe reader, ``load_checkpoint`` used ``torch.load(weights_only=True)`` only and refused
these files with ``CheckpointError``.
"""
from __future__ import annotations

import argparse

import numpy as np
import pytest
import torch

from xbench.models.base import load_checkpoint


def _training_extras() -> dict:
    return {"optimizer": {"state": {}, "param_groups": [{"lr": 1e-4, "weight_decay": np.float64(0.02)}]},
            "lr_scheduler": {"last_epoch": 40, "base_lrs": [1e-4], "_step_count": np.int64(41)},
            "config": argparse.Namespace(image_res=224, batch_size=np.int64(32), output_dir="out"),
            "epoch": np.int64(40)}


def _assert_same(model: torch.nn.Module, expected: dict[str, torch.Tensor]) -> None:
    got = model.state_dict()
    assert set(got) == set(expected)
    assert all(torch.equal(got[k], v) for k, v in expected.items())


def test_medklip_training_checkpoint_loads(tmp_path):
    from xbench.models.medklip import MedKLIPAdapter, MedKLIPNet, bert_from_state

    torch.manual_seed(1)
    state = MedKLIPNet().state_dict()
    path = tmp_path / "checkpoint_final.pth"
    torch.save({"model": {f"module.{k}": v for k, v in state.items()}, **_training_extras()}, path)
    adapter = MedKLIPAdapter.from_checkpoint(load_checkpoint(path), bert_from_state())
    _assert_same(adapter.net, state)


def test_mavl_training_checkpoint_loads(tmp_path):
    from xbench.models.mavl import MAVLAdapter, MAVLNet
    from xbench.models.medklip import bert_from_state

    torch.manual_seed(2)
    state = MAVLNet().state_dict()
    path = tmp_path / "checkpoint_full_40.pth"
    torch.save({"model": {f"module.{k}": v for k, v in state.items()}, **_training_extras()}, path)
    adapter = MAVLAdapter.from_checkpoint(load_checkpoint(path), bert_from_state())
    _assert_same(adapter.net, state)


@pytest.mark.parametrize("trunk", ["layer3"])
def test_kad_training_checkpoint_loads(tmp_path, trunk):
    from xbench.models.kad import HashWordTokenizer, KADAdapter, KADNetwork, seeded_build

    network = seeded_build(3, lambda: KADNetwork(trunk))
    containers = {name: getattr(network, name).state_dict() for name in ("image_encoder", "text_encoder", "model")}
    path = tmp_path / "best_valid.pt"
    torch.save({**containers, **_training_extras()}, path)
    adapter = KADAdapter.from_checkpoint(load_checkpoint(path), HashWordTokenizer(),
                                                  {"params": {"trunk": trunk}, "input_size": 224})
    for name, state in containers.items():
        _assert_same(getattr(adapter.network, name), state)
