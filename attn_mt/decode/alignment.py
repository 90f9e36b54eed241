"""Word alignments from cross-attention: which source word each output word came from.

The finished outputs are run once more through the decoder with teacher forcing (the same
attention the search saw: cached decoding equals uncached), recording the cross-attention of
the decoder at the step that chose each output piece, averaged over heads, over every decoder
layer (or the one `decode.alignment_layer` names) and over an ensemble's models. The layers,
the heads' reduction and the step were chosen by alignment error rate against hand-aligned
pairs (`scripts/bench_align.py`, figures in docs/decoding.md): one layer alone (the
penultimate, Garg et al., 2019), a head alone or the largest head, and the step after (where
the piece is the decoder's input; Chen et al., 2020) align worse.

Pieces are merged into words at SentencePiece's word boundaries (a piece starting with U+2581
starts a word): a target word's attention is the mean of its pieces' rows, a source word's
share the sum of its pieces' columns, and each target word is linked to the source word with
the largest share. The pairs are Pharaoh `i-j` (source word i, target word j, from 0), in
target order.

Shape legend: B outputs, S source length, T output length, H heads, L layers.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import ExitStack

import torch

from attn_mt.data.batching import pad_sequences
from attn_mt.data.tokenizer import Tokenizer
from attn_mt.errors import UserError
from attn_mt.model.attention import padding_mask, record_attention
from attn_mt.model.transformer import Transformer
from attn_mt.model.vocab import BOS_ID, EOS_ID, PAD_ID

WORD_START = "\u2581"  # SentencePiece's mark of a piece that begins a word

Alignment = list[tuple[int, int]]  # (source word, target word) pairs


def layer_index(models: Sequence[Transformer], layer: int) -> int:
    """`layer` (negative: from the end) as an index valid in every model's decoder; -2 in a
    one-layer decoder is its one layer."""
    depth = min(len(m.decoder) for m in models)
    if layer == -2 and depth == 1:
        return 0
    if not -depth <= layer < depth:
        raise UserError(f"decode.alignment_layer {layer}: the decoder has {depth} layers")
    return layer % depth


@torch.no_grad()
def layer_attention(
    models: Sequence[Transformer],
    src: Sequence[list[int]],
    outputs: Sequence[list[int]],
    layers: Sequence[int],
) -> torch.Tensor:
    """The model-mean cross-attention of each decoder layer in `layers` (indices as
    `layer_index` reads them), every head apart: (L, B, H, T, S) for sources (with <eos>)
    and outputs (T: the step at <bos> that chose the first token, then one step per token)."""
    device = next(models[0].parameters()).device
    src_ids = pad_sequences([[*s, EOS_ID] for s in src], PAD_ID).to(device)  # (B, S)
    tgt_in = pad_sequences([[BOS_ID, *t] for t in outputs], PAD_ID).to(device)  # (B, T)
    src_mask = padding_mask(src_ids, PAD_ID)  # (B, 1, 1, S)
    indices = [layer_index(models, layer) for layer in layers]
    total: torch.Tensor | None = None
    for model in models:
        with ExitStack() as stack:
            recorders = [
                stack.enter_context(record_attention(model.decoder_layers[i].cross_attn))[0]
                for i in indices
            ]
            model.decode(tgt_in, model.encode(src_ids, src_mask), src_mask)
            weights = torch.stack([r.recorded_weights().float() for r in recorders])
        total = weights if total is None else total + weights  # (L, B, H, T, S)
    assert total is not None  # there is at least one model
    return total / len(models)


def cross_attention(
    models: Sequence[Transformer],
    src: Sequence[list[int]],
    outputs: Sequence[list[int]],
    layer: int | None,
) -> torch.Tensor:
    """What `word_alignment` reads: the head- and model-mean cross-attention of decoder layer
    `layer`, or with None the mean of every layer's; (B, T, S), rows as `layer_attention`'s,
    the step that chose each output token, then the one that chose </s>."""
    depth = min(len(m.decoder_layers) for m in models)
    layers = range(depth) if layer is None else [layer]
    return layer_attention(models, src, outputs, layers).mean(dim=(0, 2))


def word_starts(pieces: Sequence[str]) -> list[int]:
    """The word number of each piece: a new word at the first piece and at each U+2581 piece."""
    numbers, word = [], -1
    for i, piece in enumerate(pieces):
        if i == 0 or piece.startswith(WORD_START):
            word += 1
        numbers.append(word)
    return numbers


def source_words(tokenizer: Tokenizer, line: str, ids: Sequence[int]) -> list[int]:
    """The word of `line` (split at whitespace, as a reader counts words) that each of its
    piece ids comes from. Pieces never cross whitespace, so each word is segmented alone; a
    U+2581 the user typed inside a word splits its pieces but not the word."""
    words = line.split()
    per_word = tokenizer.encode(words)
    numbers = [w for w, word_ids in enumerate(per_word) for _ in word_ids]
    if len(numbers) != len(ids):  # a segmentation that differs in context: count by the marks
        last = max(len(words) - 1, 0)
        return [min(w, last) for w in word_starts(tokenizer.pieces(ids))]
    return numbers


def output_words(tokenizer: Tokenizer, ids: Sequence[int]) -> list[int]:
    """The word of the decoded output (split at whitespace) that each piece id ends in: the
    words of the text decoded up to and including it, less one. A piece of whitespace alone
    (as sampling may draw) belongs to the word before it; an unknown piece, decoded " ⁇ ",
    is a word of its own, as the text shows it."""
    total = len(tokenizer.decode([ids])[0].split())
    prefixes = tokenizer.decode([ids[: k + 1] for k in range(len(ids))])
    return [min(max(len(text.split()) - 1, 0), max(total - 1, 0)) for text in prefixes]


def word_alignment(
    attention: torch.Tensor, src_words: list[int], out_words: list[int], shift: int = 0
) -> Alignment:
    """Pharaoh pairs from one output's piece attention (T, S) (the source's <eos> column and
    padding included, then dropped), given each source and output piece's word number; an
    output piece's row is the step `shift` steps after the one that chose it."""
    if not src_words or not out_words:
        return []
    rows = slice(shift, shift + len(out_words))
    piece_att = attention[rows, : len(src_words)]  # (T, S) without <eos>, padding
    to_src = torch.zeros(len(src_words), max(src_words) + 1).index_put_(
        (torch.arange(len(src_words)), torch.tensor(src_words)), torch.tensor(1.0)
    )  # (S, source words): sums a source word's pieces
    to_out = torch.zeros(max(out_words) + 1, len(out_words)).index_put_(
        (torch.tensor(out_words), torch.arange(len(out_words))), torch.tensor(1.0)
    )  # (output words, T)
    to_out /= to_out.sum(dim=1, keepdim=True).clamp(min=1)  # a mean over a word's pieces
    word_att = to_out @ piece_att.cpu() @ to_src  # (output words, source words)
    return [(int(i), j) for j, i in enumerate(word_att.argmax(dim=1).tolist())]


def alignment_error_rate(found: Sequence[Alignment], gold: Sequence[Alignment]) -> float:
    """AER over a corpus (Och & Ney, 2003) with every gold link sure:
    1 - 2 |A & G| / (|A| + |G|), A the links found, G the gold links, summed over sentences."""
    hits = sum(len(set(a) & set(g)) for a, g in zip(found, gold, strict=True))
    links = sum(len(set(a)) + len(set(g)) for a, g in zip(found, gold, strict=True))
    return 1 - 2 * hits / links if links else 0.0
