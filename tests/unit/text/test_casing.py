"""The casing table and lines in capitals or Title Case: the table from a toy corpus (a
sentence's first word not counted), which lines are recased and how, and the output cased
back; a line in ordinary case, or one the table writes as it is, is left alone."""

from __future__ import annotations

import pytest

from attn_mt.text.casing import (
    Casing,
    CasingTable,
    case_back,
    detect,
    recase,
    tables_from_dict,
    tables_to_dict,
    title_case,
)

CORPUS = [
    "Ein Mann mit einem Hut sieht zum Mann.",
    "Zwei Hunde laufen im Park mit einem Mann. Ein Hund springt.",
    "Der Mann fährt in die USA, der Mann lacht.",
    "Mann oder Frau?",  # "Mann" here starts a sentence: not counted
    "Ein iPhone und ein iPhone und ein IPHONE.",
    "mann ohne Hut",  # one sentence in ordinary lower case at its start
]


@pytest.fixture(scope="module")
def table() -> CasingTable:
    return CasingTable.build(CORPUS)


def test_the_table_holds_each_words_most_frequent_form(table: CasingTable) -> None:
    assert table.words["mann"] == "Mann"
    assert table.words["mit"] == "mit" and table.words["usa"] == "USA"
    assert table.words["iphone"] == "iPhone"  # 2 to 1 against IPHONE
    assert table.words["hund"] == "Hund"  # after a sentence's end inside a line: not counted
    assert "ein" in table.words  # counted where it is not first ("und ein iPhone")
    assert "zwei" not in table.words and "der" in table.words  # "der Mann lacht"
    assert table.capital_start  # five of six sentences start with a capital


def test_sentence_initial_forms_are_not_counted() -> None:
    table = CasingTable.build(["Hund bellt", "Hund bellt", "ein hund"])
    assert table.words == {"bellt": "bellt", "hund": "hund"}
    assert not CasingTable.build(["qb qc", "qd qf"]).capital_start


def test_a_table_survives_plain_data(table: CasingTable) -> None:
    again = tables_from_dict(tables_to_dict({"de": table}))["de"]
    assert again == table
    with pytest.raises(ValueError, match="format"):
        tables_from_dict({"format": "other", "languages": {}})


def test_a_sharp_s_in_capitals_is_found_in_the_table() -> None:
    """Upper case writes ß as SS: STRASSE is the table's Straße, not an unknown word."""
    table = CasingTable.build(["Ein Hund auf der Straße mit weißen Pfoten und einer Tasse."])
    line = "EIN HUND AUF DER STRASSE MIT WEISSEN PFOTEN UND EINER TASSE."
    assert recase(line, table)[0] == "Ein Hund auf der Straße mit weißen Pfoten und einer Tasse."


def test_words_the_table_lacks_take_the_form_of_words_seen_once() -> None:
    nouns = CasingTable.build(["Der Hund sieht Katzen", "Die Frau sieht Vögel und Bäume"])
    assert nouns.rare_capital  # Hund, Katzen, Frau, Vögel, Bäume against und
    assert recase("EIN ZEBRA SIEHT ALLES", nouns)[0] == "Ein Zebra sieht Alles"
    plain = CasingTable.build(["The dog sees cats", "A woman sees Birds and trees"])
    assert not plain.rare_capital
    assert recase("A ZEBRA SEES ALL", plain)[0] == "A zebra sees all"
    old = {"format": "attn-mt-casing/1", "languages": {"de": {"capital_start": True, "words": {}}}}
    assert not tables_from_dict(old)["de"].rare_capital  # a table written before the key


@pytest.mark.parametrize(
    ("line", "expected", "casing"),
    [
        ("EIN MANN MIT EINEM HUT.", "Ein Mann mit einem Hut.", Casing("upper")),
        ("Ein Mann Mit Einem Hut.", "Ein Mann mit einem Hut.", Casing("title")),
        # A Title Case line keeps its acronyms and the words the table does not know.
        ("Ein Mann In Der USA Mit Xaver.", "Ein Mann in der USA mit Xaver.", Casing("title")),
        # A run of capitals inside a line; its words the table does not know stay.
        (
            "ein hut: MANN MIT HUT BBQ",
            "ein hut: Mann mit Hut BBQ",
            Casing(words=frozenset({2, 3, 4, 5})),
        ),
        # ALL CAPS: every word, a sentence's first in capitals, unknown words in lower case.
        ("HUT? EIN MANN ZORRO!", "Hut? Ein Mann zorro!", Casing("upper")),
    ],
)
def test_lines_in_capitals_or_title_case_are_recased(table, line, expected, casing) -> None:
    assert recase(line, table) == (expected, casing)


@pytest.mark.parametrize(
    "line",
    [
        "Ein Mann mit einem Hut.",  # ordinary case
        "Ein Mann.",  # looks like Title Case, but the table writes it as it is
        "Mongolian BBQ in den USA",  # lone acronyms
        "Ein Hut: BBQ USA",  # a run the table does not know
        "12 34 !",  # no letters
        "",
    ],
)
def test_lines_in_ordinary_case_are_left_alone(table, line) -> None:
    assert recase(line, table) == (line, Casing())


def test_detect_names_how_a_line_is_written() -> None:
    assert detect(["A"]) == Casing("upper")
    assert detect(["IPHONE", "12"]) == Casing("upper")
    assert detect(["New", "York", "City"]) == Casing("title")
    assert detect(["NASA", "USA"]) == Casing("upper")
    assert detect(["the", "NASA", "USA", "budget"]) == Casing(words=frozenset({1, 2}))
    assert detect(["the", "NASA", "budget"]) == Casing()


def test_outputs_are_cased_back() -> None:
    assert case_back("A man with a hat.", Casing("upper"), []) == "A MAN WITH A HAT."
    assert case_back("A man with a hat.", Casing("title"), []) == "A Man With A Hat."
    run = Casing(words=frozenset({2, 3}))
    pairs = [(0, 0), (1, 1), (2, 3), (3, 2), (4, 4)]
    assert case_back("a hat: man with hat", run, pairs) == "a hat: MAN WITH hat"
    assert case_back("a hat", Casing(), pairs) == "a hat"


def test_title_case_keeps_the_rest_of_each_word() -> None:
    assert title_case("an iPhone, don't  go") == "An IPhone, Don't  Go"
