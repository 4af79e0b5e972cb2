"""Explainers run with the adapter's weights frozen (xbench.explain.base.frozen_weights): a layer explainer records no
graph below its layer, the maps equal those of a forward pass with trainable weights, and the weights' flags return."""
from __future__ import annotations

import numpy as np
import torch

from xbench.explain import explained, gradients_through_adapters
from xbench.explain.base import class_gradients, forward_logits, module_at, tokens_to_grid
from xbench.models import create_model

PROMPTS = ["cardiomegaly", "pleural effusion"]


def _pixels(adapter, n: int = 2) -> torch.Tensor:
    rng = np.random.default_rng(3)
    return torch.stack([adapter.preprocess(rng.random((320, 320), dtype=np.float32)) for _ in range(n)])


def test_layer_explainer_builds_no_graph_below_its_layer_and_restores_the_flags():
    adapter = create_model("ref_xattn")
    layer = module_at(adapter, adapter.config["explain_layer"])
    below = [m for m in layer.modules() if isinstance(m, torch.nn.Conv2d)]
    assert below, "the reference model's explain_layer holds convolutions"
    seen: list[bool] = []
    handles = [m.register_forward_hook(lambda _m, _a, out: seen.append(out.requires_grad)) for m in below]
    try:
        explained(adapter, "gradcam").predict(_pixels(adapter), PROMPTS)
    finally:
        for h in handles:
            h.remove()
    assert seen and not any(seen)  # every convolution inside the explained layer ran without a graph
    assert all(p.requires_grad for p in adapter.model.parameters())  # flags restored


def test_gradcam_with_frozen_weights_equals_gradcam_with_trainable_weights():
    """The maps do not depend on whether the trunk's graph was recorded: computed here by hand with trainable
    weights (graph through the whole network, gradients at the hooked output), against the explainer."""
    adapter = create_model("ref_xattn")
    px = _pixels(adapter)
    layer = module_at(adapter, adapter.config["explain_layer"])
    captured: list[torch.Tensor] = []
    handle = layer.register_forward_hook(lambda _m, _a, out: captured.append(out))
    try:
        with gradients_through_adapters():
            _, logits = forward_logits(adapter, px.clone(), PROMPTS)
            assert captured[0].requires_grad and captured[0].grad_fn is not None  # the trunk's graph is there
            grads = torch.cat([g for _, _, (g,) in class_gradients(logits, [captured[0]])])
    finally:
        handle.remove()
    act = tokens_to_grid(captured[0].detach(), len(px))
    weights = grads.mean((-2, -1))  # (C, B, K)
    expected = torch.einsum("cbk,bkhw->bchw", weights, act).clamp(min=0)
    maps = explained(adapter, "gradcam").predict(px, PROMPTS).maps
    scale = expected.flatten(2).amax(-1)[..., None, None]
    got = maps / maps.flatten(2).amax(-1)[..., None, None].clamp(min=1e-30)
    torch.testing.assert_close(got, expected / scale.clamp(min=1e-30), atol=1e-5, rtol=0)
