"""Attention: the scoring functions, masks and MultiHeadAttention (its decoding cache:
`kv_cache.py`).

Shape legend: B batch, H heads, T query length, S key length, D model width, Dh = D / H,
A additive-attention hidden width (= Dh).
Masks are boolean and broadcast to (B, H, T, S); True means "this query may attend this key".
A causal self-attention passes no mask but `causal=True`: torch's flash and memory-efficient
kernels take that flag and keep no (T, T) matrix (on CUDA flash is the faster for long
sequences, memory-efficient for a sentence's: `short_causal`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.checkpoint import checkpoint

from attn_mt.model.kv_cache import KVCache

# Additive attention scores this many (B, H, T, S, A) elements at a time (64 MiB in float32):
# the whole tensor of a batch of 25k tokens would take several GiB, and as much for its gradient.
ADDITIVE_CHUNK = 2**24


# Causal self-attention over fewer positions than this leaves flash out for the memory-efficient
# kernel: flash computes in tiles of 128 positions, mostly empty for a sentence (docs/gpu.md,
# "What to expect"; scripts/bench_kernels.py times both).
SHORT_CAUSAL = 96
SHORT_CAUSAL_BACKENDS = [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]  # flash left out
SHORT_CAUSAL_DEVICES = ("cuda",)

# ---------------------------------------------------------------------------------------------
# Pure scoring functions


def dot_product_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(Q K^T / sqrt(d_k)) V, the math path. Returns (output, attention weights).

    Args:
        q: (B, H, T, Dh) queries.  k, v: (B, H, S, Dh) keys and values.
        mask: bool, broadcastable to (B, H, T, S); False entries get zero weight.
        dropout_p: dropout on the weights (pass 0 at inference).
    Returns:
        (B, H, T, Dh) output and (B, H, T, S) weights (before dropout).
    """
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, H, T, S)
    return _attend(scores, v, mask, dropout_p)


def fused_dot_product_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    causal: bool = False,
) -> torch.Tensor:
    """The same function as `dot_product_attention` through torch's fused kernel (flash or
    memory-efficient attention where the device has one); weights are not materialised.
    `causal` (with no mask): query i attends keys 0..i, the one rule the flash kernel takes.
    A short causal self-attention on CUDA takes the memory-efficient kernel (`short_causal`)."""
    if short_causal(q, mask, causal):
        with sdpa_kernel(SHORT_CAUSAL_BACKENDS):
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=causal
    )


def short_causal(q: torch.Tensor, mask: torch.Tensor | None, causal: bool) -> bool:
    """Whether `fused_dot_product_attention` leaves flash out, so that memory-efficient
    attention (else the math path) takes the call: a causal self-attention (no mask) of fewer
    than SHORT_CAUSAL queries on CUDA. Under torch.compile the length test is a guard: one
    graph below the bound, one from it. (The list, not a priority order: `sdpa_kernel`'s
    `set_priority` came after torch 2.4, the oldest attn-mt runs on.)"""
    return (
        causal
        and mask is None
        and q.device.type in SHORT_CAUSAL_DEVICES
        and q.size(-2) < SHORT_CAUSAL
    )


def additive_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    w_q: torch.Tensor,
    w_k: torch.Tensor,
    w_score: torch.Tensor,
    mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    chunk: int = ADDITIVE_CHUNK,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Additive (Bahdanau) scoring per head: score(q, k) = w^T tanh(W_q q + W_k k).

    The (B, H, T, S, A) hidden tensor is built for a few queries at a time, at most `chunk`
    elements; with more than one piece, training recomputes each in the backward pass rather
    than keeping them all.

    Args:
        q: (B, H, T, Dh), k and v: (B, H, S, Dh).
        w_q, w_k: (H, Dh, A) per-head projections.  w_score: (H, A) the vector w.
    Returns:
        (B, H, T, Dh) output and (B, H, T, S) weights.
    """
    q_part = torch.einsum("bhtd,hda->bhta", q, w_q)  # (B, H, T, A)
    k_part = torch.einsum("bhsd,hda->bhsa", k, w_k)  # (B, H, S, A)
    batch, heads, length, hidden = q_part.shape
    rows = max(1, chunk // (batch * heads * k_part.size(2) * hidden))  # queries per piece
    score = _additive_scores
    if rows < length and torch.is_grad_enabled():  # one piece's hidden tensor alive at a time
        score = functools.partial(checkpoint, _additive_scores, use_reentrant=False)
    pieces = [score(q_part[:, :, i : i + rows], k_part, w_score) for i in range(0, length, rows)]
    scores = torch.cat(pieces, dim=2) if len(pieces) > 1 else pieces[0]  # (B, H, T, S)
    return _attend(scores, v, mask, dropout_p)


def _additive_scores(
    q_part: torch.Tensor, k_part: torch.Tensor, w_score: torch.Tensor
) -> torch.Tensor:
    """w^T tanh(q_part + k_part) for every (query, key) pair: (B, H, T, A), (B, H, S, A)
    -> (B, H, T, S)."""
    hidden = torch.tanh(q_part.unsqueeze(3) + k_part.unsqueeze(2))  # (B, H, T, S, A)
    return torch.einsum("bhtsa,ha->bhts", hidden, w_score)  # (B, H, T, S)


def _attend(
    scores: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, dropout_p: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Weights softmax(scores) over the allowed keys, then their weighted sum of `v`.

    Masked keys get weight exactly 0. A query with no allowed key gets all-zero weights and a
    zero output, as torch's fused kernel gives on the CPU, rather than softmax's NaNs.
    Returns (B, H, T, Dh) output and (B, H, T, S) weights (before dropout).
    """
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = scores.softmax(dim=-1)  # (B, H, T, S)
    if mask is not None:
        weights = weights.masked_fill(~mask, 0.0)  # a fully masked row: NaN -> 0
    dropped = F.dropout(weights, dropout_p) if dropout_p > 0 else weights
    return dropped @ v, weights  # (B, H, T, Dh)


# ---------------------------------------------------------------------------------------------
# Masks


def padding_mask(tokens: torch.Tensor, pad_id: int) -> torch.Tensor:
    """(B, L) ids -> (B, 1, 1, L) bool: True where the key is a real token."""
    return (tokens != pad_id)[:, None, None, :]


def causal_mask(length: int, device: torch.device | None = None, offset: int = 0) -> torch.Tensor:
    """(1, 1, T, offset + T) bool: query i (position offset + i) may attend keys 0..offset + i."""
    ones = torch.ones(length, offset + length, dtype=torch.bool, device=device)
    return ones.tril(diagonal=offset)[None, None]


# ---------------------------------------------------------------------------------------------
# The module


class MultiHeadAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1..head_H) W_o, head_i = Attn(Q W_q^i, K W_k^i, V W_v^i).

    W_q, W_k and W_v (each D x D, i.e. the H per-head Dh-wide projections side by side) are
    stacked as the rows of one `in_proj` matrix, as in `torch.nn.MultiheadAttention`, so that
    self-attention computes all three with one matrix product.
    """

    def __init__(
        self,
        d_model: int,
        heads: int,
        dropout: float = 0.0,
        scoring: str = "dot",
        fused: bool = True,
    ):
        super().__init__()
        if d_model % heads:
            raise ValueError(f"heads ({heads}) must divide d_model ({d_model})")
        self.heads, self.head_dim = heads, d_model // heads
        self.dropout, self.scoring, self.fused = dropout, scoring, fused
        self.in_proj = nn.Linear(d_model, 3 * d_model)  # rows: W_q; W_k; W_v
        self.out_proj = nn.Linear(d_model, d_model)  # W_o
        if scoring == "additive":
            self.add_w_q = nn.Parameter(torch.empty(heads, self.head_dim, self.head_dim))
            self.add_w_k = nn.Parameter(torch.empty(heads, self.head_dim, self.head_dim))
            self.add_w_score = nn.Parameter(torch.empty(heads, self.head_dim))
            for p in (self.add_w_q, self.add_w_k, self.add_w_score):
                nn.init.normal_(p, std=self.head_dim**-0.5)
        elif scoring != "dot":
            raise ValueError(f"unknown attention scoring {scoring!r}")
        self.record_weights = False  # set by `record_attention` for plots and tests
        self.last_weights: torch.Tensor | None = None  # (B, H, T, S) when recording

    def forward(
        self,
        query: torch.Tensor,
        key_value: torch.Tensor,
        mask: torch.Tensor | None = None,
        cache: KVCache | None = None,
        causal: bool = False,
    ) -> torch.Tensor:
        """Attend from `query` (B, T, D) to `key_value` (B, S, D); returns (B, T, D).

        Pass the same tensor twice for self-attention. With a `cache`, self-attention appends
        this call's keys/values to it; a static (cross-attention) cache is filled once.
        `causal` (self-attention, no mask, no cache): query i attends keys 0..i.
        `key_value` (and the cache) may hold one row per group of G consecutive query rows
        (B = G * its rows: a sentence's G beams share its encoder output); each group's
        queries are then scored together against that one row, which is read once.
        """
        q, k, v = self._project(query, key_value, cache)  # (B, H, T, Dh), (B / G, H, S, Dh)
        dropout_p = self.dropout if self.training else 0.0
        fused = self.scoring == "dot" and self.fused and not self.record_weights
        slow_fused = _slow_fused_kernel(q)
        if (group := q.size(0) // k.size(0)) > 1:
            q = _group_rows(q, group)  # (B / G, H, G * T, Dh)
        if fused and not slow_fused:
            out = fused_dot_product_attention(q, k, v, mask, dropout_p, causal)
            weights = None
        else:
            if causal:
                mask = causal_mask(q.size(2), q.device)  # (1, 1, T, T)
            if self.scoring == "additive":
                out, weights = additive_attention(
                    q, k, v, self.add_w_q, self.add_w_k, self.add_w_score, mask, dropout_p
                )
            else:
                out, weights = dot_product_attention(q, k, v, mask, dropout_p)
        if group > 1:
            out = _ungroup_rows(out, group)  # (B, H, T, Dh)
            weights = None if weights is None else _ungroup_rows(weights, group)
        if self.record_weights:
            assert weights is not None  # recording takes the math path, which returns weights
            self.last_weights = weights.detach()
        batch, _, length, _ = out.shape
        out = out.transpose(1, 2).reshape(batch, length, -1)  # (B, T, D)
        return self.out_proj(out)

    def recorded_weights(self) -> torch.Tensor:
        """`last_weights`, which a call inside `record_attention` has set; (B, H, T, S)."""
        assert self.last_weights is not None, "no weights: call it inside record_attention"
        return self.last_weights

    def _project(
        self, query: torch.Tensor, key_value: torch.Tensor, cache: KVCache | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Q, K, V split into heads, using and updating the cache."""
        if cache is not None and cache.static and cache.k is not None and cache.v is not None:
            return self._split(self._in_proj_rows(query, 0, 1)), cache.k, cache.v
        if key_value is query:
            q, k, v = self.in_proj(query).chunk(3, dim=-1)  # 3 x (B, T, D)
        else:
            q = self._in_proj_rows(query, 0, 1)  # (B, T, D)
            k, v = self._in_proj_rows(key_value, 1, 3).chunk(2, dim=-1)  # 2 x (B, S, D)
        q, k, v = self._split(q), self._split(k), self._split(v)  # (B, H, T|S, Dh)
        if cache is not None:
            k, v = cache.extend(k, v)  # (B, H, S_old + T, Dh); a static cache: its first fill
        return q, k, v

    def _in_proj_rows(self, x: torch.Tensor, first: int, last: int) -> torch.Tensor:
        """x times the blocks first..last-1 of in_proj (0 = W_q, 1 = W_k, 2 = W_v); (B, L, n*D)."""
        # Prepacked or int8 weights cannot be sliced: an inference copy (`InProj`) holds the
        # blocks' uses as layers of their own; a `OneDnnLinear` slices and multiplies itself.
        own_rows = getattr(self.in_proj, "rows", None)
        if own_rows is not None:
            return own_rows(x, first, last)
        rows = slice(first * x.size(-1), last * x.size(-1))
        return F.linear(x, self.in_proj.weight[rows], self.in_proj.bias[rows])

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        """(B, L, D) -> (B, H, L, Dh): head h takes features h*Dh .. (h+1)*Dh - 1."""
        batch, length, _ = x.shape
        return x.view(batch, length, self.heads, self.head_dim).transpose(1, 2)  # (B, H, L, Dh)


def _group_rows(x: torch.Tensor, group: int) -> torch.Tensor:
    """(B, H, T, X) -> (B / G, H, G * T, X): the T rows of G consecutive batch rows as one."""
    batch, heads, length, width = x.shape
    grouped = x.view(batch // group, group, heads, length, width).transpose(1, 2)
    return grouped.reshape(batch // group, heads, group * length, width)


def _ungroup_rows(x: torch.Tensor, group: int) -> torch.Tensor:
    """The inverse of `_group_rows`: (B / G, H, G * T, X) -> (B, H, T, X)."""
    rows, heads, grouped_length, width = x.shape
    split = x.view(rows, heads, group, grouped_length // group, width).transpose(1, 2)
    return split.reshape(rows * group, heads, grouped_length // group, width)


def _slow_fused_kernel(q: torch.Tensor) -> bool:
    """True where torch's fused kernel is slower than the math path (two matmuls and a
    softmax), on the CPU: in bf16, and for one query per row (a decoding step with the KV
    cache). The measurements: docs/performance.md (scripts/bench_train.py, bench_decode.py)."""
    return q.device.type == "cpu" and (q.dtype == torch.bfloat16 or q.size(2) == 1)


@contextmanager
def record_attention(model: nn.Module) -> Iterator[list[MultiHeadAttention]]:
    """Within the block, every MultiHeadAttention of `model` keeps its last weights
    (`.last_weights`, (B, H, T, S)); the math path is used so weights exist."""
    layers = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
    for layer in layers:
        layer.record_weights = True
    try:
        yield layers
    finally:
        for layer in layers:
            layer.record_weights, layer.last_weights = False, None
