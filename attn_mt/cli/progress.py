"""Progress displays on a terminal (with `rich`), nothing when stderr is a pipe or a file.

Used by `attn_mt.cli` only (and imported inside its commands, so that help stays fast): the library
reports progress through plain callbacks and log lines and never writes control characters.
Off a terminal these displays print nothing, so CI logs, pipes and `2> file` get exactly the
plain lines they always got.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TaskID,
    TextColumn,
)
from rich.text import Text

from attn_mt.jobs.pace import Pace
from attn_mt.train.clock import clock


def on_terminal() -> bool:
    """Whether stderr is an interactive terminal (where a live display belongs)."""
    return sys.stderr.isatty()


class SinceStartColumn(ProgressColumn):
    """`12.3 UNIT  0:42  ETA 1:05`: the task's pace since it started (not rich's window of
    the last seconds, which forgets a phase that comes back after a pause), its elapsed time
    and the time left at that pace."""

    def __init__(self, unit: str):
        super().__init__()
        self.unit = unit

    def render(self, task: Task) -> Text:
        elapsed = task.elapsed or 0.0
        rate = task.completed / elapsed if task.completed and elapsed > 0 else None
        left = None if rate is None or task.total is None else (task.total - task.completed) / rate
        speed = f"{rate:,.1f} {self.unit}" if rate else f"? {self.unit}"
        return Text(f"{speed}  {clock(elapsed)}  ETA {clock(left, '-:--')}")


def _sentence_columns(label: str) -> tuple[ProgressColumn, ...]:
    """LABEL, a bar (as wide as the terminal leaves), done/total sentences, sentences/s,
    elapsed time and ETA."""
    return (
        TextColumn(label),
        BarColumn(bar_width=None),
        MofNCompleteColumn(),
        TextColumn("sentences"),
        SinceStartColumn("sent/s"),
    )


class PaceColumn(ProgressColumn):
    """`12.3 UNIT  0:42  ETA 1:05`: the task's `pace` (`Pace`), elapsed time, time left."""

    def __init__(self, unit: str):
        super().__init__()
        self.unit = unit

    def render(self, task: Task) -> Text:
        pace: Pace = task.fields["pace"]
        rate, left = pace.rate, pace.remaining
        speed = f"{rate:,.1f} {self.unit}" if rate else f"? {self.unit}"
        return Text(f"{speed}  {clock(time.monotonic() - pace.start)}  ETA {clock(left, '-:--')}")


@contextlib.contextmanager
def lines(
    total: int | None, label: str, unit: str = "lines", rate_unit: str = "lines/s"
) -> Iterator[Pace]:
    """Yield the `Pace` of a decoding of `total` lines; on a terminal, a bar of lines done,
    lines/s, the elapsed time and the time left, redrawn as `Pace.finished` is called.

    `total` None (e.g. endless stdin) shows nothing, as does a stderr that is not a terminal.
    """
    pace = Pace(total)
    if total is None or not on_terminal():
        yield pace
        return
    columns = (
        TextColumn(label),
        BarColumn(bar_width=None),
        MofNCompleteColumn(),
        TextColumn(unit),
        PaceColumn(rate_unit),
    )
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(label, total=total, pace=pace)
        pace.on_change = lambda: bar.update(task, completed=pace.shown)
        yield pace


@contextlib.contextmanager
def sentences(total: int | None, label: str) -> Iterator[Callable[[int], None]]:
    """Yield `advance(n)`: `lines`' display of sentences, n more done after each batch."""
    with lines(total, label, "sentences", "sent/s") as pace:
        yield pace.finished


# The training line's fields a narrow terminal drops first, by their first word: the rest
# (step, ETA, loss and tokens/s) fit in 80 columns.
LEAST_NEEDED = ("grad", "lr", "epoch", "ppl", "elapsed")


def fit(line: str, width: int) -> str:
    """The training line in `width` columns: whole fields dropped, least needed first."""
    fields = line.split("  ")
    for name in LEAST_NEEDED:
        if len("  ".join(fields)) <= width:
            break
        fields = [f for f in fields if f.split(" ")[0] != name]
    return "  ".join(fields)


class TrainingDisplay:
    """Training's live line (the log line's figures after every update, as many as the
    terminal's width holds, its elapsed time and ETA moving on between updates) and, while it
    validates, a bar of sentences scored ("validation loss") then translated ("validation
    search"; of a multilingual run "validation search de-en"). Log lines print above it.

    A validation under a time budget goes in chunks, scoring and translating in turn: each
    phase keeps its bar (shown while it runs), its clock and its pace across the chunks."""

    def __init__(self, console: Console, now: Callable[[], float] = time.monotonic):
        self.console, self.now = console, now
        self.line = ""
        self.times: tuple[float, float, float | None] = (0.0, 0.0, None)  # came, elapsed, ETA
        columns = _sentence_columns("{task.description}")
        self.bar = Progress(*columns, console=console, auto_refresh=False)
        self.task: TaskID | None = None  # the phase shown
        self.phases: dict[str, TaskID] = {}  # every phase of this validation
        self.live = Live(
            console=console, transient=True, redirect_stderr=True, get_renderable=self._render
        )

    def _render(self) -> RenderableType:
        line = Text(fit(self.shown(), self.console.width), no_wrap=True, overflow="ellipsis")
        return line if self.task is None else Group(line, self.bar)

    def training(self, line: str, elapsed: float, eta: float | None) -> None:
        """Show the training line `line`, made at the run's `elapsed` seconds with `eta` left
        (drawn at the next refresh, a few times a second)."""
        first = not self.line
        self.line, self.times = line, (self.now(), elapsed, eta)
        if first:
            self.live.refresh()

    def shown(self) -> str:
        """The training line with its elapsed time and ETA moved on by the time since it came
        (an update or a validation may take a while)."""
        came, elapsed, eta = self.times
        since = self.now() - came
        left = None if eta is None else max(eta - since, 0.0)
        now = {"elapsed": clock(elapsed + since), "ETA": clock(left)}
        return "  ".join(
            f"{name} {now[name]}" if (name := field.split(" ")[0]) in now else field
            for field in self.line.split("  ")
        )

    def validating(self, phase: str, done: int, total: int) -> None:
        """Validation's `phase` has done `done` of `total` sentences; the bars go when the
        search is done."""
        label = f"validation {phase}"
        task = self.phases.get(label)
        shown = {t.id: t.completed for t in self.bar.tasks}
        if task is not None and done < shown[task]:  # a new validation
            self.bar.remove_task(task)
            task = None
        if task is None:
            task = self.phases[label] = self.bar.add_task(label, total=total)
        for other in self.phases.values():
            self.bar.update(other, visible=other == task)
        if task != self.task:
            self.task = task
            self.live.refresh()  # shown at least once, however quick the phase
        self.bar.update(task, completed=done, total=total)
        if phase.split(" ")[0] == "search" and done >= total:
            for other in self.phases.values():
                self.bar.remove_task(other)
            self.phases.clear()
            self.task = None


@contextlib.contextmanager
def training(enabled: bool = True) -> Iterator[TrainingDisplay | None]:
    """A live training display on a terminal; None elsewhere (the log lines say it all)."""
    if not (enabled and on_terminal()):
        yield None
        return
    display = TrainingDisplay(Console(stderr=True))
    with display.live:
        yield display
