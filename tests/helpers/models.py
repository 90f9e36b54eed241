"""Tiny untrained models (in memory, or saved as checkpoints of any config) and random sources
for search and export tests, and the checks they share."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from attn_mt.checkpoint import FORMAT, save_checkpoint
from attn_mt.config.file import config_from_dict
from attn_mt.data.batching import pad_sequences
from attn_mt.data.tokenizer import train_tokenizer
from attn_mt.decode.generate import Hypothesis
from attn_mt.model.layers import LayerSpec
from attn_mt.model.transformer import Transformer, build_model
from attn_mt.model.vocab import BOS_ID, EOS_ID, PAD_ID
from helpers.toy import toy_config_dict, toy_pairs

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


def random_checkpoint(folder: Path, toy_data, joint: bool = True, **model) -> Path:
    """An untrained checkpoint in the saved format, every parameter perturbed from its init."""
    raw = toy_config_dict(toy_data, folder / "run")
    raw["model"].update(d_model=32, heads=4, encoder_layers=2, decoder_layers=3, **model)
    raw["tokenizer"]["joint"] = joint
    cfg = config_from_dict(raw)
    src, tgt = toy_pairs(300, seed=1)
    if joint:
        src_tok = tgt_tok = train_tokenizer(cfg.tokenizer, src + tgt, folder / "spm")
    else:
        src_tok = train_tokenizer(cfg.tokenizer, src, folder / "spm")
        tgt_tok = train_tokenizer(cfg.tokenizer, tgt, folder / "spm")
    torch.manual_seed(0)
    net = build_model(cfg, src_tok.vocab_size, tgt_tok.vocab_size)
    with torch.no_grad():
        for param in net.parameters():
            param.add_(0.1 * torch.randn_like(param))
    state = {
        "format": FORMAT,
        "model": net.state_dict(),
        "config": raw,
        "step": 0,
        "tokenizers": {"src": src_tok.model_bytes, "tgt": tgt_tok.model_bytes},
    }
    path = folder / "random.pt"
    save_checkpoint(state, path)
    return path
