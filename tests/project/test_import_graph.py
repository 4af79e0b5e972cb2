"""The package's import graph has no cycle (imports inside functions count too; ``TYPE_CHECKING`` blocks do not)."""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "xbench"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_package(name: str) -> bool:
    return (PACKAGE.parent / Path(*name.split(".")) / "__init__.py").exists()


def _exists(name: str) -> bool:
    base = PACKAGE.parent / Path(*name.split("."))
    return base.with_suffix(".py").exists() or (base / "__init__.py").exists()


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                skip.update(id(n) for n in ast.walk(child))
    return skip


def import_graph() -> dict[str, set[str]]:
    """Module → the xbench modules it imports (a package import points at its ``__init__``)."""
    graph: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = _module_name(path)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skip = _type_checking_nodes(tree)
        edges: set[str] = set()
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.Import):
                edges.update(a.name for a in node.names if a.name.split(".")[0] == "xbench")
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[: len(base) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                if target.split(".")[0] != "xbench":
                    continue
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    edges.add(sub if _exists(sub) else target)
        graph[name] = {e for e in edges if e != name and _exists(e)}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_import_graph_has_no_cycle():
    found = cycles(import_graph())
    assert not found, "import cycles: " + "; ".join(" ↔ ".join(c) for c in found)


def test_the_check_sees_a_cycle():
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]


# The stages of the pipeline, lowest first. A module may import its own folder and any folder of a LOWER rank;
# folders that share a rank are independent of each other (datasets, models, metrics and the paper's numbers
# never import one another). The top-level modules (the public face, the command line, the notebook session)
# sit above everything. docs/layout.md describes the same order.
LAYERS: dict[str, int] = {
    "core": 0,          # errors, atomic writer, logging
    "spec": 1,          # schema, registry, findings, manifests, run configs
    "datasets": 2, "models": 2, "metrics": 2, "paper": 2,
    "store": 3, "explain": 3,  # results store, fingerprints; post-hoc explainers over any adapter
    "preflight": 3,     # what a run needs, checked before any model is built (inference and evaluation ask it)
    "inference": 4,     # input feed, precision, runner
    "evaluation": 5,    # metric tables of a run
    "outputs": 6,       # tables, figures, analyses, exports, report
    "workflows": 7,     # run = inference + evaluation, score, reproduce, training the reference models
}
TOP = {"xbench", "xbench.cli", "xbench.session"}


def stage(module: str) -> str | None:
    """The stage folder of an ``xbench`` module (None for the top-level modules)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in LAYERS) else None


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Imports that run up the stages, or sideways between two folders of one rank, or from a stage to the top."""
    bad = []
    for a, targets in sorted(graph.items()):
        sa = stage(a)
        for b in sorted(targets):
            sb = stage(b)
            if sa is None or sa == sb:
                continue  # the top may import anything; a folder may import itself
            if sb is None or LAYERS[sb] > LAYERS[sa] or (LAYERS[sb] == LAYERS[sa]):
                bad.append(f"{a} → {b}")
    return bad


def test_every_import_runs_downhill():
    bad = upward_imports(import_graph())
    assert not bad, "imports that run up the pipeline's stages:\n  " + "\n  ".join(bad)


def test_every_module_lives_in_a_stage_folder_or_is_the_top():
    modules = set(import_graph())
    loose = sorted(m for m in modules if stage(m) is None and m not in TOP)
    assert not loose, f"modules outside the stage folders (add them to a stage, or to TOP with a reason): {loose}"
    folders = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert folders == set(LAYERS), f"stage folders {sorted(folders)} differ from LAYERS {sorted(LAYERS)}"


def test_the_layer_check_sees_an_upward_import():
    graph = {"xbench.store.results": {"xbench.evaluation.evaluate", "xbench.core.errors"},
             "xbench.datasets.base": {"xbench.models.base"},
             "xbench.inference.runner": {"xbench"},
             "xbench.cli": {"xbench.workflows.run"}}
    assert upward_imports(graph) == ["xbench.datasets.base → xbench.models.base",
                                     "xbench.inference.runner → xbench",
                                     "xbench.store.results → xbench.evaluation.evaluate"]


def test_evaluation_imports_nothing_from_inference():
    """Metric tables are computed from the store alone: evaluation asks preflight (below both) which models run."""
    graph = import_graph()
    found = sorted(f"{a} → {b}" for a, targets in graph.items() if stage(a) == "evaluation"
                   for b in targets if stage(b) == "inference")
    assert not found, "evaluation imports inference:\n  " + "\n  ".join(found)
