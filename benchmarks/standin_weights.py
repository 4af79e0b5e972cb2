"""Stand-in weight folders: each model's seeded random-init network written as the files its real weights come in.

A real run builds a model from its weights folder (``xbench.create_model(name, weights=DIR)`` ->
``Adapter.from_config`` -> the adapter's ``_load``); a random-init run builds the network in the process instead.
:func:`write_weight_folders` writes, for clip, medklip, mavl, kad, carzero, devide, chexzero and gloria,
``<folder>/<name>/`` holding
the files that model's YAML ``weights:`` section lists (``xbench/configs/models/<name>.yaml``), in the layout the
published files have, so that ``create_model(name, weights=<folder>/<name>)`` builds from files (label
``"official"``; DeViDe, which has no official release, ``"user-checkpoint"``) and its networks equal, tensor for
tensor, those of ``create_model(name, random_init=True, seed=seed)``:

=========  ====================================================================================================
clip       ``open_clip_pytorch_model.bin``: the plain open_clip state dict (as on the Hugging Face hub).
medklip    ``checkpoint_final.pth``: ``{"model": {"module.<key>": ...}, "epoch"}`` (``nn.DataParallel`` keys);
           ``observation explanation.json`` (the 75 entities, pneumonia under the official misspelt key
           ``"eumonia"``); ``Bio_ClinicalBERT/`` (``config.json``, ``pytorch_model.bin`` with ``bert.`` keys and
           the pooler, ``vocab.txt``).
mavl       ``checkpoint_full_40.pth``: as MedKLIP's plus the pre-training ``module.temp`` (9,), which the loader
           drops; ``observation explanation.json`` and ``gpt4_mimic.json`` (8 aspect strings, border ... texture),
           both with the 75 entities and ``covid19``; ``Bio_ClinicalBERT/`` as MedKLIP's.
kad        ``best_valid.pt``: ``{"image_encoder", "text_encoder", "model", "epoch"}``; the image encoder's trunk
           also under its ``resnet.<child>.*`` aliases and the TQN's final norm also as ``decoder.norm.*`` (one
           shared tensor each, as the official modules register them); ``Med-KEBERT/`` (``vocab.txt``,
           ``tokenizer_config.json``, ``special_tokens_map.json``).
carzero    ``CARZero_best_model.ckpt``: Lightning ``{"state_dict": {"CARZero.<key>": ...}, "epoch", "global_step",
           "pytorch-lightning_version"}`` (no ``hyper_parameters``, whose OmegaConf object the reader would keep
           as a placeholder with a warning); ``BioClinicalMPBERT/`` (``vocab.txt``, ``tokenizer_config.json``,
           ``config.json``).
devide     ``devide.pt``: KAD's containers with ``vit.*`` image keys (the layout ``xbench/models/devide.py``
           documents); ``Med-KEBERT/`` as KAD's.
chexzero   ``chexzero.pt``: the plain state dict of OpenAI's ViT-B/32 CLIP (``torch.save(model.state_dict())``, as
           each checkpoint of the published ensemble).
gloria     ``chexpert_resnet50.ckpt``: Lightning ``{"state_dict": {"gloria.<key>": ...}, "epoch", "global_step",
           "pytorch-lightning_version"}``; ``Bio_ClinicalBERT/`` (``config.json``, ``vocab.txt``: the tokenizer the
           official code fetches from the hub; the BERT weights are in the checkpoint).
=========  ====================================================================================================

Tokenizer and text files are synthesised (nothing is downloaded): a BERT ``vocab.txt`` has exactly the text
encoder's ``vocab_size`` lines, the BERT-base special ids (``[PAD]`` 0, ``[unused1..99]``, ``[UNK]`` 100, ``[CLS]``
101, ``[SEP]`` 102, ``[MASK]`` 103), single characters and their ``##`` pieces (so no word is all ``[UNK]``), the
lower-case words of the entity names, synonyms, official spellings, templates and every registered dataset's class
names, then inert ``[unusedN]`` filler. Descriptions and aspects are short synthetic sentences. Outputs therefore
differ from the random-init adapter's (other tokens); the networks do not.

A folder is written under a temporary name and renamed when complete; its marker ``.standin_complete`` (JSON:
model, seed, format) is written last. A complete folder of the same seed and format is reused as it is; one of
another seed or format is rewritten; an existing folder without the marker is never touched (an error names it).
Files are ``torch.save`` zip archives of tensors, strings and ints only, so the safe reader
(:mod:`xbench.models.checkpoint`) reads them without placeholders or warnings.

    python benchmarks/standin_weights.py --out DIR --models clip,medklip,mavl,kad,carzero,devide,chexzero,gloria [--seed 0]

prints ``{model: {"folder", "bytes", "seconds", "reused"}}`` as JSON.
"""
from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import re
import shutil
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

MODELS = ("clip", "medklip", "mavl", "kad", "carzero", "devide", "chexzero", "gloria")
MARKER = ".standin_complete"
FORMAT = 1  # bump when a layout changes: folders of another format are rewritten
BERT_SPECIALS = ["[PAD]", *(f"[unused{i}]" for i in range(1, 100)), "[UNK]", "[CLS]", "[SEP]", "[MASK]"]  # ids 0-103
SPECIAL_TOKENS_MAP = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]",
                      "mask_token": "[MASK]"}
CHARACTERS = "abcdefghijklmnopqrstuvwxyz0123456789"
PUNCTUATION = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"


# -- public entry ------------------------------------------------------------------------------
def write_weight_folders(models: Sequence[str], folder: Path, *, seed: int = 0) -> dict[str, Path]:
    """For each model name (of clip, medklip, mavl, kad, carzero, devide, chexzero, gloria; others, e.g. center_prior / ref_* /
    biomedclip: skipped, not in the result), write into ``folder/<name>/`` the files its YAML ``weights:`` section
    lists, in the layout its ``_load`` reads, holding the weights of its seeded random-init network (the network
    ``xbench.create_model(name, random_init=True, seed=seed)`` builds). Returns ``{name: folder/name}``.

    A folder already complete (marker :data:`MARKER` of the same seed and :data:`FORMAT`, written last) is reused,
    not rewritten. Each random-init adapter is built once, saved and freed before the next.
    """
    folder = Path(folder)
    out: dict[str, Path] = {}
    for name in dict.fromkeys(models):
        if name not in WRITERS:
            continue
        target = folder / name
        if not is_complete(target, name, seed):
            _write_folder(name, target, seed)
        out[name] = target
    return out


def is_complete(target: Path, name: str, seed: int) -> bool:
    """Whether ``target`` is a finished stand-in folder of ``name`` written with ``seed`` in this :data:`FORMAT`: its
    marker says so and every file of the YAML's ``weights:`` section (alternatives aside) is there."""
    from xbench.spec.registry import model_config

    target = Path(target)
    try:
        marker = json.loads((target / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    entries = (model_config(name).get("weights") or {}).values()
    return marker == _marker(name, seed) and all((target / e["path"]).exists() for e in entries
                                                 if not e.get("alternative_to"))


def folder_bytes(target: Path) -> int:
    """Total size in bytes of the files under ``target``."""
    return sum(p.stat().st_size for p in Path(target).rglob("*") if p.is_file())


# -- writing one folder --------------------------------------------------------------------------
def _marker(name: str, seed: int) -> dict[str, Any]:
    return {"model": name, "seed": int(seed), "format": FORMAT}


def _write_folder(name: str, target: Path, seed: int) -> None:
    """Write ``target`` under a temporary sibling name, marker last, then rename it into place.

    An existing ``target`` is replaced only when it carries this module's marker (another seed or format); any other
    existing folder raises :class:`FileExistsError` (it may hold real weights).
    """
    if target.exists() and not (target / MARKER).is_file():
        raise FileExistsError(f"{target} exists and is not a stand-in weights folder (no {MARKER}); "
                              "remove it or choose another --out")
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.parent / f".{name}.partial-{os.getpid()}"
    if partial.exists():
        shutil.rmtree(partial)
    partial.mkdir()
    try:
        adapter = random_init_adapter(name, seed)
        WRITERS[name](adapter, partial)
        del adapter
        gc.collect()
        (partial / MARKER).write_text(json.dumps(_marker(name, seed)) + "\n", encoding="utf-8")
        if is_complete(target, name, seed):  # another process finished it meanwhile
            shutil.rmtree(partial)
            return
        if target.exists():
            shutil.rmtree(target)
        try:
            partial.rename(target)
        except OSError:
            if not is_complete(target, name, seed):  # not another process's finished folder
                raise
            shutil.rmtree(partial)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise


def random_init_adapter(name: str, seed: int) -> Any:
    """``xbench.create_model(name, random_init=True, seed=seed)`` on the CPU, built from the model's YAML without the
    ``$XBENCH_WEIGHTS`` folder lookup (which would load files instead). DeViDe's "unverified" warning is silenced."""
    from xbench.spec.registry import import_target, model_config

    cfg = model_config(name)
    config = {**cfg, "params": {**(cfg.get("params") or {}), "random_init": True, "seed": int(seed)}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        adapter = import_target(cfg["class"]).from_config(config, None, "cpu")
    if adapter.weights_label != "random-init":
        raise RuntimeError(f"{name}: expected a random-init build, got {adapter.weights_label!r}")
    return adapter


def _save(obj: Any, path: Path) -> None:
    """``torch.save`` (zip format) of ``obj``."""
    torch.save(obj, path)


def _state(module: torch.nn.Module, prefix: str = "") -> dict[str, torch.Tensor]:
    """``module.state_dict()`` with ``prefix`` before every key (tensors share the module's storage)."""
    return {prefix + k: v for k, v in module.state_dict().items()}


# -- text files ----------------------------------------------------------------------------------
def _words(texts: Iterable[str]) -> set[str]:
    """Lower-case ``[a-z0-9]+`` words of ``texts``."""
    return {w for t in texts for w in re.findall(r"[a-z0-9]+", t.lower())}


@functools.cache
def _prompt_words() -> frozenset[str]:
    """Words of the names the adapters put into text: entity names, synonyms, official spellings, templates and the
    class names / prompts of every registered dataset manifest."""
    from xbench.models import carzero, clip, kad
    from xbench.models.entity_queries import ENTITIES, SYNONYMS
    from xbench.models.mavl import ASPECTS
    from xbench.models.medklip import UNSEEN_DESCRIPTIONS
    from xbench.spec.registry import dataset_manifest, list_datasets

    texts = [*ENTITIES, *SYNONYMS, *SYNONYMS.values(), *ASPECTS, *UNSEEN_DESCRIPTIONS.values(),
             *kad.OFFICIAL_TEXT.values(), *carzero.OFFICIAL_NAMES.values(), carzero.TEMPLATE,
             *clip.DEFAULT_TEMPLATES.values(), _description("x"), _aspect("x", "x")]
    for dataset in list_datasets():
        for entry in dataset_manifest(dataset).get("classes") or []:
            texts += [str(entry.get(k, "")) for k in ("name", "prompt", "finding", "display")]
    return frozenset(_words(t.replace("_", " ") for t in texts))


def bert_vocab(size: int, words: Iterable[str] = ()) -> list[str]:
    """A BERT WordPiece vocabulary of exactly ``size`` tokens (module docstring): BERT-base special ids, characters
    and their ``##`` pieces, ``words`` (sorted), then ``[unusedN]`` filler."""
    head = [*BERT_SPECIALS, *PUNCTUATION, *CHARACTERS, *(f"##{c}" for c in CHARACTERS)]
    seen = set(head)
    tokens = head + sorted(w for w in set(words) if w not in seen)
    if len(tokens) > size:
        raise ValueError(f"{len(tokens)} tokens do not fit a vocabulary of {size}")
    return tokens + [f"[unused{i}]" for i in range(100, 100 + size - len(tokens))]


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")


def write_tokenizer(folder: Path, vocab_size: int, *, config: Any = None, tokenizer_config: bool = True) -> None:
    """``folder/vocab.txt`` (:func:`bert_vocab` of :func:`_prompt_words`), with ``tokenizer_config.json`` and
    ``special_tokens_map.json`` when ``tokenizer_config``, and ``config.json`` from ``config`` (a ``BertConfig``)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.txt").write_text("\n".join(bert_vocab(vocab_size, _prompt_words())) + "\n", encoding="utf-8")
    if tokenizer_config:
        _write_json(folder / "tokenizer_config.json", {"do_lower_case": True, "model_max_length": 512,
                                                       "tokenizer_class": "BertTokenizer", **SPECIAL_TOKENS_MAP})
        _write_json(folder / "special_tokens_map.json", SPECIAL_TOKENS_MAP)
    if config is not None:
        config.to_json_file(str(folder / "config.json"))


def _description(name: str) -> str:
    return f"{name} seen on the chest radiograph"


def _aspect(aspect: str, name: str) -> str:
    return f"{aspect} of the {name} on the chest radiograph"


def _descriptions(names: Sequence[str], rename: Mapping[str, str] | None = None) -> dict[str, str]:
    """``{key: description}`` of ``names`` (key renamed by ``rename``), in order."""
    rename = rename or {}
    return {rename.get(n, n): _description(n.replace("_", " ")) for n in names}


# -- per model -----------------------------------------------------------------------------------
def _write_clip(adapter: Any, out: Path) -> None:
    """``open_clip_pytorch_model.bin``: the plain open_clip state dict."""
    _save(_state(adapter.model), out / "open_clip_pytorch_model.bin")


def _write_bio_clinical_bert(bert: torch.nn.Module, folder: Path) -> None:
    """``Bio_ClinicalBERT/``: ``config.json``, ``pytorch_model.bin`` (``bert.`` keys, pooler included; the loader
    strips the prefix and drops the pooler) and ``vocab.txt`` (no tokenizer config, as published)."""
    write_tokenizer(folder, bert.config.vocab_size, config=bert.config, tokenizer_config=False)
    _save(_state(bert, "bert."), folder / "pytorch_model.bin")


def _write_medklip(adapter: Any, out: Path) -> None:
    from xbench.models.entity_queries import ENTITIES

    _save({"model": _state(adapter.net, "module."), "epoch": 0}, out / "checkpoint_final.pth")
    _write_json(out / "observation explanation.json", _descriptions(ENTITIES, {"pneumonia": "eumonia"}))
    _write_bio_clinical_bert(adapter.text_encoder, out / "Bio_ClinicalBERT")


def _write_mavl(adapter: Any, out: Path) -> None:
    from xbench.models.entity_queries import ENTITIES
    from xbench.models.mavl import ASPECTS

    names = [*ENTITIES, "covid19"]
    state = {**_state(adapter.net, "module."), "module.temp": torch.full((len(ASPECTS) + 1,), 0.07)}
    _save({"model": state, "epoch": 0}, out / "checkpoint_full_40.pth")
    _write_json(out / "observation explanation.json", _descriptions(names))
    _write_json(out / "gpt4_mimic.json", {n: [_aspect(a, n.replace("_", " ")) for a in ASPECTS] for n in names})
    _write_bio_clinical_bert(adapter.text_encoder, out / "Bio_ClinicalBERT")


def _with_aliases(state: dict[str, torch.Tensor], aliases: Callable[[str], str | None]) -> dict[str, torch.Tensor]:
    """``state`` plus, for each key with an alias (``aliases(key)`` not None), the same tensor under that alias."""
    out = dict(state)
    for key, value in state.items():
        alias = aliases(key)
        if alias is not None:
            out[alias] = value
    return out


def _kad_containers(network: Any) -> dict[str, dict[str, torch.Tensor]]:
    """``text_encoder`` and ``model`` (TQN, final norm also as ``decoder.norm.*``) containers of KAD / DeViDe."""
    return {"text_encoder": _state(network.text_encoder),
            "model": _with_aliases(_state(network.model), lambda k: "decoder.norm." + k[len("decoder_norm."):]
                                   if k.startswith("decoder_norm.") else None)}


def _write_kad(adapter: Any, out: Path) -> None:
    from xbench.models.kad import _RESNET_CHILDREN

    child = {index: name for name, index in _RESNET_CHILDREN.items()}

    def resnet_alias(key: str) -> str | None:  # res_features.<i>.rest -> resnet.<child>.rest
        match = re.match(r"res_features\.(\d+)\.(.+)$", key)
        return f"resnet.{child[int(match.group(1))]}.{match.group(2)}" if match else None

    network = adapter.network
    image = _with_aliases(_state(network.image_encoder), resnet_alias)
    _save({"image_encoder": image, **_kad_containers(network), "epoch": 0}, out / "best_valid.pt")
    write_tokenizer(out / "Med-KEBERT", network.text_encoder.bert_model.config.vocab_size)


def _write_devide(adapter: Any, out: Path) -> None:
    network = adapter.network
    _save({"image_encoder": _state(network.image_encoder), **_kad_containers(network), "epoch": 0}, out / "devide.pt")
    write_tokenizer(out / "Med-KEBERT", network.text_encoder.bert_model.config.vocab_size)


def _write_carzero(adapter: Any, out: Path) -> None:
    model = adapter.model
    _save({"state_dict": _state(model, "CARZero."), "epoch": 0, "global_step": 0,
           "pytorch-lightning_version": "1.9.0"}, out / "CARZero_best_model.ckpt")
    bert_config = model.text_encoder.model.config
    write_tokenizer(out / "BioClinicalMPBERT", bert_config.vocab_size, config=bert_config)


def _write_chexzero(adapter: Any, out: Path) -> None:
    """``chexzero.pt``: the plain state dict (OpenAI's key names, which open_clip's CLIP shares)."""
    _save(_state(adapter.model), out / "chexzero.pt")


def _write_gloria(adapter: Any, out: Path) -> None:
    model = adapter.model
    _save({"state_dict": _state(model, "gloria."), "epoch": 0, "global_step": 0,
           "pytorch-lightning_version": "1.1.4"}, out / "chexpert_resnet50.ckpt")
    bert_config = model.text_encoder.model.config
    write_tokenizer(out / "Bio_ClinicalBERT", bert_config.vocab_size, config=bert_config, tokenizer_config=False)


WRITERS: dict[str, Callable[[Any, Path], None]] = {
    "clip": _write_clip, "medklip": _write_medklip, "mavl": _write_mavl, "kad": _write_kad,
    "carzero": _write_carzero, "devide": _write_devide, "chexzero": _write_chexzero, "gloria": _write_gloria,
}


# -- command line --------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> dict[str, dict[str, Any]]:
    """``--out DIR --models a,b,... [--seed N]``: write (or reuse) each folder; print and return
    ``{model: {"folder", "bytes", "seconds", "reused"}}``. Names outside :data:`MODELS` are skipped (stderr)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True, help="parent folder; each model goes to OUT/<name>/")
    p.add_argument("--models", default=",".join(MODELS), help="comma-separated model names")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    names = [m.strip() for m in args.models.split(",") if m.strip()]
    skipped = [m for m in names if m not in WRITERS]
    if skipped:
        print(f"skipped (no stand-in weights): {', '.join(skipped)}", file=sys.stderr)
    result: dict[str, dict[str, Any]] = {}
    for name in names:
        if name in skipped:
            continue
        reused = is_complete(args.out / name, name, args.seed)
        started = time.perf_counter()
        target = write_weight_folders([name], args.out, seed=args.seed)[name]
        result[name] = {"folder": str(target), "bytes": folder_bytes(target),
                        "seconds": round(time.perf_counter() - started, 2), "reused": reused}
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
