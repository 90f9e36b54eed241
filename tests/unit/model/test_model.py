"""Model properties: padding invariance, causality, positional encodings, embedding scale,
cached == uncached decoding, weight sharing, config wiring, trainability and initialisation.

Tiny float64 models with fixed seeds; "unchanged" means equal to ~1e-10.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from attn_mt.config.file import config_from_dict
from attn_mt.errors import UserError
from attn_mt.model import transformer
from attn_mt.model.attention import causal_mask
from attn_mt.model.layers import Dropout, LayerSpec
from attn_mt.model.positions import LearnedPositions, SinusoidalPositions, sinusoidal_table
from attn_mt.model.transformer import Transformer, build_model
from attn_mt.model.vocab import BOS_ID, PAD_ID

VOCAB = 20
VARIANTS = [  # (pre_norm, scoring, learned_positions)
    (pre, scoring, learned)
    for pre in (True, False)
    for scoring in ("dot", "additive")
    for learned in (False, True)
]


def variant_id(variant: tuple[bool, str, bool]) -> str:
    pre, scoring, learned = variant
    return f"{'pre' if pre else 'post'}-{scoring}-{'learned' if learned else 'sin'}"


def tiny_model(**overrides) -> Transformer:
    """A 2+2-layer, 16-wide float64 model in eval mode (dropout off)."""
    torch.manual_seed(0)
    layer = {"d_model": 16, "heads": 2, "d_ff": 32}
    model = {"encoder_layers": 2, "decoder_layers": 2, "max_positions": 64}
    for key, value in overrides.items():
        (layer if key in LayerSpec.__dataclass_fields__ else model)[key] = value
    return Transformer(VOCAB, VOCAB, LayerSpec(**layer), **model).double().eval()


def position_kind(learned: bool) -> str:
    return "learned" if learned else "sinusoidal"


def variant_model(variant: tuple[bool, str, bool]) -> Transformer:
    pre, scoring, learned = variant
    return tiny_model(pre_norm=pre, scoring=scoring, positions=position_kind(learned))


def tokens(batch: int, length: int, seed: int) -> torch.Tensor:
    """Random non-special ids (4..VOCAB-1)."""
    return torch.randint(4, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def src_mask_of(src: torch.Tensor) -> torch.Tensor:
    return (src != PAD_ID)[:, None, None, :]  # (B, 1, 1, S)


# ---------------------------------------------------------------------------------------------
# Padding invariance and causality


@pytest.mark.parametrize("variant", VARIANTS, ids=variant_id)
def test_source_padding_changes_nothing(variant):
    """Appending pad tokens to the source leaves the encoder output at real positions and the
    decoder logits unchanged."""
    model = variant_model(variant)
    src = tokens(2, 5, seed=1)
    src[1, 3:] = PAD_ID  # row 1 is already padded; padding it further must not matter either
    padded = torch.cat([src, torch.full((2, 3), PAD_ID)], dim=1)
    tgt = torch.cat([torch.full((2, 1), BOS_ID), tokens(2, 4, seed=2)], dim=1)

    memory = model.encode(src, src_mask_of(src))
    padded_memory = model.encode(padded, src_mask_of(padded))
    torch.testing.assert_close(padded_memory[0, :5], memory[0], rtol=0, atol=1e-10)
    torch.testing.assert_close(padded_memory[1, :3], memory[1, :3], rtol=0, atol=1e-10)

    logits = model.decode(tgt, memory, src_mask_of(src))
    padded_logits = model.decode(tgt, padded_memory, src_mask_of(padded))
    torch.testing.assert_close(padded_logits, logits, rtol=0, atol=1e-10)
    torch.testing.assert_close(model(padded, tgt), logits, rtol=0, atol=1e-10)


@pytest.mark.parametrize("variant", VARIANTS[::2], ids=variant_id)
def test_future_target_tokens_do_not_leak(variant):
    """Changing target token t changes no logits before t (and does change those from t)."""
    model = variant_model(variant)
    src = tokens(2, 6, seed=3)
    tgt = torch.cat([torch.full((2, 1), BOS_ID), tokens(2, 5, seed=4)], dim=1)
    changed = tgt.clone()
    changed[:, 4] = 4 + (tgt[:, 4] - 4 + 1) % (VOCAB - 4)
    before, after = model(src, tgt), model(src, changed)
    torch.testing.assert_close(after[:, :4], before[:, :4], rtol=0, atol=1e-10)
    assert (after[:, 4:] - before[:, 4:]).abs().amax() > 1e-4


def test_target_padding_changes_nothing_before_it():
    """Pad tokens appended to a target prefix leave the logits of its real positions alone."""
    model = tiny_model()
    src = tokens(2, 6, seed=5)
    tgt = torch.cat([torch.full((2, 1), BOS_ID), tokens(2, 3, seed=6)], dim=1)
    padded = torch.cat([tgt, torch.full((2, 2), PAD_ID)], dim=1)
    torch.testing.assert_close(model(src, padded)[:, :4], model(src, tgt), rtol=0, atol=1e-10)


def test_mask_free_decoder_equals_the_masked_one_at_real_positions():
    """The whole-prefix decoder uses the causal flag alone (no mask, flash on CUDA); with right
    padding its real positions equal attention under causal & key-padding masks."""
    model = tiny_model()
    src = tokens(2, 6, seed=7)
    tgt = torch.cat([torch.full((2, 1), BOS_ID), tokens(2, 5, seed=8)], dim=1)
    tgt[1, 3:] = PAD_ID  # row 1: 3 real positions
    memory = model.encode(src, src_mask_of(src))
    self_mask = causal_mask(6) & (tgt != PAD_ID)[:, None, None, :]  # (B, 1, T, T)
    y = model.tgt_embed(tgt)
    for layer in model.decoder:
        y = layer(y, memory, self_mask, src_mask_of(src))
    masked = model.output(model.decoder_norm(y))  # (B, T, V)
    mask_free = model.decode(tgt, memory, src_mask_of(src))
    torch.testing.assert_close(mask_free[0], masked[0], rtol=0, atol=1e-10)
    torch.testing.assert_close(mask_free[1, :3], masked[1, :3], rtol=0, atol=1e-10)


def test_decoder_self_attention_reaches_the_fused_kernel_with_the_causal_flag_alone(
    monkeypatch,
):
    """Whole-prefix decoding (fp32, fused path) calls scaled_dot_product_attention for
    self-attention with no mask and is_causal: the only form torch's flash kernel takes."""
    model = tiny_model().float()
    src, tgt = tokens(2, 6, seed=9), tokens(2, 4, seed=10)
    tgt[1, 2:] = PAD_ID
    memory = model.encode(src, src_mask_of(src))
    calls = []
    sdpa = F.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, **kw):
        calls.append({"keys": k.size(2), "mask": attn_mask, "causal": is_causal})
        return sdpa(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, **kw)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    model.decode(tgt, memory, src_mask_of(src))
    self_calls = [c for c in calls if c["keys"] == 4]  # (keys = target length: 4; source: 6)
    assert len(self_calls) == len(model.decoder) and len(calls) == 2 * len(model.decoder)
    assert all(c["mask"] is None and c["causal"] for c in self_calls), self_calls
    assert all(c["mask"] is not None and not c["causal"] for c in calls if c["keys"] == 6)


# ---------------------------------------------------------------------------------------------
# Positional encodings and embeddings


def formula_table(length: int, d_model: int, offset: int = 0) -> torch.Tensor:
    """P[i, 2j] = sin(i / 10000^(2j/d)), P[i, 2j+1] = cos(i / 10000^(2j/d)), with math.sin."""
    table = torch.empty(length, d_model, dtype=torch.float64)
    for row in range(length):
        i = offset + row
        for j in range(d_model // 2):
            angle = i / 10000 ** (2 * j / d_model)
            table[row, 2 * j] = math.sin(angle)
            table[row, 2 * j + 1] = math.cos(angle)
    return table


def test_sinusoidal_table_matches_formula():
    table = sinusoidal_table(60, 10)
    assert table.shape == (60, 10)
    torch.testing.assert_close(table.double(), formula_table(60, 10), rtol=0, atol=1e-6)
    torch.testing.assert_close(
        sinusoidal_table(5, 10, offset=40).double(), formula_table(5, 10, 40), rtol=0, atol=1e-6
    )


@pytest.mark.parametrize("delta", [1, 3, 17])
def test_sinusoidal_relative_position_is_a_fixed_rotation(delta: int):
    """For each offset delta one block-diagonal matrix of 2x2 rotations M(delta), built from
    delta alone, maps P[i] to P[i + delta] for every i:
    [sin((i+δ)w), cos((i+δ)w)] = [[cos δw, sin δw], [-sin δw, cos δw]] [sin iw, cos iw]."""
    d_model, length = 8, 80
    table = sinusoidal_table(length, d_model).double()  # (L, D)
    m = torch.zeros(d_model, d_model, dtype=torch.float64)
    for j in range(d_model // 2):
        w = 1 / 10000 ** (2 * j / d_model)
        c, s = math.cos(delta * w), math.sin(delta * w)
        m[2 * j : 2 * j + 2, 2 * j : 2 * j + 2] = torch.tensor([[c, s], [-s, c]])
    torch.testing.assert_close(m @ m.T, torch.eye(d_model, dtype=torch.float64))  # a rotation
    assert torch.linalg.det(m).item() == pytest.approx(1.0)
    # P[i + delta] = M P[i] for all i at once: rows are positions, so multiply by M^T.
    torch.testing.assert_close(table[delta:], table[:-delta] @ m.T, rtol=0, atol=1e-5)


def test_sinusoidal_positions_grow_past_initial_length():
    positions = SinusoidalPositions(d_model=6, initial_length=4)
    rows = positions(10)
    assert rows.shape == (10, 6) and positions.table.size(0) >= 10
    torch.testing.assert_close(rows.double(), formula_table(10, 6), rtol=0, atol=1e-6)
    later = positions(3, offset=30)
    torch.testing.assert_close(later.double(), formula_table(3, 6, offset=30), rtol=0, atol=1e-6)
    assert "table" not in positions.state_dict()  # a pure function of the size: not saved

    # Through a whole model: a source longer than the default 512-row table just works.
    model = tiny_model(d_model=8, encoder_layers=1, decoder_layers=1)
    src = tokens(1, 520, seed=7)
    assert torch.isfinite(model.encode(src, src_mask_of(src))).all()


def test_learned_positions_past_the_end_give_a_user_error():
    model = tiny_model(positions="learned", max_positions=6)
    assert model.max_positions == 6
    src = tokens(1, 6, seed=8)
    memory = model.encode(src, src_mask_of(src))  # exactly max_positions is fine
    with pytest.raises(UserError, match="max_positions"):
        model.encode(tokens(1, 7, seed=8), torch.ones(1, 1, 1, 7, dtype=torch.bool))
    # Step by step with a cache, the 7th target position is the one too many.
    cache = model.new_cache()
    model.decode(tokens(1, 6, seed=9), memory, src_mask_of(src), cache)
    with pytest.raises(UserError, match="max_positions"):
        model.decode(tokens(1, 1, seed=9), memory, src_mask_of(src), cache)
    assert tiny_model().max_positions is None  # sinusoidal: unbounded


@pytest.mark.parametrize("learned", [False, True], ids=["sin", "learned"])
def test_embedder_scales_by_sqrt_d(learned: bool):
    """x = E[token] * sqrt(D) + P[position] (dropout off), also from an offset."""
    model = tiny_model(positions=position_kind(learned), dropout=0.3)  # eval(): dropout is off
    embed = model.tgt_embed
    ids = tokens(2, 5, seed=10)
    for offset in (0, 3):
        if learned:
            p = embed.positions.embedding.weight[offset : offset + 5]
        else:
            p = sinusoidal_table(5, 16, offset).double()
        expected = embed.embedding.weight[ids] * math.sqrt(16) + p
        torch.testing.assert_close(embed(ids, offset), expected, rtol=0, atol=1e-12)


# ---------------------------------------------------------------------------------------------
# Incremental decoding with the key/value cache


@pytest.mark.parametrize("variant", VARIANTS[::3], ids=variant_id)
@pytest.mark.parametrize("chunks", [(1,) * 6, (2, 1, 3)], ids=["steps", "chunks"])
def test_cached_decoding_equals_full_decoding(variant, chunks):
    """Feeding the target through the cache one step (or several) at a time gives the full
    decoder's logits; the cross-attention keys/values are computed once, on the first call."""
    model = variant_model(variant)
    src = tokens(2, 7, seed=11)
    src[1, 4:] = PAD_ID
    src_mask = src_mask_of(src)
    memory = model.encode(src, src_mask)
    tgt = torch.cat([torch.full((2, 1), BOS_ID), tokens(2, 5, seed=12)], dim=1)
    full = model.decode(tgt, memory, src_mask)

    cache, pieces, start = model.new_cache(), [], 0
    for size in chunks:
        # After the first call the memory is never read again: garbage in its place is fine.
        step_memory = memory if start == 0 else torch.full_like(memory, float("nan"))
        pieces.append(model.decode(tgt[:, start : start + size], step_memory, src_mask, cache))
        if start == 0:
            cross_keys = [(cross.k, cross.v) for _, cross in cache]
        start += size
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, rtol=0, atol=1e-10)
    assert all(own.length == 6 and cross.length == 7 for own, cross in cache)
    assert all(c.k is k and c.v is v for (_, c), (k, v) in zip(cache, cross_keys, strict=True))


def test_cache_select_follows_reordered_rows():
    """Reordering the cache (as beam search does) equals decoding the reordered batch."""
    model = tiny_model()
    src = tokens(2, 5, seed=13)
    tgt = torch.cat([torch.full((2, 1), BOS_ID), tokens(2, 3, seed=14)], dim=1)
    memory = model.encode(src, src_mask_of(src))
    cache = model.new_cache()
    model.decode(tgt[:, :2], memory, src_mask_of(src), cache)
    order = torch.tensor([1, 1, 0])
    for self_cache, cross_cache in cache:
        self_cache.select(order)
        cross_cache.select(order)
    step = model.decode(tgt[order, 2:], memory[order], src_mask_of(src[order]), cache)
    expected = model(src[order], tgt[order])[:, 2:]
    torch.testing.assert_close(step, expected, rtol=0, atol=1e-10)


# ---------------------------------------------------------------------------------------------
# Weight sharing, config wiring and parameter counts


def config(joint: bool = True, **model) -> object:
    """A validated Config with the given tokenizer.joint and model keys."""
    raw = {"data": {"dataset": "multi30k"}, "tokenizer": {"joint": joint}, "model": model}
    return config_from_dict(raw)


def test_weight_sharing_follows_joint_and_tie():
    small = dict(d_model=16, heads=2, encoder_layers=1, decoder_layers=1, d_ff=32)

    model = build_model(config(joint=True, tie_embeddings=True, **small), 30, 30)
    src_w, tgt_w = model.src_embed.embedding.weight, model.tgt_embed.embedding.weight
    assert src_w is tgt_w is model.output.weight

    model = build_model(config(joint=False, tie_embeddings=True, **small), 30, 40)
    src_w, tgt_w = model.src_embed.embedding.weight, model.tgt_embed.embedding.weight
    assert src_w is not tgt_w and tgt_w is model.output.weight
    assert src_w.shape == (30, 16) and tgt_w.shape == (40, 16)

    model = build_model(config(joint=True, tie_embeddings=False, **small), 30, 30)
    src_w, tgt_w = model.src_embed.embedding.weight, model.tgt_embed.embedding.weight
    assert src_w is not tgt_w and model.output.weight is not tgt_w
    assert model.output.weight is not src_w


def expected_parameters(src_vocab, tgt_vocab, d, heads, enc, dec, ff, **m) -> int:
    """The parameter count written out from the architecture."""
    attention = 4 * d * d + 4 * d  # in_proj (3D x D + 3D) and out_proj (D x D + D)
    if m.get("attention") == "additive":
        attention += 2 * heads * (d // heads) ** 2 + d  # per-head W_q, W_k (Dh x Dh) and w
    feed_forward = 2 * d * ff + ff + d
    norm = 2 * d
    total = enc * (attention + feed_forward + 2 * norm)
    total += dec * (2 * attention + feed_forward + 3 * norm)
    total += 2 * norm if m.get("norm", "pre") == "pre" else 0  # final encoder/decoder norms
    tie = m.get("tie_embeddings", True)
    shared = tie and m["joint"]
    total += tgt_vocab * d + (0 if shared else src_vocab * d)
    total += 0 if tie else tgt_vocab * d  # output projection (no bias)
    if m.get("positions") == "learned":
        total += 2 * m["max_positions"] * d  # one table per side
    return total


@pytest.mark.parametrize(
    "keys",
    [
        dict(joint=True),
        dict(joint=False, norm="post", attention="additive", positions="learned", max_positions=50),
        dict(joint=True, tie_embeddings=False, activation="gelu", activation_dropout=0.0),
        dict(joint=False, tie_embeddings=False, norm="post", activation_dropout=0.35),
    ],
)
def test_build_model_reads_the_config(keys: dict):
    sizes = dict(d_model=24, heads=3, encoder_layers=2, decoder_layers=1, d_ff=40)
    joint = keys["joint"]
    model_keys = {k: v for k, v in keys.items() if k != "joint"}
    cfg = config(joint=joint, dropout=0.2, attention_dropout=0.05, **sizes, **model_keys)
    src_vocab, tgt_vocab = (50, 50) if joint else (50, 70)
    model = build_model(cfg, src_vocab, tgt_vocab)

    count = sum(p.numel() for p in model.parameters())  # shared tensors counted once
    assert count == expected_parameters(src_vocab, tgt_vocab, 24, 3, 2, 1, 40, **keys)
    assert len(model.encoder) == 2 and len(model.decoder) == 1
    assert model.pre_norm == (cfg.model.norm == "pre")
    assert isinstance(model.encoder_norm, nn.LayerNorm if model.pre_norm else nn.Identity)
    layer = model.decoder[0]
    for attention in (layer.self_attn, layer.cross_attn, model.encoder[0].self_attn):
        assert attention.heads == 3 and attention.head_dim == 8
        assert attention.scoring == cfg.model.attention and attention.dropout == 0.05
        assert attention.fused == cfg.model.fused_attention
    # model.activation_dropout drops the feed-forward hidden layer alone; unset, model.dropout
    ff_dropout = keys.get("activation_dropout", 0.2)
    for ff in (layer.ff, model.encoder[0].ff):
        assert ff.w_1.out_features == 40 and ff.dropout.p == ff_dropout
    residuals = [layer.res_self, layer.res_cross, layer.res_ff, model.encoder[0].res_ff]
    assert [r.dropout.p for r in residuals] == [0.2] * 4 and model.src_embed.dropout.p == 0.2
    assert layer.ff.activation is (F.gelu if cfg.model.activation == "gelu" else F.relu)
    learned = cfg.model.positions == "learned"
    kind = LearnedPositions if learned else SinusoidalPositions
    assert isinstance(model.src_embed.positions, kind)
    assert isinstance(model.tgt_embed.positions, kind)
    assert model.max_positions == (50 if learned else None)


# ---------------------------------------------------------------------------------------------
# Training and initialisation


@pytest.mark.parametrize("pre_norm", [True, False], ids=["pre", "post"])
def test_small_model_overfits_one_batch(pre_norm: bool):
    """Both norm placements train: loss on one fixed batch falls below 0.1 nats/token."""
    torch.manual_seed(0)
    layer = LayerSpec(d_model=32, heads=4, d_ff=64, pre_norm=pre_norm)
    model = Transformer(VOCAB, VOCAB, layer, encoder_layers=1, decoder_layers=1)
    src = tokens(4, 7, seed=15)
    src[2, 5:] = PAD_ID
    tgt = tokens(4, 6, seed=16)
    tgt[3, 4:] = PAD_ID
    tgt_in = torch.cat([torch.full((4, 1), BOS_ID), tgt[:, :-1]], dim=1)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(300):
        logits = model(src, tgt_in)
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), tgt.reshape(-1), ignore_index=PAD_ID)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if loss.item() < 0.1:
            break
    assert losses[-1] < 0.1, f"loss only fell from {losses[0]:.2f} to {losses[-1]:.2f}"


@pytest.mark.parametrize("pre_norm", [True, False], ids=["pre", "post"])
@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
def test_initialisation_is_sane(pre_norm: bool, tie: bool):
    """No NaNs, pad embeddings zero, logits of unit-ish scale and loss near log(V) at init."""
    torch.manual_seed(0)
    vocab = 500
    layer = LayerSpec(d_model=64, heads=4, d_ff=128, dropout=0.1, pre_norm=pre_norm)
    stacks = {"encoder_layers": 2, "decoder_layers": 2}
    model = Transformer(vocab, vocab, layer, **stacks, share_embeddings=tie, tie_output=tie).eval()
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert (model.src_embed.embedding.weight[PAD_ID] == 0).all()
    assert (model.tgt_embed.embedding.weight[PAD_ID] == 0).all()
    gen = torch.Generator().manual_seed(17)
    src = torch.randint(4, vocab, (8, 12), generator=gen)
    tgt_in = torch.randint(4, vocab, (8, 10), generator=gen)
    labels = torch.randint(4, vocab, (8, 10), generator=gen)  # not the inputs: tied weights
    with torch.no_grad():  # favour copying the input token at init, which is fine
        logits = model(src, tgt_in)
    assert torch.isfinite(logits).all()
    assert 0.3 < logits.std().item() < 3.0
    loss = F.cross_entropy(logits.reshape(-1, vocab), labels.reshape(-1))
    assert abs(loss.item() - math.log(vocab)) < 1.0


def test_dropout_keeps_1_minus_p_scaled_and_is_identity_in_eval() -> None:
    torch.manual_seed(0)
    dropout = Dropout(0.3)
    x = torch.rand(400, 500) + 0.5
    y = dropout(x)
    kept = y != 0
    assert abs(kept.float().mean().item() - 0.7) < 0.005  # 200k Bernoulli draws
    scale = 65536 / (65536 - dropout.threshold)
    assert torch.allclose(y[kept], x[kept] * scale)
    assert abs(scale - 1 / 0.7) < 1e-4
    assert abs(y.mean().item() - x.mean().item()) < 0.01  # E[output] = input
    torch.manual_seed(5)
    first = dropout(x)
    torch.manual_seed(5)
    assert torch.equal(dropout(x), first)  # the draws come from torch's seeded generator
    assert not torch.equal(dropout(x), first)
    dropout.eval()
    assert dropout(x) is x
    assert Dropout(0.0).train()(x) is x


def test_dropout_gradient_is_the_same_mask_and_works_in_bf16() -> None:
    torch.manual_seed(1)
    x = torch.randn(3, 7, 5, requires_grad=True)
    y = Dropout(0.5)(x)
    y.backward(torch.ones_like(y))
    assert torch.equal(x.grad, (y != 0).float() * 2.0)
    half = Dropout(0.5)(torch.ones(1000, dtype=torch.bfloat16))
    assert half.dtype == torch.bfloat16 and set(half.unique().tolist()) == {0.0, 2.0}


@pytest.mark.parametrize("scoring", ["dot", "additive"])
def test_activation_checkpointing_gives_the_same_gradients(monkeypatch, scoring: str) -> None:
    """Recomputed layers (dropout on: the masks must be replayed) give the same loss and
    gradients as kept activations."""
    calls = []

    def counted(function, *args, **kwargs):
        calls.append(function)
        return checkpoint(function, *args, **kwargs)

    monkeypatch.setattr(transformer, "checkpoint", counted)
    src, tgt = tokens(3, 7, seed=11), tokens(3, 6, seed=12)
    grads = []
    for checkpointing in (False, True):
        model = tiny_model(dropout=0.3, scoring=scoring).train()
        model.activation_checkpointing = checkpointing
        torch.manual_seed(5)
        loss = model(src, tgt).logsumexp(-1).mean()
        loss.backward()
        grads.append([loss.detach()] + [p.grad for p in model.parameters()])
    assert len(calls) == 4  # every layer of the second model, none of the first
    for plain, recomputed in zip(*grads, strict=True):
        torch.testing.assert_close(recomputed, plain, rtol=0, atol=1e-12)


class Float32Norm(nn.LayerNorm):
    """A layer norm that answers in fp32, as CUDA's autocast runs it (the CPU's keeps bf16)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.float())


def stream_run(
    model: Transformer, src: torch.Tensor, tgt: torch.Tensor, dtype: torch.dtype | None
) -> tuple[set[torch.dtype], torch.Tensor]:
    """One forward and backward pass under autocast to `dtype` (None: none): the dtypes of every
    encoder and decoder layer's output, and all the gradients in one vector."""
    seen: set[torch.dtype] = set()
    hooks = [
        layer.register_forward_hook(lambda _m, _i, out: seen.add(out.dtype))
        for layer in [*model.encoder, *model.decoder]
    ]
    model.zero_grad()
    with torch.autocast("cpu", dtype=dtype or torch.float32, enabled=dtype is not None):
        model(src, tgt).logsumexp(-1).mean().backward()
    for hook in hooks:
        hook.remove()
    return seen, torch.cat([p.grad.flatten() for p in model.parameters()])


@pytest.mark.parametrize("pre_norm", [True, False], ids=["pre", "post"])
@pytest.mark.parametrize("cuda_norm", [False, True], ids=["cpu-norm", "fp32-norm"])
def test_bf16_stream_keeps_every_layer_in_bf16_under_bf16_autocast_only(
    monkeypatch, pre_norm: bool, cuda_norm: bool
) -> None:
    """`bf16_stream`: every layer hands on bf16 under bf16 autocast (layer norms answering in
    fp32, as on CUDA, included); its gradients are within twice the error the fp32 stream
    has under the same autocast (against no autocast); without bf16 autocast nothing changes."""
    if cuda_norm:
        monkeypatch.setattr(transformer.nn, "LayerNorm", Float32Norm)
    src, tgt = tokens(3, 9, seed=21), tokens(3, 8, seed=22)
    models = {}
    for stream in (False, True):
        torch.manual_seed(0)
        layer = LayerSpec(d_model=32, heads=4, d_ff=64, pre_norm=pre_norm)
        models[stream] = Transformer(VOCAB, VOCAB, layer, 2, 2).train()
        models[stream].bf16_stream = stream
    exact = stream_run(models[False], src, tgt, None)[1]
    fp32_dtypes, fp32_grads = stream_run(models[False], src, tgt, torch.bfloat16)
    bf16_dtypes, bf16_grads = stream_run(models[True], src, tgt, torch.bfloat16)
    assert fp32_dtypes == {torch.float32} and bf16_dtypes == {torch.bfloat16}
    assert bf16_grads.dtype == torch.float32  # the weights and their gradients stay fp32
    autocast_error = (fp32_grads - exact).norm() / exact.norm()
    assert 0 < (bf16_grads - exact).norm() / exact.norm() <= 2 * autocast_error
    for dtype in (None, torch.float16):  # no autocast, or another dtype: no bf16 stream
        dtypes, grads = stream_run(models[True], src, tgt, dtype)
        assert dtypes == {torch.float32}
        assert torch.equal(grads, stream_run(models[False], src, tgt, dtype)[1])
    for on in (False, True):  # train.bf16_stream sets it
        raw = {"data": {"dataset": "multi30k"}, "train": {"bf16_stream": on}}
        assert build_model(config_from_dict(raw), 9, 9).bf16_stream is on


def test_bf16_stream_compiles_into_one_graph() -> None:
    """train.compile traces the stream's autocast test without a graph break, and the traced
    model hands on what the eager one does."""
    torch.manual_seed(0)
    model = Transformer(VOCAB, VOCAB, LayerSpec(d_model=16, heads=2, d_ff=32), 1, 1).eval()
    model.bf16_stream = True
    src, tgt = tokens(2, 7, seed=31), tokens(2, 5, seed=32)
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected, traced = model(src, tgt), compiled(src, tgt)
    assert traced.dtype == torch.bfloat16
    torch.testing.assert_close(traced, expected, rtol=0, atol=0)
