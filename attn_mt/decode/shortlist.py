"""Lexical shortlists (`decode.shortlist`; Marian's `--shortlist`, CTranslate2's vocabulary map):
a search step scores only the target pieces that co-occur with its batch's source pieces in the
training data, plus the most frequent target pieces, instead of the whole target vocabulary.
The output layer is most of a step with a large vocabulary (58k pieces: an OPUS-MT model).

`attn-mt shortlist` builds the file from a config's training corpora (`build_shortlist`);
`Translator` reads it (`read_shortlist`) and gives each batch's rows (`Shortlist.rows`: the
union of its sentences' lists) to the search, whose output layer then multiplies by those rows
alone and puts their log-probabilities back among all V ids (`generate.StepDecoder`), so the
strategies see full-vocabulary log-probabilities, every other piece at -inf. The softmax is
taken over the rows, as Marian and CTranslate2 take it.

The file, UTF-8 text, one record a line (docs/pretrained.md, "Decode it fast"):

    attn-mt shortlist 1
    source 8000 3f2a9c0e1b7d4a55         the source vocabulary: its size and its fingerprint
    target 8000 9bc1d2e3f4a5b6c7         the target vocabulary, the same
    built pairs 29000 candidates 50 frequent 100
    <TAB>▁a ▁. ▁the ...                  the most frequent target pieces: always scored
    ▁Hund<TAB>▁dog ▁dogs ...             a source piece, its best target candidates first

A fingerprint is the first 16 hex digits of the sha256 of the vocabulary's pieces in id order,
so a shortlist made for another vocabulary is refused. The lines from the fifth on are a
CTranslate2 vocabulary map (`ct2-*-converter --vocab_mapping`). Candidates rank by the Dice
coefficient 2 c(s, t) / (c(s) + c(t)) of sentence pairs holding both pieces, alignment-free.

Shape legend: B sentences, S source length, U shortlist rows.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from attn_mt.checkpoint import load_checkpoint, tokenizers_from
from attn_mt.config.schema import Config
from attn_mt.data.cooccurrence import count_cooccurrence
from attn_mt.data.prepare import prepare_shards
from attn_mt.data.tokenizer import Tokenizer
from attn_mt.errors import LINE_BREAKS, UserError, named
from attn_mt.fileio import atomic_write, os_reason
from attn_mt.model.vocab import BOS_ID, EOS_ID, PAD_ID, UNK_ID

log = logging.getLogger("attn_mt")

MAGIC = "attn-mt shortlist 1"
HEADER_LINES = 4
# Always scored: the search masks <pad> and <s> after the softmax, as without a shortlist,
# so their probability stays in its denominator.
ALWAYS = (PAD_ID, UNK_ID, BOS_ID, EOS_ID)


def fingerprint(tokenizer: Tokenizer) -> str:
    """The first 16 hex digits of the sha256 of the tokenizer's pieces in id order."""
    pieces = "\n".join(tokenizer.all_pieces()).encode("utf-8")
    return hashlib.sha256(pieces).hexdigest()[:16]


def writable_piece(piece: str) -> bool:
    """Whether a piece can stand in the file: no whitespace or line break in it."""
    return not any(c.isspace() or c in LINE_BREAKS for c in piece)


@dataclass
class Shortlist:
    """A shortlist read for one model: each source id's candidate target ids (CSR: those of id
    s are targets[offsets[s]:offsets[s + 1]]) and the target ids always scored."""

    offsets: torch.Tensor  # (source vocabulary + 1,)
    targets: torch.Tensor  # (candidates in all,)
    always: torch.Tensor  # (frequent + specials,)

    def rows(self, src: torch.Tensor, extra: Iterable[int] = ()) -> torch.Tensor:
        """The target ids a batch of sources (B, S) scores, sorted, (U,) on src's device: the
        candidates of every source id in it, the ones always scored and `extra` (the pieces a
        line's terms or prefix need)."""
        ids = src.unique().cpu()
        ids = ids[ids < self.offsets.numel() - 1]
        starts, ends = self.offsets[ids], self.offsets[ids + 1]
        lengths = ends - starts
        # the positions of every list in `targets`, back to back
        first = torch.repeat_interleave(starts - torch.cumsum(lengths, 0) + lengths, lengths)
        picked = self.targets[first + torch.arange(int(lengths.sum()))]
        given = torch.tensor(list(extra), dtype=torch.long)
        return torch.cat([self.always, picked, given]).unique().to(src.device)


def read_shortlist(path: str | Path, src_tok: Tokenizer, tgt_tok: Tokenizer) -> Shortlist:
    """The shortlist in `path` for a model of these tokenizers; a file that is not a
    shortlist, or one made for other vocabularies, is a UserError naming it."""
    where = f"decode.shortlist {named(path)}"
    try:
        lines = Path(path).read_text(encoding="utf-8").split("\n")
    except (OSError, UnicodeDecodeError) as err:
        reason = os_reason(err) if isinstance(err, OSError) else "not UTF-8 text"
        raise UserError(f"{where}: cannot read it ({reason})") from None
    if lines[0] != MAGIC or len(lines) < HEADER_LINES + 1:
        raise UserError(f"{where}: not a shortlist (make one with `attn-mt shortlist`)")
    for line, side, tokenizer in ((lines[1], "source", src_tok), (lines[2], "target", tgt_tok)):
        expected = f"{side} {tokenizer.vocab_size} {fingerprint(tokenizer)}"
        if line != expected:
            raise UserError(
                f"{where}: made for another {side} vocabulary ('{line}', this model's: "
                f"'{expected}'); build one with `attn-mt shortlist --model RUN`"
            )
    src_ids = {p: i for i, p in enumerate(src_tok.all_pieces())}
    tgt_ids = {p: i for i, p in enumerate(tgt_tok.all_pieces())}
    lists: dict[int, list[int]] = {}
    for number, line in enumerate(lines[HEADER_LINES:], HEADER_LINES + 1):
        if not line:
            continue
        key, tab, values = line.partition("\t")
        try:
            source = -1 if key == "" else src_ids[key]
            lists[source] = [tgt_ids[piece] for piece in values.split(" ") if piece]
        except KeyError as err:
            raise UserError(f"{where}, line {number}: unknown piece {err}") from None
        if not tab:
            raise UserError(f"{where}, line {number}: no tab between a piece and its list")
    return _shortlist(lists, src_tok.vocab_size)


def _shortlist(lists: dict[int, list[int]], source_vocab: int) -> Shortlist:
    """The CSR layout of `lists` (source id -> target ids; -1: the ones always scored)."""
    lengths = torch.zeros(source_vocab, dtype=torch.long)
    for source, targets in lists.items():
        if source >= 0:
            lengths[source] = len(targets)
    offsets = torch.zeros(source_vocab + 1, dtype=torch.long)
    offsets[1:] = torch.cumsum(lengths, 0)
    flat = [t for source in range(source_vocab) for t in lists.get(source, ())]
    always = torch.tensor(sorted({*ALWAYS, *lists.get(-1, ())}), dtype=torch.long)
    return Shortlist(offsets, torch.tensor(flat, dtype=torch.long), always)


# ---------------------------------------------------------------------------------------------
# Building

SAMPLE_BATCH = 64  # sentences of the batches `build_shortlist` reports the rows of
SAMPLE_BATCHES = 20


@dataclass
class Built:
    """What `build_shortlist` wrote: the pairs counted, the source pieces listed, the target
    vocabulary and the rows a batch of SAMPLE_BATCH training sources scores on average."""

    pairs: int
    listed: int
    vocab: int
    batch_rows: float


def build_shortlist(
    config: Config,
    out: str | Path,
    model: str | Path | None = None,
    candidates: int = 50,
    frequent: int = 100,
    max_pairs: int = 1_000_000,
) -> Built:
    """Write the shortlist of `config`'s training corpora to `out`: per source piece its
    `candidates` best target pieces, and the `frequent` most frequent target pieces, counted
    over (at most about) `max_pairs` pairs of the prepared data. The pieces are those of
    `model`'s tokenizers (a run folder or checkpoint), else those a run of `config` trains."""
    if candidates < 1 or frequent < 0 or max_pairs < 0:
        raise UserError("--candidates must be >= 1, --frequent and --max-pairs >= 0")
    tokenizers = None
    if model is not None:
        state = load_checkpoint(model, mapped=True)
        given = {k: state["config"]["data"].get(k) for k in ("src_lang", "tgt_lang")}
        wanted = {"src_lang": config.data.src_lang, "tgt_lang": config.data.tgt_lang}
        if given != wanted:
            raise UserError(
                f"--model {named(model)} translates {given['src_lang']}->{given['tgt_lang']}, "
                f"the config's data {wanted['src_lang']}->{wanted['tgt_lang']}"
            )
        tokenizers = tokenizers_from(state, model)
    shards = prepare_shards(config, tokenizers)
    src_tok, tgt_tok = tokenizers or shards.tokenizers()
    counts = count_cooccurrence(
        shards.src, shards.tgt, src_tok.vocab_size, tgt_tok.vocab_size, max_pairs
    )
    lists = ranked_candidates(
        (counts.source, counts.target, counts.both), counts.src_pairs, counts.tgt_pairs, candidates
    )
    by_count = np.argsort(-counts.tgt_tokens, kind="stable")
    common = [int(t) for t in by_count if counts.tgt_tokens[t] and t not in ALWAYS][:frequent]
    built = f"pairs {counts.pairs} candidates {candidates} frequent {frequent}"
    listed = write_shortlist(out, lists, common, (src_tok, tgt_tok), built)
    shortlist = read_shortlist(out, src_tok, tgt_tok)  # as a search reads it
    return Built(counts.pairs, listed, tgt_tok.vocab_size, _batch_rows(shortlist, shards.src))


def _batch_rows(shortlist: Shortlist, sources: Sequence[Sequence[int]]) -> float:
    """The mean rows of up to SAMPLE_BATCHES batches of SAMPLE_BATCH sources spread evenly."""
    starts = np.linspace(0, max(len(sources) - SAMPLE_BATCH, 0), SAMPLE_BATCHES).astype(int)
    sizes = []
    for start in sorted(set(starts.tolist())):
        batch = [sources[i] for i in range(start, min(start + SAMPLE_BATCH, len(sources)))]
        ids = torch.tensor([t for sentence in batch for t in sentence], dtype=torch.long)
        sizes.append(shortlist.rows(ids[None]).numel())
    return float(np.mean(sizes)) if sizes else 0.0


def ranked_candidates(
    counts: tuple[np.ndarray, np.ndarray, np.ndarray],
    src_freq: np.ndarray,
    tgt_freq: np.ndarray,
    candidates: int,
) -> dict[int, list[int]]:
    """Each source id's `candidates` best target ids by the Dice coefficient of the sentence
    pairs holding both (ties: the pair seen more often, then the lower id).

    counts: (source ids, target ids, pairs holding both), one entry per co-occurring pair;
    src_freq, tgt_freq: the pairs holding each source id, each target id."""
    source, target, both = counts
    keep = ~np.isin(target, ALWAYS)  # always scored anyway
    source, target, both = source[keep], target[keep], both[keep]
    dice = 2.0 * both / (src_freq[source] + tgt_freq[target])
    order = np.lexsort((target, -both, -dice, source))  # by source, best first
    source, target = source[order], target[order]
    starts = np.searchsorted(source, source, side="left")  # each entry's group start
    rank = np.arange(len(source)) - starts
    source, target = source[rank < candidates], target[rank < candidates]
    bounds = np.flatnonzero(np.diff(source)) + 1
    return {
        int(group[0]): targets.tolist()
        for group, targets in zip(np.split(source, bounds), np.split(target, bounds), strict=True)
        if len(group)
    }


def write_shortlist(
    path: str | Path,
    lists: dict[int, list[int]],
    frequent: Sequence[int],
    tokenizers: tuple[Tokenizer, Tokenizer],
    built: str,
) -> int:
    """Write the file (atomically); returns the source pieces listed. Pieces that cannot
    stand in it (whitespace in them) are left out."""
    src_tok, tgt_tok = tokenizers
    src_pieces, tgt_pieces = src_tok.all_pieces(), tgt_tok.all_pieces()

    def joined(ids: Iterable[int]) -> str:
        return " ".join(tgt_pieces[i] for i in ids if writable_piece(tgt_pieces[i]))

    lines = [
        MAGIC,
        f"source {src_tok.vocab_size} {fingerprint(src_tok)}",
        f"target {tgt_tok.vocab_size} {fingerprint(tgt_tok)}",
        f"built {built}",
        f"\t{joined(frequent)}",
    ]
    for source in sorted(lists):
        if writable_piece(src_pieces[source]) and (targets := joined(lists[source])):
            lines.append(f"{src_pieces[source]}\t{targets}")
    try:
        with atomic_write(path) as handle:
            handle.write(("\n".join(lines) + "\n").encode("utf-8"))
    except OSError as err:
        raise UserError(f"--out {named(path)}: cannot write it ({os_reason(err)})") from None
    return len(lines) - HEADER_LINES - 1
