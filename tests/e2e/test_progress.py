"""Progress displays: live on a terminal (a pseudo-terminal here), never in a pipe or a file.

Each command runs once with stderr on a pty and once with stderr piped (in-process through
CliRunner where the command allows it: a fresh process costs a torch import).
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers.toy import toy_config_dict
from typer.testing import CliRunner

from attn_mt.cli import app
from attn_mt.data.text import read_lines

ATTN_MT = Path(sys.executable).parent / "attn-mt"
CONTROL = ("\r", "\x1b")
# The training line, in the log and on the terminal alike.
LINE = (
    r"step \d+(/\d+)?  elapsed \d+:\d\d  ETA (\d+:)?\d+:\d\d  epoch \d+  loss [\d.]+  "
    r"ppl [\d.]+  lr [\d.e+-]+  grad [\d.]+  [\d,]+ tgt tok/s"
)


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
    assert "translate" in terminal and "lines" in terminal and "lines/s" in terminal
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


# ---------------------------------------------------------------------------------------------
# Training


def test_remaining_time_counts_the_run_to_its_end() -> None:
    """The ETA is of the run, not of its updates: start-up, the validations still due and
    the final one count; max_minutes keeps back the final validation's time."""
    from attn_mt.config.schema import TrainConfig
    from attn_mt.train.clock import RunClock, clock

    now = [20.0]  # 20 s of start-up, then 600 updates of 0.1 s and one validation of 30 s
    run = RunClock(start=0.0, first_step=0, now=lambda: now[0])  # training began at 20 s
    now[0] += 600 * 0.1
    with run.phase("validation"):
        now[0] += 30.0
    run.validated(30.0)
    assert run.elapsed() == pytest.approx(110)

    def left(epochs: float = 0.0, **budget: float) -> float | None:
        return run.remaining(TrainConfig(eval_every=500, **budget), 600, epochs)

    # 400 updates and the validation at step 1000, which is the final one
    assert left(max_steps=1000) == pytest.approx(400 * 0.1 + 30)
    # 1,800 updates to the end of epoch 2: validations at 1000, 1500, 2000 and the final one
    assert left(0.5, max_epochs=2) == pytest.approx(1800 * 0.1 + 4 * 30)
    assert left(max_steps=1000, max_minutes=2) == pytest.approx(10)  # the budget ends first
    assert left(max_steps=-1) is None and left(patience=3) is None
    assert run.out_of_time(TrainConfig(max_minutes=2))  # 110 s + 30 s for the final validation
    assert not run.out_of_time(TrainConfig(max_minutes=3)) and not run.out_of_time(TrainConfig())
    assert [clock(s) for s in (0, 59.9, 61, 3600, 3 * 3600 + 62, None)] == [
        "0:00", "0:59", "1:01", "1:00:00", "3:01:02", "?",
    ]  # fmt: skip


def test_the_live_line_fits_the_terminal() -> None:
    from attn_mt.cli.progress import fit

    line = (
        "step 1200/100000  elapsed 1:02:03  ETA 12:34:56  epoch 3  loss 3.456  ppl 31.70  "
        "lr 1.00e-03  grad 1.23  123,456 tgt tok/s"
    )
    assert fit(line, 200) == line
    narrow = fit(line, 80)
    assert len(narrow) <= 80 and narrow.split("  ") == [
        "step 1200/100000", "elapsed 1:02:03", "ETA 12:34:56", "loss 3.456", "123,456 tgt tok/s",
    ]  # fmt: skip
    assert fit(line, 60).startswith("step 1200/100000  ETA 12:34:56  loss 3.456")


def test_the_live_line_moves_its_clock_on_between_updates() -> None:
    """An update or a validation may take a while: the line's elapsed time and ETA move on
    with the clock, not only when the next update is read; a direction's search bar goes
    when it is done."""
    import io

    from rich.console import Console

    from attn_mt.cli.progress import TrainingDisplay

    now = [100.0]
    console = Console(file=io.StringIO(), width=200, force_terminal=True)
    display = TrainingDisplay(console, now=lambda: now[0])
    line = "step 7/50  elapsed 0:26  ETA 1:00  epoch 0  loss 9.100  ppl 8955.29  12 tgt tok/s"
    display.training(line, 26.4, 60.0)
    assert display.shown() == line
    now[0] += 14.0  # an update of 14 s, still running
    assert display.shown() == line.replace("0:26", "0:40").replace("ETA 1:00", "ETA 0:46")
    now[0] += 100.0
    assert "elapsed 2:20  ETA 0:00  epoch 0" in display.shown()  # never below zero
    display.training(line, 26.4, None)
    assert "ETA ?" in display.shown()
    display.validating("search de-en", 3, 5)
    assert (
        display.task is not None and display.bar.tasks[0].description == "validation search de-en"
    )
    display.validating("search de-en", 5, 5)
    assert display.task is None


def labels(line: str) -> str:
    """A training line with its numbers blanked: what the log and the display must share."""
    return re.sub(r"\d[\d.,:e+-]*", "#", line)


class Recorder:
    """A training monitor that keeps what it is told."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.validations: list[tuple[str, int, int]] = []

    def training(self, line: str, elapsed: float, eta: float | None) -> None:
        self.lines.append(line)

    def validating(self, phase: str, done: int, total: int) -> None:
        self.validations.append((phase, done, total))


def test_training_reports_to_its_monitor(toy_config, caplog) -> None:
    """One line per update with the log line's labels, the last updates logged even short of
    log_every; validation progress of both phases on a subset."""
    from attn_mt.train.setup import train

    recorder = Recorder()
    cfg = toy_config(max_steps=4, eval_every=2, log_every=3, valid_max_sentences=30)
    with caplog.at_level(logging.INFO, logger="attn_mt"):
        result = train(cfg, device="cpu", monitor=recorder)
    assert result.step == 4 and len(recorder.lines) == 4
    assert re.fullmatch(LINE, recorder.lines[1]) and recorder.lines[1].startswith("step 2/4 ")
    logged = [r.getMessage() for r in caplog.records if r.getMessage().startswith("step ")]
    assert [labels(line) for line in logged] == [labels(line) for line in recorder.lines[2:]]
    assert recorder.validations[-1] == ("search", 30, 30)  # two validations of 30 pairs, each
    for phase in ("loss", "search"):  # scoring them, then translating them
        assert [done for p, done, _ in recorder.validations if p == phase].count(30) == 2
    # The finished loss bar gives way to the search's before its first (slowest) batch ends.
    after_loss = [
        b
        for a, b in zip(recorder.validations, recorder.validations[1:], strict=False)
        if a[0] == "loss" and a[1] == 30
    ]
    assert after_loss == [("search", 0, 30)] * 2
    valid = [json.loads(line) for line in (cfg_out(cfg) / "metrics.jsonl").read_text().splitlines()]
    assert [m["sentences"] for m in valid if m["split"] == "valid"] == [30, 30]
    assert [m["step"] for m in valid if m["split"] == "train"] == [3, 4]  # in TensorBoard too
    log_text = (cfg_out(cfg) / "train.log").read_text()
    assert "valid step 4 (on 30 of 100 validation sentences): loss" in log_text
    finished = next(line for line in log_text.splitlines() if "finished at step 4" in line)
    assert finished.endswith("(on 30 of 100 validation sentences)"), finished


def cfg_out(cfg) -> Path:
    return Path(cfg.train.out_dir)


def test_training_shows_a_live_line_on_a_terminal(toy_data, tmp_path: Path) -> None:
    """Start-up stages, the live line and a validation bar on a terminal; the log lines
    printed above the display keep their labels."""
    raw = toy_config_dict(toy_data, tmp_path / "run", max_steps=6, eval_every=3, log_every=3)
    raw["train"]["valid_max_sentences"] = 20
    config = tmp_path / "toy.yaml"
    config.write_text(yaml.safe_dump(raw))
    code, _, terminal = run_on_terminal("train", "--config", config, "--device", "cpu")
    assert code == 0, terminal
    stages = ("reading the validation split ...", "preparing the training data ...",
              "prepared data: ", "building the model ...")  # fmt: skip
    for stage in stages:
        assert stage in terminal, stage
    assert re.search(r"\r\x1b\[2Kstep [1-6]/6  elapsed \d+:\d\d  ETA \d+:\d\d  epoch", terminal)
    assert "validation loss" in terminal and "validation search" in terminal
    assert "sent/s" in terminal
    assert "valid step 6 (on 20 of 100 validation sentences)" in terminal
    logged = (tmp_path / "run" / "train.log").read_text()
    assert re.search(LINE, logged) and not any(c in logged for c in CONTROL)
