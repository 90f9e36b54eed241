"""Beams as wide as the vocabulary: a beam K with V / 2 < K <= V (allowed by decode.beam,
train.eval_beam, --beam) has fewer than the usual 2K candidates at its first step, when one
row per sentence offers only V."""

from __future__ import annotations

import math

import pytest
from helpers.models import VOCAB, random_model, random_sources, teacher_forced_logprob

from attn_mt.decode.controls import Controls
from attn_mt.decode.generate import generate, max_output_lengths
from attn_mt.decode.search import Beam
from attn_mt.decode.steered import SteeredBeam


@pytest.mark.parametrize("beam", [VOCAB // 2 + 1, VOCAB - 1, VOCAB])
def test_beam_up_to_the_vocabulary_searches(beam: int) -> None:
    model, src = random_model(0), random_sources(1, count=3)
    limits = max_output_lengths(src, 1.0, 3)
    found = generate(model, src, limits, Beam(beam, nbest=beam), alpha=1.0)
    for row, hyps in enumerate(found):
        assert hyps, "every sentence gets an output"
        assert all(math.isfinite(h.score) for h in hyps)
        assert len({tuple(h.tokens) for h in hyps}) == len(hyps)  # no beam found twice
        assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
        best = hyps[0]
        assert best.logprob == pytest.approx(
            teacher_forced_logprob(model, src[row], best.tokens), abs=1e-4
        )


@pytest.mark.parametrize("beam", [VOCAB // 2 + 1, VOCAB])
def test_steered_beam_up_to_the_vocabulary_holds_its_term(beam: int) -> None:
    model, src = random_model(1), random_sources(2, count=3)
    limits = max_output_lengths(src, 1.0, 3)
    controls = [Controls(terms=[[7, 8]], prefix=[5]) for _ in range(3)]
    for [best] in generate(model, src, limits, SteeredBeam(controls, beam), alpha=1.0):
        assert best.tokens[0] == 5 and any(
            best.tokens[i : i + 2] == [7, 8] for i in range(len(best.tokens))
        )
