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

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import open_clip
import torch
import torch.nn.functional as F
from PIL import Image

from xbench.errors import CheckpointError, MissingFileError
from xbench.models.base import Adapter, Prediction, load_checkpoint, load_state_strict, resize_crop_window

ARCHITECTURE = "ViT-B-16-quickgelu"  # open_clip config of OpenAI's ViT-B/16 (QuickGELU activations)
CHECKPOINT_FILES = ("open_clip_pytorch_model.bin", "open_clip_model.safetensors", "ViT-B-16.pt")
WEIGHTS_SOURCE = "https://huggingface.co/timm/vit_base_patch16_clip_224.openai"
OPENAI_METADATA_KEYS = ("input_resolution", "context_length", "vocab_size")  # entries of OpenAI's archive, not weights
MAP_VARIANTS = ("naive", "maskclip")
DEFAULT_TEMPLATES = {"positive": "a chest x-ray showing {}", "negative": "a chest x-ray with no {}"}
LOGIT_SCALE = 100.0  # OpenAI's zero-shot scale (exp of the released logit_scale)


# -- network and weights ---------------------------------------------------------------
def build_clip(seed: int = 0) -> torch.nn.Module:
    """The full-size open_clip ``ViT-B-16-quickgelu`` network with seeded random weights, in eval mode.

    The seed is applied inside :func:`torch.random.fork_rng`, so the global RNG state is left untouched.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = open_clip.create_model(ARCHITECTURE, pretrained=None)
    return model.eval()


def clip_state_dict(checkpoint: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """A loaded official checkpoint object → open_clip ``CLIP`` state dict (float32).

    Accepts the HF/open_clip state dict, an open_clip training checkpoint (``{"state_dict": ...}``, ``module.``
    prefixes) or the ``state_dict()`` of OpenAI's TorchScript archive (fp16, with metadata entries, which are dropped).
    """
    if not isinstance(checkpoint, Mapping):
        raise CheckpointError(f"CLIP checkpoint: expected a state dict (mapping), got {type(checkpoint).__name__}")
    state = checkpoint.get("state_dict", checkpoint)
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        if key in OPENAI_METADATA_KEYS:
            continue
        if not isinstance(value, torch.Tensor):
            raise CheckpointError(f"CLIP checkpoint: entry {key!r} is a {type(value).__name__}, not a tensor")
        out[key.removeprefix("module.")] = value.float() if value.is_floating_point() else value
    return out


def load_openai_archive(path: str | Path) -> dict[str, torch.Tensor]:
    """Tensors of OpenAI's TorchScript ``ViT-B-16.pt`` read as data: its code is never compiled or run.

    The archive's ``data.pkl`` is read by the restricted unpickler
    (:func:`xbench.models.checkpoint.read_torchscript_state_dict`): the module tree's tensors under their
    dotted names, the keys ``state_dict()`` of the archive has. A file that is not such an archive, or
    one that holds no tensors (a crafted payload), raises :class:`CheckpointError` naming it and
    pointing to the plain state-dict files.
    """
    from xbench.models.checkpoint import read_torchscript_state_dict

    hint = (f"Use {CHECKPOINT_FILES[0]} or {CHECKPOINT_FILES[1]} from {WEIGHTS_SOURCE} instead "
            "(plain state dicts of the same OpenAI weights).")
    state, _ = read_torchscript_state_dict(path, hint)
    return state


def read_clip_checkpoint(folder: str | Path) -> tuple[dict[str, torch.Tensor], Path]:
    """The first of :data:`CHECKPOINT_FILES` found in ``folder``, loaded and converted by :func:`clip_state_dict`."""
    folder = Path(folder)
    for name in CHECKPOINT_FILES:
        path = folder / name
        if path.exists():
            raw = load_openai_archive(path) if path.suffix == ".pt" else load_checkpoint(path)
            return clip_state_dict(raw), path
    raise MissingFileError(
        folder / CHECKPOINT_FILES[0],
        "CLIP ViT-B/16 OpenAI weights (one of " + ", ".join(CHECKPOINT_FILES) + ")",
        WEIGHTS_SOURCE,
    )


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
    """Score and map rules of CLIP-style models with a positive and a negative prompt per class.

    Score = softmax over (positive, negative) of ``logit_scale() · cos(image, prompt)``, positive's
    probability; map = cosine between each projected patch token and the positive prompt, raw, at the
    native grid. Subclasses set ``model`` (with ``encode_text``), ``tokenizer``, ``transform`` and
    ``templates`` and implement :meth:`image_features` and :meth:`logit_scale`.
    """

    map_source = "similarity"
    score_rule = "probability"

    def _set_templates(self) -> None:
        """``params.templates`` over :data:`DEFAULT_TEMPLATES`; each needs a ``{}`` for the class name."""
        self.templates: dict[str, str] = {**DEFAULT_TEMPLATES, **self.config.get("params", {}).get("templates", {})}
        for role in ("positive", "negative"):
            if "{}" not in self.templates[role]:
                raise ValueError(f"{self.name} params.templates.{role} must contain '{{}}', got {self.templates[role]!r}")
        self._text_cache: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

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

    def text_embeddings(self, prompts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Positive and negative prompt embeddings ``(C, 512)`` each, L2-normalised (cached per prompt name)."""
        todo = [p for p in dict.fromkeys(prompts) if p not in self._text_cache]
        if todo:
            texts = [self.templates[role].format(p) for role in ("positive", "negative") for p in todo]
            with torch.no_grad():
                emb = self.encode_text_ids(self.tokenizer(texts))
            for i, prompt in enumerate(todo):
                self._text_cache[prompt] = (emb[i], emb[len(todo) + i])
        pos = torch.stack([self._text_cache[p][0] for p in prompts])
        neg = torch.stack([self._text_cache[p][1] for p in prompts])
        return pos, neg

    def image_features(self, pixels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Pooled image embedding ``(B, 512)`` and projected patch tokens ``(B, h·w, 512)``, both L2-normalised."""
        raise NotImplementedError

    def logit_scale(self) -> float | torch.Tensor:
        """Multiplier of the cosines before the prompt softmax."""
        raise NotImplementedError

    @torch.no_grad()
    def predict(self, pixels: torch.Tensor, prompts: Sequence[str]) -> Prediction:
        """Scores ``(B, C)`` (positive-prompt probability) and raw cosine maps ``(B, C, h, w)``, float32 on CPU."""
        prompts = list(prompts)
        if not prompts:
            raise ValueError(f"{self.name} predict: prompts is empty")
        if pixels.ndim != 4 or tuple(pixels.shape[1:]) != (3, self.input_size, self.input_size):
            raise ValueError(f"{self.name} predict expects pixels (B, 3, {self.input_size}, {self.input_size}), "
                             f"got {tuple(pixels.shape)}")
        pos, neg = self.text_embeddings(prompts)
        image, patches = self.image_features(pixels.to(self.device, torch.float32))
        logits = self.logit_scale() * torch.stack([image @ pos.T, image @ neg.T], dim=-1)  # (B, C, 2)
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

    name = "clip"
    map_source = "similarity"
    score_rule = "probability"
    citation = "Radford et al., CLIP, ICML 2021"
    input_size = 224
    grid = (14, 14)

    def __init__(self, model: torch.nn.Module, config: Mapping[str, Any] | None = None,
                 device: str | torch.device = "cpu", weights_label: str = "unknown"):
        super().__init__(config, device)
        params = self.config.get("params", {})
        self.map_variant: str = params.get("map_variant", "naive")
        if self.map_variant not in MAP_VARIANTS:
            raise ValueError(f"CLIP params.map_variant must be one of {MAP_VARIANTS}, got {self.map_variant!r}")
        self._set_templates()
        self.model = model.to(self.device).eval()
        self.grid = tuple(self.model.visual.grid_size)
        self.tokenizer = open_clip.get_tokenizer(ARCHITECTURE)
        self.transform = open_clip.image_transform(
            self.input_size, is_train=False, mean=open_clip.OPENAI_DATASET_MEAN, std=open_clip.OPENAI_DATASET_STD)
        self.weights_label = weights_label

    # -- construction --------------------------------------------------------------------
    @classmethod
    def from_config(cls, config: Mapping[str, Any], weights_dir: str | Path | None,
                    device: str | torch.device = "cpu") -> CLIPAdapter:
        """Official weights from ``weights_dir``; else random init if ``params.random_init``; else MissingFileError."""
        params = config.get("params", {})
        if weights_dir is not None:
            state, path = read_clip_checkpoint(weights_dir)
            return cls.from_checkpoint(state, config, device, where=str(path))
        if params.get("random_init", False):
            return cls(build_clip(int(params.get("seed", 0))), config, device, weights_label="random-init")
        raise MissingFileError(
            Path("$XBENCH_WEIGHTS") / "clip" / CHECKPOINT_FILES[0],
            "CLIP weights folder holding one of " + ", ".join(CHECKPOINT_FILES)
            + " (pass create_model('clip', weights=DIR) or set XBENCH_WEIGHTS; or params random_init=True)",
            WEIGHTS_SOURCE,
        )

    @classmethod
    def from_checkpoint(cls, checkpoint: Mapping[str, Any], config: Mapping[str, Any] | None = None,
                        device: str | torch.device = "cpu", where: str = "CLIP checkpoint") -> CLIPAdapter:
        """Adapter from a loaded checkpoint object (the path every official file takes); labelled ``"official"``.

        A checkpoint that does not match the architecture raises :class:`~xbench.errors.CheckpointError` listing the
        missing / unexpected / mis-shaped keys.
        """
        model = build_clip(int(dict(config or {}).get("params", {}).get("seed", 0)))
        load_state_strict(model, clip_state_dict(checkpoint), where)
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

