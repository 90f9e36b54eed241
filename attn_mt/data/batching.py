"""Batches: one padded `Batch` type, one collate, and length buckets (`bucket_batches`: rows of
near-equal lengths cut to a token budget, so padding stays small), for training, validation and
search alike. Which batches a training process takes, epoch after epoch, is `epochs.py`'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from attn_mt.data.shards import TokenView
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


def padding_fraction(batches: Sequence[Batch]) -> float:
    """Share of pad positions among all source and target positions of `batches`."""
    total = sum(b.src.numel() + b.tgt_out.numel() for b in batches)
    pads = sum(int((b.src == PAD_ID).sum() + (b.tgt_out == PAD_ID).sum()) for b in batches)
    return pads / max(total, 1)


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
