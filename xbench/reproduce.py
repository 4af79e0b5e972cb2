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
there as well.
"""
from __future__ import annotations

import logging
import shutil
from pathlib import Path

from .errors import XBenchError
from .registry import PACKAGE_DIR

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


def reproduce(config: str | Path, *, output_dir: str | Path, device: str = "cpu", notebooks: str | Path | None = None,
              timeout: int = 1800, kernel: str = "python3", figures_dir: str | Path | None = None,
              progress: bool = True, keep_going: bool = False, check: bool = True) -> Path:
    """Execute the notebooks with papermill; returns ``output_dir``.

    ``check``: preflight the config first (with ``output_dir`` / ``device`` applied).
    ``keep_going``: run the remaining notebooks after a failure; the failures are listed at the end.
    """
    import papermill as pm
    from papermill.exceptions import PapermillExecutionError

    if check:
        from .config import RunConfig
        from .preflight import preflight

        preflight(RunConfig.from_yaml(config, output_dir=str(output_dir), device=device)).raise_for_problems()
    out = Path(output_dir).resolve()
    executed = out / "notebooks"
    executed.mkdir(parents=True, exist_ok=True)
    params = {"config": str(Path(config).resolve()), "output_dir": str(out), "device": device}
    failures = []
    for nb in notebook_paths(notebooks):
        log.info("notebook %s", nb.name)
        try:
            pm.execute_notebook(str(nb), str(executed / nb.name), parameters=params, kernel_name=kernel,
                                execution_timeout=timeout, progress_bar=progress, cwd=str(nb.parent))
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


def copy_outputs(output_dir: Path, figures_dir: Path) -> list[Path]:
    """Copy ``tables/*.{csv,md,tex}`` and ``figures/*.{png,pdf}`` of a run into ``figures_dir``."""
    figures_dir.mkdir(parents=True, exist_ok=True)
    copied = []
    for sub, suffixes in (("tables", {".md", ".tex", ".csv"}), ("figures", {".png", ".pdf"})):
        for f in sorted((output_dir / sub).glob("*")):
            if f.suffix in suffixes:
                copied.append(Path(shutil.copy2(f, figures_dir / f.name)))
    return copied
