"""The batches of a training process, epoch after epoch (`ShardBatches`), from a resumable
position: each corpus taken as often as its weight says, the epoch's batches bucketed by length
(`batching.bucket_batches`) and shuffled, each rank taking its share, subword regularization
drawn per batch (`Resampler`).

The batches' order is a pure function of (seed, epoch), which is what makes exact resume and
agreement between DDP ranks possible without storing any sampler state: the source's position
is two numbers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from attn_mt.config.schema import Config
from attn_mt.data.batching import Batch, bucket_batches, collate, padding_fraction
from attn_mt.data.shards import Shards, mix_weights
from attn_mt.data.tokenizer import Tokenizer
from attn_mt.distributed import World
from attn_mt.errors import DataError


def epoch_order(
    lengths: Sequence[tuple[int, int]] | np.ndarray,
    batch_tokens: int,
    seed: int,
    epoch: int,
    rank: int = 0,
    world_size: int = 1,
) -> list[np.ndarray]:
    """This rank's batches of one epoch, in a shuffled order fixed by (seed, epoch).

    Every rank computes the same global list and takes every `world_size`-th batch; the list is
    cut to a multiple of `world_size` so all ranks do the same number of steps (no deadlock).
    """
    gen = torch.Generator().manual_seed(seed * 100_003 + epoch)
    tie_order = torch.randperm(len(lengths), generator=gen).numpy()
    batches = bucket_batches(lengths, batch_tokens, tie_order)
    shuffled = [batches[i] for i in torch.randperm(len(batches), generator=gen).tolist()]
    usable = len(shuffled) - len(shuffled) % world_size
    return shuffled[rank:usable:world_size]


@dataclass
class Resampler:
    """Subword regularization of a batch (`tokenizer.sampling_alpha`): its pairs' best
    segmentations, as the shards hold them, decoded to text and encoded again with a sampled one.

    The seed is the batch's place in the data (seed, epoch, batch, rank), so a resumed run
    samples what the straight run would have. The batch was cut by the best segmentations'
    lengths, and its padded width is that of its longest sentence: so that one long sample
    does not widen the whole batch, a sampled sentence keeps its best segmentation when it is
    longer than the batch's longest best one plus 10% (at least 2 pieces), or than
    `data.max_len` (figures: docs/performance.md).
    """

    tokenizers: tuple[Tokenizer, Tokenizer]
    alpha: float
    max_len: int

    def collate(self, shards: Shards, rows: np.ndarray, seed: int) -> Batch:
        sides = []
        for tokenizer, view in zip(self.tokenizers, (shards.src, shards.tgt), strict=True):
            best = [view[row] for row in rows]
            sampled = tokenizer.sample(tokenizer.decode(best), self.alpha, seed)
            width = max(map(len, best))
            limit = min(width + max(2, width // 10), self.max_len)
            sides.append(
                [s if 0 < len(s) <= limit else b for s, b in zip(sampled, best, strict=True)]
            )
        batch = collate(sides[0], sides[1], range(len(rows)))
        batch.ids = rows.tolist()
        return batch


def batch_seed(*place: int) -> int:
    """A 32-bit seed for SentencePiece from a batch's place (seed, epoch, batch, rank)."""
    return int(np.random.SeedSequence(list(place)).generate_state(1)[0])


class ShardBatches:
    """This rank's batches from the shards, epoch after epoch, from a resumable position.

    An epoch takes each corpus `weight` times: whole passes, plus for a fractional weight a
    subset drawn anew each epoch (seeded by seed, epoch and corpus). With every weight 1 the
    epoch is the corpus itself and the batches are `epoch_order` of its lengths.
    """

    def __init__(
        self,
        shards: Shards,
        weights: Sequence[float],
        batch_tokens: int,
        seed: int,
        world: World = World(),
        resampler: Resampler | None = None,
    ):
        self.shards, self.weights = shards, list(weights)
        self.resampler = resampler
        self.batch_tokens, self.seed, self.world = batch_tokens, seed, world
        counts = np.bincount(shards.corpus, minlength=len(self.weights))
        check_epoch(self.weights, counts)
        self.starts = np.concatenate([[0], np.cumsum(counts)])  # corpora are stored in order
        self.epoch, self.index = 0, 0  # the position: batches handed out by `next`
        self.rescaled = ""  # how a position saved by another process count was mapped
        self._orders: dict[int, list[np.ndarray]] = {}  # epoch -> its batches (two at most)
        self._ready: list[Batch] = []  # the batches after the position, made by `prepare`

    @classmethod
    def from_config(cls, cfg: Config, shards: Shards, world: World) -> ShardBatches:
        """The source of `cfg`'s weights, batch budget, seed and subword sampling for this
        process."""
        alpha = cfg.tokenizer.sampling_alpha
        resampler = Resampler(shards.tokenizers(), alpha, cfg.data.max_len) if alpha else None
        t = cfg.train
        weights = mix_weights(shards, cfg.data.weights(), cfg.data.temperature)
        return cls(shards, weights, t.batch_tokens, t.seed, world, resampler)

    @property
    def batches(self) -> list[np.ndarray]:
        """This rank's batches (rows) of the current epoch, computed once per epoch."""
        return self._epoch_batches(self.epoch)

    def _epoch_batches(self, epoch: int) -> list[np.ndarray]:
        """This rank's batches of `epoch`; the current and the next epoch's are kept, as
        batches prepared ahead may come from the next one."""
        if epoch not in self._orders:
            self._orders = {e: b for e, b in self._orders.items() if e == epoch - 1}
            self._orders[epoch] = self._batches(epoch)
        return self._orders[epoch]

    def epoch_rows(self, epoch: int) -> np.ndarray:
        """The pairs of one epoch (with repeats), before batching."""
        if all(w == 1 for w in self.weights):
            return np.arange(len(self.shards))
        parts = []
        for c, weight in enumerate(self.weights):
            start, end = int(self.starts[c]), int(self.starts[c + 1])
            parts += [np.arange(start, end)] * int(weight)
            extra = round((weight - int(weight)) * (end - start))
            if extra:
                rng = np.random.default_rng([self.seed, epoch, c])
                parts.append(start + np.sort(rng.choice(end - start, extra, replace=False)))
        return np.concatenate(parts)

    def _batches(self, epoch: int) -> list[np.ndarray]:
        rows = self.epoch_rows(epoch)
        lengths = self.shards.lengths[rows] + 1  # + <eos>: what the batch holds
        batches = epoch_order(
            lengths, self.batch_tokens, self.seed, epoch, self.world.rank, self.world.size
        )
        if not batches:
            raise DataError(
                f"the training data makes fewer batches than the {self.world.size} processes; "
                "lower train.batch_tokens or use fewer processes"
            )
        return [rows[positions] for positions in batches]

    def first_batches(self, count: int) -> list[Batch]:
        """The current epoch's first `count` batches, made apart from the position (a sample)."""
        return [collate(self.shards.src, self.shards.tgt, rows) for rows in self.batches[:count]]

    @property
    def epochs_done(self) -> int:
        """Whole epochs consumed so far."""
        return self.epoch + (1 if self.index >= len(self.batches) else 0)

    @property
    def epochs_run(self) -> float:
        """Epochs consumed so far, the current one's share included (for the ETA)."""
        return self.epoch + self.index / len(self.batches)

    def next(self) -> Batch:
        """The next batch of this rank (prepared ahead, if it was), moving to the next epoch at
        the end of one."""
        self.epoch, self.index = self._place(self.epoch, self.index)
        batch = self._ready.pop(0) if self._ready else self._make(self.epoch, self.index)
        self.index += 1
        return batch

    def prepare(self, count: int, place: Callable[[Batch], Batch]) -> None:
        """Make the `count` batches after those already prepared now, each passed through
        `place` (a copy to the GPU, started while the GPU is still busy), for `next` to hand
        out. The position does not move: a checkpoint saved meanwhile resumes at the batch
        `next` gives next, and the batches made again are the same (a batch is a function of
        its place)."""
        epoch, index = self.epoch, self.index + len(self._ready)
        for _ in range(count):
            epoch, index = self._place(epoch, index)
            self._ready.append(place(self._make(epoch, index)))
            index += 1

    def _place(self, epoch: int, index: int) -> tuple[int, int]:
        """The place of batch `index` of `epoch`, past an epoch's end the next one's first."""
        return (epoch + 1, 0) if index >= len(self._epoch_batches(epoch)) else (epoch, index)

    def _make(self, epoch: int, index: int) -> Batch:
        """Batch `index` of `epoch`, subword-sampled with a seed of its place if asked."""
        rows = self._epoch_batches(epoch)[index]
        if self.resampler is None:
            return collate(self.shards.src, self.shards.tgt, rows)
        seed = batch_seed(self.seed, epoch, index + 1, self.world.rank)
        return self.resampler.collate(self.shards, rows, seed)

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "index": self.index, "world_size": self.world.size}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Go to a saved position; from another process count, keep the share of the epoch's
        global order already seen (rounded up: a few batches may be skipped, none repeated)."""
        index, saved_world = state["index"], state.get("world_size", 1)
        if saved_world != self.world.size:
            index = -(-index * saved_world // self.world.size)
            self.rescaled = (
                f"resuming a {saved_world}-process run with {self.world.size} processes: "
                f"epoch {state['epoch']} continues at batch {index}"
            )
        self.epoch, self.index = state["epoch"], index
        self._ready = []

    def describe(self) -> str:
        """Batches per epoch and the padding share of the first 50 (for the start-up log)."""
        per = " per process" if self.world.size > 1 else ""
        padding = 100 * padding_fraction(self.first_batches(50))
        line = f"{len(self.batches)} batches per epoch{per}, padding {padding:.1f}%"
        if self.resampler:
            line += f", segmentations sampled (alpha {self.resampler.alpha:g})"
        return f"{line}; {self.rescaled}" if self.rescaled else line


MAX_EPOCH_PAIRS = 2**31  # an epoch's row numbers, held in memory at once


def check_epoch(weights: Sequence[float], counts: np.ndarray) -> None:
    """Refuse weights that give an epoch too large to hold, or a corpus none of its pairs."""
    size = sum(w * int(n) for w, n in zip(weights, counts, strict=True))
    if size > MAX_EPOCH_PAIRS:
        raise DataError(
            f"data.train: the weights give an epoch of {size:,.0f} pairs (weight x pairs kept); "
            f"at most {MAX_EPOCH_PAIRS:,}: lower the weights"
        )
    for i, (weight, count) in enumerate(zip(weights, counts, strict=True)):
        if count and int(weight) * count + round((weight - int(weight)) * count) < 1:
            raise DataError(
                f"data.train[{i}].weight: {weight:g} of {count} pairs is no pair per epoch; "
                f"give at least {1 / count:.3g}"
            )
