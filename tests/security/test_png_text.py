"""A PNG's text chunks are bounded at ``xbench.datasets.images.MAX_PNG_TEXT`` (1 MiB) in all, not Pillow's
64 MiB: more is a :class:`FormatError` naming the file (a counted skip under ``on_missing_image: skip``); an image
with a little text (NIH's PNGs carry two dates) reads as before. On 64b3395 a PNG with 1.2 MB of ``tEXt`` or
1.4 MiB of inflated ``zTXt`` loaded (only more than 64 MiB was refused)."""
from __future__ import annotations

import json
import warnings
import zlib
from pathlib import Path

import numpy as np
import pytest

import hostile
import xbench
from xbench.core.errors import FormatError, XBenchWarning
from xbench.datasets.images import image_size, read_image, read_source

NIH = Path(__file__).resolve().parents[2] / ".." / "shared" / "samples" / "00000001_000.png"


def _text(kind: bytes, chars: int, chunks: int) -> bytes:
    """``chunks`` text chunks of ``kind`` holding ``chars`` characters each (``zTXt``: compressed)."""
    out = []
    for i in range(chunks):
        key = f"Comment{i}".encode() + b"\x00"
        value = b"v" * chars
        out.append(hostile.png_chunk(kind, key + (b"\x00" + zlib.compress(value, 9) if kind == b"zTXt" else value)))
    return b"".join(out)


OVER = {"tEXt-1.2MB": _text(b"tEXt", 600_000, 2), "zTXt-1.4MiB": _text(b"zTXt", 700_000, 2)}


@pytest.mark.parametrize("name", sorted(OVER))
def test_png_text_over_the_bound_is_a_format_error(tmp_path, name):
    path = tmp_path / f"{name}.png"
    path.write_bytes(hostile.png(OVER[name]))
    for reader in (read_image, read_source, image_size):
        with pytest.raises(FormatError, match=rf"{name}\.png.*MAX_TEXT_MEMORY"):
            reader(path)


def test_png_with_a_little_text_still_reads(tmp_path):
    path = tmp_path / "small.png"
    path.write_bytes(hostile.png(_text(b"tEXt", 64_000, 2) + _text(b"zTXt", 100_000, 1)))
    assert read_image(path).shape == (4, 4) and image_size(path) == (4, 4)
    np.testing.assert_array_equal(read_image(path)[0], np.arange(4, dtype=np.float32) / 255)
    if NIH.is_file():  # a real chest X-ray PNG (two date chunks)
        assert read_image(NIH).shape == (512, 512)


def test_png_text_over_the_bound_is_a_counted_skip(tmp_path, monkeypatch):
    """Under ``on_missing_image: skip`` the PNG with too much text is one counted skip (FormatError); the run goes
    on with the other cases."""
    from xbench.spec.config import RunConfig
    from xbench.workflows.run import run

    monkeypatch.setenv("XBENCH_CACHE", str(tmp_path / "cache"))
    data = xbench.load_dataset("phantom", split="test", cases=6)
    path = Path(data.cases["image_path"].iloc[2])
    path.write_bytes(hostile.png(OVER["tEXt-1.2MB"], width=256, height=256))
    raw = {"output_dir": str(tmp_path / "run"), "datasets": [{"name": "phantom", "split": "test", "cases": 6}],
           "models": ["center_prior"], "grid": [32, 32], "chunk_size": 4, "batch_size": 4,
           "bootstrap": {"replicates": 0}, "on_missing_image": "skip"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", XBenchWarning)
        run(RunConfig.from_dict(raw), progress=False)
    entry = {e["model"]: e for e in json.loads((tmp_path / "run" / "run_log.json").read_text())}["center_prior"]
    assert (entry["cases_skipped"], entry["cases_inferred"], entry["skip_reasons"]) == (1, 5, {"FormatError": 1})
