"""The rules of data.filters on hand-made pairs: what each drops, and what it must keep (short
lines, Czech diacritics, Cyrillic, Greek, Arabic digits, Chinese and Japanese); the order of the
rules; the registry, the one place a rule is added (its keys, its order, its code, its counts in
`attn-mt clean`'s files and the manifest); the hashes dedup keeps; py3langid's scores computed a
chunk at a time."""

# ruff: noqa: E501  (a table of sentence pairs reads best one pair a line)
from __future__ import annotations

import dataclasses
import gzip
import json
import random

import numpy as np
import pytest
from helpers.toy import write_lines

from attn_mt.config.data import FilterConfig
from attn_mt.config.file import config_from_dict
from attn_mt.data import filters
from attn_mt.data.cleaning import clean_corpora, dropped_counts, judge_corpora
from attn_mt.data.corpora import train_corpora
from attn_mt.data.dedup import SeenHashes, pair_hashes
from attn_mt.data.filters import FILTERS, PairFilter, rule_names
from attn_mt.data.rules import ChunkRule, PairRule, Rule, Score
from attn_mt.langid import language_scores

LONG_DE = "Ein Mann schneidet einen Kuchen auf einer rosafarbenen Unterlage in der Küche auf."

# (rules on, languages, source, target, the rule that drops the pair or None)
# fmt: off
CASES = [
    ({}, "de-en", "", "A dog.", "empty"),
    ({}, "de-en", "Ein Hund.", "   ", "empty"),
    ({}, "de-en", "Ja.", "Yes.", None),  # a short line is a line
    ({"max_chars": 20}, "de-en", LONG_DE, "A man cuts a cake.", "max_chars"),
    ({"max_chars": 20}, "de-en", "Ein Hund.", "A dog.", None),
    ({"ratio": 1.6}, "de-en", LONG_DE, "A man.", "ratio"),
    ({"ratio": 1.6}, "de-en", "OK.", "Einverstanden.", None),  # short lines are not judged
    ({"ratio": 1.6}, "zh-en", "我们今天去公园散步。", "We are going for a walk in the park today.", None),
    ({"ratio": 1.6}, "en-ja", "I love cats.", "私は猫が大好きです。", None),
    ({"markup": True}, "de-en", "<b>Angebot</b> heute", "<b>Offer</b> today", "markup"),
    ({"markup": True}, "de-en", "Mehr unter www.example.com/x", "More at www.example.com/x", "markup"),
    ({"markup": True}, "de-en", "Startseite | Kontakt | Hilfe", "Home | Contact | Help", "markup"),
    ({"markup": True}, "de-en", "© 2020 Firma", "© 2020 Company", "markup"),
    ({"markup": True}, "de-en", "Tom &amp; Jerry spielen.", "Tom &amp; Jerry play.", None),
    ({"markup": True}, "de-en", "Drei < fünf, oder?", "Three < five, right?", None),
    ({"long_words": 30}, "de-en", "Der Donaudampfschifffahrtsgesellschaftskapitän", "The captain", "long_words"),
    ({"long_words": 30}, "zh-en", "我们今天去公园散步然后回家吃晚饭看电视睡觉休息一下吧好吗朋友们大家", "Today.", None),
    ({"digits": True}, "de-en", "2 Hunde rennen.", "3 dogs run.", "digits"),
    ({"digits": True}, "de-en", "1.000 Euro für 2,50", "1,000 euros for 2.50", None),
    ({"digits": True}, "ar-en", "٣ كلاب تجري", "3 dogs run", None),
    ({"digits": True}, "de-en", "Zwei Hunde.", "Two dogs.", None),
    ({"copy": True}, "de-en", "Ein Hund rennt im Park.", "Ein Hund rennt im Park.", "copy"),
    ({"copy": True}, "de-en", "Hallo Welt, wie geht es?", "Hello world, how are you?", None),
    ({"copy": True}, "de-en", "Berlin, Paris und Rom.", "Berlin, Paris and Rome.", None),
    ({"script": True}, "ru-en", "Hello, how are you today?", "Hello, how are you today?", "script"),
    ({"script": True}, "ru-en", "Привет, как дела сегодня?", "Hello, how are you today?", None),
    ({"script": True}, "el-en", "Καλημέρα κόσμε, τι κάνεις;", "Good morning world, how are you?", None),
    ({"script": True}, "zh-en", "我非常喜欢我的新iPhone手机，它很好用。", "I love my new iPhone.", None),
    ({"script": True}, "ja-en", "今日は公園を散歩します。", "I walk in the park today.", None),
    ({"script": True}, "de-en", "12345 !!!", "12345 !!!", None),  # no letters: no script
    ({"langid": True}, "de-en", "Ein Mann fährt mit dem Fahrrad über die Straße.", "Un homme fait du vélo dans la rue.", "langid"),
    ({"langid": True}, "de-en", "A man rides his bike across the street.", "Ein Mann fährt mit dem Fahrrad über die Straße.", "langid"),
    ({"langid": True}, "cs-en", "Černý pes vyskočil z vody a běží po pláži.", "A black dog jumped out of the water and runs on the beach.", None),
    ({"langid": True}, "ru-en", "Мужчина едет на велосипеде по улице.", "A man rides a bike down the street.", None),
    ({"langid": True}, "el-en", "Ένας άντρας οδηγεί ποδήλατο στον δρόμο.", "A man rides a bike down the street.", None),
    ({"langid": True}, "zh-en", "一个男人在街上骑自行车。", "A man rides a bike down the street.", None),
    ({"langid": True}, "de-en", "Ja, bitte.", "Oui, merci.", None),  # too short to judge
    ({"langid": True}, "de-en", "EIN MANN FÄHRT MIT DEM FAHRRAD ÜBER DIE STRASSE.", "A MAN RIDES HIS BIKE ACROSS THE STREET.", None),
]
# fmt: on


@pytest.mark.parametrize(("rules", "langs", "src", "tgt", "dropped_by"), CASES)
def test_each_rule_drops_noise_and_keeps_translations(rules, langs, src, tgt, dropped_by):
    judge = PairFilter(FilterConfig(**rules), *langs.split("-"))
    code = int(judge.judge([src], [tgt])[0])
    assert (rule_names()[code - 1] if code else None) == dropped_by


def test_a_pair_counts_under_the_first_rule_and_a_chunk_is_judged_pair_by_pair():
    everything = FilterConfig(markup=True, copy=True, langid=True, ratio=1.6)
    judge = PairFilter(everything, "de", "en")
    german = "Ein Mann fährt mit dem Fahrrad über die Straße."
    src = [german, german, "<p>Ein Hund.</p>", "Eine Frau liest ein Buch im Park."]
    tgt = [german, "A man rides his bike.", "<p>A dog.</p>", "A woman reads a book in the park."]
    codes = judge.judge(src, tgt)  # the copy is also in the wrong language: copy comes first
    assert [rule_names()[c - 1] if c else None for c in codes] == ["copy", "ratio", "markup", None]


def test_every_rule_keeps_clean_pairs_when_on():
    """The same clean pairs pass all the rules at once, in several languages."""
    rules = FilterConfig(
        max_chars=200,
        ratio=1.6,
        markup=True,
        long_words=40,
        digits=True,
        copy=True,
        script=True,
        langid=True,
        dedup=True,
    )
    # fmt: off
    clean = [
        ("de-en", "Zwei Hunde spielen im Schnee mit einem roten Ball.", "Two dogs play in the snow with a red ball."),
        ("cs-en", "Dva psi si hrají ve sněhu s červeným míčem.", "Two dogs play in the snow with a red ball."),
        ("ru-en", "Две собаки играют в снегу с красным мячом.", "Two dogs play in the snow with a red ball."),
        ("el-en", "Δύο σκύλοι παίζουν στο χιόνι με μια κόκκινη μπάλα.", "Two dogs play in the snow with a red ball."),
        ("zh-en", "两只狗在雪地里玩一个红色的球。", "Two dogs play in the snow with a red ball."),
        ("de-en", "Hallo!", "Hi!"),
    ]
    # fmt: on
    for langs, src, tgt in clean:
        assert PairFilter(rules, *langs.split("-")).judge([src], [tgt]).tolist() == [0], langs


def test_unknown_languages_are_not_judged(caplog):
    judge = PairFilter(FilterConfig(script=True, langid=True), "xx", "yy")
    assert judge.judge(["Ein Hund rennt über die Wiese."], ["Un chien court."]).tolist() == [0]
    assert "no script known for xx" in caplog.text
    assert "py3langid does not know yy" in caplog.text


# ---------------------------------------------------------------------------------------------
# The registry


def test_each_filters_key_belongs_to_one_registered_rule_in_its_order():
    """A key of data.filters is a rule's switch (named as the rule) or one of its settings
    (`RULE_*`); the switches come in the registry's order, the order the docs list them in."""
    names = [rule.name for rule in FILTERS]
    for field in dataclasses.fields(FilterConfig):
        owners = [n for n in names if field.name == n or field.name.startswith(f"{n}_")]
        assert len(owners) == 1, (field.name, owners)
    switches = list(FilterConfig().switches())
    assert switches == [n for n in names if n != "empty"]
    assert rule_names() == (*names, "max_len", "max_len_ratio")


SWITCHED_ON = {"bool": True, "int": 5, "float": 2.0, "str | None": "model.pt"}


@pytest.mark.parametrize("switch", list(FilterConfig().switches()))
def test_a_switch_turns_on_its_rule_and_no_other(switch):
    field = next(f for f in dataclasses.fields(FilterConfig) if f.name == switch)
    config = FilterConfig(**{switch: SWITCHED_ON[str(field.type)]})
    assert config.switches() == {name: name == switch for name in config.switches()}
    assert config.any() and not FilterConfig().any()
    assert [rule.name for rule in PairFilter(config, "de", "en").rules] == ["empty", switch]


def test_the_registry_is_in_the_order_the_rules_run():
    """Pair by pair, then a chunk at a time on the workers, then the rules that accept in the
    order of the corpus (dedup), then the model's (score): the order the codes are given in."""

    def stage(rule: type[Rule]) -> int:
        if issubclass(rule, PairRule):
            return 0
        if issubclass(rule, ChunkRule):
            return 2 if rule.in_order else 1
        return 3

    stages = [stage(rule) for rule in FILTERS]
    assert stages == sorted(stages) and FILTERS[-1] is Score and stages.count(3) == 1


class Shouting(PairRule):
    """A rule only the test below registers (always on): a source written in capitals."""

    name = "shouting"

    @classmethod
    def is_on(cls, config: FilterConfig) -> bool:
        return True

    def score(self, src: str, tgt: str) -> bool:
        return src.isupper()

    def accept(self, score: bool) -> bool:
        return not score


def test_a_rule_added_to_the_registry_is_run_reported_and_ordered(tmp_path, monkeypatch):
    """One class in `FILTERS` is all: `clean` runs it in its place (after markup, before copy,
    on the worker processes), counts it in report.json, dropped.tsv and the manifest's order."""
    monkeypatch.setattr(filters, "FILTERS", (*FILTERS[:4], Shouting, *FILTERS[4:]))
    assert rule_names()[3:6] == ("markup", "shouting", "long_words")
    pairs = [
        ("Ein Hund rennt.", "A dog runs."),
        ("EIN HUND RENNT.", "A dog runs."),  # shouting
        ("<B>EIN HUND.</B>", "<b>A dog.</b>"),  # markup comes first
        ("EINE KATZE SCHLÄFT.", "EINE KATZE SCHLÄFT."),  # shouting comes before copy
        ("Eine Katze schläft.", "Eine Katze schläft."),  # copy
        ("EIN HUND RENNT.", "A dog runs."),  # shouting again: dedup looks at the pairs kept
        ("Ein Hund rennt.", "A dog runs."),  # dedup
    ]
    src = write_lines(tmp_path / "corpus.de", [s for s, _ in pairs])
    tgt = write_lines(tmp_path / "corpus.en", [t for _, t in pairs])
    files = {"src": str(src), "tgt": str(tgt)}
    rules = {"markup": True, "copy": True, "dedup": True}
    data = {"src_lang": "de", "tgt_lang": "en", "train": files, "valid": files, "filters": rules}
    cfg = config_from_dict({"data": data})
    corpora = train_corpora(cfg.data)
    out = tmp_path / "out"
    out.mkdir()
    clean_corpora(cfg.data, corpora, out, workers=2)
    report = json.loads((out / "report.json").read_text())["corpora"][0]
    assert report["dropped"] == {"empty": 0, "markup": 1, "shouting": 3, "copy": 1, "dedup": 1}
    rows = [line.split("\t")[1:3] for line in (out / "dropped.tsv").read_text().splitlines()]
    assert rows == [["2", "shouting"], ["3", "markup"], ["4", "shouting"], ["5", "copy"],
                    ["6", "shouting"], ["7", "dedup"]]  # fmt: skip
    assert gzip.decompress((out / "train.1.de.gz").read_bytes()).decode() == "Ein Hund rennt.\n"
    (codes,) = judge_corpora(cfg.data, corpora, workers=1)  # prepare's pass
    assert list(dropped_counts(codes).dropped.items()) == [
        ("markup", 1), ("shouting", 3), ("copy", 1), ("dedup", 1),
    ]  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Repeated pairs


def test_seen_hashes_are_a_set():
    rng = np.random.default_rng(0)
    seen, reference = SeenHashes(), set()
    for size in [1, 5, 300, 7, 1000, 64, 2, 500]:  # levels merge as the set grows
        batch = rng.integers(0, 3000, size, dtype=np.uint64)  # repeats within and across
        fresh = seen.add_new(batch)
        expected = []
        for value in batch.tolist():
            expected.append(value not in reference)
            reference.add(value)
        assert fresh.tolist() == expected
    assert len(seen) == len(reference)


def test_pair_hashes_ignore_spacing_only():
    a = pair_hashes(["Ein  Hund ", "Ein Hund"], ["A dog", "A  dog\t"])
    b = pair_hashes(["Ein Hund"], ["A cat"])
    assert a[0] == a[1] != b[0] and a.dtype == np.uint64


def test_language_scores_are_py3langids():
    """The batched walk gives py3langid's own normalized probabilities, line by line."""
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    reference = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
    lines = [
        "Ein Mann fährt Fahrrad.",
        "Černý pes vyskočil z vody.",
        "Мужчина едет на велосипеде.",
        "一个男人在街上骑自行车。",
        "THIS LINE IS ALL CAPITALS",
        "",
        "12345",
    ]
    random.Random(0).shuffle(lines)  # lengths in no order
    scores = language_scores()
    for lang in ("de", "cs", "ru", "zh", "en"):
        ours = scores.probability(lines, [lang] * len(lines))
        theirs = [dict(reference.rank(line))[lang] for line in lines]
        assert ours == pytest.approx(theirs, abs=1e-4), lang
