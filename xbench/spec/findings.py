"""Canonical finding ids, so the same finding lines up across datasets.

Two names per class
-------------------
Each dataset manifest lists its classes with the dataset's **own spelling** as
``name`` (``Effusion`` in NIH and ChestX-Det10, ``Pleural Effusion`` in
CheXlocalize, ``Pleural effusion`` in VinDr-CXR) and a canonical ``finding`` id
from :data:`CANONICAL` (all three → ``pleural_effusion``).

* ``name`` is what the loaders, labels, regions and per-dataset results use.
  The paper's "36 findings" count distinct per-dataset strings (case
  sensitive), so tables keep these spellings apart as display names
  (datasets.md, "Other findings").
* ``finding`` merges synonyms (Effusion / Pleural Effusion / Pleural effusion;
  Infiltrate / Infiltration; Fibrosis / Pulmonary fibrosis; Airspace Opacity /
  Lung Opacity; Pleural Thickening / Pleural thickening / Pleural_Thickening)
  so cross-dataset analyses can group by finding. Findings that are broader or
  narrower are **not** merged: ``Fracture`` vs ``Rib fracture`` vs
  ``Clavicle fracture``; ``Nodule`` vs ``Mass`` vs VinDr's ``Nodule/Mass``;
  ``Nodule`` vs ChestX-Det's ``Diffuse Nodule``; ``Pneumonia`` vs
  ``Consolidation``.

:func:`canonical` maps any known spelling (a dataset's class string, in any
case, with ``_`` / ``-`` / repeated spaces treated as one space) or a canonical
id to the id.
"""
from __future__ import annotations

import re

from ..core.errors import UnknownNameError

__all__ = ["CANONICAL", "SYNONYMS", "canonical", "display_name"]

#: canonical id → display name. Covers every class of the seven XBench sources
#: (RSNA, SIIM-ACR, COVID-19 Rural, ChestX-Det10 / ChestX-Det, CheXlocalize,
#: NIH ChestX-ray14 boxes and labels, VinDr-CXR local and global labels).
CANONICAL: dict[str, str] = {
    "aortic_enlargement": "Aortic enlargement",
    "atelectasis": "Atelectasis",
    "calcification": "Calcification",
    "cardiomegaly": "Cardiomegaly",
    "clavicle_fracture": "Clavicle fracture",
    "consolidation": "Consolidation",
    "copd": "COPD",
    "covid19_opacity": "COVID-19 opacity",
    "diffuse_nodule": "Diffuse nodule",
    "edema": "Edema",
    "emphysema": "Emphysema",
    "enlarged_cardiomediastinum": "Enlarged cardiomediastinum",
    "enlarged_pa": "Enlarged pulmonary artery",
    "fibrosis": "Fibrosis",
    "fracture": "Fracture",
    "hernia": "Hernia",
    "infiltration": "Infiltration",
    "interstitial_lung_disease": "Interstitial lung disease",
    "lung_cavity": "Lung cavity",
    "lung_cyst": "Lung cyst",
    "lung_lesion": "Lung lesion",
    "lung_opacity": "Lung opacity",
    "lung_tumor": "Lung tumor",
    "mass": "Mass",
    "mediastinal_shift": "Mediastinal shift",
    "no_finding": "No finding",
    "nodule": "Nodule",
    "nodule_mass": "Nodule/Mass",
    "other_disease": "Other disease",
    "other_lesion": "Other lesion",
    "pleural_effusion": "Pleural effusion",
    "pleural_other": "Pleural other",
    "pleural_thickening": "Pleural thickening",
    "pneumonia": "Pneumonia",
    "pneumothorax": "Pneumothorax",
    "rib_fracture": "Rib fracture",
    "support_devices": "Support devices",
    "tuberculosis": "Tuberculosis",
}

#: dataset spellings (normalised: lower case, single spaces) that differ from
#: the canonical id → canonical id. Spellings equal to an id or its display
#: name need no entry.
SYNONYMS: dict[str, str] = {
    "effusion": "pleural_effusion",  # NIH, ChestX-Det10
    "infiltrate": "infiltration",  # NIH BBox_List_2017.csv
    "pulmonary fibrosis": "fibrosis",  # VinDr-CXR
    "airspace opacity": "lung_opacity",  # CheXlocalize JSON (Lung Opacity in the CSV)
    "ild": "interstitial_lung_disease",  # VinDr-CXR
    "enlarged pa": "enlarged_pa",  # VinDr-CXR
    "other diseases": "other_disease",  # VinDr-CXR train labels (test: Other disease)
    "covid 19": "covid19_opacity",
    "covid 19 pneumonia": "covid19_opacity",
    "groud glass opacity": "covid19_opacity",  # sic: COVID-19 Rural LabelMe opacity label
}


def _normalise(name: str) -> str:
    return re.sub(r"[\s_\-]+", " ", name.strip().lower())


_LOOKUP: dict[str, str] = {}
for _id, _display in CANONICAL.items():
    _LOOKUP[_normalise(_id)] = _id
    _LOOKUP[_normalise(_display)] = _id
_LOOKUP.update({_normalise(k): v for k, v in SYNONYMS.items()})


def canonical(name: str) -> str:
    """Canonical finding id of a dataset class name or id.

    Matching ignores case and treats ``_``, ``-`` and runs of whitespace as
    one space (``"Pleural_Thickening"`` → ``"pleural_thickening"``).

    Raises
    ------
    UnknownNameError
        ``name`` is not a known spelling; the message suggests close ids.
    """
    found = _LOOKUP.get(_normalise(name)) if isinstance(name, str) else None
    if found is None:
        raise UnknownNameError("finding", str(name), CANONICAL)
    return found


def display_name(finding: str) -> str:
    """Display name of a canonical id (or any known spelling)."""
    return CANONICAL[canonical(finding)]
