"""An exponential moving average (EMA) of a model's weights, as Marian's exponential smoothing:
after every update avg <- decay * avg + (1 - decay) * weights. Validation, best.pt and
translation use the average; training never reads it, so it changes no training bit.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn


class WeightEMA:
    """The moving average of `model`'s parameters, held as a frozen copy of the model (so it
    validates and saves like one: tied weights stay tied, buffers come along)."""

    def __init__(self, model: nn.Module, decay: float):
        if not 0.0 < decay < 1.0:
            raise ValueError(f"EMA decay {decay} must be in (0, 1)")
        self.decay = decay
        self.model = copy.deepcopy(model).eval().requires_grad_(False)
        # parameters() yields tied tensors once, in the same order in the model and its copy.
        self._averages: list[torch.Tensor] = list(self.model.parameters())
        self._weights: list[torch.Tensor] = list(model.parameters())

    @torch.no_grad()
    def update(self, taken: torch.Tensor | None = None) -> None:
        """avg <- avg + (1 - decay) * (weights - avg), in place, all tensors in one call; with
        `taken` (a bool on the device: the optimizer took the step) only if it is true, decided
        on the device (a weight of 0 leaves every average exactly as it was)."""
        weight = 1.0 - self.decay
        if taken is None:
            torch._foreach_lerp_(self._averages, self._weights, weight)
        else:
            # One 0-d weight per tensor: a tensor as the scalar weight would be read back to
            # the host (`.item()`), a wait for the GPU.
            gated = taken.to(self._averages[0].dtype) * weight
            torch._foreach_lerp_(self._averages, self._weights, [gated] * len(self._averages))

    def state_dict(self) -> dict[str, Any]:
        """The averaged weights as the model's state_dict."""
        return self.model.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from saved averaged weights."""
        self.model.load_state_dict(state)
