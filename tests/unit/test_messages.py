"""Round four's messages and odd inputs outside the search: a damaged metrics.jsonl beside an
exported checkpoint, the n-best formats of one entry, the training budget's and schedule's
bounds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.toy import toy_config_dict

import attn_mt.checkpoint
from attn_mt.config.file import config_from_dict
from attn_mt.decode.translator import Translation
from attn_mt.errors import ConfigError
from attn_mt.export.hf_card import _validation_scores
from attn_mt.jobs.nbest import NbestFormat, format_entries

GOOD = {"step": 5, "bleu": 12.5, "chrf": 40.0}


@pytest.fixture
def toy_raw(toy_data: dict[str, Path], tmp_path: Path) -> dict:
    return toy_config_dict(toy_data, tmp_path / "run")


@pytest.mark.parametrize(
    "damage",
    [
        b'{"step": 5, "bl',  # a cut last line (the run was killed while writing)
        b"\xff\xfe not utf-8 \x80\n",
        b"[1, 2, 3]\n",  # JSON, but not an object
        b'{"step": 5, "bleu": "n/a"}\n',  # an object the model card cannot format
    ],
)
def test_export_reads_a_damaged_metrics_log(
    damage: bytes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(attn_mt.checkpoint, "load_checkpoint", lambda path: {"step": 5})
    (tmp_path / "metrics.jsonl").write_bytes(json.dumps(GOOD).encode() + b"\n" + damage)
    assert _validation_scores(tmp_path / "best.pt") == GOOD


def test_marian_nbest_format_holds_for_one_entry() -> None:
    entry = Translation(text="hallo welt", score=-1.25, tokens=[5, 6])
    assert format_entries(3, [entry], 1, NbestFormat.marian) == "3 ||| hallo welt ||| -1.2500\n"
    assert format_entries(3, [entry], 1, NbestFormat.tsv) == "hallo welt\n"


@pytest.mark.parametrize(
    ("train", "words"),
    [
        ({"lr": 1e-4, "min_lr": 1e-3}, ["train.min_lr", "must not exceed train.lr"]),
        ({"max_minutes": "1e308"}, ["train.max_minutes", "must be at most"]),
        ({"max_minutes": 1e12}, ["train.max_minutes", "must be at most"]),
    ],
)
def test_training_budget_and_floor_are_bounded(toy_raw: dict, train: dict, words: list) -> None:
    toy_raw["train"].update(train)
    with pytest.raises(ConfigError) as info:
        config_from_dict(toy_raw)
    assert all(word in str(info.value) for word in words) and "\n" not in str(info.value)
