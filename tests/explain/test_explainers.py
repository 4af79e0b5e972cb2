"""Explainers as map sources (xbench.explain): shapes, library cross-checks, every adapter, config entries."""
from __future__ import annotations

import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from xbench.spec.config import RunConfig
from xbench.core.errors import FormatError, XBenchError, XBenchWarning
from xbench.explain import EXPLAINERS, explained, gradients_through_adapters
from xbench.explain.base import forward_logits
from xbench.models import create_model

PROMPTS = ["cardiomegaly", "pleural effusion"]


def _pixels(adapter, n: int = 2, seed: int = 0) -> torch.Tensor:
    rng = np.random.default_rng(seed)  # 320 px: CARZero's preprocessing only downscales
    return torch.stack([adapter.preprocess(rng.random((320, 320), dtype=np.float32)) for _ in range(n)])


@pytest.fixture(scope="module")
def ref_xattn():
    return create_model("ref_xattn")


@pytest.mark.parametrize("method", ["gradcam", "gradcampp", "gradxinput", "ig"])
def test_explainers_on_reference_model(ref_xattn, method):
    wrapped = explained(ref_xattn, method, **({"n_steps": 4} if method == "ig" else {}))
    px = _pixels(ref_xattn)
    pred = wrapped.predict(px, PROMPTS)
    assert wrapped.name == f"ref_xattn+{method}" and wrapped.map_source == f"explainer:{method}"
    assert tuple(pred.maps.shape) == (2, 2, *wrapped.grid)
    assert wrapped.grid == ((16, 16) if method.startswith("gradcam") else (32, 32))
    torch.testing.assert_close(pred.scores, ref_xattn.predict(px, PROMPTS).scores)  # the model's own scores
    assert torch.isfinite(pred.maps).all() and pred.maps.abs().sum() > 0
    assert not torch.equal(pred.maps[:, 0], pred.maps[:, 1])  # each class its own backward pass


def test_gradcam_matches_pytorch_grad_cam(ref_xattn):
    """Shared-forward Grad-CAM / Grad-CAM++ equal pytorch-grad-cam's own call (one class at a time), after its
    resize to the input and per-image min-max; Grad-CAM++ on a post-ReLU layer (where both are defined)."""
    from pytorch_grad_cam import GradCAM, GradCAMPlusPlus
    from pytorch_grad_cam.utils.image import scale_cam_image
    from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget

    class Logits(torch.nn.Module):
        def __init__(self, adapter):
            super().__init__()
            self.adapter, self.net = adapter, adapter.model  # pytorch-grad-cam reads the device from the parameters

        def forward(self, x):
            return forward_logits(self.adapter, x, PROMPTS)[1]

    px = _pixels(ref_xattn)
    post_relu = create_model("ref_xattn")  # Grad-CAM++ is defined on post-ReLU layers: its conv body's output
    post_relu.config = {**post_relu.config, "explain_layer": "model.image.body"}
    for method, cls, adapter, layer in (("gradcam", GradCAM, ref_xattn, ref_xattn.model.image),
                                        ("gradcampp", GradCAMPlusPlus, post_relu, post_relu.model.image.body)):
        ours = explained(adapter, method).predict(px, PROMPTS).maps.numpy()
        for c in range(len(PROMPTS)):
            with gradients_through_adapters(), cls(Logits(adapter), [layer]) as cam:
                theirs = cam(px.clone(), targets=[ClassifierOutputTarget(c)] * len(px))
            expected = scale_cam_image(scale_cam_image(ours[:, c], (128, 128)))  # its __call__ normalises twice
            np.testing.assert_allclose(expected, theirs, atol=2e-4)


def test_gradient_x_input_matches_captum(ref_xattn):
    from captum.attr import InputXGradient

    px = _pixels(ref_xattn)
    ours = explained(ref_xattn, "gradxinput", pool=1).predict(px, PROMPTS).maps
    with gradients_through_adapters():
        ixg = InputXGradient(lambda x: forward_logits(ref_xattn, x, PROMPTS)[1])
        theirs = torch.stack([ixg.attribute(px.clone(), target=c).sum(1) for c in range(2)], 1)
    torch.testing.assert_close(_unit(ours), _unit(theirs.detach()), rtol=1e-4, atol=1e-6)  # maps scaled by 2^k


def _unit(maps: torch.Tensor) -> torch.Tensor:
    """Each map divided by its largest |value| (explainer maps come scaled by a power of two per map)."""
    return maps / maps.abs().flatten(2).amax(-1).clamp(min=1e-30)[..., None, None]


def test_prior_has_zero_gradient_maps_and_no_layer():
    prior = create_model("center_prior")
    px = _pixels(prior)
    assert explained(prior, "gradxinput").predict(px, PROMPTS).maps.abs().sum() == 0  # score ignores the pixels
    assert explained(prior, "ig").predict(px, PROMPTS).maps.abs().sum() == 0
    with pytest.raises(XBenchError, match="explain_layer.*center_prior.*prior baseline has no image encoder"):
        explained(prior, "gradcam").predict(px, PROMPTS)
    with pytest.raises(XBenchError, match="explain_attention"):
        patchsim = create_model("ref_patchsim")
        explained(patchsim, "attngrad").predict(_pixels(patchsim, 1), PROMPTS)


def test_random_prior_variant_keeps_its_case_keyed_scores():
    prior = create_model("random_prior")
    px = _pixels(prior)
    pred = explained(prior, "gradxinput").predict_cases(px, PROMPTS, ["a", "b"])
    torch.testing.assert_close(pred.scores, prior.predict_cases(px, PROMPTS, ["a", "b"]).scores.float())
    assert pred.maps.abs().sum() == 0


def test_no_grad_is_restored_after_an_explanation(ref_xattn):
    explained(ref_xattn, "gradxinput").predict(_pixels(ref_xattn, 1), PROMPTS)
    with torch.no_grad():
        assert not torch.is_grad_enabled()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["kad", "medklip", "mavl", "carzero", "devide", "clip", "biomedclip"])
def test_every_image_model_gets_gradcam_at_its_grid(tmp_path, name, test_device):
    """Each registered VLM (seeded random weights) gives non-zero Grad-CAM maps at its native grid; the ViTs
    also gradient-weighted attention (CLIP: nn.MultiheadAttention, BiomedCLIP: timm Attention). On
    ``XBENCH_TEST_DEVICE`` (CUDA: the batched backward checked on the GPU, fp32 without TF32)."""
    from xbench.inference.speed import precision_mode

    sys.path.insert(0, str(Path(__file__).parents[1] / "models"))
    from biomedclip_folder import write_folder

    torch.set_num_threads(2)
    weights = write_folder(tmp_path / "bmc") if name == "biomedclip" else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", XBenchWarning)
        adapter = create_model(name, weights=weights, random_init=True, device=test_device)
    px = _pixels(adapter, 1).to(test_device)
    for method in ["gradcam"] + (["attngrad"] if name in ("clip", "biomedclip") else []):  # MHA and timm paths
        maps = explained(adapter, method).predict(px, PROMPTS).maps
        assert tuple(maps.shape) == (1, 2, *adapter.grid), (name, method)
        assert torch.isfinite(maps).all() and maps.abs().sum() > 0, (name, method)
    # batched on the device = the per-class computation, on every explainer the model takes (IG: the reference
    # models' test; its batching is the same code)
    for method in ["gradcam", "gradcampp", "gradxinput"] + (["attngrad"] if adapter.config.get("explain_attention")
                                                           else []):
        with precision_mode("fp32", test_device):
            _assert_same_maps(_batched(adapter, px, method), _per_class_reference(adapter, px, method), (name, method))


def test_run_config_explainer_entries(tmp_path):
    base = {"output_dir": str(tmp_path), "datasets": [{"name": "phantom", "split": "test"}]}
    cfg = RunConfig.from_dict({**base, "models": ["ref_xattn", {"name": "ref_xattn", "explainer": "gradcam"}]})
    assert [m.label for m in cfg.models] == ["ref_xattn", "ref_xattn+gradcam"]
    with pytest.raises(FormatError, match="unknown explainer 'gradcma'.*did you mean 'gradcam'"):
        RunConfig.from_dict({**base, "models": [{"name": "kad", "explainer": "gradcma"}]})
    assert set(EXPLAINERS) == {"gradcam", "gradcampp", "gradxinput", "ig", "attngrad"}


@pytest.mark.usefixtures("phantom_cache")
@pytest.mark.parametrize("scale", [30.0, 100.0])
def test_saturated_probabilities_keep_the_gradient_of_the_logit(scale):
    """ref_patchsim with its similarity scale raised on phantom images: (image, class) probabilities sit outside
    [1e-6, 1 − 1e-6] (where a clamp has no gradient) or round to 0 / 1; gradient × input still equals direct
    autograd of the pre-sigmoid logit, non-zero on every (image, class)."""
    from xbench.datasets import load_dataset

    adapter = create_model("ref_patchsim")
    with torch.no_grad():
        adapter.model.log_scale.fill_(float(np.log(scale)))
    phantom = load_dataset("phantom", split="test", cases=6)
    px = torch.stack([adapter.preprocess(phantom[i].image()) for i in range(6)])
    probs = adapter.predict(px, PROMPTS).scores
    saturated = (probs < 1e-6) | (probs > 1 - 1e-6)
    assert saturated.sum() >= 2, probs  # the clamp's flat region is reached
    ours = explained(adapter, "gradxinput", pool=1).predict(px, PROMPTS).maps
    x = px.clone().requires_grad_(True)
    pos = adapter.model.class_embeddings(PROMPTS, adapter_templates("POSITIVE_TEMPLATES"))
    neg = adapter.model.class_embeddings(PROMPTS, adapter_templates("NEGATIVE_TEMPLATES"))
    logits = adapter.model.forward_features(x, pos.detach(), neg.detach())[0]
    direct = torch.stack([(torch.autograd.grad(logits[:, c].sum(), x, retain_graph=True)[0] * px).sum(1)
                          for c in range(len(PROMPTS))], 1)
    torch.testing.assert_close(_unit(ours), _unit(direct), rtol=1e-4, atol=1e-5)
    assert (ours.abs().flatten(2).amax(-1) > 0).all()


def adapter_templates(name: str):
    from xbench.models import reference

    return getattr(reference, name)


def test_probability_not_followable_to_logits_is_refused(ref_xattn):
    """A probability computed by an operation the log-odds tracking does not follow (here 1 − (1 − p)) is
    refused, not differentiated through its rounding."""
    class Odd(type(ref_xattn)):
        def predict(self, pixels, prompts):
            pred = super().predict(pixels, prompts)
            return type(pred)(1 - (1 - pred.scores), pred.maps)

    odd = Odd.from_checkpoint(ref_xattn.model.state_dict())
    with pytest.raises(XBenchError, match="not a sigmoid / softmax output"):
        explained(odd, "gradxinput").predict(_pixels(odd, 1), PROMPTS)


def _layer_tensors(adapter, px):
    """The explain_layer's activations (B, K, h, w) and the logit gradients at it of every class (C, B, K, h, w)."""
    from xbench.explain.base import class_gradients, module_at, tokens_to_grid

    captured = []
    handle = module_at(adapter, adapter.config["explain_layer"]).register_forward_hook(
        lambda m, a, out: captured.append(out))
    try:
        with gradients_through_adapters():
            _, logits = forward_logits(adapter, px.clone(), PROMPTS)
            grads = torch.cat([torch.stack([tokens_to_grid(g, len(px)) for g in gs])
                               for _, _, (gs,) in class_gradients(logits, captured)])
    finally:
        handle.remove()
    return tokens_to_grid(captured[0].detach(), len(px)), grads


def test_gradcampp_is_well_conditioned_on_signed_layers(ref_xattn):
    """ref_xattn's layer has signed activations: a 1e-6 relative change of the gradient moves no Grad-CAM++ map by
    more than 0.1 % of its maximum, also where a channel sum makes pytorch-grad-cam's Eq. 19 denominator vanish
    (ΣA = −2, g = 1: 2g² + ΣA·g³ = 0); every map is finite in the store's float16."""
    from pytorch_grad_cam import GradCAMPlusPlus as Library

    from xbench.explain.base import float16_ready
    from xbench.explain.methods import GradCAMPlusPlus

    method = GradCAMPlusPlus()
    act, grads = _layer_tensors(ref_xattn, _pixels(ref_xattn, 4, seed=3))
    assert (act.sum((2, 3)) < 0).float().mean() > 0.2  # signed: many negative channel sums
    gen = torch.Generator().manual_seed(0)
    singular_act = torch.full((1, 2, 4, 4), -2.0 / 16)
    singular_act[0, 1] = torch.rand((4, 4), generator=gen)
    singular_grad = torch.ones((1, 2, 4, 4))
    cases = [(act, g) for g in grads] + [(singular_act, singular_grad)]
    for a, g in cases:
        base = method.cam(a, g)
        moved = method.cam(a, g * (1 + 1e-6 * (2 * torch.rand(g.shape, generator=gen) - 1)))
        assert (moved - base).abs().max() <= 1e-3 * base.abs().max(), (moved - base).abs().max() / base.max()
        stored = float16_ready(base[:, None]).numpy().astype(np.float16)
        assert np.isfinite(stored).all()
    # the library's weights on the raw activations are what blows up there
    raw = Library.get_cam_weights(None, None, None, None, singular_act.numpy(), singular_grad.numpy())
    assert np.abs(raw).max() > 1e3 * method.cam(singular_act, singular_grad).abs().max().item()


def _numpy_cam(method: str, act: np.ndarray, grad: np.ndarray) -> np.ndarray:
    """The per-class NumPy maps of pytorch-grad-cam's ``get_cam_weights`` (Grad-CAM++ on A⁺), as explainers
    computed them on the host, class by class, before they were batched on the device."""
    from pytorch_grad_cam import GradCAM, GradCAMPlusPlus

    if method == "gradcampp":
        act = np.maximum(act, 0.0)
    cls = GradCAMPlusPlus if method == "gradcampp" else GradCAM
    weights = cls.get_cam_weights(None, None, None, None, act, grad)
    return np.maximum((weights[:, :, None, None] * act).sum(1), 0.0)


def _per_class_reference(adapter, px, method, n_steps=4):
    """Maps ``(B, C, h, w)`` of ``method`` computed as before batching: one backward per class
    (``logits[:, c].sum()``), weights and sums in NumPy on the host per class; IG by captum per class."""
    from xbench.explain import create_explainer
    from xbench.explain.base import module_at, tokens_to_grid
    from xbench.explain.methods import AttentionGrad, black_baseline

    explainer = create_explainer(method, **({"n_steps": n_steps} if method == "ig" else {}))
    with gradients_through_adapters():
        if method == "ig":
            from captum.attr import IntegratedGradients

            ig = IntegratedGradients(lambda x: forward_logits(adapter, x, PROMPTS)[1])
            base = black_baseline(adapter).to(px.device)[None].expand_as(px).contiguous()
            return torch.stack([explainer.pool_input(ig.attribute(px.clone(), baselines=base, target=c,
                                                                   n_steps=n_steps).detach())
                                for c in range(len(PROMPTS))], 1).cpu()
        if method == "gradxinput":
            x = px.clone().requires_grad_(True)
            logits = forward_logits(adapter, x, PROMPTS)[1]
            return torch.stack([explainer.pool_input(torch.autograd.grad(logits[:, c].sum(), x, retain_graph=True)[0]
                                                     * px) for c in range(len(PROMPTS))], 1).cpu()
        if method == "attngrad":
            captured = []
            original = AttentionGrad.explain

            class Captured(Exception):
                pass

            def capture(self, adapter, pixels, prompts):  # the explainer's forward with its hooks, then stop
                import xbench.explain.methods as m

                def stop(logits, attns, chunk=None):
                    captured.append((logits, attns))
                    raise Captured

                real = m.class_gradients
                m.class_gradients = stop
                try:
                    original(self, adapter, pixels, prompts)
                except Captured:
                    pass
                finally:
                    m.class_gradients = real

            capture(explainer, adapter, px.clone(), PROMPTS)
            logits, attns = captured[0]
            b, n = len(px), attns[0].shape[-1]
            side = int(np.sqrt(n))
            maps = []
            for c in range(len(PROMPTS)):
                grads = torch.autograd.grad(logits[:, c].sum(), attns, retain_graph=True)
                rollout = torch.eye(n, device=px.device).expand(b, n, n).clone()
                for a, g in zip(attns, grads):
                    rollout = rollout + (g * a).reshape(b, -1, n, n).clamp(min=0).mean(1).float() @ rollout
                maps.append(rollout[:, 0, n - side * side:].reshape(b, side, side).detach().cpu())
            return torch.stack(maps, 1)
        captured = []
        handle = module_at(adapter, adapter.config["explain_layer"]).register_forward_hook(
            lambda m, a, out: captured.append(out[0] if isinstance(out, (tuple, list)) else out))
        try:
            logits = forward_logits(adapter, px.clone(), PROMPTS)[1]
        finally:
            handle.remove()
        act = tokens_to_grid(captured[0].detach(), len(px)).float().cpu().numpy()
        maps = [_numpy_cam(method, act, tokens_to_grid(torch.autograd.grad(logits[:, c].sum(), captured[0],
                                                                            retain_graph=True)[0], len(px)).cpu().numpy())
                for c in range(len(PROMPTS))]
        return torch.from_numpy(np.stack(maps, 1))


def _batched(adapter, px, method, n_steps=4, **options):
    """The explainer's raw maps (before the store's power-of-two scaling)."""
    from xbench.explain import create_explainer

    explainer = create_explainer(method, **({"n_steps": n_steps} if method == "ig" else {}), **options)
    with gradients_through_adapters():
        return explainer.explain(adapter, px.clone(), PROMPTS).maps.detach().cpu()


def _assert_same_maps(ours, reference, label):
    """Max |difference| ≤ 1e-5 of each map's largest |value| (all-zero maps: equal)."""
    assert ours.shape == reference.shape, label
    top = reference.abs().flatten(2).amax(-1)[..., None, None]
    worst = ((ours - reference).abs() / top.clamp(min=1e-30)).max().item()
    assert worst <= 1e-5, (label, worst)


@pytest.mark.parametrize("model", ["ref_xattn", "ref_patchsim"])
@pytest.mark.parametrize("method", ["gradcam", "gradcampp", "gradxinput", "ig"])
def test_batched_maps_equal_the_per_class_computation(model, method):
    """Maps with every class in one batched backward on the device equal the per-class computation (one backward
    per class, pytorch-grad-cam's NumPy weights on the host; captum IG): ≤ 1e-5 of each map's maximum. Integrated
    Gradients against captum's ``IntegratedGradients`` (same steps, Gauss-Legendre, black baseline) also with its
    path points split over several forward passes."""
    adapter = create_model(model)
    px = _pixels(adapter, 3, seed=1)
    reference = _per_class_reference(adapter, px, method)
    assert reference.abs().sum() > 0
    _assert_same_maps(_batched(adapter, px, method), reference, (model, method))
    if method == "ig":
        _assert_same_maps(_batched(adapter, px, method, points_per_pass=len(px)), reference, (model, "ig/1 step"))


@pytest.mark.parametrize("method", ["gradcam", "gradcampp", "gradxinput", "ig"])
def test_maps_do_not_depend_on_the_class_chunking_or_the_batched_backward(ref_xattn, method, monkeypatch):
    """One class per backward, two, or all at once, and the per-class fallback (a model whose backward vmap cannot
    batch): the same maps."""
    px = _pixels(ref_xattn, 2, seed=2)
    prompts = PROMPTS + ["pneumothorax"]
    from xbench.explain import create_explainer

    def maps(**options):
        explainer = create_explainer(method, **({"n_steps": 3} if method == "ig" else {}), **options)
        with gradients_through_adapters():
            return explainer.explain(ref_xattn, px.clone(), prompts).maps.detach()

    whole = maps()
    for chunk in (1, 2):
        torch.testing.assert_close(maps(class_chunk=chunk), whole, rtol=1e-6, atol=1e-6 * whole.abs().max().item())
    real_grad = torch.autograd.grad

    def no_vmap(*args, **kwargs):
        if kwargs.get("is_grads_batched"):
            raise RuntimeError("vmap: a batching rule is missing")
        return real_grad(*args, **kwargs)

    monkeypatch.setattr(torch.autograd, "grad", no_vmap)
    with pytest.warns(XBenchWarning, match="batched backward failed, one backward per class"):
        fallback = maps()
    torch.testing.assert_close(fallback, whole, rtol=1e-6, atol=1e-6 * whole.abs().max().item())
    with pytest.raises(XBenchError, match="class_chunk must be >= 1"):
        maps(class_chunk=0)


def test_explainer_maps_survive_the_float16_store_within_its_bound(ref_xattn):
    """Raw gradient × input / IG maps are tiny (below float16's normal range); the maps an explainer returns are
    scaled by a power of two per map, so the store's float16 holds every value within 2^-11 relative (values below
    2^-28 of the map's largest: within 2^-25 of it absolutely), and no metric can tell (scaling commutes with the
    per-map min–max)."""
    px = _pixels(ref_xattn)
    for method in ("gradxinput", "ig", "gradcam", "gradcampp"):
        maps = explained(ref_xattn, method, **({"n_steps": 4} if method == "ig" else {})).predict(px, PROMPTS).maps
        m = maps.numpy().astype(np.float64)
        half = maps.numpy().astype(np.float16).astype(np.float64)
        top = np.abs(m).reshape(*m.shape[:2], -1).max(-1)[..., None, None]
        assert np.isfinite(half).all() and (top > 0).all()
        big = np.abs(m) >= top * 2.0**-28
        assert (np.abs(half - m)[big] <= 2.0**-11 * np.abs(m)[big]).all(), method
        assert (np.abs(half - m)[~big] <= 2.0**-25 * np.broadcast_to(top, m.shape)[~big]).all(), method


def test_explained_adapter_keeps_the_models_gpu_preprocessing_plan():
    """An explainer over a model preprocesses as the model: the same GPU preprocessing plan (proven equal to its
    ``preprocess``) and the same decode-once input key, so explainer runs ride the native runs' feed and kernels."""
    from xbench.inference.calibration import model_input
    from xbench.inference.gpu_preprocess import check_plan, plan_for
    from xbench.models.base import Adapter
    from xbench.models.kad import KADAdapter

    kad = object.__new__(KADAdapter)  # no network: preprocess reads the YAML's input size only
    Adapter.__init__(kad, {"name": "kad"})
    wrapped = explained(kad, "gradcam")
    assert plan_for(kad) is not None and plan_for(wrapped) == plan_for(kad)
    assert check_plan(wrapped, plan_for(wrapped)) is not None
    assert model_input(wrapped).key == model_input(kad).key
    assert plan_for(explained(create_model("ref_xattn"), "gradcam")) is None  # a model without a plan: none
