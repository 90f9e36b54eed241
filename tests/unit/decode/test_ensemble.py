"""Ensembles: the mean of the models' log-probabilities at every step, each model with its own
KV cache. An ensemble of one model, or of a model with itself, is that model bit for bit
(greedy, beam and sampling); two models give the mean of their step log-probabilities and of
their sequence log-probabilities; `attn_mt.load([a, b])` checks the vocabulary.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers.models import random_model, random_sources, teacher_forced_logprob
from helpers.toy import script_validation, toy_config_dict

import attn_mt
from attn_mt.config.file import config_from_dict
from attn_mt.decode.generate import Hypothesis, StepDecoder, generate, max_output_lengths
from attn_mt.decode.search import Beam, Draw, Greedy, Sampling
from attn_mt.errors import UserError
from attn_mt.model.vocab import BOS_ID, PAD_ID
from attn_mt.train.setup import setup as training_run  # `setup` is a fixture here


@pytest.fixture(scope="module")
def setup():
    """Two tiny random models of one vocabulary, sources and output limits."""
    src = random_sources(4)
    return random_model(4), random_model(5), src, max_output_lengths(src, 1.5, 5)


def as_tuples(rows: list[list[Hypothesis]]) -> list[list[tuple]]:
    return [[(h.tokens, h.logprob, h.score) for h in hyps] for hyps in rows]


def searches(models, src, limits) -> dict[str, list[list[Hypothesis]]]:
    """Greedy, beam (3-best) and sampling (2 samples) outputs of `models` for every row."""
    lines = list(range(1, src.size(0) + 1))
    strategies = {
        "greedy": Greedy(),
        "beam": Beam(3, nbest=3),
        "sample": Draw(Sampling(temperature=1.5, seed=2), lines, samples=2),
    }
    return {name: generate(models, src, limits, s, alpha=0.6) for name, s in strategies.items()}


@pytest.mark.parametrize("members", [1, 2], ids=["alone", "with-itself"])
def test_an_ensemble_of_one_model_is_that_model(setup, members: int) -> None:
    """Bit for bit: the mean of one tensor, or (a + a) / 2, is the tensor itself."""
    model, _, src, limits = setup
    single = searches(model, src, limits)
    ensemble = searches([model] * members, src, limits)
    for name in single:
        assert as_tuples(ensemble[name]) == as_tuples(single[name]), name


def test_step_log_probs_are_the_mean_of_the_models(setup) -> None:
    first, second, src, _ = setup
    prefix = torch.full((src.size(0), 1), BOS_ID)
    prefix = torch.cat([prefix, torch.randint(4, 24, (src.size(0), 3))], dim=1)  # (B, 4)
    both = StepDecoder([first, second], src, use_cache=False).log_probs(prefix)  # (B, V)
    one = StepDecoder(first, src, use_cache=False).log_probs(prefix)
    two = StepDecoder(second, src, use_cache=False).log_probs(prefix)
    assert not torch.allclose(one, two)
    assert torch.equal(both, (one + two) / 2)  # -inf at <pad> and <s> in all three


def test_two_models_score_the_mean_of_their_log_probabilities(setup) -> None:
    """Without renormalisation a finished hypothesis scores the mean of the models'
    log P(y | x); cached (each model its own cache) and uncached search agree."""
    first, second, src, limits = setup
    ensemble = [first, second]
    hyps = generate(ensemble, src, limits, Beam(3, nbest=3), alpha=0.0)
    uncached = generate(ensemble, src, limits, Beam(3, nbest=3), alpha=0.0, use_cache=False)
    assert [[h.tokens for h in r] for r in hyps] == [[h.tokens for h in r] for r in uncached]
    differs = 0
    for row, row_hyps in enumerate(hyps):
        for h in row_hyps:
            assert h.tokens and PAD_ID not in h.tokens and BOS_ID not in h.tokens
            each = [teacher_forced_logprob(m, src[row], h.tokens) for m in ensemble]
            assert h.logprob == pytest.approx(sum(each) / 2, abs=1e-4)
            differs += abs(each[0] - each[1]) > 1e-3
    assert differs, "the two models should disagree"
    single = [[h.tokens for h in r] for r in generate(first, src, limits, Beam(3, nbest=3))]
    assert [[h.tokens for h in r] for r in hyps] != single  # the second model counts


# ---------------------------------------------------------------------------------------------
# attn_mt.load([a, b])


@pytest.fixture(scope="module")
def checkpoints(toy_data: dict[str, Path], tmp_path_factory: pytest.TempPathFactory):
    """best.pt of two 2-step toy runs with one vocabulary (seeds 1, 2), and of a run with
    another vocabulary size."""
    folder = tmp_path_factory.mktemp("ensemble")
    paths = {}
    for name, seed, vocab in (("a", 1, 60), ("b", 2, 60), ("other_vocab", 1, 50)):
        raw = toy_config_dict(toy_data, folder / name, max_steps=2, seed=seed)
        raw["tokenizer"]["vocab_size"] = vocab
        with pytest.MonkeyPatch.context() as patch:
            script_validation(patch)
            training_run(config_from_dict(raw)).run()
        paths[name] = folder / name / "checkpoints" / "best.pt"
    return paths


def test_load_a_list_decodes_the_ensemble(checkpoints: dict[str, Path]) -> None:
    lines = ["qb qc qd", "", "qz qf qg"]
    alone = attn_mt.load(checkpoints["a"], device="cpu")
    assert attn_mt.load([checkpoints["a"]], device="cpu").translate(lines, beam=3) == (
        alone.translate(lines, beam=3)
    )
    pair = attn_mt.load([checkpoints["a"], checkpoints["b"]], device="cpu")
    assert len(pair.models) == 2 and pair.model is pair.models[0]
    nbest = pair.translate_nbest(lines, beam=3, nbest=2)
    assert [len(n) for n in nbest] == [2, 2, 2] and {e.text for e in nbest[1]} == {""}
    assert all(e.score <= 0 for n in nbest for e in n)


def test_load_refuses_models_of_another_vocabulary(checkpoints: dict[str, Path]) -> None:
    with pytest.raises(UserError) as err:
        attn_mt.load([checkpoints["a"], checkpoints["other_vocab"]], device="cpu")
    message = str(err.value)
    assert str(checkpoints["a"]) in message and str(checkpoints["other_vocab"]) in message
    assert "SentencePiece" in message and "\n" not in message
