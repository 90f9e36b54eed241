"""The glossary rule: which target terms a line gets (whole words, any case, the longer of two
terms found at one place, in order, each once, after the line's own terms); a file of
`source<TAB>target` lines read, each mistake one error naming the line; the same glossary on
the API's lines as the terms given by hand."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.toy import toy_pairs

import attn_mt
from attn_mt.decode.glossary import Glossary
from attn_mt.errors import UserError

TERMS = {"Hund": "dog", "New York": "NY", "York": "Y", "C++": "C plus plus", "a.b": "ab"}


@pytest.mark.parametrize(
    ("line", "terms"),
    [
        ("Der Hund läuft.", ["dog"]),
        ("DER HUND LÄUFT.", ["dog"]),  # any case
        ("Die Hunde laufen.", []),  # a whole word, not part of one
        ("Hundehütte", []),
        ("Ich liebe New York und York.", ["NY", "Y"]),  # the longer term at one place
        ("York, New York, Hund, York", ["Y", "NY", "dog"]),  # in order, each once
        ("Ich schreibe C++ gern.", ["C plus plus"]),  # taken literally, not as a pattern
        ("axb a.b", ["ab"]),
        ("", []),
    ],
)
def test_a_line_gets_the_target_terms_of_the_source_terms_it_holds(line, terms) -> None:
    assert Glossary.of(TERMS).terms(line) == terms


def test_constraints_are_a_lines_own_terms_then_the_glossarys() -> None:
    glossary = Glossary.of(TERMS)
    lines = ["Der Hund in New York.", "Nichts.", "Hund"]
    assert glossary.constraints(lines) == [["dog", "NY"], [], ["dog"]]
    given = [["Katze", "dog"], [], []]
    assert glossary.constraints(lines, given) == [["Katze", "dog", "NY"], [], ["dog"]]


def test_a_glossary_file_is_read(tmp_path: Path) -> None:
    path = tmp_path / "terms.tsv"
    path.write_bytes("\ufeffHund\tdog\n\n New York \t NY\r\nhund\tdog\n".encode())
    glossary = Glossary.read(path)
    assert glossary.entries == (("Hund", "dog"), ("New York", "NY"))  # the same term: once
    assert glossary == Glossary.of({"Hund": "dog", "New York": "NY"})
    assert glossary.digest() == Glossary.of({"Hund": "dog", "New York": "NY"}).digest()
    assert glossary.digest() != Glossary.of({"Hund": "hound", "New York": "NY"}).digest()


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (b"Hund\tdog\nKatze\n", "line 2: give 'source term<TAB>target term' (1 fields)"),
        (b"Hund\tdog\tcanine\n", "line 1: give 'source term<TAB>target term' (3 fields)"),
        (b"Hund\tdog\nHund\thound\n", "line 2: 'Hund' is given on an earlier line too"),
        (b"Hund\tdog\nhund\thound\n", "one source term (case aside) with two targets"),
        (b"Hund\t \n", "line 1: the target term is empty"),
        (b"\tdog\n", "line 1: the source term is empty"),
        (b"Hund\tdog\nKatze\tc\xe4t\n", "line 2 is not UTF-8 text"),
    ],
)
def test_each_mistake_in_a_glossary_file_is_one_error(tmp_path: Path, content, words) -> None:
    path = tmp_path / "terms.tsv"
    path.write_bytes(content)
    with pytest.raises(UserError, match="--glossary") as found:
        Glossary.read(path)
    assert words in str(found.value)
    with pytest.raises(UserError, match="cannot read"):
        Glossary.read(tmp_path / "missing.tsv")


def test_a_glossary_from_the_api_is_checked() -> None:
    for terms in ({"Hund": ""}, {"": "dog"}, {"Hund": "dog\u2028"}, {"Hund": 3}):
        with pytest.raises(UserError, match="glossary"):
            Glossary.of(terms)  # type: ignore[arg-type]


def test_the_glossary_gives_the_terms_given_by_hand(trained_run: Path) -> None:
    """On the toy model: each line that holds `qb` gets `Ba`, as `constraints` would give it."""
    translator = attn_mt.load(trained_run, device="cpu")
    lines = toy_pairs(8, seed=11)[0]
    by_hand = [["Ba"] if "qb" in line.split() else [] for line in lines]
    assert any(by_hand) and not all(by_hand)
    glossed = translator.translate(lines, beam=3, glossary=Glossary.of({"QB": "Ba"}))
    assert glossed == translator.translate(lines, beam=3, constraints=by_hand)
    assert all("Ba" in out.split() for out, terms in zip(glossed, by_hand, strict=True) if terms)
