"""Shared fixtures: a synthetic word-translation task, a tiny config, and one trained toy run.

The toy task maps each source word to a fixed target word, keeping the order, so a tiny model
learns it in seconds and reaches a high BLEU on held-out sentences: enough to test training,
search, translate, evaluate, averaging, plots and export end to end inside the CI budget.
"""

from __future__ import annotations

import math
import os
import random
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from attn_mt.config import Config, config_from_dict
from attn_mt.data import epoch_order
from attn_mt.train import Trainer, Validation

# The fixtures of the end-to-end command-line tests (a toy corpus and a finished run).
pytest_plugins = ("clirun",)

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


def load_raw(path: Path) -> dict[str, Any]:
    """A checkpoint read the way the design promises it can be: weights_only=True."""
    return torch.load(path, map_location="cpu", weights_only=True)


def resumable_state(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """What must be bit-identical between a straight and a resumed run."""
    ts = checkpoint["train_state"]
    return {
        "step": checkpoint["step"],
        "model": checkpoint["model"],
        "optimizer": ts["optimizer"],
        "rng": ts["rng"],
        "data": ts["data"],
        "ema": checkpoint.get("ema"),  # the weight average, when train.ema_decay > 0
    }


def assert_identical(a: Any, b: Any, where: str = "state") -> None:
    """Recursive equality; tensors must match in dtype, shape and every bit."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), where
        assert a.dtype == b.dtype and a.shape == b.shape, where
        assert torch.equal(a, b), (
            f"{where} differs (max diff {(a.double() - b.double()).abs().max()})"
        )
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            assert_identical(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_identical(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def epoch_lists(*args, **kwargs) -> list[list[int]]:
    """`data.epoch_order` as lists of row indices, to compare with recorded batches."""
    return [rows.tolist() for rows in epoch_order(*args, **kwargs)]


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


def script_validation(monkeypatch: pytest.MonkeyPatch, bleus: tuple[float, ...] = ()) -> None:
    """Replace validation with a scripted BLEU sequence (then 0.0): fast, and it drives early
    stopping. Module fixtures call it inside `pytest.MonkeyPatch.context()`."""
    sequence = iter(bleus)

    def validate(self: Trainer) -> Validation:
        bleu = next(sequence, 0.0)
        return Validation({"loss": 1.0, "ppl": math.e, "bleu": bleu, "chrf": 0.0}, [])

    monkeypatch.setattr(Trainer, "validate", validate)


@pytest.fixture
def scripted_validation(monkeypatch: pytest.MonkeyPatch):
    """scripted_validation(bleus) installs `script_validation` for one test."""

    def install(bleus: tuple[float, ...] = ()) -> None:
        script_validation(monkeypatch, bleus)

    return install


@pytest.fixture(scope="session")
def trained_run(toy_data: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run folder with a toy model trained to a high BLEU (shared by many tests; read-only)."""
    from attn_mt.train import train

    out = tmp_path_factory.mktemp("trained") / "run"
    raw = toy_config_dict(toy_data, out, max_steps=400, eval_every=200, keep_checkpoints=2)
    config_file = out.parent / "toy.yaml"
    config_file.write_text(yaml.safe_dump(raw))
    result = train(config_from_dict(raw))
    assert result.best_score > 80, (
        f"the toy model should learn the task, got BLEU {result.best_score}"
    )
    return out
