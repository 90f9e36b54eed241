"""Checkpoints written in the background (`CheckpointWriter`, train/state.py): training goes on
while a checkpoint is written, at most one write is in flight, last.pt is a complete checkpoint
whenever it is read, and the run's final save has landed when the run returns."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch

from attn_mt import checkpoint
from attn_mt.checkpoint import load_checkpoint
from attn_mt.train import state as train_state
from attn_mt.train.runlog import RunLog
from attn_mt.train.setup import setup


def test_cpu_copy_is_independent_of_the_original() -> None:
    weights = torch.ones(3)
    state = {"model": {"w": weights}, "groups": [{"lr": 1.0, "moments": (weights,)}]}
    copied = train_state.cpu_copy(state)
    weights.add_(1)
    state["groups"][0]["lr"] = 2.0
    assert torch.equal(copied["model"]["w"], torch.ones(3))
    assert torch.equal(copied["groups"][0]["moments"][0], torch.ones(3))
    assert copied["groups"][0]["lr"] == 1.0


def test_a_save_copies_each_tensor_once_whichever_files_hold_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """best.pt, step_N.pt and last.pt hold the same weights: the host holds one copy of them,
    not three; and each file still holds what was submitted."""
    weights, moments = torch.arange(4.0), torch.ones(2)
    model = {"w": weights}
    last = {"model": model, "train_state": {"optimizer": {"exp_avg": moments}}}
    written: dict[str, dict] = {}
    monkeypatch.setattr(
        train_state, "save_checkpoint", lambda state, path, *_: written.update({path.name: state})
    )
    writer = train_state.CheckpointWriter()
    files = [({"model": model}, tmp_path / "best.pt"), ({"model": model}, tmp_path / "step_3.pt")]
    writer.submit([*files, (last, tmp_path / "last.pt")], [])
    writer.wait()
    copies = [written[name]["model"]["w"] for name in ("best.pt", "step_3.pt", "last.pt")]
    assert {copy.data_ptr() for copy in copies} == {copies[0].data_ptr()} != {weights.data_ptr()}
    assert torch.equal(copies[0], weights)
    assert torch.equal(written["last.pt"]["train_state"]["optimizer"]["exp_avg"], moments)


def test_a_failed_write_is_raised_at_the_next_wait(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    writer = train_state.CheckpointWriter()
    writer.submit([({"x": torch.ones(1)}, blocker / "last.pt")], [])
    with pytest.raises(checkpoint.CheckpointError, match="could not write checkpoint"):
        writer.wait()
    writer.wait()  # raised once


def test_training_goes_on_while_checkpoints_are_written(
    toy_config, monkeypatch, scripted_validation
) -> None:
    """Each write is slowed down; a reader loads last.pt over and over meanwhile."""
    scripted_validation()
    monkeypatch.setattr(RunLog, "attention", lambda *args: None)  # no plots: a quick test
    trainer = setup(
        toy_config(max_steps=12, eval_every=3, batch_tokens=256, warmup=1, keep_checkpoints=2)
    )
    write = checkpoint.save_checkpoint
    in_flight, most_in_flight, steps_during = [0], [0], []

    def slow(state, path, *rest):
        """Write once training has moved past the checkpoint's step (the final one: at once)."""
        in_flight[0] += 1
        most_in_flight[0] = max(most_in_flight[0], in_flight[0])
        if state["step"] < 12:
            deadline = time.monotonic() + 10  # a save that blocked training would wait it out
            while trainer.progress.step == state["step"] and time.monotonic() < deadline:
                time.sleep(0.01)
            steps_during.append(trainer.progress.step - state["step"])
        write(state, path, *rest)
        in_flight[0] -= 1

    monkeypatch.setattr(train_state, "save_checkpoint", slow)
    last = Path(trainer.cfg.train.out_dir) / "checkpoints" / "last.pt"
    read_steps, done = [], threading.Event()

    def reader() -> None:
        while not done.is_set():
            if last.exists():
                read_steps.append(load_checkpoint(last)["step"])  # raises on a partial file
            time.sleep(0.02)

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        result = trainer.run()
    finally:
        done.set()
        thread.join()
    assert result.step == 12
    assert most_in_flight[0] == 1
    assert steps_during and min(steps_during) > 0, steps_during  # training went on meanwhile
    assert len(read_steps) > 1 and read_steps == sorted(read_steps)
    assert all(step % 3 == 0 for step in read_steps)
    assert load_checkpoint(last)["step"] == 12  # the final save waited
    kept = sorted(p.name for p in last.parent.glob("step_*.pt"))
    assert kept == ["step_12.pt", "step_9.pt"]
