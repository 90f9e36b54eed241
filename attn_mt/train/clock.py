"""The run's time (`RunClock`): what has passed since the run began (earlier processes' time
included on resume), what is left of max_minutes, the pace of the updates and which one is the
last, where this process's time went; the time one validation may take (`Allowance`); and how a
time is written (`clock`: h:mm:ss), in train.log and on the terminal alike. No torch here: the
CLI's progress display writes times with it.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from attn_mt.config.schema import TrainConfig

if TYPE_CHECKING:  # torch: the clock itself needs none
    from attn_mt.train.state import TrainProgress

# Before any validation, max_minutes keeps back this share of the budget, at most RESERVE_CAP
# seconds, for the final validation (a 2-minute budget keeps back 18 s).
RESERVE_SHARE, RESERVE_CAP = 0.15, 120.0
# A validation takes at most this share of the budget, and never runs past its end
# (`RunClock.allowance`); of its allowance, SCORING_SHARE is kept for scoring and the plot.
VALID_SHARE, SCORING_SHARE = 0.15, 0.1
# The pace of updates follows a slower update at once (a machine loaded after the start must not
# run the last update past the deadline) and a faster one by this share of the difference.
PACE_WEIGHT = 0.3


@dataclass
class RunClock:
    """The run's time: what has passed since it began (start-up included, and on resume the
    earlier processes' time), what validating took, the pace of the updates, and so what is
    left of the run and which update is its last."""

    start: float  # now() at the run's beginning, earlier processes' time subtracted
    first_step: int  # the step this process resumed from (0 for a new run)
    last_validation: float = 0.0  # seconds the latest validation took (0: none yet)
    now: Callable[[], float] = time.monotonic  # tests pass a fake clock
    earlier: float = 0.0  # seconds the run's earlier processes took (0 for a new run)
    pace: float = 0.0  # seconds an update takes lately (PACE_WEIGHT; 0: none measured yet)
    spent: dict[str, float] = field(default_factory=dict)  # this process's, by `phase`
    last_launch: float | None = None  # `updating()` when the latest update was launched
    final: bool = False  # the latest update launched was the last the budget holds
    training_began: float = field(init=False)

    def __post_init__(self) -> None:
        self.training_began = self.now()

    @classmethod
    def of(cls, began: float, progress: TrainProgress, now: Callable[[], float]) -> RunClock:
        """The clock of a process that began at `began` (a `now()`) and goes on from
        `progress` (a new run's: step 0, no time yet); its training begins now."""
        elapsed = progress.elapsed
        return cls(
            began - elapsed, progress.step, progress.validation_seconds, now, elapsed,
            progress.pace,
        )  # fmt: skip

    def record(self, progress: TrainProgress) -> None:
        """Note the run's time and pace in `progress`, which last.pt keeps for a resume."""
        progress.elapsed, progress.pace = self.elapsed(), self.pace

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Count the time inside towards `name` (a validation, the checkpoints) in this
        process's `timesheet`."""
        began = self.now()
        try:
            yield
        finally:
            self.spent[name] = self.spent.get(name, 0.0) + self.now() - began

    def timesheet(self) -> dict[str, float]:
        """This process's seconds so far: its start-up (until training began: the data, the
        model, the compile choice), then the updates (all that no `phase` took) and each
        phase's, by name."""
        start_up = self.training_began - self.start - self.earlier
        sheet = {"start-up": start_up, "updates": self.updating()}
        return sheet | dict(sorted(self.spent.items()))

    def updating(self) -> float:
        """This process's seconds on updates: since training began, less every `phase`."""
        return self.now() - self.training_began - sum(self.spent.values())

    def elapsed(self) -> float:
        """Seconds the run has taken so far."""
        return self.now() - self.start

    def validated(self, seconds: float) -> None:
        """A validation took `seconds` (its time is counted by `phase`; this one sets the
        deadline's reserve)."""
        self.last_validation = seconds

    def deadline(self, t: TrainConfig) -> float:
        """The run's second at which max_minutes stops training: the budget less the time the
        final validation will take, so the run ends within it. That is as long as the latest
        validation took; before the first one (a short run may end before it), an estimate:
        RESERVE_SHARE of the budget, at most RESERVE_CAP seconds. Both come from the config and
        `last_validation`, which last.pt keeps, so a resumed run has the same deadline."""
        return t.max_minutes * 60 - self.reserve(t)

    def reserve(self, t: TrainConfig) -> float:
        """The seconds a validation is taken to last (`deadline`)."""
        return self.last_validation or min(RESERVE_SHARE * t.max_minutes * 60, RESERVE_CAP)

    def out_of_time(self, t: TrainConfig) -> bool:
        """Whether training must stop for max_minutes: the update launched last was the last
        one the budget holds (`launch`), or the next would end past the deadline at this pace
        (where the pace grew faster than it was followed)."""
        late = self.elapsed() + self.pace >= self.deadline(t)
        return bool(t.max_minutes) and (self.final or late)

    def schedule_seconds(self, t: TrainConfig, validation_due: bool = False) -> float:
        """The run's time as a time-driven lr schedule reads it for an update launched now:
        when the update after it would end (at this pace, after the validation `due` after
        this one), stretched so that the deadline falls on the budget's end. An update whose
        next would end past the deadline is the last, and its lr is the floor."""
        if not t.max_minutes:
            return self.elapsed()
        after_next = self.elapsed() + 2 * self.pace + validation_due * self.reserve(t)
        return t.max_minutes * 60 * (after_next / max(self.deadline(t), 1e-9))  # exact at it

    def launch(self, t: TrainConfig, validation_due: bool, agreed: float | None = None) -> float:
        """An update is launched now: follow the pace (its time since the latest launch, less
        any `phase`), and return the seconds its lr reads (`schedule_seconds`, or under
        torchrun the ranks' `agreed` mean); an update at the budget's end is the last."""
        updating = self.updating()
        if self.last_launch is not None:
            took = updating - self.last_launch
            self.pace = took if took > self.pace else self.pace + PACE_WEIGHT * (took - self.pace)
        self.last_launch = updating
        seconds = self.schedule_seconds(t, validation_due) if agreed is None else agreed
        self.final = bool(t.max_minutes) and seconds >= t.max_minutes * 60
        return seconds

    def allowance(self, t: TrainConfig) -> Allowance | None:
        """The time a validation starting now may take: what is left of max_minutes, at most
        VALID_SHARE of it (None without max_minutes: a validation takes what it takes)."""
        if not t.max_minutes:
            return None
        budget = t.max_minutes * 60
        return Allowance(min(budget - self.elapsed(), VALID_SHARE * budget), self.now)

    def holds(self, seconds: float, t: TrainConfig) -> bool:
        """Whether `seconds` more end within max_minutes (always without it)."""
        return not t.max_minutes or self.elapsed() + seconds <= t.max_minutes * 60

    def remaining(self, t: TrainConfig, step: int, epochs: float) -> float | None:
        """Seconds left until the run ends, its final validation included: the first of
        max_steps, max_minutes and max_epochs, at this process's pace of updates and
        validations (`epochs` may be fractional); None without such a budget."""
        left = []
        if t.max_minutes:
            left.append(t.max_minutes * 60 - self.elapsed())
        steps_left = []
        if t.max_steps > 0:
            steps_left.append(t.max_steps - step)
        if t.max_epochs and epochs:
            steps_left.append(math.ceil((t.max_epochs - epochs) * step / epochs))
        done = step - self.first_step
        if steps_left and done > 0:
            training = self.updating()
            last = step + min(steps_left)  # the step the run ends at
            validations = last // t.eval_every - step // t.eval_every
            validations += last % t.eval_every != 0  # the final one, unless it falls due anyway
            left.append(min(steps_left) * training / done + validations * self.last_validation)
        return max(min(left), 0.0) if left else None


@dataclass
class Allowance:
    """The time one validation may take (`seconds` from when it is made, on the run's clock),
    and how many more sentences fit in what is left of it (`fits`)."""

    seconds: float
    now: Callable[[], float]
    began: float = field(init=False)

    def __post_init__(self) -> None:
        self.began = self.now()

    def left(self) -> float:
        """Seconds left to validate, SCORING_SHARE of the allowance kept for what follows."""
        return (1 - SCORING_SHARE) * self.seconds - (self.now() - self.began)

    def fits(self, done: int, wanted: int) -> int:
        """How many of `wanted` more sentences fit in the time left, at the pace of the `done`
        so far (0: none)."""
        spent, left = self.now() - self.began, self.left()
        if left <= 0:
            return 0
        return wanted if spent <= 0 else min(wanted, int(done * left / spent))

    def part(self, parts: int) -> Allowance:
        """An equal share of the time left, for one of `parts` that share it (a direction)."""
        return Allowance(max(self.seconds - (self.now() - self.began), 0.0) / parts, self.now)


def clock(seconds: float | None, unknown: str = "?") -> str:
    """h:mm:ss (m:ss under an hour); `unknown` for None."""
    if seconds is None:
        return unknown
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"
