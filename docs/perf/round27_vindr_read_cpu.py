"""Round 27 (issue 22, round 19): where a VinDr-CXR stand-in's read goes on the CPU, by transfer syntax.

For every ``.dicom`` file under ``<root>/vindr_cxr/images`` (stand-ins of ``bench_gpu.py --phases none``): the
pixel decode alone (``pydicom`` ``pixel_array``), by transfer syntax; the decode worker's read
(``xbench.datasets.images._read_dicom(path, source=True)``); and the decode cache's content hash. Averages in ms.

usage: python docs/perf/round27_vindr_read_cpu.py /tmp/s01
"""
import collections
import json
import sys
import time
from pathlib import Path

import pydicom

from xbench.datasets.images import _read_dicom
from xbench.inference.cache import content_hash


def main(root: Path) -> None:
    files = sorted((root / "vindr_cxr" / "images").glob("*.dicom"))
    pixels: dict[str, list[float]] = collections.defaultdict(list)
    for f in files:
        ds = pydicom.dcmread(f)
        started = time.perf_counter()
        _ = ds.pixel_array  # decoded on first access
        pixels[str(ds.file_meta.TransferSyntaxUID.name)].append(time.perf_counter() - started)

    def mean_ms(fn) -> float:
        started = time.perf_counter()
        for f in files:
            fn(f)
        return round(1000 * (time.perf_counter() - started) / len(files), 1)

    out = {"files": len(files),
           "pixel_decode_ms": {k: {"files": len(v), "mean": round(1000 * sum(v) / len(v), 1)} for k, v in pixels.items()},
           "read_source_ms": mean_ms(lambda f: _read_dicom(f, None, source=True)),
           "content_hash_ms": mean_ms(content_hash)}
    print(json.dumps(out))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
