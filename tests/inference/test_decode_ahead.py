"""Decoding ahead (issue 22): a fresh dataset's inputs are decoded while its networks are built (input twins), and
the next dataset's while this one's models run. The decoding thread is running during the real builds and before
the previous dataset's pairs finish (the builds begin before the feed is set up), the store is the same bytes as
without decoding ahead, a twin whose preprocessing differs is caught (decoded again, logged), and a resumed dataset
builds first as before."""
from __future__ import annotations

import json
import logging
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from conftest import tiny_run
from xbench.core.errors import CheckpointError, FormatError, XBenchError, XBenchWarning
from xbench.datasets import open_dataset
from xbench.inference import feeds, runner
from xbench.inference.calibration import inherit_input, model_input
from xbench.inference.input_feed import InputFeed
from xbench.models.base import input_twin
from xbench.spec.config import RunConfig
from xbench.store.results import ResultStore
from xbench.workflows.run import run

pytestmark = pytest.mark.usefixtures("phantom_cache")

# two trained reference networks (twins: their _random hook on the meta device), a prior that reads pixels (no twin:
# built first) and one that reads none
MODELS = ["ref_xattn", "ref_patchsim", "random_prior", "center_prior"]
TWINNED = {"ref_xattn", "ref_patchsim"}


def infer(out: Path, models: list[str] = MODELS, **changes) -> dict[str, dict]:
    cfg = RunConfig.from_dict(tiny_run(out, cases=12, models=models, grid=[32, 32],
                                       **{"decode_ahead": True, "num_workers": 0, **changes}))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", XBenchWarning)
        run(cfg, progress=False, evaluate=False)
    return {e["model"]: e for e in json.loads((out / "run_log.json").read_text())}


def chunk_bytes(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted((out / "store").rglob("chunk-*.npz"))}


@pytest.fixture(scope="module")
def without_twins(tmp_path_factory) -> Path:
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("no-twins")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(runner, "input_twin", lambda *a, **k: None)
        log = infer(out)
    assert not any(e["built_while_decoding"] for e in log.values())
    return out


def test_an_input_twin_has_the_real_preprocessing_and_no_network_memory():
    import xbench

    twin, real = input_twin("ref_xattn"), xbench.create_model("ref_xattn")
    modules = [m for m in vars(twin).values() if isinstance(m, torch.nn.Module)]
    assert modules and {p.device.type for m in modules for p in m.parameters()} == {"meta"}
    image = np.random.default_rng(0).random((37, 53), dtype=np.float32)
    assert torch.equal(twin.preprocess(image), real.preprocess(image))
    assert twin.input_window((37, 53)) == real.input_window((37, 53))
    assert twin.weights_label == "input-twin" and real.weights_label == "xbench-reference"
    assert input_twin("center_prior") is None  # no _random hook: built for real, first


def test_a_built_adapter_takes_its_twins_calibration_from_two_probe_images(monkeypatch):
    """:func:`inherit_input`: the built adapter is checked on the two probe images only (not the 256 constant images
    of the 8-bit table), then shares its twin's calibration; one whose outputs differ is refused and left alone."""
    import xbench

    twin, real = input_twin("ref_xattn"), xbench.create_model("ref_xattn")
    want = model_input(twin)
    calls = []
    real_preprocess = type(real).preprocess
    monkeypatch.setattr(real, "preprocess", lambda image: calls.append(image.shape) or real_preprocess(real, image))
    assert inherit_input(real, twin) and len(calls) == 2
    assert model_input(real) is want and len(calls) == 2  # calibrated: no further call
    assert want.lut is not None and want.key == model_input(xbench.create_model("ref_xattn")).key  # full calibration

    other = xbench.create_model("ref_xattn")
    other.input_size = 48
    assert not inherit_input(other, twin)
    assert model_input(other).key != want.key  # nothing was recorded: calibrated in full, its own key


def test_networks_are_built_while_the_inputs_decode_and_the_store_is_unchanged(tmp_path, monkeypatch, without_twins):
    """The twinned networks are built in the background thread, started before the feed is set up: the feed's set-up
    waits here until a build has begun (it would wait 10 s in vain if the builds began after it), and each of those
    builds waits until the decoding thread runs (it would wait 30 s in vain if decoding waited for the builds). The
    models without a twin are built first, in the main thread, before anything decodes."""
    decoding_during_build: dict[str, bool] = {}
    build_thread: dict[str, str] = {}
    build_began, feed_saw_a_build = threading.Event(), []
    real_open, real_feed = runner.open_model, feeds.new_feed

    def new_feed(*args, **kwargs):
        feed_saw_a_build.append(build_began.wait(10))
        return real_feed(*args, **kwargs)

    def decoding() -> bool:
        return any(t.name == "xbench-decode" and t.is_alive() for t in threading.enumerate())

    def open_model(spec, *args, **kwargs):
        build_thread[spec.name] = threading.current_thread().name.rsplit("_", 1)[0]
        if spec.name in TWINNED:
            build_began.set()
            deadline = time.monotonic() + 30
            while not decoding() and time.monotonic() < deadline:
                time.sleep(0.01)
        decoding_during_build[spec.name] = decoding()
        return real_open(spec, *args, **kwargs)

    monkeypatch.setattr(runner, "open_model", open_model)
    monkeypatch.setattr(feeds, "new_feed", new_feed)
    log = infer(tmp_path / "run")
    assert feed_saw_a_build == [True]  # one fresh dataset, one feed
    assert decoding_during_build == {m: m in TWINNED for m in MODELS}
    assert build_thread == {m: "xbench-build" if m in TWINNED else "MainThread" for m in MODELS}
    assert {m: e["built_while_decoding"] for m, e in log.items()} == {m: m in TWINNED for m in MODELS}
    got, want = chunk_bytes(tmp_path / "run"), chunk_bytes(without_twins)
    assert len(got) == 4 * 2 and got == want  # 12 cases in chunks of 8: 2 chunks per model, the same bytes


def test_a_feed_that_cannot_be_set_up_cancels_the_builds_not_yet_begun(tmp_path, monkeypatch):
    """The background builds start before the feed is set up; when the set-up fails, its error is raised and the
    builds still queued are cancelled (the one under way ends in its thread)."""
    futures: list = []
    real_behind, failed = runner._build_behind, threading.Event()
    opened: list[str] = []
    real_open = runner.open_model

    def build_behind(*args, **kwargs):
        started = real_behind(*args, **kwargs)
        futures.extend(future for future, _ in started.values())
        return started

    def open_model(spec, *args, **kwargs):
        opened.append(spec.name)
        if spec.name in TWINNED:  # the first background build is under way when the set-up fails ...
            failed.wait(10)
            deadline = time.monotonic() + 10  # ... and ends only once the builds queued behind it are cancelled
            while not all(f.cancelled() for f in futures[1:]) and time.monotonic() < deadline:
                time.sleep(0.01)
        return real_open(spec, *args, **kwargs)

    def new_feed(*args, **kwargs):
        failed.set()
        raise XBenchError("no feed here")

    monkeypatch.setattr(runner, "_build_behind", build_behind)
    monkeypatch.setattr(runner, "open_model", open_model)
    monkeypatch.setattr(feeds, "new_feed", new_feed)
    with pytest.raises(XBenchError, match="no feed here"):
        infer(tmp_path / "run")
    assert len(futures) == 2
    futures[0].result(timeout=30)  # the build under way finishes
    assert futures[1].cancelled()
    assert len([m for m in opened if m in TWINNED]) == 1  # the second network was never opened


def test_a_twin_whose_preprocessing_differs_is_decoded_again(tmp_path, monkeypatch, caplog, without_twins):
    def wrong_twin(name, *args, **kwargs):
        twin = input_twin(name, *args, **kwargs)
        if twin is not None:
            twin.input_size = 48  # not the model's: what it decodes must not reach the model
        return twin

    monkeypatch.setattr(runner, "input_twin", wrong_twin)
    with caplog.at_level(logging.WARNING, logger="xbench.inference.feeds"):
        infer(tmp_path / "run")
    assert "do not match the built model's preprocessing; decoding again" in caplog.text
    assert "ref_xattn" in caplog.text and "ref_patchsim" in caplog.text
    assert chunk_bytes(tmp_path / "run") == chunk_bytes(without_twins)


def test_a_resumed_dataset_builds_its_models_first(tmp_path, without_twins):
    out = tmp_path / "run"
    infer(out)
    lost = ResultStore(out).chunk_path("phantom", "ref_xattn", 1)
    lost.unlink()
    log = infer(out)
    assert not any(e["built_while_decoding"] for e in log.values())
    assert log["ref_xattn"]["chunks_written"] == 1 and log["ref_patchsim"]["chunks_written"] == 0
    assert chunk_bytes(out) == chunk_bytes(without_twins)


def test_decode_ahead_is_on_for_cuda_runs_unless_turned_off(tmp_path, monkeypatch):
    """``auto`` (the default) decodes ahead only where the models run on CUDA: on the CPU decoding competes with them
    (docs/performance.md). ``false`` builds first on any device."""
    assert RunConfig.from_dict(tiny_run(tmp_path)).decode_ahead == "auto"
    for wrong in ("yes", 1):
        with pytest.raises(FormatError, match="decode_ahead"):
            RunConfig.from_dict(tiny_run(tmp_path, decode_ahead=wrong))
    chained: list = []
    monkeypatch.setattr(InputFeed, "then", lambda self, action: chained.append(action))
    log = infer(tmp_path / "auto", decode_ahead="auto")  # a CPU run
    assert not any(e["built_while_decoding"] for e in log.values()) and chained == []
    infer(tmp_path / "on", decode_ahead=True)  # the same run with decoding ahead: its twins, no next dataset
    assert json.loads((tmp_path / "on" / "run_log.json").read_text())[0]["built_while_decoding"] is True


def test_the_next_dataset_decodes_while_this_one_infers(tmp_path, monkeypatch, two_datasets):
    models = ["ref_xattn", "random_prior", "center_prior"]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(feeds, "fresh_rows", lambda *a, **k: [])  # nothing decoded ahead: the reference store
        infer(tmp_path / "plain", models, datasets=two_datasets)

    second_started = threading.Event()
    real_produce, real_finish = InputFeed._produce, runner.PairRun.finish
    seen: list[bool] = []

    def produce(self, todo):
        if len(self.dataset) == 10:  # phantom_b
            second_started.set()
        return real_produce(self, todo)

    def finish(self):
        if self.dspec.name == "phantom":  # the first dataset's pairs end only once the second one decodes
            seen.append(second_started.wait(timeout=60))
        return real_finish(self)

    monkeypatch.setattr(InputFeed, "_produce", produce)
    monkeypatch.setattr(runner.PairRun, "finish", finish)
    infer(tmp_path / "ahead", models, datasets=two_datasets)
    assert seen == [True] * len(models)
    got, want = chunk_bytes(tmp_path / "ahead"), chunk_bytes(tmp_path / "plain")
    assert len(got) == 2 * 3 * 2 and got == want  # 2 datasets x 3 models x 2 chunks, the same bytes


def test_with_decode_workers_the_next_dataset_is_chained_and_the_store_is_unchanged(tmp_path, monkeypatch,
                                                                                 two_datasets):
    """Through 2 decode workers: the runner chains the second dataset's feed to the first one's decoding, and the
    chunks are the bytes of a run without decoding ahead."""
    models = ["ref_xattn", "random_prior", "center_prior"]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(feeds, "fresh_rows", lambda *a, **k: [])  # nothing decoded ahead: the reference store
        infer(tmp_path / "plain", models, datasets=two_datasets, num_workers=2)
    chained: list = []
    real_then = InputFeed.then
    monkeypatch.setattr(InputFeed, "then", lambda self, action: chained.append(action) or real_then(self, action))
    infer(tmp_path / "ahead", models, datasets=two_datasets, num_workers=2)
    (start,) = chained  # the chain to phantom_b: its feed's start
    assert start.func.__name__ == "start" and len(start.func.__self__.dataset) == 10
    got, want = chunk_bytes(tmp_path / "ahead"), chunk_bytes(tmp_path / "plain")
    assert len(got) == 2 * 3 * 2 and got == want


def test_a_lead_of_small_images_is_inferred_first_and_the_tables_keep_the_config_order(tmp_path, two_datasets):
    """``inference_order`` (:mod:`xbench.datasets.base`): phantom_b (10 cases of 128² px) leads, before phantom (12
    cases of 512², first in the config, the most evaluation work, which largest first alone puts first); its ground
    truth is prepared in the same order. The tidy table still lists phantom first."""
    from xbench.datasets.base import inference_order, largest_first

    large, small = {**two_datasets[0], "cases": 12, "size": 512}, {**two_datasets[1], "cases": 10, "size": 128}
    cfg = RunConfig.from_dict(tiny_run(tmp_path / "run", models=["center_prior", "random_prior"], grid=[32, 32],
                                       num_workers=0, eval_workers=2, datasets=[large, small], decode_ahead=True))
    opened = [open_dataset(d) for d in cfg.datasets]
    assert largest_first(opened) == [0, 1] and inference_order(opened) == [1, 0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", XBenchWarning)
        out = run(cfg, progress=False)
    log = json.loads((tmp_path / "run" / "run_log.json").read_text())
    assert [e["dataset"] for e in log] == ["phantom_b"] * 2 + ["phantom"] * 2
    assert log[0]["since_start_seconds"] <= log[-1]["since_start_seconds"]
    events = json.loads((tmp_path / "run" / "evaluation_timing.json").read_text())["events"]
    assert events["phantom_b"]["ground_truth_started"] <= events["phantom"]["ground_truth_started"]
    tidy = pd.read_csv(out / "tables" / "metrics.csv")
    assert list(dict.fromkeys(tidy["dataset"])) == ["phantom", "phantom_b"]


def test_a_built_model_runs_while_the_next_network_is_built(tmp_path, monkeypatch, without_twins):
    """The twinned networks are built one after another in a background thread (smallest weight files first) and each
    model's pair starts as soon as its network is: the second network's build waits here until the first model has
    predicted a batch. The store is the same bytes as without twins."""
    first_predicted = threading.Event()
    built: list[str] = []
    waited: list[bool] = []
    real_open = runner.open_model

    def open_model(spec, *args, **kwargs):
        if spec.name in TWINNED:
            assert threading.current_thread().name.startswith("xbench-build")
            if built:  # the second network: built while the first model runs
                waited.append(first_predicted.wait(timeout=60))
            adapter = real_open(spec, *args, **kwargs)
            built.append(spec.name)
            if len(built) == 1:
                real_predict = adapter.predict_cases
                adapter.predict_cases = lambda *a, **k: (first_predicted.set(), real_predict(*a, **k))[1]
            return adapter
        return real_open(spec, *args, **kwargs)

    monkeypatch.setattr(runner, "open_model", open_model)
    log = infer(tmp_path / "run")
    assert sorted(built) == sorted(TWINNED) and waited == [True]
    first, second = built
    assert log[first]["built_since_start_seconds"] < log[second]["built_since_start_seconds"]
    assert chunk_bytes(tmp_path / "run") == chunk_bytes(without_twins)


def test_background_builds_run_smallest_weights_first_one_at_a_time():
    """:func:`runner._build_behind`: one thread, the jobs in order of weight bytes (ties in model order)."""
    order: list[int] = []
    threads: set[str] = set()

    def job(j):
        def make():
            threads.add(threading.current_thread().name)
            order.append(j)
            return f"adapter {j}"
        return make

    started = runner._build_behind({0: (30, job(0), "twin 0"), 1: (10, job(1), "twin 1"), 3: (10, job(3), "twin 3"),
                                    5: (0, job(5), "twin 5")})
    assert {j: (f.result(timeout=30), twin) for j, (f, twin) in started.items()} == {
        j: (f"adapter {j}", f"twin {j}") for j in (0, 1, 3, 5)}
    assert order == [5, 1, 3, 0] and len(threads) == 1


def test_a_background_build_on_cuda_runs_on_a_stream_of_its_own_finished_before_it_is_handed_over(monkeypatch):
    """:func:`runner._on_own_stream`: on CUDA the build runs inside ``torch.cuda.stream`` of a new stream on the run's
    device, and that stream is synchronised after the build and before the adapter is returned (so the weights'
    blocking copies wait for the build's own work, not for the model passes queued on the default stream). On the
    CPU the build is returned as it is. The CUDA calls are stand-ins here (this machine has no GPU); with
    ``XBENCH_TEST_DEVICE=cuda`` the test below runs the real ones."""
    events: list[str] = []

    class Stream:
        def __init__(self, device):
            events.append(f"stream on {device}")

        def synchronize(self):
            events.append("synchronize")

    class Entered:
        def __init__(self, stream):
            assert isinstance(stream, Stream)

        def __enter__(self):
            events.append("enter")

        def __exit__(self, *exc):
            events.append("exit")

    def build():
        events.append("build")
        return "adapter"

    assert runner._on_own_stream(build, torch.device("cpu")) is build and runner._on_own_stream(build, None) is build
    monkeypatch.setattr(torch.cuda, "Stream", Stream)
    monkeypatch.setattr(torch.cuda, "stream", Entered)
    wrapped = runner._on_own_stream(build, torch.device("cuda", 1))
    assert events == []  # nothing before the build thread runs it
    assert wrapped() == "adapter"
    assert events == ["stream on cuda:1", "enter", "build", "exit", "synchronize"]


def test_a_background_build_on_cuda_leaves_the_default_stream_to_the_models(test_device):
    if test_device.type != "cuda":
        pytest.skip("needs XBENCH_TEST_DEVICE=cuda")
    seen = {}

    def build():
        seen["stream"] = torch.cuda.current_stream(test_device)
        weights = torch.arange(1 << 20, dtype=torch.float32).to(test_device)  # a blocking copy, as Module.to makes
        return weights * 2  # a kernel on the build's stream

    out = runner._on_own_stream(build, test_device)()
    assert seen["stream"] != torch.cuda.default_stream(test_device)
    assert torch.equal(out.cpu(), torch.arange(1 << 20, dtype=torch.float32) * 2)


def test_a_network_failing_in_the_background_stops_the_run_and_keeps_the_chunks_written(tmp_path, monkeypatch):
    """A background build's error is raised by the run once the models already running have had their turn; their
    chunks stay in the store, and no decoding or building thread is left behind."""
    first_done = threading.Event()
    built: list[str] = []
    real_open, real_finish = runner.open_model, runner.PairRun.finish

    def open_model(spec, *args, **kwargs):
        if spec.name in TWINNED and built:
            first_done.wait(timeout=60)
            raise CheckpointError(f"{spec.name}: the checkpoint is damaged (test)")
        adapter = real_open(spec, *args, **kwargs)
        if spec.name in TWINNED:
            built.append(spec.name)
        return adapter

    def finish(self):
        counts = real_finish(self)
        if self.mspec.name in built:
            first_done.set()
        return counts

    monkeypatch.setattr(runner, "open_model", open_model)
    monkeypatch.setattr(runner.PairRun, "finish", finish)
    with pytest.raises(CheckpointError, match="damaged"):
        infer(tmp_path / "run")
    store = ResultStore(tmp_path / "run")
    assert [store.has_chunk("phantom", built[0], k) for k in (0, 1)] == [True, True]
    failed = next(iter(TWINNED - set(built)))
    assert not store.has_chunk("phantom", failed, 0)
    ours = [t for t in threading.enumerate() if t.name.startswith(("xbench-decode", "xbench-build"))]
    for thread in ours:  # ending: the build thread leaves once its last job has raised
        thread.join(timeout=30)
    assert [t.name for t in ours if t.is_alive()] == []


def test_the_next_datasets_feed_gets_adapters_that_took_their_twins_calibration(tmp_path, monkeypatch, two_datasets):
    """The next dataset's feed is made once every network is built (``on_built``), after the last one has taken its
    twin's calibration: the real adapter is never calibrated in full (256 constant images of the 8-bit table)."""
    calls: list[tuple[int, ...]] = []
    real_open = runner.open_model

    def open_model(spec, *args, **kwargs):
        adapter = real_open(spec, *args, **kwargs)
        if spec.name == "ref_xattn":
            preprocess = adapter.preprocess
            adapter.preprocess = lambda image: calls.append(image.shape) or preprocess(image)
        return adapter

    monkeypatch.setattr(runner, "open_model", open_model)
    chained: list = []
    real_then = InputFeed.then
    monkeypatch.setattr(InputFeed, "then", lambda self, action: chained.append(action) or real_then(self, action))
    infer(tmp_path / "run", ["ref_xattn", "random_prior", "center_prior"], datasets=two_datasets)
    assert len(chained) == 1  # the second dataset's decoding followed the first one's
    assert 2 <= len(calls) < 2 + 256  # the two probe images (and rows decoded in this process), no full calibration
