"""How often source and target pieces occur in the same sentence pair of a corpus (counted once
a pair however often they repeat in it): the statistics a lexical shortlist ranks its
candidates by (`decode/shortlist.py`). Counted over token shards in chunks with numpy: each
pair's distinct source ids times its distinct target ids, keyed s * V_tgt + t.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from attn_mt.data.shards import TokenView

CHUNK_PAIRS = 20_000  # pairs counted at once: memory ~ pairs x source x target pieces


@dataclass
class Cooccurrence:
    """Counts over `pairs` sentence pairs: per co-occurring (source id, target id) the pairs
    holding both (`source`, `target`, `both`, one entry each); per id the pairs holding it
    (`src_pairs`, `tgt_pairs`) and the target ids' occurrences (`tgt_tokens`)."""

    pairs: int
    source: np.ndarray
    target: np.ndarray
    both: np.ndarray
    src_pairs: np.ndarray
    tgt_pairs: np.ndarray
    tgt_tokens: np.ndarray


def _distinct(view: TokenView, first: int, last: int, vocab: int) -> tuple[np.ndarray, ...]:
    """The distinct ids of pairs first..last-1 of one side: (pair, id) sorted by pair then id,
    and how many each pair holds."""
    start, end = int(view.offsets[first]), int(view.offsets[last])
    lengths = np.diff(np.asarray(view.offsets[first : last + 1]))
    ids = np.asarray(view.tokens[start:end], dtype=np.int64)
    pair = np.repeat(np.arange(last - first, dtype=np.int64), lengths)
    keys = np.unique(pair * vocab + ids)
    pair, ids = keys // vocab, keys % vocab
    return pair, ids, np.bincount(pair, minlength=last - first)


def count_cooccurrence(
    src: TokenView, tgt: TokenView, src_vocab: int, tgt_vocab: int, max_pairs: int
) -> Cooccurrence:
    """The counts over the pairs of `src` and `tgt`; of at most about `max_pairs` of them (0:
    no limit) where the corpus holds more, taken as chunks spread evenly through it."""
    total = len(src)
    spread = max(total // max_pairs, 1) if max_pairs else 1  # one chunk in `spread` counted
    keys = np.zeros(0, dtype=np.int64)
    counts = np.zeros(0, dtype=np.int64)
    src_pairs = np.zeros(src_vocab, dtype=np.int64)
    tgt_pairs = np.zeros(tgt_vocab, dtype=np.int64)
    tgt_tokens = np.zeros(tgt_vocab, dtype=np.int64)
    pairs = 0
    for first in range(0, total, CHUNK_PAIRS * spread):
        last = min(first + CHUNK_PAIRS, total)
        s_pair, s_ids, _ = _distinct(src, first, last, src_vocab)
        t_pair, t_ids, t_count = _distinct(tgt, first, last, tgt_vocab)
        src_pairs += np.bincount(s_ids, minlength=src_vocab)
        tgt_pairs += np.bincount(t_ids, minlength=tgt_vocab)
        start, end = int(tgt.offsets[first]), int(tgt.offsets[last])
        tgt_tokens += np.bincount(np.asarray(tgt.tokens[start:end]), minlength=tgt_vocab)
        # each distinct source id of a pair, times each distinct target id of that pair
        repeats = t_count[s_pair]
        t_start = np.cumsum(t_count) - t_count  # where each pair's target ids begin
        within = np.arange(int(repeats.sum())) - np.repeat(np.cumsum(repeats) - repeats, repeats)
        targets = t_ids[np.repeat(t_start[s_pair], repeats) + within]
        chunk_keys, chunk_counts = np.unique(
            np.repeat(s_ids, repeats) * tgt_vocab + targets, return_counts=True
        )
        keys, inverse = np.unique(np.concatenate([keys, chunk_keys]), return_inverse=True)
        counts = np.bincount(
            inverse, weights=np.concatenate([counts, chunk_counts]), minlength=len(keys)
        ).astype(np.int64)
        pairs += last - first
    return Cooccurrence(
        pairs, keys // tgt_vocab, keys % tgt_vocab, counts, src_pairs, tgt_pairs, tgt_tokens
    )
