"""Post-hoc explainers as map sources over any adapter.

``explained(adapter, "gradcam")`` returns an :class:`ExplainedAdapter` named ``"<model>+gradcam"``; a run config
chooses one with a model entry ``{name: kad, explainer: gradcam}``. Explainers: :data:`EXPLAINERS`
(``gradcam``, ``gradcampp``, ``gradxinput``, ``ig``, ``attngrad``; :mod:`xbench.explain.methods` says what each
computes). Faithfulness and sanity metrics of maps: :mod:`xbench.metrics.faithfulness`; per-case tables over a
dataset: :mod:`xbench.explain.faithfulness`.
"""
from __future__ import annotations

from typing import Any

from ..core.errors import UnknownNameError
from ..models.base import Adapter
from .base import ExplainedAdapter, Explainer, gradients_through_adapters, score_logits
from .methods import EXPLAINERS


def create_explainer(name: str, **options: Any) -> Explainer:
    """The explainer registered as ``name`` (unknown names: an error with "did you mean")."""
    if name not in EXPLAINERS:
        raise UnknownNameError("explainer", name, EXPLAINERS)
    return EXPLAINERS[name](**options)


def explained(adapter: Adapter, explainer: str | Explainer, **options: Any) -> ExplainedAdapter:
    """``adapter`` with its maps replaced by ``explainer``'s (a name of :data:`EXPLAINERS` or an instance)."""
    method = create_explainer(explainer, **options) if isinstance(explainer, str) else explainer
    return ExplainedAdapter(adapter, method)


__all__ = ["EXPLAINERS", "ExplainedAdapter", "Explainer", "create_explainer", "explained",
           "gradients_through_adapters", "score_logits"]
