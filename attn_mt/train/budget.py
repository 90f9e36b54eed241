"""The run's time budget and its stopping rules: `RunClock` (the run's time, what is left of
max_minutes, the time a time-driven lr reads, and where this process's time went),
`stop_rules` (each rule as this process sees it) and, under torchrun, `RankAgreement` (the
rules and the clock every rank takes, so all ranks stop at the same update and set the same
lr).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from attn_mt import distributed
from attn_mt.config import TrainConfig
from attn_mt.train.schedule import time_driven
from attn_mt.train.state import TrainProgress

# The stopping rules whose value can differ between ranks (a signal, the clock, rank 0's
# validations): under torchrun every rank takes any rank's.
RANK_RULES = ("early stopping", "signal", "max_minutes")
# Before any validation, max_minutes keeps back this share of the budget, at most RESERVE_CAP
# seconds, for the final validation (a 2-minute budget keeps back 18 s).
RESERVE_SHARE, RESERVE_CAP = 0.15, 120.0


@dataclass
class RunClock:
    """The run's time: what has passed since it began (start-up included, and on resume the
    earlier processes' time), what validating took, and so what is left of the run."""

    start: float  # now() at the run's beginning, earlier processes' time subtracted
    first_step: int  # the step this process resumed from (0 for a new run)
    last_validation: float = 0.0  # seconds the latest validation took (0: none yet)
    now: Callable[[], float] = time.monotonic  # tests pass a fake clock
    earlier: float = 0.0  # seconds the run's earlier processes took (0 for a new run)
    spent: dict[str, float] = field(default_factory=dict)  # this process's, by `phase`
    training_began: float = field(init=False)

    def __post_init__(self) -> None:
        self.training_began = self.now()

    @classmethod
    def of(cls, began: float, progress: TrainProgress, now: Callable[[], float]) -> RunClock:
        """The clock of a process that began at `began` (a `now()`) and goes on from
        `progress` (a new run's: step 0, no time yet); its training begins now."""
        elapsed = progress.elapsed
        return cls(
            began - elapsed, progress.step, progress.validation_seconds, now, earlier=elapsed
        )

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
        budget = t.max_minutes * 60
        reserve = self.last_validation or min(RESERVE_SHARE * budget, RESERVE_CAP)
        return budget - reserve

    def out_of_time(self, t: TrainConfig) -> bool:
        """Whether training must stop for max_minutes."""
        return bool(t.max_minutes) and self.elapsed() >= self.deadline(t)

    def schedule_seconds(self, t: TrainConfig) -> float:
        """The run's time as a time-driven lr schedule reads it: stretched so the budget's end
        falls on the deadline, where training stops, so the last update's lr is the floor."""
        if not t.max_minutes:
            return self.elapsed()
        return self.elapsed() * t.max_minutes * 60 / max(self.deadline(t), 1e-9)

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


def stop_rules(
    t: TrainConfig, progress: TrainProgress, signalled: bool, clock: RunClock, epochs_done: int
) -> dict[str, bool]:
    """Each stopping rule, as this process sees it now (the first that fires names the stop)."""
    return {
        "early stopping": bool(t.patience) and progress.bad_evals >= t.patience,
        "signal": signalled,
        "max_steps": t.max_steps > 0 and progress.step >= t.max_steps,
        "max_minutes": clock.out_of_time(t),
        "max_epochs": bool(t.max_epochs) and epochs_done >= t.max_epochs,
    }


class RankAgreement:
    """Under torchrun: RANK_RULES as all ranks last agreed on them, and the ranks' mean clock
    that a time-driven lr reads. Both travel in the all-reduce an update already makes
    (`figures` in, `take` out), or after a validation in one of their own (`settle`)."""

    def __init__(self, world: distributed.World, device: torch.device):
        self.world, self.device = world, device
        self.rules: list[bool] | None = None  # None: nothing agreed since the last stop check
        self.seconds = 0.0  # the ranks' mean schedule clock

    def figures(self, rules: dict[str, bool], seconds: float) -> list[float]:
        """What the ranks must agree on: each of RANK_RULES as this rank sees it, then its
        clock (`seconds`)."""
        return [*(float(rules[name]) for name in RANK_RULES), seconds]

    def take(self, sums: list[float]) -> None:
        """Read `figures` summed over the ranks: any rank's rule, the mean clock."""
        self.rules = [flag > 0 for flag in sums[: len(RANK_RULES)]]
        self.seconds = sums[len(RANK_RULES)] / self.world.size

    def schedule_seconds(self, clock: RunClock, train: TrainConfig) -> float:
        """The run's time as the lr schedule reads it: under torchrun with a time-driven lr the
        ranks' mean clock as they last agreed on it, so all ranks set the same lr; else this
        rank's own."""
        if self.world.distributed and time_driven(train):
            return self.seconds
        return clock.schedule_seconds(train)

    def forget(self) -> None:
        """Drop the agreed rules (after a validation: rank 0 alone knows whether it improved)."""
        self.rules = None

    def settle(self, rules: dict[str, bool], seconds: float) -> dict[str, bool]:
        """`rules` with RANK_RULES as every rank agrees on them: from the last update's
        all-reduce, or else from one all-reduce of their own; used once."""
        if self.rules is None:
            sums = distributed.sum_to_device(self.figures(rules, seconds), self.world, self.device)
            self.take(sums.tolist())
        assert self.rules is not None
        agreed = {**rules, **dict(zip(RANK_RULES, self.rules, strict=True))}
        self.rules = None
        return agreed
