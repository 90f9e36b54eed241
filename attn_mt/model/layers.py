"""The Transformer's layers (Vaswani et al., 2017), each built from one `LayerSpec`: the embedder
(token embeddings scaled by sqrt(D) plus positions), the encoder and decoder layers, and their
parts: residual blocks (pre-norm or post-norm), the feed-forward block, dropout. The model that
stacks them is `transformer.py`'s.

Shape legend: B batch, S source length, T target length, L either, D model width.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from attn_mt.model.attention import MultiHeadAttention
from attn_mt.model.kv_cache import KVCache
from attn_mt.model.positions import Positions


class Embedder(nn.Module):
    """x = dropout(E[token] * sqrt(D) + P[position])."""

    def __init__(self, embedding: nn.Embedding, positions: Positions, dropout: float):
        super().__init__()
        self.embedding, self.positions = embedding, positions
        self.scale = math.sqrt(embedding.embedding_dim)
        self.dropout = Dropout(dropout)

    def forward(self, tokens: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """Ids (B, L) -> (B, L, D), the first token at position `offset`."""
        x = self.embedding(tokens) * self.scale  # (B, L, D)
        return self.dropout(x + self.positions(tokens.size(1), offset).to(x.dtype))


class Dropout(nn.Module):
    """Inverted dropout: each element is zeroed with probability p, the rest scaled by 1/(1-p).

    On the CPU, torch's dropout draws one 32-bit random number per element, a visible share of
    a training step; here each 64-bit draw gives four 16-bit numbers (figures:
    docs/performance.md). So p is rounded to a multiple of 1/65536, and the scale uses the
    rounded p (E[output] = input).
    On other devices torch's fused dropout kernel is used.
    """

    def __init__(self, p: float):
        super().__init__()
        self.p = p
        self.threshold = min(round(p * 65536), 65535)  # drop where a uniform 16-bit draw < this

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.threshold == 0:
            return x
        if x.device.type != "cpu":
            return F.dropout(x, self.p, training=True)
        n = x.numel()
        draws = torch.empty((n + 3) // 4, dtype=torch.int64).random_(-(2**63), None)  # 64 bits
        signed16 = draws.view(torch.int16)[:n].view(x.shape)  # uniform in [-32768, 32767]
        keep = signed16 >= self.threshold - 32768  # probability 1 - threshold / 65536
        return x * (keep.to(x.dtype) * (65536 / (65536 - self.threshold)))

    def extra_repr(self) -> str:
        return f"p={self.p}"


# model.activation -> the feed-forward non-linearity; swish(x) = x * sigmoid(x) (SiLU), as the
# OPUS-MT models use it.
ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "relu": F.relu,
    "gelu": F.gelu,
    "swish": F.silu,
}


class FeedForward(nn.Module):
    """FFN(x) = W_2 dropout(act(W_1 x + b_1)) + b_2, applied at every position."""

    def __init__(self, d_model: int, d_ff: int, dropout: float, activation: str):
        super().__init__()
        self.w_1, self.w_2 = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)
        self.activation = ACTIVATIONS[activation]
        self.dropout = Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, L, D) -> (B, L, D) through a (B, L, d_ff) hidden layer."""
        return self.w_2(self.dropout(self.activation(self.w_1(x))))


class Residual(nn.Module):
    """A residual block: pre-norm x + dropout(f(LN(x))), or post-norm LN(x + dropout(f(x)))."""

    def __init__(self, d_model: int, dropout: float, pre_norm: bool):
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.dropout = Dropout(dropout)
        self.pre_norm = pre_norm

    def forward(
        self, x: torch.Tensor, sublayer: Callable[[torch.Tensor], torch.Tensor]
    ) -> torch.Tensor:
        """x (B, L, D) -> (B, L, D) with `sublayer` wrapped in the residual block."""
        if self.pre_norm:
            return x + self.dropout(sublayer(self.norm(x)))
        # CUDA's autocast runs layer norm in fp32: the stream keeps its dtype (`bf16_stream`).
        return self.norm(x + self.dropout(sublayer(x))).to(x.dtype)


@dataclass(frozen=True)
class LayerSpec:
    """What each encoder and decoder layer is made of (`build_model` fills it from `model:`)."""

    d_model: int  # D
    heads: int  # H, divides D
    d_ff: int  # feed-forward hidden width
    dropout: float = 0.0  # on sub-layer outputs
    activation_dropout: float = 0.0  # on the feed-forward hidden layer
    attention_dropout: float = 0.0  # on attention weights
    scoring: str = "dot"  # "dot" or "additive"
    pre_norm: bool = True  # LayerNorm before (pre) or after (post) each block
    activation: str = "relu"  # a name of ACTIVATIONS
    fused_attention: bool = True  # torch's scaled_dot_product_attention kernel where it applies

    def attention(self) -> MultiHeadAttention:
        """A multi-head attention block of this spec."""
        return MultiHeadAttention(
            self.d_model, self.heads, self.attention_dropout, self.scoring, self.fused_attention
        )

    def residual(self) -> Residual:
        """A residual block of this spec."""
        return Residual(self.d_model, self.dropout, self.pre_norm)

    def feed_forward(self) -> FeedForward:
        """A feed-forward block of this spec."""
        return FeedForward(self.d_model, self.d_ff, self.activation_dropout, self.activation)


class EncoderLayer(nn.Module):
    """Self-attention then feed-forward, each inside a residual block."""

    def __init__(self, spec: LayerSpec):
        super().__init__()
        self.self_attn = spec.attention()
        self.ff = spec.feed_forward()
        self.res_attn = spec.residual()
        self.res_ff = spec.residual()

    def forward(self, x: torch.Tensor, src_mask: torch.Tensor) -> torch.Tensor:
        """x (B, S, D) and the source padding mask (B, 1, 1, S) -> (B, S, D)."""
        x = self.res_attn(x, lambda h: self.self_attn(h, h, src_mask))  # (B, S, D)
        return self.res_ff(x, self.ff)


class DecoderLayer(nn.Module):
    """Masked self-attention, cross-attention to the encoder, then feed-forward."""

    def __init__(self, spec: LayerSpec):
        super().__init__()
        self.self_attn = spec.attention()
        self.cross_attn = spec.attention()
        self.ff = spec.feed_forward()
        self.res_self = spec.residual()
        self.res_cross = spec.residual()
        self.res_ff = spec.residual()

    def forward(
        self,
        y: torch.Tensor,
        memory: torch.Tensor,
        self_mask: torch.Tensor | None,
        src_mask: torch.Tensor | None,
        cache: tuple[KVCache, KVCache] | None = None,
        causal: bool = False,
    ) -> torch.Tensor:
        """y (B, T, D) attending to itself (`self_mask`, or `causal`: position t sees 0..t)
        and to memory (B, S, D) -> (B, T, D)."""
        self_cache, cross_cache = cache if cache is not None else (None, None)
        y = self.res_self(y, lambda h: self.self_attn(h, h, self_mask, self_cache, causal))
        y = self.res_cross(y, lambda h: self.cross_attn(h, memory, src_mask, cross_cache))
        return self.res_ff(y, self.ff)
