"""Preflight: everything a run needs, checked before any model is built (``xbench check``).

It sits below inference and evaluation, which both ask it which models of a run config are runnable.
"""
from .checks import (DatasetCheck, ModelCheck, PreflightError, PreflightReport, check_dataset, check_device,
                     check_model, model_weights, preflight, runnable_models, summary)

__all__ = ["preflight", "PreflightReport", "DatasetCheck", "ModelCheck", "PreflightError", "runnable_models",
           "check_dataset", "check_model", "check_device", "model_weights", "summary"]
