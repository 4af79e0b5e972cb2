"""The explainer study of notebook 11: explainer variants of a run's models, their plausibility and faithfulness.

:func:`explainer_study` runs (resumably, like any run) the chosen models with their own maps and with each chosen
explainer on the run's datasets — the phantom restricted to ``cases`` cases — into ``<output_dir>``, evaluates the
grounding metrics as every run does, computes the per-case faithfulness table
(:func:`~xbench.explain.faithfulness.faithfulness_table`) on the first dataset and joins them
(:func:`~xbench.explain.summary.plausibility_vs_faithfulness`).
"""
from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd

from ..core.atomic import write_frame
from ..core.errors import StoreError, XBenchWarning
from ..core.files import contained_folder
from ..spec.config import DatasetSpec, ModelSpec, RunConfig, dataset_options
from ..datasets import open_dataset
from ..evaluation.evaluate import load_tables
from ..explain.faithfulness import faithfulness_table
from ..explain.summary import faithfulness_summary, plausibility_vs_faithfulness


@dataclass
class Study:
    """Tables of :func:`explainer_study`: ``metrics`` (tidy grounding/recognition), ``faithfulness`` (per case),
    ``summary`` (faithfulness with CIs), ``frame`` (plausibility beside faithfulness, one row per variant) and
    ``skipped`` (variant → why: an explainer that needs a YAML key the model lacks, e.g. Grad-CAM for a prior)."""

    config: RunConfig
    metrics: pd.DataFrame
    faithfulness: pd.DataFrame
    summary: pd.DataFrame
    frame: pd.DataFrame
    skipped: dict[str, str]


def _limited(spec: DatasetSpec, cases: int | None) -> DatasetSpec:
    if cases is None or "cases" not in dataset_options(spec.name):
        return spec
    return replace(spec, options={**spec.options, "cases": int(cases)})


_DROPPED = "undefined bootstrap replicates dropped"


def _replay_combined(caught: list[warnings.WarningMessage], cases: int | None) -> None:
    """Warn again what the study's run warned, with the per-variant "undefined bootstrap replicates dropped" notes
    (expected on a few cases: a resample without a positive of a class) joined into one warning."""
    dropped = list(dict.fromkeys(str(w.message) for w in caught if _DROPPED in str(w.message)))
    registry: dict = {}  # a warning repeated in the run shows once, as it would have
    for w in caught:
        if _DROPPED not in str(w.message):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, registry=registry)
    if dropped:
        detail = "; ".join(m.split(": ", 1)[0].removeprefix("score_table") + ": " + m.rsplit("): ", 1)[-1]
                           for m in dropped)
        warnings.warn(f"explainer study{f' ({cases} cases)' if cases else ''}: {_DROPPED} in {len(dropped)} "
                      f"variant(s), expected on few cases (a resample without a positive of a class; per class): "
                      f"{detail}", XBenchWarning, stacklevel=3)


def explainer_study(cfg: RunConfig, *, models: Sequence[str], explainers: Sequence[str], output_dir: str | Path,
                    cases: int | None = None, steps: int = 10, road: bool = False, n_boot: int | None = None,
                    progress: bool = False, overwrite: bool = False) -> Study:
    """Run and score ``models`` × (own maps + ``explainers``) on ``cfg``'s datasets (module docstring).

    The study's run config is ``cfg`` with these model entries, ``output_dir`` and, for datasets with a ``cases``
    option (the phantom), ``cases`` cases; ``n_boot`` defaults to the config's bootstrap replicates.
    ``overwrite``: recompute a study whose store in ``output_dir`` was made with other settings (another
    ``cases``, say); without it such a store is an error that says how to recompute (notebook 11 declares
    an ``overwrite`` parameter: ``xbench reproduce -p overwrite true``).
    """
    from .run import run
    from ..inference.builder import open_model

    from ..spec.registry import model_config
    from ..explain.methods import EXPLAINERS

    specs = [ModelSpec(m) for m in models]
    skipped = {f"{s.name}+{e}": f"model {s.name!r} has no {EXPLAINERS[e].requires} in its YAML"
               for s in specs for e in explainers
               if EXPLAINERS[e].requires and not model_config(s.name).get(EXPLAINERS[e].requires)}
    specs += [replace(s, explainer=e) for s in specs for e in explainers if f"{s.name}+{e}" not in skipped]
    output_dir = Path(output_dir)  # a real folder under its parent (the run's output folder): no link (containment)
    contained_folder(output_dir.parent, output_dir.name)
    study_cfg = replace(cfg, output_dir=str(output_dir), models=specs,
                        datasets=[_limited(d, cases) for d in cfg.datasets])
    caught: list[warnings.WarningMessage] = []
    try:
        with warnings.catch_warnings(record=True) as caught:  # the caller's filters still apply
            run(study_cfg, progress=progress, overwrite=overwrite)
    except StoreError as exc:
        if "different configuration" not in str(exc):
            raise
        raise StoreError(f"{str(exc).split('; use another')[0]}. The explainer study in "
                         f"{Path(output_dir).resolve()} was made with other settings (e.g. another `cases`). To "
                         "recompute it: `xbench reproduce ... -p overwrite true` (notebook "
                         "11), `explainer_study(..., overwrite=True)`, or delete that folder.") from exc
    finally:
        _replay_combined(caught, cases)
    tables = load_tables(study_cfg.output_dir)
    dspec = study_cfg.datasets[0]
    dataset = open_dataset(dspec)
    device = study_cfg.resolved_device()
    faith = pd.concat([faithfulness_table(open_model(s, device, dspec, study_cfg.output_dir), dataset, cases=cases,
                                          steps=steps, road=road) for s in specs], ignore_index=True)
    tables_dir = contained_folder(output_dir, "tables")
    write_frame(faith, tables_dir / "faithfulness_cases.csv")
    summary = faithfulness_summary(faith, n_boot=study_cfg.bootstrap_replicates if n_boot is None else n_boot,
                                   seed=study_cfg.bootstrap_seed)
    write_frame(summary, tables_dir / "faithfulness.csv")
    frame = plausibility_vs_faithfulness(tables["metrics"], summary, dataset=dspec.name)
    write_frame(frame, tables_dir / "plausibility_vs_faithfulness.csv")
    return Study(study_cfg, tables["metrics"], faith, summary, frame, skipped)
