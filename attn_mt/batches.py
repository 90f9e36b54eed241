"""Training data as the loop sees it: the encoded corpus, and a batch source that hands out
this process's batches epoch after epoch and alone holds the position in the data.

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

from attn_mt import distributed
from attn_mt.config import Config
from attn_mt.data import (
    Batch,
    FilterStats,
    cache_dir,
    clean_pairs,
    collate,
    epoch_batches,
    padding_fraction,
    read_parallel,
    split_files,
)
from attn_mt.errors import DataError
from attn_mt.runlog import stage
from attn_mt.tokenizer import Tokenizer, build_tokenizers


@dataclass
class Corpus:
    """Encoded training pairs (filtered) and the validation split."""

    src_ids: list[list[int]]
    tgt_ids: list[list[int]]
    lengths: list[tuple[int, int]]  # (source + <eos>, target + <eos>) per kept pair
    stats: FilterStats
    valid_src: list[str]
    valid_ref: list[str]
    valid_src_ids: list[list[int]]
    valid_tgt_ids: list[list[int]]


def prepare_data(
    cfg: Config, tokenizers: tuple[Tokenizer, Tokenizer] | None, world: distributed.World
) -> tuple[Tokenizer, Tokenizer, Corpus]:
    """Read the corpus, train (or reuse) SentencePiece, encode and filter the training pairs."""
    train_files = split_files(cfg.data, "train")
    valid_files = split_files(cfg.data, "valid")
    with stage("reading the corpus"):
        train_src, train_tgt = read_parallel(*train_files)
        valid_src, valid_ref = read_parallel(*valid_files)
    for name, files, src, tgt in (
        ("training", train_files, train_src, train_tgt),
        ("validation", valid_files, valid_src, valid_ref),
    ):
        if not any(s.strip() and t.strip() for s, t in zip(src, tgt, strict=True)):
            raise DataError(f"{files[0]}: the {name} corpus has no non-empty pairs")
    if tokenizers is None:
        # Rank 0 trains SentencePiece and sends the models: every process must use the same
        # pieces, and machines of a multi-node run need not share a cache folder.
        with stage("SentencePiece", announce=False):  # it says whether it trains or reuses
            tokenizers = distributed.from_main(
                lambda: build_tokenizers(cfg.tokenizer, train_src, train_tgt, cache_dir() / "spm"),
                world,
            )
    src_tok, tgt_tok = tokenizers
    with stage("encoding the corpus"):
        src_ids, tgt_ids = src_tok.encode(train_src), tgt_tok.encode(train_tgt)
        keep, stats = clean_pairs(src_ids, tgt_ids, cfg.data.max_len)
    if not keep:
        raise DataError(
            f"every training pair was filtered out ({stats.empty} empty, {stats.too_long} longer "
            f"than data.max_len={cfg.data.max_len} tokens); raise data.max_len"
        )
    src_ids, tgt_ids = [src_ids[i] for i in keep], [tgt_ids[i] for i in keep]
    corpus = Corpus(
        src_ids=src_ids,
        tgt_ids=tgt_ids,
        lengths=[(len(s) + 1, len(t) + 1) for s, t in zip(src_ids, tgt_ids, strict=True)],
        stats=stats,
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


class CorpusSource:
    """Token-budget batches of an in-memory `Corpus`; rank r takes every world-size-th batch."""

    def __init__(self, corpus: Corpus, batch_tokens: int, seed: int, world: distributed.World):
        self.corpus, self.batch_tokens, self.seed, self.world = corpus, batch_tokens, seed, world
        self.epoch, self.index = 0, 0
        self.batches = self._epoch_batches(0)
        self.rescaled = ""  # how a position saved by another process count was mapped

    def _epoch_batches(self, epoch: int) -> list[list[int]]:
        batches = epoch_batches(
            self.corpus.lengths,
            self.batch_tokens,
            self.seed,
            epoch,
            self.world.rank,
            self.world.size,
        )
        if not batches:
            raise DataError(
                f"the training data makes fewer batches than the {self.world.size} processes; "
                "lower train.batch_tokens or use fewer processes"
            )
        return batches

    @property
    def epochs_done(self) -> int:
        return self.epoch + (1 if self.index >= len(self.batches) else 0)

    @property
    def epochs_run(self) -> float:
        return self.epoch + self.index / len(self.batches)

    def next(self) -> Batch:
        if self.index >= len(self.batches):
            self.epoch, self.index = self.epoch + 1, 0
            self.batches = self._epoch_batches(self.epoch)
        rows = self.batches[self.index]
        self.index += 1
        return self._collate(rows)

    def _collate(self, rows: list[int]) -> Batch:
        return collate(self.corpus.src_ids, self.corpus.tgt_ids, rows)

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "index": self.index, "world_size": self.world.size}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        index, saved_world = state["index"], state["world_size"]
        if saved_world != self.world.size:
            # The index counts one process's batches; keep the share of the epoch's global
            # order already seen (rounded up: a few batches may be skipped, none repeated).
            index = -(-index * saved_world // self.world.size)
            self.rescaled = (
                f"resuming a {saved_world}-process run with {self.world.size} processes: "
                f"epoch {state['epoch']} continues at batch {index}"
            )
        self.epoch, self.index = state["epoch"], index
        self.batches = self._epoch_batches(self.epoch)

    def describe(self) -> str:
        sample = [self._collate(rows) for rows in self.batches[:50]]
        per = " per process" if self.world.distributed else ""
        padding = 100 * padding_fraction(sample)
        line = f"{len(self.batches)} batches per epoch{per}, padding {padding:.1f}%"
        return f"{line}; {self.rescaled}" if self.rescaled else line


def make_source(cfg: Config, corpus: Corpus, world: distributed.World) -> BatchSource:
    """The batch source of a training run."""
    return CorpusSource(corpus, cfg.train.batch_tokens, cfg.train.seed, world)
