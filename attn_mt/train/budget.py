"""A run's budget and the rules that stop it: the learning rate, a pure function of the update
number, the config and the run's time, so a resume needs no scheduler state (`learning_rate`);
the run's time (`RunClock`: what is left of max_minutes, where this process's time went); the
stopping rules (`stop_rules`) and, under torchrun, the ranks' agreement on them
(`RankAgreement`), so all ranks stop at the same update and set the same lr; Ctrl-C and SIGTERM
(`StopSignals`); updates skipped for NaN/inf, too many of which in a row end a run (`SkipRule`).
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
from pathlib import Path
from typing import Any

import torch

from attn_mt import distributed
from attn_mt.config import TrainConfig
from attn_mt.errors import UserError
from attn_mt.fileio import Terminated
from attn_mt.train.state import TrainProgress

log = logging.getLogger("attn_mt")

# The stopping rules whose value can differ between ranks (a signal, the clock, rank 0's
# validations): under torchrun every rank takes any rank's.
RANK_RULES = ("early stopping", "signal", "max_minutes")
# Before any validation, max_minutes keeps back this share of the budget, at most RESERVE_CAP
# seconds, for the final validation (a 2-minute budget keeps back 18 s).
RESERVE_SHARE, RESERVE_CAP = 0.15, 120.0
# A second signal sooner than this is the first one delivered again (a terminal signals torchrun
# and its workers, and torchrun passes its copy on to them), not a user asking to stop at once.
REPEAT_SECONDS = 1.0
# fp16: below this loss scale the gradients overflow whatever the scale, and the run has
# diverged (fairseq's --min-loss-scale). From GradScaler's 2^16 it takes ~30 overflows in a row.
MIN_LOSS_SCALE = 1e-4


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


class TrainingDiverged(UserError):
    """The loss stayed NaN/inf for `train.max_nonfinite` updates in a row, or fp16's loss scale
    fell below MIN_LOSS_SCALE."""

    @classmethod
    def after(cls, what: str, step: int, last: Path, advice: str) -> TrainingDiverged:
        """The error once `what` happened at `step`."""
        kept = (
            f"the last good checkpoint is kept: {last}"
            if last.is_file()
            else "no checkpoint had been written yet"
        )
        return cls(f"{what} at step {step}; {advice} ({kept})")


@dataclass
class Update:
    """What one optimizer update did, summed over all processes."""

    loss: float  # summed label-smoothed loss
    nll: float  # summed negative log-likelihood
    tokens: int  # target tokens
    grad_norm: float
    finite: bool  # False: NaN/inf in the loss or a gradient, the update was skipped


@dataclass
class SkipRule:
    """Counts skipped updates in a row and ends the run when there are too many.

    A NaN/inf loss or gradient leaves the weights, the optimizer, the step count, the learning
    rate and the EMA as they were (fairseq does not count such a step). Under fp16 an overflowed
    gradient is GradScaler's normal way to find its scale, so it is counted apart: the run ends
    only when the scale falls below MIN_LOSS_SCALE.
    """

    max_nonfinite: int  # train.max_nonfinite
    scaler: torch.amp.GradScaler | None
    last: Path  # last.pt, named in the error
    # Waits for the checkpoint write in flight (CheckpointWriter.wait), so that the error names
    # last.pt when a save before the divergence is still landing in the background.
    settle: Callable[[], None]
    nonfinite: int = 0  # updates in a row skipped for a NaN/inf loss
    overflows: int = field(default=0)  # fp16 updates in a row skipped for overflowed gradients

    def accept(self, update: Update, step: int) -> bool:
        """False for a skipped update; raises TrainingDiverged when too many came in a row."""
        if update.finite:
            self.nonfinite = self.overflows = 0
            return True
        if self.scaler is not None and math.isfinite(update.loss + update.nll):
            self.overflows += 1
            scale = self.scaler.get_scale()  # already halved by GradScaler.update
            log.info(
                "step %d: fp16 gradients overflowed; update skipped, loss scale %g", step, scale
            )
            if scale < MIN_LOSS_SCALE:
                raise self._diverged(
                    f"fp16 gradients overflowed for {self.overflows} updates in a row and the "
                    f"loss scale fell to {scale:g} (below {MIN_LOSS_SCALE:g})",
                    step,
                    "train with precision bf16 or fp32, or lower train.lr",
                )
            return False
        self.nonfinite += 1
        log.warning(
            "step %d: non-finite loss or gradient; update skipped (%d in a row)",
            step,
            self.nonfinite,
        )
        if self.nonfinite >= max(self.max_nonfinite, 1):
            raise self._diverged(
                f"the loss was NaN/inf for {self.nonfinite} updates in a row",
                step,
                "lower train.lr or check the data",
            )
        return False

    def _diverged(self, what: str, step: int, advice: str) -> TrainingDiverged:
        """The error, once the checkpoint write in flight has landed (so it names last.pt
        when a save from before the divergence was still being written)."""
        self.settle()
        return TrainingDiverged.after(what, step, self.last, advice)
