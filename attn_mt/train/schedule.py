"""The learning-rate schedule: a pure function of the update number, the training time spent and
the train config, so a resumed run needs no scheduler state to continue where it stopped."""

from __future__ import annotations

import math

from attn_mt.config import TrainConfig

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
