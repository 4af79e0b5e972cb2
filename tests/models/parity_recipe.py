"""The parity weight recipe ``xbench-parity-recipe-v1`` (../shared/parity/README.md §1–2).

Test helper shared by every parity test (``from parity_recipe import fill, build_state``), with the readers of a
fixture folder every parity test uses (:func:`load_fixture`, :func:`strict`, :func:`write_vocab`).

``fill(key, shape)`` depends only on the checkpoint key string (exactly as it appears in
the official file, inside its container) and the shape; every step up to the final
float32 cast is exact integer or correctly rounded float64 arithmetic, so the values
are bit-identical to the fixture generator's.
"""
from __future__ import annotations

import json
import math
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file

P = 2**31 - 1  # prime modulus of the quadratic-residue sequence


def fill(key: str, shape: Sequence[int]) -> torch.Tensor:
    """Recipe value of checkpoint entry ``key`` with ``shape`` (float32, int64 zeros for ``num_batches_tracked``).

    Rule by the last dotted component of ``key``: ``running_mean`` 0.1v, ``running_var`` 1+0.5|v|,
    ``*bias`` 0.1v, ``in_proj_weight`` v·3√(3/fan_in), other ``*weight`` with ndim ≥ 2 v·√(3/fan_in),
    ``*weight`` with ndim ≤ 1 1+0.1v, anything else 0.02v; ``v = 2·(r/P) − 1`` with
    ``r = (a·(k² mod P) + k) mod P``, ``a = 1 + crc32(key) mod (P−1)``, ``k`` the 1-based C-order position.
    """
    shape = tuple(int(s) for s in shape)
    name = key.split(".")[-1]
    if name == "num_batches_tracked":
        return torch.zeros(shape, dtype=torch.int64)
    n = int(np.prod(shape)) if shape else 1
    a = 1 + zlib.crc32(key.encode("utf-8")) % (P - 1)
    k = np.arange(1, n + 1, dtype=np.int64)
    v = 2.0 * (((a * ((k * k) % P) + k) % P).astype(np.float64) / P) - 1.0
    fan_in = int(np.prod(shape[1:])) if len(shape) >= 2 else 1
    if name == "running_mean":
        x = 0.1 * v
    elif name == "running_var":
        x = 1.0 + 0.5 * np.abs(v)
    elif name.endswith("bias"):
        x = 0.1 * v
    elif name == "in_proj_weight":
        x = v * (3.0 * math.sqrt(3.0 / fan_in))
    elif name.endswith("weight") and len(shape) >= 2:
        x = v * math.sqrt(3.0 / fan_in)
    elif name.endswith("weight"):
        x = 1.0 + 0.1 * v
    else:
        x = 0.02 * v
    return torch.from_numpy(x.reshape(shape).astype(np.float32))


def build_state(entries: Mapping[str, Mapping[str, Any]]) -> dict[str, torch.Tensor]:
    """Synthetic state dict for one schema container, in the schema's key order.

    ``entries`` maps checkpoint key → schema entry (``shape``, optional ``alias_of``, ``role``).
    An ``alias_of`` entry gets ``fill(alias_of, shape)`` (identical values under both keys, as in
    the real file); the role ``buffer_constructed`` (KAD's ``bert_model.embeddings.position_ids``)
    gets ``arange(shape[-1])`` broadcast to ``shape`` in int64.
    """
    state: dict[str, torch.Tensor] = {}
    for key, entry in entries.items():
        shape = tuple(int(s) for s in entry["shape"])
        if entry.get("role") == "buffer_constructed":
            state[key] = torch.arange(shape[-1], dtype=torch.int64).expand(shape).clone()
        else:
            state[key] = fill(entry.get("alias_of", key), shape)
    return state


def load_fixture(folder: Path) -> dict[str, Any]:
    """A parity fixture folder (``tests/fixtures/parity/<model>`` or ``../shared/parity/<model>``): ``dir``,
    ``tensors`` (``case.safetensors``), ``json`` (``case.json``), ``schema`` (``schema.json``) and, where the
    folder has one, ``text_schema`` (``text_schema.json``)."""
    case = {"dir": folder, "tensors": load_file(str(folder / "case.safetensors")),
            "json": json.loads((folder / "case.json").read_text()),
            "schema": json.loads((folder / "schema.json").read_text())}
    if (folder / "text_schema.json").is_file():
        case["text_schema"] = json.loads((folder / "text_schema.json").read_text())
    return case


def strict(case: Mapping[str, Any], tensor: str) -> dict[str, float]:
    """``assert_close`` tolerances of ``tensor`` from ``case.json``'s ``tolerances.recommended_strict``."""
    tol = case["tolerances"]["recommended_strict"][tensor]
    return {"atol": tol["atol"], "rtol": tol["rtol"]}


def write_vocab(folder: Path, vocab: Mapping[str, Any]) -> Path:
    """``folder/vocab.txt`` of a fixture's synthetic vocabulary (``case.json``'s ``vocab``: ``size``, ``special`` and
    ``words`` token → id; the other ids ``[unusedN]``)."""
    lines = [f"[unused{i}]" for i in range(vocab["size"])]
    for token, i in {**vocab["special"], **vocab["words"]}.items():
        lines[int(i)] = token
    (folder / "vocab.txt").write_text("\n".join(lines) + "\n")
    return folder / "vocab.txt"
