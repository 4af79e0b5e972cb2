"""Text-encoder and tokenizer folders in the layouts publishers ship (issue 11), written by the tests."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from xbench.core.errors import CheckpointError, FormatError, MissingFileError
from xbench.models.kad import MedKEBERTTokenizer
from xbench.models.medklip import load_text_encoder

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "there", "is", "pleural", "effusion", "##s", "no", "mass"]
TEXT = "There is Pleural effusions"
EXPECTED_IDS = [2, 5, 6, 7, 8, 9, 3]  # [CLS] there is pleural effusion ##s [SEP] (lower-cased WordPiece)


def _tiny_config():
    from transformers import BertConfig

    return BertConfig(vocab_size=len(VOCAB), hidden_size=8, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=16, max_position_embeddings=32)


@pytest.fixture
def bert_folder(tmp_path):
    """A Bio_ClinicalBERT-like folder: config.json, model.safetensors of a BertForPreTraining (``bert.`` + ``cls.``), vocab."""
    from transformers import BertForPreTraining

    torch.manual_seed(0)
    model = BertForPreTraining(_tiny_config()).eval()
    folder = tmp_path / "Bio_ClinicalBERT"
    folder.mkdir()
    model.config.to_json_file(str(folder / "config.json"))
    state = {k: v.contiguous().clone() for k, v in model.state_dict().items()}
    save_file(state, folder / "model.safetensors")
    (folder / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    return folder, model


def _hidden(bert):
    ids = torch.tensor([EXPECTED_IDS])
    with torch.no_grad():
        return bert(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state


def test_complete_folder_loads_the_published_weights(bert_folder):
    folder, reference = bert_folder
    bert, tokenizer = load_text_encoder(folder)
    assert torch.equal(_hidden(bert), _hidden(reference.bert))
    assert tokenizer(TEXT)["input_ids"] == EXPECTED_IDS


def test_missing_encoder_weight_is_an_error_naming_it(bert_folder):
    folder, _ = bert_folder
    state = load_file(folder / "model.safetensors")
    del state["bert.encoder.layer.1.attention.self.query.weight"]
    save_file(state, folder / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"model\.safetensors.*missing 1 \[encoder\.layer\.1\.attention\.self\.query\.weight\]"):
        load_text_encoder(folder)


def test_unexpected_encoder_weight_is_an_error_naming_it(bert_folder):
    folder, _ = bert_folder
    state = load_file(folder / "model.safetensors")
    state["bert.encoder.layer.7.output.dense.weight"] = torch.zeros(8, 16)
    save_file(state, folder / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"unexpected 1 \[encoder\.layer\.7\.output\.dense\.weight\]"):
        load_text_encoder(folder)


def test_legacy_bin_with_gamma_beta_position_ids_and_heads_loads(bert_folder):
    """pytorch_model.bin of an older transformers: LayerNorm.gamma/beta, a saved position_ids, pre-training heads."""
    folder, reference = bert_folder
    state = load_file(folder / "model.safetensors")
    (folder / "model.safetensors").unlink()
    legacy = {}
    for key, value in state.items():
        key = key.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta")
        legacy[key] = value
    legacy["bert.embeddings.position_ids"] = torch.arange(32)[None]
    torch.save(legacy, folder / "pytorch_model.bin")
    bert, _ = load_text_encoder(folder)
    assert torch.equal(_hidden(bert), _hidden(reference.bert))


def test_folder_without_weights_or_config_names_the_file(bert_folder):
    folder, _ = bert_folder
    (folder / "model.safetensors").unlink()
    with pytest.raises(MissingFileError, match=r"model\.safetensors"):
        load_text_encoder(folder)
    (folder / "config.json").unlink()
    with pytest.raises(MissingFileError, match=r"config\.json"):
        load_text_encoder(folder)


# -- tokenizer layouts -----------------------------------------------------------------------------
LAYOUTS = {
    "vocab only": {},
    "tokenizer_config without class": {"tokenizer_config.json": {"do_lower_case": True, "model_max_length": 512}},
    "tokenizer_config with class": {"tokenizer_config.json": {"tokenizer_class": "BertTokenizer", "do_lower_case": True}},
    "config.json model_type bert": {"config.json": {"model_type": "bert", "vocab_size": len(VOCAB)}},
    "all files": {"config.json": {"model_type": "bert"}, "tokenizer_config.json": {"tokenizer_class": "BertTokenizerFast"},
                  "special_tokens_map.json": {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]",
                                              "cls_token": "[CLS]", "mask_token": "[MASK]"}},
}


def _write_layout(folder, files):
    folder.mkdir()
    (folder / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    for name, content in files.items():
        (folder / name).write_text(json.dumps(content))
    return folder


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_kad_tokenizer_reads_every_published_layout(tmp_path, layout):
    folder = _write_layout(tmp_path / "Med-KEBERT", LAYOUTS[layout])
    ids, mask = MedKEBERTTokenizer(folder, max_length=10)([TEXT])
    assert ids[0].tolist() == EXPECTED_IDS + [0, 0, 0]
    assert mask[0].tolist() == [1] * 7 + [0] * 3


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_slow_bert_tokenizer_reads_every_published_layout(tmp_path, layout):
    from xbench.models.text import load_bert_tokenizer

    folder = _write_layout(tmp_path / "BioClinicalMPBERT", LAYOUTS[layout])
    assert load_bert_tokenizer(folder)(TEXT)["input_ids"] == EXPECTED_IDS


def test_tokenizer_folder_errors_name_file_and_field(tmp_path):
    from xbench.models.text import load_bert_tokenizer

    with pytest.raises(MissingFileError, match=r"vocab\.txt"):
        load_bert_tokenizer(tmp_path)
    folder = _write_layout(tmp_path / "roberta", {"tokenizer_config.json": {"tokenizer_class": "RobertaTokenizer"}})
    with pytest.raises(FormatError, match=r"tokenizer_config\.json, field 'tokenizer_class': declares 'RobertaTokenizer'"):
        load_bert_tokenizer(folder)
    folder = _write_layout(tmp_path / "gpt", {"config.json": {"model_type": "gpt2"}})
    with pytest.raises(FormatError, match=r"config\.json, field 'model_type'"):
        load_bert_tokenizer(folder)
    folder = _write_layout(tmp_path / "broken", {})
    (folder / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(FormatError, match=r"tokenizer_config\.json: not valid JSON"):
        load_bert_tokenizer(folder)
