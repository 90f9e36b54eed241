"""The learning rate: a pure function of the update number, the config and the run's time, so a
resume needs no scheduler state (`learning_rate`); with a time-driven schedule the time is the
run clock's (`clock.RunClock.schedule_seconds`, under torchrun the ranks' agreed mean:
`stopping.RankAgreement`). An update launched before the one before it was read gets both of
its possible rates, decided on the device (`learning_rates`, `chosen_lr`).
"""

from __future__ import annotations

import math

import torch

from attn_mt import distributed
from attn_mt.config.schema import TrainConfig

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
