"""The README cannot drift from the code: its config table and the commands it shows."""

from __future__ import annotations

import re
import sys

import pytest
from helpers import REPO

from attn_mt.cli import app
from attn_mt.config import config_keys

sys.path.insert(0, str(REPO / "scripts"))

import config_table  # noqa: E402

README = (REPO / "README.md").read_text(encoding="utf-8")


def test_config_table_is_the_generated_one() -> None:
    assert config_table.with_table(README) == README, (
        "README.md's config table is stale: run `python scripts/config_table.py --write`"
    )


def test_config_table_lists_every_key_once() -> None:
    block = README.split(config_table.START)[1].split(config_table.END)[0]
    listed = re.findall(r"^\| `([a-z0-9_.]+)` \|", block, flags=re.M)
    assert listed == [path for path, *_ in config_keys()]


def test_every_key_has_a_meaning() -> None:
    assert [path for path, _, _, meaning in config_keys() if not meaning.strip()] == []


COMMANDS = sorted(
    {c.name or c.callback.__name__ for c in app.registered_commands}
    | {g.name for g in app.registered_groups}
)


@pytest.mark.parametrize("command", COMMANDS, ids=str)
def test_every_command_is_shown(command: str) -> None:
    assert re.search(rf"attn-mt {command}\b", README), f"README never shows `attn-mt {command}`"
