"""The explainers: Grad-CAM, Grad-CAM++, gradient × input, Integrated Gradients, gradient-weighted attention.

Each explains every class of a batch with **one forward pass** shared by the classes and one backward pass per class
(:func:`~xbench.explain.base.class_gradients`), except Integrated Gradients (captum: its path points are forward
passes of their own).

* ``gradcam`` — Grad-CAM (Selvaraju et al., ICCV 2017) on the layer named by the model YAML's ``explain_layer``
  (the image encoder's last spatial layer): ``relu(sum_k w_k A_k)``, ``w_k`` = spatial mean of the gradient.
* ``gradcampp`` — Grad-CAM++ (Chattopadhay et al., WACV 2018), same layer, weights of its Eq. 19, computed on the
  **positive part of the activations** ``A⁺ = max(A, 0)`` (weights and map). Eq. 19 is derived for post-ReLU
  activations (``A ≥ 0``): there ``A⁺ = A`` and the maps equal pytorch-grad-cam's. On a layer with signed activations
  (the ViTs' LayerNorm outputs, the reference models' projections) the channel sums ``ΣA`` can be negative and the
  denominator ``2g² + ΣA·g³`` of a positive gradient ``g`` can pass through 0 (weights up to 10⁴× Grad-CAM's, maps
  that a 1e-6 change of the gradient moves by percents); with ``A⁺`` it is ``g²(2 + ΣA⁺·g) ≥ 2g²``, so each
  ``α = 1 / (2 + ΣA⁺·g)`` lies in (0, 1/2] and the weights are bounded by half the positive gradient mass.
  The channel weights of both come from pytorch-grad-cam (``GradCAM`` / ``GradCAMPlusPlus.get_cam_weights``);
  its ``__call__`` is not used because it runs one forward pass per target set and rescales every map to the
  input size with a per-image min-max — here classes share a forward and maps stay raw at the layer's grid.
  ViT layers (token outputs) drop their leading extra tokens and are reshaped to the patch grid; for ViTs the
  YAMLs name the last block's first LayerNorm (pytorch-grad-cam's advice for ViTs): the last block's *output* patch
  tokens do not reach a CLS-pooled score, so their gradient is zero.
* ``gradxinput`` — gradient × input (Shrikumar et al. 2016) on the preprocessed pixels, summed over the 3
  channels and average-pooled ``pool x pool`` (default 4). Own code so classes share a forward pass;
  tests check it equals captum's ``InputXGradient``.
* ``ig`` — Integrated Gradients (Sundararajan et al., ICML 2017) by captum's ``IntegratedGradients``
  (``n_steps=16``, Gauss-Legendre), baseline = the adapter's preprocessing of an all-black image; channel sum and
  pooling as ``gradxinput``.
* ``attngrad`` — gradient-weighted attention rollout (Chefer et al., CVPR 2021, Eq. 13-14): ``R = I``, per block
  ``R += mean_heads(relu(dA/dy * A)) @ R``; map = the CLS row of ``R`` over the patch tokens. Attention comes from
  every ``nn.MultiheadAttention`` (open_clip, torchvision) or timm ``Attention`` under the YAML's
  ``explain_attention`` module (CLIP, BiomedCLIP, DeViDe). Own code: captum and pytorch-grad-cam have no
  attention-rollout method.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from ..core.errors import XBenchError
from ..spec.registry import EXPLAINERS as _REGISTERED
from ..models.base import Adapter, Prediction
from .base import Explainer, class_gradients, explain_fact, forward_logits, module_at, tokens_to_grid


class _LayerCAM(Explainer):
    """Grad-CAM family on the YAML's ``explain_layer``; ``cam_class`` gives the channel weights."""

    kind = "layer"
    requires = "explain_layer"
    cam_class: ClassVar[Any]

    def explain(self, adapter: Adapter, pixels: torch.Tensor, prompts: Sequence[str]) -> Prediction:
        layer = module_at(adapter, explain_fact(adapter, "explain_layer", self.name))
        captured: list[torch.Tensor] = []

        def hook(_: nn.Module, __: Any, out: Any) -> None:
            captured.append(out[0] if isinstance(out, (tuple, list)) else out)

        handle = layer.register_forward_hook(hook)
        try:
            scores, logits = forward_logits(adapter, pixels, prompts)
        finally:
            handle.remove()
        if len(captured) != 1:
            raise XBenchError(f"{adapter.name}: explain_layer ran {len(captured)} times in one forward pass; "
                              "name a layer that runs once per image batch")
        act = captured[0]
        grid = tokens_to_grid(act.detach(), len(pixels)).float().cpu().numpy()
        maps = [self.cam(grid, tokens_to_grid(grad, len(pixels)).float().cpu().numpy())
                for (grad,) in class_gradients(logits, [act])]
        return Prediction(scores, torch.from_numpy(np.stack(maps, 1).astype(np.float32)))

    def cam(self, activations: np.ndarray, gradients: np.ndarray) -> np.ndarray:
        """Maps ``(B, h, w)`` = ``relu(Σ_k w_k A_k)`` from a layer's activations and the class's gradients
        ``(B, K, h, w)``; the weights from pytorch-grad-cam's ``get_cam_weights`` (no instance state used)."""
        weights = self.cam_class.get_cam_weights(None, None, None, None, activations, gradients)  # (B, K)
        return np.maximum((weights[:, :, None, None] * activations).sum(1), 0.0)


class GradCAM(_LayerCAM):
    """Grad-CAM (module docstring)."""

    name = "gradcam"

    @property
    def cam_class(self) -> Any:  # type: ignore[override]
        from pytorch_grad_cam import GradCAM as _GradCAM

        return _GradCAM


class GradCAMPlusPlus(_LayerCAM):
    """Grad-CAM++ on the positive part of the layer's activations (module docstring: Eq. 19 assumes ``A ≥ 0``;
    on post-ReLU layers this is pytorch-grad-cam's Grad-CAM++ exactly)."""

    name = "gradcampp"

    def cam(self, activations: np.ndarray, gradients: np.ndarray) -> np.ndarray:
        return super().cam(np.maximum(activations, 0.0), gradients)

    @property
    def cam_class(self) -> Any:  # type: ignore[override]
        from pytorch_grad_cam import GradCAMPlusPlus as _GradCAMPlusPlus

        return _GradCAMPlusPlus


class GradientXInput(Explainer):
    """Gradient × input (module docstring)."""

    name = "gradxinput"

    def explain(self, adapter: Adapter, pixels: torch.Tensor, prompts: Sequence[str]) -> Prediction:
        pixels = pixels.detach().requires_grad_(True)
        scores, logits = forward_logits(adapter, pixels, prompts)
        maps = [self.pool_input(grad * pixels.detach()) for (grad,) in class_gradients(logits, [pixels])]
        return Prediction(scores, torch.stack(maps, 1))


def black_baseline(adapter: Adapter) -> torch.Tensor:
    """The adapter's preprocessing of an all-black 1024 x 1024 image, ``(3, S, S)`` (a constant image: its size only
    has to suit preprocessors that only downscale)."""
    return adapter.preprocess(np.zeros((1024, 1024), np.float32))


class IntegratedGradients(Explainer):
    """Integrated Gradients by captum (module docstring)."""

    name = "ig"

    def __init__(self, pool: int = 4, n_steps: int = 16):
        super().__init__(pool)
        self.n_steps = int(n_steps)

    def explain(self, adapter: Adapter, pixels: torch.Tensor, prompts: Sequence[str]) -> Prediction:
        from captum.attr import IntegratedGradients as _IG

        def forward(x: torch.Tensor) -> torch.Tensor:
            return forward_logits(adapter, x, prompts)[1]

        scores, logits = forward_logits(adapter, pixels, prompts)
        baseline = black_baseline(adapter).to(pixels.device, pixels.dtype)[None].expand_as(pixels).contiguous()
        if not logits.requires_grad:  # the score ignores the pixels (priors): zero attribution, by definition
            zero = torch.zeros(len(pixels), len(prompts), *self.grid(adapter))
            return Prediction(scores, zero)
        ig = _IG(forward)
        maps = [self.pool_input(ig.attribute(pixels, baselines=baseline, target=c, n_steps=self.n_steps,
                                             internal_batch_size=len(pixels) * self.n_steps).detach())
                for c in range(len(prompts))]
        return Prediction(scores, torch.stack(maps, 1))


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
        try:
            scores, logits = forward_logits(adapter, pixels, prompts)
        finally:
            for h in handles:
                h.remove()
            for module, fused in restore:
                module.fused_attn = fused
        b, n = len(pixels), attns[0].shape[-1]
        side = int(np.sqrt(n))
        maps = []
        for grads in class_gradients(logits, attns):
            rollout = torch.eye(n, device=attns[0].device).expand(b, n, n).clone()
            for a, g in zip(attns, grads):
                weighted = (g * a).reshape(b, -1, n, n).clamp(min=0).mean(1).float()
                rollout = rollout + weighted @ rollout
            maps.append(rollout[:, 0, n - side * side:].reshape(b, side, side).detach().cpu())
        return Prediction(scores, torch.stack(maps, 1))


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
