"""Forced decoding: the log-probability a model gives a reference translation of a source, as
`marian-scorer` and fairseq's `--score-reference` give it.

A pair's score is log P(reference pieces, </s> | source), summed over the target positions;
the per-token scores are those terms, one per piece and one for </s>. It is exactly what a
search accumulates (`Hypothesis.logprob`): greedy search's own output scores its own logprob.

Shapes: B pairs, S source length, T target length (+1 for <bos> or </s>), V vocabulary.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from attn_mt.data.batching import length_batches, source_batch
from attn_mt.data.ids import target_ids
from attn_mt.decode.translator import Translator
from attn_mt.errors import UserError
from attn_mt.model.transformer import Transformer
from attn_mt.model.vocab import BOS_ID, EOS_ID, PAD_ID
from attn_mt.precision import autocast_context


@dataclass
class PairScore:
    """One pair's forced-decoding scores: `total` = sum(`tokens`), over `pieces` and </s>."""

    total: float
    tokens: list[float]
    pieces: list[str]

    @property
    def normalized(self) -> float:
        """The mean per token (pieces and </s>), as marian-scorer's --normalize."""
        return self.total / len(self.tokens)


def score_ids(
    model: Transformer,
    src: Sequence[Sequence[int]],
    tgt: Sequence[Sequence[int]],
    batch_tokens: int = 4096,
) -> list[list[float]]:
    """log P(token | source, previous tokens) of every target token and the </s> after them,
    per pair, in input order; batched by length, `batch_tokens` per batch."""
    device = next(model.parameters()).device
    scores: list[list[float]] = [[] for _ in src]
    lengths = [(len(s) + 1, len(t) + 1) for s, t in zip(src, tgt, strict=True)]
    for rows in length_batches(lengths, batch_tokens):
        src_batch = source_batch(src, rows).to(device)  # (B, S)
        width = max(len(tgt[i]) for i in rows) + 1
        tgt_in = torch.full((len(rows), width), PAD_ID, dtype=torch.long)  # (B, T+1)
        tgt_out = torch.full((len(rows), width), PAD_ID, dtype=torch.long)  # (B, T+1)
        for b, i in enumerate(rows):
            tgt_in[b, : len(tgt[i]) + 1] = torch.tensor([BOS_ID, *tgt[i]])
            tgt_out[b, : len(tgt[i]) + 1] = torch.tensor([*tgt[i], EOS_ID])
        with torch.inference_mode():
            logits = model(src_batch, tgt_in.to(device)).float()  # (B, T+1, V)
            log_probs = logits.log_softmax(dim=-1)
            picked = log_probs.gather(-1, tgt_out.to(device)[:, :, None])[:, :, 0]  # (B, T+1)
        for b, i in enumerate(rows):
            scores[i] = picked[b, : len(tgt[i]) + 1].double().tolist()
    return scores


def score_lines(
    translator: Translator,
    sources: Sequence[str],
    references: Sequence[str],
    batch_tokens: int = 4096,
    tgt_lang: str | None = None,
) -> list[PairScore]:
    """Score every (source, reference) pair with the translator's (first) model; the sources
    read as `translate` reads them (`Translator.encode`: a multilingual model's tag for
    `tgt_lang`, over-long lines cut), the references as validation reads them (`target_ids`:
    stripped, whole)."""
    if len(sources) != len(references):
        raise UserError(f"score: {len(sources)} source lines but {len(references)} reference lines")
    src = translator.encode(sources, tgt_lang)
    tgt = target_ids(translator.tgt_tokenizer, references)
    limit = translator.max_output_len
    for number, ids in enumerate(tgt, start=1):
        if limit is not None and len(ids) + 1 > limit:
            raise UserError(
                f"line {number}: the reference has {len(ids)} pieces; the model's positions "
                f"hold {limit - 1}"
            )
    with autocast_context(translator.device, translator.dtype):
        scores = score_ids(translator.model, src, tgt, batch_tokens)
    return [
        PairScore(sum(tokens), tokens, [*translator.tgt_tokenizer.pieces(t), "</s>"])
        for tokens, t in zip(scores, tgt, strict=True)
    ]
