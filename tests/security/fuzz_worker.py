"""Worker of the fuzz tests (tests/security/test_fuzz_inputs.py): reads one crafted file per request, under a memory
ceiling. Started as a subprocess; after its imports it sets ``RLIMIT_AS`` to its current address space plus
``XBENCH_FUZZ_HEADROOM`` bytes, then answers JSON lines ``{"kind", "path"}`` with ``{"status", "detail"}``:
``ok`` (read), ``refused`` (an :class:`~xbench.core.errors.XBenchError`), ``bad`` (anything else: the test fails)."""
from __future__ import annotations

import json
import os
import resource
import sys
import traceback
import warnings
from pathlib import Path

import torch

from xbench.spec.config import RunConfig
from xbench.core.errors import XBenchError
from xbench.spec.manifests import validate
from xbench.models.base import load_checkpoint
from xbench.spec.registry import read_yaml
from xbench.store.results import read_chunk_file
from xbench.workflows.score import load_maps, read_chexlocalize_pickle
from xbench.datasets.images import read_image

#: meta.json of the fuzzed results-store chunk (test_fuzz_inputs.py's "store chunk" seed): 4 cases, 3 findings, 5 × 7
CHUNK_META = {"findings": ["Nodule", "Effusion", "Mass"], "grid": [5, 7], "chunk_size": 4}


def _manifest(path: Path) -> None:
    validate(read_yaml(path))


READERS = {
    "checkpoint": load_checkpoint,
    "pickle": read_chexlocalize_pickle,
    "maps": lambda p: load_maps(Path(p).parent, classes=["Nodule"]),
    "config": RunConfig.from_yaml,
    "manifest": _manifest,
    "chunk": lambda p: read_chunk_file(p, CHUNK_META),
    "image": read_image,
}


def _vm_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize in /proc/self/status")


def main() -> None:
    torch.set_num_threads(1)
    ceiling = _vm_bytes() + int(os.environ.get("XBENCH_FUZZ_HEADROOM", str(1 << 30)))
    resource.setrlimit(resource.RLIMIT_AS, (ceiling, ceiling))
    print(json.dumps({"status": "ready", "detail": ceiling}), flush=True)
    warnings.simplefilter("ignore")
    for line in sys.stdin:
        request = json.loads(line)
        try:
            READERS[request["kind"]](request["path"])
            answer = {"status": "ok", "detail": ""}
        except XBenchError as exc:
            answer = {"status": "refused", "detail": str(exc)[:300]}
        except BaseException as exc:  # noqa: BLE001 — reported to the test, which fails on it
            answer = {"status": "bad", "detail": f"{type(exc).__name__}: {exc}"[:500] + traceback.format_exc()[-1500:]}
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
