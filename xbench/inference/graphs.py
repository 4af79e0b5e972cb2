"""A model's batch step recorded once in a CUDA graph and replayed (the run config's ``cuda_graphs``).

A replay launches every kernel the recorded :meth:`~xbench.models.base.Adapter.predict_on_device` call launched, on
a fixed input buffer, in one call from Python. The model's step then no longer waits for the interpreter to launch
its kernels one by one, which is what decoding, builds and cache reads in the same process slow down.

Conventions (:class:`GraphedPredict`):

* only batches of the planned size (``batch_size``, the same shape, dtype and layout as the recorded one) are
  replayed; a smaller batch (a chunk's last) runs eagerly;
* the first ``warmup`` full batches run eagerly, on the stream the graph is then recorded on: they fill the
  adapter's caches (prompt features, index tensors) and let the libraries set up their work on that stream;
* a replay's outputs are the same bytes as the eager call's (the same kernels on the same inputs): checked for every
  network on CUDA by ``tests/models/test_contract.py`` and over whole runs by ``benchmarks/bench_gpu.py``'s stores;
* a recording that fails leaves the pair eager for the rest of its batches, with the reason in the run log; nothing
  recorded by a failed recording is ever read;
* the outputs of a replay live in the graph's memory and are overwritten by the next replay: the caller copies them
  before its next call (the runner copies each batch to the host at once);
* what the recorded call reads outside the graph's own memory stays in place while the graph lives: the weights,
  and the text features and index tensors the adapters cache (kept for the adapter's life, never replaced:
  :class:`~xbench.models._common.PromptCache`); the runner holds a graph only for its pair's steps.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch

from ..models.base import Adapter, Prediction

__all__ = ["GraphedPredict", "CudaRecorder", "graph_use"]

_STREAMS: dict[int, torch.cuda.Stream] = {}
_STREAMS_LOCK = threading.Lock()


class Recorder(Protocol):
    def eager(self, fn: Callable[[torch.Tensor], Prediction], pixels: torch.Tensor) -> Prediction: ...

    def record(self, fn: Callable[[torch.Tensor], Prediction], static: torch.Tensor) -> tuple[Any, Prediction]: ...

    def replay(self, graph: Any) -> None: ...


def graph_use(device: torch.device, adapter: Adapter, precision: str, asked: bool) -> str | None:
    """Why a pair's steps are not replayed from a CUDA graph, or None when they are.

    >>> graph_use(torch.device("cpu"), None, "fp32", True)
    'the run device is not CUDA'
    """
    if not asked:
        return "cuda_graphs: false"
    if device.type != "cuda":
        return "the run device is not CUDA"
    if precision not in ("fp32", "tf32"):
        return f"precision {precision} runs under autocast"
    if not type(adapter).graph_ready():
        return f"{type(adapter).__name__} has no predict_on_device"
    return None


def _capture_stream(device: torch.device) -> torch.cuda.Stream:
    """One side stream per CUDA device for the warm-up batches and the recordings."""
    index = torch.device(device).index
    index = torch.cuda.current_device() if index is None else index
    with _STREAMS_LOCK:
        if index not in _STREAMS:
            _STREAMS[index] = torch.cuda.Stream(device=index)
        return _STREAMS[index]


class CudaRecorder:
    """Eager calls and recordings on the device's side stream, ordered after and before the caller's stream."""

    def __init__(self, device: torch.device):
        self.device = device
        self.stream = _capture_stream(device)

    def _enter(self, pixels: torch.Tensor) -> torch.cuda.Stream:
        current = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(current)
        pixels.record_stream(self.stream)
        return current

    def _leave(self, current: torch.cuda.Stream, out: Prediction) -> None:
        current.wait_stream(self.stream)
        for tensor in (out.scores, out.maps):
            tensor.record_stream(current)

    def eager(self, fn: Callable[[torch.Tensor], Prediction], pixels: torch.Tensor) -> Prediction:
        current = self._enter(pixels)
        with torch.cuda.stream(self.stream):
            out = fn(pixels)
        self._leave(current, out)
        return out

    def record(self, fn: Callable[[torch.Tensor], Prediction], static: torch.Tensor) -> tuple[Any, Prediction]:
        """The graph of ``fn(static)`` and its output tensors (not yet computed: the caller replays it).

        ``torch.cuda.graph`` is not used: it collects garbage and empties the allocator's cache before every
        recording, and a run records one graph per (dataset, model) pair while other threads use the device.
        Recording is ``thread_local``: only this thread is kept from calls that cannot be recorded.
        """
        graph = torch.cuda.CUDAGraph()
        current = self._enter(static)
        with torch.cuda.stream(self.stream):
            graph.capture_begin(capture_error_mode="thread_local")
            try:
                out = fn(static)
            except BaseException:
                try:
                    graph.capture_end()
                except RuntimeError:
                    pass  # the failed call already ended the recording
                raise
            graph.capture_end()
        self._leave(current, out)
        return graph, out

    def replay(self, graph: Any) -> None:
        graph.replay()


class GraphedPredict:
    """``adapter.predict_on_device(pixels, prompts)`` for a run's batches, replayed from a CUDA graph where it can be
    (the module docstring states when); ``__call__`` returns the batch's outputs on the device.

    ``recorder`` does the device work (:class:`CudaRecorder` for ``device``; tests pass a stand-in). The counts for
    the run log: ``replayed`` and ``eager`` batches, and ``failed`` (the recording's error) when one failed.
    """

    def __init__(self, adapter: Adapter, prompts: Sequence[str], batch_size: int, device: torch.device, *,
                 warmup: int = 2, recorder: Recorder | None = None):
        self.adapter, self.prompts, self.batch_size, self.warmup = adapter, list(prompts), batch_size, warmup
        self.recorder = recorder if recorder is not None else CudaRecorder(device)
        self.replayed = 0
        self.eager = 0
        self.failed: str | None = None
        self._full_seen = 0
        self._graph: Any = None
        self._static: torch.Tensor | None = None
        self._out: Prediction | None = None

    def _predict(self, pixels: torch.Tensor) -> Prediction:
        return self.adapter.predict_on_device(pixels, self.prompts)

    def _fits(self, pixels: torch.Tensor) -> bool:
        static = self._static
        if static is None:
            return pixels.shape[0] == self.batch_size
        return (pixels.shape == static.shape and pixels.dtype == static.dtype and pixels.device == static.device
                and pixels.stride() == static.stride())

    def __call__(self, pixels: torch.Tensor) -> Prediction:
        if self.failed is not None or not self._fits(pixels):
            self.eager += 1
            return self.recorder.eager(self._predict, pixels)
        if self._graph is None:
            if self._full_seen < self.warmup:
                self._full_seen += 1
                self.eager += 1
                return self.recorder.eager(self._predict, pixels)
            static = torch.empty_like(pixels)
            static.copy_(pixels)
            try:
                self._graph, self._out = self.recorder.record(self._predict, static)
            except Exception as exc:  # noqa: BLE001 - any failure leaves the pair eager, with the reason logged
                self.failed = f"{type(exc).__name__}: {exc}"[:500]
                self.eager += 1
                return self.recorder.eager(self._predict, pixels)
            self._static = static
        else:
            self._static.copy_(pixels)
        self.recorder.replay(self._graph)
        self.replayed += 1
        assert self._out is not None
        return self._out

    def counts(self) -> dict[str, Any]:
        """``{"replayed": n, "eager": m}``, and ``"failed"`` with the recording's error when it failed."""
        out: dict[str, Any] = {"replayed": self.replayed, "eager": self.eager}
        if self.failed is not None:
            out["failed"] = self.failed
        return out

    def close(self) -> None:
        """Drop the graph and its buffers (their memory goes back to the allocator)."""
        self._graph = self._static = self._out = None
