"""Tiny untrained models and random sources for search tests, and the checks they share."""

from __future__ import annotations

import pytest
import torch

from attn_mt.data.batching import pad_sequences
from attn_mt.decode.search import (
    Hypothesis,
)
from attn_mt.model.transformer import LayerSpec, Transformer
from attn_mt.model.vocab import BOS_ID, EOS_ID, PAD_ID

VOCAB = 24


def random_model(seed: int, cls: type[Transformer] = Transformer) -> Transformer:
    """A tiny untrained model: its flat, arbitrary distributions make searches disagree."""
    torch.manual_seed(seed)
    layer = LayerSpec(d_model=32, heads=2, d_ff=64)
    return cls(VOCAB, VOCAB, layer, encoder_layers=1, decoder_layers=2).eval()


def random_sources(seed: int, count: int = 12) -> torch.Tensor:
    """(count, S) random source ids of 1-8 tokens + <eos>, right-padded."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 9, (count,), generator=gen).tolist()
    seqs = [torch.randint(4, VOCAB, (n,), generator=gen).tolist() + [EOS_ID] for n in lengths]
    return pad_sequences(seqs, PAD_ID)


def teacher_forced_logprob(model: Transformer, src: torch.Tensor, tokens: list[int]) -> float:
    """log P(tokens + <eos> | src): <bos>+tokens -> tokens+<eos> through the full decoder."""
    src = src[src != PAD_ID][None]  # (1, S)
    tgt_in = torch.tensor([[BOS_ID, *tokens]])  # (1, T)
    tgt_out = torch.tensor([[*tokens, EOS_ID]])  # (1, T)
    with torch.no_grad():
        log_probs = model(src, tgt_in).float().log_softmax(dim=-1)  # (1, T, V)
    return float(log_probs.gather(2, tgt_out[..., None]).sum())


def assert_same(a: list[Hypothesis], b: list[Hypothesis], rel: float = 1e-5) -> None:
    """Identical tokens, scores and log-probabilities equal up to float rounding."""
    assert [h.tokens for h in a] == [h.tokens for h in b]
    assert [h.score for h in a] == pytest.approx([h.score for h in b], rel=rel, abs=1e-5)
    assert [h.logprob for h in a] == pytest.approx([h.logprob for h in b], rel=rel, abs=1e-5)
