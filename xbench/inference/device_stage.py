"""Device preprocessing of decoded rows in stacks, without waiting on the device per image.

The decoding thread of :class:`xbench.inference.input_feed.InputFeed` hands every decoded row that still needs device
codes to a :class:`DeviceStage`. Rows whose native-size sources have one shape and dtype are stacked (up to
``max_images`` and ``max_pixels``), copied once into pinned memory, uploaded in one copy (sources already
page-locked, in :mod:`~xbench.inference.pinned_slots` slots, are uploaded one by one from where they are), and run
through each distinct plan once per stack. The codes come back in one copy to pinned memory, and a CUDA event marks their
arrival. The thread waits on an event only when more than ``depth`` stacks are in flight. Upload, kernels and copy
back therefore overlap the models and the next rows' decoding instead of stalling the thread once per image.

Timings: :attr:`DeviceStage.seconds` splits the thread's time in the stage by step (``pin``: the pinned block and
the stack copy into it; ``upload``; ``kernels``: launching the plans; ``copy_back``: the pinned block for the codes
and the copy's launch; ``wait``: waiting on events; ``publish``: the codes out of the pinned block and handed on).
On CUDA the launches are asynchronous, so these are the thread's own seconds, not the device's.

Bytes: every kernel of :mod:`xbench.inference.gpu_preprocess` is elementwise or an exact integer sum per image, so
a stack gives each image its own codes (``test_plans_on_a_stack_equal_each_image``) and stores do not depend on
how rows were grouped. On a CPU device the same code runs synchronously.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from .recorder import Stopwatch

__all__ = ["DeviceStage", "STEPS"]

STEPS = ("pin", "upload", "kernels", "copy_back", "wait", "publish")  # DeviceStage.seconds, in a stack's order


class DeviceStage:
    """Stacks of equal-size sources through the device plans; ``done(item, keys)`` is called for every finished row
    with the device keys whose codes were put into ``item.inputs`` (each row exactly once, in completion order).

    Parameters
    ----------
    plans : mapping of transform key to plan
        Equal plans are computed once per stack.
    device : torch.device
    done : callable
        Receives ``(item, keys)``; ``item.source`` is None by then.
    max_images, max_pixels : int
        A stack is launched once it holds ``max_images`` rows or its next row would pass ``max_pixels`` source pixels;
        all partial stacks are launched once ``2 * max_images`` rows are held.
    depth : int
        Stacks in flight before the thread waits for the oldest.
    """

    def __init__(self, plans: Mapping[str, Any], device: torch.device, done: Callable[[Any, list[str]], None], *,
                 max_images: int = 16, max_pixels: int = 1 << 25, depth: int = 3):
        self.plans, self.device, self.done = dict(plans), torch.device(device), done
        self.max_images, self.max_pixels, self.depth = max(1, int(max_images)), int(max_pixels), max(0, int(depth))
        self.cuda = self.device.type == "cuda"
        self.groups: dict[tuple[tuple[int, ...], torch.dtype], list[tuple[Any, list[str]]]] = {}
        self.held = 0
        self.flight: deque[tuple[list[tuple[Any, list[str]]], dict[Any, tuple[slice, tuple[int, ...]]], torch.Tensor,
                                 Any]] = deque()
        self.device_inputs = 0  # model inputs computed (equal plans counted once per image)
        self.stacks = 0
        self.seconds = Stopwatch(STEPS)  # this thread's seconds per step (module docstring)

    def put(self, item: Any) -> None:
        """Queue one row (``item.source``: its uploaded array; ``item.inputs``: keys already held)."""
        wanted = [key for key in self.plans if key not in item.inputs]
        source = item.source
        group = self.groups.setdefault((tuple(source.shape), source.dtype), [])
        group.append((item, wanted))
        self.held += 1
        room = max(1, min(self.max_images, self.max_pixels // max(1, source.numel())))
        if len(group) >= room:
            self._launch(self.groups.pop((tuple(source.shape), source.dtype)))
        if self.held >= 2 * self.max_images:
            for key in list(self.groups):
                self._launch(self.groups.pop(key))
        self._retire(wait=False)

    def drain(self) -> None:
        """Launch every partial stack and finish every row."""
        for key in list(self.groups):
            self._launch(self.groups.pop(key))
        self._retire(wait=True)

    def _launch(self, rows: list[tuple[Any, list[str]]]) -> None:
        self.held -= len(rows)
        sources = [item.source for item, _ in rows]
        self.seconds.start()
        if self.cuda and all(source.is_pinned() for source in sources):  # arena slots: uploaded from where they are
            self.seconds.lap("pin")
            stack = torch.empty((len(sources), *sources[0].shape), dtype=sources[0].dtype, device=self.device)
            for i, source in enumerate(sources):
                stack[i].copy_(source, non_blocking=True)
        elif self.cuda:
            host = torch.empty((len(sources), *sources[0].shape), dtype=sources[0].dtype, pin_memory=True)
            torch.stack(sources, out=host)
            self.seconds.lap("pin")
            stack = host.to(self.device, non_blocking=True)
        else:
            host = torch.stack(sources)
            self.seconds.lap("pin")
            stack = host.to(self.device)
        self.seconds.lap("upload")
        for item, _ in rows:
            item.source = None  # its shared memory is released as soon as the stack holds it (a slot: once done)
        plans: dict[Any, None] = {}
        for _, wanted in rows:
            for key in wanted:
                plans.setdefault(self.plans[key])
        layout: dict[Any, tuple[slice, tuple[int, ...]]] = {}  # plan -> (its columns of a row, one image's shape)
        outs, at = [], 0
        for plan in plans:
            codes = plan(stack)
            outs.append(codes.reshape(len(rows), -1))
            layout[plan] = (slice(at, at + outs[-1].shape[1]), tuple(codes.shape[1:]))
            at += outs[-1].shape[1]
        flat = torch.cat(outs, dim=1) if len(outs) > 1 else outs[0]
        self.seconds.lap("kernels")
        event = None
        if self.cuda:
            back = torch.empty(flat.shape, dtype=flat.dtype, pin_memory=True)
            back.copy_(flat, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
        else:
            back = flat.cpu()
        self.flight.append((rows, layout, back, event))
        self.stacks += 1
        self.seconds.lap("copy_back")

    def _retire(self, *, wait: bool) -> None:
        while self.flight:
            rows, layout, back, event = self.flight[0]
            if event is not None and not (wait or len(self.flight) > self.depth or event.query()):
                return
            if event is not None:
                with self.seconds("wait"):
                    event.synchronize()
            with self.seconds("publish"):
                self.flight.popleft()
                self._publish(rows, layout, back)

    def _publish(self, rows: list[tuple[Any, list[str]]], layout: dict[Any, tuple[slice, tuple[int, ...]]],
                 back: torch.Tensor) -> None:
        """The codes of one finished stack into each row's ``inputs`` (equal plans shared), each row handed on."""
        codes = back.numpy().copy()  # out of the pinned block, which is reused once ``back`` is freed
        for i, (item, wanted) in enumerate(rows):
            per_plan: dict[Any, np.ndarray] = {}
            for key in wanted:
                plan = self.plans[key]
                if plan not in per_plan:
                    columns, shape = layout[plan]
                    per_plan[plan] = codes[i, columns].reshape(shape)
                    self.device_inputs += 1
                item.inputs[key] = per_plan[plan]
            self.done(item, wanted)
