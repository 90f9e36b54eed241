"""The package's parts depend one way. Every top-level module and subpackage has a place in
LAYERS, low to high, and imports only parts below it (at any depth: a function's lazy import
counts too); no module imports itself round a cycle; a subpackage's `__init__` imports nothing
(an eager one would make the parts' imports of each other circular)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import attn_mt

PACKAGE = Path(attn_mt.__file__).parent
# Low to high: a part may import only the parts before it.
LAYERS = [
    "errors",
    "world",  # who this process is, without torch
    "cpuenv",  # the environment torch's CPU libraries read once, without torch
    "comet",  # COMET as a sacreBLEU metric (optional: unbabel-comet)
    "scores",  # sacreBLEU's metrics, named before they load: the config names them
    "fileio",
    "paths",  # the paths a command is given, checked before torch loads
    "config",  # the schema, how keys are declared and checked, reading a file
    "runfolder",  # one training process per run folder, checked before torch loads
    "precision",
    "kernels",  # the MKL-vs-oneDNN timing rule
    "langid",  # py3langid: the off-target rate
    "distributed",
    "text",  # text as people write it: casing, spans, normalisation (pure rules; prepare uses them)
    "model",
    "data",
    "checkpoint",
    "decode",
    "documents",  # sentences, paragraphs, markup
    "export",  # CTranslate2 and transformers exports, the Marian import
    "jobs",  # a file translated as `translate` does it: in parts, resumable; n-best formats
    "viz",
    "evaluate",
    "evaluate_variants",  # the test set as people type it, scored per variant
    "compare",  # systems against a baseline: sacreBLEU's paired tests
    "train",
    "distill",  # a student's corpus from its teacher's n-best, its translation and training
    "serve",
    "cli",
    "__main__",
]
# Subpackages whose __init__ must import nothing; cli's registers the commands on its app, and
# nothing in the package imports cli.
SUBPACKAGES = sorted(
    p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists() and p.name != "cli"
)


def module_name(path: Path) -> str:
    """attn_mt/train/loop.py -> attn_mt.train.loop; a package's __init__ is the package."""
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in PACKAGE.rglob("*.py")}


def imported_modules(path: Path) -> set[str]:
    """The attn_mt modules `path` imports, at any depth (lazy and TYPE_CHECKING ones too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("attn_mt"):
            names = {f"{node.module}.{alias.name}" for alias in node.names}
            modules = names & MODULES.keys()  # `from attn_mt.train import loop`
            found |= modules or {node.module}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("attn_mt.")}
    return {name for name in found if name in MODULES and name != "attn_mt"}


def part(module: str) -> str:
    """The top-level module or subpackage a module belongs to."""
    return module.split(".")[1]


def test_every_part_has_a_layer() -> None:
    parts = {part(name) for name in MODULES if name != "attn_mt"}
    assert parts == set(LAYERS), (
        f"add to LAYERS: {parts - set(LAYERS)}; gone: {set(LAYERS) - parts}"
    )


@pytest.mark.parametrize("layer", LAYERS)
def test_parts_import_only_lower_layers(layer: str) -> None:
    allowed = set(LAYERS[: LAYERS.index(layer) + 1])
    wrong = {
        f"{name} imports {sorted(imported)}"
        for name, path in MODULES.items()
        if name != "attn_mt" and part(name) == layer
        if (imported := {part(m) for m in imported_modules(path)} - allowed)
    }
    assert not wrong


def test_no_module_imports_itself_round_a_cycle() -> None:
    graph = {name: imported_modules(path) - {name} for name, path in MODULES.items()}
    cycles = strongly_connected(graph)
    assert not [sorted(c) for c in cycles if len(c) > 1]


def strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's strongly connected components of a directed graph."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    components: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = set()
            while (top := stack.pop()) != node:
                component.add(top)
            components.append(component | {node})

    for node in graph:
        if node not in index:
            visit(node)
    return components


def test_the_cycle_check_finds_a_cycle() -> None:
    found = strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}})
    assert {"a", "b", "c"} in found and {"d"} in found


@pytest.mark.parametrize("package", SUBPACKAGES)
def test_subpackage_init_imports_nothing(package: str) -> None:
    tree = ast.parse((PACKAGE / package / "__init__.py").read_text(encoding="utf-8"))
    assert not [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
