"""One call to open an evaluated run for the notebooks: :func:`open_run`.

Replaces the setup cell every analysis notebook repeated (read the config, load the tables, derive the model
flags); the notebooks then only call the library and plot.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from .core.errors import XBenchError
from .spec.config import RunConfig


@dataclass
class Run:
    """An evaluated run: its config and tables (``metrics`` tidy, ``pairs``, ``curves``, ``models``), the
    evaluation log, the paired model comparisons (``comparisons.csv``; None for a run evaluated before they existed)
    and the model flags the tables and figures use."""

    cfg: RunConfig
    metrics: pd.DataFrame
    pairs: pd.DataFrame
    curves: pd.DataFrame
    models: pd.DataFrame
    log: list[dict[str, Any]] = field(default_factory=list)
    comparisons: pd.DataFrame | None = None

    @property
    def output_dir(self) -> Path:
        return Path(self.cfg.output_dir)

    @property
    def baselines(self) -> list[str]:
        """Prior baselines (never ranked)."""
        from .outputs.tables import model_flags

        return model_flags(self.models)[0]

    @property
    def unverified(self) -> list[str]:
        """Models without verified code or weights (dagger)."""
        from .outputs.tables import model_flags

        return model_flags(self.models)[1]

    @property
    def notes(self) -> dict[str, str]:
        """Model → note (e.g. ``random-init weights``)."""
        from .outputs.tables import model_notes

        return model_notes(self.models)

    @property
    def flags(self) -> dict[str, Any]:
        """``baselines``, ``unverified`` and ``notes`` as keyword arguments for :mod:`xbench.outputs.tables`."""
        return {"baselines": self.baselines, "unverified": self.unverified, "notes": self.notes}

    @property
    def datasets(self) -> list[str]:
        return list(dict.fromkeys(self.metrics["dataset"]))

    @property
    def label(self) -> str:
        """Figure-title fragment naming the run's datasets (the phantom flagged as synthetic)."""
        from .outputs.figures import data_label

        return data_label(sorted(self.datasets))

    def path(self, kind: str, name: str) -> Path:
        """``<output_dir>/<kind>/<name>`` (``kind``: ``tables`` or ``figures``), its folder created."""
        from .core.files import contained_folder

        return contained_folder(self.output_dir, kind) / name  # a real folder inside the output folder, no link


def open_run(config: str | Path | RunConfig, *, output_dir: str | Path | None = None, device: str | None = None) -> Run:
    """The evaluated run of ``config`` (a run YAML or a :class:`RunConfig`): its tables must exist
    (``xbench run`` / ``xbench evaluate`` or notebook 00 wrote them)."""
    from .evaluation.comparisons import load_comparisons
    from .evaluation.evaluate import load_tables, read_evaluation_log

    cfg = config if isinstance(config, RunConfig) else RunConfig.from_yaml(
        config, output_dir=None if output_dir is None else str(output_dir), device=device)
    try:
        tables = load_tables(cfg.output_dir)
    except XBenchError as exc:
        if Path(cfg.output_dir).is_absolute():
            raise
        raise XBenchError(f"{exc}. The notebooks' default paths (config, output_dir) are relative to the "
                          "notebooks/ folder: run a notebook from there after notebook 00 (or `make reproduce`) has "
                          "filled the run, e.g. `cd notebooks && papermill 01_table1_grounding.ipynb /tmp/01.ipynb`, "
                          "or pass absolute paths: `papermill NB OUT -p config ABS_YAML -p output_dir ABS_DIR`.") from exc
    log_path = Path(cfg.output_dir) / "tables" / "evaluation_log.json"
    log = read_evaluation_log(log_path) or []
    compared = load_comparisons(cfg.output_dir)
    return Run(cfg, tables["metrics"], tables["pairs"], tables["curves"], tables["models"], log,
               None if compared is None else compared[0])
