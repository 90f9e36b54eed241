"""Word alignments from cross-attention (`attn_mt.decode.alignment`): the error rate they are
chosen by, pieces merged into words at the step that chose them, the toy model's known
alignment, and the hand-aligned gold pairs `scripts/bench_align.py` measures with."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers.models import random_model
from helpers.toy import toy_pairs

import attn_mt
from attn_mt.decode.alignment import (
    alignment_error_rate,
    cross_attention,
    layer_attention,
    output_words,
    source_words,
    word_alignment,
)
from bench.align import GOLD, read_gold


def test_alignment_error_rate_is_och_and_neys_with_every_link_sure() -> None:
    gold = [[(0, 0), (1, 1)], [(0, 0), (1, 1), (1, 2)]]
    assert alignment_error_rate(gold, gold) == 0.0
    assert alignment_error_rate([[(1, 0), (0, 1)], [(2, 2)]], gold) == 1.0
    # 2 of 3 found links right, 5 gold links: 1 - 2 * 2 / (3 + 5)
    assert alignment_error_rate([[(0, 0), (0, 1)], [(1, 1)]], gold) == pytest.approx(0.5)


def test_word_alignment_merges_pieces_at_the_step_asked() -> None:
    """Source pieces (words 0, 0, 1) and output pieces (words 0, 1, 1), then </s>: the
    first output word attends to source word 1 at its own step and to word 0 a step later."""
    attention = torch.tensor(
        [
            [0.1, 0.1, 0.7, 0.1],  # output piece 0 (word 0)
            [0.4, 0.4, 0.1, 0.1],  # output piece 1 (word 1)
            [0.1, 0.0, 0.8, 0.1],  # output piece 2 (word 1)
            [0.2, 0.2, 0.5, 0.1],  # </s>
        ]
    )  # (T, S): the last column is the source's <eos>
    assert word_alignment(attention, [0, 0, 1], [0, 1, 1]) == [(1, 0), (1, 1)]
    assert word_alignment(attention, [0, 0, 1], [0, 1, 1], shift=1) == [(0, 0), (1, 1)]
    assert word_alignment(attention, [], [0]) == []


def test_the_alignment_reads_every_layer_and_head_by_default() -> None:
    """With no layer named, the mean of every decoder layer's heads (a distribution over the
    source at each step); with one named, that layer's head mean alone."""
    models = [random_model(0)]  # a two-layer decoder
    src, out = [[5, 6, 7], [8, 9]], [[10, 11], [12, 13, 14]]
    heads = layer_attention(models, src, out, [0, 1])  # (L, B, H, T, S)
    every = cross_attention(models, src, out, None)  # (B, T, S)
    assert heads.shape[:3] == (2, 2, 2) and every.shape == heads.shape[1:2] + heads.shape[3:]
    assert torch.allclose(every, heads.mean(dim=(0, 2)))
    assert torch.allclose(every[1].sum(dim=-1), torch.ones(4))
    assert torch.allclose(cross_attention(models, src, out, -1), heads[1].mean(dim=1))
    assert not torch.allclose(every, heads[1].mean(dim=1))


@pytest.fixture(scope="module")
def toy(trained_run: Path) -> attn_mt.Translator:
    return attn_mt.load(trained_run, device="cpu")


def test_the_toy_model_aligns_each_word_to_its_source(toy: attn_mt.Translator) -> None:
    """The toy task translates word by word in order: the gold alignment is i-i. Forcing the
    true translations through the model, the default reading finds most of it; the step after
    each piece's own (Shift-Att) or each cell's largest head would not."""
    src, tgt = toy_pairs(40, seed=12)
    sources, targets = toy.encode(src, None), toy.tgt_tokenizer.encode(tgt)
    attention = cross_attention(toy.models, sources, targets, toy.config.decode.alignment_layer)
    gold = [[(i, i) for i in range(len(line.split()))] for line in src]
    words = [
        (source_words(toy.src_tokenizer, line, s), output_words(toy.tgt_tokenizer, t))
        for line, s, t in zip(src, sources, targets, strict=True)
    ]

    def aer(weights: torch.Tensor, shift: int = 0) -> float:
        found = [word_alignment(a, *w, shift) for a, w in zip(weights, words, strict=True)]
        return alignment_error_rate(found, gold)

    largest_head = layer_attention(toy.models, sources, targets, [0])[0].amax(dim=1)
    assert aer(attention) < 0.2 < min(aer(attention, shift=1), aer(largest_head))
    found = [word_alignment(a, *w) for a, w in zip(attention, words, strict=True)]
    assert sum(links[0] == (0, 0) for links in found) >= 36  # the first word, mostly


def test_the_gold_pairs_link_every_target_word_within_both_sentences() -> None:
    pairs = read_gold(GOLD)
    assert len(pairs) >= 30
    for pair in pairs:
        assert {j for _, j in pair.links} == set(range(len(pair.target.split()))), pair
        assert len(set(pair.links)) == len(pair.links), pair


def test_a_gold_link_past_the_sentence_is_refused(tmp_path: Path) -> None:
    gold = tmp_path / "gold.tsv"
    gold.write_text("Ein Hund.\tA dog.\t0-0 1-1 2-1\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"gold\.tsv:1: a link names a word"):
        read_gold(gold)
