"""The adapter contract, checked for EVERY registered model (``xbench.list_models()``).

Each model is built the way a user without official weights can build it: random init (the full-size
network), the committed reference weights, a fitted-prior file, or BiomedCLIP's folder without a
checkpoint. Then ``preprocess`` of a real-size image, ``predict`` on a tiny batch, and the facts the YAML
states: input size, map grid, score range of the score rule, name / map source / verified / citation.
Adapter-specific behaviour (official rules, parity with the official code) stays in the per-model tests.
"""
from __future__ import annotations

import re
import warnings

import numpy as np
import pytest
import torch
from biomedclip_folder import write_folder

from xbench.errors import XBenchWarning
from xbench.models import Adapter, create_model, list_models
from xbench.models.priors import AnatomicalPrior
from xbench.registry import model_config

PROMPTS = ["cardiomegaly", "pleural effusion"]  # known to every model (entities, phantom vocabulary, open vocabulary)
REAL_SIZE = (1024, 1024)  # NIH ChestX-ray14 PNGs
WIDE = (300, 420)  # a non-square image: preprocess must still give the square model input
LABELS = {"official", "random-init", "xbench-reference", "user-checkpoint", "none"}


def test_every_registered_model_is_covered():
    assert set(list_models()) >= {"clip", "biomedclip", "medklip", "kad", "kad_512", "kad_1024", "mavl", "carzero",
                                  "devide", "center_prior", "anatomical_prior", "random_prior", "ref_patchsim",
                                  "ref_xattn"}


def _build(name: str, folder) -> Adapter:
    cfg = model_config(name)
    if cfg.get("bundled_weights") or not cfg.get("weights"):
        return create_model(name)  # committed weights / no files
    if name == "anatomical_prior":
        h, w = cfg["grid"]
        maps = {p: np.random.default_rng(i).random((h, w)).astype(np.float32) for i, p in enumerate(PROMPTS)}
        AnatomicalPrior(maps, {p: 0.25 for p in PROMPTS}).save(folder)
        return create_model(name, weights=folder)
    if name == "biomedclip":  # random init still reads the folder's config and tokenizer
        return create_model(name, weights=write_folder(folder), random_init=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", XBenchWarning)  # DeViDe says it is unverified
        return create_model(name, random_init=True)


@pytest.fixture(scope="module", params=list_models())
def built(request, tmp_path_factory):
    torch.set_num_threads(1)
    name = request.param
    return name, _build(name, tmp_path_factory.mktemp(name))


def test_contract(built):
    name, adapter = built
    cfg = model_config(name)
    # facts come from the YAML
    assert (adapter.name, adapter.map_source, adapter.score_rule) == (name, cfg["map_source"], cfg["score_rule"])
    assert adapter.verified == cfg.get("verified", True) and adapter.citation == cfg["citation"]
    assert adapter.input_size == cfg["input_size"] and adapter.grid == tuple(cfg["grid"])
    assert adapter.weights_label in LABELS
    row = adapter.describe()
    assert row["model"] == name and row["grid"] == "{}x{}".format(*cfg["grid"])

    # preprocess: a real-size and a non-square image -> (3, S, S) float32, finite
    rng = np.random.default_rng(0)
    images = [rng.random(REAL_SIZE, dtype=np.float32), rng.random(WIDE, dtype=np.float32)]
    pixels = torch.stack([adapter.preprocess(im) for im in images])
    size = cfg["input_size"]
    assert pixels.shape == (2, 3, size, size) and pixels.dtype == torch.float32 and torch.isfinite(pixels).all()

    # predict: scores (B, C), maps (B, C, *grid), float32, finite, score range of the rule
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", XBenchWarning)
        pred = adapter.predict(pixels, PROMPTS)
    assert pred.scores.shape == (2, len(PROMPTS)) and pred.maps.shape == (2, len(PROMPTS), *cfg["grid"])
    assert pred.scores.dtype == torch.float32 and pred.maps.dtype == torch.float32
    assert torch.isfinite(pred.scores).all() and torch.isfinite(pred.maps).all()
    probs = adapter.to_probability(pred.scores)
    assert ((probs >= 0) & (probs <= 1)).all()
    if cfg["score_rule"] == "logit":
        assert np.allclose(probs, 1 / (1 + np.exp(-pred.scores.numpy().astype(np.float64))))
    else:  # probability, constant, random: already in [0, 1]
        assert ((pred.scores >= 0) & (pred.scores <= 1)).all()
        np.testing.assert_array_equal(probs, pred.scores.numpy().astype(np.float64))
    if cfg["score_rule"] == "constant":
        assert torch.equal(pred.scores[0], pred.scores[1])

    with pytest.raises(ValueError):  # checked before any forward pass
        adapter.predict(pixels, [])
    if cfg["map_source"] != "prior":  # priors take any input size; models name the expected and received shapes
        wrong = torch.zeros(1, 3, size + 32, size + 32)
        with pytest.raises(ValueError, match=re.escape(f"(B, 3, {size}, {size})")) as err:
            adapter.predict(wrong, PROMPTS)
        assert str(tuple(wrong.shape)) in str(err.value)


def test_from_config_is_the_one_builder():
    with pytest.raises(TypeError, match="_load / _random"):
        type("Bad", (Adapter,), {"from_config": classmethod(lambda cls, *a: None)})


def test_shared_helpers_are_defined_once():
    """The helpers of models/_common.py have no copies in the package (issue 10: seeded_build twice, the crc32
    stand-in tokenizer three times, resize_uint8 twice), and no adapter writes the facts its YAML holds."""
    import ast
    from pathlib import Path

    import xbench

    helpers = {"seeded_build", "HashWordTokenizer", "to_uint8", "resize_uint8", "normalize_uint8", "check_inputs",
               "PromptCache"}
    facts = {"name", "map_source", "score_rule", "input_size", "grid", "verified", "citation"}
    defined: dict[str, list[str]] = {}
    for path in Path(xbench.__file__).parent.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in helpers:
                defined.setdefault(node.name, []).append(path.name)
            is_class = isinstance(node, ast.ClassDef)
            methods = {f.name for f in node.body if isinstance(f, ast.FunctionDef)} if is_class else set()
            if is_class and path.parent.name == "models" and methods & {"predict", "_load", "_random"}:
                written = {t.id for stmt in node.body if isinstance(stmt, (ast.Assign, ast.AnnAssign))
                           for t in (stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target])
                           if isinstance(t, ast.Name)} & facts
                assert path.name == "base.py" or not written, f"{path.name}:{node.name} writes YAML facts {written}"
    home = {h: ["inputs.py" if h == "to_uint8" else "_common.py"] for h in helpers}  # _common re-exports to_uint8
    assert defined == home, defined
