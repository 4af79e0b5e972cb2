"""Reproduction driver: run every notebook in ``notebooks/`` in order through papermill.

Each notebook has a ``parameters`` cell with ``config``, ``output_dir`` and
``device``; the driver injects absolute values, sets the kernel name
explicitly, applies a per-cell execution timeout and saves each executed
notebook under ``<output_dir>/notebooks/``. Before any notebook runs, the run
config goes through :func:`xbench.preflight.preflight` (a problem stops here,
before a model is built). A failing notebook stops the run with an error naming
the notebook, the cell and the exception; with ``keep_going`` the remaining
notebooks run and every failure is listed at the end (still an error). With
``figures_dir`` the tables (CSV/Markdown/LaTeX) and figures (PNG/PDF) are copied
there as well, unless that folder holds a committed set whose tables agree with the run's within the
tolerances of :mod:`xbench.outputs.agreement` (:func:`copy_outputs`).

Every output lands under ``output_dir``: the notebooks run with it as their working folder (a relative
path a notebook writes cannot reach the notebooks' folder, which is inside ``site-packages`` for an
installed wheel). ``config`` may name a shipped run config (``phantom``, ``paper``). ``parameters``
(``xbench reproduce -p NAME VALUE``) are passed to every notebook that declares ``NAME`` in its
``parameters`` cell. The preflight summary is logged before the first notebook; each kernel logs XBench's
progress lines at the driver's verbosity and they are relayed to the driver's stderr while the notebook
runs (they stay in the executed notebook as well). Kernels talk over IPC sockets on POSIX (no "TCP
without encryption" warning per notebook).
"""
from __future__ import annotations

import logging
import os
import shutil
import sys
from collections.abc import Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from ..core.errors import XBenchError
from ..core.workers import environment_set
from ..spec.registry import PACKAGE_DIR
from ..spec.run_configs import resolve_run_config

log = logging.getLogger(__name__)

#: the repository's notebooks/ (an installed wheel carries them as xbench/notebooks/)
NOTEBOOKS_DIR = PACKAGE_DIR / "notebooks" if (PACKAGE_DIR / "notebooks").is_dir() else PACKAGE_DIR.parent / "notebooks"


def notebook_paths(folder: str | Path | None = None) -> list[Path]:
    """The numbered notebooks (``NN_name.ipynb``) of ``folder`` in run order."""
    folder = Path(folder) if folder else NOTEBOOKS_DIR
    paths = sorted(folder.glob("[0-9][0-9]_*.ipynb"))
    if not paths:
        raise XBenchError(f"No notebooks named NN_*.ipynb in {folder}")
    return paths


class _Relay:
    """papermill's ``stderr_file``: the kernels' stderr (XBench's log lines, warnings) to the driver's stderr."""

    def write(self, text: str) -> None:
        sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def _kernel_manager_class() -> type:
    """A kernel manager whose kernels use IPC sockets on POSIX (TCP, the default, warns on every start)."""
    import tempfile
    import uuid

    from jupyter_client.manager import AsyncKernelManager
    from jupyter_core.paths import jupyter_runtime_dir
    from traitlets import CaselessStrEnum, default

    class LocalKernelManager(AsyncKernelManager):
        transport = CaselessStrEnum(["tcp", "ipc"], default_value="ipc" if os.name == "posix" else "tcp", config=True)

        @default("ip")
        def _ip_default(self) -> str:
            if self.transport != "ipc":
                return super()._ip_default()
            name = f"xbench-{uuid.uuid4().hex[:12]}-ipc"
            folder = Path(jupyter_runtime_dir())  # the sockets live here, not in the notebooks' working folder
            if len(str(folder / name)) + 3 > 100:  # Linux socket paths hold 107 bytes; the kernel appends "-<n>"
                return str(Path(tempfile.mkdtemp(prefix="xb-")) / name)  # a short private (0700) folder instead
            folder.mkdir(parents=True, exist_ok=True)
            return str(folder / name)

        async def _async_interrupt_kernel(self) -> None:
            # jupyter_client sends SIGINT before every shutdown request; a kernel busy in a message handler then
            # logs "[IPKernelApp] ERROR | KeyboardInterrupt caught in kernel." to the console. A notebook is done
            # when papermill stops its kernel, so the shutdown request alone is sent (interrupts on a cell timeout
            # go through ``interrupt_kernel``, which is not this method, and still happen).
            if getattr(self, "shutting_down", False):
                return
            await super()._async_interrupt_kernel()

    return LocalKernelManager


def _verbosity() -> int:
    """The driver's verbosity (-1 quiet, 0 info, 1 debug), read from the ``xbench`` logger's level."""
    level = logging.getLogger("xbench").getEffectiveLevel()
    return 1 if level <= logging.DEBUG else -1 if level >= logging.WARNING else 0


def _kernel_env(verbosity: int) -> AbstractContextManager[None]:
    """Kernels inherit the environment: ``XBENCH_LOG_LEVEL`` makes ``import xbench`` set up logging there."""
    return environment_set({"XBENCH_LOG_LEVEL": str(verbosity)})


def reproduce(config: str | Path, *, output_dir: str | Path, device: str = "cpu", notebooks: str | Path | None = None,
              timeout: int = 1800, kernel: str = "python3", figures_dir: str | Path | None = None,
              progress: bool = True, keep_going: bool = False, check: bool = True,
              parameters: Mapping[str, Any] | None = None) -> Path:
    """Execute the notebooks with papermill; returns ``output_dir``.

    ``check``: preflight the config first (with ``output_dir`` / ``device`` applied); its summary is logged.
    ``keep_going``: run the remaining notebooks after a failure; the failures are listed at the end.
    ``parameters``: extra notebook parameters (``config``, ``output_dir`` and ``device`` are set here).
    """
    import papermill as pm
    from papermill.exceptions import PapermillExecutionError

    config = resolve_run_config(config)
    extra = dict(parameters or {})
    reserved = sorted(set(extra) & {"config", "output_dir", "device"})
    if reserved:
        raise XBenchError(f"-p {reserved[0]}: set it with --{reserved[0].replace('_', '-')} instead")
    if check:
        from ..spec.config import RunConfig
        from ..preflight import preflight

        report = preflight(RunConfig.from_yaml(config, output_dir=str(output_dir), device=device))
        log.info("preflight of %s:\n%s", config, report.format())
        report.raise_for_problems(keep_going=keep_going)
    out = Path(output_dir).resolve()
    executed = out / "notebooks"
    executed.mkdir(parents=True, exist_ok=True)
    params = {"config": str(Path(config).resolve()), "output_dir": str(out), "device": device}
    paths = notebook_paths(notebooks)
    _check_parameters(paths, extra)
    failures = []
    for i, nb in enumerate(paths, 1):
        log.info("notebook %d/%d %s", i, len(paths), nb.name)
        declared = _declared_parameters(nb)
        nb_params = {**params, **{k: v for k, v in extra.items() if k in declared}}
        log.debug("notebook %s parameters %s (working folder %s)", nb.name, nb_params, out)
        try:
            with _kernel_env(_verbosity()):
                pm.execute_notebook(str(nb), str(executed / nb.name), parameters=nb_params, kernel_name=kernel,
                                    execution_timeout=timeout, progress_bar=progress, cwd=str(out),
                                    stderr_file=_Relay(), kernel_manager_class=_kernel_manager_class())
        except PapermillExecutionError as exc:
            message = (f"notebook {nb.name} failed in cell {exc.exec_count} ({exc.ename}: {exc.evalue}); "
                       f"the executed copy with the traceback is {executed / nb.name}")
            if not keep_going:
                raise XBenchError(message) from exc
            log.error("%s", message)
            failures.append(message)
    if failures:
        raise XBenchError(f"{len(failures)} notebook(s) failed (the others ran):\n  - " + "\n  - ".join(failures))
    if figures_dir is not None:
        copy_outputs(out, Path(figures_dir))
    return out


def _declared_parameters(nb: Path) -> set[str]:
    """Names assigned in the notebook's ``parameters`` cell."""
    import ast

    import nbformat

    for cell in nbformat.read(nb, as_version=4).cells:
        if "parameters" in cell.metadata.get("tags", []):
            return {t.id for node in ast.parse(cell.source).body if isinstance(node, ast.Assign)
                    for t in node.targets if isinstance(t, ast.Name)}
    return set()


def _check_parameters(paths: list[Path], extra: Mapping[str, Any]) -> None:
    """Every ``-p NAME`` must be declared by at least one notebook (a typo is an error, not a no-op)."""
    declared = set().union(*(_declared_parameters(p) for p in paths))
    unknown = sorted(set(extra) - declared)
    if unknown:
        import difflib

        close = difflib.get_close_matches(unknown[0], sorted(declared), n=3)
        hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
        raise XBenchError(f"-p {unknown[0]}: no notebook declares this parameter.{hint} "
                          f"Declared: {', '.join(sorted(declared))}.")


def copy_outputs(output_dir: Path, figures_dir: Path) -> list[Path]:
    """Copy ``tables/*.{csv,md,tex}`` and ``figures/*.{png,pdf}`` of a run into ``figures_dir``; returns what was written.

    When ``figures_dir`` already holds every one of these files (a committed set) and the run's CSV tables
    agree with the committed ones within the tolerances of :mod:`xbench.outputs.agreement`, nothing is
    written and one line says so with the largest differences: CPU network inference differs by
    instruction set in the last bits, so a byte-for-byte copy would dirty a checkout on another machine
    with numbers that mean the same. Otherwise every file is copied and each table that differs beyond
    tolerance is named (with its cells) in a warning.
    """
    from ..outputs.agreement import BOOTSTRAP_ATOL, VALUE_ATOL, compare_tables

    sources = [f for sub, suffixes in (("tables", {".md", ".tex", ".csv"}), ("figures", {".png", ".pdf"}))
               for f in sorted((output_dir / sub).glob("*")) if f.suffix in suffixes]
    committed = {p.name: p for p in figures_dir.glob("*.csv")} if figures_dir.is_dir() else {}
    if committed:
        agreement = compare_tables(committed, {f.name: f for f in sources if f.suffix == ".csv"})
        missing = [f.name for f in sources if not (figures_dir / f.name).exists()]
        if agreement.ok and not missing:
            log.warning("%s: kept the committed tables and figures: this run's %d tables agree with them within "
                        "tolerance (largest |difference| %.3g for values, tolerance %g; %.3g for bootstrap CI "
                        "bounds/p-values/ranks, tolerance %g; %d rounded cells moved by one unit of their last "
                        "digit)", figures_dir, agreement.n_tables, agreement.max_value_diff, VALUE_ATOL,
                        agreement.max_bootstrap_diff, BOOTSTRAP_ATOL, agreement.n_rounded_moved)
            return []
        if agreement.problems:
            log.warning("%s: this run's tables differ from the committed ones beyond tolerance (values %g, "
                        "bootstrap quantities %g); writing the new files:\n  - %s", figures_dir, VALUE_ATOL,
                        BOOTSTRAP_ATOL, "\n  - ".join(agreement.problems))
    figures_dir.mkdir(parents=True, exist_ok=True)
    return [Path(shutil.copy2(f, figures_dir / f.name)) for f in sources]
