"""Test helper: a BiomedCLIP weights folder without a checkpoint (published config + tiny vocabulary), enough for
``create_model("biomedclip", weights=folder, random_init=True)`` (``from biomedclip_folder import write_folder``)."""
from __future__ import annotations

import json

OPEN_CLIP_CONFIG = {  # the published open_clip_config.json of microsoft/BiomedCLIP-PubMedBERT_256-vit_base_patch16_224
    "model_cfg": {
        "embed_dim": 512,
        "vision_cfg": {"timm_model_name": "vit_base_patch16_224", "timm_model_pretrained": False, "timm_pool": "",
                       "timm_proj": "linear", "image_size": 224},
        "text_cfg": {"hf_model_name": "microsoft/BiomedNLP-BiomedBERT-base-uncased-abstract",
                     "hf_tokenizer_name": "microsoft/BiomedNLP-BiomedBERT-base-uncased-abstract",
                     "hf_proj_type": "mlp", "hf_pooler_type": "cls_last_hidden_state_pooler", "context_length": 256},
    },
    "preprocess_cfg": {"mean": [0.48145466, 0.4578275, 0.40821073], "std": [0.26862954, 0.26130258, 0.27577711]},
}
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "chest", "x", "-", "ray", "showing", "with", "no",
         "pneumonia", "pleural", "effusion", "cardio", "##megaly"]


def write_folder(folder):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "open_clip_config.json").write_text(json.dumps(OPEN_CLIP_CONFIG))
    (folder / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    tokenizer_config = {"tokenizer_class": "BertTokenizer", "do_lower_case": True}
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    return folder
