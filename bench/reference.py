"""The reference model: `torch.nn.Transformer` dressed as attn-mt's model, timed beside it.

The Trainer's update (`attn_mt.train.loop.UpdateStep`) cannot train it (its objective takes
attn-mt's Transformer alone): its turns time `bench.steps.PlainStep`, the one plain step.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch
import torch.nn as nn

from attn_mt.model.positions import sinusoidal_table
from attn_mt.model.transformer import feed_forward_dropout
from attn_mt.model.vocab import PAD_ID


class Reference(nn.Module):
    """`torch.nn.Transformer` dressed as attn-mt's model `m` (a `model:` config): the same
    embeddings (shared, scaled, sinusoidal positions, dropout), pre- or post-norm, the same
    dropout on sub-layer outputs, the feed-forward hidden layer and attention weights, tied
    output projection."""

    table: torch.Tensor  # the sinusoidal positions, a buffer

    def __init__(self, m: Any, vocab: int):
        super().__init__()
        self.d = d = m.d_model
        self.embedding = nn.Embedding(vocab, d, padding_idx=PAD_ID)
        nn.init.normal_(self.embedding.weight, std=d**-0.5)
        self.dropout = nn.Dropout(m.dropout)
        with warnings.catch_warnings():  # pre-norm: its inference fast path is off; we train
            warnings.filterwarnings("ignore", message="enable_nested_tensor is True")
            self.core = nn.Transformer(d, m.heads, m.encoder_layers, m.decoder_layers, m.d_ff,
                                       m.dropout, batch_first=True,
                                       norm_first=m.norm == "pre")  # fmt: skip
        for layer in self.core.modules():
            if isinstance(layer, nn.TransformerEncoderLayer | nn.TransformerDecoderLayer):
                layer.dropout.p = feed_forward_dropout(m)  # between linear1 and linear2
            elif isinstance(layer, nn.MultiheadAttention):
                layer.dropout = m.attention_dropout
        self.register_buffer("table", sinusoidal_table(1024, d), persistent=False)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Scaled embeddings plus sinusoidal positions, then dropout: (B, L) -> (B, L, D)."""
        x = self.embedding(ids) * math.sqrt(self.d) + self.table[: ids.size(1)]
        return self.dropout(x)

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        """The logits (B, T, V) of `tgt_in` (B, T) given `src` (B, S), teacher-forced."""
        length = tgt_in.size(1)  # True: may not attend (boolean, as the padding masks are)
        causal = torch.ones(length, length, dtype=torch.bool, device=src.device).triu(1)
        hidden = self.core(
            self.embed(src),
            self.embed(tgt_in),
            tgt_mask=causal,
            src_key_padding_mask=src == PAD_ID,
            tgt_key_padding_mask=tgt_in == PAD_ID,
            memory_key_padding_mask=src == PAD_ID,
            tgt_is_causal=True,
        )
        return hidden @ self.embedding.weight.T  # (B, T, V)
