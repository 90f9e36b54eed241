"""What a training run reads: the prepared training shards (memory-mapped) and the validation
split (in memory, its ids those the search reads: `attn_mt.data.ids`), prepared once for every
process of the run; the start-up stages a run announces in its log (`stage`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from attn_mt import distributed
from attn_mt.config.schema import Config
from attn_mt.data.corpora import split_files, valid_directions
from attn_mt.data.ids import input_limit, language_prefix, source_ids, target_ids
from attn_mt.data.prepare import shards_for_run
from attn_mt.data.shards import Shards, TokenView, corpus_lines, mix_weights
from attn_mt.data.text import FilterStats, read_parallel
from attn_mt.data.tokenizer import Tokenizer
from attn_mt.errors import DataError

log = logging.getLogger("attn_mt")


@contextlib.contextmanager
def stage(name: str) -> Iterator[None]:
    """Log a start-up stage as it begins, and its time when it took more than a second."""
    log.info("%s ...", name)
    begin = time.monotonic()
    yield
    seconds = time.monotonic() - begin
    if seconds > 1:
        log.info("%s: %.1f s", name, seconds)


@dataclass
class Corpus:
    """The training pairs (memory-mapped token shards) and the validation split (in memory)."""

    shards: Shards
    weights: list[float]  # of each training corpus, for the start-up log
    valid_src: list[str]
    valid_ref: list[str]
    valid_src_ids: list[list[int]]
    valid_tgt_ids: list[list[int]]
    valid_tgt_lang: str | None = None  # the language asked for (a direction of a multilingual run)
    # A multilingual run's validation per direction ("de-en" -> its corpus); the fields above
    # then hold every direction's pairs, one after the other.
    pairs: dict[str, Corpus] = dataclasses.field(default_factory=dict)
    # data.valid_general's pairs: validated beside the split above, never selecting best.pt.
    general: Corpus | None = None

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
            total.add(FilterStats.read(entry))
        return total

    def describe(self) -> list[str]:
        """One line per training corpus: pairs kept, weight, tag and share of an epoch."""
        return corpus_lines(self.shards.manifest["corpora"], self.weights)


def training_data(
    cfg: Config, tokenizers: tuple[Tokenizer, Tokenizer] | None, world: distributed.World
) -> tuple[Tokenizer, Tokenizer, Corpus]:
    """Prepare (or reuse) the training shards, then read and encode the validation split.

    tokenizers: a resumed run's SentencePiece models; None trains (or reuses) them, on rank 0,
    whose models every process then uses (machines of a multi-node run need not share a cache).
    """
    directions = valid_directions(cfg.data)
    if directions is None:
        valid_files = split_files(cfg.data, "valid")
        if valid_files is None:
            raise DataError("data.valid: no validation corpus; give data.valid.src and .tgt")
        directions = {"": valid_files}
    general = cfg.data.valid_general
    if general.src and general.tgt:  # the second validation set: general (`Corpus.general`)
        directions["general"] = (Path(general.src), Path(general.tgt))
    with stage("reading the validation split"):  # checked before the training data's work
        texts = {pair: read_parallel(*files) for pair, files in directions.items()}
    for pair, (valid_src, valid_ref) in texts.items():
        if not any(s.strip() and t.strip() for s, t in zip(valid_src, valid_ref, strict=True)):
            raise DataError(f"{directions[pair][0]}: the validation corpus has no non-empty pairs")
    with stage("preparing the training data"):
        shards = shards_for_run(cfg, tokenizers, world)
    src_tok, tgt_tok = tokenizers or shards.tokenizers()
    weights = mix_weights(shards, cfg.data.weights(), cfg.data.temperature)
    # The ids the validation search reads too (`Translator.encode`): the run's model has the
    # positions of its config, bounded for learned ones only. The search warns of a line cut.
    positions = cfg.model.max_positions if cfg.model.positions == "learned" else None
    limit = input_limit(cfg.decode.max_input_len, positions)
    pairs = {}
    for pair, (valid_src, valid_ref) in texts.items():
        tgt_lang = pair.partition("-")[2] or None  # "" and "general": the run's one direction
        prefix = language_prefix(cfg.data, src_tok, tgt_lang)
        pairs[pair] = Corpus(
            shards=shards,
            weights=weights,
            valid_src=valid_src,
            valid_ref=valid_ref,
            valid_src_ids=source_ids(src_tok, valid_src, prefix, limit, warn=False),
            valid_tgt_ids=target_ids(tgt_tok, valid_ref),
            valid_tgt_lang=tgt_lang,
        )
    watched = pairs.pop("general", None)
    corpus = pairs[""] if "" in pairs else joined(pairs)
    return src_tok, tgt_tok, dataclasses.replace(corpus, general=watched)


def joined(pairs: dict[str, Corpus]) -> Corpus:
    """One corpus over the validation of every direction (`pairs`), holding them too."""
    first = next(iter(pairs.values()))

    def every(name: str) -> list:
        return [item for corpus in pairs.values() for item in getattr(corpus, name)]

    return Corpus(
        shards=first.shards,
        weights=first.weights,
        valid_src=every("valid_src"),
        valid_ref=every("valid_ref"),
        valid_src_ids=every("valid_src_ids"),
        valid_tgt_ids=every("valid_tgt_ids"),
        pairs=pairs,
    )


def valid_subset(corpus: Corpus, size: int, seed: int) -> Corpus:
    """`corpus` with `size` of its validation pairs (0 = all): a fixed seeded choice, kept in
    file order, drawn from its own generator (the training streams never move); of a
    multilingual run, `size` pairs of each direction; of data.valid_general, `size` pairs."""
    if corpus.general is not None:
        alone = valid_subset(dataclasses.replace(corpus, general=None), size, seed)
        return dataclasses.replace(alone, general=valid_subset(corpus.general, size, seed))
    if corpus.pairs:
        return joined({pair: valid_subset(c, size, seed) for pair, c in corpus.pairs.items()})
    if not size or size >= len(corpus.valid_src):
        return corpus
    rows = sorted(random.Random(seed).sample(range(len(corpus.valid_src)), size))

    def chosen(lines: list) -> list:
        return [lines[i] for i in rows]

    return dataclasses.replace(
        corpus,
        valid_src=chosen(corpus.valid_src),
        valid_ref=chosen(corpus.valid_ref),
        valid_src_ids=chosen(corpus.valid_src_ids),
        valid_tgt_ids=chosen(corpus.valid_tgt_ids),
    )
