"""attn_mt.load's device settings: fp32 translation on CUDA uses TF32 as its model's training
did (CUDA mocked: the Translator is replaced, so no tensor goes to a GPU)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers.toy import toy_config_dict

from attn_mt.checkpoint import load_checkpoint, save_checkpoint
from attn_mt.config.file import config_from_dict
from attn_mt.decode import load
from attn_mt.precision import set_tf32

CUDA = torch.device("cuda", 0)


@pytest.fixture(scope="module")
def checkpoints(toy_data: dict[str, Path], tmp_path_factory: pytest.TempPathFactory):
    """Two updates of the toy model, saved as trained (train.tf32 true, the default), with
    train.tf32 false and with train.deterministic true."""
    from attn_mt.train.setup import train

    out = tmp_path_factory.mktemp("tf32") / "run"
    train(config_from_dict(toy_config_dict(toy_data, out, max_steps=2)))
    trained = out / "checkpoints" / "last.pt"
    paths = {"default": trained}
    for name, key in (("tf32 off", "tf32"), ("deterministic", "deterministic")):
        state = load_checkpoint(trained)
        state["config"]["train"][key] = key == "deterministic"
        paths[name] = out / f"{name}.pt"
        save_checkpoint(state, paths[name])
    return paths


@pytest.fixture
def tf32_left(monkeypatch: pytest.MonkeyPatch):
    """TF32 off to start with (torch's default), restored after; load builds no Translator
    (nothing goes on CUDA)."""
    saved = tf32()
    set_tf32(False)
    monkeypatch.setattr(load, "Translator", lambda *args: args)
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def tf32() -> tuple[bool, bool]:
    return torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32


@pytest.mark.parametrize(
    ("checkpoint", "expected"),
    [("default", (True, True)), ("tf32 off", (False, False)), ("deterministic", (False, False))],
)
def test_fp32_translation_on_cuda_uses_tf32_as_training_did(
    checkpoints, tf32_left, checkpoint, expected
):
    load.load(checkpoints[checkpoint], device=CUDA, precision="fp32")
    assert tf32() == expected


@pytest.mark.parametrize(("device", "precision"), [(CUDA, "bf16"), (torch.device("cpu"), "fp32")])
def test_tf32_is_left_alone_off_cuda_or_with_autocast(checkpoints, tf32_left, device, precision):
    load.load(checkpoints["default"], device=device, precision=precision)
    assert tf32() == (False, False)
