"""What ends a run before its budget does: Ctrl-C and SIGTERM (`StopSignals`: the first stops
after the update in flight and saves, a second at once), and updates skipped for a NaN/inf
loss or gradient, too many of which in a row end the run (`SkipRule`, `TrainingDiverged`).
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

from attn_mt.errors import UserError
from attn_mt.fileio import Terminated

log = logging.getLogger("attn_mt")

# A second signal sooner than this is the first one delivered again (a terminal signals torchrun
# and its workers, and torchrun passes its copy on to them), not a user asking to stop at once.
REPEAT_SECONDS = 1.0
# fp16: below this loss scale the gradients overflow whatever the scale, and the run has
# diverged (fairseq's --min-loss-scale). From GradScaler's 2^16 it takes ~30 overflows in a row.
MIN_LOSS_SCALE = 1e-4


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
