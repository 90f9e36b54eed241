"""An update read one update later: the loop queues update k+1 on the device before it reads
update k's figures (loss, tokens, gradient norm, NaN/inf), so the host never makes the device
wait between updates (nanoGPT and torchtitan read the loss only when they log it).

What the host cannot know yet is decided on the device: update k+1's learning rate is that of
the next step if update k was taken, else of the same step again (a skipped update moves no
step), and the EMA follows a step only if it was taken. Before anything that needs the exact
state (a log line, a validation, a checkpoint, a stop), the loop reads the pending update
first, so a run trains, validates and resumes bit for bit as one that read every update at
once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from attn_mt import distributed
from attn_mt.config import TrainConfig
from attn_mt.train.schedule import learning_rate
from attn_mt.train.skips import Update


@dataclass
class Pending:
    """An update whose figures are still on the device."""

    figures: torch.Tensor  # float64: loss, nll, the ranks' agreement figures, tokens, grad norm
    finite: torch.Tensor  # bool: no NaN/inf, so the optimizer took the step
    lrs: tuple[float, float] = (0.0, 0.0)  # its lr: if the update before it was taken, or not
    after_pending: bool = False  # launched before the update before it was read (else lrs[0])

    def lr(self, before_taken: bool) -> float:
        """The learning rate it trained with, once the update before it is read."""
        return self.lrs[0] if before_taken or not self.after_pending else self.lrs[1]

    def read(self) -> tuple[Update, list[float]]:
        """The update's figures on the host (the one wait for the device), and the ranks'
        agreement figures that travelled with them."""
        figures = self.figures.tolist()
        loss, nll, tokens, grad_norm = *figures[:2], figures[-2], figures[-1]
        finite = math.isfinite(loss) and math.isfinite(nll) and math.isfinite(grad_norm)
        return Update(loss, nll, int(tokens), grad_norm, finite), figures[2:-2]


def read_at_once(step: int, train: TrainConfig, fp16: bool) -> bool:
    """Whether the update that makes `step` is read before the next is queued: when that step
    is logged, validated (its loss alone included) or the last of max_steps, and under fp16
    (the loss scale is read with the update); else it is read one update later."""
    logged = step % train.log_every == 0 or step % train.eval_every == 0
    return logged or train.checks_loss_alone(step) or step == train.max_steps or fp16


def learning_rates(
    step: int, train: TrainConfig, seconds: float, before: Pending | None
) -> tuple[float, float]:
    """The lr of the update after `step - 1` taken steps, after `seconds` of the schedule's
    clock: if `before` (launched, not read yet) is taken, and if it is skipped."""
    taken = learning_rate(step + (before is not None), train, seconds)
    return taken, learning_rate(step, train, seconds)


def chosen_lr(
    lrs: tuple[float, float], before: Pending | None, device: torch.device
) -> torch.Tensor:
    """The learning rate to give the optimizer, as a tensor on the device: `lrs[0]` when the
    update before is known (`before` is None), else whichever of `lrs` (taken, skipped) its
    NaN/inf flag picks. Always a tensor, so that every update reads its lr the same way (a
    resumed run's first update as the straight run's); float64 on the CPU, where the fused
    optimizer reads it as the Python float it replaces, float32 on a GPU, as its kernel reads
    it."""
    dtype = torch.float32 if device.type == "cuda" else torch.float64
    options = distributed.to_device(list(lrs), device).to(dtype)
    if before is None:
        return options[0]
    return torch.where(before.finite, options[0], options[1])
