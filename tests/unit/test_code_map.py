"""docs/code.md's table names every module of the package once: each row's first cell is one
module (`train/loop.py`) and no module is described in two places (a subpackage's row beside
its modules' rows, or two rows for one file), so a newcomer reads each job in one place."""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

from helpers import REPO

PACKAGE = REPO / "attn_mt"
ROW = re.compile(r"^\| `([^`]+)` \|", re.MULTILINE)


def described(page: str) -> list[str]:
    """The first cell of every table row of `page` (a module path as the row names it)."""
    return ROW.findall(page)


def modules() -> set[str]:
    """Every module of the package, as code.md names it (relative to attn_mt/); a subpackage's
    `__init__.py` that holds no more than its docstring is no module of its own."""
    return {
        path.relative_to(PACKAGE).as_posix()
        for path in PACKAGE.rglob("*.py")
        if path.parent == PACKAGE or path.name != "__init__.py" or not _only_docstring(path)
    }


def _only_docstring(path: Path) -> bool:
    body = ast.parse(path.read_text(encoding="utf-8")).body
    return all(isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) for n in body)


def test_every_module_has_one_row() -> None:
    rows = described((REPO / "docs" / "code.md").read_text(encoding="utf-8"))
    package_rows = [r for r in rows if not r.startswith(("bench/", "scripts/"))]
    twice = [name for name, n in Counter(package_rows).items() if n > 1]
    assert not twice, f"described twice in docs/code.md: {twice}"
    folders = [r for r in package_rows if r.endswith("/")]
    assert not folders, f"a subpackage's row beside its modules' rows: {folders}"
    assert set(package_rows) == modules(), (
        f"no row: {sorted(modules() - set(package_rows))}; "
        f"no such module: {sorted(set(package_rows) - modules())}"
    )


def test_the_check_finds_a_module_described_twice() -> None:
    page = "| `train/loop.py` | the loop |\n| `serve/` | all of it |\n| `train/loop.py` | again |\n"
    rows = described(page)
    assert [n for n, c in Counter(rows).items() if c > 1] == ["train/loop.py"]
    assert [r for r in rows if r.endswith("/")] == ["serve/"]
