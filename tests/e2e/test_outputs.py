"""Every output path is written the same way (`fileio.atomic_write`): through a symbolic link
to the file it names (the link kept), in place on a device or FIFO (never replaced by a regular
file), atomically elsewhere, with temp files that a concurrent writer of the same output never
deletes.
"""

from __future__ import annotations

import os
import re
import socket
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest
from helpers.clirun import translate_args
from helpers.workspace import Stdin, World, run_cli

from attn_mt import fileio

# How a temp file names its writer: `.NAME.HOST-PID-RANDOM.tmp` (fileio.temp_prefix)
HOST = re.sub(r"[^A-Za-z0-9_]", "_", socket.gethostname())


def cli(*args: object, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    result = run_cli(list(args), Stdin(stdin), {"ATTN_MT_OFFLINE": "1"})
    assert result.returncode == 0, result.stderr.decode()
    return result


@pytest.fixture
def folder(world: World) -> Path:
    return Path(tempfile.mkdtemp(dir=world.root, prefix="outputs."))


def best(world: World) -> Path:
    return world.run / "checkpoints" / "best.pt"


def link_to_file(folder: Path, name: str) -> tuple[Path, Path]:
    """./NAME -> ./real/NAME.target, the target holding "old"."""
    (folder / "real").mkdir()
    target = folder / "real" / f"{name}.target"
    target.write_text("old\n")
    (folder / name).symlink_to(target)
    return folder / name, target


def assert_link_kept(link: Path, target: Path) -> None:
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.is_file() and target.read_bytes() != b"old\n"


def test_average_through_a_link_writes_its_file(world: World, folder: Path) -> None:
    link, target = link_to_file(folder, "avg.pt")
    cli("average", "--out", link, "--force", best(world), best(world))
    assert_link_kept(link, target)


def test_evaluate_through_a_link_writes_its_file(world: World, folder: Path) -> None:
    link, target = link_to_file(folder, "hyp.txt")
    cli("evaluate", "--model", best(world), "--split", "valid", "--device", "cpu", "--out", link)
    assert_link_kept(link, target)
    assert len(target.read_text().splitlines()) == 8


def test_translate_through_a_link_writes_its_file(world: World, folder: Path) -> None:
    link, target = link_to_file(folder, "out.txt")
    cli(*translate_args(best(world), "--output", str(link)), stdin=b"qb\nqc\n")
    assert_link_kept(link, target)
    assert len(target.read_text().splitlines()) == 2


@pytest.mark.skipif(os.geteuid() != 0, reason="making a device node needs root")
def test_average_onto_a_device_writes_it_in_place(world: World, folder: Path) -> None:
    null = folder / "null"
    os.mknod(null, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # a /dev/null of our own
    cli("average", "--out", null, "--force", best(world), best(world))
    assert stat.S_ISCHR(null.lstat().st_mode)
    assert os.listdir(folder) == ["null"]


def test_translate_onto_a_fifo_writes_it_in_place(world: World, folder: Path) -> None:
    fifo = folder / "pipe"
    os.mkfifo(fifo)
    reader = subprocess.Popen(["cat", str(fifo)], stdout=subprocess.PIPE)
    cli(*translate_args(best(world), "--output", str(fifo)), stdin=b"qb\nqc\n")
    assert len(reader.communicate(timeout=60)[0].splitlines()) == 2
    assert stat.S_ISFIFO(fifo.lstat().st_mode)


def test_another_writers_temp_file_is_never_removed(tmp_path: Path) -> None:
    """Two `translate --output F` at once: the second must not delete the first's temp file
    (the first would fail after all its work); a killed writer's is removed."""
    out = tmp_path / "out.txt"
    host = HOST
    alive = tmp_path / f".out.txt.{host}-{os.getppid()}-abc123.tmp"  # a running process's
    alive.write_text("half")
    dead_pid = 2**22 + 12345  # above the kernel's pid_max: never running
    dead = tmp_path / f".out.txt.{host}-{dead_pid}-abc123.tmp"
    dead.write_text("left by a SIGKILL")
    with fileio.atomic_write(out) as handle:
        handle.write(b"done\n")
        own = [p for p in tmp_path.iterdir() if p.name.startswith(fileio.temp_prefix(out))]
        assert len(own) == 1 and own[0] != alive  # this process's name: host, pid, random
    assert out.read_text() == "done\n"
    assert alive.read_text() == "half"
    assert not dead.exists()


def test_concurrent_translate_runs_to_one_output_both_succeed(world: World, folder: Path) -> None:
    """A real second process's temp file, present while this one writes the same output."""
    out = folder / "out.txt"
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        theirs = folder / f".out.txt.{HOST}-{sleeper.pid}-xyz789.tmp"
        theirs.write_text("their half-written output\n")
        cli(*translate_args(best(world), "--output", str(out)), stdin=b"qb\n")
        assert theirs.exists()
    finally:
        sleeper.kill()
        sleeper.wait()
