"""CLIP ViT-B/16 with OpenAI's weights, run through open_clip: zero-shot scores and patch–text similarity maps.

Citation
    Radford et al., "Learning Transferable Visual Models From Natural Language Supervision", ICML 2021.
Official code
    https://github.com/openai/CLIP ; the network here is open_clip's own ``ViT-B-16-quickgelu``
    (https://github.com/mlfoundations/open_clip), built with ``open_clip.create_model(..., pretrained=None)``.
Weights (local only, never downloaded), one of, looked up in this order inside the weights folder:
    * ``open_clip_pytorch_model.bin`` or ``open_clip_model.safetensors`` as published on
      https://huggingface.co/timm/vit_base_patch16_clip_224.openai (a plain open_clip state dict);
    * ``ViT-B-16.pt``, OpenAI's TorchScript archive
      (https://openaipublic.azureedge.net/clip/models/5806e77cd80f8b59890b7e101eabd078d9fb84e6937f9e85e4ecb61988df416f/ViT-B-16.pt).
      Its code is never compiled or run (XBench has no TorchScript loader): only its ``data.pkl`` is read, by XBench's
      restricted unpickler (:func:`xbench.models.checkpoint.read_torchscript_state_dict`), giving the tensors that
      the archive's ``state_dict()`` holds; a file without them is refused with an error that points to the
      ``open_clip_pytorch_model.bin`` / ``open_clip_model.safetensors`` files. Its fp16 tensors are cast to float32 and its three metadata entries ``input_resolution``,
      ``context_length`` and ``vocab_size`` are dropped, as open_clip's ``build_model_from_openai_state_dict`` does.
    Without weights and with ``params.random_init: true`` the full-size network gets seeded random weights and is
    labelled ``"random-init"``.
Input
    224×224. The XBench image (float32 ``(H, W)`` in [0, 1]) becomes 8-bit with ``np.round(image * 255)``, is replicated
    to RGB, then follows open_clip's validation transform exactly: ``Resize(224, bicubic)`` of the shorter side (PIL),
    ``CenterCrop(224)``, ``ToTensor``, OpenAI mean/std ``(0.48145466, 0.4578275, 0.40821073)`` /
    ``(0.26862954, 0.26130258, 0.27577711)``.
Native grid
    14×14 (patch 16).
Score rule (``score_rule: probability``)
    Per class, two prompts from the config templates, by default ``"a chest x-ray showing {}"`` (positive) and
    ``"a chest x-ray with no {}"`` (negative), with ``{}`` replaced by the prompt name. The score is the positive
    prompt's probability in ``softmax(100 · [cos(img, pos), cos(img, neg)])`` — CLIP's usual zero-shot rule with
    OpenAI's logit scale of 100 (which is ``exp(logit_scale)`` of the released weights). XBench's exact CLIP templates
    are not published; these are ours.
Map rule (``map_source: similarity``), ``params.map_variant``
    ``"naive"`` (default): the output tokens of the **last** residual block, patch tokens only (CLS dropped), through
    ``ln_post`` and ``@ proj`` (768→512) — exactly the tokens that ``visual.output_tokens = True`` returns, projected
    — L2-normalised, cosine with the class's L2-normalised **positive** prompt embedding, reshaped row-major to 14×14.
    ``"maskclip"``: MaskCLIP (Zhou et al., ECCV 2022): the last residual block is replaced by its value path only,
    ``out_proj(ln_1(x) @ W_v.T + b_v)`` with ``W_v = in_proj_weight[2·768:]``, ``b_v = in_proj_bias[2·768:]`` of its
    ``nn.MultiheadAttention`` (batch-first, open_clip ≥ 2.26), applied to the input tokens of that block; residual and
    MLP are dropped; then ``ln_post``, ``@ proj`` and the same cosine. Maps are raw cosines in [-1, 1], not normalised.
    The class score always uses the unmodified CLS embedding.
Unseen classes
    None: CLIP is open-vocabulary, every prompt name is put into the templates as is.
Tokenizer
    open_clip's bundled BPE ``SimpleTokenizer`` (context 77), offline.
Deviations
    Tokens come from ``visual.forward_intermediates`` (open_clip ≥ 2.32) so that both map variants and the pooled
    embedding share one forward pass; ``tests/models/test_clip.py`` checks the naive tokens against
    ``visual.output_tokens``.
"""
from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import open_clip
import torch
import torch.nn.functional as F
from PIL import Image

from xbench.core.errors import CheckpointError
from xbench.models._common import check_inputs, seeded_or_uninitialised
from xbench.models.base import Adapter, Prediction, load_checkpoint, load_state_strict, resize_crop_window
from xbench.models.checkpoint import require_tensor_state

ARCHITECTURE = "ViT-B-16-quickgelu"  # open_clip config of OpenAI's ViT-B/16 (QuickGELU activations)
OPENAI_METADATA_KEYS = ("input_resolution", "context_length", "vocab_size")  # entries of OpenAI's archive, not weights
MAP_VARIANTS = ("naive", "maskclip")
DEFAULT_TEMPLATES = {"positive": "a chest x-ray showing {}", "negative": "a chest x-ray with no {}"}
SCORE_MODES = ("prompt_pair", "paper_sigmoid")
LOGIT_SCALE = 100.0  # OpenAI's zero-shot scale (exp of the released logit_scale)


# -- network and weights ---------------------------------------------------------------
class _RandomInitNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("No pretrained weights loaded")


@contextlib.contextmanager
def _no_random_init_notice() -> Iterator[None]:
    """Drop open_clip's root-logger line "No pretrained weights loaded for model …": XBench always builds the network
    without weights (``pretrained=None``) and loads them itself, or labels the model ``random_init``."""
    root, notice = logging.getLogger(), _RandomInitNotice()
    root.addFilter(notice)
    try:
        yield
    finally:
        root.removeFilter(notice)


def build_clip(seed: int | None = 0, architecture: str = ARCHITECTURE) -> torch.nn.Module:
    """The full-size open_clip network ``architecture`` (default ``ViT-B-16-quickgelu``) in eval mode: with seeded
    random weights, or with ``seed=None`` uninitialised for a strict load
    (:func:`~xbench.models._common.build_uninitialised`).

    Seeded by :func:`~xbench.models._common.seeded_build`, so the global RNG state is left untouched.
    """
    def network() -> torch.nn.Module:
        with _no_random_init_notice():
            return open_clip.create_model(architecture, pretrained=None, device=torch.get_default_device())

    return seeded_or_uninitialised(network, seed).eval()


def clip_state_dict(checkpoint: Mapping[str, Any], where: str = "CLIP checkpoint") -> dict[str, torch.Tensor]:
    """A loaded official checkpoint object → open_clip ``CLIP`` state dict (float32).

    Accepts the HF/open_clip state dict, an open_clip training checkpoint (``{"state_dict": ...}``, ``module.``
    prefixes) or the ``state_dict()`` of OpenAI's TorchScript archive (fp16, with metadata entries, which are dropped).
    Anything else (a non-string key, a value that is not a tensor) → :class:`CheckpointError` naming ``where`` (the
    file) and the entry.
    """
    if not isinstance(checkpoint, Mapping):
        raise CheckpointError(f"{where}: expected a state dict (mapping), got {type(checkpoint).__name__}")
    state = checkpoint.get("state_dict", checkpoint)
    if isinstance(state, Mapping):
        state = {key: value for key, value in state.items() if key not in OPENAI_METADATA_KEYS}
    return {key.removeprefix("module."): value.float() if value.is_floating_point() else value
            for key, value in require_tensor_state(state, where).items()}


def load_openai_archive(path: str | Path, hint: str = "") -> dict[str, torch.Tensor]:
    """Tensors of OpenAI's TorchScript ``ViT-B-16.pt`` read as data: its code is never compiled or run.

    The archive's ``data.pkl`` is read by the restricted unpickler
    (:func:`xbench.models.checkpoint.read_torchscript_state_dict`): the module tree's tensors under their
    dotted names, the keys ``state_dict()`` of the archive has. A file that is not such an archive, or
    one that holds no tensors (a crafted payload), raises :class:`CheckpointError` naming it and
    ``hint`` (where the plain state-dict files of the same weights are).
    """
    from xbench.models.checkpoint import read_torchscript_state_dict

    state, _ = read_torchscript_state_dict(path, hint)
    return state


def read_clip_checkpoint(path: str | Path, hint: str = "") -> dict[str, torch.Tensor]:
    """One official CLIP file (the YAML's ``checkpoint`` or an alternative), converted by :func:`clip_state_dict`:
    a ``.pt`` is OpenAI's TorchScript archive, anything else a state-dict file."""
    path = Path(path)
    return clip_state_dict(load_openai_archive(path, hint) if path.suffix == ".pt" else load_checkpoint(path), str(path))


def maskclip_value_path(block: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """MaskCLIP's replacement of a residual block: ``out_proj(ln_1(x) @ W_v.T + b_v)``, no residual, no MLP.

    ``block`` is an open_clip ``ResidualAttentionBlock`` whose ``attn`` is a batch-first ``nn.MultiheadAttention``;
    ``tokens`` is its input ``(B, L, width)``. The value path acts on each token separately.
    """
    attn = block.attn
    width = attn.embed_dim
    values = F.linear(block.ln_1(tokens), attn.in_proj_weight[2 * width:], attn.in_proj_bias[2 * width:])
    return attn.out_proj(values)


# -- shared by the open_clip-family adapters (CLIP here, BiomedCLIP in biomedclip.py) --------------
class PromptPairCLIP(Adapter):
    """Score and map rules of CLIP-style models, selected by ``params.score_mode``.

    ``"prompt_pair"`` (default): a positive and a negative prompt per class (``params.templates``); score =
    softmax over (positive, negative) of ``logit_scale() · cos(image, prompt)``, positive's probability.
    ``"paper_sigmoid"``: the paper's rule (arXiv 2510.19599, Sec. 2: ``s_c(x) = <h(x), g(t_c)>``,
    ``p_c(x) = σ(s_c(x))``) with one prompt per class in the model's official style (``params.paper_template``)
    and the L2-normalised embeddings, unscaled as the paper writes it: ``σ(cos(image, prompt))``.
    Map = cosine between each projected patch token and the class's (positive) prompt, raw, at the native
    grid. Subclasses set ``model`` (with ``encode_text``), ``tokenizer``, ``transform`` and implement
    :meth:`image_features` and :meth:`logit_scale`.
    """

    gpu_preprocess = "open_clip"  # :meth:`preprocess` (its transform's steps) as a GPU kernel

    def _set_templates(self) -> None:
        """Prompt templates of ``params.score_mode``; each needs a ``{}`` for the class name."""
        params = self.config.get("params", {})
        self.score_mode: str = params.get("score_mode", "prompt_pair")
        if self.score_mode not in SCORE_MODES:
            raise ValueError(f"{self.name} params.score_mode must be one of {SCORE_MODES}, got {self.score_mode!r}")
        if self.score_mode == "paper_sigmoid":
            if not params.get("paper_template"):
                raise ValueError(f"{self.name} params.score_mode paper_sigmoid needs params.paper_template")
            self.templates: dict[str, str] = {"positive": params["paper_template"]}
        else:
            self.templates = {**DEFAULT_TEMPLATES, **params.get("templates", {})}
        for role, template in self.templates.items():
            if "{}" not in template:
                raise ValueError(f"{self.name} template {role!r} must contain '{{}}', got {template!r}")
        self._text_cache: dict[str, tuple[torch.Tensor, ...]] = {}

    def preprocess(self, image: np.ndarray) -> torch.Tensor:
        """XBench image (float32 ``(H, W)`` in [0, 1]) → ``(3, 224, 224)`` float32 (see the module docstring)."""
        image = np.asarray(image)
        if image.ndim != 2:
            raise ValueError(f"{self.name} preprocess expects a grey (H, W) image, got shape {image.shape}")
        rgb = Image.fromarray(np.round(image * 255).astype(np.uint8)).convert("RGB")
        return self.transform(rgb)

    def encode_text_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Token ids ``(N, context_length)`` → L2-normalised text embeddings ``(N, 512)``."""
        return F.normalize(self.model.encode_text(input_ids.to(self.device)), dim=-1)

    def text_embeddings(self, prompts: Sequence[str]) -> tuple[torch.Tensor, ...]:
        """One ``(C, 512)`` L2-normalised embedding per template role (positive, then negative in prompt-pair
        mode), cached per prompt name. Each prompt is encoded in a batch of its own, so its embedding does not
        depend on which other prompts were encoded with it (a run's datasets, their order, a rank's shard)."""
        roles = list(self.templates)
        for prompt in dict.fromkeys(prompts):
            if prompt not in self._text_cache:
                with torch.no_grad():
                    emb = self.encode_text_ids(self.tokenizer([self.templates[role].format(prompt) for role in roles]))
                self._text_cache[prompt] = tuple(emb[r] for r in range(len(roles)))
        return tuple(torch.stack([self._text_cache[p][r] for p in prompts]) for r in range(len(roles)))

    def image_features(self, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Pooled image embedding ``(B, 512)`` and projected patch tokens ``(B, h·w, 512)``, both L2-normalised."""
        raise NotImplementedError

    def logit_scale(self) -> float | torch.Tensor:
        """Multiplier of the cosines before the prompt softmax."""
        raise NotImplementedError

    @torch.no_grad()
    def predict(self, pixels: torch.Tensor, prompts: Sequence[str]) -> Prediction:
        """Scores ``(B, C)`` (probabilities, rule of ``params.score_mode``) and raw cosine maps ``(B, C, h, w)``."""
        prompts = list(prompts)
        check_inputs(pixels, prompts, self.input_size)
        pos, *neg = self.text_embeddings(prompts)
        image, patches = self.image_features(pixels.to(self.device, torch.float32))
        if self.score_mode == "paper_sigmoid":
            scores = torch.sigmoid(image @ pos.T)
        else:
            logits = self.logit_scale() * torch.stack([image @ pos.T, image @ neg[0].T], dim=-1)  # (B, C, 2)
            scores = logits.softmax(dim=-1)[..., 0]
        maps = torch.einsum("bnd,cd->bcn", patches, pos).reshape(len(pixels), len(prompts), *self.grid)
        return Prediction(scores=scores.float().cpu(), maps=maps.float().cpu())


# -- adapter ---------------------------------------------------------------------------
class CLIPAdapter(PromptPairCLIP):
    """CLIP ViT-B/16 (OpenAI) adapter; see the module docstring for the score and map rules.

    Parameters
    ----------
    model : torch.nn.Module
        An open_clip ``CLIP`` built by :func:`build_clip` (weights already loaded).
    config : dict, optional
        The model config; ``params.map_variant`` (``"naive"`` or ``"maskclip"``) and ``params.templates``
        (``{"positive": "...{}...", "negative": "...{}..."}``) are read from it.
    device : str or torch.device, default="cpu"
    weights_label : str, default="unknown"
        ``"official"`` or ``"random-init"`` (shown by :meth:`describe`).
    """

    config_name = "clip"
    architecture: ClassVar[str] = ARCHITECTURE  # open_clip config of the network (subclasses: other OpenAI ViTs)

    def __init__(self, model: torch.nn.Module, config: Mapping[str, Any] | None = None,
                 device: str | torch.device = "cpu", weights_label: str = "unknown"):
        super().__init__(config, device)
        params = self.config.get("params", {})
        self.map_variant: str = params.get("map_variant", "naive")
        if self.map_variant not in MAP_VARIANTS:
            raise ValueError(f"CLIP params.map_variant must be one of {MAP_VARIANTS}, got {self.map_variant!r}")
        self._set_templates()
        self.model = model.to(self.device).eval()
        self.check_fact("grid", tuple(self.model.visual.grid_size), f"the {self.architecture} network")
        self.tokenizer = open_clip.get_tokenizer(self.architecture)
        self.transform = open_clip.image_transform(
            self.input_size, is_train=False, mean=open_clip.OPENAI_DATASET_MEAN, std=open_clip.OPENAI_DATASET_STD)
        self.weights_label = weights_label

    # -- construction --------------------------------------------------------------------
    @classmethod
    def _load(cls, files: Mapping[str, Path], config: Mapping[str, Any], device: str | torch.device) -> CLIPAdapter:
        """Official weights: the first of the YAML's ``checkpoint`` files found in the folder."""
        path = files["checkpoint"]
        plain = [w for w in config.get("weights", {}).values() if not str(w.get("path", "")).endswith(".pt")]
        hint = ("Use " + " or ".join(f"{w['path']} ({w.get('source', '')})" for w in plain)
                + " instead (plain state dicts of the same OpenAI weights).") if plain else ""
        return cls.from_checkpoint(read_clip_checkpoint(path, hint), config, device, where=str(path))

    @classmethod
    def _random(cls, files: Mapping[str, Path], config: Mapping[str, Any], device: str | torch.device) -> CLIPAdapter:
        """The full-size network with weights seeded by ``params.seed``."""
        return cls(build_clip(int(config["params"].get("seed", 0)), cls.architecture), config, device)

    @classmethod
    def from_checkpoint(cls, checkpoint: Mapping[str, Any], config: Mapping[str, Any] | None = None,
                        device: str | torch.device = "cpu", where: str = "CLIP checkpoint") -> CLIPAdapter:
        """Adapter from a loaded checkpoint object (the path every official file takes); labelled ``"official"``.

        A checkpoint that does not match the architecture raises :class:`~xbench.core.errors.CheckpointError` listing the
        missing / unexpected / mis-shaped keys.
        """
        model = build_clip(None, cls.architecture)  # every parameter is loaded next
        load_state_strict(model, clip_state_dict(checkpoint, where), where)
        return cls(model, config, device, weights_label="official")

    def logit_scale(self) -> float:
        """OpenAI's fixed zero-shot scale, 100."""
        return LOGIT_SCALE

    def input_window(self, size: tuple[int, int]) -> tuple[float, float, float, float]:
        """Shorter side to 224 then centre crop: the map covers a centred square of the shorter side."""
        return resize_crop_window(size, self.input_size, "shortest")

    def image_features(self, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Pooled image embedding ``(B, 512)`` and projected patch tokens ``(B, h·w, 512)``, both L2-normalised.

        Patch tokens follow ``params.map_variant`` (module docstring); their order is row-major over the grid.
        """
        visual = self.model.visual
        depth = len(visual.transformer.resblocks)
        out = visual.forward_intermediates(
            pixels, indices=[depth - 2, depth - 1], output_fmt="NLC", output_extra_tokens=True)
        before_last, last = out["image_intermediates"]  # patch tokens (CLS removed), before ln_post
        if self.map_variant == "maskclip":
            last = maskclip_value_path(visual.transformer.resblocks[-1], before_last)
        patches = visual.ln_post(last) @ visual.proj
        return F.normalize(out["image_features"], dim=-1), F.normalize(patches, dim=-1)

