"""GPU preprocessing kernels (xbench/inference/gpu_preprocess.py) are bit-identical to Pillow, to CARZero's INTER_AREA and
to every ported adapter's own CPU ``preprocess`` — run here on the CPU device (``XBENCH_TEST_DEVICE`` picks another).

The large randomised comparison on the GPU is ``benchmarks/bench_gpu_preprocess.py`` (docs/perf/).
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import TEST_DEVICE, shared_path
from PIL import Image

from xbench.inference.calibration import ModelInput
from xbench.datasets.images import read_image
from xbench.inference.gpu_preprocess import (PILLOW_VERTICAL_FIRST, CodePlan, check_plan, plan_for, preprocess_standins,
                                   resize_area, resize_pillow, source_array)
from xbench.models.carzero import resize_area as resize_area_cpu
from xbench.models.priors import CenterPrior

DEVICE = torch.device(TEST_DEVICE)
FILTERS = (Image.BICUBIC, Image.BILINEAR, Image.BOX)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Small float64 products run faster on one thread than on two contended ones (CI has 2 cores)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _on(x: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(x)).to(DEVICE)


def _content(rng: np.random.Generator, h: int, w: int, kind: int) -> np.ndarray:
    """noise, constant, smooth gradient, or sparse extremes (0/255 spikes: clipping on both ends)."""
    if kind == 0:
        return rng.integers(0, 256, (h, w), dtype=np.uint8)
    if kind == 1:
        return np.full((h, w), rng.integers(0, 256), np.uint8)
    if kind == 2:
        return (np.add.outer(np.arange(h) * 7, np.arange(w) * 3) % 256).astype(np.uint8)
    return np.where(rng.random((h, w)) < 0.1, 255, 0).astype(np.uint8)


def test_pillow_resize_random_cases():
    """160 random shapes (1–300 px in and out: up, down, mixed, non-square), three filters, four kinds of content."""
    rng = np.random.default_rng(22)
    for case in range(160):
        h, w, oh, ow = (int(v) for v in rng.integers(1, 301, 4))
        f = FILTERS[case % 3]
        img = _content(rng, h, w, case % 4)
        want = np.asarray(Image.fromarray(img).resize((ow, oh), f))
        got = resize_pillow(_on(img), (oh, ow), f).cpu().numpy()
        assert np.array_equal(got, want), f"case {case}: {h}x{w} -> {oh}x{ow} filter {f}"


def test_pillow_pass_order_shapes_and_rgb():
    """Shapes where Pillow 13 runs the vertical pass first (height cut much more than width), the mirror
    case, an identity size, and an RGB image (each band resized alike)."""
    rng = np.random.default_rng(7)
    for h, w, oh, ow in [(400, 120, 37, 100), (401, 300, 50, 290), (90, 400, 80, 41), (64, 64, 64, 64),
                         (300, 200, 300, 77), (150, 150, 151, 20)]:
        img = rng.integers(0, 256, (h, w), dtype=np.uint8)
        want = np.asarray(Image.fromarray(img).resize((ow, oh), Image.BICUBIC))
        assert np.array_equal(resize_pillow(_on(img), (oh, ow)).cpu().numpy(), want), (h, w, oh, ow)
    rgb = rng.integers(0, 256, (97, 131, 3), dtype=np.uint8)
    want = np.asarray(Image.fromarray(rgb).resize((40, 61), Image.BICUBIC))
    got = resize_pillow(_on(rgb.transpose(2, 0, 1)), (61, 40)).cpu().numpy().transpose(1, 2, 0)
    assert np.array_equal(got, want)
    assert isinstance(PILLOW_VERTICAL_FIRST, bool)


def test_inter_area_random_cases():
    """CARZero's INTER_AREA: 2x2 (round half up), other integer factors, fractional scales, 1-px outputs."""
    rng = np.random.default_rng(3)
    shapes = [(512, 384, 256, 192), (900, 600, 300, 200), (257, 1000, 64, 250), (300, 301, 1, 1)]
    for _ in range(40):
        h, w = (int(v) for v in rng.integers(2, 700, 2))
        shapes.append((h, w, int(rng.integers(1, h + 1)), int(rng.integers(1, w + 1))))
    for case, (h, w, oh, ow) in enumerate(shapes):
        img = _content(rng, h, w, case % 4)
        assert np.array_equal(resize_area(_on(img), oh, ow).cpu().numpy(), resize_area_cpu(img, oh, ow)), (h, w, oh, ow)
    with pytest.raises(ValueError, match="only downscales"):
        resize_area(_on(np.zeros((10, 10), np.uint8)), 11, 5)


# -- whole adapter preprocessing -----------------------------------------------------------------
def _adapters() -> dict[str, object]:
    """Objects whose ``preprocess`` is each adapter class's own function (networks not built)."""
    return preprocess_standins()


def _write_dicom():
    spec = importlib.util.spec_from_file_location("_images_test", Path(__file__).parents[1] / "datasets" / "test_images.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.write_dicom


def _images(tmp_path: Path) -> dict[str, np.ndarray]:
    """Real NIH PNGs, 8/16-bit PNGs, MONOCHROME1 and windowed 12-bit DICOMs, constant and noise, up/down sizes."""
    rng = np.random.default_rng(11)
    images = {name: read_image(shared_path("samples", name)) for name in ("00000001_000.png", "00027426_000.png")}
    Image.fromarray(rng.integers(0, 256, (420, 300), dtype=np.uint8)).save(tmp_path / "noise8.png")
    Image.fromarray(rng.integers(0, 65536, (333, 517), dtype=np.uint16)).save(tmp_path / "noise16.png")
    ramp = (np.add.outer(np.arange(290) * 181, np.arange(260) * 37) % 65536).astype(np.uint16)
    Image.fromarray(ramp).save(tmp_path / "ramp16.png")
    write_dicom = _write_dicom()
    pix12 = rng.integers(0, 4096, (300, 280)).astype(np.uint16)
    write_dicom(tmp_path / "mono1.dcm", pix12, bits=12, photometric="MONOCHROME1",
                WindowCenter=2000, WindowWidth=3000)
    write_dicom(tmp_path / "mono2.dcm", rng.integers(0, 256, (270, 400)).astype(np.uint8))
    for name in ("noise8.png", "noise16.png", "ramp16.png", "mono1.dcm", "mono2.dcm"):
        images[name] = read_image(tmp_path / name)
    images["constant"] = np.full((512, 300), 0.25, np.float32)
    images["small_up"] = (rng.integers(0, 256, (260, 257)) / 255).astype(np.float32)  # CLIP/KAD upscale
    images["float"] = rng.random((303, 288), dtype=np.float32)
    return images


def test_adapter_preprocess_bit_identical(tmp_path):
    """Each ported adapter: GPU codes → the adapter's own table gather equals its CPU ``preprocess`` (torch.equal)."""
    images = _images(tmp_path)
    assert images["noise16.png"].dtype == np.float32 and source_array(images["noise16.png"]).dtype == np.uint16
    assert source_array(images["mono1.dcm"]).dtype == np.uint8
    for name, adapter in _adapters().items():
        plan = plan_for(adapter)
        assert isinstance(plan, CodePlan), name
        table = check_plan(adapter, plan, DEVICE)
        assert table is not None, name
        spec = ModelInput("test", table)  # the store's gather: codes -> float input
        for image_name, image in images.items():
            want = adapter.preprocess(image)
            codes = plan(_on(source_array(image)))
            got = spec.decode(codes[None], torch.from_numpy(table).to(DEVICE))[0].cpu()
            assert torch.equal(got, want), f"{name} on {image_name}"


def test_plans_on_a_stack_equal_each_image():
    """A stack of images of one size (the decode stage's batches) gives each image's own codes, for every plan and
    both upload dtypes: 8-bit noise / constant / gradient / spikes and 16-bit values, sizes that take CARZero's integer
    and float area branches and Pillow's either pass order."""
    rng = np.random.default_rng(2211)
    plans = {plan_for(a) for a in _adapters().values()}
    for h, w in [(640, 640), (300, 257), (263, 301), (1024, 512)]:
        stack8 = np.stack([_content(rng, h, w, kind) for kind in range(4)])
        stack16 = rng.integers(0, 65536, (3, h, w)).astype(np.uint16)
        for stack in (stack8, stack16):
            for plan in plans:
                got = plan(_on(stack)).cpu()
                want = torch.stack([plan(_on(image)).cpu() for image in stack])
                assert got.shape == want.shape and torch.equal(got, want), (plan, h, w, stack.dtype)
    flat = _on(rng.integers(0, 256, (2, 3, 90, 70), dtype=np.uint8))  # two leading dimensions
    assert torch.equal(resize_area(flat, 31, 23)[1, 2], resize_area(flat[1, 2], 31, 23))


def test_a_plan_makes_no_tensor_from_host_data_once_it_has_run(monkeypatch):
    """After a first call on a device, a plan takes everything it needs from the device (its matrices, area terms and
    factors are cached there). A tensor made from host data per call is a copy from pageable memory, which on CUDA
    first waits for all work queued on the stream, so the decoding thread would stop at every stack. Sizes take
    CARZero's integer area branch with a factor (768², 1024²: 3 and 4 cells a side), its float branch (640², 600 × 500)
    and both of Pillow's pass orders; 8- and 16-bit uploads. On CUDA (``XBENCH_TEST_DEVICE``) the calls also run
    under ``torch.cuda.set_sync_debug_mode("error")``."""
    rng = np.random.default_rng(5)
    plans = {plan_for(a) for a in _adapters().values()}
    stacks = [_on(rng.integers(0, 256, (2, h, w), dtype=np.uint8)) for h, w in [(768, 768), (1024, 1024), (640, 640),
                                                                                  (600, 500)]]
    stacks.append(_on(rng.integers(0, 4096, (2, 768, 768)).astype(np.uint16)))
    for stack in stacks:
        for plan in plans:
            plan(stack)  # the first call fills the caches

    def refuse(name):
        def made_from_host(*args, **kwargs):
            raise AssertionError(f"a plan called torch.{name} after its first call")
        return made_from_host

    for name in ("tensor", "as_tensor", "from_numpy"):
        monkeypatch.setattr(torch, name, refuse(name))
    strict = DEVICE.type == "cuda"
    if strict:
        torch.cuda.set_sync_debug_mode("error")
    try:
        for stack in stacks:
            for plan in plans:
                plan(stack)
    finally:
        if strict:
            torch.cuda.set_sync_debug_mode("default")


def test_plans_shared_and_absent():
    """Models with equal preprocessing share one plan; priors and reference models have none (CPU path)."""
    ads = _adapters()
    assert plan_for(ads["medklip"]) == plan_for(ads["mavl"])  # bilinear
    assert plan_for(ads["kad"]) == plan_for(ads["devide"])  # bicubic
    assert plan_for(ads["medklip"]).resample != plan_for(ads["kad"]).resample
    assert plan_for(ads["kad_512"]) != plan_for(ads["kad"])
    assert plan_for(ads["gloria"]) == plan_for(ads["carzero"])  # one pipeline, two normalisations (tables)
    assert plan_for(CenterPrior()) is None
    wrong = CodePlan("square", 223, 223, int(Image.BICUBIC), "linear")  # a plan that is not the adapter's
    assert check_plan(ads["medklip"], wrong, DEVICE) is None
    assert check_plan(ads["medklip"], plan_for(ads["kad"]), DEVICE) is None  # bicubic != bilinear


def test_every_builtin_model_declares_its_plan():
    """The GPU plan is declared by the adapter class (``gpu_preprocess``), not recognised by its ``preprocess``
    function: the ported models name theirs, priors and reference models none, and each declared plan is proven
    equal to the class's own CPU ``preprocess`` (the stand-ins carry the class's function and declaration)."""
    from xbench.spec.registry import import_target, list_models, model_config

    declared = {name: import_target(model_config(name)["class"]).gpu_preprocess for name in list_models()}
    assert {name: plan for name, plan in declared.items() if plan is not None} == {
        "medklip": "square", "mavl": "square", "kad": "square", "kad_512": "square", "kad_1024": "square",
        "devide": "square", "carzero": "carzero", "gloria": "gloria", "clip": "open_clip", "biomedclip": "open_clip"}
    for name, adapter in _adapters().items():
        assert adapter.gpu_preprocess == declared[name], name
        assert check_plan(adapter, plan_for(adapter), DEVICE) is not None, name


def test_an_edited_preprocess_keeps_its_plan():
    """Editing an adapter's ``preprocess`` (here: a subclass wrapping it) keeps its declared plan, which is then
    proven again against the new function; a name that is not a plan is an error naming the class."""
    from xbench.core.errors import XBenchError
    from xbench.models.kad import KADAdapter

    class EditedKAD(KADAdapter):
        def preprocess(self, image):
            return super().preprocess(image)

    edited = object.__new__(EditedKAD)  # no network: preprocess reads input_size only
    edited.input_size = 224
    assert plan_for(edited) == plan_for(_adapters()["kad"])
    assert check_plan(edited, plan_for(edited), DEVICE) is not None
    EditedKAD.gpu_preprocess = "squares"
    with pytest.raises(XBenchError, match="EditedKAD.gpu_preprocess = 'squares' names no GPU preprocessing plan"):
        plan_for(edited)


# -- the runner: stores equal on both paths ------------------------------------------------------
def _store(out: Path) -> dict[str, dict[str, np.ndarray]]:
    found = {}
    for p in sorted((out / "store").rglob("chunk-*.npz")):
        with np.load(p) as z:
            found[str(p.relative_to(out))] = {k: z[k] for k in z.files}
    return found


@pytest.mark.usefixtures("phantom_cache")
def test_runner_stores_identical_with_device_preprocessing(tmp_path):
    """The phantom run with ported models (CLIP, KAD, random-init) and a prior: ``preprocess_device: device``
    (kernels on the run device, the CPU here; decoded in 2 worker processes) writes the same store bytes as ``cpu``
    (in this process)."""
    import json
    import warnings

    from conftest import tiny_run

    from xbench.spec.config import RunConfig
    from xbench.core.errors import XBenchWarning
    from xbench.workflows.run import run

    models = ["center_prior", {"name": "clip", "params": {"random_init": True}},
              {"name": "kad", "params": {"random_init": True}}]
    outs = {}
    for path in ("cpu", "device"):
        # the device path through 2 decoding processes: uploads cross as named shared memory, rows out of order
        raw = tiny_run(tmp_path / path, cases=6, models=models, device=str(DEVICE), preprocess_device=path,
                       num_workers=2 if path == "device" else 0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", XBenchWarning)
            outs[path] = run(RunConfig.from_dict(raw), progress=False)
    cpu, dev = (_store(outs[p]) for p in ("cpu", "device"))
    assert cpu.keys() == dev.keys() and len(cpu) == 3
    for name in cpu:
        for key in cpu[name]:
            np.testing.assert_array_equal(cpu[name][key], dev[name][key], err_msg=f"{name}:{key}")
    log = json.loads((outs["device"] / "run_log.json").read_text())
    from xbench.inference.runner import with_index

    # 6 images x 2 distinct plans, on the device named by index (cuda:0 on a GPU: the decoding thread's own device)
    assert log[-1]["preprocessed_on"] == {"device": str(with_index(DEVICE)), "inputs": 12}
    steps = {k: v for k, v in log[-1]["decode_profile"].items() if k.startswith("device_") and k != "device_prep"}
    assert len(steps) == 6 and steps["device_kernels"] > 0  # the device step's own seconds (DeviceStage.seconds)
    assert sum(steps.values()) <= log[-1]["decode_profile"]["device_prep"] + 0.01  # within it (each rounded to 1 ms)
    assert "preprocessed_on" not in json.loads((outs["cpu"] / "run_log.json").read_text())[-1]
