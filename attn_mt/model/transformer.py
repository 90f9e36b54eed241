"""The Transformer encoder-decoder (Vaswani et al., 2017) with our own attention.

Shape legend: B batch, S source length, T target length, D model width, V vocabulary size.
`encode` and `decode` are separate so search can run the decoder one step at a time with a
key/value cache; `build_model` is the only function that reads the config.
Target padding is on the right, so the causal rule alone keeps every real position from seeing
a pad: decoder self-attention needs no mask and reaches torch's flash kernel on CUDA.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from attn_mt.config.schema import Config, ModelConfig
from attn_mt.model.attention import MultiHeadAttention, causal_mask
from attn_mt.model.kv_cache import KVCache
from attn_mt.model.positions import POSITIONS, Positions
from attn_mt.model.vocab import PAD_ID

DecoderCache = list[tuple[KVCache, KVCache]]  # per decoder layer: (self-attention, cross)


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


# ---------------------------------------------------------------------------------------------
# Layers


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


class FeedForward(nn.Module):
    """FFN(x) = W_2 dropout(act(W_1 x + b_1)) + b_2, applied at every position."""

    def __init__(self, d_model: int, d_ff: int, dropout: float, activation: str):
        super().__init__()
        self.w_1, self.w_2 = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)
        self.activation = F.gelu if activation == "gelu" else F.relu
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
    activation: str = "relu"  # "relu" or "gelu"
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


# ---------------------------------------------------------------------------------------------
# The model


class Transformer(nn.Module):
    """Encoder-decoder Transformer. Use `encode` once, then `decode` (whole or step by step)."""

    def __init__(
        self,
        src_vocab: int,
        tgt_vocab: int,
        layer: LayerSpec,
        encoder_layers: int = 3,
        decoder_layers: int = 3,
        positions: str = "sinusoidal",
        max_positions: int = 1024,
        share_embeddings: bool = True,
        tie_output: bool = True,
    ):
        super().__init__()
        # A training choice, not the architecture (build_model sets it from train.): training
        # keeps only each layer's input and recomputes the rest in the backward pass.
        self.activation_checkpointing = False
        # Under bf16 autocast, the residual stream in bf16 (`_stream`); set from train. too.
        self.bf16_stream = False
        if share_embeddings and src_vocab != tgt_vocab:
            raise ValueError("shared embeddings need one vocabulary for both sides")
        d_model = layer.d_model
        self.d_model, self.pre_norm = d_model, layer.pre_norm
        tgt_embedding = nn.Embedding(tgt_vocab, d_model, padding_idx=PAD_ID)
        src_embedding = (
            tgt_embedding if share_embeddings else nn.Embedding(src_vocab, d_model, PAD_ID)
        )
        for emb in {id(e): e for e in (src_embedding, tgt_embedding)}.values():
            nn.init.normal_(emb.weight, std=d_model**-0.5)
            with torch.no_grad():
                emb.weight[PAD_ID].zero_()
        kind = POSITIONS[positions]
        self.src_embed = Embedder(src_embedding, kind(d_model, max_positions), layer.dropout)
        self.tgt_embed = Embedder(tgt_embedding, kind(d_model, max_positions), layer.dropout)
        self.encoder = nn.ModuleList(EncoderLayer(layer) for _ in range(encoder_layers))
        self.decoder = nn.ModuleList(DecoderLayer(layer) for _ in range(decoder_layers))
        # Pre-norm stacks end with a LayerNorm; post-norm layers already end normalised.
        self.encoder_norm = nn.LayerNorm(d_model) if layer.pre_norm else nn.Identity()
        self.decoder_norm = nn.LayerNorm(d_model) if layer.pre_norm else nn.Identity()
        self.output = nn.Linear(d_model, tgt_vocab, bias=False)
        if tie_output:
            self.output.weight = tgt_embedding.weight
        else:
            nn.init.normal_(self.output.weight, std=d_model**-0.5)
        self._init_linear_layers()

    def _init_linear_layers(self) -> None:
        """Xavier-uniform weights and zero biases for every projection (Vaswani et al.)."""
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear) and name != "output":
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)

    @property
    def encoder_layers(self) -> list[EncoderLayer]:
        """The layers of `encoder`, typed (an nn.ModuleList yields plain Modules)."""
        return cast(list[EncoderLayer], list(self.encoder))

    @property
    def decoder_layers(self) -> list[DecoderLayer]:
        """The layers of `decoder`, typed (an nn.ModuleList yields plain Modules)."""
        return cast(list[DecoderLayer], list(self.decoder))

    @property
    def max_positions(self) -> int | None:
        """The longest sequence the positional encoding allows (None: unbounded)."""
        return self.src_embed.positions.max_positions

    def encode(self, src: torch.Tensor, src_mask: torch.Tensor) -> torch.Tensor:
        """Source ids (B, S) and their padding mask (B, 1, 1, S) -> memory (B, S, D)."""
        x = self._stream(self.src_embed(src))  # (B, S, D)
        for layer in self.encoder:
            x = self._run(layer, x, src_mask)
        return self.encoder_norm(x)

    def decode(
        self,
        tgt: torch.Tensor,
        memory: torch.Tensor,
        src_mask: torch.Tensor | None,
        cache: DecoderCache | None = None,
    ) -> torch.Tensor:
        """Target prefix ids (B, T) -> next-token logits (B, T, V): `output` of the final states.

        Without a cache, `tgt` is the whole prefix, padded on the right, and position t sees
        positions <= t (the pads after a row's last token are never among them; the logits at
        pad positions are not meaningful). With a cache, `tgt` holds only the new step(s) (no
        padding): earlier keys and values come from the cache and positions continue where
        the cache ends. `src_mask` None: every memory position is a real one (no padding).
        """
        return self.output(self._decoder_states(tgt, memory, src_mask, cache))  # (B, T, V)

    def _decoder_states(
        self,
        tgt: torch.Tensor,
        memory: torch.Tensor,
        src_mask: torch.Tensor | None,
        cache: DecoderCache | None = None,
    ) -> torch.Tensor:
        """`decode` short of the output projection: the decoder's final states (B, T, D)."""
        offset = cache[0][0].length if cache else 0
        y = self._stream(self.tgt_embed(tgt, offset))  # (B, T, D)
        if cache is not None and tgt.size(1) > 1:
            self_mask = causal_mask(tgt.size(1), tgt.device, offset)  # (1, 1, T, offset + T)
        else:  # whole prefix: the causal flag; one cached step may attend everything cached
            self_mask = None
        for i, layer in enumerate(self.decoder):
            layer_cache = cache[i] if cache else None
            y = self._run(layer, y, memory, self_mask, src_mask, layer_cache, cache is None)
        return self.decoder_norm(y)  # (B, T, D)

    def _stream(self, x: torch.Tensor) -> torch.Tensor:
        """The embeddings in the residual stream's dtype: bf16 with `bf16_stream` under bf16
        autocast, else as they are (fp32). The layers keep the dtype they are given: each
        residual sum adds bf16 to bf16, and each layer norm reads and writes bf16 (computing in
        fp32), half the bytes of an fp32 stream (Megatron-LM's default; fairseq's fp16)."""
        device = x.device.type
        if (
            self.bf16_stream
            and torch.is_autocast_enabled(device)
            and torch.get_autocast_dtype(device) == torch.bfloat16
        ):
            return x.to(torch.bfloat16)
        return x

    def _run(self, layer: nn.Module, *args) -> torch.Tensor:
        """layer(*args), through `torch.utils.checkpoint` when training with activation
        checkpointing (gradients are the same; dropout masks are replayed, not redrawn)."""
        if self.activation_checkpointing and self.training and torch.is_grad_enabled():
            return checkpoint(layer, *args, use_reentrant=False)
        return layer(*args)

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        """Teacher forcing: logits (B, T, V) for every position of `tgt_in` (B, T)."""
        return self.output(self.features(src, tgt_in))  # (B, T, V)

    def features(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        """Teacher forcing short of the output projection: the decoder's final states (B, T, D)
        (the training loss projects them a chunk at a time: `loss.projected_loss`)."""
        src_mask = (src != PAD_ID)[:, None, None, :]  # (B, 1, 1, S)
        return self._decoder_states(tgt_in, self.encode(src, src_mask), src_mask)  # (B, T, D)

    def new_cache(self) -> DecoderCache:
        """An empty key/value cache for step-by-step decoding."""
        return [(KVCache(), KVCache(static=True)) for _ in self.decoder]


def feed_forward_dropout(m: ModelConfig) -> float:
    """The dropout rate on the feed-forward hidden layer: model.activation_dropout, or
    model.dropout where that is null (the default, and every config written before the key)."""
    return m.dropout if m.activation_dropout is None else m.activation_dropout


def build_model(cfg: Config, src_vocab: int, tgt_vocab: int) -> Transformer:
    """The model a config describes; the only place that reads `cfg.model`."""
    m = cfg.model
    layer = LayerSpec(
        d_model=m.d_model,
        heads=m.heads,
        d_ff=m.d_ff,
        dropout=m.dropout,
        activation_dropout=feed_forward_dropout(m),
        attention_dropout=m.attention_dropout,
        scoring=m.attention,
        pre_norm=m.norm == "pre",
        activation=m.activation,
        fused_attention=m.fused_attention,
    )
    model = Transformer(
        src_vocab,
        tgt_vocab,
        layer,
        encoder_layers=m.encoder_layers,
        decoder_layers=m.decoder_layers,
        positions=m.positions,
        max_positions=m.max_positions,
        share_embeddings=cfg.tokenizer.joint and m.tie_embeddings,
        tie_output=m.tie_embeddings,
    )
    model.activation_checkpointing = cfg.train.activation_checkpointing
    model.bf16_stream = cfg.train.bf16_stream
    return model


def parameter_count(model: nn.Module) -> int:
    """The model's parameters, each trained tensor once (a tied embedding and output layer are
    one; `parameters()` yields it once): the count training's first line, `attn-mt info` and
    the server's /info state. Count before `decode.packed` prepacks or quantizes the linear
    layers, whose weights then are no parameters."""
    return sum(p.numel() for p in model.parameters())
