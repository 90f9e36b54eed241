"""Sampling decode (for back-translation): top-k 1 and a tiny top-p are greedy search, every
sampled token lies in the top-k set / nucleus of its step (checked by re-scoring with the full
decoder), <pad> and <s> never come out, and the draws depend on (seed, line number, sample
number) only: not on the batch, the chunk of input, or how many samples are asked for.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers.models import random_model, random_sources
from helpers.toy import toy_config_dict

from attn_mt.config.file import config_from_dict
from attn_mt.decode.generate import Hypothesis, generate, max_output_lengths
from attn_mt.decode.search import Draw, Greedy, Sampling
from attn_mt.decode.translator import Translator
from attn_mt.errors import UserError
from attn_mt.model.vocab import BOS_ID, EOS_ID, PAD_ID
from attn_mt.train.setup import setup
from attn_mt.train.validate import translator_of

SEEDS = [0, 1, 2]


@pytest.fixture(scope="module", params=SEEDS, ids=[f"random-{s}" for s in SEEDS])
def case(request: pytest.FixtureRequest):
    """(model, src (B, S), max_lengths (B,), line numbers) of a tiny random model."""
    seed = request.param
    src = random_sources(seed)
    lines = list(range(1, src.size(0) + 1))
    return random_model(seed), src, max_output_lengths(src, 1.5, 5), lines


def step_log_probs(model, src_row: torch.Tensor, tokens: list[int]) -> torch.Tensor:
    """The model's log P(. | prefix) before each of tokens + <eos>, full decoder; (T, V)."""
    src = src_row[src_row != PAD_ID][None]  # (1, S)
    with torch.no_grad():
        return model(src, torch.tensor([[BOS_ID, *tokens]])).float().log_softmax(-1)[0]


def assert_same(a: list[Hypothesis], b: list[Hypothesis]) -> None:
    """Identical tokens; scores equal up to float rounding (other rows in the batch)."""
    assert [h.tokens for h in a] == [h.tokens for h in b]
    assert [h.logprob for h in a] == pytest.approx([h.logprob for h in b], rel=1e-5, abs=1e-5)
    assert [h.score for h in a] == pytest.approx([h.score for h in b], rel=1e-5, abs=1e-5)


@pytest.mark.parametrize(
    "sampling",
    [Sampling(top_k=1, seed=7), Sampling(top_k=1, temperature=3.0), Sampling(top_p=1e-6, seed=3)],
    ids=["top_k=1", "top_k=1-hot", "top_p=tiny"],
)
def test_a_cut_to_one_token_is_greedy_search(case, sampling: Sampling) -> None:
    model, src, limits, lines = case
    greedy = generate(model, src, limits, Greedy(), alpha=0.6)
    drawn = generate(model, src, limits, Draw(sampling, lines, samples=2), alpha=0.6)
    for row_samples, [g] in zip(drawn, greedy, strict=True):
        assert_same(row_samples, [g, g])


def test_a_temperature_near_zero_is_greedy_search(case) -> None:
    """Dividing by 1e-300 overflows every log-probability but the likeliest's: still greedy."""
    model, src, limits, lines = case
    greedy = generate(model, src, limits, Greedy(), alpha=0.6)
    drawn = generate(model, src, limits, Draw(Sampling(temperature=1e-300), lines), alpha=0.6)
    for row_samples, g in zip(drawn, greedy, strict=True):
        assert_same(row_samples, g)


@pytest.mark.parametrize("top_k", [2, 5])
def test_every_token_is_in_the_top_k_of_its_step(case, top_k: int) -> None:
    """Re-scored with the full decoder: fewer than k tokens beat each sampled one, and the
    sample's log-probability is the model's own (the temperature only shapes the draw)."""
    model, src, limits, lines = case
    sampling = Sampling(top_k=top_k, temperature=3.0, seed=11)  # hot: the tail would show up
    not_argmax = 0
    for row, hyps in enumerate(generate(model, src, limits, Draw(sampling, lines, samples=4))):
        for h in hyps:
            log_probs = step_log_probs(model, src[row], h.tokens)  # (T, V)
            log_probs[:, [PAD_ID, BOS_ID]] = float("-inf")
            chosen = log_probs.gather(1, torch.tensor([*h.tokens, EOS_ID])[:, None])  # (T, 1)
            assert h.logprob == pytest.approx(float(chosen.sum()), abs=1e-4)
            better = (log_probs > chosen + 1e-5).sum(dim=1)[: len(h.tokens)]  # (T - 1,)
            assert all(b < top_k for b in better.tolist()), f"row {row}: {better.tolist()}"
            not_argmax += int((better > 0).sum())
    assert not_argmax > 0, "hot sampling never left the most probable token: not sampling"


def test_every_token_is_in_the_nucleus_of_its_step(case) -> None:
    model, src, limits, lines = case
    top_p = 0.5
    draw = Draw(Sampling(top_p=top_p), lines, samples=4)
    for row, hyps in enumerate(generate(model, src, limits, draw)):
        for h in hyps:
            probs = step_log_probs(model, src[row], h.tokens).exp()  # (T, V)
            probs[:, [PAD_ID, BOS_ID]] = 0.0
            probs /= probs.sum(dim=-1, keepdim=True)
            for t, token in enumerate(h.tokens):
                before = float(probs[t][probs[t] > probs[t, token]].sum())
                assert before < top_p + 1e-5, f"row {row} step {t}: mass {before} before it"


def test_never_emits_padding_or_bos(case) -> None:
    """At temperature 20 every token is about equally likely: <pad> and <s> would turn up."""
    model, src, limits, lines = case
    tokens = [
        t
        for hyps in generate(model, src, limits, Draw(Sampling(temperature=20.0), lines, 8))
        for h in hyps
        for t in h.tokens
    ]
    assert len(tokens) > 500 and len(set(tokens)) > 15
    assert PAD_ID not in tokens and BOS_ID not in tokens and EOS_ID not in tokens


def test_reproducible_for_a_seed_and_different_for_another(case) -> None:
    model, src, limits, lines = case
    sampling = Sampling(temperature=1.5, top_p=0.95, seed=5)
    first = generate(model, src, limits, Draw(sampling, lines, samples=3))
    again = generate(model, src, limits, Draw(sampling, lines, samples=3))
    for a, b in zip(first, again, strict=True):
        assert_same(a, b)
    reseeded = Sampling(temperature=1.5, top_p=0.95, seed=6)
    other = generate(model, src, limits, Draw(reseeded, lines, samples=3))
    assert [[h.tokens for h in r] for r in other] != [[h.tokens for h in r] for r in first]


def test_a_line_samples_the_same_in_any_batch_and_with_any_count(case) -> None:
    model, src, limits, lines = case
    sampling = Sampling(temperature=1.5, top_k=10, seed=9)
    batched = generate(model, src, limits, Draw(sampling, lines, samples=3))
    for row, hyps in enumerate(batched):
        alone = src[row : row + 1, : int((src[row] != PAD_ID).sum())]  # (1, S_row), no padding
        one = generate(model, alone, limits[row : row + 1], Draw(sampling, [lines[row]]))
        assert [h.tokens for h in one[0]] == [hyps[0].tokens]  # sample 0 whatever the count
        assert [h.logprob for h in one[0]] == pytest.approx([hyps[0].logprob], abs=1e-4)
    reversed_rows = list(range(src.size(0)))[::-1]
    draw = Draw(sampling, lines[::-1], samples=3)
    shuffled = generate(model, src[reversed_rows], limits[reversed_rows], draw)
    assert [[h.tokens for h in r] for r in shuffled[::-1]] == [
        [h.tokens for h in r] for r in batched
    ]


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"temperature": 0.0}, "temperature"),
        ({"temperature": float("inf")}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_k": -1}, "top-k"),
        ({"top_p": 0.0}, "top-p"),
        ({"top_p": 1.5}, "top-p"),
    ],
)
def test_bad_sampling_settings_are_user_errors(options: dict, fragment: str) -> None:
    with pytest.raises(UserError, match=fragment):
        Sampling(**options)


# ---------------------------------------------------------------------------------------------
# Through the Translator (the API the CLI's translate --sample wraps)


@pytest.fixture(scope="module")
def translator(toy_data: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Translator:
    """An untrained toy model with the toy SentencePiece models (nothing is trained: fast)."""
    out = tmp_path_factory.mktemp("sampling") / "run"
    return translator_of(setup(config_from_dict(toy_config_dict(toy_data, out))).state)


def test_translator_samples_n_per_line_the_same_in_any_chunk(translator: Translator) -> None:
    lines = ["qb qc qd", "", "qz qf", "qg qh qj qk", "qd"]
    sampling = Sampling(temperature=1.2, top_k=20, seed=3)
    whole = translator.translate_nbest(lines, nbest=3, sampling=sampling)
    assert [len(entries) for entries in whole] == [3, 3, 3, 3, 3]  # a blank line: 3 ""
    assert whole[1][0].text == ""  # a blank line gives a blank output
    assert len({e.text for e in whole[3]}) > 1  # samples differ
    chunked = translator.translate_nbest(lines[:2], nbest=3, sampling=sampling)
    chunked += translator.translate_nbest(lines[2:], nbest=3, sampling=sampling, first_line=3)
    assert [[e.text for e in r] for r in chunked] == [[e.text for e in r] for r in whole]
    tiny_batches = translator.translate_nbest(lines, nbest=3, sampling=sampling, batch_tokens=1)
    assert [[e.text for e in r] for r in tiny_batches] == [[e.text for e in r] for r in whole]
    first = translator.translate(lines, sampling=sampling)
    assert first == [entries[0].text for entries in whole]
    greedy = translator.translate(lines, beam=1)
    assert translator.translate(lines, sampling=Sampling(top_k=1)) == greedy


def test_sampling_with_a_beam_is_refused(translator: Translator) -> None:
    with pytest.raises(UserError, match="--beam"):
        translator.translate_nbest(["qb"], beam=4, sampling=Sampling())
    with pytest.raises(UserError, match="--nbest"):
        translator.translate_nbest(["qb"], nbest=0, sampling=Sampling())


def test_cli_sample_and_ensemble_flags(trained_run: Path, tmp_path: Path) -> None:
    """`translate --sample` gives --nbest reproducible samples per line; `--model` twice decodes
    the ensemble, which for a model with itself is the model's own output."""
    from typer.testing import CliRunner

    from attn_mt.cli import app

    runner = CliRunner()
    source = tmp_path / "in.txt"
    source.write_text("qb qc qd\n\nqz qf\n")
    model = str(trained_run)
    args = ["translate", "--model", model, "--input", str(source), "--device", "cpu"]
    sample = [*args, "--sample", "--top-k", "5", "--temperature", "1.5", "--seed", "4"]
    first = runner.invoke(app, [*sample, "--nbest", "2", "--nbest-format", "marian"])
    again = runner.invoke(app, [*sample, "--nbest", "2", "--nbest-format", "marian"])
    assert first.exit_code == 0, first.output
    assert first.stdout == again.stdout
    assert [line.split(" ||| ")[0] for line in first.stdout.splitlines()] == list("001122")
    alone = runner.invoke(app, [*args, "--beam", "2"])
    pair = runner.invoke(app, [*args, "--beam", "2", "--model", model])
    assert alone.exit_code == pair.exit_code == 0 and pair.stdout == alone.stdout
    refused = runner.invoke(app, [*sample, "--beam", "3"])
    assert refused.exit_code != 0
