"""Checkpoints: atomic writes that never lose the previous file, the one "config differs"
comparison that resume and averaging share, and what a checkpoint holds."""

from __future__ import annotations

import errno
import io
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.toy import assert_identical, load_raw

import attn_mt
from attn_mt.checkpoint import (
    FORMAT,
    average_checkpoints,
    config_differences,
    load_checkpoint,
    save_checkpoint,
)
from attn_mt.config.schema import Config
from attn_mt.errors import CheckpointError
from attn_mt.export.ct2 import export_ctranslate2
from attn_mt.train.setup import setup

REAL_TORCH_SAVE = torch.save


def test_config_differences_names_each_changed_key() -> None:
    old, new = Config().to_dict(), Config().to_dict()
    new["model"]["d_ff"] = 7
    new["train"]["lr"] = 1.0
    new["data"]["tgt_lang"] = "xx"
    assert config_differences(old, new, ["model", "data.src_lang"]) == ["model.d_ff"]
    assert config_differences(old, new, ["train", "data.tgt_lang"]) == [
        "train.lr",
        "data.tgt_lang",
    ]
    assert config_differences(old, old, ["model", "tokenizer", "train"]) == []
    del new["model"]["heads"]  # a key only one side has differs too
    assert "model.heads" in config_differences(old, new, ["model"])


def checkpoint_state(value: float) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "model": {"w": torch.full((64, 64), value)},
        "config": {},
        "step": int(value),
        "tokenizers": {"src": b"src", "tgt": b"tgt"},
    }


def serialized(obj: Any) -> bytes:
    buffer = io.BytesIO()
    REAL_TORCH_SAVE(obj, buffer)
    return buffer.getvalue()


def write_half_then(error: BaseException):
    """A torch.save that writes half the file, then fails with `error`."""

    def save(obj, handle, *args, **kwargs):
        data = serialized(obj)
        handle.write(data[: len(data) // 2])
        raise error

    return save


class FullDisk(io.RawIOBase):
    """A file wrapper whose writes fail with ENOSPC once `room` bytes are written."""

    def __init__(self, handle: Any, room: int):
        self.handle, self.room = handle, room

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        if len(data) > self.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= len(data)
        return self.handle.write(data)


def disk_fills_up_midway(obj, handle, *args, **kwargs):
    """The real torch.save on a disk that fills up half-way (torch wraps it in RuntimeError)."""
    REAL_TORCH_SAVE(obj, FullDisk(handle, len(serialized(obj)) // 2))


def fail(error: OSError):
    def failing(*args, **kwargs):
        raise error

    return failing


@pytest.mark.parametrize(
    ("target", "replacement", "reason"),
    [
        ("torch.save", write_half_then(RuntimeError("stream writer failed")), "writer failed"),
        ("torch.save", write_half_then(OSError(errno.ENOSPC, "No space left on device")), "space"),
        ("torch.save", disk_fills_up_midway, "No space left on device"),
        ("os.fsync", fail(OSError(errno.EIO, "Input/output error")), "Input/output error"),
        ("os.replace", fail(OSError(errno.EACCES, "Permission denied")), "Permission denied"),
    ],
    ids=["interrupted", "enospc", "disk-fills-midway", "fsync-fails", "rename-fails"],
)
def test_failed_checkpoint_write_keeps_the_previous_file(
    target: str, replacement, reason: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "checkpoints" / "last.pt"
    save_checkpoint(checkpoint_state(1.0), path)
    module, name = target.split(".")
    monkeypatch.setattr({"torch": torch, "os": os}[module], name, replacement)
    with pytest.raises(CheckpointError) as err:
        save_checkpoint(checkpoint_state(2.0), path)
    monkeypatch.undo()
    message = str(err.value)
    assert str(path) in message and "could not write" in message and "intact" in message
    assert reason in message
    assert [p.name for p in path.parent.iterdir()] == ["last.pt"]  # no temp file left
    assert_identical(load_checkpoint(path), checkpoint_state(1.0))


def test_interrupt_during_a_checkpoint_write_keeps_the_previous_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "last.pt"
    save_checkpoint(checkpoint_state(1.0), path)
    monkeypatch.setattr(torch, "save", write_half_then(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(checkpoint_state(2.0), path)
    monkeypatch.undo()
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]
    assert_identical(load_raw(path), checkpoint_state(1.0))


def test_checkpoint_error_during_training_is_a_user_error(
    toy_config, monkeypatch: pytest.MonkeyPatch, scripted_validation
) -> None:
    scripted_validation()
    monkeypatch.setattr(torch, "save", disk_fills_up_midway)
    cfg = toy_config(max_steps=1)
    with pytest.raises(CheckpointError, match="No space left on device"):
        setup(cfg).run()
    monkeypatch.undo()
    assert list((Path(cfg.train.out_dir) / "checkpoints").iterdir()) == []


def test_a_checkpoint_written_on_a_gpu_loads_resumes_averages_and_exports_on_the_cpu(
    toy_config, scripted_validation, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Checkpoints whose tensors are tagged cuda:0, as torch.save writes them from a GPU: the
    bytes of a CPU run, saved with the storage location torch records for a CUDA tensor."""
    scripted_validation()
    cfg = toy_config(max_steps=2, eval_every=1, keep_checkpoints=2)
    setup(cfg).run()
    folder = Path(cfg.train.out_dir) / "checkpoints"
    names = ("last.pt", "best.pt", "step_1.pt", "step_2.pt")
    with monkeypatch.context() as patch:
        patch.setattr(torch.serialization, "location_tag", lambda storage: "cuda:0")
        for name in names:
            save_checkpoint(load_raw(folder / name), folder / name)
    for name in names:  # really tagged: without map_location torch would place them on a GPU
        with pytest.raises(RuntimeError, match="CUDA"):
            torch.load(folder / name, weights_only=True)
    translator = attn_mt.load(folder / "best.pt", device="cpu")
    assert isinstance(translator.translate(["a b c"])[0], str)
    averaged = average_checkpoints([folder / "step_1.pt", folder / "step_2.pt"])
    assert {t.device.type for t in averaged["model"].values()} == {"cpu"}
    exported = export_ctranslate2(folder / "step_1.pt", tmp_path / "ct2")
    assert (exported / "model.bin").is_file()
    resumed = setup(toy_config(max_steps=3, eval_every=1, keep_checkpoints=2), resume=True)
    assert resumed.run().step == 3
