"""Text as people write it through the Translator (`decode.recase`, `decode.protect`): a plain
line searched exactly as with both off, lines in capitals, Title Case or with a run in
capitals recased and cased back, spans put back in order, a line that lost a number read again
with its numbers taken out, and a checkpoint without a casing table said once."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from helpers.toy import toy_pairs

import attn_mt
from attn_mt.config.file import apply_override, config_from_dict, parse_yaml
from attn_mt.config.schema import DecodeConfig
from attn_mt.decode.request import Request
from attn_mt.decode.written import given_back, lost_numbers, read_again
from attn_mt.text.form import TextRules

OFF = {"recase": "off", "protect": "off"}


@pytest.fixture(scope="module")
def ours(trained_run: Path) -> attn_mt.Translator:
    return attn_mt.load(trained_run, device="cpu", prepack=False)


@pytest.fixture(scope="module")
def off(trained_run: Path) -> attn_mt.Translator:
    return attn_mt.load(trained_run, device="cpu", prepack=False, decode=OFF)


def entries(translator: attn_mt.Translator, lines: list[str], **options) -> list:
    found = translator.translate_nbest(lines, **options)
    return [[(e.text, e.tokens, e.score, e.alignment) for e in row] for row in found]


def test_plain_lines_are_searched_as_with_both_off(ours, off) -> None:
    lines = [*toy_pairs(12, seed=4)[0], "", "qb  qc\tqd "]
    assert off.text is None and ours.text is not None
    for options in ({"beam": 1}, {"beam": 3, "nbest": 3, "alignment": True}):
        assert entries(ours, lines, **options) == entries(off, lines, **options)


def test_capitals_and_title_case_are_recased_and_cased_back(ours) -> None:
    plain = ours.translate(["qb qc qd qf", "qg qh qj"])
    words = plain[0].split()
    found = ours.translate(["QB QC QD QF", "Qg Qh Qj", "qb QC QD qf"])
    assert found[0] == plain[0].upper()
    assert found[1] == " ".join(w[:1].upper() + w[1:] for w in plain[1].split())
    assert found[2] == " ".join([words[0], words[1].upper(), words[2].upper(), words[3]])


def test_spans_come_back_verbatim_and_in_order(ours) -> None:
    w = ours.translate(["qb qc qd"])[0].split()
    cases = {
        "https://x.de qb qc qd": f"https://x.de {w[0]} {w[1]} {w[2]}",
        "qb qc qd info@x.de": f"{w[0]} {w[1]} {w[2]} info@x.de",
        "qb @jo #t qc /etc/hosts qd 🙂": f"{w[0]} @jo #t {w[1]} /etc/hosts {w[2]} 🙂",
        "qb (https://x.de), qc `ls -la` qd": f"{w[0]} (https://x.de), {w[1]} `ls -la` {w[2]}",
        "qb 👍 qc 👍 qd": f"{w[0]} 👍 {w[1]} 👍 {w[2]}",
        "qb👍 qc qd": f"{w[0]}👍 {w[1]} {w[2]}",
        "https://x.de info@x.de": "https://x.de info@x.de",  # nothing else to translate
    }
    assert ours.translate(list(cases)) == list(cases.values())


def test_alignments_count_the_words_as_given(ours) -> None:
    [[plain]] = ours.translate_nbest(["qb qc"], alignment=True)
    [[found]] = ours.translate_nbest(["qb https://x.de qc"], alignment=True)
    assert found.text.split()[1] == "https://x.de"
    assert (1, 1) in found.alignment
    moved = {(s + (s > 0), t + (t > 0)) for s, t in plain.alignment}
    assert moved <= set(found.alignment)


def test_a_checkpoint_without_a_casing_table_says_so_once(trained_run, tmp_path, off) -> None:
    state = torch.load(trained_run / "checkpoints" / "best.pt", weights_only=True)
    assert isinstance(state.pop("casing"), dict)  # training wrote one, as plain data
    bare = tmp_path / "bare.pt"
    torch.save(state, bare)
    translator = attn_mt.load(bare, device="cpu", prepack=False)
    lines = ["QB QC QD", "qb qc", "QD QF"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        found = translator.translate(lines)
        translator.translate(lines)
    said = [str(w.message) for w in caught]
    assert len(said) == 1 and "no casing table" in said[0] and "recase-table" in said[0]
    assert found == off.translate(lines)  # read as given


def test_numbers_come_back_as_written(ours) -> None:
    lines = ["qb 28 qc qd", "1.000 qb qc", "qb qc qd 3,5", "qb qc (10:30) qd", "42", "qb 24/7"]
    for line, output in zip(lines, ours.translate(lines), strict=True):
        for number in line.replace("(", " ").replace(")", " ").split():
            assert not number[0].isdigit() or number in output, (line, output)


class Stub:
    """A translator's text rules and a word-for-word alignment."""

    def __init__(self):
        self.text = TextRules(False, True, None, {}, lambda c: True)

    def language_prefix(self, tgt_lang):
        return []

    def _align(self, lines, src, entries, lead):
        for line, row in zip(lines, entries, strict=True):
            for entry in row:
                count = min(len(line.split()), len(entry.text.split()))
                entry.alignment = [(i, i) for i in range(count)]


class Entry:
    def __init__(self, text: str):
        self.text, self.alignment = text, None


def test_a_line_that_lost_a_number_is_read_again_without_its_numbers() -> None:
    stub = Stub()
    lines = ["qb 28 qc 7", "qb 28", "42"]
    forms = stub.text.read(lines)
    found = [[Entry("Ba Ca 7")], [Entry("Ca 28")], [Entry("")]]
    lost = lost_numbers(forms, [0, 1, 2], found)
    assert lost == [0, 2]  # the second kept its number
    model_lines = [form.text for form in forms]
    read_again(stub.text, forms, model_lines, lost, None)
    assert model_lines == ["qb qc", "qb 28", ""]
    assert forms[2].kept == "42"  # nothing but a number: given back as it is
    request = Request().resolved(DecodeConfig(), 100)
    back = given_back(stub, forms, model_lines, [[1]] * 3, [0], [[Entry("Ba Ca")]], request)
    assert back[0][0].text == "Ba 28 Ca 7"


def test_lines_that_lost_numbers_are_searched_again_together_last(ours, monkeypatch) -> None:
    lines = [f"qb {n} qc qd" for n in range(10)] + ["qb qc"] * 6 + ["4"]  # one piece each
    searched: list[list[str]] = []
    search = ours._search

    def spy(texts, ids, rows, controls, request):
        searched.append([texts[row] for row in rows])
        return search(texts, ids, rows, controls, request)

    monkeypatch.setattr(ours, "_search", spy)
    done: list[int] = []
    found = ours.translate_nbest(
        lines, beam=2, nbest=2, batch_tokens=12, on_line=lambda row, entries: done.append(row)
    )
    assert sorted(done) == list(range(len(lines))) and [len(row) for row in found] == [2] * len(
        lines
    )
    for line, (best, _) in zip(lines, found, strict=True):
        assert all(word in best.text for word in line.split() if word[0].isdigit())
    # Each line that lost its number was read again as "qb qc qd", after every first search.
    first = [k for k, texts in enumerate(searched) if any(c.isdigit() for t in texts for c in t)]
    again = [k for k, texts in enumerate(searched) if "qb qc qd" in texts]
    assert len(first) > 2 and again and min(again) > max(first)
    searched.clear()
    ours.translate(lines, beam=2)  # the batch holds them all: the lines read again, one more
    assert len(searched) == 2 and "qb qc qd" in searched[1]


def test_off_is_off_in_yaml_and_set(trained_run) -> None:
    """YAML reads `off` as false: the keys take it as "off", in a file and from --set."""
    raw = torch.load(trained_run / "checkpoints" / "best.pt", weights_only=True)["config"]
    apply_override(raw, "decode.recase=off")
    raw["decode"]["protect"] = parse_yaml("off")
    decode = config_from_dict(raw).decode
    assert (decode.recase, decode.protect) == ("off", "off")
