"""Work bounded by a file's size, at the readers (the CLI cases are in ``test_cli_errors.py`` and
``test_cli_checkpoints.py``).

On 5da1164: a checkpoint applying ``_codecs.encode`` K times to one memoised string built K copies (1.5 GB from
1.06 MB); a zero-stride view loaded as a 1.6 GB tensor view of 4 bytes; PNG text chunks over Pillow's limits and a
forged IDAT length ended in raw ``ValueError`` / ``MemoryError`` (an image under ``on_missing_image: skip`` killed
the run); a deflated DICOM was inflated whole before its pixel bound was checked; bounded text of untrusted values
(``brief``) did not exist — ``{pid!r:.80}`` built the whole text first. On 64b3395 a PNG with 1.2 MB of text
loaded (Pillow's total is 64 MiB; XBench's is now 1 MiB)."""
from __future__ import annotations

import json
import re
import time
import warnings
import zipfile
import zlib
from pathlib import Path

import pytest
import torch

import hostile
from test_fuzz_inputs import Worker
from xbench.core.errors import CheckpointError, FormatError, XBenchWarning
from xbench.datasets.images import image_size, read_image, read_source
from xbench.models.base import load_checkpoint


def _archive_with_pickle(path: Path, data_pkl: bytes) -> Path:
    """A torch zip checkpoint whose ``archive/data.pkl`` is ``data_pkl`` (stored, like torch writes it)."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("archive/data.pkl", data_pkl)
        archive.writestr("archive/byteorder", "little")
        archive.writestr("archive/version", "3\n")
    return path


@pytest.fixture(scope="module")
def worker():
    w = Worker()  # RLIMIT_AS = its size after imports + 1 GiB; 20 s a file
    yield w
    w.close()


@pytest.mark.parametrize("func,second,as_list", [(("_codecs", "encode"), "latin1", False),
                                                (("builtins", "bytearray"), "latin1", False),
                                                (("builtins", "list"), None, False),
                                                (("torch", "Size"), None, True)], ids=["encode", "bytearray", "list", "Size"])
def test_memo_reuse_checkpoint_is_refused_by_name_in_bounded_memory(tmp_path, worker, func, second, as_list):
    """~1 MB: one memoised 1 MiB string (or the list of its characters) handed to an admitted call 3,000 times."""
    payload = hostile.memo_reuse_pickle(calls=3000, text_bytes=2**20, func=func, second=second, as_list=as_list)
    path = _archive_with_pickle(tmp_path / "memo.pth", payload)
    t0 = time.perf_counter()
    answer = worker.read("checkpoint", path)
    assert answer["status"] == "refused", answer
    assert f"calling {func[0]}.{func[1]}" in answer["detail"] and "memo.pth" in answer["detail"], answer
    assert time.perf_counter() - t0 < 15


def test_numpy_reconstruct_reuse_is_refused(tmp_path, worker):
    """``numpy._reconstruct`` + ``BUILD`` from one memoised 1 MiB bytes object, 3,000 times."""
    path = _archive_with_pickle(tmp_path / "np.pth", hostile.numpy_reuse_pickle(calls=3000, nbytes=2**20))
    answer = worker.read("checkpoint", path)
    assert answer["status"] == "refused", answer
    assert "building numpy array" in answer["detail"] and "exceed" in answer["detail"], answer


def test_zero_stride_and_out_of_storage_views_are_refused(tmp_path):
    class View:
        def __init__(self, *args):
            self.args = args

        def __reduce__(self):
            return (torch._utils._rebuild_tensor_v2, self.args)

    import collections

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # TypedStorage deprecation
        storage = torch.ones(4).storage()
    for size, stride, offset in [((1, 1, 20000, 20000), (0, 0, 0, 0), 0), ((4,), (1,), 1), ((2, 2), (2, 2), 0)]:
        path = tmp_path / "view.pth"
        torch.save({"w": View(storage, offset, size, stride, False, collections.OrderedDict())}, path)
        with pytest.raises(CheckpointError, match=r"view\.pth.*tensor view of size .* its storage holds 4"):
            load_checkpoint(path)
    ok = tmp_path / "ok.pth"  # views inside their storage still load (a row of a matrix, a transposed one)
    base = torch.arange(6.0).reshape(2, 3)
    torch.save({"row": base[1], "t": base.t()}, ok)
    got = load_checkpoint(ok)
    assert torch.equal(got["row"], base[1]) and torch.equal(got["t"], base.t())


@pytest.mark.parametrize("dtype", [torch.qint8, torch.quint8, torch.bits8, torch.uint4])
def test_quantized_and_packed_dtypes_are_refused_when_named(tmp_path, dtype):
    path = tmp_path / "q.pth"
    path.write_bytes(b"")
    _archive_with_pickle(path, hostile.dtype_view_pickle(dtype))
    with pytest.raises(CheckpointError, match=rf"q\.pth.*{dtype}.*not supported"):
        load_checkpoint(path)


def test_real_quantized_checkpoint_is_refused(tmp_path):
    path = tmp_path / "q.pth"
    torch.save({"w": torch.quantize_per_tensor(torch.rand(4), 0.1, 0, torch.qint8)}, path)
    with pytest.raises(CheckpointError, match=r"q\.pth.*quantized"):
        load_checkpoint(path)


def test_doubling_tuple_in_a_persistent_id_is_summarised_fast(tmp_path):
    """An ~850-byte checkpoint whose persistent id is a tuple doubling at each of 60 levels: the error shows a
    bounded summary (``{pid!r:.80}`` would build 2**60 items of text first). Read in a worker of its own (a hang
    there fails this test after the worker's time limit)."""
    body = [b"\x80\x02}", hostile._put(0), *hostile._doubling(1, 60), hostile._binunicode("w"), hostile._get(61),
            b"Q", b"s."]
    path = _archive_with_pickle(tmp_path / "pid.pth", b"".join(body))
    assert path.stat().st_size < 1500
    own = Worker()
    try:
        t0 = time.perf_counter()
        answer = own.read("checkpoint", path)
        assert time.perf_counter() - t0 < 5
    finally:
        own.proc.kill()
    assert answer["status"] == "refused", answer
    assert re.search(r"pid\.pth.*persistent id \(\(\(\(.*… is not a torch storage", answer["detail"]), answer


# -- images ------------------------------------------------------------------------------------------------------
def _text(kind: bytes, chars: int, chunks: int) -> bytes:
    """``chunks`` text chunks of ``kind`` holding ``chars`` characters each (``zTXt``: compressed)."""
    out = []
    for i in range(chunks):
        key, value = f"Comment{i}".encode() + b"\x00", b"v" * chars
        out.append(hostile.png_chunk(kind, key + (b"\x00" + zlib.compress(value, 9) if kind == b"zTXt" else value)))
    return b"".join(out)


PNG_CASES = {
    "ztxt-8MiB": hostile.png(hostile.ztxt_bomb()),
    "iccp-8MiB": hostile.png(hostile.iccp_bomb()),
    "text-72MB": hostile.png(b"".join(hostile.png_chunk(b"tEXt", b"k\x00" + b"v" * (2**20 - 8)) for _ in range(72))),
    # over XBench's 1 MiB bound on a PNG's text in all (MAX_PNG_TEXT), under Pillow's 64 MiB: loaded on 64b3395
    "text-1.2MB": hostile.png(_text(b"tEXt", 600_000, 2)),
    "ztxt-2x700KB": hostile.png(_text(b"zTXt", 700_000, 2)),
    "ihdr-length": hostile.png(ihdr_length=4),  # a fuzzed length field: Pillow's ValueError("Truncated IHDR chunk")
}
TEXT_BOUND = {"text-1.2MB", "ztxt-2x700KB"}  # refused by the text bound: Pillow's message names MAX_TEXT_MEMORY


@pytest.mark.parametrize("name", sorted(PNG_CASES))
def test_hostile_png_is_a_format_error(tmp_path, name):
    path = tmp_path / f"{name}.png"
    path.write_bytes(PNG_CASES[name])
    for reader in (read_image, read_source, image_size):
        if reader is image_size and name == "ihdr-length":
            continue  # a header-only read: the forged IHDR length is met when pixels are decoded
        with pytest.raises(FormatError, match=rf"{name}\.png.*{'MAX_TEXT_MEMORY' if name in TEXT_BOUND else ''}"):
            reader(path)


def test_png_with_a_little_text_still_reads(tmp_path):
    """200 KB of text chunks (NIH's PNGs carry two dates) reads as before."""
    path = tmp_path / "small.png"
    path.write_bytes(hostile.png(_text(b"tEXt", 64_000, 2) + _text(b"zTXt", 100_000, 1)))
    assert image_size(path) == (4, 4)
    assert torch.equal(torch.from_numpy(read_image(path)[0]), torch.arange(4, dtype=torch.float32) / 255)


@pytest.mark.parametrize("name", ["ihdr-length", "text-1.2MB"])
def test_hostile_png_is_a_counted_skip(tmp_path, monkeypatch, name):
    """Under ``on_missing_image: skip`` an unreadable PNG is one counted skip (reason FormatError); the run goes on."""
    import xbench
    from xbench.spec.config import RunConfig
    from xbench.workflows.run import run

    monkeypatch.setenv("XBENCH_CACHE", str(tmp_path / "cache"))
    data = xbench.load_dataset("phantom", split="test", cases=6)
    path = Path(data.cases["image_path"].iloc[2])
    path.write_bytes(PNG_CASES[name])
    raw = {"output_dir": str(tmp_path / "run"), "datasets": [{"name": "phantom", "split": "test", "cases": 6}],
           "models": ["center_prior"], "grid": [32, 32], "chunk_size": 4, "batch_size": 4,
           "bootstrap": {"replicates": 0}, "on_missing_image": "skip"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", XBenchWarning)
        run(RunConfig.from_dict(raw), progress=False)
    entry = {e["model"]: e for e in json.loads((tmp_path / "run" / "run_log.json").read_text())}["center_prior"]
    assert (entry["cases_skipped"], entry["cases_inferred"], entry["skip_reasons"]) == (1, 5, {"FormatError": 1})


def test_deflated_dicom_is_bounded_before_inflating(tmp_path, monkeypatch):
    """The dataset inflates to 64 MiB around an 8×8 image; with a bound of 10⁶ pixels (8 MB + 16 MiB) it is refused
    while inflating in pieces — pydicom never holds it whole. Within the bound the same kind of file reads."""
    monkeypatch.setenv("XBENCH_MAX_PIXELS", str(10**6))
    path = hostile.deflated_dicom(tmp_path / "bomb.dcm", filler=64 * 2**20)
    assert path.stat().st_size < 2**20
    for reader in (read_image, image_size):
        with pytest.raises(FormatError, match=r"bomb\.dcm.*deflated dataset inflates to more than"):
            reader(path)
    small = hostile.deflated_dicom(tmp_path / "ok.dcm", filler=1024)
    assert read_image(small).shape == (8, 8) and image_size(small) == (8, 8)
