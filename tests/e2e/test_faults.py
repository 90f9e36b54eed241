"""Faults and limits end to end, in real `attn-mt` processes: a long translation stream and a
reader that goes away, a NaN loss, SIGINT/SIGTERM and SIGKILL at random moments, a failed
write. Each must leave whole checkpoints behind, and a run resumed after it must end bit for
bit where an uninterrupted run ends.
"""

from __future__ import annotations

import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers.clirun import (
    CLI,
    RUN_STEPS,
    assert_same_training_state,
    assert_user_error,
    assert_whole_checkpoints,
    attn_mt,
    checkpoint_names,
    child_env,
    config_dict,
    snapshot,
    start,
    train_args,
    translate_args,
    wait_for,
    write_yaml,
)
from helpers.toy import write_lines

from attn_mt.checkpoint import load_checkpoint

# ---------------------------------------------------------------------------------------------
# Translate: a long stream, a reader that goes away


def run_measured(
    args: list[Any], stdin: Path, cwd: Path
) -> tuple[subprocess.CompletedProcess[bytes], int]:
    """Run `attn-mt ARGS` with stdin from a file; also return its peak anonymous memory in bytes
    (RssAnon, polled: what holding lines would cost, without the pages of torch's libraries).
    oneDNN's primitive cache is off (ONEDNN_PRIMITIVE_CACHE_CAPACITY=0): it keeps a primitive
    per batch shape met, up to its capacity, spread over glibc's per-thread arenas, so with it
    the memory grows with the shapes a run has met so far, not with the lines it holds, and
    a short run has met fewer."""
    with (
        open(stdin, "rb") as source,
        open(cwd / "out", "w+b") as out,
        open(cwd / "err", "w+b") as err,
    ):
        child = subprocess.Popen(
            [*CLI, *map(str, args)],
            stdin=source,
            stdout=out,
            stderr=err,
            cwd=cwd,
            env=child_env(ONEDNN_PRIMITIVE_CACHE_CAPACITY="0"),
        )
        status, peak = Path(f"/proc/{child.pid}/status"), 0
        deadline = time.monotonic() + 600
        while child.poll() is None and time.monotonic() < deadline:
            try:
                fields = dict(line.split(":", 1) for line in status.read_text().splitlines())
                peak = max(peak, int(fields["RssAnon"].split()[0]) * 1024)  # in kB
            except (OSError, KeyError, ValueError):  # ended between poll() and the read
                pass
            time.sleep(0.005)
        if child.poll() is None:
            child.kill()
        child.wait()
        out.seek(0)
        err.seek(0)
        result = subprocess.CompletedProcess(child.args, child.returncode, out.read(), err.read())
    return result, peak


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc/PID/status")
def test_translate_streams_50k_lines_in_bounded_memory(trained_run: Path, tmp_path: Path) -> None:
    rng = random.Random(0)
    words = [f"q{c}" for c in "bcdfghjklmnprstvwz"]
    # Every other line blank: the blank lines must come out blank in the same places.
    lines = [
        " ".join(rng.choices(words, k=rng.randint(1, 3))) if i % 2 == 0 else ""
        for i in range(50_000)
    ]
    small, big = (
        write_lines(tmp_path / "2k.txt", lines[:2000]),
        write_lines(tmp_path / "50k.txt", lines),
    )
    args = translate_args(trained_run, "--beam", "1")
    peaks = {}
    for path in (small, big):
        result, peaks[path] = run_measured(args, path, tmp_path)
        assert result.returncode == 0 and b"Traceback" not in result.stderr, result.stderr.decode()
    output = result.stdout.decode("utf-8").split("\n")
    assert output.pop() == "" and len(output) == len(lines)
    assert [bool(line.strip()) for line in output] == [bool(line) for line in lines]
    growth = peaks[big] - peaks[small]
    # Streaming, it grows by about 1 MiB; holding all 50k lines and results would take ~32 MiB.
    assert growth < 16 * 2**20, f"peak memory grew by {growth / 2**20:.0f} MiB from 2k to 50k lines"


def test_translate_reader_closing_early_is_quiet(trained_run: Path, tmp_path: Path) -> None:
    source = write_lines(tmp_path / "in.txt", ["qb qc qd"] * 5000)
    log = tmp_path / "stderr.txt"
    with open(source, "rb") as stdin, open(log, "wb") as stderr:
        proc = subprocess.Popen(
            [*CLI, *map(str, translate_args(trained_run))],
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=stderr,
            cwd=tmp_path,
            env=child_env(),
        )
        first = proc.stdout.readline()
        proc.stdout.close()  # like `attn-mt translate ... | head -1`
        returncode = proc.wait(timeout=300)
    assert first.strip()
    assert "Traceback" not in log.read_text() and "attn-mt: error" not in log.read_text()
    assert returncode == 0


# ---------------------------------------------------------------------------------------------
# Training faults


def logged(log: Path, text: str) -> Callable[[], bool]:
    """A condition: `text` appears in the log file."""
    return lambda: text in log.read_text(encoding="utf-8", errors="replace")


def test_nan_loss_stops_with_a_clear_error(corpus: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "run"
    raw = config_dict(corpus, out, lr=1e6, warmup=1, eval_every=1, max_nonfinite=2)
    result = attn_mt(*train_args(write_yaml(tmp_path / "nan.yaml", raw)), cwd=tmp_path)
    last = out / "checkpoints" / "last.pt"
    message = assert_user_error(
        result, "the loss was NaN/inf for 2 updates in a row", "lower train.lr", str(last)
    )
    step = assert_whole_checkpoints(out)["step"]  # saved at every step before the NaNs
    assert step >= 1 and f"in a row at step {step + 1};" in message


def test_crlf_corpus_trains_exactly_like_lf(
    corpus: dict[str, Path], straight_run: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    config = write_yaml(tmp_path / "crlf.yaml", config_dict(corpus, out, crlf=True))
    result = attn_mt(*train_args(config), cwd=tmp_path)
    assert result.returncode == 0, result.stderr.decode()
    assert_same_training_state(
        out / "checkpoints" / "last.pt", straight_run / "checkpoints" / "last.pt"
    )
    crlf, lf = (load_checkpoint(run / "checkpoints" / "last.pt") for run in (out, straight_run))
    assert crlf["tokenizers"] == lf["tokenizers"]  # no piece learned a \r
    assert b"\r" not in (out / "train.log").read_bytes()  # holds validation sources and refs


def test_sigint_then_sigterm_then_resume_equals_straight_run(
    corpus: dict[str, Path], straight_run: Path, tmp_path: Path
) -> None:
    """Each signal stops the run promptly with last.pt written; resuming twice ends where the
    straight run ends (the schedule does not depend on max_steps, so 100000 then 24 is fine)."""
    out = tmp_path / "run"
    config = write_yaml(tmp_path / "run.yaml", config_dict(corpus, out, max_steps=100_000))
    step = 0
    for signum in (signal.SIGINT, signal.SIGTERM):
        log = tmp_path / f"{signum.name}.log"
        proc = start(*train_args(config, *(["--resume"] if step else [])), cwd=tmp_path, log=log)
        wait_for(logged(log, "\nstep "), proc, "the first training step", log)
        sent = time.monotonic()
        proc.send_signal(signum)
        returncode = proc.wait(timeout=300)
        took = time.monotonic() - sent
        stderr = log.read_text()
        assert returncode == 128 + signum and "Traceback" not in stderr, stderr  # 130, 143
        assert f"stopped by {signum.name} at step" in stderr and took < 60
        state = assert_whole_checkpoints(out)
        assert step < state["step"] < RUN_STEPS
        step = state["step"]
    result = attn_mt(
        *train_args(config, "--resume", "--set", f"train.max_steps={RUN_STEPS}"), cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr.decode()
    assert_same_training_state(
        out / "checkpoints" / "last.pt", straight_run / "checkpoints" / "last.pt"
    )


def test_ctrl_c_says_at_once_that_it_saves_and_a_second_stops_at_once(
    corpus: dict[str, Path], tmp_path: Path
) -> None:
    """The first Ctrl-C prints at once that the run stops and saves (and how to stop at once),
    before the save; the second, sent as soon as that line shows, ends the run without waiting
    for it (exit 130, no traceback): every checkpoint on disk is whole and no temp file stays."""
    out = tmp_path / "run"
    config = write_yaml(tmp_path / "run.yaml", config_dict(corpus, out, max_steps=100_000))
    log = tmp_path / "train.log"
    proc = start(*train_args(config), cwd=tmp_path, log=log)
    wait_for(logged(log, "\nstep 9"), proc, "a step after the first save (step 8)", log)
    proc.send_signal(signal.SIGINT)
    saying = "SIGINT: stopping: saving last.pt ... (Ctrl-C again to stop at once)"
    wait_for(logged(log, saying), proc, "the line saying it stops", log)
    proc.send_signal(signal.SIGINT)
    returncode = proc.wait(timeout=60)
    stderr = log.read_text()
    assert returncode == 130 and "Traceback" not in stderr, stderr
    if "Ctrl-C again: stopping at once" in stderr:
        assert "last.pt written" not in stderr, stderr
    else:  # the save and the end came before the second Ctrl-C: the first one's ending
        assert "stopped by SIGINT at step" in stderr, stderr
    assert_whole_checkpoints(out)
    assert not [n for n in checkpoint_names(out) if n.startswith(".")], checkpoint_names(out)


def test_sigkill_at_random_moments_then_resume_equals_straight_run(
    corpus: dict[str, Path], straight_run: Path, tmp_path: Path
) -> None:
    """Three SIGKILLs, the first while last.pt is being replaced (the next one too, until a kill
    lands inside a write): each time every checkpoint on disk is whole, and the run resumed
    after the third ends bit for bit where the uninterrupted run ends."""
    out = tmp_path / "run"
    last = out / "checkpoints" / "last.pt"
    config = write_yaml(tmp_path / "run.yaml", config_dict(corpus, out))
    rng = random.Random(9)
    in_a_write, saved_step = False, 0

    def writing_last() -> bool:
        return last.exists() and any(n.startswith(".last.pt.") for n in checkpoint_names(out))

    for kill in range(3):
        log = tmp_path / f"kill-{kill}.log"
        proc = start(*train_args(config, *(["--resume"] if kill else [])), cwd=tmp_path, log=log)
        if in_a_write:
            wait_for(logged(log, "vocabulary:"), proc, "the start of training", log)
            time.sleep(rng.uniform(0.0, 0.6))
        else:
            wait_for(writing_last, proc, "a write of last.pt over an earlier one", log)
        proc.kill()
        assert proc.wait(timeout=60) == -signal.SIGKILL, log.read_text()
        in_a_write |= writing_last()  # the temp file of the cut write is still there
        state = assert_whole_checkpoints(out)
        assert state["step"] >= saved_step
        saved_step = state["step"]
    assert in_a_write, "no SIGKILL landed inside a checkpoint write"
    result = attn_mt(*train_args(config, "--resume"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr.decode()
    assert not [n for n in checkpoint_names(out) if n.startswith(".last.pt.")]  # cleaned up
    assert_same_training_state(last, straight_run / "checkpoints" / "last.pt")


# Run a command with files capped at argv[1] bytes: a write past the cap fails with EFBIG
# ("File too large"), a real write error like a full disk. SIGXFSZ is ignored: an error, not a kill.
WITH_FILE_SIZE_LIMIT = (
    "import os, resource, signal, sys\n"
    "limit = int(sys.argv[1])\n"
    "resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))\n"
    "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)


def test_write_error_while_saving_keeps_the_previous_checkpoint(
    corpus: dict[str, Path], straight_run: Path, tmp_path: Path
) -> None:
    out = Path(shutil.copytree(straight_run, tmp_path / "run"))
    last = out / "checkpoints" / "last.pt"
    limit = 2**20
    assert (out / "checkpoints" / "best.pt").stat().st_size < limit < last.stat().st_size
    before = snapshot(last)
    config = write_yaml(tmp_path / "run.yaml", config_dict(corpus, out))
    resume = train_args(config, "--resume", "--set", f"train.max_steps={RUN_STEPS + 8}")
    result = subprocess.run(
        [sys.executable, "-c", WITH_FILE_SIZE_LIMIT, str(limit), *CLI, *map(str, resume)],
        capture_output=True,
        cwd=tmp_path,
        env=child_env(),
        timeout=300,
    )
    assert_user_error(
        result,
        f"{last}: could not write checkpoint (File too large)",
        "the previous checkpoint is intact",
    )
    assert snapshot(last) == before
    assert not [name for name in checkpoint_names(out) if name.endswith(".tmp")]
    assert load_checkpoint(last)["step"] == RUN_STEPS
