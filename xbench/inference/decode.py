"""The decode stage: one dataset row read once and turned into every model's stored input.

A :class:`RowDecoder` is what a decode worker (:class:`~xbench.inference.decode_pool.DecodePool`) runs for a row: the
disk cache (:mod:`~xbench.inference.disk_cache`) answers when it holds every entry; otherwise the file is read, each
CPU-path model's ``preprocess`` runs on the one decoded image (stored as codes where exact,
:mod:`~xbench.inference.calibration`), and the native-size source is handed on for the models whose codes are computed
on the device (:mod:`~xbench.inference.gpu_preprocess`).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from torch.utils.data import Dataset

from ..core.errors import FormatError, MissingFileError
from .calibration import ModelInput
from .disk_cache import DAMAGED, DiskCache, content_hash, file_identity
from .pinned_slots import SlotArena
from .recorder import Stopwatch

__all__ = ["CaseItem", "Decoded", "RowDecoder", "share_by_name"]


class CaseItem(NamedTuple):
    """One row of a model batch as both input pipelines yield it (the pixels travel apart, stacked per batch).

    ``reason`` is why the case is skipped (None when its image was read); ``shape`` the image's ``(H, W)`` and
    ``window`` the adapter's :meth:`input_window` of it (both None for a skipped case).
    """

    row: int
    case_id: str
    reason: str | None
    shape: tuple[int, int] | None
    window: tuple[float, float, float, float] | None


@dataclass
class Decoded:
    """What the decode stage gives for one dataset row.

    ``inputs``: stored input per transform key (codes or float32); ``reason``: why the case is skipped (None when
    read); ``shape``: the image's ``(H, W)``; ``decoded``: the file was read (not served from the cache);
    ``source``: the native-size ``uint8``/``uint16`` image (a tensor, shared memory between processes) when keys
    computed on the device still need it;
    ``content``: the file's content hash when the disk cache is on (entries of device-computed keys are saved
    under it);
    ``slot``: the :class:`~xbench.inference.pinned_slots.SlotArena` slot the worker wrote the source into instead
    (``layout``: its shape and numpy dtype string; ``source`` is then None until the decoding thread views the slot).
    """

    row: int
    case_id: str
    inputs: dict[str, np.ndarray]
    reason: str | None
    shape: tuple[int, int] | None
    decoded: bool
    source: torch.Tensor | None = None
    content: str | None = None
    read_seconds: float = 0.0  # in the worker: reading the file (decode)
    prep_seconds: float = 0.0  # in the worker: CPU preprocess of the CPU-path keys and the upload array
    slot: int | None = None
    layout: tuple[tuple[int, ...], str] | None = None
    damaged: int = 0  # unusable cache files met for this row (logged, recomputed, never served)


class RowDecoder(Dataset):
    """Row → :class:`Decoded` — one decode for every model; keys in ``device_keys`` are left to the device."""

    def __init__(self, dataset: Any, adapters: dict[str, Any], inputs: dict[str, ModelInput],
                 cache: DiskCache | None, skip_missing: bool, device_keys: frozenset[str] = frozenset(),
                 arena: SlotArena | None = None):
        self.dataset, self.adapters, self.inputs, self.cache, self.skip_missing = (
            dataset, adapters, inputs, cache, skip_missing)
        self.device_keys = device_keys
        self.arena = arena
        self.damaged = 0  # unusable cache files met by cached() (logged there)

    def __len__(self) -> int:
        return len(self.dataset)

    def into(self, task: tuple[int, int | None]) -> Decoded:
        """``(row, slot)`` → the row decoded, its source written into ``slot`` of the arena where it fits (a decode
        worker's task; ``slot`` None: no slot was free)."""
        return self.__getitem__(*task)

    def cached(self, row: int) -> Decoded | None:
        """The row from the disk cache when every key's entry is there, else None (nothing is decoded, and no entry
        is read unless all exist)."""
        before = len(DAMAGED)
        sample, path, found = self._look(row, complete=True)
        self.damaged += len(DAMAGED) - before  # read again by a worker, which counts them there
        return found if isinstance(found, Decoded) else None

    def _look(self, row: int, complete: bool = False) -> tuple[Any, Path,
                                                               Decoded | tuple[dict[str, np.ndarray], str | None]]:
        """``(sample, path, found)``: ``found`` is the cached row, or the entries found so far and the content hash
        of an indexed file (both empty without a cache or an index record; ``complete``: no entry is read unless
        every one exists)."""
        sample = self.dataset[row]
        out: dict[str, np.ndarray] = {}
        path = Path(sample.image_path)
        folder = getattr(sample.reader, "__self__", None)
        if self.cache is None:
            return sample, path, (out, None)
        if hasattr(folder, "locate"):  # ImageFolder reader: the real file
            try:
                path = folder.locate(path.name)
            except MissingFileError:
                pass
        rec = self.cache.lookup(path) if path.is_file() else None
        if rec is None:
            return sample, path, (out, None)
        if complete and not all(self.cache.entry(key, rec["content"]).is_file() for key in self.inputs):
            return sample, path, (out, rec["content"])
        for key in self.inputs:
            arr = self.cache.load(key, rec["content"], self.inputs[key])
            if arr is None:
                return sample, path, (out, rec["content"])
            out[key] = arr
        return sample, path, Decoded(row, sample.case_id, out, None, tuple(rec["shape"]), False)

    def __getitem__(self, row: int, slot: int | None = None) -> Decoded:
        before = len(DAMAGED)
        item = self._item(row, slot)
        item.damaged = len(DAMAGED) - before
        return item

    def _item(self, row: int, slot: int | None) -> Decoded:
        sample, path, found = self._look(row)
        if isinstance(found, Decoded):
            return found
        out, content = found
        watch = Stopwatch(("read", "prep"))  # travels as the row's read_seconds / prep_seconds
        watch.start()
        try:
            st = path.stat() if self.cache is not None and path.is_file() else None
            src = sample.source()  # the file's integers; the float image only where a CPU-path model needs it
        except (MissingFileError, FormatError) as exc:
            if not self.skip_missing:
                raise
            return Decoded(row, sample.case_id, {}, f"{type(exc).__name__}: {exc}", None, True)
        watch.lap("read")
        if self.cache is not None and st is not None and content is None:
            content = content_hash(path)
            if file_identity(path.stat()) != file_identity(st):  # changed while we read it: do not cache
                content = None
        self._cpu_inputs(src, out, content)
        if content is not None:  # lookup() serves a record only once every key's entry exists
            self.cache.record(path, content, src.shape, st)
        source, slot, layout = self._hand_source(src, out, slot)
        watch.lap("prep")
        return Decoded(row, sample.case_id, out, None, src.shape, True, source, content, watch["read"],
                       watch["prep"], slot, layout)

    def _cpu_inputs(self, src: Any, out: dict[str, np.ndarray], content: str | None) -> None:
        """Each CPU-path key not held yet: ``preprocess`` of the one decoded image, encoded (and saved to the cache
        under ``content`` when known)."""
        image = None
        for key, spec in self.inputs.items():
            if key in out or key in self.device_keys:
                continue
            if image is None:
                image = src.image()
            out[key] = spec.encode(self.adapters[key].preprocess(image))
            if content is not None:
                self.cache.save(key, content, out[key])

    def _hand_source(self, src: Any, out: dict[str, np.ndarray], slot: int | None
                     ) -> tuple[torch.Tensor | None, int | None, tuple[tuple[int, ...], str] | None]:
        """``(source, slot, layout)``: the native-size source for the device keys still missing, written into the
        arena ``slot`` where it fits (``layout``), else a shared-memory tensor; all None when no device key needs it."""
        if not any(key not in out for key in self.device_keys):
            return None, None, None
        from .gpu_preprocess import upload_array

        array = np.ascontiguousarray(upload_array(src))
        if slot is not None and self.arena is not None and self.arena.fits(array):
            self.arena.write(slot, array)
            return None, slot, (tuple(array.shape), array.dtype.str)
        # a tensor crosses to the main process through shared memory (a numpy array would be pickled)
        return torch.from_numpy(array), None, None


def share_by_name() -> None:
    """In a decoding process: send tensors as named shared memory (``file_system``). The default (``file_descriptor``)
    makes the receiver fetch each tensor's descriptor from the sender's resource-sharer thread, an authenticated
    round trip that waits for the busy worker's GIL: measured at ~7 ms per image, serial in the receiving thread
    (docs/performance.md). Set in the worker only, so this process's own strategy is unchanged."""
    torch.multiprocessing.set_sharing_strategy("file_system")
