"""The package's stages depend one way: model <- data <- train, and decode beside train; no
stage imports the command line, and a subpackage's `__init__` imports nothing (an eager one
would make the stages' imports of each other circular)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import attn_mt

PACKAGE = Path(attn_mt.__file__).parent
# stage -> the stages it must never import
FORBIDDEN = {
    "model": {"data", "train", "decode", "cli"},
    "data": {"train", "decode", "cli"},
    "decode": {"train", "cli"},
    "train": {"cli"},
}


def imported_stages(path: Path) -> set[str]:
    """The attn_mt subpackages (or top-level modules) a module imports, at any depth."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("attn_mt"):
            parts = node.module.split(".")
            found |= {parts[1]} if len(parts) > 1 else {a.name for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[1] for a in node.names if a.name.startswith("attn_mt.")}
    return found


@pytest.mark.parametrize("stage", sorted(FORBIDDEN))
def test_stages_import_one_way(stage: str) -> None:
    wrong = {
        f"{path.relative_to(PACKAGE)} imports {sorted(imported_stages(path) & FORBIDDEN[stage])}"
        for path in (PACKAGE / stage).glob("*.py")
        if imported_stages(path) & FORBIDDEN[stage]
    }
    assert not wrong


@pytest.mark.parametrize("stage", sorted(FORBIDDEN))
def test_subpackage_init_imports_nothing(stage: str) -> None:
    tree = ast.parse((PACKAGE / stage / "__init__.py").read_text(encoding="utf-8"))
    assert not [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
