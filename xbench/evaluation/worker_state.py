"""What an evaluation worker needs of its parent's process state, shipped with each job.

Worker processes start from the fork server (:mod:`xbench.core.workers`), not from the parent's memory.
``multiprocessing`` gives each new worker the parent's current ``sys.path``; what else the parent changed at run
time would be missing: config folders (``--config-path``, :func:`xbench.spec.registry.add_search_dir`) and
metrics registered in the metric table (:func:`xbench.metrics.table.register`, docs/extending.md).
:func:`process_state` collects them (checking that they pickle); :func:`apply_state` installs them in a worker
before the job runs. Nothing here unpickles bytes: state and dataset travel as job arguments, which the pool
pickles and unpickles itself. When the state cannot be pickled (a metric function defined where a worker cannot
import it, e.g. in a notebook cell or an ``exec``), the run is evaluated in the calling process instead.
"""
from __future__ import annotations

import hashlib
import pickle
from typing import Any, NamedTuple

__all__ = ["State", "process_state", "apply_state"]

_APPLIED: set[str] = set()  # worker: digests of the states already installed in this process


class State(NamedTuple):
    """The parent's registries (config folders, metric table) and the digest of their pickled form."""

    digest: str
    registries: dict[str, Any]


def process_state() -> tuple[State | None, str]:
    """``(state, "")``, or ``(None, why)`` when the registries cannot be pickled."""
    from ..metrics import table as metric_table
    from ..spec import registry

    registries = {"manifest_dirs": list(registry.MANIFEST_DIRS), "model_dirs": list(registry.MODEL_CONFIG_DIRS),
                  "env_read": registry._ENV_READ, "metrics": list(metric_table.METRIC_TABLE)}
    try:
        return State(hashlib.sha256(pickle.dumps(registries)).hexdigest(), registries), ""
    except Exception as exc:  # PicklingError, AttributeError ("Can't pickle local object"), TypeError
        return None, f"{type(exc).__name__}: {exc}"


def apply_state(state: State) -> None:
    """Install a :func:`process_state` in this process (once per distinct state)."""
    if state.digest in _APPLIED:
        return
    from ..metrics import table as metric_table
    from ..spec import registry

    registries = state.registries
    registry.MANIFEST_DIRS[:] = registries["manifest_dirs"]
    registry.MODEL_CONFIG_DIRS[:] = registries["model_dirs"]
    registry._ENV_READ = registries["env_read"]  # the parent's $XBENCH_CONFIG_PATH folders are in the lists already
    metric_table.METRIC_TABLE[:] = registries["metrics"]
    _APPLIED.add(state.digest)

