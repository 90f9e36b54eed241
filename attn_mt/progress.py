"""Progress displays on a terminal (with `rich`), nothing when stderr is a pipe or a file.

Used by `cli.py` only (and imported inside its commands, so that help stays fast): the library
reports progress through plain callbacks and log lines and never writes control characters.
Off a terminal these displays print nothing, so CI logs, pipes and `2> file` get exactly the
plain lines they always got.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
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


@contextlib.contextmanager
def sentences(total: int | None, label: str) -> Iterator[Callable[[int], None]]:
    """Yield `advance(n)`; on a terminal, a bar of sentences done, sentences/s and ETA.

    `total` None (e.g. endless stdin) shows nothing, as does a stderr that is not a terminal.
    """
    if total is None or not on_terminal():
        yield lambda n: None
        return
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("sentences"),
        RateColumn("sent/s"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(label, total=total)
        yield lambda n: bar.advance(task, n)
