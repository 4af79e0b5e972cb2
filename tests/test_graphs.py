"""CUDA graphs of the networks' batch steps (xbench/inference/graphs.py).

On the CPU, :class:`GraphedPredict`'s bookkeeping runs against a recorder that behaves like a graph (a recording
computes nothing; a replay overwrites the recorded output tensors from the static input). On CUDA
(``XBENCH_TEST_DEVICE=cuda``), every network's replays are compared byte for byte with its eager outputs.
"""
from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch

import xbench
from conftest import tiny_run
from models.biomedclip_folder import write_folder
from xbench.core.errors import XBenchWarning
from xbench.inference.graphs import CudaRecorder, GraphedPredict, graph_use
from xbench.models.base import Adapter, Prediction
from xbench.spec.config import RunConfig
from xbench.spec.registry import import_target, model_config
from xbench.workflows.run import run

NETWORKS = ["clip", "biomedclip", "medklip", "kad", "mavl", "carzero", "devide"]
PROMPTS = ["pneumonia", "pleural effusion", "cardiomegaly"]


class Doubling(Adapter):
    """A network stand-in: scores = per-image means × prompt index, maps = the first channel, on the device."""

    config_name = "center_prior"

    def __init__(self):
        super().__init__({"name": "doubling", "grid": [4, 4], "input_size": 4})
        self.calls = 0

    def preprocess(self, image):
        raise NotImplementedError

    def predict_on_device(self, pixels, prompts):
        self.calls += 1
        base = pixels.mean(dim=(1, 2, 3))
        scores = torch.stack([base * (i + 1) for i in range(len(prompts))], dim=1)
        return Prediction(scores=scores, maps=pixels[:, :1].expand(-1, len(prompts), -1, -1) * 2)


class FakeGraphs:
    """Graph semantics on the CPU: ``record`` computes nothing readable (outputs are NaN until a replay); ``replay``
    writes ``fn(static)`` into the recorded outputs, as a CUDA graph overwrites its output memory."""

    def __init__(self, fail: bool = False):
        self.fail, self.recorded, self.replays, self.eager_calls = fail, 0, 0, 0

    def eager(self, fn, pixels):
        self.eager_calls += 1
        return fn(pixels)

    def record(self, fn, static):
        if self.fail:
            raise RuntimeError("operation not permitted when stream is capturing")
        self.recorded += 1
        out = fn(static)
        out = Prediction(scores=torch.full_like(out.scores, float("nan")), maps=torch.full_like(out.maps, float("nan")))
        return (fn, static, out), out

    def replay(self, graph):
        self.replays += 1
        fn, static, out = graph
        now = fn(static)
        out.scores.copy_(now.scores)
        out.maps.copy_(now.maps)


def batches(sizes: list[int]) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.rand(b, 3, 4, 4, generator=g) for b in sizes]


def test_full_batches_are_replayed_after_the_warm_up_and_each_output_is_the_eager_one():
    adapter, graphs = Doubling(), FakeGraphs()
    step = GraphedPredict(adapter, PROMPTS, 4, torch.device("cpu"), warmup=2, recorder=graphs)
    inputs = batches([4, 4, 4, 4, 4, 3, 4])
    for pixels in inputs:
        got = step(pixels)
        want = adapter.predict_on_device(pixels, PROMPTS)
        assert torch.equal(got.scores, want.scores) and torch.equal(got.maps, want.maps)
        got_first = got.scores.clone()
        assert torch.equal(got_first, want.scores)  # copied before the next call, as the runner does
    # two warm-up batches and the 3-case batch ran eagerly; the third full batch was recorded, then replayed
    assert step.counts() == {"replayed": 4, "eager": 3}
    assert (graphs.recorded, graphs.replays, graphs.eager_calls) == (1, 4, 3)


def test_a_replay_overwrites_the_previous_outputs_so_the_runner_copies_each_batch_at_once():
    step = GraphedPredict(Doubling(), PROMPTS, 2, torch.device("cpu"), warmup=0, recorder=FakeGraphs())
    first_in, second_in = batches([2, 2])
    first = step(first_in)
    kept = first.scores.clone()
    second = step(second_in)
    assert first.scores is second.scores  # the graph's output memory
    assert not torch.equal(kept, second.scores)


def test_a_failed_recording_leaves_the_pair_eager_with_the_reason_and_right_outputs():
    adapter = Doubling()
    step = GraphedPredict(adapter, PROMPTS, 4, torch.device("cpu"), warmup=1, recorder=FakeGraphs(fail=True))
    for pixels in batches([4, 4, 4, 2]):
        got = step(pixels)
        want = adapter.predict_on_device(pixels, PROMPTS)
        assert torch.equal(got.scores, want.scores) and torch.equal(got.maps, want.maps)
    counts = step.counts()
    assert counts["replayed"] == 0 and counts["eager"] == 4
    assert counts["failed"] == "RuntimeError: operation not permitted when stream is capturing"


def test_a_batch_of_another_layout_runs_eagerly():
    step = GraphedPredict(Doubling(), PROMPTS, 2, torch.device("cpu"), warmup=0, recorder=FakeGraphs())
    plain, = batches([2])
    step(plain)
    wide = plain.contiguous(memory_format=torch.channels_last)
    step(wide)
    step(plain.double())
    assert step.counts() == {"replayed": 1, "eager": 2}


def test_which_pairs_are_replayed():
    cuda = torch.device("cuda")
    prior = xbench.create_model("center_prior")
    assert graph_use(cuda, Doubling(), "fp32", True) is None
    assert graph_use(cuda, Doubling(), "tf32", True) is None
    assert graph_use(cuda, Doubling(), "bf16", True) == "precision bf16 runs under autocast"
    assert graph_use(cuda, Doubling(), "fp32", False) == "cuda_graphs: false"
    assert graph_use(torch.device("cpu"), Doubling(), "fp32", True) == "the run device is not CUDA"
    assert graph_use(cuda, prior, "fp32", True) == "CenterPrior has no predict_on_device"
    ready = {name: import_target(model_config(name)["class"]).graph_ready() for name in
             NETWORKS + ["center_prior", "random_prior", "anatomical_prior", "ref_xattn", "ref_patchsim"]}
    assert ready == {**{n: True for n in NETWORKS}, "center_prior": False, "random_prior": False,
                     "anatomical_prior": False, "ref_xattn": False, "ref_patchsim": False}


def test_predict_is_predict_on_device_copied_to_the_host():
    adapter = Doubling()
    pixels, = batches([3])
    a, b = adapter.predict(pixels, PROMPTS), adapter.predict_on_device(pixels, PROMPTS)
    assert torch.equal(a.scores, b.scores) and torch.equal(a.maps, b.maps) and a.scores.device.type == "cpu"


def test_a_run_log_says_whether_each_pair_was_replayed(tmp_path, phantom_cache):
    out = tmp_path / "run"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", XBenchWarning)
        run(RunConfig.from_dict(tiny_run(out, cases=6, models=["center_prior"])), progress=False)
    pairs = [e for e in json.loads((out / "run_log.json").read_text()) if e.get("model") == "center_prior"]
    assert len(pairs) == 1 and pairs[0]["cuda_graph"] == {"off": "the run device is not CUDA"}


@pytest.mark.parametrize("name", NETWORKS)
def test_replays_are_the_eager_bytes_on_cuda(name, test_device, tmp_path):
    if test_device.type != "cuda":
        pytest.skip("CUDA graphs need XBENCH_TEST_DEVICE=cuda")
    folder = write_folder(tmp_path / "biomedclip") if name == "biomedclip" else None  # its config and vocabulary
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        adapter = xbench.create_model(name, weights=folder, device=test_device, random_init=True)
    size = adapter.input_size
    g = torch.Generator(device=test_device).manual_seed(0)
    inputs = [torch.rand(4, 3, size, size, device=test_device, generator=g) for _ in range(4)]
    step = GraphedPredict(adapter, PROMPTS, 4, test_device, warmup=1, recorder=CudaRecorder(test_device))
    with torch.inference_mode():
        for pixels in inputs:
            got = step(pixels).cpu()
            want = adapter.predict(pixels, PROMPTS)
            np.testing.assert_array_equal(got.scores.numpy(), want.scores.numpy())
            np.testing.assert_array_equal(got.maps.numpy(), want.maps.numpy())
    assert step.counts() == {"replayed": 3, "eager": 1}
