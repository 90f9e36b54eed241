"""A GPU's memory in training: the largest batch tried once at start-up
(`probe_largest_batch`): batches come in a random order, so without the probe the largest could
come hours into a run and end it with a traceback; running out of memory as one line naming the
key to change (`out_of_memory_hint`); the peak so far, for the training line (`peak_gib`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import numpy as np
import torch

from attn_mt.config.schema import TrainConfig
from attn_mt.data.batching import Batch, collate
from attn_mt.data.epochs import ShardBatches
from attn_mt.errors import UserError
from attn_mt.model.loss import SmoothedObjective
from attn_mt.model.transformer import Transformer
from attn_mt.train.speed import Forward
from attn_mt.train.state import fork_rng

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
    logits: `projected_loss` in model/loss.py)."""
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
    objective = SmoothedObjective(model, label_smoothing)
    with fork_rng(device):
        loss, _ = Forward(objective, objective, dtype)(batch)
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
