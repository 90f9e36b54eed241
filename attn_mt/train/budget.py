"""A run's budget: the learning rate, a pure function of the update number, the config and the
run's time, so a resume needs no scheduler state (`learning_rate`); the run's time (`RunClock`:
what is left of max_minutes, the pace of its updates, the time a validation may take, where
this process's time went); the stopping rules (`stop_rules`) and, under torchrun, the ranks'
agreement on them (`RankAgreement`), so all ranks stop at the same update and set the same lr.
Ctrl-C and SIGTERM end a run early (`StopSignals`: the first stops after the update in flight
and saves, a second at once); updates skipped for a NaN/inf are `state.SkipRule`'s.
"""

from __future__ import annotations

import contextlib
import logging
import math
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from attn_mt import distributed
from attn_mt.config.schema import TrainConfig
from attn_mt.fileio import Terminated
from attn_mt.train.state import TrainProgress

log = logging.getLogger("attn_mt")

# A second signal sooner than this is the first one delivered again (a terminal signals torchrun
# and its workers, and torchrun passes its copy on to them), not a user asking to stop at once.
REPEAT_SECONDS = 1.0

# The stopping rules whose value can differ between ranks (a signal, the clock, rank 0's
# validations): under torchrun every rank takes any rank's.
RANK_RULES = ("early stopping", "signal", "max_minutes")
# Before any validation, max_minutes keeps back this share of the budget, at most RESERVE_CAP
# seconds, for the final validation (a 2-minute budget keeps back 18 s).
RESERVE_SHARE, RESERVE_CAP = 0.15, 120.0
# A validation takes at most this share of the budget, and never runs past its end
# (`RunClock.allowance`); of its allowance, SCORING_SHARE is kept for scoring and the plot.
VALID_SHARE, SCORING_SHARE = 0.15, 0.1
# The pace of updates follows a slower update at once (a machine loaded after the start must not
# run the last update past the deadline) and a faster one by this share of the difference.
PACE_WEIGHT = 0.3


# The shape of each decaying schedule: the share of (lr - min_lr) left at `progress` in [0, 1].
DECAYS = {
    "linear": lambda progress: 1.0 - progress,
    "cosine": lambda progress: 0.5 * (1.0 + math.cos(math.pi * progress)),
}


def learning_rate(step: int, train: TrainConfig, seconds: float = 0.0) -> float:
    """The learning rate of update number `step` (1-based) after `seconds` of training.

    inverse_sqrt: lr * min(step / warmup, sqrt(warmup / step))  (peak lr at step = warmup)
    linear:       linear warm-up, then min_lr + (lr - min_lr) * (1 - progress)
    cosine:       linear warm-up, then min_lr + (lr - min_lr) * (1 + cos(pi * progress)) / 2
    constant:     linear warm-up, then lr
    For linear and cosine, progress = (step - warmup) / (max_steps - warmup) with max_steps set;
    without it progress = seconds / (max_minutes * 60), the share of the time budget spent, and
    the lr is the lower of the warm-up ramp and the decay (the warm-up's end time is not known
    in advance), so it reaches min_lr exactly when the budget runs out, whatever the CPU.
    (The config refuses linear and cosine with neither length.)
    """
    warmup = max(train.warmup, 1)
    if train.schedule == "inverse_sqrt":
        return train.lr * min(step / warmup, math.sqrt(warmup / step))
    ramp = train.lr * min(step / warmup, 1.0)
    if train.schedule not in DECAYS:
        return ramp
    if not time_driven(train):
        if step < warmup:
            return ramp
        return _decayed(min((step - warmup) / max(train.max_steps - warmup, 1), 1.0), train)
    return min(ramp, _decayed(min(seconds / (train.max_minutes * 60), 1.0), train))


def _decayed(progress: float, train: TrainConfig) -> float:
    """The decaying schedule's lr at `progress` in [0, 1]: lr at 0, exactly min_lr at 1."""
    return train.min_lr + (train.lr - train.min_lr) * DECAYS[train.schedule](progress)


def time_driven(train: TrainConfig) -> bool:
    """True when the lr follows the time budget (linear or cosine with no max_steps)."""
    return train.schedule in DECAYS and train.max_steps <= 0


def learning_rates(
    step: int, train: TrainConfig, seconds: float, after: bool
) -> tuple[float, float]:
    """The lr of the update after `step - 1` taken steps and `seconds` of the schedule's clock,
    launched `after` an update not read yet (`loop.Pending`): if that one is taken, and if it
    is skipped (a skipped update moves no step)."""
    taken = learning_rate(step + after, train, seconds)
    return taken, learning_rate(step, train, seconds)


def chosen_lr(
    lrs: tuple[float, float], before_finite: torch.Tensor | None, device: torch.device
) -> torch.Tensor:
    """The learning rate to give the optimizer, as a tensor on the device: `lrs[0]` when the
    update before is known (`before_finite` None), else whichever of `lrs` (taken, skipped) its
    NaN/inf flag picks. Always a tensor, so that every update reads its lr the same way (a
    resumed run's first update as the straight run's); float64 on the CPU, where the fused
    optimizer reads it as the Python float it replaces, float32 on a GPU, as its kernel does."""
    dtype = torch.float32 if device.type == "cuda" else torch.float64
    options = distributed.to_device(list(lrs), device).to(dtype)
    if before_finite is None:
        return options[0]
    return torch.where(before_finite, options[0], options[1])


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

    def agreed(self, train: TrainConfig) -> float | None:
        """The run's time as the lr schedule reads it under torchrun with a time-driven lr: the
        ranks' mean clock as they last agreed on it, so all ranks set the same lr; else None
        (each rank reads its own)."""
        return self.seconds if self.world.distributed and time_driven(train) else None

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


class StopSignals:
    """The run's SIGINT/SIGTERM handlers (`installed` for the length of a run); `name` is the
    first signal's name once one came.

    The first signal stops the run after the update in flight, which then saves last.pt, and
    says so at once; a second stops at once: the checkpoint write in flight is abandoned (its
    temp file is removed as the stack unwinds), so last.pt stays the last one completed.
    """

    def __init__(self, abandon: Callable[[], None]):
        self.name: str | None = None
        self.at = 0.0  # time.monotonic() of the first signal
        self.abandon = abandon  # gives up the checkpoint write in flight (CheckpointWriter's)

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """The handlers in place for the block, the previous ones back however it ends."""
        previous = {sig: signal.signal(sig, self.handle) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def handle(self, signum: int, frame: Any) -> None:
        """The first SIGINT/SIGTERM notes the stop and says it saves; a second stops at once."""
        name = signal.Signals(signum).name
        again = "Ctrl-C" if signum == signal.SIGINT else name
        if self.name is None:
            self.name, self.at = name, time.monotonic()
            _say("%s: stopping: saving last.pt ... (%s again to stop at once)", name, again)
            return
        if time.monotonic() - self.at < REPEAT_SECONDS:
            return  # the same stop delivered twice: a terminal's Ctrl-C, then torchrun's copy
        _say("%s again: stopping at once; last.pt stays the last one completed", again)
        self.abandon()
        raise KeyboardInterrupt if signum == signal.SIGINT else Terminated(128 + signum)


def _say(message: str, *args: Any) -> None:
    """Log from a signal handler, on a thread of its own: the handler may have interrupted the
    main thread inside a write to the same log stream, which a second write from that thread
    would re-enter (`RuntimeError: reentrant call`); the thread waits for the stream's lock."""
    speaker = threading.Thread(target=log.info, args=(message, *args), name="attn-mt signal")
    speaker.start()
    speaker.join(timeout=1.0)  # at once, unless the main thread holds the stream
