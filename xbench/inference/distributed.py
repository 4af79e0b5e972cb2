"""Ranks: which shard this process is (under ``torchrun`` or ``--shard i/n``), the store chunks each takes, joining the
torchrun group, the rank's GPU and the barrier.

``RANK``/``WORLD_SIZE`` set (world > 1): each rank takes its own shard of the chunks, and the ranks meet at a
monitored barrier (a gloo group, also under NCCL) once inference ends, so a crashed or stuck rank is an error naming
it after ``$XBENCH_BARRIER_TIMEOUT`` seconds, never a hang. Chunks are assigned from their costs alone
(:func:`assign_chunks`), so every rank and every independent shard agrees without talking.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch

from ..core.errors import XBenchError
from ..datasets import BaseDataset
from ..datasets.base import case_pixels

_GLOO_GROUP: Any = None


def dist_shard() -> tuple[int, int] | None:
    """(rank, world) under torchrun, else None."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    return (int(os.environ.get("RANK", "0")), world) if world > 1 else None


def barrier_timeout() -> float:
    """Seconds a rank waits at the barrier for the others: ``$XBENCH_BARRIER_TIMEOUT`` (default 3600)."""
    return float(os.environ.get("XBENCH_BARRIER_TIMEOUT", "3600"))


def init_distributed(device: torch.device) -> None:
    """Join the torchrun group (NCCL when the run's ``device`` is CUDA, else gloo), each rank on GPU ``LOCAL_RANK``,
    plus a gloo group for the monitored barrier."""
    global _GLOO_GROUP
    cuda = device.type == "cuda"
    if cuda and torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))  # "cuda" then means this rank's GPU
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group("nccl" if cuda else "gloo", timeout=timedelta(seconds=barrier_timeout()))
        _GLOO_GROUP = None  # a group of an earlier, destroyed process group is unusable
    if _GLOO_GROUP is None:
        _GLOO_GROUP = (torch.distributed.new_group(backend="gloo")
                       if torch.distributed.get_backend() != "gloo" else torch.distributed.group.WORLD)


def with_index(device: torch.device) -> torch.device:
    """``device`` with its index: plain ``cuda`` is this thread's current GPU (a distributed rank's ``LOCAL_RANK``,
    :func:`init_distributed`). CUDA's current device is per thread, and in a new thread it is GPU 0: the decoding
    and building threads are given the index. Other devices are returned as they are.

    >>> with_index(torch.device("cpu"))
    device(type='cpu')
    """
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def barrier(shard: tuple[int, int]) -> None:
    """Wait for every rank; a rank that crashed or hangs is an error naming it after the timeout, never a hang."""
    try:
        torch.distributed.monitored_barrier(group=_GLOO_GROUP, timeout=timedelta(seconds=barrier_timeout()),
                                            wait_all_ranks=True)
    except RuntimeError as exc:
        raise XBenchError(
            f"rank {shard[0]} of {shard[1]}: not every rank reached the end of inference within "
            f"{barrier_timeout():g} s (XBENCH_BARRIER_TIMEOUT) — a rank crashed or is stuck ({exc}). The chunks every "
            "rank finished are in the store; run the same command again to resume, or evaluate with `xbench merge`."
        ) from exc


@dataclass(frozen=True)
class RankShare:
    """This process's part of a run: its ``shard`` (index, count), whether it is a torchrun rank, its device (with
    the index: :func:`with_index`) and, per dataset, the store chunks it infers."""

    shard: tuple[int, int]
    distributed: bool
    device: torch.device
    chunks: tuple[tuple[int, ...], ...]


def rank_share(shard: tuple[int, int] | None, device: torch.device,
               costs: Sequence[Sequence[tuple[float, float]]]) -> RankShare:
    """This process's share of chunks whose ``costs`` are given per dataset (:func:`chunk_costs`): shard ``(i, n)``
    as given, else this torchrun rank (the group joined on ``device``, the run's device), else the whole run."""
    dist = dist_shard() if shard is None else None
    if dist is not None:
        shard = dist
        init_distributed(device)
    shard = shard or (0, 1)
    if not 0 <= shard[0] < shard[1]:
        raise XBenchError(f"shard index must satisfy 0 <= i < n, got {shard[0]}/{shard[1]}")
    on = with_index(device)  # the decoding and building threads use it too
    owner = assign_chunks(costs, shard[1])  # the same on every rank
    chunks = tuple(tuple(k for (d, k), rank in owner.items() if d == i and rank == shard[0]) for i in range(len(costs)))
    return RankShare(shard, dist is not None, on, chunks)


def chunk_costs(dataset: BaseDataset, chunk_size: int) -> list[tuple[float, float]]:
    """What each store chunk of ``dataset`` costs a rank: ``(pixels, cases)``. Decoding grows with the images' pixels
    (``height × width`` of the case table; the case count when the table has no sizes), the models' passes with the
    cases."""
    pixels = case_pixels(dataset)
    return [(float(pixels[k: k + chunk_size].sum()), float(min(chunk_size, len(dataset) - k)))
            for k in range(0, len(dataset), chunk_size)]


def assign_chunks(costs: Sequence[Sequence[float | Sequence[float]]], ranks: int) -> dict[tuple[int, int], int]:
    """Rank of every ``(dataset index, chunk)``, balancing every resource a chunk costs at once.

    A chunk's cost is a number or a tuple of numbers (:func:`chunk_costs`: pixels to decode, cases to infer). Each
    resource is taken as a share of its total over all chunks. Chunks go by decreasing largest share (ties in dataset,
    then chunk order), each to the rank whose largest share would be smallest with it (then the smallest sum of
    shares, then the lowest rank). With one resource this is longest processing time first. Balancing pixels alone
    gave one of four ranks 1.8 times the cases of another (4 × H200, half-scale stand-ins).

    Deterministic from the costs alone, so independent shards (``--shard i/n``) agree without talking. A chunk is
    written whole by one rank, so stores do not depend on the number of ranks.

    >>> owner = assign_chunks([[9.0, 1.0, 1.0], [5.0, 4.0]], 2)
    >>> [owner[(0, 0)], owner[(1, 0)], owner[(1, 1)], owner[(0, 1)], owner[(0, 2)]]
    [0, 1, 1, 0, 1]
    >>> owner = assign_chunks([[(8.0, 1.0), (8.0, 1.0)], [(1.0, 4.0), (1.0, 4.0)]], 2)  # (pixels, cases)
    >>> sorted(owner.items())
    [((0, 0), 0), ((0, 1), 1), ((1, 0), 0), ((1, 1), 1)]
    """
    if ranks < 1:
        raise ValueError(f"ranks must be >= 1, got {ranks}")
    vectors = {(d, k): (tuple(float(x) for x in c) if isinstance(c, Sequence) else (float(c),))
               for d, row in enumerate(costs) for k, c in enumerate(row)}
    dims = max((len(v) for v in vectors.values()), default=1)
    if any(len(v) != dims for v in vectors.values()):
        raise ValueError("every chunk's cost must name the same resources")
    totals = [sum(v[i] for v in vectors.values()) or 1.0 for i in range(dims)]
    share = {key: tuple(v[i] / totals[i] for i in range(dims)) for key, v in vectors.items()}
    load = [[0.0] * dims for _ in range(ranks)]
    owner: dict[tuple[int, int], int] = {}
    for key in sorted(share, key=lambda key: (-max(share[key]), key)):
        after = [[load[r][i] + share[key][i] for i in range(dims)] for r in range(ranks)]
        rank = min(range(ranks), key=lambda r: (max(after[r]), sum(after[r]), r))
        owner[key] = rank
        load[rank] = after[rank]
    return owner
