"""SentencePiece: train on the training split (cached by a hash of inputs and settings), load
from bytes, encode and decode. The special ids are `attn_mt.model.vocab`'s.

Text is only ever text: the tags a run adds to a source (`<2de>`, a corpus's `<bt>`) are
user-defined pieces, which SentencePiece would find in a sentence's text too, so a line holding
"<2fr>" would steer the model. Encoding uses a copy of the model in which those pieces are
control pieces (`text_only`): their ids stay, put in by id only, and their strings in a sentence
are segmented as any other text. Text without such strings gets exactly the ids it had.
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import logging
import os
from collections.abc import Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

import sentencepiece as spm

from attn_mt.config.schema import TokenizerConfig
from attn_mt.errors import ConfigError, UserError
from attn_mt.fileio import atomic_write, os_reason
from attn_mt.model.vocab import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from attn_mt.paths import writable_dir

# From this many sentences on, `Tokenizer.decode` makes SentencePiece's batch call (threads).
BATCH_DECODE = 128
log = logging.getLogger("attn_mt")


class Tokenizer:
    """A SentencePiece model held as bytes, so it can live inside a checkpoint."""

    def __init__(self, model_bytes: bytes):
        self.model_bytes = bytes(model_bytes)
        self.sp = spm.SentencePieceProcessor(model_proto=self.model_bytes)  # ids, pieces, decoding

    @cached_property
    def text_model(self) -> bytes:
        """The model as encoding uses it, its user-defined pieces (tags) made control pieces
        (`text_only`): what an export writes, so that its users encode text as attn-mt does."""
        return text_only(self.model_bytes)

    @cached_property
    def _text(self) -> spm.SentencePieceProcessor:
        """The processor that encodes (`text_model`): a tag's string in a sentence is text."""
        if self.text_model == self.model_bytes:  # no tags: the one processor
            return self.sp
        return spm.SentencePieceProcessor(model_proto=self.text_model)

    @property
    def vocab_size(self) -> int:
        """Number of pieces, special symbols included."""
        return self.sp.get_piece_size()

    @cached_property
    def by_pieces(self) -> bool:
        """Whether ids come from the pieces' strings: a model whose vocabulary holds pieces its
        segmentation never makes (unused: the other side's pieces of an imported Marian
        vocabulary, `export/marian.py`), where a run of characters the model does not know is
        looked up as a piece, as MarianTokenizer does, instead of becoming <unk>."""
        return any(self._text.is_unused(i) for i in range(self.vocab_size))

    def encode(self, lines: Sequence[str]) -> list[list[int]]:
        """Text -> piece ids (no <bos>/<eos>; the batcher adds them); a tag's string in the text
        is text, never the tag's piece."""
        if self.by_pieces:
            pieces = self._text.encode(list(lines), out_type=str)
            return [[self._text.piece_to_id(piece) for piece in seq] for seq in pieces]
        return self._text.encode(list(lines), out_type=int)

    def sample(self, lines: Sequence[str], alpha: float, seed: int) -> list[list[int]]:
        """One sampled segmentation per line: subword regularization (Kudo, 2018) for a unigram
        model, `alpha` the smoothing of P(segmentation)^alpha over all segmentations (smaller
        samples more); BPE-dropout (Provilkov et al., 2020) for a BPE model, `alpha` the
        probability of dropping a merge.

        Reproducible for a `seed`: SentencePiece's generator is seeded, then the lines are
        encoded in order on one thread of their own (a batch call starts fresh threads, whose
        generators start from the seed), so the same seed gives the same ids.
        """
        spm.set_random_generator_seed(seed)
        return self._text.encode(
            list(lines),
            out_type=int,
            enable_sampling=True,
            alpha=alpha,
            nbest_size=-1,
            num_threads=1,
        )

    def decode(self, ids: Sequence[Sequence[int]]) -> list[str]:
        """Piece ids -> detokenized text; special ids are dropped."""
        specials = {PAD_ID, BOS_ID, EOS_ID}
        seqs = [[i for i in seq if i not in specials] for seq in ids]
        if len(seqs) < BATCH_DECODE:
            # SentencePiece's batch call starts a thread each time, which costs more than a
            # few sentences one by one (translate decodes a line's hypotheses at once).
            return [self.sp.decode(seq) for seq in seqs]
        return self.sp.decode(seqs)

    def pieces(self, ids: Sequence[int]) -> list[str]:
        """Piece strings of `ids`, for attention plots and export vocabularies."""
        return [self.sp.id_to_piece(int(i)) for i in ids]

    def all_pieces(self) -> list[str]:
        """Every piece in id order."""
        return [self.sp.id_to_piece(i) for i in range(self.vocab_size)]


def text_only(model: bytes) -> bytes:
    """The SentencePiece model `model` with every user-defined piece made a control piece: the
    same ids and segmentation, but a piece's string in a sentence is no longer that piece."""
    from sentencepiece import sentencepiece_model_pb2  # protobuf: tensorboard's dependency

    proto = sentencepiece_model_pb2.ModelProto.FromString(model)  # type: ignore[attr-defined]
    for piece in proto.pieces:
        if piece.type == piece.USER_DEFINED:
            piece.type = piece.CONTROL
    return proto.SerializeToString()


def train_tokenizer(
    cfg: TokenizerConfig, lines: Sequence[str], cache: Path, symbols: Sequence[str] = ()
) -> Tokenizer:
    """Train (or fetch from `cache`) a SentencePiece model on `lines` with `cfg`'s settings.

    `symbols` (corpus tags such as <bt>) become pieces of their own, never split.
    """
    settings: dict[str, Any] = {
        "vocab_size": cfg.vocab_size,
        "model_type": cfg.model_type,
        "character_coverage": cfg.character_coverage,
        "byte_fallback": cfg.byte_fallback,
        "input_sentence_size": cfg.max_sentences,
    }
    if symbols:  # only then: the cache key of a model without tags stays what it was
        settings["user_defined_symbols"] = list(symbols)
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode())
    for line in lines:
        digest.update(line.encode("utf-8") + b"\n")
    cached = cache / f"{digest.hexdigest()[:32]}.model"
    found = _from_cache(cached)
    if found is not None:
        return found
    log.info(
        "SentencePiece: training a %d-piece %s model on %s lines ...",
        cfg.vocab_size,
        cfg.model_type,
        f"{len(lines):,}",
    )
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(line for line in lines if line.strip()),
            model_writer=model,
            pad_id=PAD_ID,
            unk_id=UNK_ID,
            bos_id=BOS_ID,
            eos_id=EOS_ID,
            hard_vocab_limit=False,
            shuffle_input_sentence=True,
            num_threads=1,  # one thread keeps the training deterministic
            minloglevel=2,
            **settings,
        )
    except RuntimeError as err:
        raise _training_error(cfg, len(lines), err) from None
    try:
        with atomic_write(cached) as out:
            out.write(model.getvalue())
    except OSError as err:
        raise _cache_error(cached.parent, err) from None
    return Tokenizer(model.getvalue())


def _from_cache(cached: Path) -> Tokenizer | None:
    """The tokenizer cached at `cached`, or None (after checking that the cache folder can take
    one, before SentencePiece trains rather than after); a damaged entry is trained again."""
    cache = cached.parent
    try:
        if cached.is_file():
            tokenizer = Tokenizer(cached.read_bytes())
            log.info("SentencePiece: found in the cache (%s)", cached)
            return tokenizer
        cache.mkdir(parents=True, exist_ok=True)
        if not writable_dir(cache):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
    except RuntimeError:
        pass  # a damaged cache entry: train again and replace it
    except OSError as err:
        raise _cache_error(cache, err) from None
    return None


def _training_error(cfg: TokenizerConfig, lines: int, err: RuntimeError) -> ConfigError:
    """SentencePiece's refusal to train as one line, with the setting to change."""
    reason = str(err).splitlines()[-1] if str(err) else "unknown"
    hint = ""
    if "input_sentence_size" in reason or (
        "ocabulary size" in reason and cfg.max_sentences < lines
    ):  # the cap left too few sentences for the vocabulary
        hint = (
            f"; tokenizer.max_sentences {cfg.max_sentences} leaves too few sentences for it: "
            "raise tokenizer.max_sentences or lower tokenizer.vocab_size"
        )
    elif cfg.byte_fallback and cfg.vocab_size < 300:
        hint = (
            "; byte_fallback takes 256 byte pieces plus one per character: raise "
            "tokenizer.vocab_size or set tokenizer.byte_fallback: false"
        )
    return ConfigError(
        f"tokenizer: SentencePiece could not train with vocab_size {cfg.vocab_size} "
        f"({reason}){hint}"
    )


def _cache_error(cache: Path, err: OSError) -> UserError:
    return UserError(
        f"{cache}: cannot use the SentencePiece cache ({os_reason(err)}); make it writable "
        "or set ATTN_MT_CACHE to another folder"
    )


def build_tokenizers(
    cfg: TokenizerConfig,
    src_lines: Sequence[str],
    tgt_lines: Sequence[str],
    cache: Path,
    src_symbols: Sequence[str] = (),
) -> tuple[Tokenizer, Tokenizer]:
    """(source, target) tokenizers: the same object when the vocabulary is joint.

    `src_symbols` (corpus tags) are reserved pieces of the source vocabulary.
    """
    if cfg.joint:
        joint = train_tokenizer(cfg, list(src_lines) + list(tgt_lines), cache, src_symbols)
        return joint, joint
    return (
        train_tokenizer(cfg, src_lines, cache, src_symbols),
        train_tokenizer(cfg, tgt_lines, cache),
    )
