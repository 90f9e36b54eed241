"""Steered beam search on tiny random models: every term appears, the output starts with its
prefix, avoided sequences never appear, a batch equals its lines one by one, and with nothing
to steer it is exactly beam search.
"""

from __future__ import annotations

import random

import pytest
import torch
from helpers.models import VOCAB, assert_same, random_model, random_sources

from attn_mt.decode.controls import Controls
from attn_mt.decode.generate import generate, max_output_lengths
from attn_mt.decode.search import Beam
from attn_mt.decode.steered import SteeredBeam, TermProgress
from attn_mt.model.vocab import EOS_ID

SEEDS = [0, 1]


def random_controls(seed: int, count: int, terms: bool, prefix: bool, avoid: bool) -> list:
    """Per row: 0-3 random terms of 1-3 tokens, a 0-3 token prefix, an avoided pair."""
    rng = random.Random(seed)

    def tokens(low: int, high: int) -> list[int]:
        return [rng.randrange(4, VOCAB) for _ in range(rng.randint(low, high))]

    controls = []
    for _ in range(count):
        c = Controls(
            [tokens(1, 3) for _ in range(rng.randint(0, 3))] if terms else [],
            tokens(0, 3) if prefix else [],
        )
        if avoid:  # a pair and a token, neither inside a term or the prefix
            bad = [[rng.randrange(4, VOCAB), rng.randrange(4, VOCAB)], [rng.randrange(4, VOCAB)]]
            c.avoid = [a for a in bad if not any(_holds(t, a) for t in [*c.terms, c.prefix])]
        controls.append(c)
    return controls


def _holds(seq: list[int], part: list[int]) -> bool:
    return any(seq[i : i + len(part)] == part for i in range(len(seq) - len(part) + 1))


def search(model, src, controls, beam: int, nbest: int = 1, use_cache: bool = True):
    limits = max_output_lengths(src, 1.0, 2)
    needed = torch.tensor([c.needed_length() for c in controls])
    limits = torch.maximum(limits, needed)
    steered = SteeredBeam(controls, beam, nbest)
    return generate(model, src, limits, steered, alpha=1.0, use_cache=use_cache), limits


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_term_and_prefix_appear_and_no_avoided_sequence(seed: int) -> None:
    """The property, over random terms, prefixes and avoided words, for every n-best entry
    (beams of 2 to 4: fewer than the terms' tokens too; seed 2 an ensemble of two models)."""
    src, beam = random_sources(seed, count=8), 2 + seed
    model = random_model(seed) if seed < 2 else [random_model(seed), random_model(seed + 10)]
    controls = random_controls(seed, src.size(0), terms=True, prefix=True, avoid=True)
    found, limits = search(model, src, controls, beam, nbest=beam)
    for c, hyps, limit in zip(controls, found, limits.tolist(), strict=True):
        assert hyps, f"no output for {c}"
        for h in hyps:
            assert h.tokens[: len(c.prefix)] == c.prefix
            assert all(_holds(h.tokens, term) for term in c.terms), (c.terms, h.tokens)
            assert not any(_holds(h.tokens, bad) for bad in c.avoid), (c.avoid, h.tokens)
            assert EOS_ID not in h.tokens and len(h.tokens) + 1 <= limit


@pytest.mark.parametrize("seed", SEEDS)
def test_batch_equals_lines_one_by_one(seed: int) -> None:
    model, src = random_model(seed), random_sources(seed, count=4)
    controls = random_controls(seed, src.size(0), terms=True, prefix=True, avoid=False)
    together, _ = search(model, src, controls, beam=3, nbest=2)
    for row, c in enumerate(controls):
        alone, _ = search(model, src[row : row + 1], [c], beam=3, nbest=2)
        assert_same(together[row], alone[0])


def test_cached_equals_uncached(seed: int = 3) -> None:
    model, src = random_model(seed), random_sources(seed, count=4)
    controls = random_controls(seed, src.size(0), terms=True, prefix=False, avoid=True)
    cached, _ = search(model, src, controls, beam=3, nbest=3, use_cache=True)
    uncached, _ = search(model, src, controls, beam=3, nbest=3, use_cache=False)
    for a, b in zip(cached, uncached, strict=True):
        assert_same(a, b)


@pytest.mark.parametrize("seed", SEEDS)
def test_nothing_to_steer_is_beam_search(seed: int) -> None:
    """With no terms, prefix or avoided word, the steered search is plain beam search."""
    model, src = random_model(seed), random_sources(seed)
    controls = [Controls() for _ in range(src.size(0))]
    steered, limits = search(model, src, controls, beam=4, nbest=4)
    plain = generate(model, src, limits, Beam(4, nbest=4), alpha=1.0)
    for a, b in zip(steered, plain, strict=True):
        assert_same(a, b)


def test_progress_follows_terms_that_share_a_start() -> None:
    terms = [[5, 6, 7], [5, 8]]
    p = TermProgress()
    for token in (5, 6, 5, 8):  # 5 6 is broken off by 5, which goes on to meet [5, 8]
        p = p.advance(terms, token)
    assert p.met == {1} and p.bank(terms) == 2 and not p.complete(terms)
    assert p.next_tokens(terms) == [5]
    for token in (5, 6, 7):
        p = p.advance(terms, token)
    assert p.complete(terms) and p.bank(terms) == 5
