"""`attn-mt prepare` as real processes: Ctrl-C while a pool of workers encodes, and two prepares
of one corpus started at once (tests/unit/data/test_shards.py has the in-process versions)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from helpers.clirun import CLI, child_env
from helpers.toy import toy_config_dict, toy_pairs, write_lines


def big_corpus(toy_data: dict[str, Path], tmp_path: Path, pairs: int) -> Path:
    """A config whose training corpus is `pairs` toy pairs (a few distinct ones repeated), its
    prepared folder and SentencePiece cache in `tmp_path`; returns the config file."""
    src, tgt = toy_pairs(1000, 7)
    repeat = pairs // len(src)
    write_lines(tmp_path / "big.src", src * repeat)
    write_lines(tmp_path / "big.tgt", tgt * repeat)
    raw = toy_config_dict(toy_data, tmp_path / "run")
    raw["data"]["train"] = {"src": str(tmp_path / "big.src"), "tgt": str(tmp_path / "big.tgt")}
    raw["data"]["prepared_dir"] = str(tmp_path / "prepared")
    raw["tokenizer"]["max_sentences"] = 2000  # SentencePiece on a small sample: seconds saved
    config = tmp_path / "big.yaml"
    config.write_text(yaml.safe_dump(raw))
    return config


def prepare(config: Path, log: Path, workers: int) -> subprocess.Popen[bytes]:
    """`attn-mt prepare` in a session of its own (a terminal's Ctrl-C reaches its whole group),
    started as from a terminal: with SIGINT's default action, which a test run started in the
    background (`cmd &` in a script) would otherwise pass on as ignored."""
    with open(log, "wb") as stderr:
        return subprocess.Popen(
            [*CLI, "prepare", "--config", str(config), "--workers", str(workers)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            env=child_env(ATTN_MT_CACHE=str(config.parent / "cache")),
            start_new_session=True,
            preexec_fn=_default_sigint,
        )


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def children(pid: int) -> set[int]:
    """The processes `pid` started (Linux: /proc/PID/task/*/children)."""
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found.update(int(c) for c in (task / "children").read_text().split())
        except OSError:
            continue
    return found


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie waiting for init to reap it does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def wait_for(condition, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux's /proc")
def test_ctrl_c_while_workers_encode_ends_cleanly(toy_data: dict[str, Path], tmp_path: Path):
    """Exit 130, no traceback, no temp folder, no worker left behind."""
    config = big_corpus(toy_data, tmp_path, 400_000)
    log = tmp_path / "prepare.log"
    proc = prepare(config, log, workers=2)
    try:
        wait_for(lambda: b"encoding into" in log.read_bytes(), 60, "the encoding to start")
        wait_for(lambda: len(children(proc.pid)) >= 2, 10, "both workers")
        workers = children(proc.pid)
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C on a terminal does
        code = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    stderr = log.read_text(errors="replace")
    assert code == 130, stderr
    # A worker that took the SIGINT too would start a traceback ("Process ForkPoolWorker-1:")
    for sign in ("Traceback", "KeyboardInterrupt", "ForkPoolWorker"):
        assert sign not in stderr, stderr
    prepared = tmp_path / "prepared"
    assert [p.name for p in prepared.iterdir() if not p.name.endswith(".lock")] == [], (
        "a temp folder (or a folder the interrupted build finished) is left"
    )
    wait_for(lambda: not any(map(alive, workers)), 10, "the workers to end")


def test_two_prepares_at_once_build_once(toy_data: dict[str, Path], tmp_path: Path):
    """Both exit 0 with the same folder; one encodes, the other waits for it (or finds it up to
    date, if it came late)."""
    config = big_corpus(toy_data, tmp_path, 100_000)
    logs = [tmp_path / f"prepare{i}.log" for i in range(2)]
    procs = [prepare(config, log, workers=1) for log in logs]
    try:
        codes = [proc.wait(timeout=120) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    stderrs = [log.read_text(errors="replace") for log in logs]
    assert codes == [0, 0], stderrs
    assert sum("encoding into" in s for s in stderrs) == 1, stderrs
    assert sum("waiting for it" in s or "is up to date" in s for s in stderrs) == 1, stderrs
    folders = [p for p in (tmp_path / "prepared").iterdir() if not p.name.endswith(".lock")]
    assert len(folders) == 1 and (folders[0] / "manifest.json").is_file()


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux's /proc")
def test_sigterm_to_the_group_while_workers_encode_ends_cleanly(
    toy_data: dict[str, Path], tmp_path: Path
):
    """SIGTERM to the whole group (a scheduler stopping a job): exit 143 with one line, no
    traceback from the process or any worker, no temp folder, no worker left behind."""
    config = big_corpus(toy_data, tmp_path, 400_000)
    log = tmp_path / "prepare.log"
    proc = prepare(config, log, workers=2)
    try:
        wait_for(lambda: b"encoding into" in log.read_bytes(), 60, "the encoding to start")
        wait_for(lambda: len(children(proc.pid)) >= 2, 10, "both workers")
        workers = children(proc.pid)
        os.killpg(proc.pid, signal.SIGTERM)
        code = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    stderr = log.read_text(errors="replace")
    assert code == 143, stderr
    for sign in ("Traceback", "Terminated", "ForkPoolWorker"):
        assert sign not in stderr, stderr
    assert stderr.splitlines()[-1] == "attn-mt: terminated", stderr
    prepared = tmp_path / "prepared"
    assert [p.name for p in prepared.iterdir() if not p.name.endswith(".lock")] == []
    wait_for(lambda: not any(map(alive, workers)), 10, "the workers to end")


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux's /proc")
def test_after_a_sigkill_mid_build_the_next_prepare_succeeds_and_cleans_up(
    toy_data: dict[str, Path], tmp_path: Path
):
    """SIGKILL (nothing can clean up) leaves a temp folder and the lock file; the next prepare
    neither waits on that lock (an OS lock dies with its holder) nor keeps the temp folder."""
    config = big_corpus(toy_data, tmp_path, 100_000)
    prepared = tmp_path / "prepared"
    log = tmp_path / "killed.log"
    proc = prepare(config, log, workers=2)
    try:
        wait_for(lambda: any(p.name.endswith(".tmp") for p in prepared.glob(".*")), 60, "a temp")
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    left = sorted(p.name for p in prepared.iterdir())
    assert any(n.endswith(".tmp") for n in left) and any(n.endswith(".lock") for n in left), left
    again = tmp_path / "again.log"
    rerun = prepare(config, again, workers=2)
    assert rerun.wait(timeout=120) == 0, again.read_text(errors="replace")
    stderr = again.read_text(errors="replace")
    assert "waiting for it" not in stderr and "encoding into" in stderr, stderr
    names = [p.name for p in prepared.iterdir() if not p.name.endswith(".lock")]
    assert len(names) == 1 and not names[0].startswith("."), names
    assert (prepared / names[0] / "manifest.json").is_file()
