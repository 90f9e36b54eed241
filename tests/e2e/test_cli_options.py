"""The command line a practitioner expects: short options for the common flags, an example in
every command's help, no Python type names in it, and a progress bar with ETA on a terminal
while the output goes to a file."""

from __future__ import annotations

import os
import pty
import re
import subprocess
from pathlib import Path

import pytest
import typer
from helpers.clirun import CLI, child_env
from helpers.workspace import World
from typer.testing import CliRunner

import attn_mt.cli  # noqa: F401 (registers the commands)
from attn_mt.cli.app import app

SHORT = {"--model": "-m", "--input": "-i", "--output": "-o", "--beam": "-b", "--config": "-c"}


def commands() -> dict[str, typer.core.TyperCommand]:
    """Every command by its words (`data fetch`)."""
    root = typer.main.get_command(app)
    found = {}
    for name, command in root.commands.items():  # type: ignore[attr-defined]
        subcommands = getattr(command, "commands", None)
        for sub, leaf in (subcommands or {None: command}).items():
            found[f"{name} {sub}" if sub else name] = leaf
    return found


@pytest.mark.parametrize("name", sorted(commands()))
def test_every_command_has_the_short_options(name: str) -> None:
    for param in commands()[name].params:
        for long, short in SHORT.items():
            if long in param.opts:
                assert short in param.opts, f"{name} {long}: no {short}"


@pytest.mark.parametrize("name", sorted(commands()))
def test_help_shows_an_example_and_no_type_names(name: str) -> None:
    result = CliRunner().invoke(app, [*name.split(), "--help"], terminal_width=100)
    assert result.exit_code == 0, result.output
    assert re.search(r"^\s*Example: attn-mt " + name, result.output, re.M), result.output
    leaked = re.findall(r"<[a-z][^>]*>|\{[A-Za-z_]+\}|list\[", result.output)
    assert not leaked, f"{name} --help shows {leaked}"


def test_short_options_work_together(world: World, tmp_path: Path) -> None:
    source = tmp_path / "in.txt"
    source.write_text("1 2 3\n4 5\n")
    out = tmp_path / "out.txt"
    model = world.run / "checkpoints" / "best.pt"
    args = ["translate", "-m", model, "-i", source, "-o", out, "-b", "2", "--device", "cpu"]
    result = subprocess.run([*CLI, *map(str, args)], capture_output=True, env=child_env())
    assert result.returncode == 0, result.stderr.decode()
    assert len(out.read_text().splitlines()) == 2


@pytest.mark.parametrize("command", ["translate", "evaluate"])
def test_a_progress_bar_with_eta_on_a_terminal(world: World, tmp_path: Path, command: str) -> None:
    """stderr a terminal (a pty), stdin a file redirected in, the output a file: a bar."""
    source = tmp_path / "in.txt"
    source.write_text("".join(f"{i} {i + 1} {i + 2}\n" for i in range(40)))
    model = world.run / "checkpoints" / "best.pt"
    if command == "translate":
        args = ["translate", "-m", model, "-o", tmp_path / "out.txt"]  # stdin < in.txt
    else:
        ref = world.corpus["valid.tgt"]
        source.write_text(world.corpus["valid.src"].read_text())
        args = ["evaluate", "-m", model, "--src", source, "--ref", ref, "-o", tmp_path / "h"]
    leader, follower = pty.openpty()
    with open(source, "rb") as stdin:
        child = subprocess.Popen(
            [*CLI, *map(str, args), "--device", "cpu"],
            stdin=stdin,
            stdout=subprocess.DEVNULL,
            stderr=follower,
            env={**child_env(), "COLUMNS": "120", "TERM": "xterm"},
        )
    os.close(follower)
    seen = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        seen += chunk
    assert child.wait(timeout=300) == 0, seen.decode(errors="replace")
    os.close(leader)
    text = seen.decode(errors="replace")
    unit = "lines" if command == "translate" else "sentences"  # translate counts input lines
    assert "ETA" in text and unit in text, text
