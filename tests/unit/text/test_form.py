"""One line's way to the model and back (`TextRules`): what the model reads, and its output
written as the line was: cased back, spans put back, final punctuation as the source's; a line
in ordinary case with final punctuation reaches the model and comes back as it is."""

from __future__ import annotations

import pytest

from attn_mt.text.casing import CasingTable
from attn_mt.text.form import TextRules

TABLE = CasingTable.build(["Ein Mann mit einem Hut sieht den Hund.", "Der Hund sieht den Mann."])


def rules(recase: bool = True, protect: bool = True, known: str = "\"'-") -> TextRules:
    sources: dict[str | None, list[str]] = {None: ["de"]}
    return TextRules(recase, protect, {"de": TABLE}, sources, known.__contains__)


def monotone(text: str) -> list[tuple[int, int]]:
    return [(i, i) for i in range(len(text.split()))]


def round_trip(ours: TextRules, line: str, translate) -> tuple[str, str]:
    """What the model reads of `line`, and the line's output when the model answers
    `translate(text)` word for word."""
    [form] = ours.read([line])
    output = translate(form.text)
    return form.text, ours.write(form, output, monotone(output))[0]


def test_a_line_in_ordinary_case_is_read_and_written_as_it_is() -> None:
    for line in ["Ein Mann sieht den Hund.", "Der Hund sieht 3 Hunde!", "", "  "]:
        [form] = rules().read([line])
        assert form.text == line and not form.aligned
        assert rules().write(form, line, None) == (line, None)


def test_capitals_go_to_the_model_in_usual_forms_and_come_back() -> None:
    assert round_trip(rules(), "EIN MANN SIEHT DEN HUND.", str.lower) == (
        "Ein Mann sieht den Hund.",
        "EIN MANN SIEHT DEN HUND.",
    )
    text, out = round_trip(rules(), "Ein Mann: HUT SIEHT HUND", str.lower)
    assert text == "Ein Mann: Hut sieht Hund"
    assert out == "ein mann: HUT SIEHT HUND"


def test_spans_are_put_back_after_casing() -> None:
    text, out = round_trip(rules(), "EIN MANN HTTPS://X.DE SIEHT DEN HUND.", str.lower)
    assert text == "Ein Mann sieht den Hund."
    assert out == "EIN MANN HTTPS://X.DE SIEHT DEN HUND."


def test_no_final_punctuation_in_none_out() -> None:
    [form] = rules().read(["Ein Mann sieht den Hund"])
    assert rules().write(form, "A man sees the dog.", None)[0] == "A man sees the dog"
    [form] = rules(recase=False).read(["Ein Mann sieht den Hund"])
    assert rules().write(form, "A man sees the dog.", None)[0] == "A man sees the dog."


def test_a_line_of_spans_alone_is_kept() -> None:
    [form] = rules().read(["  https://x.de 🙂 "])
    assert form.text == "" and rules().write(form, "", None) == ("https://x.de 🙂", None)


def test_numbers_and_characters_read_as_the_model_knows_them() -> None:
    [form] = rules().read(["Ein\u00adMann sieht «3» Hunde — 1.000"])
    assert form.text == 'Ein Mann sieht "3" Hunde - 1.000'.replace("Ein Mann", "EinMann")
    assert form.numbers == ["3", "1.000"]
    [form] = rules(protect=False).read(["Ein\u00adMann «3»"])
    assert form.text == "Ein\u00adMann «3»" and form.numbers == []


@pytest.mark.parametrize("line", ["EIN MANN", "https://x.de Hund"])
def test_both_off_reads_every_line_as_given(line: str) -> None:
    [form] = rules(False, False).read([line])
    assert form.text == line and not form.aligned


def test_a_multilingual_model_reads_each_line_by_its_languages_table() -> None:
    french = CasingTable.build(["Un homme avec un chapeau voit le chien de Paris."])
    sources: dict[str | None, list[str]] = {"en": ["de", "fr"], "de": ["en"]}
    ours = TextRules(True, False, {"de": TABLE, "fr": french}, sources, lambda c: True)
    [de, fr] = ours.read(["EIN MANN SIEHT DEN HUND", "UN HOMME VOIT LE CHIEN DE PARIS"], "en")
    assert de.text == "Ein Mann sieht den Hund"
    assert fr.text == "Un homme voit le chien de Paris"
    [none] = ours.read(["EIN MANN SIEHT DEN HUND"], "de")  # en -> de: no English table
    assert none.text == "EIN MANN SIEHT DEN HUND"


def test_numbers_the_vocabulary_spells_are_taken_out_at_once() -> None:
    rules = TextRules(False, True, None, {}, lambda c: True, spelled=lambda n: len(n) > 1)
    [form] = rules.read(["Der Hund sieht 3 Hunde und 1987 Katzen"])
    assert form.text == "Der Hund sieht 3 Hunde und Katzen" and form.numbers == ["3"]
    [form] = rules.read(["Der Hund sieht 3 Hunde und 1987 Katzen"], numbers=True)
    assert form.text == "Der Hund sieht Hunde und Katzen" and form.numbers == []
