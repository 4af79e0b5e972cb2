"""``build_uninitialised`` (issue 22, round 6): networks whose every weight is loaded next skip their random
initialisation, on the meta device where every non-persistent buffer is one it rebuilds, else by turning random
fills of parameters into zero fills. No RNG is drawn; buffers, the non-persistent ones included, are as in a normal
build; other threads build as usual; a strict load afterwards gives the normal network."""
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


class _Bertish(torch.nn.Module):
    """BERT's two constructed buffers, a persistent buffer and a parameter: the meta-device way applies."""

    def __init__(self) -> None:
        super().__init__()
        self.words = torch.nn.Embedding(11, 4)
        self.register_buffer("position_ids", torch.arange(7).expand((1, -1)), persistent=False)
        self.register_buffer("token_type_ids", torch.zeros(1, 7, dtype=torch.long), persistent=False)
        self.register_buffer("scale", torch.full((4,), 2.0))


def test_the_meta_device_way_rebuilds_berts_buffers_and_is_refused_otherwise():
    state = torch.get_rng_state()
    net = build_uninitialised(_Bertish)
    assert torch.equal(net.position_ids, torch.arange(7).expand((1, -1)))
    assert torch.equal(net.token_type_ids, torch.zeros(1, 7, dtype=torch.long))
    assert net.words.weight.device.type == "cpu" and torch.equal(torch.get_rng_state(), state)
    reference = seeded_build(1, _Bertish)
    net.load_state_dict(reference.state_dict(), strict=True)
    assert torch.equal(net.words.weight, reference.words.weight) and torch.equal(net.scale, reference.scale)

    class WithAttribute(_Bertish):  # a tensor that is neither parameter nor buffer: built the other way, not on meta
        def __init__(self) -> None:
            super().__init__()
            self.table = torch.linspace(0, 1, 5)

    other = build_uninitialised(WithAttribute)
    assert torch.equal(other.table, torch.linspace(0, 1, 5)) and torch.equal(torch.get_rng_state(), state)


def test_no_random_fill_of_a_parameter_and_no_rng_draw(monkeypatch):
    fills: list[str] = []
    real = torch.Tensor.uniform_

    def counted(self, *args, **kwargs):  # fills of real memory (a meta-device attempt fills nothing)
        if not self.is_meta:
            fills.append(type(self).__name__)
        return real(self, *args, **kwargs)

    state = torch.get_rng_state()
    net = build_uninitialised(_Net)  # its causal buffer keeps it off the meta device
    assert torch.equal(torch.get_rng_state(), state)  # a normal build draws from the global RNG
    seeded_build(0, _Net)
    assert torch.equal(torch.get_rng_state(), state)
    _Net()
    assert not torch.equal(torch.get_rng_state(), state)
    monkeypatch.setattr(torch.Tensor, "uniform_", counted)
    build_uninitialised(lambda: torch.nn.Sequential(_Net(), torch.nn.Linear(8, 4)))
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
    pytest.importorskip("open_clip", reason="open_clip_torch (a core dependency) is not installed")
    from xbench.models.clip import build_clip

    mask = build_clip(None).attn_mask  # non-persistent: no checkpoint holds it
    assert torch.equal(mask, torch.full(mask.shape, float("-inf")).triu(1))


def test_a_strict_load_takes_the_checkpoints_tensors_and_converts_only_where_it_must():
    """:func:`xbench.models.base.load_state_strict` makes a checkpoint's tensors the module's (no copy) where they are
    already in the module's dtype and device and contiguous, and converts the others; the module's values are the
    bytes of a plain ``load_state_dict``, its parameters stay parameters that require grad."""
    from xbench.models.base import load_state_strict

    def net() -> torch.nn.Module:
        return torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))

    gen = torch.Generator().manual_seed(0)
    state = {k: torch.randn(v.shape, generator=gen) if v.is_floating_point() else v + 3
             for k, v in net().state_dict().items()}
    state["0.weight"] = torch.randn(3, 2, generator=gen).t()  # not contiguous
    state["0.bias"] = torch.randn(2, generator=gen).half()  # another dtype
    plain = net()
    plain.load_state_dict(state, strict=True)
    loaded = net()
    load_state_strict(loaded, state, "test checkpoint")
    got, want = loaded.state_dict(), plain.state_dict()
    assert got.keys() == want.keys()
    assert all(got[k].dtype == want[k].dtype and torch.equal(got[k], want[k]) for k in want)
    assert loaded[1].running_mean.data_ptr() == state["1.running_mean"].data_ptr()  # taken, not copied
    assert loaded[0].weight.is_contiguous() and loaded[0].weight.data_ptr() != state["0.weight"].data_ptr()
    assert loaded[0].bias.dtype == torch.float32
    assert all(isinstance(p, torch.nn.Parameter) and p.requires_grad for p in loaded.parameters())
