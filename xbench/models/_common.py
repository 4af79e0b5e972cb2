"""Helpers shared by the adapters: seeded builds, the stand-in tokenizer, 8-bit resize/normalise, input checks.

Each helper exists once here; adapters import it instead of keeping a copy.
"""
from __future__ import annotations

import re
import zlib
from collections.abc import Callable, Hashable, Sequence
from typing import Any, Generic, TypeVar

import numpy as np
import torch
from PIL import Image
from torch.overrides import TorchFunctionMode

from .inputs import to_uint8  # the one float -> 8-bit rule (per source depth; see xbench.models.inputs)

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

T = TypeVar("T")


def seeded_build(seed: int, build: Callable[[], T]) -> T:
    """Run ``build()`` with torch's CPU RNG seeded by ``seed`` and restored afterwards (no global seeding).

    >>> a = seeded_build(3, lambda: torch.nn.Linear(2, 2))
    >>> b = seeded_build(3, lambda: torch.nn.Linear(2, 2))
    >>> bool(torch.equal(a.weight, b.weight))
    True
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        return build()


_init = torch.nn.init
_RANDOM_FILLS = frozenset({
    torch.Tensor.uniform_, torch.Tensor.normal_, torch.Tensor.random_, torch.Tensor.bernoulli_,
    torch.Tensor.exponential_, torch.Tensor.geometric_, torch.Tensor.log_normal_, torch.Tensor.cauchy_,
    _init.uniform_, _init.normal_, _init.trunc_normal_, _init.kaiming_uniform_, _init.kaiming_normal_,
    _init.xavier_uniform_, _init.xavier_normal_, _init.orthogonal_, _init.sparse_,
})


class _NoRandomParameterFill(TorchFunctionMode):
    """Replaces the random fills of parameters (the ``torch.nn.init`` functions and the in-place samplers) by zeros;
    every other call, and every fill of a buffer or a plain tensor, runs as usual. Modes are per thread: other threads
    are not affected."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        target = args[0] if args else kwargs.get("tensor")  # torch.nn.init passes the tensor by keyword
        if func in _RANDOM_FILLS and isinstance(target, torch.nn.Parameter):
            with torch.no_grad():
                return target.zero_()  # a memset; defined values for what an init computes next (trunc_normal_'s check)
        return func(*args, **kwargs)


def seeded_or_uninitialised(factory: Callable[[], T], seed: int | None) -> T:
    """``factory()`` with seeded random weights (:func:`seeded_build`), or with ``seed=None`` uninitialised for the
    strict load that follows (:func:`build_uninitialised`)."""
    return build_uninitialised(factory) if seed is None else seeded_build(seed, factory)


_REBUILT_BUFFERS: dict[str, Callable[[torch.Tensor], object]] = {  # non-persistent buffers no checkpoint holds
    "position_ids": lambda b: b.copy_(torch.arange(b.shape[-1]).expand_as(b)),  # BERT's arange
    "token_type_ids": lambda b: b.zero_(),  # BERT's zeros
}


def build_uninitialised(factory: Callable[[], T]) -> T:
    """``factory()`` without the random initialisation of its parameters, for a network whose every parameter and
    persistent buffer is loaded next by a strict load (:func:`xbench.models.base.load_state_strict`).

    Two ways, the first that applies:

    * **meta device**: built on PyTorch's meta device and given uninitialised CPU memory; allowed when every
      non-persistent buffer is one this helper rebuilds (BERT's ``position_ids`` and ``token_type_ids``) and no other
      tensor attribute is left on the meta device;
    * **no random fills**: built normally, but random fills of parameters (the ``torch.nn.init`` functions and the
      in-place samplers) become zero fills; buffers are computed as in a normal build. This serves networks the
      first way cannot, such as open_clip's (``create_model`` moves the model to its device, and CLIP has a causal
      ``attn_mask`` buffer).

    No RNG is drawn either way. Build times are in ``docs/performance.md`` ("How a run is organised for speed"). ``accelerate``'s
    ``init_empty_weights`` is the first way without the buffer rules; accelerate is not a dependency.

    >>> net = build_uninitialised(lambda: torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2)))
    >>> state = {k: torch.ones_like(v) for k, v in net.state_dict().items()}
    >>> _ = net.load_state_dict(state, strict=True)
    >>> net[0].weight.tolist(), net[1].running_mean.tolist()
    ([[1.0, 1.0], [1.0, 1.0]], [1.0, 1.0])
    """
    module = _on_meta(factory)
    if module is not None:
        return module
    with _NoRandomParameterFill():
        return factory()


def _on_meta(factory: Callable[[], T]) -> T | None:
    """The meta-device way of :func:`build_uninitialised`, or None where it does not apply."""
    try:
        with torch.device("meta"):
            module = factory()
    except (NotImplementedError, RuntimeError):  # e.g. a factory that moves its meta tensors to a device
        return None
    if not isinstance(module, torch.nn.Module):
        return None
    owners = list(module.modules())
    if any(name not in _REBUILT_BUFFERS for owner in owners for name in owner._non_persistent_buffers_set):
        return None
    if any(isinstance(v, torch.Tensor) and v.is_meta for owner in owners for v in vars(owner).values()):
        return None  # a tensor attribute that is neither a parameter nor a buffer: to_empty would not reach it
    module = module.to_empty(device="cpu")
    with torch.no_grad():
        for owner in owners:
            for name in owner._non_persistent_buffers_set:
                _REBUILT_BUFFERS[name](getattr(owner, name))
    return module


class HashWordTokenizer:
    """Deterministic stand-in tokenizer for random-init models built without their real vocabulary.

    Lower-cased words (``pattern`` matches of the text; whitespace-separated by default) get id
    ``1000 + crc32(word) % 27000`` between ``[CLS]`` (101) and ``[SEP]`` (102), zero-padded to
    ``max_length`` (the toy ids of the parity fixtures). Calling it returns ``(input_ids,
    attention_mask)``, both int64 ``(len(texts), max_length)``; extra keyword arguments (those a BERT
    tokenizer takes) are ignored. It has no linguistic meaning and is never used with official weights.

    >>> ids, mask = HashWordTokenizer(6)(["Pleural effusion"])
    >>> ids[0, 0].item(), ids[0, 3].item(), mask.tolist()
    (101, 102, [[1, 1, 1, 1, 0, 0]])
    """

    def __init__(self, max_length: int = 256, pattern: str = r"\S+"):
        self.max_length = int(max_length)
        self.pattern = re.compile(pattern)

    def __call__(self, texts: Sequence[str], **_: object) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.zeros(len(texts), self.max_length, dtype=torch.int64)
        for row, text in enumerate(texts):
            words = self.pattern.findall(text.lower())[: self.max_length - 2]
            seq = [101, *(1000 + zlib.crc32(w.encode("utf-8")) % 27000 for w in words), 102]
            ids[row, : len(seq)] = torch.tensor(seq)
        return ids, (ids != 0).to(torch.int64)


# -- images ------------------------------------------------------------------------------------
def resize_uint8(image: np.ndarray, size: int, resample: int = Image.BICUBIC) -> np.ndarray:
    """``(H, W)`` image -> ``(size, size)`` uint8 by PIL ``resample`` (``Resize([size, size])`` on a PIL image).

    Aspect ratio is not kept. An image already ``size x size`` comes back unchanged (PIL and torchvision
    both return a copy). PIL resizes each channel alike, so resizing the grey image equals resizing its
    RGB copy channel by channel.
    """
    pil = Image.fromarray(to_uint8(image))
    if pil.size != (size, size):
        pil = pil.resize((size, size), resample)
    return np.asarray(pil)


def normalize_uint8(image_uint8: np.ndarray, mean: Sequence[float] = IMAGENET_MEAN,
                    std: Sequence[float] = IMAGENET_STD) -> torch.Tensor:
    """``(S, S)`` uint8 -> ``(3, S, S)`` float32: ``ToTensor`` (/255), grey -> RGB, ``Normalize(mean, std)``."""
    grey = torch.from_numpy(np.array(image_uint8, dtype=np.uint8)).float().div(255)  # a writable copy
    rgb = grey.unsqueeze(0).repeat(3, 1, 1)
    return rgb.sub(torch.tensor(mean, dtype=torch.float32)[:, None, None]).div(
        torch.tensor(std, dtype=torch.float32)[:, None, None])


# -- input checks --------------------------------------------------------------------------------
def check_inputs(pixels: torch.Tensor, prompts: Sequence[str], size: int | None) -> None:
    """Raise ``ValueError`` unless ``pixels`` is ``(B, 3, size, size)`` (any ``S`` when ``size`` is None) and
    ``prompts`` is not empty."""
    if pixels.ndim != 4 or pixels.shape[1] != 3 or (size is not None and tuple(pixels.shape[2:]) != (size, size)):
        want = "S, S" if size is None else f"{size}, {size}"
        raise ValueError(f"expected pixels of shape (B, 3, {want}), got {tuple(pixels.shape)}")
    if not len(prompts):
        raise ValueError("prompts is empty: give at least one class name")


class PromptCache(Generic[T]):
    """Text features of the last prompt list (``key``) an adapter encoded; ``get`` recomputes on a new key.

    >>> cache = PromptCache()
    >>> cache.get(("a",), lambda: 1), cache.get(("a",), lambda: 2), cache.get(("b",), lambda: 3)
    (1, 1, 3)
    """

    def __init__(self) -> None:
        self._entry: tuple[Hashable, T] | None = None

    def get(self, key: Hashable, compute: Callable[[], T]) -> T:
        if self._entry is None or self._entry[0] != key:
            self._entry = (key, compute())
        return self._entry[1]
