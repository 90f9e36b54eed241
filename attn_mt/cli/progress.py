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
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

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
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text


def on_terminal() -> bool:
    """Whether stderr is an interactive terminal (where a live display belongs)."""
    return sys.stderr.isatty()


class RateColumn(ProgressColumn):
    """The task's speed as `12.3 UNIT` (`? UNIT` until it is known)."""

    def __init__(self, unit: str):
        super().__init__()
        self.unit = unit

    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        return Text(f"{speed:,.1f} {self.unit}" if speed else f"? {self.unit}")


def _sentence_columns(label: str) -> tuple[ProgressColumn, ...]:
    """LABEL, a bar (as wide as the terminal leaves), done/total sentences, sentences/s,
    elapsed time and ETA."""
    return (
        TextColumn(label),
        BarColumn(bar_width=None),
        MofNCompleteColumn(),
        TextColumn("sentences"),
        RateColumn("sent/s"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
    )


@dataclass
class Pace:
    """How fast a long decoding goes and when it ends, from all it has done since it began:
    not from a window of the last seconds, which jumps, as each chunk's lines are searched
    shortest first (a fast start, a slow end). The time left weighs each line by its length
    (`read`): the lines read and not yet done by theirs, the lines not yet read by the mean of
    those read; lines never `read` weigh one each."""

    total: int | None
    clock: Callable[[], float] = time.monotonic
    start: float = field(init=False)
    lines_read: int = 0
    weight_read: int = 0
    lines_done: int = 0
    weight_done: int = 0
    on_change: Callable[[], None] = lambda: None  # a display's redraw

    def __post_init__(self) -> None:
        self.start = self.clock()

    def read(self, lines: Sequence[str]) -> None:
        """`lines` are read (a chunk), to be done."""
        self.lines_read += len(lines)
        self.weight_read += sum(map(weight, lines))

    def finished(self, lines: int, weight: int | None = None) -> None:
        """`lines` more are done, of `weight` in all (default: one a line)."""
        self.lines_done += lines
        self.weight_done += lines if weight is None else weight
        self.on_change()

    @property
    def rate(self) -> float | None:
        """Lines a second since the start; None before the first."""
        elapsed = self.clock() - self.start
        return self.lines_done / elapsed if self.lines_done and elapsed > 0 else None

    @property
    def remaining(self) -> float | None:
        """Seconds left at the pace so far; None before the first line or without a total."""
        if self.total is None or not self.weight_done:
            return None
        if self.lines_read:
            mean = self.weight_read / self.lines_read
            left = self.weight_read - self.weight_done + (self.total - self.lines_read) * mean
        else:
            left = self.total - self.weight_done
        return max(left, 0) * (self.clock() - self.start) / self.weight_done


def weight(line: str) -> int:
    """A line's share of the work: its characters, and one for the line."""
    return len(line) + 1


class PaceColumn(ProgressColumn):
    """`12.3 UNIT  0:42  ETA 1:05`: the task's `pace` (`Pace`), elapsed time, time left."""

    def __init__(self, unit: str):
        super().__init__()
        self.unit = unit

    def render(self, task: Task) -> Text:
        pace: Pace = task.fields["pace"]
        rate, left = pace.rate, pace.remaining
        speed = f"{rate:,.1f} {self.unit}" if rate else f"? {self.unit}"
        return Text(f"{speed}  {_clock(time.monotonic() - pace.start)}  ETA {_clock(left)}")


def _clock(seconds: float | None) -> str:
    """`1:02:03`, `2:03`, or `-:--` when not known."""
    if seconds is None:
        return "-:--"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


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
        pace.on_change = lambda: bar.update(task, completed=pace.lines_done)
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
    search"; of a multilingual run "validation search de-en"). Log lines print above it."""

    def __init__(self, console: Console, now: Callable[[], float] = time.monotonic):
        self.console, self.now = console, now
        self.line = ""
        self.times: tuple[float, float, float | None] = (0.0, 0.0, None)  # came, elapsed, ETA
        columns = _sentence_columns("{task.description}")
        self.bar = Progress(*columns, console=console, auto_refresh=False)
        self.task: TaskID | None = None
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
        from attn_mt.train.runlog import clock  # the log line's format; torch is loaded here

        came, elapsed, eta = self.times
        since = self.now() - came
        left = None if eta is None else max(eta - since, 0.0)
        now = {"elapsed": clock(elapsed + since), "ETA": clock(left)}
        return "  ".join(
            f"{name} {now[name]}" if (name := field.split(" ")[0]) in now else field
            for field in self.line.split("  ")
        )

    def validating(self, phase: str, done: int, total: int) -> None:
        """Validation's `phase` has done `done` of `total` sentences; the bar goes when the
        search is done."""
        label = f"validation {phase}"
        if self.task is not None and self.bar.tasks[0].description != label:
            self.bar.remove_task(self.task)  # the next phase: a bar of its own
            self.task = None
        if self.task is None:
            self.task = self.bar.add_task(label, total=total)
            self.live.refresh()  # shown at least once, however quick the validation
        self.bar.update(self.task, completed=done, total=total)
        if phase.split(" ")[0] == "search" and done >= total:
            self.bar.remove_task(self.task)
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
