"""Spans kept verbatim: each kind found, taken out with the punctuation written against it
(but a line's final punctuation), and put back where the alignment leads, in order: several
in a line, at its start and end, repeated, next to punctuation; and the numbers an output
must hold."""

from __future__ import annotations

import pytest

from attn_mt.text.spans import find, missing, numbers, put_back, take_out

KINDS = {
    "url": [
        "https://example.com/a?b=1",
        "www.example.org/x",
        "ftp://files.example.net/f",
        "HTTPS://EXAMPLE.COM/A",  # a line in capitals
    ],
    "email": ["info@example.com", "anna.schmidt+tag@mail.example.org"],
    "handle": ["@attn_mt"],
    "tag": ["#multi30k"],
    "path": ["/etc/hosts", "~/runs/teacher", "./run.sh", "C:\\Users\\anna", "config.yaml", "A.PDF"],
    "code": ["`make test`", "`x = 1`"],
    "emoji": ["🙂", "👍🏽", "🇩🇪", "👩‍💻", "1️⃣"],
}


@pytest.mark.parametrize(("kind", "span"), [(k, s) for k, spans in KINDS.items() for s in spans])
def test_each_kind_is_found_whole(kind: str, span: str) -> None:
    line = f"qb {span} qc"
    assert [(line[a:b], found) for a, b, found in find(line)] == [(span, kind)]


@pytest.mark.parametrize(
    "line",
    ["ein Mann und/oder eine Frau", "km/h und 24/7", "C# und C++", "z.B. 3.5 kg", "Nummer #1"],
)
def test_ordinary_text_holds_no_span(line: str) -> None:
    assert find(line) == []


def identity(text: str) -> list[tuple[int, int]]:
    """A monotone alignment of a text to itself, word for word."""
    return [(i, i) for i in range(len(text.split()))]


@pytest.mark.parametrize(
    ("line", "model", "spans", "back"),
    [
        # At the start, in the middle, at the end before the final punctuation.
        ("https://x.de qb qc.", "qb qc.", ["https://x.de"], "https://x.de QB QC."),
        ("qb info@x.de qc.", "qb qc.", ["info@x.de"], "QB info@x.de QC."),
        ("qb qc https://x.de.", "qb qc.", ["https://x.de"], "QB QC https://x.de."),
        # Punctuation written against a span goes with it; the final punctuation stays.
        ("qb (https://x.de), qc", "qb qc", ["(https://x.de),"], "QB (https://x.de), QC"),
        ("qb qc (https://x.de)!", "qb qc!", ["(https://x.de)"], "QB QC (https://x.de)!"),
        # Several, adjacent, repeated; written against a word.
        ("@jo #t qb 🙂 qc 🙂.", "qb qc.", ["@jo", "#t", "🙂", "🙂"], "@jo #t QB 🙂 QC 🙂."),
        ("qb👍 qc", "qb qc", ["👍"], "QB👍 QC"),
        ("qb 👍qc", "qb qc", ["👍"], "QB 👍QC"),
        ("`ls -la` qb qc", "qb qc", ["`ls -la`"], "`ls -la` QB QC"),
    ],
)
def test_spans_go_back_where_they_were(line, model, spans, back) -> None:
    taken = take_out(line)
    assert taken is not None
    assert taken.text == model
    assert [s.text for s in taken.spans] == spans
    # The "translation": word for word, in capitals.
    assert put_back(taken, model.upper(), identity(model))[0] == back


def test_spans_follow_the_alignment_and_keep_their_order() -> None:
    taken = take_out("qb https://x.de qc info@x.de qd.")
    assert taken is not None and taken.text == "qb qc qd."
    # The output reorders the words: qd qb qc.
    text, pairs = put_back(taken, "Da Ba Ca.", [(2, 0), (0, 1), (1, 2)])
    assert text == "Da Ba https://x.de Ca info@x.de."
    # The line's words (span words too) to the output's: qb-Ba, https-https, qc-Ca, ...
    assert pairs == [(4, 0), (0, 1), (1, 2), (2, 3), (3, 4)]


def test_a_line_without_spans_gives_none() -> None:
    assert take_out("qb qc 28.") is None


def test_numbers_in_their_forms() -> None:
    assert numbers("Nummer 28, 1.000 Leute, 3,5 kg um 10:30 am 1. Mai, 24/7, T4, 3D") == [
        "28",
        "1.000",
        "3,5",
        "10:30",
        "1",
        "24/7",
    ]
    assert missing(["1.000", "3,5", "28"], "number 28, 1,000 people, 3.5 kg") == []
    assert missing(["1.000"], "1000 people") == []
    assert missing(["3,5"], "35 kg") == ["3,5"]  # not a grouping: 3.5 is not 35
    assert missing(["28", "7"], "number 28") == ["7"]


def test_numbers_are_taken_out_when_asked_with_what_is_written_against_them() -> None:
    line = "Nummer 28, 1.000 Leute, 3,5 kg um (10:30) am 1. Mai 1️⃣"
    assert take_out(line) is not None and take_out("Nummer 28 um 10:30") is None
    assert take_out("Nummer 28 um 10:30", numbers=lambda n: ":" in n).text == "Nummer 28 um"
    taken = take_out(line, numbers=lambda number: True)
    assert taken is not None and taken.text == "Nummer Leute, kg um am Mai"
    spans = [(s.text, s.kind) for s in taken.spans]
    assert spans == [
        ("28,", "number"),
        ("1.000", "number"),
        ("3,5", "number"),
        ("(10:30)", "number"),
        ("1.", "number"),
        ("1️⃣", "emoji"),
    ]
    back = put_back(taken, taken.text.upper(), identity(taken.text))[0]
    assert back == line.upper()
