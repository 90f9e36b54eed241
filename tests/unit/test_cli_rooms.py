"""cli/ is one room per command: each command lives in the module named after it, and a cli
module imports from cli/ only the shared ones (`app`, `options`, `progress`), never another
command's module nor a `_private` name of another cli module; the work they share is the
library's. `cli/__init__` imports every command module (that registers them)."""

from __future__ import annotations

import ast
import keyword
from pathlib import Path

import pytest

import attn_mt

CLI = Path(attn_mt.__file__).parent / "cli"
SHARED = {"app", "options", "progress"}
MODULES = sorted(path.stem for path in CLI.glob("*.py") if path.stem != "__init__")


def reaches(module: str, source: str) -> list[str]:
    """What cli module `module` (its text `source`) takes from other cli modules that is not
    theirs to give: another command's module, or a `_private` name of any other cli module."""
    found: list[str] = []
    aliases: dict[str, str] = {}  # a name bound to a cli module here -> that module

    def take(target: str, name: str | None, line: int) -> None:
        if target == module:
            return
        if target not in SHARED:
            found.append(f"line {line}: imports cli.{target}, another command's module")
        elif name is not None and name.startswith("_"):
            found.append(f"line {line}: imports cli.{target}.{name}, a private name")

    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # `from . import x`, `from .options import y`
                base = "attn_mt.cli" + (f".{base}" if base else "")
            if base == "attn_mt.cli":  # `from attn_mt.cli import progress`: modules
                for alias in node.names:
                    take(alias.name, None, node.lineno)
                    aliases[alias.asname or alias.name] = alias.name
            elif base.startswith("attn_mt.cli."):
                for alias in node.names:
                    take(base.split(".")[2], alias.name, node.lineno)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("attn_mt.cli."):
                    take(alias.name.split(".")[2], None, node.lineno)
    for node in ast.walk(tree):  # `progress._clock`: a private name through its module
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
            and node.attr.startswith("_")
        ):
            take(aliases[node.value.id], node.attr, node.lineno)
    return found


@pytest.mark.parametrize("module", MODULES)
def test_a_cli_module_keeps_to_its_room(module: str) -> None:
    assert reaches(module, (CLI / f"{module}.py").read_text(encoding="utf-8")) == []


def test_the_room_check_finds_reaches() -> None:
    source = """
from attn_mt.cli.app import app, _argument_usage
from attn_mt.cli.decode import load_translator
from attn_mt.cli import progress, train
import attn_mt.cli.evaluate
from .job import run_job

def f():
    from attn_mt.cli.options import decode_settings  # shared: fine
    return progress._clock(1), progress.lines
"""
    assert reaches("translate", source) == [
        "line 2: imports cli.app._argument_usage, a private name",
        "line 3: imports cli.decode, another command's module",
        "line 4: imports cli.train, another command's module",
        "line 5: imports cli.evaluate, another command's module",
        "line 6: imports cli.job, another command's module",
        "line 10: imports cli.progress._clock, a private name",
    ]
    assert reaches("decode", "from attn_mt.cli.decode import _plain") == []  # its own


def test_each_command_lives_in_the_module_named_after_it() -> None:
    from attn_mt.cli.app import app, data_app

    homes = {c.name or c.callback.__name__: c.callback.__module__ for c in app.registered_commands}
    homes |= {f"data {c.name}": c.callback.__module__ for c in data_app.registered_commands}
    wrong = {name: home for name, home in homes.items() if home != f"attn_mt.cli.{module(name)}"}
    assert not wrong and len(homes) == len(MODULES) - len(SHARED) + 1, (wrong, sorted(homes))


def module(command: str) -> str:
    """The module a command lives in: its first word, `-` as `_`, a Python keyword with a
    trailing `_` (`import` -> `import_`, `recase-table` -> `recase_table`)."""
    name = command.split()[0].replace("-", "_")
    return name + "_" if keyword.iskeyword(name) else name
