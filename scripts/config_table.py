"""The table of every config key in docs/config.md, generated from the config dataclasses.

    python scripts/config_table.py            # print the table
    python scripts/config_table.py --write    # replace it in docs/config.md (between the markers)

tests/e2e/test_readme.py fails when docs/config.md and the dataclasses disagree.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from attn_mt.config.schema import config_keys  # noqa: E402

CONFIG_DOC = Path(__file__).resolve().parents[1] / "docs" / "config.md"
START, END = "<!-- config-keys:start -->", "<!-- config-keys:end -->"


def table() -> str:
    """Markdown rows: key, type, default, meaning."""
    lines = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for path, kind, default, meaning in config_keys():
        kind = kind.replace("|", "\\|")
        meaning = meaning.replace("<", "&lt;").replace(">", "&gt;")
        lines.append(f"| `{path}` | {kind} | `{_yaml(default)}` | {meaning} |")
    return "\n".join(lines)


def _yaml(value: object) -> str:
    """A default as it is written in YAML."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def with_table(text: str) -> str:
    """`text` (docs/config.md) with the block between the markers replaced by the current table."""
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{table()}\n{END}{tail}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="update docs/config.md in place")
    if parser.parse_args().write:
        CONFIG_DOC.write_text(with_table(CONFIG_DOC.read_text(encoding="utf-8")), encoding="utf-8")
    else:
        print(table())


if __name__ == "__main__":
    main()
