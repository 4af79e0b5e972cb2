"""pytest plugin: CPU seconds per test phase and per file, for timing the suite on a shared machine.

CPU time is user + system time of the pytest process (all its threads) plus that of the processes it started and
waited for (subprocesses, notebook kernels): ``resource.getrusage`` of ``RUSAGE_SELF`` and ``RUSAGE_CHILDREN`` around
each setup / call / teardown. Processes nobody in the pytest process waits for (a forkserver's pool workers) are not
counted. Wall time is written beside it. On a machine other jobs share, wall time grows with their load while CPU
time stays comparable between runs.

Usage (POSIX), from the repository root::

    PYTHONPATH=$PWD:$PWD/benchmarks python -m pytest -q -p pytest_cpu_time tests/notebooks/test_notebooks.py

The table goes to ``$PYTEST_CPU_TIME_OUT`` (default ``pytest_cpu_time.txt`` in the working folder): per file, then the
40 longest phases, largest CPU time first.
"""
from __future__ import annotations

import os
import resource
import time

import pytest

_rows: list[tuple[float, float, str, str]] = []


def _cpu() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _timed(phase: str, item: pytest.Item):
    cpu, wall = _cpu(), time.perf_counter()
    yield
    _rows.append((_cpu() - cpu, time.perf_counter() - wall, phase, item.nodeid))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item):
    yield from _timed("setup", item)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item):
    yield from _timed("call", item)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item):
    yield from _timed("teardown", item)


def pytest_sessionfinish(session: pytest.Session) -> None:
    files: dict[str, list[float]] = {}
    for cpu, wall, _, nodeid in _rows:
        total = files.setdefault(nodeid.split("::")[0], [0.0, 0.0])
        total[0] += cpu
        total[1] += wall
    lines = [f"# total cpu {sum(r[0] for r in _rows):.1f} s wall {sum(r[1] for r in _rows):.1f} s"]
    lines += [f"{cpu:8.1f} cpu {wall:8.1f} wall  {name}" for name, (cpu, wall) in
              sorted(files.items(), key=lambda kv: -kv[1][0])]
    lines += ["# phases"] + [f"{cpu:8.1f} cpu {wall:8.1f} wall  {phase:8s} {nodeid}"
                             for cpu, wall, phase, nodeid in sorted(_rows, reverse=True)[:40]]
    with open(os.environ.get("PYTEST_CPU_TIME_OUT", "pytest_cpu_time.txt"), "w", encoding="utf-8") as out:
        out.write("\n".join(lines) + "\n")
