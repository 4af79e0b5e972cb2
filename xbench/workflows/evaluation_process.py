"""The evaluation that overlaps a run's inference, coordinated in a process of its own (run option ``eval_process``).

:class:`~xbench.evaluation.evaluate.RunEvaluation` coordinates from a thread: it joins ground-truth files, submits
pairs to its worker pool, receives their results and steps the large pairs. In the process that feeds a GPU that
thread shares the interpreter lock with the models' thread and the decoding thread. On two H200s (2 × 16 decode
workers, 32 cores) rank 0, which evaluates, took 46.9 and 49.5 s to infer its share against 44.3 and 44.9 s with
``--no-eval``.

:class:`EvaluationProcess` runs the same ``RunEvaluation`` in a child process (started like pool workers,
:func:`xbench.core.workers.start_process`; it ends if this process dies). This process only sends it what happens
(a dataset is inferred, a timeline mark, inference is over) and waits for its tables, so the tables are the bytes of
the in-process evaluation: the same code computes them. An error of the evaluation is raised here as itself
(:func:`~xbench.core.workers.round_trips`), else as an :class:`~xbench.core.errors.XBenchError` naming it. Warnings
are recorded in the child and raised again here when it answers, under this process's filters, once per (text,
category, place) as in the process itself (:func:`~xbench.core.workers.replay_warnings`).
"""
from __future__ import annotations

import os
import warnings
from typing import Any

from ..core.errors import XBenchError
from ..core.logs import current_verbosity, setup_logging
from ..core.workers import Caught, as_caught, replay_warnings, round_trips, start_process
from ..evaluation.evaluate import RunEvaluation
from ..outputs.tables import write_paper_tables
from ..spec.config import RunConfig

__all__ = ["EvaluationProcess", "apart", "finish_here"]

_JOIN_SECONDS = 60.0  # close(): how long the child may take to stop its pool before it is terminated


def apart(cfg: RunConfig) -> bool:
    """Whether a run's overlapped evaluation goes to a process of its own: ``eval_process`` true, or ``auto`` on a
    CUDA run device."""
    return cfg.eval_process is True or (cfg.eval_process == "auto" and cfg.resolved_device().type == "cuda")


def finish_here(evaluation: RunEvaluation) -> None:
    """The end of an overlapped evaluation: the rest of the tables, the paper-form tables (one per worker) and
    ``evaluation_timing.json``."""
    evaluation.finish()
    write_paper_tables(evaluation.cfg.output_dir, pool=evaluation.pool)
    evaluation.mark("paper_tables_written")
    evaluation.write_timing()


class EvaluationProcess:
    """A :class:`~xbench.evaluation.evaluate.RunEvaluation` in a child process, driven with the same calls
    (:meth:`ready`, :meth:`mark`, :meth:`close`); :meth:`complete` is :func:`finish_here` there."""

    def __init__(self, cfg: RunConfig, *, progress: bool = True, nice: int = 0, watch_store: bool = False):
        from multiprocessing import Pipe

        self.cfg = cfg
        self._conn, theirs = Pipe()
        self._process = start_process(_serve, (theirs, cfg, progress, nice, watch_store, current_verbosity()),
                                      name="xbench-evaluation")
        theirs.close()
        self._registry: dict = {}  # the child's warnings, shown once per (text, category, place)

    @property
    def pid(self) -> int | None:
        return self._process.pid

    def start(self) -> None:
        """Nothing: the child starts its evaluation when it starts."""

    def ready(self, index: int) -> None:
        self._send(("ready", index))

    def mark(self, event: str) -> None:
        self._send(("mark", event))

    def _send(self, message: tuple[Any, ...]) -> None:
        try:
            self._conn.send(message)
        except (BrokenPipeError, ConnectionResetError, EOFError):  # the child is gone: complete() says why
            pass

    def complete(self) -> None:
        """Let the child finish (the rest of the tables, paper tables, timeline); its error is raised here."""
        self._send(("complete",))
        try:
            kind, payload, caught = self._conn.recv()
        except (EOFError, ConnectionResetError, OSError):
            self._process.join(timeout=_JOIN_SECONDS)
            raise XBenchError(f"the evaluation process ended (exit code {self._process.exitcode}) before it wrote "
                              f"the tables of {self.cfg.output_dir}; the store is complete: `xbench evaluate` "
                              "computes them") from None
        replay_warnings(caught, self._registry)
        if kind == "error":
            raise payload

    def close(self) -> None:
        """Stop the child (after :meth:`complete`, or after a failed inference) and wait for it."""
        self._send(("close",))
        self._conn.close()
        self._process.join(timeout=_JOIN_SECONDS)
        if self._process.is_alive():  # pragma: no cover - a child that does not stop
            self._process.terminate()
            self._process.join()


def _serve(conn: Any, cfg: RunConfig, progress: bool, nice: int, watch_store: bool, verbosity: int | None) -> None:
    """The child: one ``RunEvaluation``, driven by the messages of :class:`EvaluationProcess` until ``complete`` (its
    tables, then the answer with every warning recorded) or ``close`` / the parent's end of the pipe closing."""
    if verbosity is not None:
        setup_logging(verbosity)
    evaluation: RunEvaluation | None = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # every one recorded; the parent's filters and registry decide what shows
        try:
            evaluation = RunEvaluation(cfg, progress=progress, nice=nice, watch_store=watch_store)
            evaluation.start()
            while True:
                try:
                    message = conn.recv()
                except (EOFError, OSError):
                    return  # the parent closed its end (or ended)
                if message[0] == "ready":
                    evaluation.ready(message[1])
                elif message[0] == "mark":
                    evaluation.mark(message[1])
                elif message[0] == "complete":
                    try:
                        finish_here(evaluation)
                    except BaseException as exc:  # sent back, raised by the parent
                        conn.send(("error", _crossing(exc), _recorded(caught)))
                    else:
                        conn.send(("done", None, _recorded(caught)))
                else:  # close
                    return
        except BaseException as exc:  # the evaluation could not start: the parent raises it at complete
            _answer_later(conn, exc, caught)
        finally:
            if evaluation is not None:
                evaluation.close()
            conn.close()


def _recorded(caught: list[warnings.WarningMessage]) -> list[Caught]:
    """The warnings recorded so far (:func:`~xbench.core.workers.as_caught`), forgotten here once sent."""
    out = as_caught(caught)
    caught.clear()
    return out


def _answer_later(conn: Any, exc: BaseException, caught: list[warnings.WarningMessage]) -> None:
    """Wait for ``complete`` (or the end) and answer it with ``exc``."""
    try:
        while conn.recv()[0] not in ("complete", "close"):
            pass
        conn.send(("error", _crossing(exc), _recorded(caught)))
    except (EOFError, OSError):
        pass


def _crossing(exc: BaseException) -> BaseException:
    """``exc`` if it pickles back as itself, else an XBenchError naming its type and text."""
    if round_trips(exc):
        return exc
    return XBenchError(f"the evaluation (process {os.getpid()}) failed: {type(exc).__name__}: {exc}")
