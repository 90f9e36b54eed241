"""Every code path a docstring, a comment or a doc names exists: `attn_mt.x.y` and `x/y.py`.

A module moved by a reorganisation leaves its old name behind in prose, where nothing imports
it; this test reads the prose. It checks the package's docstrings, comments and string
literals, and README.md and docs/*.md, for
- dotted names starting with `attn_mt.`: an importable module, or an attribute reached from one
  by getattr (a dataclass field counts as an attribute of its class);
- file paths ending in `.py` (`attn_mt/train/loop.py`, `train/loop.py`, `scripts/x.py`, a bare
  `loop.py`): a file of the repository, looked for from the repository root, from `attn_mt/`,
  from the naming file's folder, or, for a bare name, anywhere in attn_mt/, scripts/ or tests/;
  with `::name`, the file defines that function or class.
"""

from __future__ import annotations

import dataclasses
import importlib
import io
import re
import tokenize
from pathlib import Path

from helpers import REPO

PACKAGE = REPO / "attn_mt"
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

DOTTED = re.compile(r"(?<![\w./-])attn_mt(?:\.[A-Za-z_]\w*)+")
PY_PATH = re.compile(r"(?<![\w./-])((?:[\w-]+/)*[A-Za-z_]\w*\.py)((?:::\w+)*)(?![\w/])")

# Files of other projects that the docs name as models (STYLE.md's examples), not ours.
FOREIGN_FILES = {
    "sequence_generator.py",  # fairseq
    "setup.py",
}
SEARCHED_TREES = [PACKAGE, REPO / "scripts", REPO / "tests"]


def prose_of_module(path: Path) -> list[tuple[int, str]]:
    """The (line, text) of each comment and string literal of a Python file."""
    source = path.read_text(encoding="utf-8")
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    return [
        (token.start[0], token.string)
        for token in tokens
        if token.type in (tokenize.COMMENT, tokenize.STRING)
    ]


def prose_of_page(path: Path) -> list[tuple[int, str]]:
    """The (line, text) of each line of a Markdown page."""
    return list(enumerate(path.read_text(encoding="utf-8").splitlines(), start=1))


def prose() -> list[tuple[Path, int, str]]:
    """Every piece of prose this test reads, with its file and first line."""
    pieces = [(p, n, t) for p in sorted(PACKAGE.rglob("*.py")) for n, t in prose_of_module(p)]
    return pieces + [(p, n, t) for p in DOCS for n, t in prose_of_page(p)]


def dotted_name_exists(name: str) -> bool:
    """`attn_mt.a.b.C.d`: the longest importable module prefix, then getattr for the rest."""
    parts = name.split(".")
    for split in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for attr in parts[split:]:
            fields = obj.__dataclass_fields__ if dataclasses.is_dataclass(obj) else {}
            if attr in fields:
                return attr == parts[-1]  # a field's own attributes are not checked
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def defines(path: Path, names: list[str]) -> bool:
    """Whether the file defines the last of `names` as a function or class."""
    if not names:
        return True
    definition = rf"^\s*(?:async\s+)?(?:def|class)\s+{names[-1]}\b"
    return re.search(definition, path.read_text(encoding="utf-8"), re.M) is not None


def py_path_exists(path: str, names: list[str], named_in: Path) -> bool:
    """Whether `path` (with `::names`) is a file of the repository, as the docstring says."""
    if Path(path).name in FOREIGN_FILES:
        return True
    candidates = [REPO / path, PACKAGE / path, named_in.parent / path]
    if "/" not in path:
        candidates += [p for tree in SEARCHED_TREES for p in tree.rglob(path)]
    return any(c.is_file() and defines(c, names) for c in candidates)


def stale_references() -> list[str]:
    """`file:line: name` for each named module, attribute or file that does not exist."""
    stale = []
    for path, line, text in prose():
        for match in [*DOTTED.finditer(text), *PY_PATH.finditer(text)]:
            name = match.group(0)
            if name.startswith("attn_mt."):
                exists = dotted_name_exists(name)
            else:
                file, tail = match.groups()
                exists = py_path_exists(file, tail.split("::")[1:], path)
            if not exists:
                at = line + text.count("\n", 0, match.start())  # a docstring spans lines
                stale.append(f"{path.relative_to(REPO).as_posix()}:{at}: {name}")
    return stale


def test_every_named_module_attribute_and_file_exists() -> None:
    stale = stale_references()
    assert stale == [], "names that no longer exist:\n" + "\n".join(stale)


def test_the_checks_tell_a_stale_name_from_a_real_one() -> None:
    assert dotted_name_exists("attn_mt.train.loop")
    assert dotted_name_exists("attn_mt.load")
    assert dotted_name_exists("attn_mt.config.schema.Config")
    assert not dotted_name_exists("attn_mt.prepare")
    assert not dotted_name_exists("attn_mt.config.schema.NoSuchThing")
    here = PACKAGE / "train" / "loop.py"
    assert py_path_exists("attn_mt/train/loop.py", [], here)
    assert py_path_exists("train/loop.py", [], here)
    assert py_path_exists("loop.py", [], here)
    assert not py_path_exists("cli.py", [], here)
    this_test = "test_the_checks_tell_a_stale_name_from_a_real_one"
    assert py_path_exists("tests/unit/test_docs_paths.py", [this_test], here)
    assert not py_path_exists("tests/unit/test_docs_paths.py", ["no_such_test"], here)
