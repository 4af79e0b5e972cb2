"""``build_uninitialised`` (issue 22, round 6): networks whose every weight is loaded next skip their random
initialisation. Parameters get no random fill and no RNG draw; buffers, the non-persistent ones included, are
computed as in a normal build; other threads build as usual; a strict load afterwards gives the normal network."""
from __future__ import annotations

import threading

import pytest
import torch

from xbench.models._common import build_uninitialised, seeded_build


class _Net(torch.nn.Module):
    """A linear layer, batch norm, an embedding with a truncated-normal init and a non-persistent buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 4)
        self.norm = torch.nn.BatchNorm1d(4)
        self.embed = torch.nn.Parameter(torch.empty(5, 4))
        torch.nn.init.trunc_normal_(self.embed, std=0.02)
        self.register_buffer("causal", torch.full((3, 3), float("-inf")).triu(1), persistent=False)


def test_no_random_fill_of_a_parameter_and_no_rng_draw(monkeypatch):
    fills: list[str] = []
    real = torch.Tensor.uniform_

    def counted(self, *args, **kwargs):
        fills.append(type(self).__name__)
        return real(self, *args, **kwargs)

    state = torch.get_rng_state()
    net = build_uninitialised(_Net)
    assert torch.equal(torch.get_rng_state(), state)  # a normal build draws from the global RNG
    seeded_build(0, _Net)
    assert torch.equal(torch.get_rng_state(), state)
    _Net()
    assert not torch.equal(torch.get_rng_state(), state)
    monkeypatch.setattr(torch.Tensor, "uniform_", counted)
    build_uninitialised(lambda: torch.nn.Linear(8, 4))
    assert fills == []
    torch.nn.Linear(8, 4)
    assert fills == ["Parameter", "Parameter"]  # weight and bias, outside the helper
    assert torch.equal(net.causal, torch.full((3, 3), float("-inf")).triu(1))  # buffers as built normally
    assert torch.equal(net.norm.running_var, torch.ones(4)) and net.norm.num_batches_tracked.item() == 0


def test_a_strict_load_gives_the_normal_network():
    reference = seeded_build(7, _Net).eval()
    net = build_uninitialised(_Net).eval()
    net.load_state_dict(reference.state_dict(), strict=True)
    x = torch.randn(6, 8)
    assert torch.equal(net.norm(net.linear(x)), reference.norm(reference.linear(x)))
    assert all(torch.equal(a, b) for a, b in zip(net.state_dict().values(), reference.state_dict().values()))
    assert torch.equal(net.causal, reference.causal)


def test_other_threads_initialise_as_usual():
    built: dict[str, torch.nn.Module] = {}

    def elsewhere() -> None:
        built["thread"] = seeded_build(3, lambda: torch.nn.Linear(64, 64))

    def factory() -> torch.nn.Module:
        worker = threading.Thread(target=elsewhere)
        worker.start()
        worker.join()
        return torch.nn.Linear(64, 64)

    build_uninitialised(factory)
    assert torch.equal(built["thread"].weight, seeded_build(3, lambda: torch.nn.Linear(64, 64)).weight)


def test_clip_keeps_its_causal_mask():
    pytest.importorskip("open_clip")
    from xbench.models.clip import build_clip

    mask = build_clip(None).attn_mask  # non-persistent: no checkpoint holds it
    assert torch.equal(mask, torch.full(mask.shape, float("-inf")).triu(1))
