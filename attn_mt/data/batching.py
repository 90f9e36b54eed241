"""Batches: one padded `Batch` type, one collate, length buckets, and the batch source that
hands a training process its batches epoch after epoch.

Batches are bucketed by length so padding stays small, and their order is a pure function of
(seed, epoch), which is what makes exact resume and agreement between DDP ranks possible
without storing any sampler state: the source's position is two numbers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from attn_mt.config.schema import Config
from attn_mt.data.shards import Shards, TokenView, mix_weights
from attn_mt.data.tokenizer import Tokenizer
from attn_mt.distributed import World
from attn_mt.errors import DataError
from attn_mt.model.vocab import BOS_ID, EOS_ID, PAD_ID


@dataclass
class Batch:
    """A padded batch. Decoder input is `<bos> y1..yn`, target `y1..yn <eos>` (teacher forcing)."""

    src: torch.Tensor  # (B, S) source ids ending in <eos>, right-padded
    tgt_in: torch.Tensor  # (B, T) <bos> y1 .. yn
    tgt_out: torch.Tensor  # (B, T) y1 .. yn <eos>
    ids: list[int]  # corpus indices of the rows
    # Non-pad target tokens, the denominator of the loss: counted from the lengths when the
    # batch is made, so no one reads it back from a GPU (a host sync per batch).
    num_tgt_tokens: int

    def to(self, device: torch.device) -> Batch:
        """The same batch on `device`; to a GPU from pinned memory, so the copy is asynchronous
        (from pageable memory `non_blocking` copies synchronously)."""
        cuda = device.type == "cuda"
        src, tgt_in, tgt_out = (
            (t.pin_memory() if cuda and t.device.type == "cpu" else t).to(device, non_blocking=cuda)
            for t in (self.src, self.tgt_in, self.tgt_out)
        )
        return Batch(src, tgt_in, tgt_out, self.ids, self.num_tgt_tokens)


def pad_sequences(seqs: Sequence[Sequence[int]], pad_id: int) -> torch.Tensor:
    """Right-pad lists of ids into a (B, L) long tensor."""
    width = max(len(s) for s in seqs)
    out = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    for row, seq in enumerate(seqs):
        out[row, : len(seq)] = torch.as_tensor(seq, dtype=torch.long)
    return out


def collate(
    src_ids: Sequence[Sequence[int]],
    tgt_ids: Sequence[Sequence[int]],
    rows: Sequence[int] | np.ndarray,
) -> Batch:
    """The `Batch` of pairs `rows` (lists of ids, or a shard's `TokenView`s): source + <eos>;
    <bos> + target; target + <eos>. Each tensor is gathered in one numpy step."""
    picked = np.asarray(rows, dtype=np.int64)
    src, src_rows = _view(src_ids, picked)
    tgt, tgt_rows = _view(tgt_ids, picked)
    tgt_lengths = tgt.offsets[tgt_rows + 1] - tgt.offsets[tgt_rows]
    return Batch(
        _padded(src, src_rows, lead=None, tail=EOS_ID),
        _padded(tgt, tgt_rows, lead=BOS_ID, tail=None),
        _padded(tgt, tgt_rows, lead=None, tail=EOS_ID),
        picked.tolist(),
        int(tgt_lengths.sum()) + len(picked),  # each target + <eos>
    )


def source_batch(src_ids: Sequence[Sequence[int]], rows: Sequence[int]) -> torch.Tensor:
    """The encoder input (B, S) of sentences `rows`: ids + <eos>, right-padded (no <bos>);
    what `collate` gives as `Batch.src`, for search."""
    view, view_rows = _view(src_ids, np.asarray(rows, dtype=np.int64))
    return _padded(view, view_rows, lead=None, tail=EOS_ID)


def _view(sentences: Sequence[Sequence[int]], rows: np.ndarray) -> tuple[TokenView, np.ndarray]:
    """`sentences` as a TokenView and the rows to take from it (lists: only `rows` are laid out)."""
    if isinstance(sentences, TokenView):
        return sentences, rows
    return TokenView.of([sentences[i] for i in rows]), np.arange(len(rows))


def _padded(side: TokenView, rows: np.ndarray, lead: int | None, tail: int | None) -> torch.Tensor:
    """(B, L) ids of `rows`: [lead] + sentence + [tail], right-padded with PAD_ID."""
    starts, lengths = side.offsets[rows], side.offsets[rows + 1] - side.offsets[rows]
    shift = int(lead is not None)
    width = int(lengths.max(initial=0)) + 1
    columns = np.arange(width) - shift  # (L,) position within the sentence
    inside = (columns >= 0) & (columns < lengths[:, None])  # (B, L)
    where = np.where(inside, starts[:, None] + columns, 0)  # (B, L) index into the flat ids
    ids = np.where(inside, side.tokens[where], PAD_ID)
    if lead is not None:
        ids[:, 0] = lead
    if tail is not None:
        ids[np.arange(len(rows)), lengths] = tail
    return torch.from_numpy(ids.astype(np.int64))


# ---------------------------------------------------------------------------------------------
# Length buckets


def length_batches(
    lengths: Sequence[tuple[int, ...]] | np.ndarray,
    batch_tokens: int,
    order: Sequence[int] | np.ndarray | None = None,
) -> list[list[int]]:
    """`bucket_batches` as lists of row indices."""
    return [rows.tolist() for rows in bucket_batches(lengths, batch_tokens, order)]


def bucket_batches(
    lengths: Sequence[tuple[int, ...]] | np.ndarray,
    batch_tokens: int,
    order: Sequence[int] | np.ndarray | None = None,
) -> list[np.ndarray]:
    """Group row indices into batches whose padded size `rows * longest side` fits the budget.

    Rows are sorted by their longest side (what the budget counts), then by (source, target)
    length, ties kept in `order`, then cut greedily, so rows of one batch have near-equal
    lengths and padding stays small. A single row longer than the budget still forms its own
    batch. `lengths` is (N, K): e.g. (source, target) tokens per row.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    lengths = lengths.reshape(len(lengths), -1) if lengths.size else lengths.reshape(0, 1)
    order = np.arange(len(lengths)) if order is None else np.asarray(order, dtype=np.int64)
    columns = lengths[order].T  # (K, N): e.g. source and target length
    keys = [columns.max(axis=0, initial=0), *columns]  # longest side first, then each side
    base = int(lengths.max(initial=0)) + 1
    if base ** len(keys) < 2**62:  # one int64 key sorts faster than a lexsort
        composite = np.zeros(len(order), dtype=np.int64)
        for key in keys:
            composite = composite * base + key
        by_length = np.argsort(composite, kind="stable")  # ties keep `order`
    else:
        by_length = np.lexsort(keys[::-1])  # also stable
    ranked, sizes = order[by_length], keys[0][by_length]  # sizes non-decreasing
    batches: list[np.ndarray] = []
    start = 0
    while start < len(ranked):
        # Sizes only grow, so a batch's longest row is its last: rows start..j fit while
        # sizes[j] * (j - start + 1) <= budget, and that product only grows with j.
        room = max(batch_tokens // max(int(sizes[start]), 1), 1)
        window = sizes[start : start + room + 1]
        over = window * np.arange(1, len(window) + 1) > batch_tokens
        over[0] = False  # a row longer than the budget still forms its own batch
        count = int(np.argmax(over)) if over.any() else len(window)
        batches.append(ranked[start : start + count])
        start += count
    return batches


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


def padding_fraction(batches: Sequence[Batch]) -> float:
    """Share of pad positions among all source and target positions of `batches`."""
    total = sum(b.src.numel() + b.tgt_out.numel() for b in batches)
    pads = sum(int((b.src == PAD_ID).sum() + (b.tgt_out == PAD_ID).sum()) for b in batches)
    return pads / max(total, 1)


# ---------------------------------------------------------------------------------------------
# The training batch source


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
    epoch is the corpus itself and the batches are `data.epoch_order` of its lengths.
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
