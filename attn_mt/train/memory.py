"""GPU memory: the worst-shaped batch a run can meet, tried once at start-up; the peak in the
step log; running out of memory as one line that says which key to change.

Batches come in a random order, so without the start-up probe the largest could come hours
into a run and end it with a traceback.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import numpy as np
import torch

from attn_mt.config import TrainConfig
from attn_mt.data.batching import Batch, ShardBatches, collate
from attn_mt.errors import UserError
from attn_mt.model.transformer import Transformer
from attn_mt.precision import autocast_context
from attn_mt.train.loss import SmoothedObjective

log = logging.getLogger("attn_mt")

GIB = 2**30


class OutOfMemory(UserError):
    """The GPU ran out of memory: the batch is too large for it."""


@contextlib.contextmanager
def out_of_memory_hint(t: TrainConfig) -> Iterator[None]:
    """Turn torch's OutOfMemoryError into one line naming train.batch_tokens."""
    try:
        yield
    except torch.OutOfMemoryError as err:
        said = str(err).strip().split(". ")[0][:160]
        raise OutOfMemory(
            f"out of GPU memory ({said}); lower train.batch_tokens (now {t.batch_tokens}) and "
            f"raise train.accumulate (now {t.accumulate}) to keep the tokens per update, or "
            "train in bf16"
        ) from None


def worst_rows(source: ShardBatches) -> np.ndarray:
    """The rows of this process's batch of the current epoch with the most padded target
    positions, ties broken by padded source positions: its activations, kept for the backward
    over every layer, are the largest tensors of an update (the loss makes no (B, T, V)
    logits: `loss.projected_loss`)."""
    lengths = source.shards.lengths  # (N, 2) source, target tokens without <eos>

    def padded(rows: np.ndarray) -> tuple[int, int]:
        widths = lengths[rows].max(axis=0) + 1  # + <eos> (or <bos>)
        return len(rows) * int(widths[1]), len(rows) * int(widths[0])

    return max(source.batches, key=padded)


def worst_batch(source: ShardBatches) -> Batch:
    """The batch of `worst_rows`, as training would see it (without subword sampling)."""
    return collate(source.shards.src, source.shards.tgt, worst_rows(source))


def probe(
    model: Transformer, batch: Batch, dtype: torch.dtype | None, label_smoothing: float
) -> None:
    """One forward and backward of `batch`, its gradients dropped and the RNG left as it was,
    so training is the same bit for bit with or without it."""
    device = next(model.parameters()).device
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        with autocast_context(device, dtype):
            objective = SmoothedObjective(model, label_smoothing)
            objective.tokens = batch.num_tgt_tokens
            loss, _ = objective(batch.src, batch.tgt_in, batch.tgt_out)
        loss.backward()
    model.zero_grad(set_to_none=True)


def probe_largest_batch(
    model: Transformer, source: ShardBatches, dtype: torch.dtype | None, label_smoothing: float
) -> None:
    """On a GPU: `probe` this process's largest batch, so a batch too large for the GPU fails
    at start-up rather than hours in, and log its peak memory; nothing on the CPU."""
    device = next(model.parameters()).device
    if device.type != "cuda":
        return
    batch = worst_batch(source)
    probe(model, batch.to(device), dtype, label_smoothing)
    log.info(
        "largest batch (%d x %d target positions): peak GPU memory %.2f GiB "
        "(the optimizer's state, twice the weights, comes on top at the first update)",
        *batch.tgt_out.shape,
        peak_gib(device),
    )


def peak_gib(device: torch.device) -> float | None:
    """The most GPU memory allocated so far, in GiB (None off the GPU)."""
    if device.type != "cuda":
        return None
    return torch.cuda.max_memory_allocated(device) / GIB
