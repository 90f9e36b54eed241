"""The validation bars of `attn-mt train` on a terminal: a validation under a time budget goes
in chunks, scoring and translating in turn, and each phase's bar keeps its clock and its pace
across the chunks (it showed `? sent/s ETA -:--:--` and a clock restarted at each chunk); the
bars go when the search is done, and the next validation starts its own."""

from __future__ import annotations

import io
import re

from rich.console import Console

from attn_mt.cli.progress import TrainingDisplay


def test_each_phase_keeps_its_clock_and_pace_across_chunks() -> None:
    console = Console(file=io.StringIO(), width=160, force_terminal=True, no_color=True)
    display = TrainingDisplay(console)
    now = [0.0]
    display.bar.get_time = lambda: now[0]  # rich's clock, which the tasks read
    display.training("step 7/50  elapsed 0:26  ETA 1:00  loss 9.100", 26.4, 60.0)
    display.validating("loss", 0, 100)
    loss = display.task
    now[0] = 2.0
    display.validating("loss", 8, 100)
    display.validating("search", 0, 100)
    now[0] = 6.0
    display.validating("search", 8, 100)
    now[0] = 8.0
    display.validating("loss", 24, 100)  # the second chunk: the loss bar again, the same one
    assert display.task == loss
    shown = [t for t in display.bar.tasks if t.visible]
    assert [t.description for t in shown] == ["validation loss"] and shown[0].elapsed == 8.0
    console.print(display.bar)
    text = re.sub(r"\x1b\[[0-9;]*m", "", console.file.getvalue())
    assert "24/100 sentences 3.0 sent/s  0:08  ETA 0:25" in text, text  # 24 in 8 s, 76 left
    assert "? sent/s" not in text and "-:--" not in text
    display.validating("search", 24, 24)  # the time ran out: 24 validated
    assert display.task is None and not display.bar.tasks
    display.validating("loss", 0, 100)  # the next validation: bars of its own
    assert [t.completed for t in display.bar.tasks] == [0]
