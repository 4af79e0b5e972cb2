"""The run's record: ``run_log.json`` (one entry per (dataset, model), in the order inferred), the skipped cases'
CSV and the timings, kept here instead of in the code that does the work.

Timing is attached, not written inline: a :class:`RunClock` starts when the run does (preflight included) and gives
each dataset's end; :class:`BuildTimes` sums each model's build seconds and notes when it was first ready; a pair's
:class:`PairTimes` splits its wall time into waiting for inputs and its own steps; the decode stage's parts (the
feed, its worker pool, its device stage) each hold a :class:`Stopwatch` of named steps, read into the run log's
``decode_profile``. The keys a run log entry gets
here (after the pair's own counts, :meth:`xbench.inference.stepper.PairRun.finish`) are those of
:meth:`RunRecorder.dataset_done`.
"""
from __future__ import annotations

import csv
import json
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from ..core.atomic import atomic_write_bytes
from ..core.errors import FormatError
from .skips import write_skips_csv

T = TypeVar("T")


class Stopwatch(dict):
    """Seconds per named step, summed over calls (a ``dict`` of step -> seconds, so it is read and logged as one).

    ``with watch("read"): ...`` adds the block's wall seconds to ``watch["read"]`` (also when it raises);
    ``watch.start()`` then ``watch.lap("pin")``, ``watch.lap("upload")``, ... add the seconds since the previous mark
    to each step in turn (consecutive steps of one pass); :meth:`add` adds seconds measured elsewhere. Steps not
    named at construction start at 0 when first timed. One thread times one watch.

    >>> watch = Stopwatch(("read", "prep"))
    >>> with watch("read"):
    ...     pass
    >>> watch.start(); _ = watch.lap("prep"); _ = watch.lap("wait")
    >>> list(watch), all(seconds >= 0 for seconds in watch.values())
    (['read', 'prep', 'wait'], True)
    """

    def __init__(self, steps: Sequence[str] = ()) -> None:
        super().__init__(dict.fromkeys(steps, 0.0))
        self._mark = 0.0

    @contextmanager
    def __call__(self, step: str) -> Iterator[None]:
        began = time.perf_counter()
        try:
            yield
        finally:
            self.add(step, time.perf_counter() - began)

    def start(self) -> None:
        """Set the mark the next :meth:`lap` counts from."""
        self._mark = time.perf_counter()

    def lap(self, step: str) -> float:
        """Add the seconds since the last mark to ``step``, move the mark to now; returns those seconds."""
        now = time.perf_counter()
        seconds, self._mark = now - self._mark, now
        self.add(step, seconds)
        return seconds

    def add(self, step: str, seconds: float) -> None:
        self[step] = self.get(step, 0.0) + seconds


class RunClock:
    """When the run started: ``since_start_seconds`` in the run log count from here, and ``run_started_unix`` is the
    same moment on the wall clock (ranks' start-ups can be compared)."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.started_unix = round(time.time(), 3)

    def since_start(self) -> float:
        """Seconds since the run started, rounded to the millisecond."""
        return round(time.perf_counter() - self.started, 3)


class BuildTimes:
    """Per model spec (by identity): wall seconds spent building it, summed over datasets (``build_seconds``), and
    when its network was first built (``built_since_start_seconds``)."""

    def __init__(self, clock: RunClock):
        self.clock = clock
        self.seconds: dict[int, float] = {}
        self.ready_at: dict[int, float] = {}

    def timed(self, key: int, make: Callable[[], T]) -> T:
        """``make()``, its seconds added to model ``key``'s build time."""
        began = time.perf_counter()
        made = make()
        self.seconds[key] = self.seconds.get(key, 0.0) + time.perf_counter() - began
        return made

    def note_built(self, key: int) -> None:
        """Note model ``key`` built (its first time only)."""
        self.ready_at.setdefault(key, self.clock.since_start())


class PairTimes:
    """One pair's seconds: ``wait`` for its inputs (decoding; with a feed also stacking and upload) and ``model`` in
    its own steps, inputs excluded."""

    def __init__(self) -> None:
        self.model = 0.0
        self.wait = 0.0

    @contextmanager
    def waiting(self) -> Iterator[None]:
        began = time.perf_counter()
        yield
        self.wait += time.perf_counter() - began

    @contextmanager
    def working(self) -> Iterator[None]:
        began = time.perf_counter()
        yield
        self.model += time.perf_counter() - began

    def counts(self) -> dict[str, float]:
        """The run log's ``seconds``, ``model_seconds`` and ``decode_seconds`` of the pair."""
        return {"seconds": round(self.model + self.wait, 3), "model_seconds": round(self.model, 3),
                "decode_seconds": round(self.wait, 3)}


class RunRecorder:
    """Collects the run log and the skipped cases of this rank, and writes them once the run ends (:meth:`write`:
    ``run_log.json`` and ``skipped_cases.csv``; ``.shard<i>of<n>`` before the suffix for a shard)."""

    def __init__(self, output_dir: Path, shard: tuple[int, int], clock: RunClock, builds: BuildTimes,
                 images: Mapping[str, Any] | None):
        self.output_dir, self.shard, self.clock, self.builds, self.images = output_dir, shard, clock, builds, images
        self.log: list[dict[str, Any]] = []
        self.skipped_rows: list[dict[str, str]] = []

    def dataset_done(self, dataset_name: str, skipped_records: Mapping[str, Any], models: Sequence[Any],
                     adapters: Sequence[Any], entries: Sequence[dict[str, Any]], twinned: set[int], feed: Any,
                     left_out: Mapping[str, str]) -> None:
        """One dataset's entries (one per model, from its pair) completed with what the run knows of it: builds,
        the dataset's end since the run started (one end for all its models), its feed's counts, the preflight's
        images; then an entry per model left out."""
        done_at = self.clock.since_start()
        for mspec, adapter, entry in zip(models, adapters, entries):
            key = id(mspec)
            self.skipped_rows += entry.pop("skipped_cases", [])
            entry["build_seconds"] = round(self.builds.seconds.get(key, 0.0), 3)  # cumulative for the model
            entry["since_start_seconds"] = done_at
            entry["run_started_unix"] = self.clock.started_unix
            entry["dataset_skipped_records"] = dict(skipped_records)
            entry["weights_label"] = adapter.weights_label
            entry["built_while_decoding"] = key in twinned
            entry["built_since_start_seconds"] = self.builds.ready_at.get(key)  # this rank's first build of the model
            entry["decode_once"] = dict(feed.stats) if feed is not None else None  # cumulative for the dataset
            if feed is not None:
                entry["decode_profile"] = {k: round(v, 3) for k, v in feed.profile.items()}  # cumulative, seconds
            if feed is not None and feed.plans:
                entry["preprocessed_on"] = {"device": str(feed.preprocess_device), "inputs": feed.device_inputs}
            if self.images is not None:
                entry["preflight_images"] = self.images.get(dataset_name)
            self.log.append(entry)
        self.log += [{"dataset": dataset_name, "model": name, "weights_label": "absent", "left_out": why}
                     for name, why in left_out.items()]

    def write(self) -> None:
        """``run_log.json`` and ``skipped_cases.csv`` (this shard's, when sharded)."""
        suffix = "" if self.shard == (0, 1) else f".shard{self.shard[0]}of{self.shard[1]}"
        atomic_write_bytes(self.output_dir / f"run_log{suffix}.json", json.dumps(self.log, indent=1, default=str).encode())
        write_skips_csv(self.output_dir / f"skipped_cases{suffix}.csv", self.skipped_rows)


def merge_run_logs(output_dir: Path, sources: Sequence[str | Path]) -> tuple[Path, Path] | None:
    """Join the shards' ``run_log.shardIofN.json`` and ``skipped_cases.shardIofN.csv`` (from ``output_dir`` and
    each of ``sources``) into ``output_dir``'s ``run_log.json`` and ``skipped_cases.csv``, as one unsharded run
    writes them; each log entry gains ``shard`` (``"IofN"``). A source without shard files contributes its plain
    ``run_log.json`` / ``skipped_cases.csv``. Returns the two paths, or None when no source has a log."""
    out = Path(output_dir).resolve()
    log: list[dict[str, Any]] = []
    skipped: dict[tuple, dict[str, str]] = {}
    folders = list(dict.fromkeys([out, *(Path(s).resolve() for s in sources)]))
    for folder in folders:
        logs = sorted(folder.glob("run_log.shard*.json"))
        if not logs and folder != out and (folder / "run_log.json").is_file():
            logs = [folder / "run_log.json"]
        for path in logs:
            shard = path.name[len("run_log."):-len(".json")].removeprefix("shard") if path.name != "run_log.json" else None
            try:
                entries = json.loads(path.read_text(encoding="utf-8"))
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise FormatError(f"{path}: not a run log ({exc})") from exc
            log += [{**e, "shard": shard} if shard else dict(e) for e in entries]
        csvs = sorted(folder.glob("skipped_cases.shard*.csv"))
        if not csvs and folder != out and (folder / "skipped_cases.csv").is_file():
            csvs = [folder / "skipped_cases.csv"]
        for path in csvs:
            with open(path, newline="", encoding="utf-8") as fh:
                for row in csv.DictReader(fh):
                    skipped[tuple(row.get(c, "") for c in ("dataset", "model", "case_id"))] = row
    if not log and not skipped:
        return None
    atomic_write_bytes(out / "run_log.json", json.dumps(log, indent=1, default=str).encode())
    return out / "run_log.json", write_skips_csv(out / "skipped_cases.csv", list(skipped.values()))
