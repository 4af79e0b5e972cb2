"""Fixed-size slots in one shared, page-locked block: decode workers write a row's source where it is uploaded from.

Why: a decoded native-size source (up to 3,072² 16-bit, 18.9 MB) used to travel from a decoding process to the
decoding thread as a tensor in named shared memory. The worker copied it into a fresh segment (~5–6 ms for 18 MB on
an H100 host), the thread mapped the segment, copied it into a pinned block, and unmapped
it again: on one H100 that receiving, copying and unmapping took about a third of the decoding thread's wall
(profiled).

Here one block of ``slots × slot_bytes`` bytes is mapped shared and anonymous before the decoding processes are
forked, so every worker inherits it, and on CUDA it is page-locked once (``cudaHostRegister``). The decoding thread
hands a free slot with each row it sends; the worker writes the row's source into that slot and sends back only its
shape and dtype; the thread uploads from the slot and frees it once the upload is known to be done (the stack's codes
are back). Nothing of the source passes through a pipe or a shared-memory segment.

Conventions
-----------
* A slot is written by exactly one worker between :meth:`SlotArena.take` and :meth:`SlotArena.give`; the thread that
  took it gives it back (after the device has read it, or at once when the worker did not use it).
* A source larger than ``slot_bytes``, or a row sent while every slot is taken, travels as before (a tensor in
  shared memory): slower, never wrong.
* One arena per process and kind (page-locked or not), made on first use and kept (:func:`shared_arena`), like
  torch's caching allocators; feeds made later reuse it, and processes forked later inherit it.
  :func:`release_arenas` frees the idle ones (a notebook that has finished its runs).
* If page-locking fails (the driver refuses the size), the arena is used unlocked and this is logged once: the
  stage then stacks the sources into a pinned block as before. Never an error.
"""
from __future__ import annotations

import logging
import mmap
import threading
from collections import deque

import numpy as np
import torch

__all__ = ["SlotArena", "shared_arena", "release_arenas", "SLOT_BYTES"]

logger = logging.getLogger(__name__)

SLOT_BYTES = 3072 * 3072 * 2  # one 3,072² 16-bit source (the largest VinDr-CXR size of the stand-ins)


class SlotArena:
    """``slots`` slots of ``slot_bytes`` bytes each in one shared mapping; page-locked when ``pin`` (CUDA) and the
    driver accepts it (:attr:`pinned`)."""

    def __init__(self, slots: int, slot_bytes: int = SLOT_BYTES, *, pin: bool = False):
        if slots < 1 or slot_bytes < 1:
            raise ValueError(f"a slot arena needs at least one slot of one byte, got {slots} x {slot_bytes}")
        self.slots, self.slot_bytes = int(slots), int(slot_bytes)
        self._map = mmap.mmap(-1, self.slots * self.slot_bytes, flags=mmap.MAP_SHARED)
        self.block = np.frombuffer(self._map, dtype=np.uint8)
        self.pinned = False
        if pin:
            result = torch.cuda.cudart().cudaHostRegister(self.block.ctypes.data, self.block.nbytes, 1)  # portable
            if int(result) == 0:
                self.pinned = True
            else:
                logger.warning("page-locking %d bytes for decoded sources failed (%s): they are uploaded through a "
                               "pinned copy instead", self.block.nbytes, result)
        self._host = torch.from_numpy(self.block)
        self._free: deque[int] = deque(range(self.slots))
        self._lock = threading.Lock()
        self._closed = False

    @property
    def free(self) -> int:
        """Slots not taken now."""
        with self._lock:
            return len(self._free)

    def take(self) -> int | None:
        """A free slot, or None when every slot is taken or the arena is closed (the row then travels the slower
        way)."""
        with self._lock:
            return self._free.popleft() if self._free and not self._closed else None

    def give(self, slot: int) -> None:
        """Free ``slot`` (taken by this caller; the device has finished reading it)."""
        if not 0 <= slot < self.slots:
            raise ValueError(f"no slot {slot} in an arena of {self.slots}")
        with self._lock:
            self._free.append(slot)

    def fits(self, array: np.ndarray) -> bool:
        """Whether ``array`` fits one slot."""
        return array.nbytes <= self.slot_bytes

    def write(self, slot: int, array: np.ndarray) -> None:
        """Copy ``array`` into ``slot`` (in a decode worker; the caller checked :meth:`fits`)."""
        if not self.fits(array):
            raise ValueError(f"{array.nbytes} bytes do not fit a slot of {self.slot_bytes}")
        start = slot * self.slot_bytes
        np.copyto(self.block[start: start + array.nbytes].view(array.dtype).reshape(array.shape), array)

    def view(self, slot: int, shape: tuple[int, ...], dtype: str) -> torch.Tensor:
        """The tensor written into ``slot`` (no copy; page-locked when the arena is)."""
        dt = np.dtype(dtype)
        count = int(np.prod(shape, dtype=np.int64))
        if count * dt.itemsize > self.slot_bytes:
            raise ValueError(f"shape {shape} of {dt} does not fit a slot of {self.slot_bytes} bytes")
        start = slot * self.slot_bytes
        return self._host[start: start + count * dt.itemsize].view(_TORCH_DTYPES[dt.str]).view(shape)

    def close(self, *, only_if_idle: bool = False) -> bool:
        """Unlock the block and unmap it (at once, or once the last view of it is dropped); no slot is taken
        afterwards. With ``only_if_idle`` nothing is done while a slot is taken. Returns whether it was closed now."""
        with self._lock:  # idle and closed at once: a feed holding the arena takes no slot afterwards
            if self._closed or (only_if_idle and len(self._free) != self.slots):
                return False
            self._closed = True
        self._unmap()
        return True

    def _unmap(self) -> None:
        if self.pinned:
            torch.cuda.cudart().cudaHostUnregister(self.block.ctypes.data)
            self.pinned = False
        del self._host, self.block
        try:
            self._map.close()
        except BufferError:  # views are still held: the mapping goes with the last of them
            pass


_TORCH_DTYPES = {np.dtype(np.uint8).str: torch.uint8, np.dtype(np.uint16).str: torch.uint16}

_ARENAS: dict[bool, SlotArena] = {}
_ARENAS_LOCK = threading.Lock()


def shared_arena(slots: int, *, pin: bool, slot_bytes: int = SLOT_BYTES) -> SlotArena:
    """This process's arena of the given kind, made with ``slots`` slots on first use and reused afterwards (a
    later, larger request reuses the first arena: rows beyond it travel the slower way)."""
    with _ARENAS_LOCK:
        arena = _ARENAS.get(pin)
        if arena is None:
            arena = _ARENAS[pin] = SlotArena(slots, slot_bytes, pin=pin)
        return arena


def release_arenas() -> int:
    """Unlock and unmap this process's arenas that no feed is using (every slot free); returns the bytes released.
    The next feed that needs one makes it again (page-locking 2 GB took 0.93 s on the H100 host)."""
    released = 0
    with _ARENAS_LOCK:
        for kind, arena in list(_ARENAS.items()):
            if arena.close(only_if_idle=True):
                released += arena.slots * arena.slot_bytes
                del _ARENAS[kind]
    return released
