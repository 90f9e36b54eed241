"""The Transformer encoder-decoder (Vaswani et al., 2017) with our own attention: the stacks of
`layers.py`'s encoder and decoder layers between the embedders and the output projection.

Shape legend: B batch, S source length, T target length, D model width, V vocabulary size.
`encode` and `decode` are separate so search can run the decoder one step at a time with a
key/value cache; `build_model` is the only function that reads the config.
Target padding is on the right, so the causal rule alone keeps every real position from seeing
a pad: decoder self-attention needs no mask and reaches torch's flash kernel on CUDA.
"""

from __future__ import annotations

from typing import cast

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from attn_mt.config.schema import Config, ModelConfig
from attn_mt.model.attention import causal_mask
from attn_mt.model.kv_cache import KVCache
from attn_mt.model.layers import DecoderLayer, Embedder, EncoderLayer, LayerSpec
from attn_mt.model.positions import POSITIONS
from attn_mt.model.vocab import PAD_ID

DecoderCache = list[tuple[KVCache, KVCache]]  # per decoder layer: (self-attention, cross)


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
        output_bias: bool = False,
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
        # logits = W y (+ b: a learned bias per target piece, Marian's `final_logits_bias`)
        self.output = nn.Linear(d_model, tgt_vocab, bias=output_bias)
        if output_bias:
            nn.init.zeros_(self.output.bias)
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
        return self.output(self.decoder_states(tgt, memory, src_mask, cache))  # (B, T, V)

    def decoder_states(
        self,
        tgt: torch.Tensor,
        memory: torch.Tensor,
        src_mask: torch.Tensor | None,
        cache: DecoderCache | None = None,
    ) -> torch.Tensor:
        """`decode` short of the output projection: the decoder's final states (B, T, D) (a
        search with a shortlist projects them onto some rows of the output layer)."""
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
        return self.decoder_states(tgt_in, self.encode(src, src_mask), src_mask)  # (B, T, D)

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
        output_bias=m.output_bias,
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
