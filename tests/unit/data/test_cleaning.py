"""data.filters and data.augment in `prepare`: what the shards keep, the counts in the manifest
and the logs, a corpus entry's own filters, the cache key, SentencePiece's sample, and exact
resume with augmented pairs."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
from helpers.toy import (
    assert_identical,
    load_raw,
    resumable_state,
    run,
    script_validation,
    toy_config_dict,
    toy_pairs,
    write_lines,
)

from attn_mt.config.data import AugmentConfig
from attn_mt.config.file import config_from_dict
from attn_mt.data.augment import Augmenter
from attn_mt.data.cleaning import judge_corpora
from attn_mt.data.corpora import train_corpora
from attn_mt.data.prepare import plan, prepare_shards, sample_pairs
from attn_mt.data.shards import corpus_lines

REPEATS, COPIES = 30, 12


@pytest.fixture(scope="module")
def noisy_files(toy_data: dict[str, Path], tmp_path_factory: pytest.TempPathFactory):
    """The toy corpus (distinct pairs) with REPEATS repeated pairs and COPIES copied sources."""
    folder = tmp_path_factory.mktemp("noisy")
    pairs = list(dict.fromkeys(zip(*toy_pairs(600, seed=7), strict=True)))
    noisy = pairs + pairs[:REPEATS] + [(s, s) for s, _ in pairs[-COPIES:]]
    files = dict(toy_data)
    for side, column in (("src", 0), ("tgt", 1)):
        files[f"train.{side}"] = write_lines(folder / f"train.{side}", [p[column] for p in noisy])
    return files, len(pairs)


def filtered_raw(files: dict[str, Path], tmp_path: Path, **filters) -> dict:
    raw = toy_config_dict(files, tmp_path / "run")
    raw["data"].update(prepared_dir=str(tmp_path / "prepared"), filters=filters)
    return raw


def test_prepare_keeps_what_the_rules_keep_and_counts_each_rule(noisy_files, tmp_path, caplog):
    files, distinct = noisy_files
    cfg = config_from_dict(filtered_raw(files, tmp_path, dedup=True, copy=True))
    with caplog.at_level(logging.INFO, logger="attn_mt"):
        shards = prepare_shards(cfg, workers=2)  # the filters run on the worker pool
    entry = shards.manifest["corpora"][0]
    assert entry["dropped"] == {"copy": COPIES, "dedup": REPEATS}
    assert entry["kept"] == len(shards) == distinct
    assert entry["pairs"] == distinct + REPEATS + COPIES
    assert f"dropped {COPIES} copy, {REPEATS} dedup" in caplog.text
    assert f"dropped {COPIES} copy, {REPEATS} dedup" in corpus_lines([entry], [1.0])[0]
    src_tok, tgt_tok = shards.tokenizers()
    kept = set(zip(src_tok.decode(list(shards.src)), tgt_tok.decode(list(shards.tgt)), strict=True))
    assert len(kept) == len(shards) and all(s.split()[0][0] == "q" for s, _ in kept)


def test_a_corpus_entry_brings_its_own_filters(noisy_files, tmp_path):
    files, distinct = noisy_files
    raw = filtered_raw(files, tmp_path, dedup=True, copy=True)
    train = raw["data"]["train"]
    raw["data"]["train"] = [train, {**train, "filters": {"copy": True}}, {**train, "filters": {}}]
    entries = prepare_shards(config_from_dict(raw), workers=1).manifest["corpora"]
    assert [e["dropped"] for e in entries] == [
        {"copy": COPIES, "dedup": REPEATS},
        {"copy": COPIES},
        {},  # every rule off: not judged (the token rules found nothing to drop)
    ]


def test_the_prepared_folder_changes_with_the_settings_that_change_the_shards(toy_data, tmp_path):
    def folder(seed: int = 1, **data) -> Path:
        raw = toy_config_dict(toy_data, tmp_path / "run", seed=seed)
        raw["data"].update(prepared_dir=str(tmp_path / "prepared"), **data)
        return plan(config_from_dict(raw)).folder

    plain = folder()
    assert folder(filters={"dedup": True}) not in (plain, folder(filters={"copy": True}))
    assert folder(filters={"ratio": 2}) != folder(filters={"ratio": 3})
    assert folder(filters={"copy_share": 0.5}) == plain  # a threshold of a rule that is off
    assert folder(filters={"langid": True, "langid_min_chars": 5}) != folder(
        filters={"langid": True}
    )
    assert folder(augment={"uppercase": 0.1}) not in (plain, folder(augment={"uppercase": 0.2}))
    assert folder(seed=2) == plain  # the seed decides the augmentation's draws only
    assert folder(seed=2, augment={"typos": 0.1}) != folder(augment={"typos": 0.1})
    listed = folder(train=[{"src": str(toy_data["train.src"]), "tgt": str(toy_data["train.tgt"])}])
    own = folder(
        train=[{"src": str(toy_data["train.src"]), "tgt": str(toy_data["train.tgt"]),
                "filters": {"dedup": True}}]
    )  # fmt: skip
    assert listed == plain != own == folder(filters={"dedup": True})


def test_sentencepiece_samples_the_kept_pairs_augmented(noisy_files, tmp_path):
    files, distinct = noisy_files
    cfg = config_from_dict(filtered_raw(files, tmp_path, dedup=True, copy=True))
    corpora = train_corpora(cfg.data)
    codes = judge_corpora(cfg.data, corpora, workers=1)
    src, tgt = sample_pairs(corpora, 10_000, codes=codes)  # every kept pair, in order
    assert len(src) == distinct == len(set(zip(src, tgt, strict=True)))
    upper = Augmenter(AugmentConfig(uppercase=1.0), seed=1)
    assert sample_pairs(corpora, 10_000, codes=codes, changes=upper) == (
        [s.upper() for s in src],
        [t.upper() for t in tgt],
    )


def test_augmented_pairs_are_drawn_per_line(toy_data):
    augment = AugmentConfig(uppercase=0.2, titlecase=0.1, no_final_punct=0.3, typos=0.2)
    src, tgt = toy_pairs(2000, seed=1)

    def changed(seed: int) -> list[tuple[str, str]]:
        changes = Augmenter(augment, seed)
        numbered = enumerate(zip(src, tgt, strict=True))
        return [changes.pair(s, t, 0, line) for line, (s, t) in numbered]

    pairs = changed(1)
    assert pairs == changed(1) != changed(2)
    assert 0.15 < sum(s.isupper() for s, _ in pairs) / len(pairs) < 0.25
    typos = [s.lower() != s0.lower() for (s, _), s0 in zip(pairs, src, strict=True)]
    assert 0.15 < sum(typos) / len(pairs) < 0.25
    assert all(t.lower() == t0.lower() for (_, t), t0 in zip(pairs, tgt, strict=True))


def test_training_on_filtered_augmented_shards_resumes_exactly(toy_data, tmp_path, monkeypatch):
    """2 updates, then resumed to 4, equal 4 straight, bit for bit; train.log counts the drops."""
    script_validation(monkeypatch)  # validation draws nothing from the training streams

    def config(out: Path, steps: int):
        raw = toy_config_dict(toy_data, out, max_steps=steps)
        raw["model"]["dropout"] = 0.1
        raw["data"].update(
            prepared_dir=str(tmp_path / "prepared"),
            filters={"max_chars": 24},
            augment={"uppercase": 0.2, "titlecase": 0.1, "no_final_punct": 0.3, "typos": 0.2},
        )
        return config_from_dict(raw)

    run(config(tmp_path / "straight", 4))
    run(config(tmp_path / "resumed", 2))
    run(config(tmp_path / "resumed", 4), resume=True)
    assert_identical(
        resumable_state(load_raw(tmp_path / "resumed" / "checkpoints" / "last.pt")),
        resumable_state(load_raw(tmp_path / "straight" / "checkpoints" / "last.pt")),
    )
    log = (tmp_path / "straight" / "train.log").read_text()
    dropped = re.search(r"data: (\d+) training pairs kept, dropped ([\d,]+) max_chars;", log)
    assert dropped and int(dropped[1]) + int(dropped[2].replace(",", "")) == 3000, log
    assert (
        "data: pairs changed as data.augment says (drawn from train.seed 1): uppercase 20%, "
        "titlecase 10%, no_final_punct 30%, typos 20%\n" in log
    ), log
