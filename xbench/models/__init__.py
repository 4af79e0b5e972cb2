"""Model adapters behind one factory door, :func:`create_model`."""
from __future__ import annotations

from ..spec.registry import list_models
from .base import Adapter, Prediction, create_model

__all__ = ["Adapter", "Prediction", "create_model", "list_models"]
