"""Shared fixtures: a synthetic word-translation task, a tiny config, and one trained toy run.

The toy task maps each source word to a fixed target word, keeping the order, so a tiny model
learns it in seconds and reaches a high BLEU on held-out sentences: enough to test training,
search, translate, evaluate, averaging, plots and export end to end inside the CI budget.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
import torch
import yaml

from attn_mt.config import Config, config_from_dict

SRC_WORDS = [f"q{w}" for w in "bcdfghjklmnprstvwz"]  # 18 source "words"
TGT_WORDS = [f"{w}a" for w in "BCDFGHJKLMNPRSTVWZ"]  # their fixed translations


def toy_pairs(count: int, seed: int) -> tuple[list[str], list[str]]:
    """`count` random sentences of 3-9 source words and their word-by-word translations."""
    rng = random.Random(seed)
    src, tgt = [], []
    for _ in range(count):
        idx = [rng.randrange(len(SRC_WORDS)) for _ in range(rng.randint(3, 9))]
        src.append(" ".join(SRC_WORDS[i] for i in idx))
        tgt.append(" ".join(TGT_WORDS[i] for i in idx))
    return src, tgt


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


@pytest.fixture(scope="session", autouse=True)
def _isolated_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Keep SentencePiece models and downloads out of the user's real cache."""
    os.environ["ATTN_MT_CACHE"] = str(tmp_path_factory.mktemp("attn-mt-cache"))
    torch.set_num_threads(min(2, torch.get_num_threads()))


@pytest.fixture(scope="session")
def toy_data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Files of the toy task: train (3000 pairs), valid (100) and test (100)."""
    folder = tmp_path_factory.mktemp("toy-data")
    files = {}
    for split, count, seed in (("train", 3000, 1), ("valid", 100, 2), ("test", 100, 3)):
        src, tgt = toy_pairs(count, seed)
        files[f"{split}.src"] = write_lines(folder / f"{split}.src", src)
        files[f"{split}.tgt"] = write_lines(folder / f"{split}.tgt", tgt)
    return files


def toy_config_dict(toy_data: dict[str, Path], out_dir: Path, **train) -> dict:
    """A tiny, fast config for the toy task as plain dicts (tests tweak it freely)."""
    return {
        "data": {
            "src_lang": "xx",
            "tgt_lang": "yy",
            "train": {"src": str(toy_data["train.src"]), "tgt": str(toy_data["train.tgt"])},
            "valid": {"src": str(toy_data["valid.src"]), "tgt": str(toy_data["valid.tgt"])},
            "test": {"src": str(toy_data["test.src"]), "tgt": str(toy_data["test.tgt"])},
            "max_len": 64,
        },
        "tokenizer": {"vocab_size": 60, "byte_fallback": False, "model_type": "bpe"},
        "model": {
            "d_model": 64,
            "heads": 4,
            "encoder_layers": 1,
            "decoder_layers": 1,
            "d_ff": 128,
            "dropout": 0.0,
        },
        "train": {
            "out_dir": str(out_dir),
            "max_steps": 20,
            "lr": 0.003,
            "warmup": 50,
            "batch_tokens": 1024,
            "eval_every": 1000,
            "log_every": 50,
            "precision": "fp32",
            "seed": 1,
            **train,
        },
        "decode": {"beam": 3, "max_len_a": 1.2, "max_len_b": 5},
    }


@pytest.fixture
def toy_config(toy_data: dict[str, Path], tmp_path: Path):
    """A factory: toy_config(**train_overrides) -> validated Config writing under tmp_path."""

    def make(**train) -> Config:
        return config_from_dict(toy_config_dict(toy_data, tmp_path / "run", **train))

    return make


@pytest.fixture(scope="session")
def trained_run(toy_data: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run folder with a toy model trained to a high BLEU (shared by many tests; read-only)."""
    from attn_mt.train import train

    out = tmp_path_factory.mktemp("trained") / "run"
    raw = toy_config_dict(toy_data, out, max_steps=400, eval_every=200, keep_checkpoints=2)
    config_file = out.parent / "toy.yaml"
    config_file.write_text(yaml.safe_dump(raw))
    result = train(config_from_dict(raw))
    assert result.best_bleu > 80, (
        f"the toy model should learn the task, got BLEU {result.best_bleu}"
    )
    return out
