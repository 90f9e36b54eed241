"""Round six (issue 88) in real `attn-mt` processes: a write that fails mid-way (a file-size
limit, as a full disk would) in `translate`, `distill` and `clean` is one line naming the
file, the lines done kept; output names of any length the file system takes; `distill`
stopped by SIGINT, SIGTERM or SIGKILL keeps every line it finished, and the same command
continues from there; `compare` into a closed stdout or a reader that went away.

The teacher is the hostile cases' tiny run; where a distillation is stopped, saved with
`decode.batch_tokens: 1` (a line a batch: a chunk's lines finish shortest first, most of them
ahead of the first line, and slowly enough to be stopped part-way).
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest import mock

import pytest
import torch
import yaml
from helpers.clirun import CLI, assert_user_error, child_env, translate_args
from helpers.workspace import Stdin, World, run_cli, tiny_config

from attn_mt.decode.translator import Translator
from attn_mt.distill.run import Distillation

# Run a command with files capped at argv[1] bytes: a write past the cap fails with EFBIG
# ("File too large"), as a full disk fails one. SIGXFSZ is ignored: an error, not a kill.
WITH_FILE_SIZE_LIMIT = (
    "import os, resource, signal, sys\n"
    "limit = int(sys.argv[1])\n"
    "resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))\n"
    "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)
LINES = 300  # the world's training pairs, which a student distils
STOPPED = 200  # those of a student whose distillation is stopped (enough that a loaded machine
# cannot finish them between the record keeping a line and the signal)


@pytest.fixture(scope="module")
def folder(world: World) -> Iterator[Path]:
    made = Path(tempfile.mkdtemp(dir=world.root, prefix="round-six."))
    yield made
    shutil.rmtree(made, ignore_errors=True)


@pytest.fixture(scope="module")
def teacher(world: World, folder: Path) -> Path:
    """The tiny run's best.pt, searching one line a batch."""
    state = torch.load(world.run / "checkpoints" / "best.pt", weights_only=True)
    state["config"]["decode"]["batch_tokens"] = 1
    torch.save(state, folder / "teacher.pt")
    return folder / "teacher.pt"


def limited(limit: int, args: list[Any], cwd: Path, world: World) -> subprocess.CompletedProcess:
    """`attn-mt ARGS` with every file it writes capped at `limit` bytes."""
    command = [sys.executable, "-c", WITH_FILE_SIZE_LIMIT, str(limit), *CLI, *map(str, args)]
    return subprocess.run(
        command, capture_output=True, cwd=cwd, env=child_env(**world.env()), timeout=300
    )


def partial_record(out: Path) -> dict[str, Any]:
    return json.loads(out.with_name(out.name + ".partial.json").read_text())


def kept(record: dict[str, Any]) -> int:
    """The lines a partial translation's record keeps: in order, and finished ahead."""
    return int(record["done"]["lines"]) + len(record.get("ahead", []))


def test_translate_past_a_file_size_limit_is_one_line_and_resumes(world: World, folder: Path):
    """EFBIG writing --output's partial (or its record): one line naming the file and what is
    kept; `--resume` without the limit ends with the uncut run's file."""
    model = world.run / "checkpoints" / "best.pt"
    out = folder / "capped.txt"
    args = translate_args(model, "-i", world.corpus["train.src"], "-o", out)
    result = limited(2048, [*args, "--set", "decode.batch_tokens=64"], folder, world)
    line = assert_user_error(result, "cannot write (File too large)", "capped.txt.partial")
    assert f"{kept(partial_record(out))} line(s) done are kept" in line
    assert "the same command with --resume continues them" in line and not out.exists()
    resumed = run_cli([*args, "--resume"], Stdin(), world.env())
    assert resumed.returncode == 0, resumed.stderr.decode()
    uncut = run_cli(translate_args(model, "-i", world.corpus["train.src"]), Stdin(), world.env())
    assert out.read_bytes() == uncut.stdout
    assert not out.with_name("capped.txt.partial").exists()


@pytest.mark.parametrize("length", [240, 250])
def test_an_output_name_of_any_length_the_file_system_takes(
    world: World, tmp_path: Path, length: int
) -> None:
    """240 characters failed on the temp name attn-mt added; 250 on the partial's."""
    out = tmp_path / ("o" * length)
    model = world.run / "checkpoints" / "best.pt"
    result = run_cli(translate_args(model, "-o", out), Stdin(b"qb qc\nqd\n"), world.env())
    assert result.returncode == 0, result.stderr.decode()
    assert len(out.read_text().splitlines()) == 2
    assert [p.name for p in tmp_path.iterdir()] == [out.name]


def test_clean_past_a_file_size_limit_is_one_line(world: World, folder: Path) -> None:
    config = folder / "clean.yaml"
    config.write_text(yaml.safe_dump(tiny_config(world.corpus, folder / "unused")))
    out = folder / "cleaned"
    result = limited(1024, ["clean", "--config", config, "--out", out], folder, world)
    assert_user_error(result, f"--out {out}: cannot write {out}/", "(File too large)")
    assert not out.exists() or not [p for p in out.iterdir() if p.name.endswith(".tmp")]


def student_config(world: World, folder: Path, name: str, lines: int = LINES) -> Path:
    """A student config distilling the first `lines` of the world's training pairs into
    `folder/name`."""
    corpus = dict(world.corpus)
    for side in ("src", "tgt"):
        kept_lines = world.corpus[f"train.{side}"].read_text().splitlines()[:lines]
        corpus[f"train.{side}"] = folder / f"{name}.{side}"
        corpus[f"train.{side}"].write_text("".join(f"{line}\n" for line in kept_lines))
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(tiny_config(corpus, folder / name)))
    return path


def distill_args(teacher: Path, config: Path) -> list[Any]:
    return ["distill", "--teacher", teacher, "--config", config, "--device", "cpu"]


def test_distill_past_a_file_size_limit_is_one_line_and_continues(
    world: World, folder: Path
) -> None:
    """The teacher's n-best (300 lines, 12 kB) past a 4 kB cap: one line, the lines done kept,
    and the same command, uncapped, continues them."""
    config = student_config(world, folder, "capped")
    args = distill_args(world.run, config)
    result = limited(4096, args, folder, world)
    nbest = folder / "capped" / "distilled" / "corpus1.nbest"
    line = assert_user_error(result, "(File too large)", "corpus1.nbest.partial")
    assert f"{kept(partial_record(nbest))} line(s) done are kept" in line
    assert "the same distill command continues them" in line
    again = run_cli(args, None, world.env())
    assert again.returncode == 0, again.stderr.decode()
    assert len(nbest.read_text().splitlines()) == LINES


@pytest.mark.parametrize("stop", ["SIGINT", "SIGTERM", "SIGKILL"])
def test_distill_stopped_keeps_every_finished_line(
    world: World, folder: Path, teacher: Path, stop: str
) -> None:
    """Stopped once the record keeps a line: on SIGINT and SIGTERM every finished line is kept
    (most of them ahead of the first, which a chunk searches late) and said so; on SIGKILL
    those the record held a second ago. The same command then translates only the others
    (and writes the student's corpus, whose training `test_distill.py` tests)."""
    config = student_config(world, folder, f"stopped-{stop}", STOPPED)
    nbest = folder / f"stopped-{stop}" / "distilled" / "corpus1.nbest"
    log = folder / f"stopped-{stop}.log"
    with open(log, "wb") as stderr:
        child = subprocess.Popen(
            [*CLI, *map(str, distill_args(teacher, config))],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            env=child_env(**world.env()),
        )
    deadline = time.monotonic() + 120
    while not (
        nbest.with_name("corpus1.nbest.partial.json").exists() and kept(partial_record(nbest))
    ):
        assert child.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.01)
    child.send_signal(signal.Signals[stop])
    code = child.wait(60)
    record = partial_record(nbest)
    assert code == {"SIGINT": 130, "SIGTERM": 143, "SIGKILL": -9}[stop], log.read_text()
    assert record["ahead"] and 0 < kept(record) < STOPPED, record["done"]
    if stop != "SIGKILL":
        assert f"{kept(record)} line(s) done are kept" in log.read_text()
    translate = Translator.translate_nbest
    again: list[str] = []

    def counted(self: Translator, sources: list[str], request: Any) -> Any:
        again.extend(source for source in sources if source)  # kept lines are passed blank
        return translate(self, sources, request)

    untrained = SimpleNamespace(stop_signal=None)  # the student's training is not tested here
    with (
        mock.patch.object(Translator, "translate_nbest", counted),
        mock.patch.object(Distillation, "train", lambda self, monitor=None: untrained),
    ):
        result = run_cli(distill_args(teacher, config), None, world.env())
    assert result.returncode == 0, result.stderr.decode()
    assert f"{record['done']['lines']} line(s) done and {len(record['ahead'])}" in (
        result.stderr.decode()
    )
    corpus = set(config.with_suffix(".src").read_text().splitlines())
    assert len([s for s in again if s in corpus]) == STOPPED - kept(record)
    assert len(nbest.read_text().splitlines()) == STOPPED


def compare_shell(world: World, folder: Path, redirect: str) -> subprocess.CompletedProcess:
    """`compare` of the valid references against themselves, stdout as `redirect` says."""
    ref = world.corpus["valid.tgt"]
    command = " ".join([*CLI, "compare", "--ref", str(ref), str(ref), str(ref)])
    return subprocess.run(
        ["bash", "-c", f"{command} {redirect}"],
        capture_output=True,
        cwd=folder,
        env=child_env(**world.env()),
        timeout=300,
    )


def test_compare_into_a_closed_stdout_or_a_gone_reader(world: World, folder: Path) -> None:
    """`>&-`: one line, exit 2, before the work (it exited 0 having written nothing); a reader
    that went away (`| true`, as `| head -1` half the time): quiet, exit 0, as translate."""
    closed = compare_shell(world, folder, ">&-")
    assert_user_error(closed, "stdout: cannot write (it is closed)")
    gone = compare_shell(world, folder, "| true; exit ${PIPESTATUS[0]}")
    assert gone.returncode == 0 and gone.stderr == b"", gone.stderr.decode()
    table = compare_shell(world, folder, "")
    assert table.returncode == 0 and b"p 1 identical" in table.stdout
