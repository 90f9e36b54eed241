"""Updates skipped for a NaN/inf loss or gradient (`SkipRule`): the weights, the optimizer, the
step count, the learning rate and the EMA stay as they were; too many in a row, or fp16's loss
scale falling below MIN_LOSS_SCALE, end the run (`TrainingDiverged`). `Update` is what one
optimizer update did, as the loop reads it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from attn_mt.errors import UserError

log = logging.getLogger("attn_mt")

# fp16: below this loss scale the gradients overflow whatever the scale, and the run has
# diverged (fairseq's --min-loss-scale). From GradScaler's 2^16 it takes ~30 overflows in a row.
MIN_LOSS_SCALE = 1e-4


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
