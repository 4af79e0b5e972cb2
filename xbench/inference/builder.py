"""The model builder: each runnable model's network, built once for every dataset, in the foreground, in a background
thread, or first stood in for by an *input twin* while its inputs decode.

A model without ``fit_split`` is built once and serves every dataset; a ``fit_split`` baseline is fitted on its
dataset's split (:func:`open_model`) and built again for each dataset. On a fresh dataset that decodes ahead
(:mod:`xbench.inference.feeds`), each model that has an input twin (:func:`xbench.models.base.input_twin`: its
preprocessing without its network) is built in one background thread (:func:`build_behind`), smallest weight files
first, while the feed decodes for its twin; the others are built first, in the calling thread.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from pathlib import Path

import torch

from ..core.errors import XBenchError
from ..datasets import open_dataset
from ..models import Adapter, create_model
from ..models.base import input_twin
from ..spec.config import DatasetSpec, ModelSpec
from ..spec.registry import dataset_manifest, import_target, model_config
from ..models.base import weight_files
from ..store.fingerprint import fit_key, fitted_is_current, refit
from .recorder import BuildTimes

Building = dict[int, tuple[Future, Adapter]]  # model index -> (its build in the background, its input twin)


def open_model(spec: ModelSpec, device: torch.device, dspec: DatasetSpec | None = None,
               output_dir: str | Path | None = None, *, overwrite: bool = False) -> Adapter:
    """Build a model named in a run config.

    A spec with ``fit_split`` (a baseline whose class has ``fit(dataset)`` and ``save(folder)``) is fitted
    on that split of ``dspec``'s dataset and saved under ``<output_dir>/fitted/<dataset>/<model>/`` with a
    ``fit.json`` of what it was fitted on (:func:`xbench.store.fingerprint.fit_key`); it is refitted when that
    differs (other dataset options, root content, params) or with ``overwrite``.
    """
    if spec.explainer is not None:  # the model built as below, its maps made by a post-hoc explainer
        from ..explain import explained

        plain = ModelSpec(spec.name, spec.weights, spec.params, spec.fit_split, spec.optional)
        return explained(open_model(plain, device, dspec, output_dir, overwrite=overwrite), spec.explainer)
    if spec.fit_split is None:
        return create_model(spec.name, weights=spec.weights, device=device, **spec.params)
    if dspec is None or output_dir is None:
        raise XBenchError(f"model {spec.name!r} has fit_split: it needs the dataset it is fitted on")
    evaluated = dspec.split or dataset_manifest(dspec.name).get("default_split", "test")
    if spec.fit_split == evaluated:
        raise XBenchError(f"model {spec.name!r}: fit_split {spec.fit_split!r} is the evaluation split of "
                          f"{dspec.name!r}; a baseline must be fitted on a disjoint split")
    folder = fitted_folder(output_dir, dspec, spec)
    fit_data = open_dataset(dspec, split=spec.fit_split)
    key = fit_key(fit_data, dspec, spec)
    if overwrite or not fitted_is_current(folder, key):
        cls = import_target(model_config(spec.name)["class"])
        refit(folder, lambda tmp: cls.fit(fit_data).save(tmp), key)
    return create_model(spec.name, weights=folder, device=device, **spec.params)


def fitted_folder(output_dir: str | Path, dspec: DatasetSpec, mspec: ModelSpec) -> Path:
    """Where a ``fit_split`` baseline's fitted files live."""
    return Path(output_dir) / "fitted" / dspec.name / mspec.name


def weight_bytes(mspec: ModelSpec) -> int:
    """The size of a model's weight files (0 without any): builds in the background run smallest first."""
    if mspec.fit_split is not None:
        return 0
    return sum(f.stat().st_size for f in weight_files(mspec.name, mspec.weights) if f.is_file())


def build_behind(jobs: dict[int, tuple[int, Callable[[], Adapter], Adapter]],
                 device: torch.device | None = None) -> Building:
    """Start ``jobs`` (model index -> (its weight bytes, its build, its input twin)) one after another in a background
    thread, the smallest weight files first (ties in config order), so the first model runs soon while the larger ones
    are read. One thread: builds that seed torch's RNG (random-init) never overlap. On a CUDA ``device`` each build
    runs on a stream of its own (:func:`on_own_stream`). Builds from weight files in three threads, and the next
    dataset decoded from the first build on, were measured and dropped: on one H200 both made the models' own passes
    slower, and neither ended the run sooner."""
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="xbench-build")
    order = sorted(jobs, key=lambda j: (jobs[j][0], j))
    started = {j: (pool.submit(on_own_stream(jobs[j][1], device)), jobs[j][2]) for j in order}
    pool.shutdown(wait=False)  # the thread ends after the last build
    return started


def on_own_stream(build: Callable[[], Adapter], device: torch.device | None) -> Callable[[], Adapter]:
    """``build`` on a CUDA stream of its own when ``device`` is CUDA, its work finished before the adapter is handed
    over (otherwise ``build`` itself).

    A network's weights reach the GPU by blocking copies, and PyTorch ends each blocking copy by synchronising the
    copying thread's current stream. On the default stream, which the stepping thread's model passes also use, each
    copy of a background build would first wait for every pass queued there. On a stream of its own it waits for the
    build's own copies only. The stream is synchronised before the adapter is returned, so the stepping thread never
    reads a weight that is still being copied.
    """
    if device is None or device.type != "cuda":
        return build

    def run() -> Adapter:
        stream = torch.cuda.Stream(device=device)
        with torch.cuda.stream(stream):
            adapter = build()
        stream.synchronize()
        return adapter

    return run


class ModelBuilder:
    """Builds a run's models on ``device``, fitted baselines under ``output_dir``, each build timed into ``times``.

    ``open_model``, ``input_twin`` and ``build_behind`` are the functions that build a network, its twin and the
    background builds (the module's own unless the caller hands others in).
    """

    def __init__(self, device: torch.device, output_dir: Path, times: BuildTimes, *, overwrite: bool,
                 allow_random_init: bool, open_model: Callable[..., Adapter] = open_model,
                 input_twin: Callable[..., Adapter | None] = input_twin,
                 build_behind: Callable[..., Building] = build_behind):
        self.device, self.output_dir, self.times = device, output_dir, times
        self.overwrite, self.allow_random_init = overwrite, allow_random_init
        self._open, self._twin, self._behind = open_model, input_twin, build_behind
        self.built: dict[int, Adapter] = {}  # models without fit_split, by spec identity: built once, every dataset

    def all_built(self, models: Sequence[ModelSpec]) -> bool:
        """Whether every model is built for good (none is refitted per dataset)."""
        return all(id(m) in self.built for m in models)

    def build(self, mspec: ModelSpec, dspec: DatasetSpec) -> Adapter:
        """The model's network for ``dspec`` (built once unless it is fitted per dataset). A random-init build is an
        error unless the run or the entry allows it."""
        key = id(mspec)
        adapter = self.built.get(key)
        if adapter is None:
            adapter = self.times.timed(key, lambda: self._open(mspec, self.device, dspec, self.output_dir,
                                                               overwrite=self.overwrite))
        if adapter.weights_label == "random-init" and not (self.allow_random_init or mspec.params.get("random_init") is True):
            raise XBenchError(f"model {mspec.name!r} was built random-init (no weights found) but this config does not "
                              "allow random-init models (allow_random_init: true, or params: {random_init: true})")
        if mspec.fit_split is None:
            self.built[key] = adapter
        self.times.note_built(key)
        return adapter

    def twins(self, models: Sequence[ModelSpec]) -> dict[int, Adapter]:
        """Input twins (by spec identity) of the models not yet built whose network is built once (no fit_split, no
        explainer) and has a twin."""
        twins: dict[int, Adapter] = {}
        for m in models:
            if id(m) not in self.built and m.fit_split is None and m.explainer is None:
                copy = self.times.timed(id(m), partial(self._twin, m.name, m.weights, **m.params))  # its imports, mostly
                if copy is not None:
                    twins[id(m)] = copy
        return twins

    def launch(self, models: Sequence[ModelSpec], dspec: DatasetSpec,
              twins: dict[int, Adapter]) -> tuple[list[Adapter | None], Building]:
        """Build the models without a twin now, then start the others in the background (:func:`build_behind`).
        Returns every model's adapter (None for those still building) and the builds under way. The background builds
        start before the feed is set up (its calibrations) and decoding starts: the first network is read while the
        feed gets ready."""
        now = {id(m): self.build(m, dspec) for m in models if id(m) not in twins}
        building = self._behind({j: (weight_bytes(m), partial(self.build, m, dspec), twins[id(m)])
                                 for j, m in enumerate(models) if id(m) in twins}, self.device) if twins else {}
        return [now.get(id(m)) for m in models], building
