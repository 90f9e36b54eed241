"""The toy task every test builds on, and the checks tests share.

The toy task maps each source word to a fixed target word, keeping the order, so a tiny model
learns it in seconds and reaches a high BLEU on held-out sentences: enough to test training,
search, translate, evaluate, averaging, plots and export end to end inside the CI budget.
"""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import pytest
import torch

from attn_mt.config.file import config_from_dict
from attn_mt.config.schema import Config
from attn_mt.data.epochs import epoch_order
from attn_mt.train.loop import TrainResult
from attn_mt.train.runlog import Validation
from attn_mt.train.setup import setup
from attn_mt.train.validate import Validator

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
    """`epochs.epoch_order` as lists of row indices, to compare with recorded batches."""
    return [rows.tolist() for rows in epoch_order(*args, **kwargs)]


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


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


def script_validation(monkeypatch: pytest.MonkeyPatch, bleus: tuple[float, ...] = ()) -> None:
    """Replace validation with a scripted BLEU sequence (then 0.0): fast, and it drives early
    stopping. Module fixtures call it inside `pytest.MonkeyPatch.context()`."""
    sequence = iter(bleus)

    def validate(self: Validator) -> Validation:
        bleu = next(sequence, 0.0)
        return Validation({"loss": 1.0, "ppl": math.e, "bleu": bleu, "chrf": 0.0}, [])

    monkeypatch.setattr(Validator, "validate", validate)


def make_config(toy_data: dict[str, Path], out: Path, model: dict | None = None, **train) -> Config:
    """The toy config writing to `out`, with model and train keys overridden."""
    raw = toy_config_dict(toy_data, out, **train)
    raw["model"].update(model or {})
    return config_from_dict(raw)


def run(cfg: Config, resume: bool = False) -> TrainResult:
    return setup(cfg, resume=resume).run()


def invoke(*args: str | Path):
    """`attn-mt ARGS` in this process (no terminal: no progress display)."""
    from typer.testing import CliRunner

    from attn_mt.cli import app

    return CliRunner().invoke(app, [str(a) for a in args])
