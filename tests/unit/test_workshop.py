"""The workshop (bench/ and scripts/) uses attn-mt as any user would: no module there imports a
name of `attn_mt` or `bench` that starts with `_` (nor reaches one through a module it
imported), none imports a script of scripts/ or puts that folder on the path (the shared code
is bench/'s, the scripts are its entry points), and each keeps the structure bar: a module of
at most 400 lines, a function body of at most 60."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from helpers import REPO

OWN = ("attn_mt", "bench")  # packages whose private names stay private
SCRIPTS = {path.stem for path in (REPO / "scripts").glob("*.py")}
FILES = sorted([*(REPO / "bench").glob("*.py"), *(REPO / "scripts").glob("*.py")])
MODULE_LINES, BODY_LINES = 400, 60
PATH_CALLS = ("sys.path.insert", "sys.path.append")


def private(name: str) -> bool:
    """`_x`, not a dunder such as `__version__`."""
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def ours(module: str) -> bool:
    return module.split(".")[0] in OWN


def trespasses(source: str) -> list[str]:
    """What `source` (a module's text) imports or reaches that it should not: private names of
    attn_mt or bench, script modules, the scripts folder put on sys.path."""
    found, modules = [], set()  # `modules`: names bound to a module of ours
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in SCRIPTS:
                    found.append(f"imports the script {alias.name}")
                elif ours(alias.name):
                    if any(private(part) for part in alias.name.split(".")):
                        found.append(f"imports {alias.name}")
                    modules.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] in SCRIPTS:
                found.append(f"imports the script {node.module}")
            elif ours(node.module):
                for alias in node.names:
                    if any(private(part) for part in [*node.module.split("."), alias.name]):
                        found.append(f"imports {alias.name} from {node.module}")
                    modules.add(alias.asname or alias.name)  # a module, or a name: both checked
        elif (
            isinstance(node, ast.Call)
            and ast.unparse(node.func) in PATH_CALLS
            and "scripts" in " ".join(map(ast.unparse, node.args))
        ):
            found.append(f"puts the scripts folder on the path: {ast.unparse(node)}")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and private(node.attr):
            root = node.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in modules:
                found.append(f"reaches {ast.unparse(node)}")
    return found


def long_parts(source: str) -> list[str]:
    """The module if over MODULE_LINES lines; each function whose body (its docstring left
    out) is over BODY_LINES lines."""
    tree = ast.parse(source)
    found = [f"{len(source.splitlines())} lines"] if len(source.splitlines()) > MODULE_LINES else []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                body = body[1:] or body
            lines = (node.end_lineno or 0) - body[0].lineno + 1
            if lines > BODY_LINES:
                found.append(f"{node.name}: a body of {lines} lines")
    return found


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_the_workshop_imports_only_public_names_and_no_script(path: Path) -> None:
    assert not trespasses(path.read_text(encoding="utf-8"))


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_the_workshop_keeps_the_structure_bar(path: Path) -> None:
    assert not long_parts(path.read_text(encoding="utf-8"))


def test_the_checks_find_what_they_look_for() -> None:
    source = "\n".join([
        "import sys",
        "from attn_mt.train.loop import Trainer, _helper",
        "from attn_mt.train import loop",
        "import attn_mt.train._private",
        "from bench.common import _status",
        "import bench_train",
        "from profile_step import main",
        "sys.path.insert(0, str(ROOT / 'scripts'))",
        "loop._read_now = None",
        "Trainer._secret(1)",
        "x = loop.__name__",
        "def f():",
        *["    pass"] * (BODY_LINES + 1),
    ])  # fmt: skip
    assert trespasses(source) == [
        "imports _helper from attn_mt.train.loop",
        "imports attn_mt.train._private",
        "imports _status from bench.common",
        "imports the script bench_train",
        "imports the script profile_step",
        "puts the scripts folder on the path: sys.path.insert(0, str(ROOT / 'scripts'))",
        "reaches loop._read_now",
        "reaches Trainer._secret",
    ]
    assert long_parts(source) == [f"f: a body of {BODY_LINES + 1} lines"]
    assert long_parts("x = 1\n" * (MODULE_LINES + 1)) == [f"{MODULE_LINES + 1} lines"]
    assert not trespasses("from attn_mt.train.loop import UpdateStep\nimport torch\ntorch._dynamo")
