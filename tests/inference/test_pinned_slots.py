"""Decoded sources written by the decode workers into shared slots (xbench.inference.pinned_slots): the same bytes as
the shared-memory path, every slot given back (after a run, an early stop, an error), full or too-small arenas
falling back to the old path."""
from __future__ import annotations

import multiprocessing

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import TEST_DEVICE, Files
from xbench.inference import input_feed as cache_mod
from xbench.inference.pinned_slots import SlotArena, shared_arena


def test_slots_are_taken_until_none_is_free_and_given_back():
    arena = SlotArena(3, 64)
    taken = [arena.take() for _ in range(3)]
    assert sorted(taken) == [0, 1, 2] and arena.take() is None and arena.free == 0
    arena.give(taken[1])
    assert arena.free == 1 and arena.take() == taken[1]
    with pytest.raises(ValueError, match="no slot 3"):
        arena.give(3)
    arena.close()


def test_a_slot_holds_uint8_and_uint16_sources_written_in_a_forked_worker():
    arena = SlotArena(2, 40 * 30 * 2)
    a8 = np.arange(35 * 20, dtype=np.uint8).reshape(35, 20)
    a16 = (np.arange(40 * 30, dtype=np.uint16) * 53).reshape(40, 30)

    def worker():  # inherits the mapping, as the decode workers do
        arena.write(0, a8)
        arena.write(1, a16)

    proc = multiprocessing.get_context("fork").Process(target=worker)
    proc.start()
    proc.join()
    assert proc.exitcode == 0
    got8, got16 = arena.view(0, a8.shape, a8.dtype.str), arena.view(1, a16.shape, a16.dtype.str)
    assert got8.dtype == torch.uint8 and np.array_equal(got8.numpy(), a8)
    assert got16.dtype == torch.uint16 and np.array_equal(got16.numpy().view(np.uint16), a16)
    too_big = np.zeros((41, 30), np.uint16)
    assert not arena.fits(too_big)
    with pytest.raises(ValueError, match="do not fit"):
        arena.write(0, too_big)
    with pytest.raises(ValueError, match="does not fit"):
        arena.view(0, (41, 30), too_big.dtype.str)
    arena.close()


@settings(max_examples=60, derandomize=True, deadline=None, database=None)
@given(st.lists(st.tuples(st.integers(1, 40), st.integers(1, 40), st.sampled_from(["|u1", "<u2"])), min_size=1,
                max_size=6), st.integers(0, 2**32 - 1))
def test_any_source_that_fits_comes_back_from_its_slot_unchanged(shapes, seed):
    """Write each array into a slot of its own (in order, as workers do), then view them all: equal bytes, shapes and
    dtypes, neighbours untouched; an array over the slot size is refused by ``fits`` and ``write`` alike."""
    rng = np.random.default_rng(seed)
    arena = SlotArena(len(shapes), 40 * 30 * 2)
    arrays = {}
    for h, w, dtype in shapes:
        array = rng.integers(0, np.iinfo(np.dtype(dtype)).max + 1, (h, w)).astype(dtype)
        slot = arena.take()
        if arena.fits(array):
            arena.write(slot, array)
            arrays[slot] = array
        else:
            assert array.nbytes > arena.slot_bytes
            with pytest.raises(ValueError, match="do not fit"):
                arena.write(slot, array)
    for slot, array in arrays.items():
        got = arena.view(slot, array.shape, array.dtype.str)
        assert tuple(got.shape) == array.shape and np.array_equal(got.numpy().view(array.dtype), array)
    assert arena.take() is None
    arena.close()


def test_one_arena_per_process_and_kind_released_when_idle():
    from xbench.inference.pinned_slots import release_arenas

    release_arenas()  # whatever earlier tests left
    arena = shared_arena(4, pin=False, slot_bytes=256)
    assert shared_arena(9, pin=False, slot_bytes=256) is arena and arena.slots == 4
    slot = arena.take()
    assert release_arenas() == 0  # a slot is out: kept
    arena.give(slot)
    assert release_arenas() == 4 * 256
    assert arena.take() is None  # closed: a feed still holding it sends its rows the old way
    again = shared_arena(2, pin=False, slot_bytes=256)
    assert again is not arena and again.take() is not None
    release_arenas()


def test_a_refused_page_lock_leaves_the_arena_usable_unlocked(monkeypatch, caplog):
    class Refusing:
        def cudaHostRegister(self, *args):
            return 2  # cudaErrorMemoryAllocation

    monkeypatch.setattr(torch.cuda, "cudart", lambda: Refusing())
    with caplog.at_level("WARNING", logger="xbench.inference.pinned_slots"):
        arena = SlotArena(2, 64, pin=True)
    assert not arena.pinned and "page-locking 128 bytes for decoded sources failed" in caplog.text
    slot = arena.take()
    arena.write(slot, np.arange(8, dtype=np.uint8))
    assert arena.view(slot, (8,), "|u1").tolist() == list(range(8))
    arena.close()


def _images(tmp_path, shapes, seed=5):
    from PIL import Image

    rng = np.random.default_rng(seed)
    paths = []
    for i, shape in enumerate(shapes):
        path = tmp_path / f"{i}.png"
        Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8)).save(path)
        paths.append(path)
    return paths


class _Counting(SlotArena):
    """An arena that counts the sources the decoding thread read from its slots."""

    viewed = 0

    def view(self, slot, shape, dtype):
        type(self).viewed += 1
        return super().view(slot, shape, dtype)


def _feed(paths, arena, monkeypatch, **kw):
    from xbench.inference.gpu_preprocess import preprocess_standins

    monkeypatch.setattr(cache_mod, "shared_arena", lambda slots, pin: arena)
    adapters = [preprocess_standins()["kad"], preprocess_standins()["carzero"]]
    return cache_mod.InputFeed(Files(paths), adapters, workers=2, preprocess_device=TEST_DEVICE, **kw)


def _arena(slots, slot_bytes):  # page-locked on CUDA, as the feed makes it there
    return _Counting(slots, slot_bytes, pin=torch.device(TEST_DEVICE).type == "cuda")


@pytest.mark.parametrize("slots, slot_bytes, through_slots", [(16, 1 << 18, 7), (1, 1 << 18, None), (16, 100, 0)],
                         ids=["enough", "one-slot", "too-small"])
def test_rows_through_slots_equal_rows_in_process_and_every_slot_comes_back(tmp_path, monkeypatch, slots,
                                                                           slot_bytes, through_slots):
    """Enough slots: every source goes through one; a single slot: rows sent while it is taken go the old way;
    slots too small for any source: all go the old way. The codes are the same bytes in-process in every case."""
    paths = _images(tmp_path, [(297, 320), (256, 256), (350, 281), (260, 400), (328, 328), (256, 256), (290, 290)])
    paths.append(tmp_path / "missing.png")
    _Counting.viewed = 0
    arena = _arena(slots, slot_bytes)
    feed = _feed(paths, arena, monkeypatch, skip_missing=True)
    feed.ensure(range(len(paths)))
    from xbench.inference.gpu_preprocess import preprocess_standins

    plain = cache_mod.InputFeed(Files(paths), [preprocess_standins()["kad"], preprocess_standins()["carzero"]],
                                skip_missing=True, preprocess_device="cpu")
    plain.ensure(range(len(paths)))
    assert feed.stats == plain.stats == {"decoded": 7, "from_cache": 0, "skipped": 1}
    assert feed.device_inputs == plain.device_inputs == 14
    for row in range(len(paths)):
        a, b = plain.rows[row], feed.rows[row]
        assert a[0] == b[0] and a[2:] == b[2:] and a[1].keys() == b[1].keys()
        for key in a[1]:
            assert np.array_equal(a[1][key], b[1][key])
    if through_slots is None:  # one slot: at least one row went each way
        assert 1 <= _Counting.viewed < 7
    else:
        assert _Counting.viewed == through_slots
    assert arena.free == slots and not feed._handed
    if arena.pinned and through_slots:  # on CUDA: a view of a slot is page-locked (uploaded from where it is)
        assert arena.view(0, (4, 4), "|u1").is_pinned()
    arena.close()


def test_slots_come_back_after_an_error_and_after_a_stop(tmp_path, monkeypatch):
    paths = _images(tmp_path, [(260, 260)] * 6)
    paths.insert(3, tmp_path / "missing.png")
    arena = _arena(4, 1 << 17)
    feed = _feed(paths, arena, monkeypatch)  # a missing file is an error here
    with pytest.raises(Exception, match="missing.png"):
        feed.ensure(range(len(paths)))
    assert arena.free == 4 and not feed._handed
    stopped = _feed(_images(tmp_path, [(260, 260)] * 30, seed=6), arena, monkeypatch)
    stopped.start(range(30))
    stopped.wait([0])
    stopped.release()
    assert arena.free == 4 and not stopped._handed
    arena.close()
