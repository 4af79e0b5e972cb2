"""Worker of tests/security/test_fuzz_written.py: ``fuzz_worker.py``'s loop (memory ceiling, JSON lines) with the
readers of files XBench wrote itself: a decode-cache entry, a ground-truth cache, a store ``meta.json`` (with a
chunk next to it), an ``evaluation_log.json``. A file that is not served must end in an ``XBenchError``."""
from __future__ import annotations

from pathlib import Path

import fuzz_worker
from xbench.core.errors import XBenchError
from xbench.evaluation.evaluate import read_evaluation_log
from xbench.evaluation.ground_truth import CacheUnusable, _check_arrays, load_cache
from xbench.inference.calibration import ModelInput
from xbench.inference.disk_cache import DiskCache as _DiskCache
from xbench.store.results import ResultStore, read_chunk_file

#: the decode-cache entry of the fuzzed seed: key, content hash and the model input it must be (float32 (3, 8, 8))
ENTRY = {"key": "k" * 20, "content": "ab" * 32, "spec": ModelInput("k" * 20, None, (3, 8, 8))}
GT_KEY = {"grid": [8, 8], "dataset": "fuzz"}


def _entry(path: str) -> None:
    cache = _DiskCache(Path(path).parents[3])
    array = cache.load(ENTRY["key"], ENTRY["content"], ENTRY["spec"])
    if array is None:
        raise XBenchError("not served")
    if array.shape != (3, 8, 8) or array.dtype.kind != "f":
        raise AssertionError(f"served an array that is not the model's input: {array.dtype} {array.shape}")


def _ground_truth(path: str) -> None:
    try:
        _check_arrays(load_cache(path, GT_KEY), (8, 8))
    except CacheUnusable as exc:
        raise XBenchError(f"not served: {exc}") from None


def _meta_and_chunk(path: str) -> None:
    meta = ResultStore._read_meta(Path(path))
    read_chunk_file(Path(path).with_name("chunk-00000.npz"), meta)


fuzz_worker.READERS.update({"cache entry": _entry, "ground truth": _ground_truth, "meta": _meta_and_chunk,
                            "evaluation log": read_evaluation_log})

if __name__ == "__main__":
    fuzz_worker.main()
