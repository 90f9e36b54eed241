"""Text as people write it through the Translator (`decode.recase`, `decode.protect`): a plain
line searched exactly as with both off, lines in capitals, Title Case or with a run in
capitals recased and cased back, spans put back in order, a line that lost a number searched
again with it as a term, and a checkpoint without a casing table said once."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from helpers.toy import toy_pairs

import attn_mt
from attn_mt.config.file import apply_override, config_from_dict, parse_yaml
from attn_mt.config.schema import DecodeConfig, TokenizerConfig
from attn_mt.data.tokenizer import Tokenizer, train_tokenizer
from attn_mt.decode.controls import Controls
from attn_mt.decode.request import Request
from attn_mt.decode.written import given_back
from attn_mt.errors import UserError
from attn_mt.text.form import LineForm, TextRules

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


class Stub:
    """A translator whose search returns given outputs (a real target tokenizer: digits)."""

    def __init__(self, tokenizer, again: list[str] | None = None, fails: bool = False):
        self.text = TextRules(False, True, None, {}, lambda c: True)
        self.tgt_tokenizer = tokenizer
        self.again, self.fails, self.calls = again, fails, []

    def language_prefix(self, tgt_lang):
        return []

    def _search(self, lines, ids, rows, controls, request):
        self.calls.append((rows, controls, request.beam))
        if self.fails:
            raise UserError("no output")
        return [[Entry(self.again[row])] for row in rows]

    def _align(self, lines, src, entries, lead):
        raise AssertionError("no span here")


class Entry:
    def __init__(self, text: str):
        self.text, self.alignment = text, None


@pytest.fixture(scope="module")
def digits(tmp_path_factory) -> Tokenizer:
    """A target vocabulary that writes numbers."""
    settings = TokenizerConfig(vocab_size=60, byte_fallback=False, model_type="bpe")
    lines = [f"Ba {n} Ca" for n in range(200)]
    return train_tokenizer(settings, lines, tmp_path_factory.mktemp("digits"))


def resolved(**options) -> Request:
    return Request(**options).resolved(DecodeConfig(), 100)


def test_a_line_that_lost_a_number_is_searched_again(digits) -> None:
    stub = Stub(digits, again=["Ba 28 Ca 7", "Ca 28"])
    forms = [LineForm("qb 28 qc 7", numbers=["28", "7"]), LineForm("qb 28", numbers=["28"])]
    found = [[Entry("Ba Ca 7")], [Entry("Ca 28")]]
    back = given_back(
        stub, forms, ["a", "b"], [[1], [2]], [0, 1], [None, None], found, resolved(beam=1)
    )
    assert [row[0].text for row in back] == ["Ba 28 Ca 7", "Ca 28"]
    [(rows, [controls], beam)] = stub.calls  # the second line kept its number: not searched
    assert rows == [0] and beam == 2
    assert digits.decode(controls.terms) == ["28"]


def test_a_failed_search_again_keeps_the_first_output(digits) -> None:
    stub = Stub(digits, fails=True)
    form = LineForm("qb 28", numbers=["28"])
    given = Controls(terms=[digits.encode(["Ba"])[0]])
    found = [[Entry("Ba")]]
    back = given_back(stub, [form], ["a"], [[1]], [0], [given], found, resolved(beam=3))
    assert back[0][0].text == "Ba"
    [(_, [controls], _)] = stub.calls
    assert controls.terms[0] == given.terms[0] and len(controls.terms) == 2
    sampled = resolved(sampling=attn_mt.Sampling(seed=1))
    given_back(stub, [form], ["a"], [[1]], [0], [None], [[Entry("Ba")]], sampled)
    assert len(stub.calls) == 1  # a sample is drawn freely


def test_off_is_off_in_yaml_and_set(trained_run) -> None:
    """YAML reads `off` as false: the keys take it as "off", in a file and from --set."""
    raw = torch.load(trained_run / "checkpoints" / "best.pt", weights_only=True)["config"]
    apply_override(raw, "decode.recase=off")
    raw["decode"]["protect"] = parse_yaml("off")
    decode = config_from_dict(raw).decode
    assert (decode.recase, decode.protect) == ("off", "off")
