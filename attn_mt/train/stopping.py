"""When a run stops: the stopping rules as this process sees them (`stop_rules`); under
torchrun the ranks' agreement on them (`RankAgreement`), so all ranks stop at the same update
and set the same lr; Ctrl-C and SIGTERM (`StopSignals`: the first stops after the update in
flight and saves, a second at once). Updates skipped for a NaN/inf are `skips.SkipRule`'s.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from attn_mt import distributed
from attn_mt.config.schema import TrainConfig
from attn_mt.fileio import Terminated
from attn_mt.train.clock import RunClock
from attn_mt.train.schedule import time_driven
from attn_mt.train.state import TrainProgress

log = logging.getLogger("attn_mt")

# A second signal sooner than this is the first one delivered again (a terminal signals torchrun
# and its workers, and torchrun passes its copy on to them), not a user asking to stop at once.
REPEAT_SECONDS = 1.0

# The stopping rules whose value can differ between ranks (a signal, the clock, rank 0's
# validations): under torchrun every rank takes any rank's.
RANK_RULES = ("early stopping", "signal", "max_minutes")


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
