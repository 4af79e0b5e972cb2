"""The feed's decoding processes (xbench.inference.decode_pool): every row once, errors as themselves, deaths named."""
from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest
import torch

from conftest import Files
from xbench.core.errors import FormatError
from xbench.inference.decode import share_by_name as _share_by_name
from xbench.inference.decode_pool import DecodePool


def _square(row: int) -> tuple[int, int, int]:
    if row % 5 == 0:
        time.sleep(0.05)  # slow rows: answers come back out of order
    return row, row * row, os.getpid()


def test_every_row_once_from_several_workers():
    with DecodePool(_square, 3, prefetch=2) as pool:
        got = list(pool.imap_unordered(range(40)))
    assert sorted(r for r, _, _ in got) == list(range(40))
    assert all(sq == r * r for r, sq, _ in got)
    assert len({pid for _, _, pid in got}) > 1
    assert [r for r, _, _ in got] != list(range(40))  # taken as they finish


def _tensor(row: int) -> torch.Tensor:
    return torch.full((64, 48), row, dtype=torch.uint8)


def test_tensors_arrive_through_named_shared_memory():
    with DecodePool(_tensor, 2, init=_share_by_name) as pool:
        got = {int(t[0, 0]): t for t in pool.imap_unordered(range(6))}
    assert sorted(got) == list(range(6))
    for row, t in got.items():
        assert t.shape == (64, 48) and bool((t == row).all())


def _fails_on_three(row: int) -> int:
    if row == 3:
        raise FormatError("case-3.dcm", "cannot decode DICOM pixels: truncated")
    return row


def test_a_row_error_is_raised_as_itself_with_the_worker_traceback():
    with pytest.raises(FormatError, match="case-3.dcm.*truncated") as info:
        with DecodePool(_fails_on_three, 2) as pool:
            list(pool.imap_unordered(range(8)))
    notes = "\n".join(getattr(info.value, "__notes__", []))
    if hasattr(info.value, "add_note"):
        assert "row 3" in notes and "_fails_on_three" in notes


class _Unpicklable(Exception):
    def __init__(self, a, b):  # two required arguments: pickling rebuilds it with one
        super().__init__(a)
        self.lock = __import__("threading").Lock()


def _raises_unpicklable(row: int) -> int:
    raise _Unpicklable("bad", 2)


def test_an_unpicklable_error_still_names_its_type():
    with pytest.raises(RuntimeError, match="_Unpicklable: bad"):
        with DecodePool(_raises_unpicklable, 1) as pool:
            list(pool.imap_unordered([0]))


def _dies_on_two(row: int) -> int:
    if row == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    return row


def test_a_worker_that_dies_is_an_error_not_a_missing_row():
    with pytest.raises(RuntimeError, match=r"exit code -9"):
        with DecodePool(_dies_on_two, 1) as pool:
            list(pool.imap_unordered(range(5)))


def test_close_after_an_early_stop_ends_every_worker():
    pool = DecodePool(_square, 2)
    procs = list(pool._procs)
    it = pool.imap_unordered(range(100))
    next(it)
    pool.close(now=True)
    assert all(not p.is_alive() for p in procs)


def test_no_workers_is_refused():
    with pytest.raises(ValueError, match="at least one worker"):
        DecodePool(_square, 0)


def test_the_feed_through_workers_equals_the_feed_in_process(tmp_path):
    """InputFeed rows are the same bytes through 2 worker processes as in-process: CPU-path floats, and codes computed
    from native-size uploads that crossed as shared memory (device preprocessing run on the CPU device)."""
    from PIL import Image

    from xbench.inference.input_feed import InputFeed
    from xbench.inference.gpu_preprocess import preprocess_standins
    from xbench.models import create_model

    rng = np.random.default_rng(3)
    paths = []
    for i, shape in enumerate([(97, 120), (64, 64), (150, 81), (40, 200), (128, 128)]):
        path = tmp_path / f"{i}.png"
        Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8)).save(path)
        paths.append(path)
    paths.append(tmp_path / "missing.png")
    adapters = [preprocess_standins()["kad"], create_model("center_prior")]
    feeds = {w: InputFeed(Files(paths), adapters, workers=w, skip_missing=True, preprocess_device="cpu")
             for w in (0, 2)}
    for feed in feeds.values():
        feed.ensure(range(len(paths)))
    assert feeds[0].plans and feeds[2].device_inputs == feeds[0].device_inputs == 5
    assert feeds[2].stats == feeds[0].stats == {"decoded": 5, "from_cache": 0, "skipped": 1}
    for row in range(len(paths)):
        a, b = feeds[0].rows[row], feeds[2].rows[row]
        assert a[0] == b[0] and a[2:] == b[2:] and a[1].keys() == b[1].keys()
        for key in a[1]:
            assert a[1][key].dtype == b[1][key].dtype and np.array_equal(a[1][key], b[1][key])
    assert feeds[2].rows[5][2].startswith("MissingFileError")


def test_a_platform_without_fork_is_told_to_decode_in_process(monkeypatch):
    import multiprocessing

    from xbench.core.errors import XBenchError

    monkeypatch.setattr(multiprocessing, "get_all_start_methods", lambda: ["spawn"])
    with pytest.raises(XBenchError, match="num_workers: 0"):
        DecodePool(_square, 2)


class _OneWay(Exception):
    """Pickles (its args are one string) but cannot be rebuilt: its constructor needs two arguments."""

    def __init__(self, a, b):
        super().__init__(f"{a}/{b}")


def _raises_one_way(row: int) -> int:
    raise _OneWay("x", "y")


def test_an_answer_that_cannot_be_rebuilt_is_a_named_error():
    with pytest.raises(RuntimeError, match="decode worker 0: its answer could not be read"):
        with DecodePool(_raises_one_way, 1) as pool:
            list(pool.imap_unordered([0]))
