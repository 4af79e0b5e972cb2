"""The explainers: Grad-CAM, Grad-CAM++, gradient × input, Integrated Gradients, gradient-weighted attention.

Each explains every class of a batch with **one forward pass** shared by the classes and the gradients of all class
logits in one batched backward (:func:`~xbench.explain.base.class_gradients`: the classes as a batch dimension of
one-hot cotangents, chunked to a memory budget); Integrated Gradients adds its path points as a batch dimension of
the forward pass. Weights, weighted sums and pooling are torch operations on the model's device; nothing goes to the
host per class (the caller casts the maps to float32 on the CPU once). Cost per image: ``docs/explainers.md``.

* ``gradcam`` — Grad-CAM (Selvaraju et al., ICCV 2017) on the layer named by the model YAML's ``explain_layer``
  (the image encoder's last spatial layer): ``relu(sum_k w_k A_k)``, ``w_k`` = spatial mean of the gradient.
* ``gradcampp`` — Grad-CAM++ (Chattopadhay et al., WACV 2018), same layer, weights of its Eq. 19, computed on the
  **positive part of the activations** ``A⁺ = max(A, 0)`` (weights and map). Eq. 19 is derived for post-ReLU
  activations (``A ≥ 0``): there ``A⁺ = A`` and the maps equal pytorch-grad-cam's. On a layer with signed activations
  (the ViTs' LayerNorm outputs, the reference models' projections) the channel sums ``ΣA`` can be negative and the
  denominator ``2g² + ΣA·g³`` of a positive gradient ``g`` can pass through 0 (weights up to 10⁴× Grad-CAM's, maps
  that a 1e-6 change of the gradient moves by percents); with ``A⁺`` it is ``g²(2 + ΣA⁺·g) ≥ 2g²``, so each
  ``α = 1 / (2 + ΣA⁺·g)`` lies in (0, 1/2] and the weights are bounded by half the positive gradient mass.
  The channel weights of both are pytorch-grad-cam's (``GradCAM`` / ``GradCAMPlusPlus.get_cam_weights``), written
  as torch operations over ``(classes, B, K, h, w)`` on the device (tests check them equal to the library's NumPy
  functions); its ``__call__`` is not used because it runs one forward pass per target set and rescales every map
  to the input size with a per-image min-max — here classes share a forward and maps stay raw at the layer's grid.
  ViT layers (token outputs) drop their leading extra tokens and are reshaped to the patch grid; for ViTs the
  YAMLs name the last block's first LayerNorm (pytorch-grad-cam's advice for ViTs): the last block's *output* patch
  tokens do not reach a CLS-pooled score, so their gradient is zero.
* ``gradxinput`` — gradient × input (Shrikumar et al. 2016) on the preprocessed pixels, summed over the 3
  channels and average-pooled ``pool x pool`` (default 4). Own code so classes share a forward pass;
  tests check it equals captum's ``InputXGradient``.
* ``ig`` — Integrated Gradients (Sundararajan et al., ICML 2017), ``n_steps=16`` Gauss-Legendre points (captum's
  nodes and step sizes), baseline = the adapter's preprocessing of an all-black image; channel sum and pooling as
  ``gradxinput``. Own batched code (path points × classes as batch dimensions); tests check it equals captum's
  ``IntegratedGradients``.
* ``attngrad`` — gradient-weighted attention rollout (Chefer et al., CVPR 2021, Eq. 13-14): ``R = I``, per block
  ``R += mean_heads(relu(dA/dy * A)) @ R``; map = the CLS row of ``R`` over the patch tokens. Attention comes from
  every ``nn.MultiheadAttention`` (open_clip, torchvision) or timm ``Attention`` under the YAML's
  ``explain_attention`` module (CLIP, BiomedCLIP, DeViDe). Own code: captum and pytorch-grad-cam have no
  attention-rollout method.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from ..core.errors import XBenchError
from ..spec.registry import EXPLAINERS as _REGISTERED
from ..models.base import Adapter, Prediction
from .base import Explainer, class_gradients, explain_fact, forward_logits, module_at, tokens_to_grid


class _LayerCAM(Explainer):
    """Grad-CAM family on the YAML's ``explain_layer``; :meth:`weights` gives the channel weights."""

    kind = "layer"
    requires = "explain_layer"

    def explain(self, adapter: Adapter, pixels: torch.Tensor, prompts: Sequence[str]) -> Prediction:
        layer = module_at(adapter, explain_fact(adapter, "explain_layer", self.name))
        captured: list[torch.Tensor] = []

        def hook(_: nn.Module, __: Any, out: Any) -> Any:
            first = out[0] if isinstance(out, (tuple, list)) else out
            if not first.requires_grad:  # weights frozen (frozen_weights): the graph starts at this layer
                first = first.detach().requires_grad_(True)
                out = (first, *out[1:]) if isinstance(out, tuple) else [first, *out[1:]] if isinstance(out, list) \
                    else first
            captured.append(first)
            return out

        handle = layer.register_forward_hook(hook)
        try:
            scores, logits = forward_logits(adapter, pixels, prompts)
        finally:
            handle.remove()
        if len(captured) != 1:
            raise XBenchError(f"{adapter.name}: explain_layer ran {len(captured)} times in one forward pass; "
                              "name a layer that runs once per image batch")
        act = captured[0]
        b = len(pixels)
        grid = tokens_to_grid(act.detach(), b).float()
        maps = [self.cam(grid, torch.stack([tokens_to_grid(g, b) for g in grads]).float())
                for _, _, (grads,) in class_gradients(logits, [act], self.class_chunk)]
        return Prediction(scores, torch.cat(maps).transpose(0, 1))

    def cam(self, activations: torch.Tensor, gradients: torch.Tensor) -> torch.Tensor:
        """Maps ``(..., B, h, w)`` = ``relu(Σ_k w_k A_k)`` from a layer's activations ``(B, K, h, w)`` and gradients
        ``(..., B, K, h, w)`` (leading dimensions: classes), as torch ops on their device."""
        activations = self.activations(activations)
        weights = self.weights(activations, gradients)  # (..., B, K)
        return torch.einsum("...bk,bkhw->...bhw", weights, activations).clamp(min=0)

    def activations(self, activations: torch.Tensor) -> torch.Tensor:
        """The activations the weights and the map are computed on."""
        return activations

    def weights(self, activations: torch.Tensor, gradients: torch.Tensor) -> torch.Tensor:
        """Channel weights ``(..., B, K)``."""
        raise NotImplementedError


class GradCAM(_LayerCAM):
    """Grad-CAM (module docstring): weights = spatial mean of the gradient (pytorch-grad-cam's
    ``GradCAM.get_cam_weights``)."""

    name = "gradcam"

    def weights(self, activations: torch.Tensor, gradients: torch.Tensor) -> torch.Tensor:
        return gradients.mean((-2, -1))


class GradCAMPlusPlus(_LayerCAM):
    """Grad-CAM++ on the positive part of the layer's activations (module docstring: Eq. 19 assumes ``A ≥ 0``;
    on post-ReLU layers this is pytorch-grad-cam's Grad-CAM++ exactly). Eq. 19 as pytorch-grad-cam's
    ``GradCAMPlusPlus.get_cam_weights`` computes it: ``α = g² / (2g² + ΣA·g³ + 1e-6)`` (0 where ``g = 0``),
    weights ``Σ relu(g)·α``."""

    name = "gradcampp"

    def activations(self, activations: torch.Tensor) -> torch.Tensor:
        return activations.clamp(min=0)

    def weights(self, activations: torch.Tensor, gradients: torch.Tensor) -> torch.Tensor:
        g2 = gradients**2
        total = activations.sum((-2, -1), keepdim=True)
        alpha = g2 / (2 * g2 + total * (g2 * gradients) + 1e-6)
        alpha = torch.where(gradients != 0, alpha, torch.zeros_like(alpha))
        return (gradients.clamp(min=0) * alpha).sum((-2, -1))


class GradientXInput(Explainer):
    """Gradient × input (module docstring)."""

    name = "gradxinput"

    def explain(self, adapter: Adapter, pixels: torch.Tensor, prompts: Sequence[str]) -> Prediction:
        pixels = pixels.detach().requires_grad_(True)
        scores, logits = forward_logits(adapter, pixels, prompts)
        maps = [self.pool_input(grads * pixels.detach())
                for _, _, (grads,) in class_gradients(logits, [pixels], self.class_chunk)]
        return Prediction(scores, torch.cat(maps).transpose(0, 1))


def black_baseline(adapter: Adapter) -> torch.Tensor:
    """The adapter's preprocessing of an all-black 1024 x 1024 image, ``(3, S, S)`` (a constant image: its size only
    has to suit preprocessors that only downscale)."""
    return adapter.preprocess(np.zeros((1024, 1024), np.float32))


#: path points (images) per forward pass of Integrated Gradients when not given: whole steps of the batch
IG_POINTS_PER_PASS = 256


class IntegratedGradients(Explainer):
    """Integrated Gradients (module docstring), batched: the path points of several steps go through one forward
    pass (``points_per_pass`` images, default :data:`IG_POINTS_PER_PASS`, at least one step of the batch), and every
    class's gradients at them through one batched backward (:func:`~xbench.explain.base.class_gradients`).

    The same quantity as captum's ``IntegratedGradients(...).attribute(x, baselines, target=c, n_steps,
    method="gausslegendre")``: captum's step sizes and nodes (``approximation_parameters``), points
    ``baseline + α·(x − baseline)``, gradients weighted by the step sizes (float32) and summed over the steps, times
    ``x − baseline`` (tests check it equals captum's).
    """

    name = "ig"

    def __init__(self, pool: int = 4, n_steps: int = 16, class_chunk: int | None = None,
                 points_per_pass: int | None = None):
        super().__init__(pool, class_chunk)
        self.n_steps = int(n_steps)
        self.points_per_pass = points_per_pass

    def explain(self, adapter: Adapter, pixels: torch.Tensor, prompts: Sequence[str]) -> Prediction:
        from captum.attr._utils.approximation_methods import approximation_parameters

        with torch.set_grad_enabled(False):  # the scores only, no graph (no_grad keeps the mode while explaining)
            scores = forward_logits(adapter, pixels, prompts)[0]
        sizes_fn, alphas_fn = approximation_parameters("gausslegendre")
        step_sizes, alphas = sizes_fn(self.n_steps), alphas_fn(self.n_steps)
        b = len(pixels)
        baseline = black_baseline(adapter).to(pixels.device, pixels.dtype)[None].expand_as(pixels).contiguous()
        diff = pixels - baseline
        per_pass = max(1, (self.points_per_pass or IG_POINTS_PER_PASS) // b)  # steps per forward pass
        weights = torch.tensor(step_sizes).float().to(pixels.device)
        total: torch.Tensor | None = None
        for s0 in range(0, self.n_steps, per_pass):
            s1 = min(self.n_steps, s0 + per_pass)
            points = torch.cat([baseline + alpha * diff for alpha in alphas[s0:s1]]).requires_grad_(True)
            logits = forward_logits(adapter, points, prompts)[1]
            if not logits.requires_grad:  # the score ignores the pixels (priors): zero attribution, by definition
                return Prediction(scores, torch.zeros(b, len(prompts), *self.grid(adapter), device=pixels.device))
            chunks = []
            for _, _, (grads,) in class_gradients(logits, [points], self.class_chunk):
                scaled = grads.reshape(len(grads), s1 - s0, -1) * weights[s0:s1, None]
                chunks.append(scaled.reshape(len(grads), s1 - s0, *pixels.shape).sum(1))
            part = torch.cat(chunks)
            total = part if total is None else total + part
            del logits, points
        assert total is not None
        return Prediction(scores, self.pool_input(total * diff).transpose(0, 1))


class AttentionGrad(Explainer):
    """Gradient-weighted attention rollout (Chefer et al. 2021; module docstring)."""

    name = "attngrad"
    kind = "attention"
    requires = "explain_attention"

    def explain(self, adapter: Adapter, pixels: torch.Tensor, prompts: Sequence[str]) -> Prediction:
        root = module_at(adapter, explain_fact(adapter, "explain_attention", self.name))
        attns: list[torch.Tensor] = []
        handles, restore = [], []
        for module in root.modules():
            if isinstance(module, nn.MultiheadAttention):
                handles.append(module.register_forward_pre_hook(_need_weights, with_kwargs=True))
                handles.append(module.register_forward_hook(lambda m, a, out: attns.append(_graph_tensor(out[1]))))
            elif hasattr(module, "fused_attn") and hasattr(module, "attn_drop"):  # timm Attention
                restore.append((module, module.fused_attn))
                module.fused_attn = False
                handles.append(module.attn_drop.register_forward_hook(lambda m, a, out: attns.append(out)))
        if not handles:
            raise XBenchError(f"{adapter.name}: no nn.MultiheadAttention or timm Attention under explain_attention")
        # pixels require gradients so the attention maps are in the graph with the weights frozen
        try:
            scores, logits = forward_logits(adapter, pixels.detach().requires_grad_(True), prompts)
        finally:
            for h in handles:
                h.remove()
            for module, fused in restore:
                module.fused_attn = fused
        b, n = len(pixels), attns[0].shape[-1]
        side = int(np.sqrt(n))
        maps = []
        for start, stop, grads in class_gradients(logits, attns, self.class_chunk):
            k = stop - start
            rollout = torch.eye(n, device=attns[0].device).expand(k, b, n, n).clone()
            for a, g in zip(attns, grads):
                weighted = (g * a.detach()).reshape(k, b, -1, n, n).clamp(min=0).mean(2).float()
                rollout = rollout + weighted @ rollout
            maps.append(rollout[:, :, 0, n - side * side:].reshape(k, b, side, side))
        return Prediction(scores, torch.cat(maps).transpose(0, 1))


def _graph_tensor(weights: torch.Tensor) -> torch.Tensor:
    """The tensor the attention output was computed from: ``nn.MultiheadAttention`` returns a *view* of its softmax
    made after use (no gradient reaches the view), so gradients are taken at the view's base ``(B·H, L, L)``."""
    return weights._base if weights._base is not None else weights


def _need_weights(_: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Make ``nn.MultiheadAttention`` return per-head attention weights ``(B, H, L, L)``."""
    return args, {**kwargs, "need_weights": True, "average_attn_weights": False}


#: Explainer name → class, as :data:`xbench.spec.registry.EXPLAINERS` names them (the one table of explainer names).
EXPLAINERS: dict[str, type[Explainer]] = {name: globals()[target.rpartition(":")[2]]
                                          for name, target in _REGISTERED.items()}
_wrong = {name: cls.name for name, cls in EXPLAINERS.items() if cls.name != name}
if _wrong:  # a class renamed without its registry row
    raise XBenchError(f"explainer names in xbench.spec.registry.EXPLAINERS differ from the classes' names: {_wrong}")
