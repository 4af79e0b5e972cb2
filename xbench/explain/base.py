"""The explainer contract: a post-hoc map source over any adapter, itself an :class:`~xbench.models.Adapter`.

:class:`ExplainedAdapter` wraps a built adapter and an :class:`Explainer`. It keeps the wrapped model's
preprocessing, input window and score rule, returns the wrapped model's scores unchanged, and replaces its maps
by the explainer's. Its name is ``"<model>+<explainer>"`` (``"kad+gradcam"``), so the results store, every table,
figure, the report, ``xbench score`` and the exports treat it as one more model variant.

What is explained: the class *logit* of the adapter's score — the score itself for ``logit`` / ``constant`` /
``random`` rules; for ``score_rule: probability`` the log-odds ``log p − log(1 − p)`` computed from the model's own
pre-sigmoid / pre-softmax values, never from the rounded probability: while the adapter's ``predict`` runs,
:class:`_LogOdds` (a torch function mode) follows each ``sigmoid`` / ``softmax`` output through selections
(indexing, ``float``/``cpu``/``to``, reshapes, ``stack``/``cat``, ``where``) and means, carrying
``(log p, log(1 − p))`` from the logits: ``logsigmoid(±z)`` for a sigmoid; ``log_softmax`` and the log-sum-exp of
the other classes for a softmax (``z₁ − z₀`` for two classes); a mean of probabilities by log-mean-exp of both. So
a probability that rounds to 1.0 in float32 still has the logit's gradient (a clamp of ``p`` would have none).
A probability score reached by any other operation is refused with an error naming the model. A score that does
not depend on the pixels (the prior baselines) has no gradient: its explanation is an all-zero map, by
definition.

Map scale: an explainer's maps are returned multiplied per map by a power of two that puts their largest
|value| in [2^14, 2^15) (:func:`float16_ready`): the metrics min–max normalise each map, so nothing they compute
changes, while the results store's float16 then holds every value within 2^-11 relative (raw gradient maps
would fall below float16's normal range or overflow it).

Gradients through adapters: adapters run their forward pass under ``torch.no_grad`` (decorator or block). While an
explainer runs, :func:`gradients_through_adapters` makes ``torch.no_grad`` keep the current grad mode (and leaves
``inference_mode``), so the adapter's own ``predict`` — its exact scoring code, no copy of it — is differentiated.
It is a process-wide switch held only during one explanation call; text encoders then also build graphs, which
are dropped at the end of the call (prompt caches are filled by one gradient-free ``predict`` beforehand).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
import warnings
from contextlib import contextmanager
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from ..core.errors import XBenchError, XBenchWarning
from ..models.base import Adapter, Prediction

_LO = "_xbench_log_odds"  # tensor attribute: the lazy (log p, log(1 − p)) of a probability tensor


class _LogOddsNode:
    """How to compute ``(log p, log(1 − p))`` of one probability tensor from the logits it came from (lazy: only the
    score's chain is ever computed, not every attention softmax of the forward pass)."""

    def __init__(self, kind: str, *parts: Any):
        self.kind, self.parts = kind, parts

    def pair(self) -> tuple[torch.Tensor, torch.Tensor]:
        kind, parts = self.kind, self.parts
        if kind == "sigmoid":
            z = parts[0]
            return F.logsigmoid(z), F.logsigmoid(-z)
        if kind == "softmax":
            z, dim = parts
            zs = z.movedim(dim, -1)
            c = zs.shape[-1]
            others = zs.unsqueeze(-2).expand(*zs.shape[:-1], c, c)
            others = others.masked_fill(torch.eye(c, dtype=torch.bool, device=z.device), float("-inf"))
            lse = torch.logsumexp(zs, -1, keepdim=True)
            return (zs - lse).movedim(-1, dim), (torch.logsumexp(others, -1) - lse).movedim(-1, dim)
        if kind == "apply":  # a selection: the same call on log p and on log(1 − p)
            func, args, kwargs, node = parts
            lp, lq = node.pair()
            return func(lp, *args[1:], **kwargs), func(lq, *args[1:], **kwargs)
        if kind == "join":  # stack / cat of probability tensors
            func, nodes, rest, kwargs = parts
            pairs = [n.pair() for n in nodes]
            return func([p for p, _ in pairs], *rest, **kwargs), func([q for _, q in pairs], *rest, **kwargs)
        if kind == "where":
            cond, a, b = parts
            (ap, aq), (bp, bq) = a.pair(), b.pair()
            return torch.where(cond, ap, bp), torch.where(cond, aq, bq)
        if kind == "mean":  # 1 − mean(p) = mean(1 − p): both by log-mean-exp
            node, dims, keepdim, count = parts
            lp, lq = node.pair()
            return (torch.logsumexp(lp, dims, keepdim) - np.log(count), torch.logsumexp(lq, dims, keepdim) - np.log(count))
        raise AssertionError(kind)


_SELECTIONS = {
    torch.Tensor.__getitem__, torch.Tensor.float, torch.Tensor.double, torch.Tensor.to, torch.Tensor.cpu,
    torch.Tensor.cuda, torch.Tensor.view, torch.Tensor.reshape, torch.reshape, torch.Tensor.squeeze, torch.squeeze,
    torch.Tensor.unsqueeze, torch.unsqueeze, torch.Tensor.permute, torch.permute, torch.Tensor.transpose,
    torch.transpose, torch.Tensor.contiguous, torch.Tensor.clone, torch.clone, torch.Tensor.expand,
    torch.Tensor.expand_as, torch.Tensor.flatten, torch.flatten, torch.Tensor.narrow, torch.narrow,
    torch.Tensor.select, torch.select, torch.Tensor.index_select, torch.index_select, torch.Tensor.movedim,
    torch.movedim, torch.Tensor.type_as,
}
_SIGMOIDS = {torch.sigmoid, torch.Tensor.sigmoid, torch.special.expit, F.sigmoid}
_SOFTMAXES = {torch.softmax, torch.Tensor.softmax, F.softmax, torch.special.softmax}


def _softmax_dim(args: tuple, kwargs: dict) -> int:
    dim = kwargs.get("dim", args[1] if len(args) > 1 else None)
    if dim is None:
        raise XBenchError("softmax without dim: XBench cannot tell which axis holds the classes")
    return int(dim)


def _tagged(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and hasattr(t, _LO)


def _source_node(func: Any, args: tuple, kwargs: dict) -> _LogOddsNode | None:
    """A sigmoid / softmax output: its log-odds from its input logits."""
    if func in _SIGMOIDS:
        return _LogOddsNode("sigmoid", args[0])
    if func in _SOFTMAXES and kwargs.get("dtype") is None:
        return _LogOddsNode("softmax", args[0], _softmax_dim(args, kwargs))
    return None


def _mean_node(first: torch.Tensor, args: tuple, kwargs: dict) -> _LogOddsNode:
    dims = kwargs.get("dim", args[1] if len(args) > 1 else None)
    dims = tuple(range(first.ndim)) if dims is None else (dims if isinstance(dims, (tuple, list)) else (dims,))
    count = int(np.prod([first.shape[d] for d in dims]))
    keepdim = bool(kwargs.get("keepdim", args[2] if len(args) > 2 else False))
    return _LogOddsNode("mean", getattr(first, _LO), tuple(dims), keepdim, count)


def _derived_node(func: Any, first: torch.Tensor, args: tuple, kwargs: dict) -> _LogOddsNode | None:
    """An operation on a tagged probability tensor: a selection or a mean keeps the tag; an in-place change drops it."""
    if func in _SELECTIONS:
        return _LogOddsNode("apply", func, args, kwargs, getattr(first, _LO))
    if func in (torch.mean, torch.Tensor.mean) and not first.is_complex():
        return _mean_node(first, args, kwargs)
    if getattr(func, "__name__", "").endswith("_"):  # changed in place: no longer the probability
        delattr(first, _LO)
    return None


def _combined_node(func: Any, args: tuple, kwargs: dict) -> _LogOddsNode | None:
    """``stack`` / ``cat`` of tagged tensors, or ``where`` choosing between two."""
    first = args[0]
    if func in (torch.stack, torch.cat) and isinstance(first, (list, tuple)) and first and all(map(_tagged, first)):
        return _LogOddsNode("join", func, [getattr(t, _LO) for t in first], args[1:], kwargs)
    if func is torch.where and len(args) == 3 and all(map(_tagged, args[1:])):
        return _LogOddsNode("where", args[0], getattr(args[1], _LO), getattr(args[2], _LO))
    return None


class _LogOdds(TorchFunctionMode):
    """Tags every probability tensor made during the block with its lazy log-odds (module docstring)."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if not isinstance(out, torch.Tensor) or not args:
            return out
        node = _source_node(func, args, kwargs)
        if node is None and _tagged(args[0]):
            if out is args[0]:
                return out
            node = _derived_node(func, args[0], args, kwargs)
        elif node is None:
            node = _combined_node(func, args, kwargs)
        if node is not None:
            setattr(out, _LO, node)
        return out


@contextmanager
def frozen_weights(adapter: Adapter) -> Iterator[None]:
    """Within the block, the parameters of the adapter's networks (its attributes that are torch modules) do not
    require gradients; restored after.

    Why: explainers differentiate with respect to pixels or a layer's output, never weights. With the weights frozen
    a forward pass records a graph only from tensors that require gradients: a layer explainer that marks the hooked
    layer's output (:class:`~xbench.explain.methods._LayerCAM`) records none for the trunk below it, and backward
    passes compute no weight-side products. Gradients with respect to pixels or activations are unchanged.
    """
    params = [p for value in vars(adapter).values() if isinstance(value, nn.Module)
              for p in value.parameters() if p.requires_grad]
    for p in params:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p in params:
            p.requires_grad_(True)



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
    """The quantity explained: the log-odds of probability scores from the logits they were computed from (the
    scores of a ``predict`` run under :class:`_LogOdds`, as :func:`forward_logits` does), else the score itself
    (module docstring)."""
    if adapter.score_rule != "probability" or not scores.requires_grad:
        return scores
    node = getattr(scores, _LO, None)
    if node is None:
        raise XBenchError(f"{adapter.name}: its probability score is not a sigmoid / softmax output that XBench can "
                          "follow back to the model's logits (through indexing, dtype/device moves, reshapes, "
                          "stack/cat, where and means); explaining it would differentiate a rounded probability. "
                          "Give the adapter score_rule 'logit' with raw logits, or compute the probability by "
                          "those operations")
    log_p, log_q = node.pair()
    return log_p - log_q


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

    def __init__(self, pool: int = 4, class_chunk: int | None = None):
        self.pool = int(pool)
        #: classes per batched backward (None: by :data:`GRADIENT_BUDGET_BYTES`); maps do not depend on it
        self.class_chunk = class_chunk

    def grid(self, adapter: Adapter) -> tuple[int, int]:
        """The map grid this explainer gives for ``adapter`` (input size // pool for pixel methods)."""
        if self.kind == "input":
            return (adapter.input_size // self.pool, adapter.input_size // self.pool)
        return adapter.grid

    @abstractmethod
    def explain(self, adapter: Adapter, pixels: torch.Tensor, prompts: Sequence[str]) -> Prediction:
        """Scores ``(B, C)`` of the adapter and this method's maps ``(B, C, h, w)``, on the pixels' device (the
        caller casts them to float32 on the CPU once)."""

    def pool_input(self, attribution: torch.Tensor) -> torch.Tensor:
        """Pixel attributions ``(..., 3, S, S)`` → channel sum, average-pooled ``pool x pool`` →
        ``(..., S/p, S/p)`` (leading dimensions kept: classes, images)."""
        lead = attribution.shape[:-3]
        summed = attribution.reshape(-1, *attribution.shape[-3:]).sum(1, keepdim=True)
        pooled = torch.nn.functional.avg_pool2d(summed, self.pool)[:, 0] if self.pool > 1 else summed[:, 0]
        return pooled.reshape(*lead, *pooled.shape[-2:])


def forward_logits(adapter: Adapter, pixels: torch.Tensor, prompts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """The adapter's scores (detached) and the differentiable logits ``(B, C)`` of ``pixels``; call inside
    :func:`gradients_through_adapters`."""
    with _LogOdds():
        scores = adapter.predict(pixels, prompts).scores
    return scores.detach(), score_logits(adapter, scores)


#: Gradient bytes one batched backward may produce at the differentiated tensors (all classes of a chunk together):
#: classes are split into chunks that stay under it (:func:`class_chunk`); results do not depend on the chunking.
GRADIENT_BUDGET_BYTES = 2**31


def class_chunk(wrt: Sequence[torch.Tensor], classes: int, chunk: int | None = None) -> int:
    """Classes per batched backward: ``chunk`` when given, else the fewest equal chunks whose gradients at ``wrt``
    (4 bytes per element, float32) stay within :data:`GRADIENT_BUDGET_BYTES` (at least 1 class).

    >>> big = torch.empty(2**28, device="meta")  # 1 GiB of float32 gradients per class
    >>> class_chunk([torch.zeros(2**20)], 14), class_chunk([big], 14), class_chunk([big[:2**27 + 1]], 14)
    (14, 2, 3)
    """
    if chunk is not None:
        if int(chunk) < 1:
            raise XBenchError(f"class_chunk must be >= 1 (classes per batched backward), got {chunk}")
        return int(chunk)
    per_class = 4 * sum(t.numel() for t in wrt)
    most = max(1, min(classes, GRADIENT_BUDGET_BYTES // max(per_class, 1)))
    return -(-classes // -(-classes // most))  # chunks of equal size: 14 classes by at most 13 → 7 + 7


#: the start of the warning given when a model's backward cannot be batched over classes (benchmarks look for it)
FALLBACK_NOTE = "class gradients: the batched backward failed, one backward per class instead (same values, slower)"


def class_gradients(logits: torch.Tensor, wrt: Sequence[torch.Tensor], chunk: int | None = None
                    ) -> Iterator[tuple[int, int, list[torch.Tensor]]]:
    """The gradients of every class logit ``logits[:, c].sum()`` with respect to each of ``wrt``, by chunks of
    classes: yields ``(start, stop, grads)`` with ``grads[i]`` of shape ``(stop − start, *wrt[i].shape)`` on
    ``wrt[i]``'s device (zeros where a logit does not depend on it).

    One backward call per chunk (:func:`class_chunk`), the classes as a batch dimension of one-hot cotangents
    (``torch.autograd.grad(..., is_grads_batched=True)``: vmap over the backward); a model whose backward vmap cannot
    batch falls back to one backward per class, with the same values. The graph is kept (``retain_graph``) for the
    next chunk; it is freed with the caller's references to ``logits``.
    """
    n = logits.shape[1]
    size = class_chunk(wrt, n, chunk)
    for start in range(0, n, size):
        stop = min(n, start + size)
        if not logits.requires_grad:
            yield start, stop, [t.new_zeros((stop - start, *t.shape)) for t in wrt]
            continue
        yield start, stop, _chunk_gradients(logits, list(wrt), start, stop)


def _chunk_gradients(logits: torch.Tensor, wrt: list[torch.Tensor], start: int, stop: int) -> list[torch.Tensor]:
    k = stop - start
    one_hot = torch.zeros((k, *logits.shape), dtype=logits.dtype, device=logits.device)
    one_hot[torch.arange(k), :, torch.arange(start, stop)] = 1
    try:
        grads = torch.autograd.grad([logits], wrt, grad_outputs=[one_hot], retain_graph=True, allow_unused=True,
                                    is_grads_batched=True)
    except (RuntimeError, NotImplementedError) as exc:  # an operation vmap cannot batch: one backward per class
        warnings.warn(f"{FALLBACK_NOTE}: {type(exc).__name__}: {str(exc)[:200]}", XBenchWarning, stacklevel=2)
        per_class = [torch.autograd.grad([logits], wrt, grad_outputs=[one_hot[j]], retain_graph=True,
                                         allow_unused=True) for j in range(k)]
        grads = tuple(None if per_class[0][i] is None else torch.stack([g[i] for g in per_class])
                      for i in range(len(wrt)))
    return [t.new_zeros((k, *t.shape)) if g is None else g for g, t in zip(grads, wrt)]


#: Explainer maps are scaled per map so that their largest |value| lies in [2^14, 2^15) (module docstring).
FLOAT16_TOP = 14


def float16_ready(maps: torch.Tensor) -> torch.Tensor:
    """``maps (B, C, h, w)`` each multiplied by the power of two that puts its largest finite |value| in
    ``[2^14, 2^15)`` (all-zero and non-finite maps unchanged).

    Why: raw explainer maps (gradient × input, IG) have magnitudes anywhere from 1e-9 to 1e5; cast to the store's
    float16 as they are, values fall below its normal range (relative error up to 100 %, flushed to 0) or above
    65,504 (inf). A power of two changes no metric (every metric min–max normalises each map, and scaling by 2^k is
    exact in floating point), and after it the float16 cast errs by ≤ 2^-11 relative for every value ≥ 2^-28 of
    the map's largest (absolutely by ≤ 2^-25 of the largest below that).

    Examples
    --------
    >>> m = torch.tensor([[[[3e-7, -1e-9], [0.0, 1.5e-7]]]])
    >>> out = float16_ready(m)
    >>> round(float(out.abs().max()) / 2**14, 4), bool(torch.equal(out / out.abs().max(), m / m.abs().max()))
    (1.2583, True)
    """
    finite = torch.where(torch.isfinite(maps), maps.abs(), torch.zeros_like(maps))
    top = finite.flatten(2).amax(-1)  # (B, C)
    _, exponent = torch.frexp(top)  # top = mantissa · 2^exponent, mantissa in [0.5, 1)
    shift = torch.where(top > 0, FLOAT16_TOP + 1 - exponent, torch.zeros_like(exponent))
    return torch.ldexp(maps, shift[..., None, None].to(maps.dtype)) if maps.numel() else maps


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

    @property
    def preprocess_delegate(self) -> Adapter:
        """The adapter whose preprocessing this one is: its GPU preprocessing plan is this one's
        (:func:`xbench.inference.gpu_preprocess.plan_for`), so explainer runs decode and preprocess as native runs."""
        return self.inner

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
        with gradients_through_adapters(), frozen_weights(self.inner):
            pred = self.explainer.explain(self.inner, pixels.clone(), prompts)  # a clone: not an inference tensor
        maps = float16_ready(pred.maps.detach().float()).cpu()  # on the device; one copy to the host
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
