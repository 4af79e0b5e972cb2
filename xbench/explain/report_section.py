"""The HTML report's "Explainers and faithfulness" section (present when notebook 11 ran on the run folder)."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

#: where :func:`xbench.workflows.explain_study.explainer_study` writes its joined table inside a run folder (notebook 11)
STUDY_TABLE = Path("explain") / "tables" / "plausibility_vs_faithfulness.csv"


def explain_sections(run_dir: str | Path) -> list[tuple[str, str, pd.DataFrame]]:
    """``[(title, note, table)]`` when the run folder has the study table, else ``[]`` (the report's template renders
    and escapes the note and the table as its other blocks)."""
    path = Path(run_dir) / STUDY_TABLE
    if not path.is_file():
        return []
    frame = pd.read_csv(path).round(3)
    note = ("Post-hoc explainers (<model>+<explainer>) beside the models' own maps: "
            "plausibility (pooled pointing, Dice) against faithfulness (insertion AUC − deletion AUC, black-image "
            "baseline) and the randomisation sanity check (Spearman similarity to the map of the randomly "
            f"initialised model; lower is better), with 95 % bootstrap CIs. Source: {STUDY_TABLE} "
            "(notebook 11); the figure is figures/explain_plausibility_vs_faithfulness.png.")
    return [("Explainers and faithfulness", note, frame)]
