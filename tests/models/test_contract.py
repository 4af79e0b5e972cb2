"""The adapter contract, checked for EVERY registered model (``xbench.list_models()``).

Each model is built the way a user without official weights can build it: random init (the full-size
network), the committed reference weights, a fitted-prior file, or BiomedCLIP's folder without a
checkpoint. Then ``preprocess`` of a real-size image, ``predict`` on a tiny batch, and the facts the YAML
states: input size, map grid, score range of the score rule, name / map source / verified / citation.
Adapter-specific behaviour (official rules, parity with the official code) stays in the per-model tests.
"""
from __future__ import annotations

import ast
import re
import warnings

import numpy as np
import pytest
import torch
from biomedclip_folder import write_folder

from xbench.core.errors import XBenchWarning
from xbench.models import Adapter, list_models
from xbench.models.priors import AnatomicalPrior
from xbench.spec.registry import import_target, model_config

PROMPTS = ["cardiomegaly", "pleural effusion"]  # known to every model (entities, phantom vocabulary, open vocabulary)
REAL_SIZE = (1024, 1024)  # NIH ChestX-ray14 PNGs
WIDE = (300, 420)  # a non-square image: preprocess must still give the square model input
LABELS = {"official", "random-init", "xbench-reference", "user-checkpoint", "none"}


def test_every_registered_model_is_covered():
    assert set(list_models()) >= {"clip", "biomedclip", "medklip", "kad", "kad_512", "kad_1024", "mavl", "carzero",
                                  "devide", "center_prior", "anatomical_prior", "random_prior", "ref_patchsim",
                                  "ref_xattn"}


def planted(name: str) -> dict:
    """The YAML of ``name`` with other values for the facts that no network fixes (citation, verified, map source,
    publisher of the first weight file): an adapter that restates or overwrites one reports the wrong value."""
    cfg = model_config(name)
    weights = {k: dict(v) for k, v in (cfg.get("weights") or {}).items()}
    if weights:
        first = next(iter(weights))
        weights[first]["source"] = f"planted publisher of {name}"
    other = {"similarity": "cross-attention", "cross-attention": "prior", "prior": "similarity"}
    return {**cfg, "citation": f"planted citation of {name}", "verified": not cfg.get("verified", True),
            "map_source": other[cfg["map_source"]], "weights": weights}


def _build(name: str, folder) -> Adapter:
    """Built through the one builder from the :func:`planted` YAML, the way a user without official weights can."""
    cfg = planted(name)
    cls = import_target(cfg["class"])
    if cfg.get("bundled_weights") or not cfg.get("weights"):
        return cls.from_config(cfg, None)  # committed weights / no files
    if name == "anatomical_prior":
        h, w = cfg["grid"]
        maps = {p: np.random.default_rng(i).random((h, w)).astype(np.float32) for i, p in enumerate(PROMPTS)}
        AnatomicalPrior(maps, {p: 0.25 for p in PROMPTS}).save(folder)
        return cls.from_config(cfg, folder)
    random = {**cfg, "params": {**cfg.get("params", {}), "random_init": True}}
    if name == "biomedclip":  # random init still reads the folder's config and tokenizer
        return cls.from_config(random, write_folder(folder))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", XBenchWarning)  # DeViDe says it is unverified
        return cls.from_config(random, None)


@pytest.fixture(scope="module", params=list_models())
def built(request, tmp_path_factory):
    torch.set_num_threads(1)
    name = request.param
    return name, _build(name, tmp_path_factory.mktemp(name))


def test_contract(built):
    name, adapter = built
    cfg = model_config(name)
    # facts come from the YAML, whatever it says (planted values included): nothing restates or overwrites them
    plant = planted(name)
    assert (adapter.name, adapter.map_source, adapter.score_rule) == (name, plant["map_source"], cfg["score_rule"])
    assert adapter.verified == plant["verified"] and adapter.citation == plant["citation"]
    assert adapter.weights_source == (f"planted publisher of {name}" if cfg.get("weights") else None)
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


# -- model facts live in the YAML only ------------------------------------------------------------------------------
FACTS = ("name", "map_source", "score_rule", "input_size", "grid", "verified", "citation", "weights_source")
SIZE_NAMES = re.compile(r"size|crop|resolution|grid|side|spatial", re.IGNORECASE)


def _docstrings(tree) -> set[int]:
    """ids of the docstring nodes of a module, its classes and functions."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                out.add(id(first.value))
    return out


def _literal(node):
    try:
        value = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None
    return tuple(value) if isinstance(value, list) else value


def restated_facts(source: str, configs: list[dict], filename: str = "<adapter>") -> list[str]:
    """Where ``source`` (an adapter module) restates or overwrites a fact of one of ``configs`` (its YAMLs).

    Flags (1) ``self.<fact> = ...`` and class-level ``<fact> = ...`` (facts are set by ``Adapter.__init__`` from the
    YAML only; adapters check them with ``check_fact``); (2) a module- or class-level constant, or a parameter
    default, whose name speaks of a size / grid / crop and whose literal value is a YAML's ``input_size``, ``grid``
    or grid side (``INPUT_SIZE = 224``, ``CROP = 224``, ``grid=(14, 14)``); (3) any string literal outside
    docstrings equal to a YAML's title, citation, paper display name or group, or weight-file path.
    """
    tree = ast.parse(source)
    docs = _docstrings(tree)
    sizes = {c["input_size"] for c in configs} | {side for c in configs for side in c["grid"]}
    grids = {tuple(c["grid"]) for c in configs}
    words = ({c.get("title") for c in configs} | {c.get("citation") for c in configs}
             | {(c.get("paper") or {}).get(k) for c in configs for k in ("name", "group")}
             | {str(e.get("path")) for c in configs for e in (c.get("weights") or {}).values()}) - {None, ""}
    found = []

    def size_literal(name: str, value_node) -> None:
        value = _literal(value_node)
        if SIZE_NAMES.search(name) and (value in grids or (type(value) is int and value in sizes)):
            found.append(f"{filename}:{value_node.lineno}: {name} = {value!r} restates a YAML fact")

    for node in ast.walk(tree):
        targets = (node.targets if isinstance(node, ast.Assign) else [node.target]
                   if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else [])
        for t in targets:
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self" and t.attr in FACTS:
                found.append(f"{filename}:{t.lineno}: self.{t.attr} is assigned (overwrites the YAML fact)")
        if isinstance(node, (ast.Module, ast.ClassDef)):
            for stmt in node.body:
                if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None:
                    for t in (stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]):
                        if isinstance(t, ast.Name):
                            if isinstance(node, ast.ClassDef) and t.id in FACTS:
                                found.append(f"{filename}:{t.lineno}: class attribute {t.id} restates a YAML fact")
                            size_literal(t.id, stmt.value)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            positional = args.posonlyargs + args.args
            for arg, default in zip(positional[len(positional) - len(args.defaults):], args.defaults):
                size_literal(arg.arg, default)
            for arg, default in zip(args.kwonlyargs, args.kw_defaults):
                if default is not None:
                    size_literal(arg.arg, default)
        if (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
                and node.value in words):
            found.append(f"{filename}:{node.lineno}: literal {node.value!r} restates a YAML fact")
    return found


def _adapter_modules() -> dict[str, list[dict]]:
    """Adapter module file → the registered YAMLs whose class it holds."""
    import importlib

    modules: dict[str, list[dict]] = {}
    for name in list_models():
        cfg = model_config(name)
        module = importlib.import_module(cfg["class"].partition(":")[0])
        modules.setdefault(module.__file__, []).append(cfg)
    return modules


def test_no_adapter_restates_or_overwrites_a_yaml_fact():
    from pathlib import Path

    found = [hit for path, configs in _adapter_modules().items()
             for hit in restated_facts(Path(path).read_text(), configs, Path(path).name)]
    assert not found, "\n".join(found)


def test_the_fact_scan_finds_planted_restatements():
    """The scan above can fail: each kind of restatement planted into a real adapter's source is reported."""
    from pathlib import Path

    path, configs = next((p, c) for p, c in _adapter_modules().items() if Path(p).name == "medklip.py")
    source = Path(path).read_text()
    assert restated_facts(source, configs) == []
    plants = {
        "INPUT_SIZE = 224\n": "INPUT_SIZE = 224",
        "GRID = (14, 14)\n": "GRID = (14, 14)",
        "def crop(image, size=224):\n    return image\n": "size = 224",
        'TITLE = "MedKLIP"\n': "'MedKLIP'",
        "class Bad:\n    def __init__(self):\n        self.grid = (16, 16)\n": "self.grid is assigned",
        "class Worse:\n    citation = 'x'\n": "class attribute citation",
    }
    for plant, expected in plants.items():
        hits = restated_facts(source + "\n" + plant, configs)
        assert len(hits) == 1 and expected in hits[0], (plant, hits)


def test_a_network_that_disagrees_with_its_yaml_is_a_clear_error():
    """Shape facts the network fixes are checked, never overwritten: a YAML grid the network cannot give fails."""
    from xbench.core.errors import CheckpointError, FormatError

    for name, error in (("ref_patchsim", FormatError), ("ref_xattn", CheckpointError)):
        cfg = {**model_config(name), "grid": [8, 8]}
        with pytest.raises(error, match="grid" if error is FormatError else "positions"):
            import_target(cfg["class"]).from_config(cfg, None)


def test_a_partial_config_gets_the_facts_of_the_yaml_it_agrees_with():
    """KAD-224/512/1024 share one class: a partial config takes the facts of the YAML whose values it agrees with."""
    from xbench.core.errors import XBenchError
    from xbench.models.base import with_yaml_facts

    assert with_yaml_facts("kad", {"input_size": 512, "params": {"trunk": "layer4"}})["grid"] == [16, 16]
    assert with_yaml_facts("kad", {"params": {"trunk": "layer3"}})["name"] == "kad"
    with pytest.raises(XBenchError, match="kad_1024, kad_512"):  # layer4 alone: KAD-512 or KAD-1024?
        with_yaml_facts("kad", {"params": {"trunk": "layer4"}})
    unmatched = with_yaml_facts("kad", {"input_size": 300})  # none agrees: the class's own YAML, overridden
    assert (unmatched["name"], unmatched["input_size"], unmatched["grid"]) == ("kad", 300, [14, 14])


def test_one_in_memory_constructor_name():
    """Every adapter class builds from a loaded checkpoint through ``from_checkpoint``; no other ``from_*`` spelling
    (``from_official_checkpoint`` lives on only as base.py's deprecated alias)."""
    import inspect

    for path in {c["class"] for c in map(model_config, list_models())}:
        cls = import_target(path)
        own = {n for klass in cls.__mro__ if klass is not Adapter and klass is not object for n in vars(klass)}
        assert {n for n in own if n.startswith("from_")} <= {"from_checkpoint"}, (cls, own)
        if cls.from_checkpoint.__func__ is not Adapter.from_checkpoint.__func__:
            assert "checkpoint" in inspect.signature(cls.from_checkpoint).parameters
