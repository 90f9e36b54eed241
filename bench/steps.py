"""The two training steps the benchmarks time; nothing else trains in them.

- attn-mt's turns time the Trainer's own update, `attn_mt.train.loop.UpdateStep`, built as
  the Trainer builds it from a config's `train:` section (`trainer_step`: its objective,
  optimizer, gradient clipping and fp16 loss scaler), compiled as `train.compile: true`
  compiles it (`compile_step`) or, on the CPU, with its linear layers through oneDNN
  (`attn_mt.kernels.route_through_onednn` on the model first), as a run takes either.
- `PlainStep` is the one plain step, for what the Trainer's update cannot run: the reference
  `torch.nn.Transformer` (`bench/reference.py`), and any model's full (B, T, V) logits (the
  Trainer's objective, `SmoothedObjective`, takes attn-mt's Transformer alone and never makes
  the logits). It runs the logits' label-smoothed loss, normalised by the batch's target
  tokens, then the same clipping and optimizer step.

Either is a `Turn`: `turn(batches, phase=None)` makes one update per batch, returns the target
tokens and never waits for the device (a timed window synchronises at its edges:
`common.timed_window`). `phase(name)`, where given, is told as each phase of an update is
queued: `forward+loss`, `backward`, `clip+adamw` (the profiler's ranges, the host's lead).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from attn_mt.config.schema import TrainConfig
from attn_mt.data.batching import Batch
from attn_mt.model.loss import SmoothedObjective, label_smoothed_loss
from attn_mt.model.transformer import Transformer
from attn_mt.precision import DTYPES, autocast_context, inductor_options
from attn_mt.train import speed
from attn_mt.train.loop import UpdateStep
from attn_mt.train.setup import make_optimizer, make_scaler
from attn_mt.train.state import WeightEMA
from attn_mt.world import World

Phase = Callable[[str], None]
Turn = Callable[..., int]  # (batches, phase=None) -> target tokens
LossOf = Callable[[nn.Module, Batch, "torch.dtype | None", float], torch.Tensor]


def trainer_step(
    model: Transformer,
    t: TrainConfig,
    precision: str,
    optimizer: torch.optim.Optimizer | None = None,
    ema: WeightEMA | None = None,
) -> UpdateStep:
    """The Trainer's update of `model` as a run of `t` in `precision` makes it (one process):
    its label-smoothed objective, AdamW (`optimizer` where several steps share one), the fp16
    loss scaler, `t.clip_norm`; `ema` updated after each step where given."""
    device = next(model.parameters()).device
    return UpdateStep(
        SmoothedObjective(model, t.label_smoothing),
        optimizer or make_optimizer(model, t),
        make_scaler(precision, device),
        ema,
        t.clip_norm,
        World(),
        DTYPES[precision],
    )


def compile_step(step: UpdateStep, batches: Sequence[Batch]) -> None:
    """Compile `step` as `train.compile: true` does (`speed.compile_choice`): the model through
    torch.compile with the device's Inductor options, the loss's chunks compiled on their own,
    a batch's dims dynamic. It compiles here, on one forward and backward of `batches` (the
    gradients dropped, the RNG as it was). A compilation that fails stops the benchmark: its
    figures would be eager ones."""
    step.forward, choice = speed.compile_choice("true", "", step.forward, batches, World())
    if choice.mode != "compiled":
        raise SystemExit("torch.compile failed (the warning above): nothing compiled to time")


@dataclass
class PhasedForward(speed.Forward):
    """A `Forward` that tells `phase` as the forward is queued and as it returns (the
    backward is queued next)."""

    phase: Phase = field(default=lambda name: None)

    def __call__(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        self.phase("forward+loss")
        figures = super().__call__(batch)
        self.phase("backward")
        return figures


def trainer_updates(step: UpdateStep, batches: Sequence[Batch], phase: Phase | None = None) -> int:
    """A `Turn` of the Trainer's own update: `step.backward` and `step.apply` for each batch
    (one update a batch, as a run with train.accumulate 1); the target tokens."""
    forward = step.forward
    if phase is not None:  # told of the forward's two phases by the forward itself
        step.forward = PhasedForward(forward.objective, forward.module, forward.dtype,
                                     forward.compiled, phase)  # fmt: skip
    try:
        for batch in batches:
            tokens, sums = step.backward([batch])
            if phase is not None:
                phase("clip+adamw")
            step.apply(tokens, sums)
    finally:
        step.forward = forward
    return sum(batch.num_tgt_tokens for batch in batches)


def logits_loss(model: nn.Module, batch: Batch, dtype: torch.dtype | None, epsilon: float):
    """The full (B, T, V) logits of `model`, then their summed label-smoothed loss."""
    with autocast_context(batch.src.device, dtype):
        logits = model(batch.src, batch.tgt_in)  # (B, T, V)
    return label_smoothed_loss(logits, batch.tgt_out, epsilon)[0]


@dataclass
class PlainStep:
    """The one plain step (this module's docstring): `model`'s full logits and label-smoothed
    loss (`epsilon`) in autocast's `dtype` (None: float32), normalised by the batch's target
    tokens, the gradients clipped to `clip_norm`, then `optimizer`'s step. `compiled`: the
    model and its loss through torch.compile in one graph, with the device's Inductor
    options."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    dtype: torch.dtype | None
    clip_norm: float = 1.0
    epsilon: float = 0.1
    compiled: bool = False
    loss_of: LossOf = field(init=False)

    def __post_init__(self) -> None:
        device_type = next(self.model.parameters()).device.type
        options = inductor_options(device_type) or None  # None: what any backend takes
        self.loss_of = torch.compile(logits_loss, options=options) if self.compiled else logits_loss

    def __call__(self, batches: Sequence[Batch], phase: Phase | None = None) -> int:
        """A `Turn`: one update per batch; the target tokens."""
        tell = phase or (lambda name: None)
        for batch in batches:
            tell("forward+loss")
            loss = self.loss_of(self.model, batch, self.dtype, self.epsilon)
            tell("backward")
            (loss / batch.num_tgt_tokens).backward()
            tell("clip+adamw")
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip_norm or float("inf"))
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        return sum(batch.num_tgt_tokens for batch in batches)
