"""`attn-mt clean`: its files (the kept pairs, dropped.tsv, report.json) and its printed table
agree with each other, with the input, and with the manifest `prepare` writes for the same
config; a bad value or an output folder holding the corpus is refused with one line."""

from __future__ import annotations

import collections
import gzip
import json
import os
from pathlib import Path

import pytest
from helpers.clirun import assert_user_error, snapshot, write_yaml
from helpers.toy import write_lines
from helpers.workspace import run_cli

from attn_mt.config.file import load_config
from attn_mt.data.prepare import prepare_shards

CLEAN = [
    ("Ein Mann fährt mit dem Fahrrad über eine Brücke.", "A man rides a bike across a bridge."),
    ("Zwei Hunde spielen im Schnee.", "Two dogs play in the snow."),
    ("Eine Frau liest ein Buch im Park.", "A woman reads a book in the park."),
    ("Kinder spielen Fußball auf einer Wiese.", "Children play soccer on a meadow."),
    ("Ein Koch schneidet Gemüse in der Küche.", "A cook chops vegetables in the kitchen."),
    ("Ja.", "Yes."),
]
NOISE = [
    ("Zwei Hunde spielen im Schnee.", "Two dogs play in the snow."),  # a repeat
    ("Eine Frau liest ein Buch im Park.", "Eine Frau liest ein Buch im Park."),  # a copy
    ("<p>Startseite</p>", "<p>Home</p>"),
    ("Ein Mann fährt mit dem Fahrrad über eine Brücke.", "Un homme traverse un pont à vélo."),
    ("Ein Koch schneidet Gemüse in der Küche und singt dabei laut.", "A cook."),
]


@pytest.fixture(scope="module")
def cleaned(tmp_path_factory: pytest.TempPathFactory, toy_data: dict[str, Path]):
    """Two corpora cleaned with 2 workers: the first by data.filters, the second by its own."""
    folder = tmp_path_factory.mktemp("clean")
    pairs = [CLEAN[0], *NOISE[:2], *CLEAN[1:], *NOISE[2:]] * 2  # the second copy: all repeats
    files = {}
    for side, column in (("de", 0), ("en", 1)):
        files[side] = write_lines(folder / f"corpus.{side}", [p[column] for p in pairs])
    entry = {"src": str(files["de"]), "tgt": str(files["en"])}
    raw = {
        "data": {
            "src_lang": "de",
            "tgt_lang": "en",
            "train": [entry, {**entry, "filters": {"copy": True}}],
            "valid": {"src": str(toy_data["valid.src"]), "tgt": str(toy_data["valid.tgt"])},
            "filters": {"dedup": True, "copy": True, "markup": True, "langid": True, "ratio": 2},
            "prepared_dir": str(folder / "prepared"),
        },
        "tokenizer": {"vocab_size": 80, "byte_fallback": False, "model_type": "bpe"},
    }
    config = write_yaml(folder / "clean.yaml", raw)
    out = folder / "out"
    result = run_cli(["clean", "--config", config, "--out", out, "--workers", "2"], None, {})
    assert result.returncode == 0, result.stderr.decode()
    return config, out, pairs, result.stdout.decode()


def test_clean_writes_the_kept_pairs_and_why_each_other_went(cleaned):
    config, out, pairs, printed = cleaned
    report = json.loads((out / "report.json").read_text())
    rows = [line.split("\t") for line in (out / "dropped.tsv").read_text().splitlines()]
    first, second = report["corpora"]
    assert first["dropped"] == {
        "empty": 0, "ratio": 2, "markup": 2, "copy": 2, "langid": 2, "dedup": 8,
    }  # fmt: skip
    assert second["dropped"] == {"empty": 0, "copy": 2}
    for number, corpus in enumerate(report["corpora"], start=1):
        assert corpus["lines"] == len(pairs) == corpus["kept"] + sum(corpus["dropped"].values())
        mine = [row for row in rows if row[0] == str(number)]
        counts = collections.Counter(row[2] for row in mine)
        assert {rule: counts[rule] for rule in corpus["dropped"]} == corpus["dropped"]
        assert all((row[3], row[4]) == pairs[int(row[1]) - 1] for row in mine)
        gone = {int(row[1]) for row in mine}
        kept = [pairs[i - 1] for i in range(1, len(pairs) + 1) if i not in gone]
        src, tgt = (
            gzip.decompress((out / f"train.{number}.{lang}.gz").read_bytes()).decode().splitlines()
            for lang in ("de", "en")
        )
        assert list(zip(src, tgt, strict=True)) == kept and len(kept) == corpus["kept"]
        for rule, count in corpus["dropped"].items():
            assert any(line.split()[:2] == [rule, f"{count:,}"] for line in printed.splitlines())
    assert CLEAN[5] in kept  # the short pair stays
    # prepare drops the same pairs and counts them alike
    shards = prepare_shards(load_config(config, training=False), workers=1)
    for entry, corpus in zip(shards.manifest["corpora"], report["corpora"], strict=True):
        assert entry["kept"] == corpus["kept"]
        assert entry["dropped"] == {rule: n for rule, n in corpus["dropped"].items() if n}


def test_clean_refuses_an_output_folder_holding_the_corpus(cleaned):
    config, out, pairs, _ = cleaned
    corpus = Path(json.loads((out / "report.json").read_text())["corpora"][0]["src"]).parent
    before = snapshot(corpus)
    result = run_cli(["clean", "--config", config, "--out", corpus], None, {})
    assert_user_error(result, f"--out {corpus}", "holds the data.train[0].src file")
    assert snapshot(corpus) == before


def test_clean_refuses_a_bad_filter_value_in_one_line(cleaned):
    config, out, _, _ = cleaned
    stamp = os.stat(out / "report.json").st_mtime_ns
    result = run_cli(
        ["clean", "-c", config, "--out", out, "--set", "data.filters.ratio=0.5"], None, {}
    )
    assert_user_error(result, "data.filters.ratio: 0.5 is invalid; must be 0 (off) or >= 1")
    assert os.stat(out / "report.json").st_mtime_ns == stamp
