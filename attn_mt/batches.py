"""Training data as the loop sees it: the prepared corpus, and a batch source that hands out
this process's batches epoch after epoch and alone holds the position in the data.

The training pairs are token shards (`attn_mt.prepare`, `attn_mt.shards`): prepared once per
corpus and settings, memory-mapped by every process, sliced into a batch when it is used.

The loop needs five things from a source (`BatchSource`): the next batch, the epochs done, the
position as a `state_dict()` and back, and a line for the start-up log. The batch order is a
pure function of (seed, epoch), so the position is two numbers, and a resumed run, or one
resumed with another number of processes, continues exactly where the saved one stopped.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from attn_mt import distributed
from attn_mt.config import Config
from attn_mt.data import Batch, FilterStats, read_parallel, split_files
from attn_mt.errors import DataError
from attn_mt.prepare import prepare_for
from attn_mt.runlog import stage
from attn_mt.shards import Shards, ShardSource, TokenView, corpus_lines
from attn_mt.tokenizer import Tokenizer


@dataclass
class Corpus:
    """The training pairs (memory-mapped token shards) and the validation split (in memory)."""

    shards: Shards
    weights: list[float]  # of each training corpus, for the start-up log
    valid_src: list[str]
    valid_ref: list[str]
    valid_src_ids: list[list[int]]
    valid_tgt_ids: list[list[int]]

    @property
    def src_ids(self) -> TokenView:
        """Source ids of each kept training pair (without <eos>), read from the map."""
        return self.shards.src

    @property
    def tgt_ids(self) -> TokenView:
        """Target ids of each kept training pair (without <eos>), read from the map."""
        return self.shards.tgt

    @property
    def lengths(self) -> np.ndarray:
        """(N, 2): source + <eos> and target + <eos> tokens of each kept pair."""
        return self.shards.lengths + 1

    @property
    def stats(self) -> FilterStats:
        """What cleaning kept and dropped, over all training corpora."""
        total = FilterStats()
        for entry in self.shards.manifest["corpora"]:
            total.add(FilterStats(*(entry[k] for k in ("kept", "empty", "too_long", "bad_ratio"))))
        return total

    def describe(self) -> list[str]:
        """One line per training corpus: pairs kept, weight, tag and share of an epoch."""
        return corpus_lines(self.shards.manifest["corpora"], self.weights)


def prepare_data(
    cfg: Config, tokenizers: tuple[Tokenizer, Tokenizer] | None, world: distributed.World
) -> tuple[Tokenizer, Tokenizer, Corpus]:
    """Prepare (or reuse) the training shards, then read and encode the validation split.

    tokenizers: a resumed run's SentencePiece models; None trains (or reuses) them, on rank 0,
    whose models every process then uses (machines of a multi-node run need not share a cache).
    """
    valid_files = split_files(cfg.data, "valid")
    with stage("reading the validation split"):  # checked before the training data's work
        valid_src, valid_ref = read_parallel(*valid_files)
    if not any(s.strip() and t.strip() for s, t in zip(valid_src, valid_ref, strict=True)):
        raise DataError(f"{valid_files[0]}: the validation corpus has no non-empty pairs")
    with stage("preparing the training data"):
        shards = prepare_for(cfg, tokenizers, world)
    src_tok, tgt_tok = tokenizers or shards.tokenizers()
    corpus = Corpus(
        shards=shards,
        weights=cfg.data.weights(),
        valid_src=valid_src,
        valid_ref=valid_ref,
        valid_src_ids=src_tok.encode(valid_src),
        valid_tgt_ids=tgt_tok.encode(valid_ref),
    )
    return src_tok, tgt_tok, corpus


def valid_subset(corpus: Corpus, size: int, seed: int) -> Corpus:
    """`corpus` with `size` of its validation pairs (0 = all): a fixed seeded choice, kept in
    file order, drawn from its own generator (the training streams never move)."""
    if not size or size >= len(corpus.valid_src):
        return corpus
    rows = sorted(random.Random(seed).sample(range(len(corpus.valid_src)), size))
    return dataclasses.replace(
        corpus,
        **{
            name: [getattr(corpus, name)[i] for i in rows]
            for name in ("valid_src", "valid_ref", "valid_src_ids", "valid_tgt_ids")
        },
    )


class BatchSource(Protocol):
    """Where the training loop gets its batches; it alone holds the position in the data."""

    epoch: int  # the epoch the position is in (0-based)

    @property
    def epochs_done(self) -> int:
        """Whole epochs consumed so far."""
        ...

    @property
    def epochs_run(self) -> float:
        """Epochs consumed so far, the current one's share included (for the ETA)."""
        ...

    def next(self) -> Batch:
        """This process's next batch, moving on to the next epoch at the end of one."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """The position, for last.pt: {"epoch", "index", "world_size"}."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a saved position, also one saved by another number of processes."""
        ...

    def describe(self) -> str:
        """One line for the start-up log: batches per epoch, their padding, and how a position
        saved by another number of processes was mapped."""
        ...


def make_source(cfg: Config, corpus: Corpus, world: distributed.World) -> BatchSource:
    """The batch source of a training run: batches sliced from the memory-mapped shards."""
    return ShardSource.from_config(cfg, corpus.shards, world)
