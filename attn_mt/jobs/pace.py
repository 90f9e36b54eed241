"""How fast a translation job goes and when it ends (`Pace`), and how a caller shows it: a
`Progress`, given the number of lines to do, yields the job's `Pace` for as long as the job
runs (`attn-mt translate` draws a bar on a terminal from it; `unseen` shows nothing).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

Progress = Callable[[int | None], AbstractContextManager["Pace"]]


@dataclass
class Pace:
    """How fast a long decoding goes and when it ends, from all it has done since it began:
    not from a window of the last seconds, which jumps, as each chunk's lines are searched
    shortest first (a fast start, a slow end). The time left weighs each line by its length
    (`read`): the lines read and not yet done by theirs, the lines not yet read by the mean of
    those read; lines never `read` weigh one each. Lines an earlier run did (a resumed job's)
    are shown as done and left out of the pace."""

    total: int | None
    clock: Callable[[], float] = time.monotonic
    start: float = field(init=False)
    lines_read: int = 0
    weight_read: int = 0
    lines_done: int = 0
    weight_done: int = 0
    before: int = 0  # lines an earlier run did (`resumed`): shown as done, not in the pace
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

    def resumed(self, lines: int, weight: int | None = None) -> None:
        """`lines` were done by an earlier run: done, but no part of this run's pace;
        `weight`: theirs, where they were `read`."""
        self.before += lines
        if weight is not None:
            self.lines_read -= lines
            self.weight_read -= weight
        self.on_change()

    @property
    def shown(self) -> int:
        """The lines done, by this run and earlier ones: what a bar shows."""
        return self.before + self.lines_done

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
            unread = self.total - self.before - self.lines_read
            left = self.weight_read - self.weight_done + unread * mean
        else:
            left = self.total - self.before - self.weight_done
        return max(left, 0) * (self.clock() - self.start) / self.weight_done


def weight(line: str) -> int:
    """A line's share of the work: its characters, and one for the line."""
    return len(line) + 1


@contextlib.contextmanager
def unseen(total: int | None) -> Iterator[Pace]:
    """The `Progress` that shows nothing: the job's `Pace`, kept for no one."""
    yield Pace(total)
