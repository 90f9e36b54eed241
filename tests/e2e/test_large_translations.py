"""Large translations: `translate --shard I/N` (the N outputs concatenated are the whole output),
`--output FILE --resume` after a SIGKILL (the file an uncut run writes; other settings or input
refused in one line), torchrun's processes writing one output in input order, and outputs that
name a stream (`-o /dev/stdout >> log` appends to log) or one of the command's inputs (refused
before torch is imported).

In-process runs (`run_cli`) where a fresh process would only add a torch import; real
processes where a signal, a shell's redirection or torchrun is what is tested.
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from helpers.clirun import CLI, assert_user_error, child_env, snapshot, translate_args
from helpers.workspace import Stdin, World, run_cli

from attn_mt.jobs import io

BIN = Path(sys.executable).parent  # the virtualenv's torchrun
# A blank line inside and one before the last, which has no newline after it.
LINES = ["qb qc", "", "qd qe qf qg", "", "qz qy"]
TEXT = "\n".join(LINES).encode()


@pytest.fixture
def folder(world: World) -> Path:
    return Path(tempfile.mkdtemp(dir=world.root, prefix="large."))


def model(world: World) -> Path:
    return world.run / "checkpoints" / "best.pt"


def translated(world: World, *args: Any, stdin: bytes = b"") -> bytes:
    """stdout of `attn-mt translate` of the tiny model, run in this process."""
    result = run_cli(translate_args(model(world), *args), Stdin(stdin), {"ATTN_MT_OFFLINE": "1"})
    assert result.returncode == 0, result.stderr.decode()
    return result.stdout


def test_shards_concatenated_equal_the_whole(world: World, folder: Path) -> None:
    """From a file and from stdin; 2 parts, and 7, more than the lines (two are empty); the
    n-best ids count input lines from the start of the whole input, not of the shard."""
    source = folder / "in.txt"
    source.write_bytes(TEXT)
    whole = translated(world, "--input", source)
    assert whole.count(b"\n") == len(LINES)
    halves = [translated(world, "-i", source, "--shard", f"{i}/2") for i in (1, 2)]
    assert b"".join(halves) == whole and b"" not in halves
    sevenths = [translated(world, "-i", source, "--shard", f"{i}/7") for i in range(1, 8)]
    assert b"".join(sevenths) == whole and sevenths.count(b"") == 2
    from_stdin = [translated(world, "--shard", f"{i}/2", stdin=TEXT) for i in (1, 2)]
    assert from_stdin == halves
    marian = ["--nbest", "2", "--nbest-format", "marian"]
    nbest = [translated(world, "-i", source, "--shard", f"{i}/2", *marian) for i in (1, 2)]
    assert b"".join(nbest) == translated(world, "-i", source, *marian)
    assert nbest[1].startswith(b"2 ||| ")  # the third line (from 0: 2), the second part's first


def sources(count: int) -> list[str]:
    """`count` distinct lines of six words: equal lengths keep the batches in input order, so
    the lines done form a prefix at once."""
    return [" ".join(f"q{chr(97 + (i * 7 + k * 3) % 26)}" for k in range(6)) for i in range(count)]


def record(out: Path) -> dict[str, Any]:
    """The record of `out`'s partial translation."""
    return json.loads(out.with_name(out.name + ".partial.json").read_text())


def test_sigkill_then_resume_equals_an_uncut_run(world: World, folder: Path) -> None:
    """A real process killed mid-run loses at most the lines after its record (written as
    lines are done): --resume cuts them off and ends with exactly the uncut run's file (and
    the batch size, which changes no translation, may differ)."""
    source = folder / "in.txt"
    source.write_text("".join(f"{line}\n" for line in sources(300)))
    out = folder / "out.txt"
    args = ["--input", source, "--output", out]
    child = subprocess.Popen(
        [*CLI, *map(str, translate_args(model(world), *args, "--set", "decode.batch_tokens=1"))],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=child_env(),
    )
    deadline = time.monotonic() + 120
    while not (out.with_name("out.txt.partial.json").exists() and record(out)["done"]["lines"]):
        assert child.poll() is None and time.monotonic() < deadline, "no line was done"
        time.sleep(0.05)
    child.kill()
    child.wait()
    done = record(out)["done"]
    assert 0 < done["lines"] < 300 and not out.exists()
    assert (folder / "out.txt.partial").stat().st_size >= done["bytes"]
    assert translated(world, *args, "--resume") == b""
    uncut = translated(world, "--input", source)
    assert out.read_bytes() == uncut
    assert sorted(p.name for p in folder.iterdir()) == ["in.txt", "out.txt"]


def interrupted(world: World, folder: Path) -> list[Any]:
    """A translation of 6 lines into ./out.txt stopped (Ctrl-C) after its first chunk of 2:
    the arguments that made it."""
    source = folder / "in.txt"
    source.write_text("".join(f"{line}\n" for line in sources(6)))
    args = ["--input", source, "--output", folder / "out.txt"]
    chunks_read = []

    def second_chunk_stops(lines: list[str], *fields: Any) -> Any:
        chunks_read.append(lines)
        if len(chunks_read) == 2:
            raise KeyboardInterrupt
        return real_fields(lines, *fields)

    real_fields = io.line_fields
    with (
        mock.patch("attn_mt.jobs.io.line_chunks", functools.partial(io.line_chunks, max_lines=2)),
        mock.patch("attn_mt.jobs.io.line_fields", second_chunk_stops),
    ):
        result = run_cli(translate_args(model(world), *args), Stdin(), {})
    assert result.returncode == 130, result.stderr.decode()
    assert record(folder / "out.txt")["done"]["lines"] == 2
    return args


def first_line_edited(folder: Path) -> list[Any]:
    """The input's first line changed, after it was translated."""
    source = folder / "in.txt"
    source.write_text("qz" + source.read_text()[2:])
    return []


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (lambda world, folder: ["--beam", "3"], "was made with decode.beam 2, this run 3"),
        (lambda world, folder: ["--nbest", "2"], "was made with request.nbest 1, this run 2"),
        (  # an ensemble of the model with itself
            lambda world, folder: ["--model", model(world)],
            "was made with other model checkpoints",
        ),
        (lambda world, folder: ["--shard", "1/2"], "input lines 1-end, this run 1-3 (--shard"),
        (lambda world, folder: first_line_edited(folder), "the input's lines differ from the 2"),
    ],
    ids=["beam", "nbest", "model", "shard", "input"],
)
def test_resume_onto_other_settings_is_refused(
    world: World, folder: Path, change: Any, words: str
) -> None:
    """One line naming what differs; the partial translation and its record stay as they were."""
    args = interrupted(world, folder)
    extra = change(world, folder)
    before = snapshot(folder)
    result = run_cli(translate_args(model(world), *args, *extra, "--resume"), Stdin(), {})
    assert_user_error(result, "--resume:", words, "or leave out --resume to start over")
    assert snapshot(folder) == before


def test_torchrun_two_processes_write_what_one_process_writes(world: World, folder: Path) -> None:
    """Each of 2 processes translates its half (odd: 5 and 6 lines, blank lines and a last
    line without newline included); rank 0 joins them into --output in input order."""
    source = folder / "in.txt"
    source.write_bytes(TEXT + b"\nqc qd")
    out = folder / "out.txt"
    command = [str(BIN / "torchrun"), "--standalone", "--nproc_per_node=2", "-m", "attn_mt"]
    done = subprocess.run(
        [*command, *map(str, translate_args(model(world), "--input", source, "--output", out))],
        capture_output=True,
        env=child_env(OMP_NUM_THREADS="1"),
        timeout=300,
    )
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    assert out.read_bytes() == translated(world, "--input", source)
    assert sorted(p.name for p in folder.iterdir()) == ["in.txt", "out.txt"]


def test_output_to_dev_stdout_appends_where_the_shell_opened_it(world: World, folder: Path):
    """`translate -o /dev/stdout >> log` keeps log's earlier lines (it was replaced by a file
    of the translations alone)."""
    log = folder / "log"
    log.write_bytes(b"earlier\n")
    with open(log, "ab") as stdout:
        done = subprocess.run(
            [*CLI, *map(str, translate_args(model(world), "-o", "/dev/stdout"))],
            input=b"qb qc\nqd\n",
            stdout=stdout,
            stderr=subprocess.PIPE,
            env=child_env(),
            timeout=300,
        )
    assert done.returncode == 0, done.stderr.decode()
    lines = log.read_bytes().split(b"\n")
    assert lines[0] == b"earlier" and len(lines) == 4 and lines[-1] == b""


def test_stdout_onto_the_input_is_refused_before_torch(world: World, folder: Path) -> None:
    """`translate -i in.txt >> in.txt` (and `-o /dev/stdout` there) would read its own output
    forever: refused in one line, the file as it was."""
    source = folder / "in.txt"
    source.write_bytes(b"qb qc\n")
    for extra in ([], ["-o", "/dev/stdout"]):
        with open(source, "ab") as stdout:
            done = subprocess.run(
                [*CLI, *map(str, translate_args(model(world), "-i", source, *extra))],
                stdout=stdout,
                stderr=subprocess.PIPE,
                env=child_env(),
                timeout=300,
            )
        stderr = done.stderr.decode()
        assert done.returncode == 2 and "is the --input file being read" in stderr, stderr
        assert source.read_bytes() == b"qb qc\n"
