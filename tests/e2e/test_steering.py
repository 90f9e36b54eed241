"""Terms, prefixes, avoided words and alignments through the API and `attn-mt translate`, on the
trained toy model (one word in, its fixed translation out, in order: the true alignment is the
diagonal).
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from helpers.clirun import assert_user_error
from helpers.clirun import attn_mt as attn_mt_command
from helpers.toy import SRC_WORDS, TGT_WORDS, invoke, toy_pairs, write_lines

import attn_mt
from attn_mt.errors import UserError

SOURCES, _ = toy_pairs(16, seed=7)


@pytest.fixture(scope="module")
def translator(trained_run: Path) -> attn_mt.Translator:
    return attn_mt.load(trained_run, device="cpu")


def random_terms(seed: int, count: int) -> list[list[str]]:
    """0-2 terms per line, each one or two target words at random (often not in the output)."""
    rng = random.Random(seed)
    return [
        [" ".join(rng.choices(TGT_WORDS, k=rng.randint(1, 2))) for _ in range(rng.randint(0, 2))]
        for _ in range(count)
    ]


def holds(text: str, term: str) -> bool:
    """`term`'s words appear in `text` as consecutive whole words."""
    words, part = text.split(), term.split()
    return any(words[i : i + len(part)] == part for i in range(len(words) - len(part) + 1))


def test_every_term_appears_in_every_nbest_entry(translator) -> None:
    terms = random_terms(1, 10)
    found = translator.translate_nbest(SOURCES[:10], beam=4, nbest=2, constraints=terms)
    for line_terms, entries in zip(terms, found, strict=True):
        assert 1 <= len(entries) <= 2  # fewer when fewer outputs could hold every term
        for entry in entries:
            assert all(holds(entry.text, t) for t in line_terms), (line_terms, entry.text)


def test_a_mixed_batch_equals_its_lines_one_by_one(translator) -> None:
    """Plain lines beside steered ones get today's search exactly; steered lines their own."""
    lines = SOURCES[:6]
    terms = random_terms(2, len(lines))
    prefixes = [TGT_WORDS[i % 5] if i % 3 == 0 else None for i in range(len(lines))]
    together = translator.translate(lines, beam=3, constraints=terms, prefixes=prefixes)
    for i, line in enumerate(lines):
        alone = translator.translate([line], beam=3, constraints=[terms[i]], prefixes=[prefixes[i]])
        assert together[i] == alone[0]
        if not terms[i] and not prefixes[i]:
            assert together[i] == translator.translate([line], beam=3)[0]


@pytest.mark.parametrize("beam", [1, 3])
def test_the_output_starts_with_its_prefix(translator, beam: int) -> None:
    prefixes = [" ".join(random.Random(i).choices(TGT_WORDS, k=1 + i % 3)) for i in range(6)]
    outputs = translator.translate(SOURCES[:6], beam=beam, prefixes=prefixes)
    for prefix, output in zip(prefixes, outputs, strict=True):
        assert output.split()[: len(prefix.split())] == prefix.split()


def test_avoided_words_never_appear(translator) -> None:
    plain = translator.translate(SOURCES[:6], beam=3)
    avoid = [plain[0].split()[0], " ".join(plain[1].split()[1:3])]
    for output in translator.translate(SOURCES[:6], beam=3, avoid=avoid):
        assert not any(holds(output, bad) for bad in avoid), output


def test_alignments_link_every_output_word_to_a_source_word(translator) -> None:
    """Right word counts on both sides, and a low error rate against the true (diagonal)
    alignment of the toy task."""
    found = translator.translate_nbest(SOURCES, alignment=True)
    hits = links = gold = 0
    for line, [best] in zip(SOURCES, found, strict=True):
        src_words, out_words = len(line.split()), len(best.text.split())
        assert [j for _, j in best.alignment] == list(range(out_words))
        assert all(0 <= i < src_words for i, _ in best.alignment)
        hits += len(set(best.alignment) & {(i, i) for i in range(src_words)})
        links, gold = links + len(best.alignment), gold + src_words
    assert 1 - 2 * hits / (links + gold) < 0.2  # AER


@pytest.mark.parametrize("sampling", [None, attn_mt.Sampling(temperature=5.0)])
def test_alignment_pairs_stay_within_both_sentences_words(translator, sampling) -> None:
    """A property, on odd sources (a U+2581 typed inside a word, which SentencePiece splits at)
    and on sampled outputs (which may hold pieces of whitespace alone): every pair (i, j) has
    i < the source's words and j < the output's words, and every output word has one pair."""
    rng = random.Random(3)
    sources = [
        " ".join(
            w + ("\u2581" + rng.choice(SRC_WORDS) if rng.random() < 0.5 else "") for w in s.split()
        )
        for s in SOURCES[:8]
    ]
    found = translator.translate_nbest(
        sources, nbest=3 if sampling else 1, sampling=sampling, alignment=True
    )
    for line, entries in zip(sources, found, strict=True):
        for entry in entries:
            src_words, out_words = len(line.split()), len(entry.text.split())
            assert all(0 <= i < src_words for i, _ in entry.alignment), (line, entry)
            assert [j for _, j in entry.alignment] == list(range(out_words)), (line, entry)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"constraints": [["Ba\tCa"]]}, "line 1: a term 'Ba\\\\tCa' holds a TAB"),
        ({"constraints": [["  "]]}, "line 1: a term is empty"),
        ({"constraints": [[" ".join(["Ba"] * 1200)]]}, "line 1: .* more than an output may hold"),
        ({"prefixes": [" ".join(["Ba"] * 1200)]}, "line 1: .* more than an output may hold"),
        ({"constraints": [["Ba"]], "beam": 1}, "--beam 1: constraints need a beam"),
        ({"constraints": [["Ba"]], "sampling": attn_mt.Sampling()}, "--sample"),
        ({"constraints": [["Ba"], ["Ca"]]}, "constraints: give one entry per line"),
        ({"constraints": [["Ba Ca"]], "avoid": ["Ca"]}, "line 1: 'Ba Ca' holds an avoided word"),
        # NFKC writes fullwidth forms as ASCII and composes marks: never met as given
        ({"constraints": [["\uff22a"]]}, "line 1: a term .* U\\+FF22 FULLWIDTH LATIN CAPITAL"),
        ({"constraints": [["Be\u0301"]]}, "line 1: a term .* U\\+0301 COMBINING ACUTE ACCENT"),
        ({"prefixes": ["\uff22a"]}, "line 1: the prefix .* U\\+FF22 FULLWIDTH LATIN CAPITAL"),
        (
            {"constraints": [["Ba\u2028Ca"]]},
            "line 1: a term .* line break \\(U\\+2028 LINE SEPARATOR",
        ),
        ({"prefixes": ["Ba\x85"]}, "line 1: the prefix .* line break \\(U\\+0085\\)"),
    ],
)
def test_bad_terms_and_prefixes_are_one_clear_error(translator, options, message) -> None:
    with pytest.raises(UserError, match=message):
        translator.translate([SRC_WORDS[0]], **options)


def test_cli_terms_prefix_alignment_nbest_from_file_to_file(translator, trained_run, tmp_path):
    """`--prefix --constraints --alignment --nbest`: the API's entries, a block per line."""
    avoid = write_lines(tmp_path / "avoid.txt", [TGT_WORDS[3], ""])
    lines = [f"{SOURCES[0]}\t{TGT_WORDS[0]}\t{TGT_WORDS[1]}", "", SOURCES[1], f"{SOURCES[2]}\t"]
    source = write_lines(tmp_path / "in.txt", lines)
    out = tmp_path / "out.txt"
    options = ["--prefix", "--constraints", "--alignment", "--nbest", "2", "--avoid", avoid]
    with pytest.warns(UserWarning, match="--constraints: a line without a TAB is a source alone"):
        done = invoke("translate", "--model", trained_run, "--device", "cpu", "--input", source,
                      "--output", out, *options)  # SOURCES[1] alone: warned  # fmt: skip
    assert done.exit_code == 0, done.output
    expected = translator.translate_nbest(
        [SOURCES[0], "", SOURCES[1], SOURCES[2]],
        nbest=2,
        prefixes=[TGT_WORDS[0], None, None, None],
        constraints=[[TGT_WORDS[1]], [], [], []],
        avoid=[TGT_WORDS[3]],
        alignment=True,
    )
    blocks = out.read_text().split("\n\n")[:-1]
    assert len(blocks) == len(lines)
    for block, entries in zip(blocks, expected, strict=True):
        for row, entry in zip(block.split("\n"), entries, strict=True):
            text, pairs = row.split("\t")[1].split(" ||| ")
            assert text == entry.text
            assert pairs == " ".join(f"{i}-{j}" for i, j in entry.alignment)
    bad = write_lines(tmp_path / "bad.txt", [SOURCES[0], f"{SOURCES[1]}\t{TGT_WORDS[0]}\t"])
    args = ["--device", "cpu", "--input", bad, "--output", tmp_path / "bad.out", "--constraints"]
    done = attn_mt_command("translate", "--model", trained_run, *args, cwd=tmp_path)
    assert_user_error(done, "line 2: a term is empty")
    assert not (tmp_path / "bad.out").exists()


def test_an_ensemble_of_one_model_twice_steers_and_aligns_as_the_model(trained_run, translator):
    twice = attn_mt.load([trained_run, trained_run], device="cpu")
    options = {"constraints": random_terms(3, 4), "prefixes": ["Ba", None, None, "Ca"]}
    alone = translator.translate_nbest(SOURCES[:4], beam=3, alignment=True, **options)
    both = twice.translate_nbest(SOURCES[:4], beam=3, alignment=True, **options)
    assert [[(e.text, e.alignment) for e in entries] for entries in both] == [
        [(e.text, e.alignment) for e in entries] for entries in alone
    ]


def test_an_alignment_layer_the_decoder_lacks_is_one_clear_error(trained_run) -> None:
    deep = attn_mt.load(trained_run, device="cpu", decode={"alignment_layer": 3})
    with pytest.raises(UserError, match="decode.alignment_layer 3: the decoder has 1 layers"):
        deep.translate([SOURCES[0]], alignment=True)
