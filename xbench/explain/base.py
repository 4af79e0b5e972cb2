"""The explainer contract: a post-hoc map source over any adapter, itself an :class:`~xbench.models.Adapter`.

:class:`ExplainedAdapter` wraps a built adapter and an :class:`Explainer`. It keeps the wrapped model's
preprocessing, input window and score rule, returns the wrapped model's scores unchanged, and replaces its maps
by the explainer's. Its name is ``"<model>+<explainer>"`` (``"kad+gradcam"``), so the results store, every table,
figure, the report, ``xbench score`` and the exports treat it as one more model variant.

What is explained: the class *logit* of the adapter's score (``log p - log(1 - p)`` for ``score_rule:
probability``, clamped to ``p`` in [1e-6, 1 - 1e-6]; the score itself for ``logit`` / ``constant`` / ``random``
rules), so that saturated probabilities do not flatten the gradients. A score that does not depend on the pixels
(the prior baselines) has no gradient: its explanation is an all-zero map, by definition.

Gradients through adapters: adapters run their forward pass under ``torch.no_grad`` (decorator or block). While an
explainer runs, :func:`gradients_through_adapters` makes ``torch.no_grad`` keep the current grad mode (and leaves
``inference_mode``), so the adapter's own ``predict`` — its exact scoring code, no copy of it — is differentiated.
It is a process-wide switch held only during one explanation call; text encoders then also build graphs, which
are dropped at the end of the call (prompt caches are filled by one gradient-free ``predict`` beforehand).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from ..core.errors import XBenchError
from ..models.base import Adapter, Prediction

_LOGIT_EPS = 1e-6


@contextmanager
def gradients_through_adapters() -> Iterator[None]:
    """Within the block, ``torch.no_grad()`` keeps the grad mode it finds; grad mode is on, inference mode off."""
    no_grad = torch.autograd.grad_mode.no_grad
    original = no_grad.__enter__

    def keep_mode(self: Any) -> None:
        self.prev = torch.is_grad_enabled()

    no_grad.__enter__ = keep_mode  # type: ignore[method-assign]
    try:
        with torch.inference_mode(False), torch.enable_grad():
            yield
    finally:
        no_grad.__enter__ = original  # type: ignore[method-assign]


def score_logits(adapter: Adapter, scores: torch.Tensor) -> torch.Tensor:
    """The quantity explained: the logit of probability scores, else the score itself (module docstring)."""
    if adapter.score_rule == "probability":
        p = scores.clamp(_LOGIT_EPS, 1 - _LOGIT_EPS)
        return torch.log(p) - torch.log1p(-p)
    return scores


def explain_fact(adapter: Adapter, key: str, explainer: str) -> str:
    """The model YAML's ``key`` (``explain_layer`` / ``explain_attention``), or an error saying the model has none."""
    value = adapter.config.get(key)
    if not value:
        raise XBenchError(f"explainer {explainer!r} needs '{key}' in the YAML of model {adapter.name!r} "
                          f"(xbench/configs/models/{adapter.name}.yaml): the dotted path of the module it hooks, "
                          f"e.g. 'model.image'; {adapter.name!r} has none"
                          + (" — a prior baseline has no image encoder" if adapter.map_source == "prior" else ""))
    return str(value)


def module_at(adapter: Adapter, path: str) -> nn.Module:
    """The module at a dotted attribute path from the adapter (``"network.image_encoder.res_features"``)."""
    obj: Any = adapter
    for part in path.split("."):
        if not hasattr(obj, part):
            raise XBenchError(f"model {adapter.name!r}: YAML path {path!r} does not exist ({part!r} is not an "
                              f"attribute of {type(obj).__name__})")
        obj = getattr(obj, part)
    if not isinstance(obj, nn.Module):
        raise XBenchError(f"model {adapter.name!r}: YAML path {path!r} is a {type(obj).__name__}, not a torch module")
    return obj


def tokens_to_grid(act: torch.Tensor, batch: int) -> torch.Tensor:
    """A layer output as ``(B, D, h, w)``: conv maps as they are; ViT tokens ``(B, N, D)`` (or ``(N, B, D)``)
    without their leading extra tokens (CLS, registers), reshaped row-major to the square patch grid."""
    if act.ndim == 4:
        return act
    if act.ndim != 3:
        raise XBenchError(f"explainer layer output has shape {tuple(act.shape)}: expected (B, D, h, w) or tokens")
    if act.shape[0] != batch and act.shape[1] == batch:
        act = act.transpose(0, 1)
    side = int(np.sqrt(act.shape[1]))
    patches = act[:, act.shape[1] - side * side:]
    return patches.transpose(1, 2).reshape(batch, -1, side, side)


class Explainer(ABC):
    """A post-hoc map method. ``explain(adapter, pixels, prompts)`` → ``(scores (B, C), maps (B, C, h, w))``."""

    name: ClassVar[str] = ""
    #: "layer" (maps at a hooked layer's grid), "input" (pixel attributions pooled by ``pool``), "attention"
    kind: ClassVar[str] = "input"
    #: the model-YAML key this explainer needs (``explain_layer`` / ``explain_attention``), if any
    requires: ClassVar[str | None] = None

    def __init__(self, pool: int = 4):
        self.pool = int(pool)

    def grid(self, adapter: Adapter) -> tuple[int, int]:
        """The map grid this explainer gives for ``adapter`` (input size // pool for pixel methods)."""
        if self.kind == "input":
            return (adapter.input_size // self.pool, adapter.input_size // self.pool)
        return adapter.grid

    @abstractmethod
    def explain(self, adapter: Adapter, pixels: torch.Tensor, prompts: Sequence[str]) -> Prediction:
        """Scores of the adapter and this method's maps, both float32 on the CPU."""

    def pool_input(self, attribution: torch.Tensor) -> torch.Tensor:
        """Pixel attributions ``(B, 3, S, S)`` → channel sum, average-pooled ``pool x pool`` → ``(B, S/p, S/p)``."""
        summed = attribution.sum(1, keepdim=True)
        return torch.nn.functional.avg_pool2d(summed, self.pool)[:, 0] if self.pool > 1 else summed[:, 0]


def forward_logits(adapter: Adapter, pixels: torch.Tensor, prompts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """The adapter's scores (detached) and the differentiable logits ``(B, C)`` of ``pixels``; call inside
    :func:`gradients_through_adapters`."""
    scores = adapter.predict(pixels, prompts).scores
    return scores.detach(), score_logits(adapter, scores)


def class_gradients(logits: torch.Tensor, wrt: Sequence[torch.Tensor]) -> Iterator[list[torch.Tensor]]:
    """Per class ``c``: the gradients of ``logits[:, c].sum()`` with respect to each of ``wrt`` (zeros where the
    logit does not depend on it). One forward, one backward per class (the graph is kept between classes)."""
    n = logits.shape[1]
    for c in range(n):
        if not logits.requires_grad:
            yield [torch.zeros_like(t) for t in wrt]
            continue
        grads = torch.autograd.grad(logits[:, c].sum(), list(wrt), retain_graph=c < n - 1, allow_unused=True)
        yield [torch.zeros_like(t) if g is None else g for g, t in zip(grads, wrt)]


class ExplainedAdapter(Adapter):
    """``adapter`` whose maps come from ``explainer`` (module docstring); built by :func:`xbench.explain.explained`."""

    def __init__(self, adapter: Adapter, explainer: Explainer):
        config = {**adapter.config, "name": f"{adapter.name}+{explainer.name}",
                  "map_source": f"explainer:{explainer.name}"}
        super().__init__(config, adapter.device)
        self.inner, self.explainer = adapter, explainer
        self.weights_label = adapter.weights_label
        self.grid = explainer.grid(adapter)
        self._warm: set[tuple[str, ...]] = set()

    def preprocess(self, image: np.ndarray) -> torch.Tensor:
        return self.inner.preprocess(image)

    def input_window(self, size: tuple[int, int]) -> tuple[float, float, float, float]:
        return self.inner.input_window(size)

    def to_probability(self, scores: torch.Tensor | np.ndarray) -> np.ndarray:
        return self.inner.to_probability(scores)

    def predict(self, pixels: torch.Tensor, prompts: Sequence[str]) -> Prediction:
        key = tuple(prompts)
        if key not in self._warm:  # fill the adapter's prompt caches without a graph
            with torch.inference_mode(False), torch.no_grad():
                self.inner.predict(pixels[:1].clone(), prompts)
            self._warm.add(key)
        with gradients_through_adapters():
            pred = self.explainer.explain(self.inner, pixels.clone(), prompts)  # a clone: not an inference tensor
        maps = pred.maps.detach().float().cpu()
        if tuple(maps.shape[2:]) != tuple(self.grid):
            raise XBenchError(f"{self.name}: the explainer gave maps of grid {tuple(maps.shape[2:])}, expected "
                              f"{self.grid} (check explain_layer in the model's YAML)")
        return Prediction(pred.scores.detach().float().cpu(), maps)

    def predict_cases(self, pixels: torch.Tensor, prompts: Sequence[str], case_ids: Sequence[str]) -> Prediction:
        """:meth:`predict`; for an adapter whose output is keyed by the case (the random prior) its scores come
        from its own ``predict_cases``, so the variant keeps exactly the stored scores of the model."""
        pred = self.predict(pixels, prompts)
        if type(self.inner).predict_cases is not Adapter.predict_cases:
            pred = Prediction(self.inner.predict_cases(pixels, prompts, case_ids).scores.float().cpu(), pred.maps)
        return pred

    def describe(self) -> dict[str, Any]:
        return {**self.inner.describe(), "model": self.name, "map_source": self.map_source,
                "grid": f"{self.grid[0]}x{self.grid[1]}"}
