"""``xbench weights check NAME DIR`` on folders the tests write."""
from __future__ import annotations

import argparse
import builtins
import shutil
from pathlib import Path

import numpy as np
import torch

from xbench.cli import main

REFERENCE = Path(__file__).resolve().parents[2] / "xbench" / "reference_weights" / "ref_xattn" / "model.safetensors"


class Exec:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (builtins.exec, (f"open({str(self.marker)!r}, 'w').close()",))


def test_good_folder_passes(tmp_path, capsys):
    shutil.copy(REFERENCE, tmp_path / "model.safetensors")
    assert main(["weights", "check", "ref_xattn", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "[     ok] model.safetensors:" in out and "read with safetensors" in out
    assert "[     ok] architecture: XAttnAdapter built from the folder" in out
    assert out.rstrip().endswith("OK: the folder is complete and loads strictly")


def test_missing_files_are_named_with_their_publisher(tmp_path, capsys):
    assert main(["weights", "check", "medklip", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "[missing] checkpoint_final.pth" in out and "github.com/MediaBrain-SJTU/MedKLIP" in out
    assert "[missing] Bio_ClinicalBERT/" in out and "huggingface.co/emilyalsentzer/Bio_ClinicalBERT" in out
    assert "[skipped] architecture: not built" in out and "PROBLEMS" in out


def test_wrong_checkpoint_is_read_safely_and_fails_the_strict_match(tmp_path, capsys):
    marker = tmp_path / "marker"
    folder = tmp_path / "kad"
    (folder / "Med-KEBERT").mkdir(parents=True)
    (folder / "Med-KEBERT" / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nlung\n")
    torch.save({"image_encoder": {"res_l1.weight": torch.zeros(2, 2)}, "text_encoder": {}, "model": {},
                "config": argparse.Namespace(lr=np.float64(1e-4)), "epoch": np.int64(3), "hook": Exec(marker)},
               folder / "best_valid.pt")
    assert main(["weights", "check", "kad", str(folder)]) == 1
    out = capsys.readouterr().out
    assert not marker.exists()
    assert "[     ok] best_valid.pt: 1 tensors; read with restricted unpickler" in out and "exec" in out
    assert "[     ok] Med-KEBERT/: BERT WordPiece tokenizer, 6 tokens" in out
    assert "[  error] architecture: CheckpointError" in out and "not a Med-KEBERT/CLP_clinical state dict" in out


def test_clip_alternatives_and_a_broken_archive(tmp_path, capsys):
    (tmp_path / "ViT-B-16.pt").write_bytes(b"not an archive")
    assert main(["weights", "check", "clip", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "[skipped] open_clip_pytorch_model.bin: absent; another of the alternative checkpoint files is present" in out
    assert "[  error] ViT-B-16.pt:" in out and "TorchScript" in out
