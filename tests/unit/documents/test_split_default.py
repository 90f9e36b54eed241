"""Lines split into sentences by default (`translate`, `evaluate` and the server alike): a line of
one sentence translates exactly as the Translator translates it, Multi30k's test and validation
lines are one sentence each (so `evaluate` on them is unchanged), and an output that looks cut
short is warned about, naming its line.
"""

from __future__ import annotations

import gzip
import warnings

import pytest
from helpers.models import random_checkpoint

import attn_mt
from attn_mt.config.file import config_from_dict
from attn_mt.data.corpora import split_files
from attn_mt.decode.request import Request
from attn_mt.decode.translator import Translation, Translator
from attn_mt.documents.paragraphs import (
    NAMED_SHORT,
    SHORT_FROM,
    SHORT_SHARE,
    SHORTER_SHARE,
    ParagraphTranslator,
    Short,
    short_outputs,
    split_lines,
)
from attn_mt.documents.sentences import sentence_count


@pytest.fixture(scope="module")
def translator(toy_data, tmp_path_factory) -> Translator:
    checkpoint = random_checkpoint(tmp_path_factory.mktemp("split-default"), toy_data)
    return attn_mt.load(checkpoint, device="cpu", prepack=False)


def test_a_line_of_one_sentence_translates_as_the_translator_does(translator: Translator):
    lines = ["qb qc qd", "  qf qg qh  ", "", "qj qk qz.", "\t", "qb qc qd qf qg qh qj"]
    request = Request(beam=3, nbest=2, alignment=True)
    plain = translator.translate_nbest(lines, request)
    for sentences in (True, False):
        split = ParagraphTranslator.splitting(translator, "en", sentences)
        found = split.translate_nbest(lines, request)
        got = [[(e.text, e.score, e.tokens, e.alignment) for e in line] for line in found]
        assert got == [[(e.text, e.score, e.tokens, e.alignment) for e in line] for line in plain]


@pytest.mark.parametrize("split", ["test", "valid"])
def test_multi30k_lines_are_one_sentence_each(split: str):
    """`evaluate --split test|valid` gives what it gave before lines were split: the splitter
    finds exactly one sentence in every line, in each of the four languages."""
    for pair in ("de-en", "fr-cs"):
        data = config_from_dict({"data": {"dataset": "multi30k", "pairs": [pair]}}).data
        files = split_files(data, split, pair)
        assert files is not None
        for lang, path in zip(pair.split("-"), files, strict=True):
            with gzip.open(path, "rt", encoding="utf-8") as handle:
                lines = handle.read().splitlines()
            assert len(lines) >= 1000
            several = [n for n, line in enumerate(lines, 1) if sentence_count(line, lang) != 1]
            assert several == [], (path, several[:5])


def test_sentence_count_sees_several_sentences():
    assert (
        sentence_count("Ein Hund läuft. Zwei Männer spielen Fußball! Eine Frau liest.", "de") == 3
    )
    assert sentence_count("Dr. Müller kam am 3. Mai nach Hause.", "de") == 1
    assert sentence_count("First line\nsecond line", "en") == 2


def entry(text: str, translator: Translator) -> list[Translation]:
    """`text` as a best entry whose tokens are its pieces."""
    return [Translation(text, 0.0, translator.tgt_tokenizer.encode([text])[0])]


def test_an_output_cut_short_is_found_by_its_pieces_and_sentences(translator: Translator):
    line = "qb qc qd qf qg qh qj qk. qz qb qc qd qf qg qh qj. qk qz qb qc qd qf qg qh."
    split = split_lines(translator, [line], Request(), "en", sentences=False)
    [source] = translator.encode(split.texts)
    assert len(source) >= SHORT_FROM
    pieces = translator.tgt_tokenizer.encode

    def sized(share: float, sentences: int) -> str:
        """An output of about `share` of the source's pieces, in `sentences` sentences."""
        words = ["dogs"]
        while len(pieces([" ".join(words)])[0]) < share * len(source):
            words.append(["run", "far", "dogs"][len(words) % 3])
        size = -(-len(words) // sentences)
        cut = [words[i : i + size] for i in range(0, len(words), size)]
        text = " ".join(" ".join([part[0].title(), *part[1:]]) + "." for part in cut)
        assert sentence_count(text, "en") == sentences
        return text

    def judged(text: str) -> list[Short]:
        return short_outputs(translator, split, [entry(text, translator)], None, ("en", "en"))

    assert judged(sized(1.0, 3)) == []
    half = sized(0.3, 1)
    assert len(pieces([half])[0]) < SHORT_SHARE * len(source)
    assert judged(half) == [Short(0, len(pieces([half])[0]), len(source))]
    most = sized(0.65, 1)
    size = len(pieces([most])[0])
    assert SHORT_SHARE * len(source) <= size < SHORTER_SHARE * len(source)
    assert judged(most) == [Short(0, size, len(source), (1, 3))]  # fewer sentences than given
    assert judged(sized(0.65, 3)) == []  # as many sentences: its length alone is no sign


def test_the_warning_names_the_line_and_its_sentence(translator: Translator):
    """A search held to 2 tokens ends every long source early: each such sentence is named."""
    short = attn_mt.load(
        translator.checkpoints,
        device="cpu",
        prepack=False,
        decode={"max_len_a": 0.0, "max_len_b": 3},
    )
    long = " ".join(["qb qc qd qf qg qh"] * 2)
    lines = ["qb qc", f"qb. {long}.", long]
    for sentences, named in (
        (True, ["line 8, sentence 2", "line 9"]),
        (False, ["line 8", "line 9"]),
    ):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            split = ParagraphTranslator.splitting(short, "en", sentences)
            split.translate_nbest(lines, Request(first_line=7))
        said = [str(w.message) for w in caught if "stopped early" in str(w.message)]
        assert [message.split(":")[0] for message in said] == named
        advised = [
            message.endswith("--split-sentences translates them one by one") for message in said
        ]
        assert advised == [not sentences, False]  # only where a line of sentences was whole


def test_no_more_than_a_few_lines_cut_short_are_named(translator: Translator):
    short = attn_mt.load(
        translator.checkpoints,
        device="cpu",
        prepack=False,
        decode={"max_len_a": 0.0, "max_len_b": 3},
    )
    split = ParagraphTranslator.splitting(short, "en")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            split.translate_nbest([" ".join(["qb qc qd qf qg qh"] * 2)] * 4)
    said = [str(w.message) for w in caught if "stopped early" in str(w.message)]
    assert [message.split(":")[0] for message in said] == [f"line {n}" for n in (1, 2, 3, 4, 1)]
    assert [
        message.endswith(f"(no more than {NAMED_SHORT} such lines are named)") for message in said
    ] == [False] * 4 + [True]


def test_a_line_cut_at_the_model_s_limit_is_named_once_by_its_part(translator: Translator):
    """A sentence longer than the model reads is translated in parts: a line whose parts end
    early is named once (by its first such part, said to be cut between words), and counts as
    one line towards NAMED_SHORT."""
    short = attn_mt.load(
        translator.checkpoints,
        device="cpu",
        prepack=False,
        decode={"max_len_a": 0.0, "max_len_b": 3, "max_input_len": 12},
    )
    long = " ".join(["qb qc qd qf qg qh"] * 6)
    split = ParagraphTranslator.splitting(short, "en")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        split.translate_nbest(["qb qc", long, long])
    said = [str(w.message) for w in caught if "stopped early" in str(w.message)]
    assert [message.split(":")[0] for message in said] == ["line 2, part 1", "line 3, part 1"]
    assert all(message.endswith("translated in parts cut between words") for message in said)
    assert split.named_short == 2
    parts = split_lines(short, [long], Request(), "en")
    assert len(parts.texts) > 1 and all(s.part for s in parts.paragraphs[0].segments)
    assert parts.where(1, 5) == "line 5, part 2"
    whole = split_lines(short, ["qb. qc."], Request(), "en")
    assert whole.where(1, 5) == "line 5, sentence 2"
