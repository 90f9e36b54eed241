"""The learning-rate schedule: a pure function of the update number and the train config,
so a resumed run needs no scheduler state to continue exactly where it stopped."""

from __future__ import annotations

import math

from attn_mt.config import TrainConfig


def learning_rate(step: int, train: TrainConfig) -> float:
    """The learning rate of update number `step` (1-based).

    inverse_sqrt: lr * min(step / warmup, sqrt(warmup / step))  (peak lr at step = warmup)
    cosine:       linear warm-up, then min_lr + (lr - min_lr) * (1 + cos(pi * progress)) / 2
    constant:     linear warm-up, then lr
    (The config refuses cosine without train.max_steps, the length it decays over.)
    """
    warmup = max(train.warmup, 1)
    if train.schedule == "inverse_sqrt":
        return train.lr * min(step / warmup, math.sqrt(warmup / step))
    if step < warmup:
        return train.lr * step / warmup
    if train.schedule == "cosine":
        progress = min((step - warmup) / max(train.max_steps - warmup, 1), 1.0)
        return train.min_lr + (train.lr - train.min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))
    return train.lr
