"""Paragraphs translated as sentences (`documents.sentences`, `documents.paragraphs`): the split on
hand-made de/en/fr/cs paragraphs (abbreviations, numbers, quotes), line breaks and words kept
whole, a long sentence cut in pieces at the model's limit and never cut short, and a paragraph
translated exactly as its sentences one by one, joined with its own spacing (alignments and
scores too).
"""

from __future__ import annotations

import pytest
from helpers.models import random_checkpoint

import attn_mt
from attn_mt.decode.request import Request
from attn_mt.decode.translator import Translator
from attn_mt.documents.paragraphs import ParagraphTranslator, split_lines
from attn_mt.documents.sentences import split_paragraph
from attn_mt.errors import UserError

MAX_INPUT = 12  # decode.max_input_len of the translator here

# Hand-made paragraphs, sentence by sentence: abbreviations, ordinal numbers, decimals, quotes.
SPLITS = {
    "de": [
        ["Dr. Müller kam am 3. Mai nach Hause.", "Er war müde."],
        ["Das kostet z.B. 3,50 Euro.", "Ist das zu teuer?"],
        ["Er sagte: „Ich komme morgen.“", "Dann ging er."],
        ["Prof. Dr. Schmidt hält heute einen Vortrag.", "Der Saal ist voll."],
    ],
    "en": [
        ["Mr. Smith arrived at 5 p.m. on Monday.", "He was tired."],
        ["The U.S. economy grew by 2.5% in 2023.", "Analysts were surprised."],
        ['She said, "I will come tomorrow."', "Then she left."],
        ["What time is it?", "It's 10:30!", "We have to go."],
    ],
    "fr": [
        ["Cela coûte 3,50 euros.", "Est-ce trop cher ?"],
        ["Elle a dit : « Je viendrai demain. »", "Puis elle est partie."],
        ["Le Dr Durand travaille à l'hôpital.", "Son bureau est au 3e étage."],
    ],
    "cs": [
        ["Dr. Novák přišel 3. května domů.", "Byl unavený."],
        ["Řekl: „Přijdu zítra.“", "Pak odešel."],
        ["Dne 1. ledna 2024 začíná rok.", "Mnoho lidí slaví."],
    ],
}


def count_words(texts) -> list[list[int]]:
    """A piece a word: the model-free `encode` of the split tests."""
    return [[0] * len(text.split()) for text in texts]


def count_chars(texts) -> list[list[int]]:
    """A piece a character."""
    return [[0] * len(text) for text in texts]


def sentences(text: str, lang: str, limit: int = 1000, encode=count_words) -> list[str]:
    paragraph = split_paragraph(text, lang, limit, encode)
    return [text[s.start : s.end] for s in paragraph.segments]


@pytest.mark.parametrize(
    ("lang", "expected"),
    [(lang, split) for lang, splits in SPLITS.items() for split in splits],
)
def test_hand_made_paragraphs_split_into_their_sentences(lang: str, expected: list[str]) -> None:
    assert sentences(" ".join(expected), lang) == expected


def test_line_breaks_end_sentences_and_words_stay_whole() -> None:
    text = "  Title\nFirst one. Second one.\n\n  Third.Fourth "
    paragraph = split_paragraph(text, "en", 1000, count_words)
    found = [text[s.start : s.end] for s in paragraph.segments]
    assert found == ["Title", "First one.", "Second one.", "Third.Fourth"]
    assert [paragraph.gap(i) for i in range(5)] == ["  ", "\n", " ", "\n\n  ", " "]
    assert split_paragraph(" \t\n ", "en", 1000, count_words).segments == []


def test_a_long_sentence_is_cut_between_words_at_the_limit_after_a_clause() -> None:
    words = [f"w{i}" for i in range(30)]
    words[6] += ","  # a clause ends in the second half of the first piece
    text = " ".join(words) + "."
    found = sentences(text, "en", limit=10)
    assert found[0] == " ".join(words[:7])
    assert all(len(piece.split()) <= 10 for piece in found)
    assert " ".join(found) == text  # every word, in order, none cut short
    cut = sentences("ab " + "x" * 25, "en", limit=10, encode=count_chars)
    assert cut == ["ab", "x" * 10, "x" * 10, "x" * 5]


@pytest.fixture(scope="module")
def translator(toy_data, tmp_path_factory) -> Translator:
    checkpoint = random_checkpoint(tmp_path_factory.mktemp("sentences"), toy_data)
    return attn_mt.load(
        checkpoint, device="cpu", prepack=False, decode={"max_input_len": MAX_INPUT}
    )


PARAGRAPH = "qb qc qd. qf qg!  qh qj qk qz\nqb qd?"
SENTENCES = ["qb qc qd.", "qf qg!", "qh qj qk qz", "qb qd?"]


def test_a_paragraph_is_translated_as_its_sentences_one_by_one(translator: Translator) -> None:
    split = ParagraphTranslator.splitting(translator, "en")
    one_by_one = [translator.translate_nbest([s], alignment=True)[0][0] for s in SENTENCES]
    [entry] = split.translate_nbest([PARAGRAPH], alignment=True)[0]
    texts = [e.text for e in one_by_one]
    assert entry.text == f"{texts[0]} {texts[1]}  {texts[2]} {texts[3]}"  # a break: a space
    assert entry.score == pytest.approx(sum(e.score for e in one_by_one) / 4)
    assert [source for source, _ in entry.sentences] == SENTENCES
    # Alignment pairs, shifted by the words before each sentence on both sides.
    shifted, source_words, target_words = [], 0, 0
    for sentence, e in zip(SENTENCES, one_by_one, strict=True):
        shifted += [(i + source_words, j + target_words) for i, j in e.alignment]
        source_words += len(sentence.split())
        target_words += len(e.text.split())
    assert entry.alignment == shifted
    assert [len(e) for e in split.translate_nbest(["", PARAGRAPH], nbest=2, beam=2)] == [2, 2]
    lines = split.translate([PARAGRAPH, "", "qb qc"])
    assert lines == [entry.text, "", translator.translate(["qb qc"])[0]]


def test_a_long_sentence_is_translated_in_pieces_not_cut(translator: Translator) -> None:
    long = " ".join(["qb qc qd qf"] * 10)  # 40 words: more pieces than the model reads
    split = split_lines(translator, [long], Request())
    pieces = [len(ids) for ids in translator.encode(split.texts, warn=False)]
    assert len(split.texts) > 1 and max(pieces) < MAX_INPUT
    assert " ".join(split.texts) == long
    [[entry]] = ParagraphTranslator.splitting(translator).translate_nbest([long])
    assert entry.text == " ".join(translator.translate(split.texts))


def test_callbacks_hear_of_lines_once_their_sentences_are_done(translator: Translator) -> None:
    done, batches = {}, []
    request = Request(on_line=done.__setitem__, on_batch=batches.append, batch_tokens=6)
    found = ParagraphTranslator.splitting(translator).translate_nbest(
        ["qb qc. qd qf.", "", "qg qh"], request
    )
    assert sorted(done) == [0, 1, 2] and [done[row] for row in range(3)] == found
    assert sum(batches) == 3


def test_steered_lines_stay_whole_and_errors_name_the_line(translator: Translator) -> None:
    split = ParagraphTranslator.splitting(translator)
    prefixes = [None, "Ba", None]
    found = split.translate_nbest(
        ["qb qc. qd.", "qb qc. qd.", "qf."], Request(prefixes=prefixes, beam=2)
    )
    assert found[1][0].text.startswith("Ba") and len(found[1][0].sentences) == 1
    with pytest.raises(UserError, match=r"^line 8: the source is blank but has a prefix"):
        split.translate_nbest(["qb.", " "], Request(prefixes=[None, "Ba"], first_line=7))
    with pytest.raises(UserError, match=r"^line 2: more source pieces than the model reads"):
        split.translate_nbest(["qb", " ".join(["qb qc"] * 10)], Request(prefixes=[None, "Ba"]))
    avoided = Request(avoid=("Ba",), first_line=3, constraints=[[], ["Ba"]], beam=2)
    with pytest.raises(UserError, match=r"^line 4: 'Ba' holds an avoided word"):
        split.translate_nbest(["qb qc. qd.", "qb qc."], avoided)


def test_a_segment_error_names_the_line_and_its_sentence(translator: Translator) -> None:
    split = split_lines(translator, ["qb. qc.", "qd. qf. qg."], Request())
    err = split.user_error(UserError("line 4: no output"), first_line=10)
    assert str(err) == "line 11, sentence 2: no output"
    assert str(split.user_error(UserError("line 1: x"), 10)) == "line 10, sentence 1: x"
    assert str(split.user_error(UserError("line 9: x"), 10)) == "line 9: x"  # not a segment
