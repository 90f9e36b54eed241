"""The text side of `bench/marian.py`'s folders: Multi30k lines (a multilingual source with its
target's `>>xx<<` label), SentencePiece models as OPUS-MT trains them, and a vocab.json as
Marian's `marian-vocab` and transformers' converter make it."""

from __future__ import annotations

import collections
import io
from typing import Any

import sentencepiece as spm

from attn_mt.data.corpora import corpus_file
from attn_mt.data.text import read_lines as read_text_lines

MULTI30K = {"deu": "de", "eng": "en", "fra": "fr", "ces": "cs"}  # ISO 639-3 -> file suffix


def read_lines(lang: str, split: str = "train", limit: int | None = None) -> list[str]:
    """Multi30k lines of `lang` (de, en, fr, cs) from `split` (train, val, test_2016_flickr)."""
    lines = read_text_lines(corpus_file("multi30k", f"{split}.{lang}.gz"))
    return lines[:limit] if limit else lines


def corpus(
    shape: Any, limit: int | None = None, split: str = "train"
) -> tuple[list[str], list[str]]:
    """(source lines, target lines) of a shape; a multilingual source line starts with its
    target's label, the targets cycling through `shape.tgt` line by line."""
    src = read_lines(shape.src, split, limit)
    if not shape.labels:
        return src, read_lines(shape.tgt[0], split, limit)
    targets = {code: read_lines(MULTI30K[code], split, limit) for code in shape.tgt}
    src_out, tgt_out = [], []
    for i, line in enumerate(src):
        code = shape.tgt[i % len(shape.tgt)]
        src_out.append(f">>{code}<< {line}")
        tgt_out.append(targets[code][i])
    return src_out, tgt_out


def strip_label(line: str) -> tuple[list[str], str]:
    """MarianTokenizer.remove_language_code: a leading '>>xx<<' split off the text."""
    if line.startswith(">>") and (end := line.find("<<")) != -1:
        return [line[: end + 2]], line[end + 2 :]
    return [], line


def train_spm(lines: list[str], size: int, seed: int) -> bytes:
    """A SentencePiece unigram model as OPUS-MT trains them: default special pieces (<unk> 0,
    <s> 1, </s> 2, no <pad>), nmt_nfkc normalisation, full character coverage."""
    spm.set_random_generator_seed(seed)
    out = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter([ln for ln in lines if ln.strip()]),
        model_writer=out,
        vocab_size=size,
        model_type="unigram",
        character_coverage=1.0,
        hard_vocab_limit=False,
        num_threads=1,
        minloglevel=2,
    )
    return out.getvalue()


def piece_counts(sp: spm.SentencePieceProcessor, lines: list[str]) -> collections.Counter:
    """How often each piece occurs in `lines` segmented by `sp` (labels counted as pieces)."""
    counts: collections.Counter = collections.Counter()
    for line in lines:
        label, text = strip_label(line)
        counts.update(label)
        counts.update(sp.encode(text, out_type=str))
    return counts


def marian_vocab(
    counts: collections.Counter, models: list[spm.SentencePieceProcessor], size: int
) -> dict[str, int]:
    """A vocab.json as marian-vocab + the converter make it: </s> 0, <unk> 1, the pieces seen in
    the segmented text by frequency (ties by string), then the models' pieces never seen, then
    filler entries up to size - 1 (pieces no model produces), and <pad> last (size - 1). Where the
    pieces outnumber size - 1, the rarest are left out (they encode as <unk>)."""
    order = ["</s>", "<unk>"]
    seen = set(order)
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    for piece, _ in ranked:
        if piece not in seen:
            order.append(piece)
            seen.add(piece)
    for sp in models:
        for i in range(sp.get_piece_size()):
            piece = sp.id_to_piece(i)
            if not (sp.is_control(i) or sp.is_unknown(i)) and piece not in seen:
                order.append(piece)
                seen.add(piece)
    order = order[: size - 1]
    n = 0
    while len(order) < size - 1:
        order.append(f"▁⟪filler{n}⟫")  # never produced: no model holds these characters
        n += 1
    order.append("<pad>")
    return {piece: i for i, piece in enumerate(order)}
