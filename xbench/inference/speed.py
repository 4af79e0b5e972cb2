"""Numerics switches of a run: precision (fp32 / tf32 / bf16 / fp16) and memory layout.

``precision`` (run config):

* ``fp32`` — true float32 everywhere. On CUDA, TF32 for matmuls and cuDNN convolutions is turned
  **off** for the run and the previous settings are restored afterwards (PyTorch leaves cuDNN's
  TF32 on by default, which would silently round convolution inputs to 10-bit mantissas).
* ``tf32`` — float32 tensors, TF32 tensor-core matmuls and convolutions (≈ 3e-4 relative error).
* ``bf16`` / ``fp16`` — ``torch.autocast`` on CUDA (weights stay float32); TF32 off as for fp32.

``channels_last`` converts the 4-D weights of every module the adapter holds (CNN trunks) to the
NHWC layout and feeds NHWC inputs; transformers are unaffected.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import torch

__all__ = ["PRECISIONS", "precision_mode", "autocast", "adapter_modules", "to_channels_last"]

PRECISIONS = ("fp32", "tf32", "bf16", "fp16")


@contextmanager
def precision_mode(precision: str, device: torch.device | str) -> Iterator[None]:
    """Set TF32 for ``precision`` on CUDA for the duration of the block, then restore the previous flags."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if torch.device(device).type != "cuda":
        yield
        return
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    allow = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = allow
    torch.backends.cudnn.allow_tf32 = allow
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def autocast(precision: str, device: torch.device | str) -> Any:
    """``torch.autocast`` for bf16 / fp16 on CUDA, else a no-op context."""
    device = torch.device(device)
    if device.type == "cuda" and precision in ("bf16", "fp16"):
        return torch.autocast("cuda", dtype=torch.float16 if precision == "fp16" else torch.bfloat16)
    return nullcontext()


def adapter_modules(adapter: Any) -> list[torch.nn.Module]:
    """The top-level ``nn.Module`` attributes of an adapter (its networks)."""
    return [v for v in vars(adapter).values() if isinstance(v, torch.nn.Module)]


def to_channels_last(adapter: Any) -> int:
    """Convert every module of ``adapter`` with 4-D weights to channels_last; returns how many modules changed."""
    changed = 0
    for module in adapter_modules(adapter):
        if any(p.dim() == 4 for p in module.parameters()):
            module.to(memory_format=torch.channels_last)
            changed += 1
    return changed
