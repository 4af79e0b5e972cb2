"""Decode once (xbench/inference/input_feed.py and its parts: calibration.py, disk_cache.py, decode.py): every model input rebuilt from the cache equals the adapter's own
``preprocess`` bit for bit; the runner gives byte-identical stores with and without it; the disk cache
is reused, never stale, and safe for concurrent writers; TF32 and map_dtype switches (xbench/inference/speed.py)."""
from __future__ import annotations

import json
import multiprocessing
import os
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import xbench
from conftest import Files, tiny_run
from xbench.datasets.images import read_image
from xbench.inference.calibration import model_input
from xbench.inference.input_feed import InputFeed
from xbench.inference.gpu_preprocess import probe_images
from xbench.spec.config import RunConfig
from xbench.core.errors import XBenchWarning
from xbench.store.results import ResultStore
from xbench.workflows.run import run
from xbench.inference.speed import precision_mode

QUANTISING = ["clip", "medklip", "mavl", "kad", "carzero", "devide", "gloria"]  # preprocess starts with round(x * 255)
FLOAT_INPUT = ["center_prior", "ref_xattn", "chexzero"]  # CheXzero: bicubic resize after normalising


@pytest.fixture(scope="module")
def adapters() -> dict:
    torch.set_num_threads(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        built = {n: xbench.create_model(n, random_init=True) for n in QUANTISING}
        built.update({n: xbench.create_model(n) for n in FLOAT_INPUT})
    return built


def images(rng: np.random.Generator) -> list[np.ndarray]:
    """8-bit-valued, arbitrary float (16-bit-like) and constant images, square / portrait / landscape / tiny."""
    return [
        (rng.integers(0, 256, (300, 300)) / 255).astype(np.float32),
        rng.random((333, 290), dtype=np.float32),
        rng.random((180, 407), dtype=np.float32),
        (rng.integers(0, 65536, (257, 300)) / 65535).astype(np.float32),
        np.full((90, 64), 0.5, np.float32),
        rng.random((17, 23), dtype=np.float32),
    ]


@pytest.mark.parametrize("name", QUANTISING + FLOAT_INPUT)
def test_rebuilt_input_equals_preprocess_bit_for_bit(adapters, name):
    adapter = adapters[name]
    spec = model_input(adapter)
    assert spec.lut is not None or name not in QUANTISING
    dtypes = set()
    for image in images(np.random.default_rng(7)):
        try:
            want = adapter.preprocess(image)
        except ValueError:  # CARZero and GLoRIA only downscale (their official INTER_AREA path)
            assert name in ("carzero", "gloria") and min(image.shape) < 256
            continue
        code = spec.encode(want)
        dtypes.add(code.dtype)
        if name in QUANTISING:
            assert code.dtype == np.uint8 and code.shape == tuple(want.shape[1:])  # 12x smaller than float32
        got = spec.decode(torch.from_numpy(code)[None])[0]
        assert got.dtype == torch.float32 and got.shape == want.shape
        assert torch.equal(got, want), f"{name}: max diff {(got - want).abs().max()}"
        assert torch.equal(spec.decode(torch.from_numpy(code)[None], channels_last=True)[0], want)
    if name in FLOAT_INPUT:  # float area / bilinear resizes: kept as float32 (codes only where exact)
        assert np.dtype(np.float32) in dtypes


def test_a_value_outside_the_table_is_kept_as_float(adapters):
    spec = model_input(adapters["kad"])
    x = adapters["kad"].preprocess(np.random.default_rng(1).random((64, 64), dtype=np.float32))
    x[0, 3, 3] += 1e-3  # not any grey level's value
    code = spec.encode(x)
    assert code.dtype == np.float32 and torch.equal(spec.decode(torch.from_numpy(code)[None])[0], x)


def test_equal_preprocessing_shares_one_key_and_different_does_not(adapters):
    keys = {n: model_input(a).key for n, a in adapters.items()}
    assert keys["medklip"] == keys["mavl"]  # both: PIL bilinear 224 squash + ImageNet normalisation
    assert len({keys[n] for n in ("clip", "medklip", "kad", "carzero", "center_prior", "ref_xattn")}) == 6


def _fresh(name: str):
    """A new adapter object (the calibration is kept per object): a network-less input twin where the class has one."""
    from xbench.models.base import input_twin

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return input_twin(name) or xbench.create_model(name)


def _counting(adapter, calls: list) -> None:
    real = type(adapter).preprocess
    adapter.preprocess = lambda image: calls.append(image.shape) or real(adapter, image)


@pytest.mark.parametrize("name", QUANTISING + FLOAT_INPUT)
def test_the_8_bit_table_and_key_equal_those_of_the_256_constant_images(name, monkeypatch):
    """model_input reads the table off one call (or a GPU plan's table, for CARZero whose area resize refuses an
    image it would not shrink) and checks it at 15 levels: the table and the key are those of the definition, so
    every decode cache written before stays valid, and the quantising models need 18 ``preprocess`` calls, not 258."""
    from xbench.inference import calibration as cache
    from xbench.inference.gpu_preprocess import code_table, plan_for

    adapter, calls = _fresh(name), []
    _counting(adapter, calls)
    plan = plan_for(adapter)
    got = model_input(adapter, code_table(adapter, plan, "cpu") if name in ("carzero", "gloria") else None)
    n_calls = len(calls)  # CARZero, GLoRIA: the plan's table took the one call instead of _one_call_table

    reference = _fresh(name)
    monkeypatch.setattr(cache, "_one_call_table", lambda adapter, shape: None)  # the definition alone: 256 levels
    want = model_input(reference)
    assert got.key == want.key and got.shape == want.shape
    assert want.lut is not None and np.array_equal(got.lut, want.lut)
    if name in QUANTISING:
        assert n_calls == 2 + 1 + len(cache._CHECKED_LEVELS) == 18
    else:  # float resizes (constant images not exact): the one-call table is refused within 5 checked levels, or
        # at once where the resize is not the identity at the output size (CheXzero pads to 320 and resizes back)
        assert 2 + 1 + (name != "chexzero") + 256 <= n_calls <= 2 + 1 + 5 + 256


def test_a_table_wrong_at_a_checked_level_is_replaced_by_the_definition():
    from xbench.inference import calibration as cache

    reference, adapter = _fresh("kad"), _fresh("kad")
    want = model_input(reference)
    wrong = want.lut.copy()
    wrong[:, 254] += 1e-3  # 254 is checked
    got = model_input(adapter, wrong)
    assert 254 in cache._CHECKED_LEVELS and got.key == want.key and np.array_equal(got.lut, want.lut)


def test_a_table_wrong_at_an_unchecked_level_never_gives_a_wrong_input():
    """The checks make a wrong table unlikely, not impossible; a wrong table costs only space: an input is stored as
    codes only where the table rebuilds it exactly, otherwise as the float32 ``preprocess`` output itself."""
    from xbench.inference import calibration as cache

    adapter = _fresh("kad")
    true_lut = model_input(_fresh("kad")).lut
    wrong = true_lut.copy()
    assert 200 not in cache._CHECKED_LEVELS
    wrong[:, 200] = (wrong[:, 199] + wrong[:, 200]) / 2  # still increasing: taken
    spec = model_input(adapter, wrong)
    assert np.array_equal(spec.lut, wrong)
    image = np.full((64, 80), 200 / 255, np.float32)
    image[:8] = 10 / 255
    x = adapter.preprocess(image)
    code = spec.encode(x)
    assert code.dtype == np.float32 and torch.equal(spec.decode(torch.from_numpy(code)[None])[0], x)
    plain = np.full((64, 80), 10 / 255, np.float32)  # no pixel at level 200: codes, rebuilt exactly
    code = spec.encode(adapter.preprocess(plain))
    assert code.dtype == np.uint8 and torch.equal(spec.decode(torch.from_numpy(code)[None])[0],
                                                  adapter.preprocess(plain))


def test_on_the_kernel_path_the_feed_calibrates_carzero_from_its_plan(tmp_path):
    """CARZero's area resize refuses the one-call image (it only shrinks): on the kernel path the feed hands its
    plan's table to model_input, 18 ``preprocess`` calls instead of 258, the key and table of the definition; on
    the CPU path it has no plan to offer and runs the 256 constant images."""
    paths = write_pngs(tmp_path / "img", 1)
    kernel_path, cpu_path = _fresh("carzero"), _fresh("carzero")
    calls: list = []
    _counting(kernel_path, calls)
    feed = InputFeed(Files(paths), [kernel_path], preprocess_device="cpu")
    spec = feed.specs[id(kernel_path)]
    assert len(calls) - len(probe_images()) - 1 == 18  # check_plan then checks its table on the probe images
    assert feed.plans  # and the plan is taken: its table equals the calibration
    calls.clear()
    _counting(cpu_path, calls)
    alone = InputFeed(Files(paths), [cpu_path])
    assert len(calls) == 2 + 1 + 256  # the one-call image refused: no level is checked, the 256 are run
    assert alone.specs[id(cpu_path)].key == spec.key and np.array_equal(alone.specs[id(cpu_path)].lut, spec.lut)


# -- the runner ----------------------------------------------------------------------------------------
def arrays(out: Path) -> dict[str, dict]:
    found = {}
    for p in sorted((out / "store").rglob("chunk-*.npz")):
        with np.load(p) as z:
            found[str(p.relative_to(out))] = {k: z[k] for k in z.files}
    return found


def quiet(cfg: RunConfig, **kwargs) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", XBenchWarning)
        return run(cfg, progress=False, **kwargs)


MODELS = ["center_prior", "ref_xattn", {"name": "clip", "params": {"random_init": True}}]


@pytest.mark.usefixtures("phantom_cache")
def test_decode_once_store_equals_decode_per_model_and_cache_is_reused(tmp_path):
    torch.set_num_threads(1)
    per_model = quiet(RunConfig.from_dict(tiny_run(tmp_path / "a", cases=10, models=MODELS, decode_once=False)))
    cache = tmp_path / "cache"
    once = quiet(RunConfig.from_dict(tiny_run(tmp_path / "b", cases=10, models=MODELS, cache_dir=str(cache))))
    a, b = arrays(per_model), arrays(once)
    assert a.keys() == b.keys() and len(a) == 2 * 3
    for name in a:
        for key in a[name]:
            np.testing.assert_array_equal(a[name][key], b[name][key], err_msg=f"{name}:{key}")
    log = json.loads((once / "run_log.json").read_text())
    assert log[-1]["decode_once"] == {"decoded": 10, "from_cache": 0, "skipped": 0}
    # one transform key per model that reads pixels: the center prior (reads_pixels false) gets zeros, nothing cached
    assert len(list((cache / "entries").iterdir())) == 2

    again = quiet(RunConfig.from_dict(tiny_run(tmp_path / "c", cases=10, models=MODELS, cache_dir=str(cache))))
    assert json.loads((again / "run_log.json").read_text())[-1]["decode_once"] == {
        "decoded": 0, "from_cache": 10, "skipped": 0}
    assert arrays(again).keys() == b.keys()
    for name, parts in arrays(again).items():
        for key in parts:
            np.testing.assert_array_equal(parts[key], b[name][key])


def write_pngs(folder: Path, n: int) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(3)
    paths = []
    for i in range(n):
        p = folder / f"img{i}.png"
        Image.fromarray(rng.integers(0, 256, (40 + i, 50), dtype=np.uint8)).save(p)
        paths.append(p)
    return paths


def test_changed_file_is_decoded_again_never_served_stale(adapters, tmp_path):
    paths = write_pngs(tmp_path / "img", 3)
    cache = tmp_path / "cache"
    feed = InputFeed(Files(paths), [adapters["kad"]], cache_dir=cache)
    feed.ensure(range(3))
    assert feed.stats == {"decoded": 3, "from_cache": 0, "skipped": 0}
    Image.fromarray(np.full((40, 50), 200, np.uint8)).save(paths[0])  # new content (and mtime / size)
    os.utime(paths[0], ns=(time.time_ns() + 10**9,) * 2)
    feed2 = InputFeed(Files(paths), [adapters["kad"]], cache_dir=cache)
    feed2.ensure(range(3))
    assert feed2.stats == {"decoded": 1, "from_cache": 2, "skipped": 0}
    key = feed2.specs[id(adapters["kad"])].key
    want = adapters["kad"].preprocess(xbench.datasets.images.read_image(paths[0]))
    got = feed2.specs[id(adapters["kad"])].decode(torch.from_numpy(feed2.rows[0][1][key])[None])[0]
    assert torch.equal(got, want)


def _record(file: Path) -> dict:
    """An index record's JSON (its seal, xbench.core.files.seal, cut off)."""
    from xbench.core.files import SEAL_BYTES

    return json.loads(file.read_bytes()[:-SEAL_BYTES])


def test_the_content_key_is_sha256_and_records_of_the_earlier_blake2b_key_are_still_served(adapters, tmp_path,
                                                                                           monkeypatch):
    """New index records carry the file's SHA-256; a cache written while the key was BLAKE2b-128 (issue 22 before
    round 10) is read as it is: its rows come from the cache, equal to a fresh decode, and nothing is hashed."""
    import hashlib

    from xbench.inference import decode, disk_cache

    paths = write_pngs(tmp_path / "img", 3)
    kad = adapters["kad"]
    fresh = InputFeed(Files(paths), [kad], cache_dir=tmp_path / "new")
    fresh.ensure(range(3))
    records = [_record(f) for f in sorted((tmp_path / "new" / "index").glob("*.json"))]
    assert sorted(r["content"] for r in records) == sorted(hashlib.sha256(p.read_bytes()).hexdigest() for p in paths)

    def blake2b(path):
        return hashlib.blake2b(Path(path).read_bytes(), digest_size=16).hexdigest()

    with monkeypatch.context() as mp:  # the earlier key
        mp.setattr(decode, "content_hash", blake2b)
        InputFeed(Files(paths), [kad], cache_dir=tmp_path / "old").ensure(range(3))
    assert all(len(_record(f)["content"]) == 32 for f in (tmp_path / "old" / "index").glob("*.json"))
    hashed = []
    for module in (decode, disk_cache):  # a new record's hash, a racy record's check
        monkeypatch.setattr(module, "content_hash", lambda path: hashed.append(path) or disk_cache.sha256(path))
    old = InputFeed(Files(paths), [kad], cache_dir=tmp_path / "old")
    old.ensure(range(3))
    assert old.stats == {"decoded": 0, "from_cache": 3, "skipped": 0} and hashed == []
    key = old.specs[id(kad)].key
    assert all(np.array_equal(old.rows[r][1][key], fresh.rows[r][1][key]) for r in range(3))


def test_device_codes_are_cached_by_the_saving_thread_and_its_errors_raised(adapters, tmp_path, monkeypatch):
    """Device-computed codes (here the kernels on the CPU) are written to the cache by the feed's saving thread: once
    the stage is over every entry is on disk and a second feed reads every row from it, the same codes; a failed
    save is raised when the feed closes, not lost."""
    paths = write_pngs(tmp_path / "img", 4)
    cache = tmp_path / "cache"
    kad = adapters["kad"]
    feed = InputFeed(Files(paths), [kad], cache_dir=cache, preprocess_device="cpu")
    assert feed.plans  # the kernel path
    feed.ensure(range(4))
    key = feed.specs[id(kad)].key
    assert feed.stats["decoded"] == 4 and feed.device_inputs == 4
    again = InputFeed(Files(paths), [kad], cache_dir=cache, preprocess_device="cpu")
    again.ensure(range(4))
    assert again.stats == {"decoded": 0, "from_cache": 4, "skipped": 0}
    assert all(np.array_equal(again.rows[r][1][key], feed.rows[r][1][key]) for r in range(4))

    from xbench.inference.disk_cache import DiskCache as _DiskCache

    def full(self, *args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(_DiskCache, "save", full)
    broken = InputFeed(Files(paths), [kad], cache_dir=tmp_path / "cache2", preprocess_device="cpu")
    broken.start(range(4))
    broken.wait(range(4))  # the rows themselves are served
    with pytest.raises(OSError, match="No space left"):
        broken.close()


def test_a_warm_feed_reads_the_cache_itself_and_forks_no_workers(adapters, tmp_path, monkeypatch):
    """With workers, rows whose every entry is cached are read in the decoding thread (no process is forked when all
    are); a row with a missing entry (a new model's) or a changed file goes to the workers; after ``_COLD`` misses
    in a row the rest go to the workers unread. The rows are the same bytes every way."""
    from xbench.inference import input_feed as cache_mod

    paths = write_pngs(tmp_path / "img", 6)
    cache = tmp_path / "cache"
    kad, prior = adapters["kad"], xbench.create_model("random_prior")
    first = InputFeed(Files(paths), [kad], cache_dir=cache, workers=2, preprocess_device="cpu")
    first.ensure(range(6))
    assert first.stats == {"decoded": 6, "from_cache": 0, "skipped": 0}

    forks = []
    real_pool = cache_mod.DecodePool
    monkeypatch.setattr(cache_mod, "DecodePool", lambda *a, **k: forks.append(1) or real_pool(*a, **k))
    warm = InputFeed(Files(paths), [kad], cache_dir=cache, workers=2, preprocess_device="cpu")
    warm.ensure(range(6))
    assert warm.stats == {"decoded": 0, "from_cache": 6, "skipped": 0} and not forks
    assert warm.profile["cache_reads"] > 0 and warm.profile["pool_receive"] == 0.0
    key = warm.specs[id(kad)].key
    assert all(np.array_equal(warm.rows[r][1][key], first.rows[r][1][key]) for r in range(6))

    Image.fromarray(np.full((41, 50), 7, np.uint8)).save(paths[1])  # new bytes: decoded again, by a worker
    os.utime(paths[1], ns=(time.time_ns() + 10**9,) * 2)
    mixed = InputFeed(Files(paths), [kad, prior], cache_dir=cache, workers=2, preprocess_device="cpu")
    mixed.ensure(range(6))  # the prior's entries are new: every row goes to the workers
    assert mixed.stats == {"decoded": 6, "from_cache": 0, "skipped": 0} and len(forks) == 1
    again = InputFeed(Files(paths), [kad, prior], cache_dir=cache, workers=2, preprocess_device="cpu")
    again.ensure(range(6))
    assert again.stats == {"decoded": 0, "from_cache": 6, "skipped": 0} and len(forks) == 1
    for r in range(6):
        assert again.rows[r][1].keys() == mixed.rows[r][1].keys()
        assert all(np.array_equal(again.rows[r][1][k], mixed.rows[r][1][k]) for k in mixed.rows[r][1])

    looked = []
    real_cached = cache_mod.RowDecoder.cached
    monkeypatch.setattr(cache_mod.RowDecoder, "cached", lambda self, row: looked.append(row) or real_cached(self, row))
    monkeypatch.setattr(cache_mod, "_COLD", 2)
    cold = InputFeed(Files(paths), [kad], cache_dir=tmp_path / "cold", workers=2, preprocess_device="cpu")
    cold.ensure(range(6))
    assert looked == [0, 1] and cold.stats == {"decoded": 6, "from_cache": 0, "skipped": 0} and len(forks) == 2


def _prepare(args):
    cache, paths = args
    adapter = xbench.create_model("random_prior")  # a cheap model that reads pixels (the center prior reads none)
    feed = InputFeed(Files([Path(p) for p in paths]), [adapter], cache_dir=cache)
    feed.ensure(range(len(paths)))
    return feed.stats["decoded"] + feed.stats["from_cache"]


def test_concurrent_writers_share_the_cache_safely(tmp_path):
    paths = [str(p) for p in write_pngs(tmp_path / "img", 12)]
    cache = str(tmp_path / "cache")
    with multiprocessing.get_context("spawn").Pool(3) as pool:
        assert pool.map(_prepare, [(cache, paths)] * 3) == [12] * 3
    assert not list(Path(cache).rglob("*.tmp"))  # every write renamed into place
    entries = list((Path(cache) / "entries").rglob("*.sealed.npy"))
    assert len(entries) == 12
    for entry in entries:  # complete files, each equal to a fresh preprocess of its image
        assert np.load(entry).ndim == 3


def test_a_missing_image_is_a_counted_skip_in_the_feed(adapters, tmp_path):
    paths = write_pngs(tmp_path / "img", 2)
    paths.append(tmp_path / "img" / "absent.png")
    feed = InputFeed(Files(paths), [adapters["kad"]], skip_missing=True)
    items = [it for items, _ in feed.batches(adapters["kad"], [[0, 1, 2]], torch.device("cpu")) for it in items]
    assert [it[2] is None for it in items] == [True, True, False] and "MissingFileError" in items[2][2]
    with pytest.raises(xbench.core.errors.MissingFileError):
        InputFeed(Files(paths), [adapters["kad"]]).ensure([2])


# -- precision and map storage -------------------------------------------------------------------------
@pytest.mark.parametrize("precision, allowed", [("fp32", False), ("bf16", False), ("tf32", True)])
def test_precision_mode_sets_tf32_for_the_run_and_restores_it(precision, allowed):
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    try:
        for start in (True, False):
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = start
            with precision_mode(precision, "cuda"):
                assert torch.backends.cuda.matmul.allow_tf32 is allowed
                assert torch.backends.cudnn.allow_tf32 is allowed
            assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == (start, start)
        with pytest.raises(RuntimeError), precision_mode(precision, "cuda"):  # restored after an error too
            raise RuntimeError("boom")
        assert torch.backends.cudnn.allow_tf32 is False
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


@pytest.mark.usefixtures("phantom_cache")
def test_map_dtype_float32_stores_float32_maps_within_float16_error(tmp_path):
    torch.set_num_threads(1)
    models = ["ref_xattn"]
    half = quiet(RunConfig.from_dict(tiny_run(tmp_path / "h", cases=8, models=models)))
    full = quiet(RunConfig.from_dict(tiny_run(tmp_path / "f", cases=8, models=models, map_dtype="float32")))
    h = ResultStore(half).read("phantom", "ref_xattn").maps
    f = ResultStore(full).read("phantom", "ref_xattn").maps
    assert h.dtype == np.float16 and f.dtype == np.float32
    normal = np.abs(f) >= 2.0 ** -14  # float16 normal range
    rel = np.abs(h.astype(np.float32) - f)[normal] / np.abs(f)[normal]
    assert normal.mean() > 0.9 and 0 < rel.max() <= 2.0 ** -11  # float16 rounding: relative error at most 4.9e-4


def test_a_model_that_reads_no_pixels_gets_zeros_and_nothing_is_decoded_for_it(tmp_path):
    """The center prior reads only the batch size: the feed computes no input for it (no thumbnail of a full-size
    float image) and passes zeros of its input shape; its maps and scores equal those from its real inputs. When a
    pixel-reading model shares its preprocessing (the random prior), the decoded thumbnails are passed instead."""
    from xbench.models.priors import CenterPrior, RandomPrior

    paths = write_pngs(tmp_path / "img", 4)
    center = xbench.create_model("center_prior")
    assert CenterPrior.reads_pixels is False and RandomPrior.reads_pixels is True
    feed = InputFeed(Files(paths), [center])
    feed.ensure(range(4))
    assert feed.stats == {"decoded": 4, "from_cache": 0, "skipped": 0}  # files still read: shapes, skips
    assert all(inputs == {} for _, inputs, _, _ in feed.rows.values())
    [(items, pixels)] = list(feed.batches(center, [[0, 1, 2, 3]], torch.device("cpu")))
    assert pixels.dtype == torch.float32 and tuple(pixels.shape) == (4, 3, center.input_size, center.input_size)
    assert not pixels.any() and [it.shape for it in items] == [(40 + i, 50) for i in range(4)]
    real = torch.stack([torch.as_tensor(center.preprocess(read_image(p))) for p in paths])
    got, want = center.predict(pixels, ["a", "b"]), center.predict(real, ["a", "b"])
    assert torch.equal(got.scores, want.scores) and torch.equal(got.maps, want.maps)

    shared = InputFeed(Files(paths), [center, xbench.create_model("random_prior")])
    shared.ensure(range(4))
    [(_, thumbs)] = list(shared.batches(center, [[0, 1, 2, 3]], torch.device("cpu")))
    assert torch.equal(thumbs, real)
