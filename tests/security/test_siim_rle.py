"""Issue 12 item 7: hostile SIIM RLE strings (a huge token, a value overflowing int64, runs past the image) give a
FormatError naming file, line and field, or a counted skip with `on_error: skip` — never a raw OverflowError /
IndexError (old main: `np.array(..., dtype=int64)` overflowed, and a wrapping cumsum passed the end check)."""
from __future__ import annotations

from pathlib import Path

import pytest

from xbench.datasets.regions import decode_siim_rle, siim_rle_runs
from xbench.datasets.siim import SIIMPneumothorax
from xbench.core.errors import FormatError
from xbench.spec.registry import dataset_manifest

RLE_NAME = "siim-pneumothorax-train-rle.csv"
HOSTILE = {
    "huge token": "5 " + "9" * 5000,
    "int64 overflow": "1 9223372036854775808",
    "wrapping sum": " ".join(["0 4611686018427387904"] * 4),
    "past the image": "1048000 1000",
}


def make_root(tmp_path: Path, rle: str) -> Path:
    (tmp_path / RLE_NAME).write_text(f"ImageId, EncodedPixels\n1.2.3,-1\n1.2.4, {rle}\n1.2.5,1 2\n")
    return tmp_path


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_rle_raises_with_file_line_and_field(tmp_path, name):
    with pytest.raises(FormatError, match="bad RLE") as err:
        SIIMPneumothorax(make_root(tmp_path, HOSTILE[name]), "all", manifest=dataset_manifest("siim_acr"))
    assert (err.value.path.name, err.value.line, err.value.field) == (RLE_NAME, 3, "EncodedPixels")


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_rle_is_a_counted_skip(tmp_path, name):
    ds = SIIMPneumothorax(make_root(tmp_path, HOSTILE[name]), "all", manifest=dataset_manifest("siim_acr"),
                          on_error="skip")
    assert ds.cases["case_id"].tolist() == ["1.2.3", "1.2.5"] and dict(ds.skipped) == {"bad RLE": 1}


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_rle_is_a_value_error_in_the_decoder(name):
    for fn in (siim_rle_runs, decode_siim_rle):
        with pytest.raises(ValueError, match="larger than the 1024x1024 image|past the end"):
            fn(HOSTILE[name])
