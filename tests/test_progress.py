"""Progress displays: live on a terminal (a pseudo-terminal here), never in a pipe or a file.

Each command runs once with stderr on a pty and once with stderr piped (in-process through
CliRunner where the command allows it: a fresh process costs a torch import).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from attn_mt.cli import app
from attn_mt.data import read_lines

ATTN_MT = Path(sys.executable).parent / "attn-mt"
CONTROL = ("\r", "\x1b")


def run_on_terminal(*args: str | Path) -> tuple[int, str, str]:
    """`attn-mt ARGS` with stderr on a pseudo-terminal: (exit code, stdout, terminal text)."""
    master, slave = os.openpty()
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "120"}
    with subprocess.Popen(
        [str(ATTN_MT), *map(str, args)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=slave,
        env=env,
    ) as proc:
        os.close(slave)
        chunks = []
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        stdout = proc.stdout.read().decode()
    os.close(master)
    return proc.returncode, stdout, b"".join(chunks).decode(errors="replace")


def test_translate_input_shows_progress_on_a_terminal(trained_run: Path, toy_data, tmp_path):
    out = tmp_path / "out.txt"
    code, stdout, terminal = run_on_terminal(
        "translate", "--model", trained_run, "--input", toy_data["test.src"], "--output", out,
        "--device", "cpu",
    )  # fmt: skip
    assert code == 0, terminal
    assert stdout == ""
    assert "translate" in terminal and "sentences" in terminal and "sent/s" in terminal
    assert "ETA" in terminal and any(c in terminal for c in CONTROL)
    assert len(read_lines(out)) == len(read_lines(toy_data["test.src"]))


def test_translate_input_prints_no_progress_in_a_pipe(trained_run: Path, toy_data, tmp_path):
    out = tmp_path / "out.txt"
    result = CliRunner().invoke(
        app,
        ["translate", "--model", str(trained_run), "--input", str(toy_data["test.src"]),
         "--output", str(out), "--device", "cpu"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert result.output == ""  # nothing on stdout or stderr: no bar, no control characters
    assert len(read_lines(out)) == 100


def test_evaluate_shows_progress_on_a_terminal_only(trained_run: Path, tmp_path: Path):
    out = tmp_path / "hyp.txt"
    args = ["evaluate", "--model", str(trained_run), "--out", str(out), "--device", "cpu"]
    code, stdout, terminal = run_on_terminal(*args)
    assert code == 0, terminal
    assert stdout.startswith("BLEU ")
    assert "evaluate" in terminal and "sent/s" in terminal and "ETA" in terminal
    assert any(c in terminal for c in CONTROL)
    piped = CliRunner().invoke(app, args)
    assert piped.exit_code == 0, piped.output
    assert piped.stdout == stdout
    assert piped.stderr.splitlines() == [f"hypotheses: {out}"]
    assert not any(c in piped.output for c in CONTROL)
