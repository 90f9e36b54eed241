"""Lexical shortlists (`decode.shortlist`): a batch's rows are the union of its source pieces'
lists and the ones always scored; a shortlist of every piece searches exactly as none; a built
shortlist's outputs use only its rows; candidates rank by Dice; a file for another vocabulary,
or no shortlist at all, is refused in one line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.toy import toy_pairs

import attn_mt
from attn_mt.config.file import load_config
from attn_mt.decode.shortlist import (
    ALWAYS,
    _shortlist,
    build_shortlist,
    ranked_candidates,
    read_shortlist,
)
from attn_mt.errors import UserError
from attn_mt.model.vocab import EOS_ID


@pytest.fixture(scope="module")
def ours(trained_run: Path) -> attn_mt.Translator:
    return attn_mt.load(trained_run, device="cpu", prepack=False)


@pytest.fixture(scope="module")
def built(trained_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("shortlist") / "lex.txt"
    config = load_config(trained_run.parent / "toy.yaml", [], training=False)
    build_shortlist(config, out, trained_run, candidates=3, frequent=2)
    return out


def test_rows_are_the_union_of_the_source_lists_and_the_ones_always_scored() -> None:
    generator = np.random.default_rng(3)
    lists = {s: sorted(generator.choice(40, 5, replace=False).tolist()) for s in range(0, 30, 2)}
    lists[-1] = [7, 9]
    shortlist = _shortlist(lists, 30)
    src = torch.tensor([[4, 5, 6, 0], [12, 4, 29, 1]])
    expected = {*ALWAYS, 7, 9, 33} | {t for s in src.flatten().tolist() for t in lists.get(s, [])}
    assert shortlist.rows(src, extra=[33]).tolist() == sorted(expected)


def test_a_shortlist_of_every_piece_searches_as_none(ours) -> None:
    lines = toy_pairs(10, seed=8)[0]
    vocab = ours.tgt_tokenizer.vocab_size
    plain = ours.translate_nbest(lines, beam=3, nbest=2)
    ours.shortlist = _shortlist({-1: list(range(vocab))}, ours.src_tokenizer.vocab_size)
    try:
        listed = ours.translate_nbest(lines, beam=3, nbest=2)
    finally:
        ours.shortlist = None
    for a, b in zip(plain, listed, strict=True):
        assert [e.tokens for e in a] == [e.tokens for e in b]
        assert [e.score for e in a] == pytest.approx([e.score for e in b], abs=1e-4)


def test_a_built_shortlist_outputs_only_its_rows(trained_run, built) -> None:
    translator = attn_mt.load(
        trained_run, device="cpu", prepack=False, decode={"shortlist": str(built)}
    )
    assert translator.shortlist is not None
    vocab = translator.tgt_tokenizer.vocab_size
    lines = toy_pairs(16, seed=2)[0]
    for line in lines:  # one line a batch: its rows are its own
        found = translator.translate_nbest([line], beam=4, nbest=4)[0]
        src = torch.tensor([[*translator.encode([line])[0], EOS_ID]])
        rows = set(translator.shortlist.rows(src).tolist())
        assert len(rows) < vocab  # it does cut the vocabulary
        for entry in found:
            assert set(entry.tokens) <= rows


def test_the_file_is_refused_for_another_vocabulary_or_when_it_is_none(
    ours, built, tmp_path
) -> None:
    other = tmp_path / "other.txt"
    text = built.read_text(encoding="utf-8").split("\n")
    text[2] = "target 61 0000000000000000"
    other.write_text("\n".join(text), encoding="utf-8")
    with pytest.raises(UserError, match="made for another target vocabulary"):
        read_shortlist(other, ours.src_tokenizer, ours.tgt_tokenizer)
    other.write_text("hello\tworld\n", encoding="utf-8")
    with pytest.raises(UserError, match="not a shortlist"):
        read_shortlist(other, ours.src_tokenizer, ours.tgt_tokenizer)
    with pytest.raises(UserError, match="cannot read it"):
        read_shortlist(tmp_path / "missing.txt", ours.src_tokenizer, ours.tgt_tokenizer)


def test_candidates_rank_by_dice() -> None:
    # pairs holding both: (s5, t10) 3, (s5, t11) 3, (s5, t12) 1; t11 is in many more pairs
    source = np.array([5, 5, 5])
    target = np.array([10, 11, 12])
    both = np.array([3, 3, 1])
    src_freq = np.zeros(6)
    src_freq[5] = 4
    tgt_freq = np.zeros(13)
    tgt_freq[[10, 11, 12]] = [3, 30, 1]
    ranked = ranked_candidates((source, target, both), src_freq, tgt_freq, candidates=2)
    dice = {t: 2 * b / (4 + tgt_freq[t]) for t, b in zip(target, both, strict=True)}
    assert ranked == {5: sorted(dice, key=lambda t: -dice[t])[:2]}


def test_the_command_writes_a_shortlist_translate_reads(trained_run, tmp_path) -> None:
    from helpers.clirun import assert_user_error, attn_mt

    config, out = trained_run.parent / "toy.yaml", tmp_path / "lex.txt"
    assert_user_error(attn_mt("shortlist", "-c", config, cwd=tmp_path), "--out FILE")
    made = attn_mt(
        "shortlist", "-c", config, "--model", trained_run, "--out", out, "--candidates", 3,
        cwd=tmp_path,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr.decode()
    assert made.stdout.decode().startswith(f"wrote {out}: ")
    lines = "\n".join(toy_pairs(6, seed=5)[0]) + "\n"
    found = attn_mt(
        "translate", "-m", trained_run, "--set", f"decode.shortlist={out}",
        cwd=tmp_path, stdin=lines.encode(),
    )  # fmt: skip
    assert found.returncode == 0, found.stderr.decode()
    assert len(found.stdout.decode().splitlines()) == 6
    wrong = attn_mt(
        "translate", "-m", trained_run, "--set", f"decode.shortlist={config}",
        cwd=tmp_path, stdin=lines.encode(),
    )  # fmt: skip
    assert_user_error(wrong, "not a shortlist")
