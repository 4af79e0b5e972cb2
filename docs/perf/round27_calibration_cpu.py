"""Round 27 (issue 22, round 19): the decode feed's set-up, with the 8-bit tables read off one ``preprocess`` call
(checked at 15 levels) against the 256 constant images alone, on the same fresh input twins, arms alternated.

"256 levels" is the previous calibration: ``_one_call_table`` and ``InputFeed._plan_table`` return None, so
``model_input`` runs the 256 constant images and checks nothing (2 + 256 calls per quantising model). Each arm builds an ``InputFeed`` over one PNG for the
six paper models' twins (CLIP, MedKLIP, KAD, MAVL, CARZero, DeViDe), on the CPU path and on the kernel path (the
kernels on CPU tensors: CARZero's table comes from its plan there). Keys must be equal in every arm.

usage: python docs/perf/round27_calibration_cpu.py [repeats]   (from the repository root, dev environment)
"""
import json
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
from PIL import Image

from xbench.inference import cache
from xbench.models.base import input_twin

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from conftest import Files  # noqa: E402  (the input feed's minimal dataset of the tests)

NAMES = ["clip", "medklip", "kad", "mavl", "carzero", "devide"]


def arm(one_call: bool, device, files) -> tuple[float, list[str]]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        twins = [input_twin(n) for n in NAMES]
    saved = cache._one_call_table, cache.InputFeed._plan_table
    if not one_call:
        cache._one_call_table = lambda adapter, shape: None
        cache.InputFeed._plan_table = lambda self, adapter: None
    try:
        started = time.perf_counter()
        feed = cache.InputFeed(files, twins, preprocess_device=device)
        seconds = time.perf_counter() - started
    finally:
        cache._one_call_table, cache.InputFeed._plan_table = saved
    return seconds, [feed.specs[id(t)].key for t in twins]


def main(repeats: int) -> None:
    folder = Path(tempfile.mkdtemp())
    path = folder / "a.png"
    Image.fromarray((np.random.default_rng(0).random((300, 260)) * 255).astype(np.uint8)).save(path)
    files = Files([path])
    arm(True, None, files)  # imports and first calls out of the timings
    out = {}
    for device in (None, "cpu"):
        where = "cpu path" if device is None else "kernel path (CPU tensors)"
        times = {"one call": [], "256 levels": []}
        keys = set()
        for _ in range(repeats):
            for name, one_call in (("one call", True), ("256 levels", False)):
                seconds, k = arm(one_call, device, files)
                times[name].append(round(seconds, 3))
                keys.add(tuple(k))
        assert len(keys) == 1, keys
        ratio = float(np.median(times["256 levels"]) / np.median(times["one call"]))
        out[where] = {**times, "median_ratio": round(ratio, 2), "keys": list(keys.pop())}
        print(where, json.dumps(out[where]))
    print(json.dumps(out))


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
