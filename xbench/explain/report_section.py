"""The HTML report's "Explainers and faithfulness" section (present when notebook 11 ran on the run folder)."""
from __future__ import annotations

import html
from pathlib import Path

import pandas as pd

#: where :func:`xbench.explain.study.explainer_study` writes its joined table inside a run folder (notebook 11)
STUDY_TABLE = Path("explain") / "tables" / "plausibility_vs_faithfulness.csv"


def explain_sections(run_dir: str | Path) -> list[tuple[str, str, pd.DataFrame]]:
    """``[(title, html note, table)]`` when the run folder has the study table, else ``[]`` (the report renders
    the table as its other tables)."""
    path = Path(run_dir) / STUDY_TABLE
    if not path.is_file():
        return []
    frame = pd.read_csv(path).round(3)
    note = ("<p>Post-hoc explainers (<code>&lt;model&gt;+&lt;explainer&gt;</code>) beside the models' own maps: "
            "plausibility (pooled pointing, Dice) against faithfulness (insertion AUC − deletion AUC, black-image "
            "baseline) and the randomisation sanity check (Spearman similarity to the map of the randomly "
            f"initialised model; lower is better), with 95 % bootstrap CIs. Source: {html.escape(str(STUDY_TABLE))} "
            "(notebook 11); the figure is <code>figures/explain_plausibility_vs_faithfulness.png</code>.</p>")
    return [("Explainers and faithfulness", note, frame)]
