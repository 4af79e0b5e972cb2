"""No code from a weights file runs: planted ``__reduce__`` payloads in every container format.

Every payload file is written by the test itself into ``tmp_path`` (nothing malicious is committed).
A payload "runs" if its marker file appears; each test asserts the marker is absent and that the
reader reported what it replaced (a :class:`CheckpointWarning` naming the pickled global) or refused
the file (a :class:`CheckpointError` naming it).
"""
from __future__ import annotations

import argparse
import builtins
import collections
import os
import pickle
import subprocess
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from xbench.core.errors import CheckpointError
from xbench.models.base import load_checkpoint


# -- payloads: each would create ``marker`` if it ever ran ------------------------------------------
class OsSystem:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


class Exec(OsSystem):
    def __reduce__(self):
        return (builtins.exec, (f"open({str(self.marker)!r}, 'w').close()",))


class Eval(OsSystem):
    def __reduce__(self):
        return (builtins.eval, (f"open({str(self.marker)!r}, 'w')",))


class Open(OsSystem):
    def __reduce__(self):
        return (builtins.open, (str(self.marker), "w"))


class Popen(OsSystem):
    def __reduce__(self):
        return (subprocess.Popen, (["touch", str(self.marker)],))


PAYLOADS = {"os.system": (OsSystem, "system"), "exec": (Exec, "exec"), "eval": (Eval, "eval"),
            "open": (Open, "open"), "subprocess.Popen": (Popen, "subprocess.Popen")}


class TrainingConfig:
    """A config object pickled by NEWOBJ + BUILD (as OmegaConf / dataclass configs are), holding a payload."""

    def __init__(self, payload):
        self.lr = 1e-4
        self.schedule = {"warmup": 5}
        self.hook = payload


class AttributeDict(dict):
    """Lightning's dict subclass for hyper-parameters (pickled with SETITEMS on the instance)."""


def _weights() -> dict[str, torch.Tensor]:
    return {"layer.weight": torch.arange(6, dtype=torch.float32).reshape(2, 3), "layer.bias": torch.ones(2)}


def _assert_reported(record, name: str) -> None:
    messages = " ".join(str(w.message) for w in record)
    assert name in messages, messages


@pytest.fixture(params=sorted(PAYLOADS))
def payload(request, tmp_path):
    cls, name = PAYLOADS[request.param]
    marker = tmp_path / f"marker-{request.param}"
    return cls(marker), name, marker


def test_plain_torch_zip(tmp_path, payload):
    from xbench.models.checkpoint import CheckpointWarning, Placeholder

    obj, name, marker = payload
    path = tmp_path / "plain.pt"
    torch.save({**_weights(), "extra": obj}, path)
    with pytest.warns(CheckpointWarning) as record:
        loaded = load_checkpoint(path)
    assert not marker.exists()
    _assert_reported(record, name)
    assert torch.equal(loaded["layer.weight"], _weights()["layer.weight"])
    assert isinstance(loaded["extra"], Placeholder) and name in repr(loaded["extra"])


def test_lightning_ckpt_with_pickled_config(tmp_path, payload):
    from xbench.models.checkpoint import CheckpointWarning, Placeholder

    obj, name, marker = payload
    hparams = AttributeDict(cfg=TrainingConfig(obj), batch_size=32)
    path = tmp_path / "model.ckpt"
    torch.save({"state_dict": _weights(), "hyper_parameters": hparams, "epoch": 7,
                "callbacks": {"ModelCheckpoint": {"best_model_score": torch.tensor(0.9)}}}, path)
    with pytest.warns(CheckpointWarning) as record:
        loaded = load_checkpoint(path)
    assert not marker.exists()
    _assert_reported(record, name)
    _assert_reported(record, "TrainingConfig")
    assert isinstance(loaded["hyper_parameters"], Placeholder)
    assert loaded["hyper_parameters"].pickled_items["batch_size"] == 32
    assert loaded["epoch"] == 7 and all(torch.equal(loaded["state_dict"][k], v) for k, v in _weights().items())


def test_pth_with_namespace_numpy_scheduler_and_payload(tmp_path, payload):
    from xbench.models.checkpoint import CheckpointWarning

    obj, name, marker = payload
    args = argparse.Namespace(lr=np.float32(0.5), epochs=np.int64(40), image_res=224, hook=obj)
    scheduler = {"last_epoch": 39, "base_lrs": [1e-4], "_step_count": np.int64(40)}
    path = tmp_path / "checkpoint_final.pth"
    torch.save({"model": _weights(), "optimizer": {"state": {}, "param_groups": [{"lr": 1e-4}]},
                "lr_scheduler": scheduler, "config": args, "epoch": np.int64(40),
                "mean": np.array([0.485, 0.456, 0.406])}, path)
    with pytest.warns(CheckpointWarning) as record:
        loaded = load_checkpoint(path)
    assert not marker.exists()
    _assert_reported(record, name)
    assert isinstance(loaded["config"], argparse.Namespace) and loaded["config"].image_res == 224
    assert loaded["config"].epochs == 40 and loaded["config"].lr.dtype == np.float32
    assert loaded["epoch"] == 40 and isinstance(loaded["epoch"], np.int64)
    np.testing.assert_array_equal(loaded["mean"], [0.485, 0.456, 0.406])
    assert loaded["lr_scheduler"]["_step_count"] == 40


def test_safetensors_name_holding_a_pickle_is_refused_by_path(tmp_path, payload):
    obj, _, marker = payload
    path = tmp_path / "model.safetensors"
    torch.save({**_weights(), "extra": obj}, path)
    with pytest.raises(CheckpointError, match=r"model\.safetensors.*not a readable safetensors file"):
        load_checkpoint(path)
    path.write_bytes(pickle.dumps(obj))
    with pytest.raises(CheckpointError, match=r"model\.safetensors"):
        load_checkpoint(path)
    assert not marker.exists()


def test_real_safetensors_loads(tmp_path):
    from safetensors.torch import save_file

    save_file(_weights(), tmp_path / "model.safetensors")
    loaded = load_checkpoint(tmp_path / "model.safetensors")
    assert all(torch.equal(loaded[k], v) for k, v in _weights().items())


def test_training_checkpoint_without_payload_loads_silently(tmp_path, recwarn):
    """numpy scalars/arrays, a Namespace, OrderedDict/defaultdict/deque: all admitted, nothing replaced."""
    path = tmp_path / "best_valid.pt"
    state = {"model": collections.OrderedDict(_weights()), "epoch": np.int64(3), "best": np.float64(0.8),
             "args": argparse.Namespace(bert_model_name="Med-KEBERT", res=224),
             "history": collections.deque([1, 2]), "counts": collections.defaultdict(int, a=1)}
    torch.save(state, path)
    loaded = load_checkpoint(path)
    assert not [w for w in recwarn if "placeholder" in str(w.message)]
    assert loaded["best"] == 0.8 and loaded["args"].res == 224 and loaded["counts"]["a"] == 1


def test_build_on_a_class_is_refused(tmp_path):
    """A pickle that BUILDs onto an admitted class (mutating a global) is refused, not executed."""
    body = (b"\x80\x02ccollections\nOrderedDict\n}X\x08\x00\x00\x00__call__X\x01\x00\x00\x00xsb.")
    path = tmp_path / "build.pt"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("build/data.pkl", body)
        archive.writestr("build/version", "3\n")
        archive.writestr("build/byteorder", "little")
    with pytest.raises(CheckpointError, match=r"build\.pt"):
        load_checkpoint(path)
    assert "__call__" not in collections.OrderedDict.__dict__


def test_garbage_and_truncated_files_name_the_path(tmp_path):
    path = tmp_path / "broken.pth"
    path.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="broken.pth"):
        load_checkpoint(path)
    good = tmp_path / "good.pth"
    torch.save(_weights(), good)
    (tmp_path / "cut.pth").write_bytes(good.read_bytes()[:200])
    with pytest.raises(CheckpointError, match="cut.pth"):
        load_checkpoint(tmp_path / "cut.pth")


# -- TorchScript (CLIP's ViT-B-16.pt): never compiled or run -------------------------------------------
def _torchscript_with_payload(path: Path, marker: Path, payload) -> None:
    """A zip laid out like a TorchScript archive whose data.pkl is a payload and whose code writes the marker."""
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("ViT-B-16/data.pkl", pickle.dumps(payload, protocol=2))
        archive.writestr("ViT-B-16/constants.pkl", pickle.dumps((), protocol=2))
        archive.writestr("ViT-B-16/version", "3\n")
        archive.writestr("ViT-B-16/code/__torch__.py",
                         f"def __setstate__(self, state):\n    open({str(marker)!r}, 'w')\n")


def test_crafted_torchscript_archive_is_not_run(tmp_path, payload):
    from xbench.models import create_model

    obj, name, marker = payload
    _torchscript_with_payload(tmp_path / "ViT-B-16.pt", marker, obj)
    with pytest.warns(Warning) as record, pytest.raises(
            CheckpointError, match=r"ViT-B-16\.pt.*open_clip_pytorch_model\.bin.*vit_base_patch16_clip_224\.openai"):
        create_model("clip", weights=tmp_path)  # the only CLIP file present: OpenAI's archive
    assert not marker.exists()
    _assert_reported(record, name)


def test_torchscript_reader_gives_the_state_dict_of_a_traced_module(tmp_path):
    from xbench.models.checkpoint import read_torchscript_state_dict

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(2, 3)
            self.blocks = torch.nn.Sequential(torch.nn.Linear(3, 1))
            self.register_buffer("scale", torch.tensor([2.0]))

        def forward(self, x):
            return self.blocks(self.proj(x)) * self.scale

    net = Net().half()
    with pytest.warns((DeprecationWarning, FutureWarning, UserWarning)):
        torch.jit.save(torch.jit.trace(net, torch.zeros(1, 2, dtype=torch.half)), str(tmp_path / "net.pt"))
    state, report = read_torchscript_state_dict(tmp_path / "net.pt")
    assert report.method == "torchscript" and not report.replaced
    assert set(state) == set(net.state_dict())
    assert all(torch.equal(state[k], v) for k, v in net.state_dict().items())
    with pytest.raises(CheckpointError, match="TorchScript"):
        load_checkpoint(tmp_path / "net.pt")  # the generic reader never takes an archive with code


def test_no_torch_jit_load_and_no_unsafe_load_in_the_library():
    root = Path(__file__).resolve().parents[2] / "xbench"
    bad = ("torch.jit.load", "weights_only=False", "pickle.load(", "pickle.loads(", "allow_pickle=True")
    hits = [f"{p.relative_to(root)}: {b}" for p in root.rglob("*.py") for b in bad if b in p.read_text()]
    assert not hits, hits


# -- CARZero: non-string key / non-tensor value name the file and the key (issue 12 item 10) ----------
def test_carzero_state_with_bad_key_or_value_names_file_and_key(tmp_path):
    from xbench.models.carzero import official_state

    with pytest.raises(CheckpointError, match=r"CARZero_best_model\.ckpt\['state_dict'\].*key 7 is a int"):
        official_state({"state_dict": {7: torch.zeros(1)}}, "CARZero_best_model.ckpt")
    with pytest.raises(CheckpointError, match=r"CARZero_best_model\.ckpt.*'CARZero\.x' is a str, not a tensor"):
        official_state({"state_dict": {"CARZero.x": "abc"}}, "CARZero_best_model.ckpt")


def test_carzero_file_with_a_placeholder_value_is_refused_by_key(tmp_path):
    from xbench.models.carzero import CARZeroAdapter
    from xbench.models.checkpoint import CheckpointWarning

    marker = tmp_path / "marker"
    path = tmp_path / "CARZero_best_model.ckpt"
    torch.save({"state_dict": {"CARZero.fusion_module.decoder_norm.weight": Exec(marker)}}, path)
    with pytest.warns(CheckpointWarning, match="exec"):
        checkpoint = load_checkpoint(path)
    with pytest.raises(CheckpointError, match=r"CARZero_best_model\.ckpt.*decoder_norm\.weight' is a exec"):
        CARZeroAdapter.from_checkpoint(checkpoint, None, [], where=str(path))
    assert not marker.exists()


def test_sized_allocations_are_refused(tmp_path):
    """``bytearray(n)`` / ``range(n)`` from a pickle would allocate or iterate on request: refused or inert."""
    from xbench.models.checkpoint import CheckpointWarning, Placeholder

    class Bomb:
        def __reduce__(self):
            return (bytearray, (10**12,))

    class Lazy:
        def __reduce__(self):
            return (range, (10**12,))

    torch.save({"w": torch.ones(1), "x": Bomb()}, tmp_path / "bomb.pt")
    # refused before any allocation (torch's own weights-only unpickler would call bytearray(10**12): never used
    # on an archive, so this test is safe on a machine with much memory too)
    with pytest.raises(CheckpointError, match=r"bomb\.pt.*bytearray from a int"):
        load_checkpoint(tmp_path / "bomb.pt")
    torch.save({"w": torch.ones(1), "x": Lazy()}, tmp_path / "lazy.pt")
    with pytest.warns(CheckpointWarning, match="range"):
        assert isinstance(load_checkpoint(tmp_path / "lazy.pt")["x"], Placeholder)
    torch.save({"w": torch.ones(1), "x": bytearray(b"abc")}, tmp_path / "ok.pt")
    assert load_checkpoint(tmp_path / "ok.pt")["x"] == bytearray(b"abc")
