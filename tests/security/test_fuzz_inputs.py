"""Issue 20: Hypothesis fuzzing of every untrusted input format: each mutated file is read or refused with an
``XBenchError`` — never a crash, a hang or a large allocation.

Seeds (written here): a torch zip checkpoint holding numpy data and a placeholder payload, a legacy checkpoint,
a safetensors file, a cheXlocalize map pickle with a nested legacy storage, ``.npy`` / ``.npz`` map files, a
run config (and one with a model's mapping parameter), a dataset manifest, a results-store chunk (zstd layout), a
protocol-4 (framed) map pickle, a PNG with text chunks and a deflated DICOM. Hypothesis mutates their bytes (overwrites, truncation, insertion; derandomized,
so CI is reproducible). Each file is read by a worker subprocess (``fuzz_worker.py``) whose address space is capped
(``RLIMIT_AS`` = its size after imports + 1 GiB) with a per-file time limit; a crash, a non-XBench exception, a
``MemoryError`` or a time-out fails the test, naming the file and the mutation."""
from __future__ import annotations

import io
import json
import os
import pickle
import select
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.numpy import save as save_safetensors

import hostile
import xbench
from xbench.store.results import encode_chunk

ROOT = Path(xbench.__file__).resolve().parents[1]  # the checkout whose xbench the tests import
TIME_LIMIT_S = 20
EXAMPLES = 25


class Payload:
    def __reduce__(self):
        return (os.system, ("true",))


def _torch_bytes(obj, legacy: bool = False) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf, _use_new_zipfile_serialization=not legacy)
    return buf.getvalue()


def _seeds() -> dict[str, tuple[str, str, bytes]]:
    state = {"w": torch.arange(12.0).reshape(3, 4), "meta": {"epoch": 3, "np": np.arange(4, dtype=np.int16),
                                                              "s": np.float64(0.5), "hook": Payload()}}
    npz = io.BytesIO()
    np.savez_compressed(npz, Nodule=np.linspace(0, 1, 64, dtype=np.float32).reshape(8, 8))
    npy = io.BytesIO()
    np.save(npy, np.linspace(0, 1, 64, dtype=np.float32).reshape(1, 8, 8))
    chex = pickle.dumps({"map": torch.linspace(0, 1, 16).reshape(1, 1, 4, 4), "prob": 0.25, "task": "Edema",
                         "cxr_dims": (4, 4)}, protocol=2)
    config = (ROOT / "xbench" / "configs" / "runs").glob("*.yaml")
    config_text = next(iter(sorted(config)), None)
    manifest = (ROOT / "data_manifests" / "chestx_det.yaml").read_bytes()
    rng = np.random.default_rng(0)
    chunk = encode_chunk({"case_ids": np.array(["a", "b", "c", "d"]), "scores": rng.random((4, 3), np.float32),
                          "probs": rng.random((4, 3), np.float32), "maps": rng.random((4, 3, 5, 7)).astype(np.float16),
                          "sizes": np.full((4, 2), 512), "windows": np.zeros((4, 4)), "skipped_ids": np.array(["e"]),
                          "skipped_reasons": np.array(["MissingFileError: gone"])})  # the zstd layout (fuzz_worker's meta)
    return {
        "zip checkpoint": ("checkpoint", "model.pth", _torch_bytes(state)),
        "legacy checkpoint": ("checkpoint", "model.pt", _torch_bytes({"w": torch.arange(6.0)}, legacy=True)),
        "safetensors checkpoint": ("checkpoint", "model.safetensors",
                                   save_safetensors({"w": np.arange(6, dtype=np.float32)})),
        "chexlocalize pickle": ("pickle", "p1_Edema_map.pkl", chex),
        "npz maps": ("maps", "case1.npz", npz.getvalue()),
        "npy maps": ("maps", "case1.npy", npy.getvalue()),
        "safetensors maps": ("maps", "case1.safetensors",
                             save_safetensors({"Nodule": np.ones((8, 8), np.float32)})),
        "run config": ("config", "run.yaml", config_text.read_bytes() if config_text else b"datasets: [phantom]\n"),
        "manifest": ("manifest", "chestx_det.yaml", manifest),
        "store chunk": ("chunk", "chunk-00000.npz", chunk),
        "chexlocalize pickle protocol 4": ("pickle", "p1_Edema_map.pkl", pickle.dumps(
            {"map": np.linspace(0, 1, 16, dtype=np.float32).reshape(1, 1, 4, 4), "prob": 0.25}, protocol=4)),
        "png image": ("image", "case.png", hostile.png(hostile.png_chunk(b"tEXt", b"Comment\x00hello")
                                                        + hostile.png_chunk(b"zTXt", b"k\x00\x00" + zlib.compress(b"z" * 64)),
                                                        width=16, height=16)),
        "deflated dicom": ("image", "case.dcm", _dicom_bytes()),
        "model params config": ("config", "run.yaml", b"output_dir: out\ndatasets: [phantom]\nmodels:\n  - name: clip\n"
                                b"    params: {templates: {positive: 'a {}', negative: 'no {}'}}\ngrid: [32, 32]\n"),
    }


def _dicom_bytes() -> bytes:
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        return hostile.deflated_dicom(Path(folder) / "seed.dcm", filler=256).read_bytes()


SEEDS = _seeds()


class Worker:
    def __init__(self):
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("fuzz_worker.py"))], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        ready = self._answer(120)
        assert ready["status"] == "ready", ready
        self.count = 0

    def _answer(self, timeout: float) -> dict:
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            self.proc.kill()
            raise AssertionError(f"fuzz worker: no answer within {timeout} s (hang)")
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(10)
            raise AssertionError(f"fuzz worker died (exit {self.proc.returncode}): {self.proc.stderr.read()[-2000:]}")
        return json.loads(line)

    def read(self, kind: str, path: Path) -> dict:
        self.proc.stdin.write(json.dumps({"kind": kind, "path": str(path)}) + "\n")
        self.proc.stdin.flush()
        self.count += 1
        return self._answer(TIME_LIMIT_S)

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(30)


@pytest.fixture(scope="module")
def worker():
    w = Worker()
    yield w
    w.close()


def _mutate(data: bytes, edits: list[tuple[int, int, bytes]], cut: int | None) -> bytes:
    out = bytearray(data)
    for op, at, chunk in edits:
        i = at % (len(out) + 1)
        if op == 0:  # overwrite
            out[i:i + len(chunk)] = chunk
        elif op == 1:  # insert
            out[i:i] = chunk
        else:  # delete
            del out[i:i + len(chunk)]
    return bytes(out[:cut] if cut is not None else out)


EDIT = st.tuples(st.integers(0, 2), st.integers(0, 1 << 20),
                 st.one_of(st.binary(min_size=1, max_size=8),
                           st.sampled_from([b"\xff" * 8, b"\x00" * 8, b"\x7f\xff\xff\xff", b"O", b"|O",
                                            b"J\xff\xff\xff\x7f", b"(((((", b"!!python/object"])))


@pytest.mark.parametrize("seed", sorted(SEEDS))
def test_mutated_inputs_end_in_a_result_or_an_xbench_error(seed, worker, tmp_path_factory):
    kind, name, data = SEEDS[seed]
    folder = tmp_path_factory.mktemp("fuzz")
    seen: dict[str, int] = {}

    @settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(edits=st.lists(EDIT, min_size=1, max_size=4), cut=st.one_of(st.none(), st.integers(0, len(data))))
    def check(edits, cut):
        path = folder / name
        for old in folder.iterdir():
            old.unlink()
        path.write_bytes(_mutate(data, edits, cut))
        answer = worker.read(kind, path)
        assert answer["status"] in ("ok", "refused"), f"{seed} {edits} cut={cut}: {answer['detail']}"
        seen[answer["status"]] = seen.get(answer["status"], 0) + 1

    check()
    assert seen.get("refused", 0) > 0, seen  # the mutations do reach the readers' checks
