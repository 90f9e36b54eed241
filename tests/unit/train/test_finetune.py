"""Fine-tuning an imported model: a tiny MarianMT folder (`bench/marian.py`, transformers' own
classes) imported with `attn-mt import`, then trained from (`train.init_from`) on a few
Multi30k pairs with a config that names only its data and training: the run keeps the
import's SentencePiece models, vocabulary and shape, its loss falls, it translates, and it
validates its own set and data.valid_general at every validation, its start included. A config
that asks for another shape or other languages is one line, before anything is written.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers.toy import load_raw

import attn_mt
from attn_mt.checkpoint import tokenizers_from
from attn_mt.config.file import config_from_dict, inherit_keys, load_config
from attn_mt.data.prepare import plan, prepare_shards
from attn_mt.errors import ConfigError, DataError, UserError
from attn_mt.export.marian import import_marian
from attn_mt.train.setup import prepare_run_data, setup
from bench.marian import build_folder
from bench.marian_data import read_lines

pytest.importorskip("transformers")  # the [hf] extra: installed by `make test` (dev extras)
pytestmark = pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses")


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny opus-mt-de-en folder (random weights), imported: the run folder."""
    folder = tmp_path_factory.mktemp("opus") / "opus-mt-de-en"
    build_folder(folder, "opus-mt", small=True, eos_bias=4)
    run = tmp_path_factory.mktemp("runs") / "opus"
    import_marian(folder, run)
    return run


@pytest.fixture(scope="module")
def domain(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Multi30k files: 240 training pairs, 10 validation pairs of the run's own set and 10 of
    a general one (the 2016 test set)."""
    folder = tmp_path_factory.mktemp("domain")
    files = {}
    for name, split, count in (("train", "train", 240), ("valid", "val", 10)) + (
        ("general", "test_2016_flickr", 10),
    ):
        for lang in ("de", "en"):
            path = folder / f"{name}.{lang}"
            path.write_text("\n".join(read_lines(lang, split, count)) + "\n", encoding="utf-8")
            files[f"{name}.{lang}"] = str(path)
    return files


def tuning_dict(files: dict[str, str], out: Path, **sections: dict[str, Any]) -> dict:
    """A fine-tuning config as a user writes it: the data and the training, no model nor
    tokenizer (they come from the checkpoint); a short output limit, as the untrained
    import would run to its 511 tokens."""
    raw: dict[str, Any] = {
        "data": {
            "train": {"src": files["train.de"], "tgt": files["train.en"]},
            "valid": {"src": files["valid.de"], "tgt": files["valid.en"]},
            "valid_general": {"src": files["general.de"], "tgt": files["general.en"]},
            "prepared_dir": str(out.parent / "prepared"),
        },
        "model": {"dropout": 0.0},
        "train": {
            "out_dir": str(out),
            "max_steps": 12,
            "eval_every": 6,
            "log_every": 3,
            "lr": 0.003,
            "warmup": 4,
            "batch_tokens": 1500,
            "precision": "fp32",
            "samples": 0,
        },
        "decode": {"max_len_a": 1.0, "max_len_b": 6},
    }
    for name, keys in sections.items():
        raw[name] = {**raw.get(name, {}), **keys}
    return raw


def test_a_fine_tuned_import_keeps_its_vocabulary_and_learns(
    imported: Path, domain: dict[str, str], tmp_path: Path
) -> None:
    out = tmp_path / "tuned"
    source = load_raw(imported / "checkpoints" / "best.pt")
    cfg = config_from_dict(tuning_dict(domain, out, train={"init_from": str(imported)}))
    prepared = prepare_run_data(cfg)  # `attn-mt prepare`: with the checkpoint's SentencePiece
    assert prepared[0].startswith("training corpora prepared in") and "240" in prepared[1]
    result = setup(cfg).run()
    assert result.step == 12

    last = load_raw(out / "checkpoints" / "last.pt")
    assert last["tokenizers"] == source["tokenizers"]  # the same bytes: no SentencePiece trained
    written = yaml.safe_load((out / "config.yaml").read_text())
    assert written["tokenizer"] == source["config"]["tokenizer"]
    assert written["model"] == {**source["config"]["model"], "dropout": 0.0}  # the one key given
    assert written["decode"] == {**source["config"]["decode"], "max_len_a": 1.0, "max_len_b": 6}
    assert last["model"]["output.bias"].shape == source["model"]["output.bias"].shape
    folders = [path for path in (tmp_path / "prepared").iterdir() if path.is_dir()]
    assert folders == [plan(cfg, tokenizers_from(source)).folder]  # prepare's, which train used
    identity = json.loads((folders[0] / "manifest.json").read_text())["identity"]
    assert set(identity["tokenizer"]) == {"sha256"}  # named by the checkpoint's models

    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    losses = [row["loss"] for row in rows if row["split"] == "train"]
    assert losses[-1] < 0.95 * losses[0], losses
    validations = [(row["step"], row["split"]) for row in rows if row["split"] != "train"]
    assert validations == [
        (step, split) for step in (0, 6, 12) for split in ("valid_general", "valid")
    ]  # the start first; each step's general line before the run's own (which picks best.pt)
    log = (out / "train.log").read_text()
    assert "since step 0)" in log and "general set (data.valid_general): bleu" in log

    lines = read_lines("de", "test_2016_flickr", 3)
    translations = attn_mt.load(out, device="cpu").translate(lines)
    assert len(translations) == 3 and all(isinstance(t, str) for t in translations)


@pytest.mark.parametrize(
    ("sections", "named"),
    [
        ({"model": {"d_model": 64}}, "model.d_model (64 here, 32 there)"),
        ({"data": {"src_lang": "en", "tgt_lang": "de"}}, "the model translates de -> en"),
    ],
    ids=["shape", "languages"],
)
def test_another_shape_or_other_languages_are_one_line(
    sections: dict, named: str, imported: Path, domain: dict[str, str], tmp_path: Path
) -> None:
    out = tmp_path / "tuned"
    raw = tuning_dict(domain, out, train={"init_from": str(imported)}, **sections)
    with pytest.raises(UserError) as err:
        setup(config_from_dict(raw))
    assert named in str(err.value) and "\n" not in str(err.value)
    assert not out.exists()


def test_the_keys_a_config_writes_are_known(tmp_path: Path) -> None:
    """`Config.given` holds the file's keys and --set's; `inherit_keys` fills only the others,
    and a config made in code (every key its own) takes nothing."""
    path = tmp_path / "tune.yaml"
    path.write_text(yaml.safe_dump({"data": {"dataset": "multi30k"}, "model": {"dropout": 0.2}}))
    cfg = load_config(path, ["decode.beam=2", "train.max_steps=5"])
    assert cfg.given() == {"data.dataset", "model.dropout", "decode.beam", "train.max_steps"}
    raw = {"model": {"d_model": 64, "dropout": 0.3}, "decode": {"beam": 7}}
    source = config_from_dict(raw, files=False)  # a checkpoint's
    filled = inherit_keys(cfg, source)
    assert (filled.model.d_model, filled.model.dropout) == (64, 0.2)
    assert filled.decode.beam == 2 and filled.given() == cfg.given()
    made = config_from_dict({"data": {"dataset": "multi30k"}})
    made.__dict__.pop("_given")  # as a Config() built in code
    assert inherit_keys(made, source).model.d_model == made.model.d_model


@pytest.mark.parametrize(
    ("freeze", "problem"),
    [
        (["encoder", "encoder"], "once each"),
        (["embedding"], "some of ['embeddings', 'encoder', 'decoder']"),
        (["embeddings", "encoder", "decoder"], "leaves nothing to train"),
    ],
)
def test_freeze_names_parts_and_leaves_one(freeze: list, problem: str) -> None:
    with pytest.raises(ConfigError, match="train.freeze") as err:
        config_from_dict({"data": {"dataset": "multi30k"}, "train": {"freeze": freeze}})
    assert problem in str(err.value)


def test_prepare_never_trains_sentencepiece_for_a_run_from_a_checkpoint(
    domain: dict[str, str], tmp_path: Path
) -> None:
    """Its shards are encoded with the checkpoint's models (`prepare_run_data` reads them);
    without them `prepare_shards` refuses, and writes nothing."""
    raw = tuning_dict(domain, tmp_path / "tuned", train={"init_from": str(tmp_path / "x.pt")})
    with pytest.raises(DataError, match="that checkpoint's SentencePiece models"):
        prepare_shards(config_from_dict(raw))
    assert not (tmp_path / "prepared").exists()
