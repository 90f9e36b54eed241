"""Signals as real processes: SIGTERM leaves no temp file behind (`translate --output` keeps
the lines done in FILE.partial for `--resume` and exits 143, 128 + 15, with no traceback);
Ctrl-C during `translate` writes the lines finished in input order to stdout, and leaves an
earlier --output file as it was, its lines done kept for `--resume`."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from helpers.clirun import CLI, child_env
from helpers.workspace import World

import attn_mt


def test_sigterm_during_translate_output_keeps_the_lines_done_and_no_temp_file(
    world: World,
) -> None:
    folder = Path(tempfile.mkdtemp(dir=world.root, prefix="signals."))
    source = folder / "in.txt"
    source.write_text("qb qc qd qb qc qd qb qc\n" * 20000)
    model = world.run / "checkpoints" / "best.pt"
    args = ["translate", "--model", model, "--device", "cpu", "--input", source]
    child = subprocess.Popen(
        [*CLI, *map(str, [*args, "--output", folder / "out.txt"])],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=child_env(),
    )
    wait_for_lines_done(folder / "out.txt", child)
    child.send_signal(signal.SIGTERM)
    stderr = child.communicate(timeout=60)[1].decode()
    assert child.returncode == 143, stderr
    assert "Traceback" not in stderr and "attn-mt: terminated" in stderr
    assert "--resume continues them" in stderr.splitlines()[-1]
    names = ["in.txt", "out.txt.partial", "out.txt.partial.json"]
    assert sorted(p.name for p in folder.iterdir()) == names


def wait_for_lines_done(out: Path, child: subprocess.Popen[bytes]) -> None:
    """Wait until `out`'s partial translation records a line done."""
    record = out.with_name(out.name + ".partial.json")
    deadline = time.monotonic() + 120
    while not (record.exists() and json.loads(record.read_text())["done"]["lines"]):
        assert child.poll() is None and time.monotonic() < deadline, "no line was done"
        time.sleep(0.05)


def _sigint_default() -> None:
    """SIGINT's default action, as a terminal's Ctrl-C finds it (a test run started in the
    background would pass it on as ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _sources(count: int) -> list[str]:
    """`count` distinct sources of six words: near-equal lengths keep the batches in input order,
    so the finished lines form a prefix soon."""
    return [" ".join(f"q{chr(97 + (i * 7 + k * 3) % 26)}" for k in range(6)) for i in range(count)]


def test_ctrl_c_during_translate_writes_the_finished_lines_in_order(world: World) -> None:
    """A chunk interrupted halfway: its lines finished in input order reach stdout after the
    chunks before it, then exit 130 with one line saying how many (before, the whole chunk was
    lost)."""
    folder = Path(tempfile.mkdtemp(dir=world.root, prefix="signals."))
    sources = _sources(400)
    model = world.run / "checkpoints" / "best.pt"
    one_per_batch = ["--set", "decode.batch_tokens=1"]  # each line its own batch
    out = folder / "out.txt"
    with open(out, "wb") as stdout:
        child = subprocess.Popen(
            [*CLI, *map(str, ["translate", "--model", model, "--device", "cpu", *one_per_batch])],
            stdin=subprocess.PIPE,
            stdout=stdout,
            stderr=subprocess.PIPE,
            env=child_env(),
            preexec_fn=_sigint_default,
        )
    assert child.stdin is not None

    def send(lines: list[str], expect: int) -> float:
        """Send `lines` and wait until `expect` output lines are there: the seconds it took."""
        assert child.stdin is not None
        start = time.monotonic()
        child.stdin.write("".join(f"{s}\n" for s in lines).encode())
        child.stdin.flush()
        while out.read_bytes().count(b"\n") < expect:
            assert child.poll() is None and time.monotonic() < start + 120, "no line came"
            time.sleep(0.02)
        return time.monotonic() - start

    send(sources[:1], 1)  # once the first line is out, the model is loaded
    one_line = send(sources[1:2], 2)  # each a chunk of its own: written whole
    send(sources[2:], 2)
    time.sleep(3 * one_line + 0.5)  # a few lines of the chunk of 398
    child.send_signal(signal.SIGINT)
    stderr = child.communicate(timeout=60)[1].decode()
    lines = out.read_text().splitlines()
    assert child.returncode == 130, stderr
    assert "Traceback" not in stderr
    assert stderr.splitlines()[-1:] == [
        f"attn-mt: interrupted; the first {len(lines)} line(s) are written"
    ]
    assert 2 < len(lines) < len(sources), "not interrupted inside the third chunk"
    expected = attn_mt.load(model, device="cpu").translate(sources[: len(lines)], batch_tokens=1)
    assert lines == expected


def test_ctrl_c_during_translate_output_keeps_the_earlier_file(world: World) -> None:
    """--output is whole or not at all, Ctrl-C included: the earlier file stays as it was, no
    temp file is left, the lines done are kept in FILE.partial and the one line says so; the
    same command with --resume then writes what an uncut run writes."""
    folder = Path(tempfile.mkdtemp(dir=world.root, prefix="signals."))
    source = folder / "in.txt"
    sources = _sources(2000)
    source.write_text("".join(f"{s}\n" for s in sources))
    out = folder / "out.txt"
    out.write_text("earlier\n")
    model = world.run / "checkpoints" / "best.pt"
    args = ["translate", "--model", model, "--device", "cpu", "--input", source, "--output", out]
    one_per_batch = ["--set", "decode.batch_tokens=1"]  # a line a batch: seconds, not a blink
    child = subprocess.Popen(
        [*CLI, *map(str, args + one_per_batch)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=child_env(),
        preexec_fn=_sigint_default,
    )
    wait_for_lines_done(out, child)
    child.send_signal(signal.SIGINT)
    stderr = child.communicate(timeout=60)[1].decode()
    assert child.returncode == 130, stderr
    assert "Traceback" not in stderr
    last = (stderr.splitlines() or [""])[-1]
    assert last.startswith(f"attn-mt: interrupted; --output {out} not written yet"), stderr
    assert "--resume continues them" in last
    assert out.read_text() == "earlier\n"
    names = ["in.txt", "out.txt", "out.txt.partial", "out.txt.partial.json"]
    assert sorted(p.name for p in folder.iterdir()) == names
    resumed = subprocess.run([*CLI, *map(str, [*args, "--resume"])], env=child_env(), timeout=300)
    assert resumed.returncode == 0
    assert out.read_text().splitlines() == attn_mt.load(model, device="cpu").translate(sources)
    assert sorted(p.name for p in folder.iterdir()) == ["in.txt", "out.txt"]


def test_sigterm_during_export_hf_leaves_no_staging_folder(world: World) -> None:
    """`export --format hf` stopped while it writes and checks its staging folder: exit 143
    with one line, nothing left; the staging folder a SIGKILLed export left (its process gone)
    was removed when this export began."""
    pytest.importorskip("transformers")
    folder = Path(tempfile.mkdtemp(dir=world.root, prefix="signals."))
    host = re.sub(r"[^A-Za-z0-9_]", "_", socket.gethostname()) or "host"
    stale = folder / f".hf.{host}-{2**22 + 12345}-abc123.staging"  # above pid_max: never running
    stale.mkdir()
    (stale / "config.json").write_text("{}")
    model = world.run / "checkpoints" / "best.pt"
    args = ["export", "--model", model, "--out", folder / "hf", "--format", "hf"]
    child = subprocess.Popen(
        [*CLI, *map(str, args)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=child_env()
    )
    deadline = time.monotonic() + 120
    while not [p for p in folder.iterdir() if f"-{child.pid}-" in p.name]:
        assert child.poll() is None and time.monotonic() < deadline, "no staging folder appeared"
        time.sleep(0.05)
    assert not stale.exists()
    child.send_signal(signal.SIGTERM)
    stderr = child.communicate(timeout=60)[1].decode()
    assert child.returncode == 143, stderr
    assert "Traceback" not in stderr and stderr.splitlines()[-1:] == ["attn-mt: terminated"]
    assert list(folder.iterdir()) == []
