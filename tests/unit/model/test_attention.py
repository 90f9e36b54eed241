"""Attention maths: our MultiHeadAttention against torch's, the math path against the fused
kernel, additive scoring against a hand-written loop, masks and the key/value cache.

Everything runs in float64 at tiny sizes with fixed seeds, so "equal" means equal to ~1e-12.
Our masks are bool with True = "may attend"; torch's `key_padding_mask` and bool `attn_mask`
use True = "ignore", hence the `~` where the two meet.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from attn_mt.model.attention import (
    MultiHeadAttention,
    additive_attention,
    causal_mask,
    dot_product_attention,
    fused_dot_product_attention,
    padding_mask,
    record_attention,
    short_causal,
)
from attn_mt.model.kv_cache import KVCache

B, T, S, D, H = 2, 5, 7, 8, 2  # batch, query length, key length, model width, heads
DH = D // H


def randn(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.float64)


def random_mask(*shape: int) -> torch.Tensor:
    """A random bool mask whose every row (last dim) lets at least key 0 through."""
    mask = torch.rand(*shape) < 0.5
    mask[..., 0] = True
    return mask


def key_keep(lengths: list[int], total: int) -> torch.Tensor:
    """(B, total) bool: True for the first `lengths[b]` keys of row b (the real tokens)."""
    return torch.arange(total)[None, :] < torch.tensor(lengths)[:, None]


def torch_twin(ours: MultiHeadAttention) -> nn.MultiheadAttention:
    """A torch.nn.MultiheadAttention holding exactly our projection weights."""
    theirs = nn.MultiheadAttention(D, H, batch_first=True, dtype=torch.float64)
    with torch.no_grad():
        theirs.in_proj_weight.copy_(ours.in_proj.weight)
        theirs.in_proj_bias.copy_(ours.in_proj.bias)
        theirs.out_proj.weight.copy_(ours.out_proj.weight)
        theirs.out_proj.bias.copy_(ours.out_proj.bias)
    return theirs.eval()


# ---------------------------------------------------------------------------------------------
# MultiHeadAttention == torch.nn.MultiheadAttention


@pytest.mark.parametrize("fused", [False, True], ids=["math", "fused"])
@pytest.mark.parametrize("kind", ["self", "cross"])
@pytest.mark.parametrize("pad", [False, True], ids=["nopad", "pad"])
@pytest.mark.parametrize("attn", [False, True], ids=["nomask", "mask"])
def test_matches_torch_multihead_attention(fused: bool, kind: str, pad: bool, attn: bool):
    """Same weights, same inputs, same masks -> same output and same per-head weights."""
    torch.manual_seed(0)
    ours = MultiHeadAttention(D, H, fused=fused).double().eval()
    with torch.no_grad():  # non-zero biases, so a misplaced bias slice would show
        ours.in_proj.bias.normal_()
        ours.out_proj.bias.normal_()
    theirs = torch_twin(ours)
    query = randn(B, T, D)
    key_value = query if kind == "self" else randn(B, S, D)
    keys = key_value.size(1)

    mask = torch.ones(1, 1, T, keys, dtype=torch.bool)
    key_padding_mask = attn_mask = None
    if pad:
        keep = key_keep([keys, keys - 3], keys)  # (B, S)
        mask = mask & keep[:, None, None, :]
        key_padding_mask = ~keep
    if attn:  # causal for self-attention, an arbitrary pattern for cross-attention
        allowed = causal_mask(T)[0, 0] if kind == "self" else random_mask(T, keys)  # (T, S)
        mask = mask & allowed
        attn_mask = ~allowed

    expected, expected_weights = theirs(
        query,
        key_value,
        key_value,
        key_padding_mask=key_padding_mask,
        attn_mask=attn_mask,
        need_weights=True,
        average_attn_weights=False,
    )
    actual = ours(query, key_value, mask if (pad or attn) else None)
    torch.testing.assert_close(actual, expected, rtol=0, atol=1e-6)
    assert (actual - expected).abs().max() < 1e-12

    with record_attention(ours):
        ours(query, key_value, mask)
        weights = ours.last_weights
    torch.testing.assert_close(weights, expected_weights, rtol=0, atol=1e-12)


# ---------------------------------------------------------------------------------------------
# Math path == fused kernel


@pytest.mark.parametrize("mask_kind", ["none", "padding", "causal", "random"])
def test_math_path_equals_fused_kernel(mask_kind: str):
    torch.manual_seed(1)
    q, k, v = randn(B, H, T, DH), randn(B, H, T, DH), randn(B, H, T, DH)
    mask = {
        "none": None,
        "padding": padding_mask(torch.tensor([[5, 6, 7, 8, 9], [5, 6, 7, 0, 0]]), pad_id=0),
        "causal": causal_mask(T),
        "random": random_mask(B, H, T, T),
    }[mask_kind]
    out, weights = dot_product_attention(q, k, v, mask)
    torch.testing.assert_close(out, fused_dot_product_attention(q, k, v, mask), rtol=0, atol=1e-12)
    torch.testing.assert_close(weights.sum(-1), torch.ones(B, H, T, dtype=torch.float64))
    if mask is not None:
        assert (weights.masked_select(~mask.expand_as(weights)) == 0).all()


def test_dot_product_attention_is_the_formula():
    """softmax(Q K^T / sqrt(d_k)) V written out once more, without masks."""
    torch.manual_seed(2)
    q, k, v = randn(B, H, T, DH), randn(B, H, S, DH), randn(B, H, S, DH)
    weights = torch.softmax(torch.einsum("bhtd,bhsd->bhts", q, k) / math.sqrt(DH), dim=-1)
    out, got_weights = dot_product_attention(q, k, v)
    torch.testing.assert_close(got_weights, weights, rtol=0, atol=1e-12)
    torch.testing.assert_close(out, torch.einsum("bhts,bhsd->bhtd", weights, v))


@pytest.mark.parametrize("scoring", ["dot", "additive"])
def test_query_with_no_allowed_key_gets_zeros(scoring: str):
    """A fully masked row gives zero weights and output (as the fused kernel does), not NaN,
    and no NaN gradient reaches the inputs."""
    torch.manual_seed(8)
    q, k, v = (randn(1, 1, 3, DH).requires_grad_() for _ in range(3))
    mask = torch.tensor([[True, False, False], [False, False, False], [True, True, True]])
    if scoring == "dot":
        out, weights = dot_product_attention(q, k, v, mask)
        torch.testing.assert_close(out, fused_dot_product_attention(q, k, v, mask))
    else:
        w_q, w_k, w_score = randn(1, DH, DH), randn(1, DH, DH), randn(1, DH)
        out, weights = additive_attention(q, k, v, w_q, w_k, w_score, mask)
    assert (weights[0, 0, 1] == 0).all() and (out[0, 0, 1] == 0).all()
    torch.testing.assert_close(weights[0, 0, [0, 2]].sum(-1), torch.ones(2, dtype=torch.float64))
    out.sum().backward()
    assert all(torch.isfinite(x.grad).all() for x in (q, k, v))


@pytest.mark.parametrize("kind", ["self", "cross"])
def test_fused_module_equals_math_module(kind: str):
    """MultiHeadAttention(fused=True) and (fused=False) are the same function."""
    torch.manual_seed(3)
    layer = MultiHeadAttention(D, H, fused=True).double()
    query = randn(B, T, D)
    key_value = query if kind == "self" else randn(B, S, D)
    keep = key_keep([key_value.size(1), 2], key_value.size(1))[:, None, None, :]
    for mask in (None, keep, keep & causal_mask(T) if kind == "self" else keep):
        fused = layer(query, key_value, mask)
        layer.fused = False
        math_path = layer(query, key_value, mask)
        layer.fused = True
        torch.testing.assert_close(fused, math_path, rtol=0, atol=1e-12)


# ---------------------------------------------------------------------------------------------
# Additive (Bahdanau) scoring


def test_additive_scores_match_hand_loop():
    """score(q, k) = w^T tanh(W_q q + W_k k), softmax over keys, then the weighted sum of v,
    all with explicit Python loops on a tiny example."""
    torch.manual_seed(4)
    b_, h_, t_, s_, d_, a_ = 1, 2, 2, 3, 2, 3
    q, k, v = randn(b_, h_, t_, d_), randn(b_, h_, s_, d_), randn(b_, h_, s_, d_)
    w_q, w_k, w_score = randn(h_, d_, a_), randn(h_, d_, a_), randn(h_, a_)
    out, weights = additive_attention(q, k, v, w_q, w_k, w_score)

    for b in range(b_):
        for h in range(h_):
            for t in range(t_):
                scores = []
                for s in range(s_):
                    hidden = [
                        math.tanh(
                            sum(w_q[h, d, a].item() * q[b, h, t, d].item() for d in range(d_))
                            + sum(w_k[h, d, a].item() * k[b, h, s, d].item() for d in range(d_))
                        )
                        for a in range(a_)
                    ]
                    scores.append(sum(w_score[h, a].item() * hidden[a] for a in range(a_)))
                exps = [math.exp(x) for x in scores]
                hand_weights = [e / sum(exps) for e in exps]
                for s in range(s_):
                    assert weights[b, h, t, s].item() == pytest.approx(hand_weights[s], abs=1e-12)
                for d in range(d_):
                    hand_out = sum(hand_weights[s] * v[b, h, s, d].item() for s in range(s_))
                    assert out[b, h, t, d].item() == pytest.approx(hand_out, abs=1e-12)


def test_additive_module_respects_masks():
    """Masked keys get weight exactly 0, every row sums to 1, and masked keys' values do not
    reach the output."""
    torch.manual_seed(5)
    layer = MultiHeadAttention(D, H, scoring="additive").double().eval()
    x = randn(B, T, D)
    keep = key_keep([T, 3], T)[:, None, None, :]  # (B, 1, 1, T)
    mask = keep & causal_mask(T)  # (B, 1, T, T)
    with record_attention(layer):
        out = layer(x, x, mask)
        weights = layer.last_weights  # (B, H, T, T)
    assert weights.shape == (B, H, T, T)
    assert (weights.masked_select(~mask.expand_as(weights)) == 0).all()
    torch.testing.assert_close(weights.sum(-1), torch.ones(B, H, T, dtype=torch.float64))

    # Cross-attention to a memory whose padded keys hold other values: same output.
    memory = randn(B, S, D)
    mem_keep = key_keep([S, 4], S)[:, None, None, :]
    changed = memory.clone()
    changed[1, 4:] = randn(S - 4, D)
    torch.testing.assert_close(layer(x, memory, mem_keep), layer(x, changed, mem_keep))
    assert not torch.allclose(out, layer(x, x))  # the mask did matter


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="divide"):
        MultiHeadAttention(10, 3)
    with pytest.raises(ValueError, match="scoring"):
        MultiHeadAttention(D, H, scoring="cosine")


# ---------------------------------------------------------------------------------------------
# Masks and the key/value cache


def test_masks():
    tokens = torch.tensor([[4, 5, 0], [4, 0, 0]])
    mask = padding_mask(tokens, pad_id=0)
    assert mask.shape == (2, 1, 1, 3)
    assert mask[:, 0, 0].tolist() == [[True, True, False], [True, False, False]]
    full = causal_mask(6)
    assert full.shape == (1, 1, 6, 6)
    assert torch.equal(full[0, 0], torch.ones(6, 6, dtype=torch.bool).tril())
    # With an offset, the mask is the last rows of the full one: new queries see the cache.
    assert torch.equal(causal_mask(2, offset=4), full[:, :, 4:])


@pytest.mark.parametrize("scoring", ["dot", "additive"])
def test_self_attention_cache_equals_full_causal_attention(scoring: str):
    """Feeding positions one or more at a time through a KVCache gives the causal result."""
    torch.manual_seed(6)
    layer = MultiHeadAttention(D, H, scoring=scoring).double().eval()
    x = randn(B, 6, D)
    full = layer(x, x, causal_mask(6))
    cache, outputs, start = KVCache(), [], 0
    for size in (1, 3, 2):
        chunk = x[:, start : start + size]
        mask = causal_mask(size, offset=start) if size > 1 else None
        outputs.append(layer(chunk, chunk, mask, cache))
        start += size
        assert cache.length == start
    torch.testing.assert_close(torch.cat(outputs, dim=1), full, rtol=0, atol=1e-12)


def test_static_cache_is_filled_once():
    """A cross-attention cache projects the memory on the first call and reuses it."""
    torch.manual_seed(7)
    layer = MultiHeadAttention(D, H).double().eval()
    memory = randn(B, S, D)
    cache = KVCache(static=True)
    first = layer(randn(B, 1, D), memory, None, cache)
    k_first, v_first = cache.k, cache.v
    assert first.shape == (B, 1, D) and cache.length == S
    query = randn(B, 1, D)
    expected = layer(query, memory)
    # A different memory on later steps is ignored: the cached projection is used.
    torch.testing.assert_close(layer(query, torch.zeros_like(memory), None, cache), expected)
    assert cache.k is k_first and cache.v is v_first


def test_cache_select_reorders_rows():
    k = randn(3, H, 4, DH)
    cache = KVCache(k=k, v=k + 1)
    cache.select(torch.tensor([2, 2, 0]))
    assert torch.equal(cache.k, k[[2, 2, 0]]) and torch.equal(cache.v, k[[2, 2, 0]] + 1)
    empty = KVCache()
    empty.select(torch.tensor([0]))
    assert empty.length == 0


def test_cache_takes_selected_rows_in_the_copy_that_appends():
    """Two selects (a beam reordering, then dropping a sentence) and an append equal indexing
    twice and concatenating; the cache was not copied before the append."""
    k = randn(3, H, 4, DH)
    cache = KVCache(k=k, v=k + 1)
    first, second = torch.tensor([2, 0, 1, 1]), torch.tensor([3, 0])
    cache.select(first)
    cache.select(second)
    new = randn(2, H, 1, DH)
    keys, values = cache.extend(new, new + 1)
    expected = torch.cat([k[first][second], new], dim=2)
    assert torch.equal(keys, expected) and torch.equal(values, expected + 1)
    assert cache.length == 5 and cache.k is keys


# ---------------------------------------------------------------------------------------------
# The mask-free causal path (flash on CUDA) and additive attention in pieces


@pytest.mark.parametrize(
    ("scoring", "fused"), [("dot", True), ("dot", False), ("additive", True)], ids=str
)
def test_causal_flag_equals_the_causal_mask(scoring: str, fused: bool):
    """`causal=True` with no mask is `causal_mask`: on every path, and with weights recorded."""
    torch.manual_seed(8)
    layer = MultiHeadAttention(D, H, scoring=scoring, fused=fused).double().eval()
    x = randn(B, T, D)
    masked = layer(x, x, causal_mask(T))
    torch.testing.assert_close(layer(x, x, causal=True), masked, rtol=0, atol=1e-12)
    with record_attention(layer):
        torch.testing.assert_close(layer(x, x, causal=True), masked, rtol=0, atol=1e-12)
        assert (layer.last_weights.masked_select(~causal_mask(T)) == 0).all()


def test_short_causal_leaves_flash_out_only_for_short_causal_self_attention(monkeypatch):
    """Flash left out for a causal self-attention shorter than SHORT_CAUSAL, on CUDA only. With
    the CPU let in, the result and its gradient equal the masked math path, and torch.compile
    makes one graph below the bound and one from it, with no break in either."""
    from torch._dynamo.utils import counters

    import attn_mt.model.attention as attention

    short, long = randn(B, H, 8, DH), randn(B, H, attention.SHORT_CAUSAL, DH)
    assert not short_causal(short, None, True)  # the CPU is not in SHORT_CAUSAL_DEVICES
    monkeypatch.setattr(attention, "SHORT_CAUSAL_DEVICES", ("cpu",))
    assert short_causal(short, None, True)
    assert not short_causal(long, None, True)
    assert not short_causal(short, None, False)
    assert not short_causal(short, causal_mask(8), True)

    def run(q: torch.Tensor) -> torch.Tensor:
        return fused_dot_product_attention(q, q, q, causal=True)

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(run, backend="aot_eager", fullgraph=True, dynamic=True)
    for length in (8, 20, attention.SHORT_CAUSAL, attention.SHORT_CAUSAL + 9):
        q = randn(B, H, length, DH).requires_grad_(True)
        out = compiled(q)
        (grad,) = torch.autograd.grad(out.sum(), q)
        ref_q = q.detach().requires_grad_(True)
        ref, _ = dot_product_attention(ref_q, ref_q, ref_q, causal_mask(length))
        (ref_grad,) = torch.autograd.grad(ref.sum(), ref_q)
        torch.testing.assert_close(out, ref, rtol=0, atol=1e-10)
        torch.testing.assert_close(grad, ref_grad, rtol=0, atol=1e-10)
    assert counters["stats"]["unique_graphs"] == 2
    torch._dynamo.reset()


def test_additive_attention_in_pieces_equals_whole_with_gradients():
    """Scored a few queries at a time (recomputed in the backward pass), the output and every
    gradient equal the one-piece result."""
    torch.manual_seed(9)
    inputs = [randn(B, H, T, DH), randn(B, H, S, DH), randn(B, H, S, DH)]
    weights = [randn(H, DH, DH), randn(H, DH, DH), randn(H, DH)]
    mask = padding_mask(torch.tensor([[1] * S, [1] * 4 + [0] * 3]), pad_id=0)
    results = []
    for chunk in (10**9, B * H * S * DH * 2):  # whole; two queries a piece (3 pieces)
        leaves = [t.clone().requires_grad_() for t in inputs + weights]
        out, _ = additive_attention(*leaves, mask=mask, chunk=chunk)
        out.pow(2).sum().backward()
        results.append([out.detach()] + [leaf.grad for leaf in leaves])
    for whole, pieces in zip(*results, strict=True):
        torch.testing.assert_close(pieces, whole, rtol=0, atol=1e-12)


@pytest.mark.parametrize("scoring", ["dot", "additive"])
@pytest.mark.parametrize("queries", [1, T])
@pytest.mark.parametrize("cached", [False, True])
def test_rows_sharing_one_memory_row_equal_its_copies(scoring: str, queries: int, cached: bool):
    """Beam search keeps one memory row per sentence for its G beams: attending from G * B
    query rows to B memory rows (each group of G consecutive query rows to one) gives what
    attending to each memory row copied G times gives, weights too, with masks and a cache."""
    torch.manual_seed(11)
    group = 3
    layer = MultiHeadAttention(D, H, scoring=scoring).double().eval()
    query, memory = randn(B * group, queries, D), randn(B, S, D)
    mask = padding_mask(torch.tensor([[1] * S, [1] * (S - 3) + [0] * 3]), 0)  # (B, 1, 1, S)
    copies, copied_mask = memory.repeat_interleave(group, 0), mask.repeat_interleave(group, 0)

    def attend(keys: torch.Tensor, keys_mask: torch.Tensor) -> torch.Tensor:
        return layer(query, keys, keys_mask, KVCache(static=True) if cached else None)

    torch.testing.assert_close(attend(memory, mask), attend(copies, copied_mask))  # fused
    with record_attention(layer) as [recorded]:  # the math path, weights kept
        shared = attend(memory, mask)
        weights = recorded.last_weights
        torch.testing.assert_close(shared, attend(copies, copied_mask))
        torch.testing.assert_close(weights, recorded.last_weights)
    assert weights.shape == (B * group, H, queries, S) and not weights[group:, :, :, -3:].any()
