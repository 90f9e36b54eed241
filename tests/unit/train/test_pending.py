"""Reading an update one update later (`Pending`, train/loop.py): the loop queues the next update
before it reads the last one, and trains bit for bit as a loop that reads every update at once,
a NaN/inf update in the middle of a log window included (its step, learning rate and EMA stand
still, decided on the device)."""

from __future__ import annotations

import json
from pathlib import Path
from unittest import mock

import pytest
import torch
from helpers.toy import assert_identical, load_raw, resumable_state

import attn_mt.model.loss as loss_module
from attn_mt.model.loss import projected_loss
from attn_mt.train import loop
from attn_mt.train.loop import Pending, Trainer
from attn_mt.train.schedule import learning_rate
from attn_mt.train.setup import setup


def nan_on(monkeypatch: pytest.MonkeyPatch, bad: set[int]) -> None:
    """The loss of training forward passes number `bad` (1-based) is NaN."""
    calls = []

    def loss(hidden, weight, target, epsilon, tokens=None, fused=None):
        value, nll = projected_loss(hidden, weight, target, epsilon, tokens, fused)
        if torch.is_grad_enabled():
            calls.append(1)
            if len(calls) in bad:
                value = value * float("nan")
        return value, nll

    monkeypatch.setattr(loss_module, "projected_loss", loss)


def events(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """'U' for each update launched, 'R' for each read, in order."""
    seen: list[str] = []
    update, read = Trainer.update, Pending.read

    def noted_update(self):
        seen.append("U")
        return update(self)

    def noted_read(self):
        seen.append("R")
        return read(self)

    monkeypatch.setattr(Trainer, "update", noted_update)
    monkeypatch.setattr(Pending, "read", noted_read)
    return seen


def trained(toy_config, tmp: Path, at_once: bool) -> tuple[Trainer, Path]:
    cfg = toy_config(
        max_steps=9, log_every=4, eval_every=6, warmup=3, ema_decay=0.9, max_nonfinite=3
    )
    cfg.train.out_dir = str(tmp)
    trainer = setup(cfg)
    read_at_once = (lambda *args: True) if at_once else loop.read_at_once
    with mock.patch.object(loop, "read_at_once", read_at_once):
        trainer.run()
    return trainer, tmp


@pytest.mark.parametrize("bad", [set(), {3}], ids=["finite", "nan-at-3"])
def test_reading_one_update_later_trains_as_reading_each_at_once(
    toy_config, monkeypatch, scripted_validation, tmp_path, bad
) -> None:
    runs = {}
    for at_once in (True, False):
        monkeypatch.undo()
        scripted_validation()
        nan_on(monkeypatch, bad)
        seen = events(monkeypatch)
        runs[at_once] = trained(toy_config, tmp_path / str(at_once), at_once)
        runs[at_once] += ("".join(seen),)
    (now, now_out, now_seen), (later, later_out, later_seen) = runs[True], runs[False]
    assert now_seen == "UR" * (9 + len(bad))
    # Read later: update 2 is queued before update 1 is read; steps 4 (logged), 6 (validated)
    # and 9 (the last) are read before the next is queued.
    assert later_seen.startswith("UURUR") and later_seen.count("R") == 9 + len(bad)
    assert later.progress.step == now.progress.step == 9
    assert later.progress.skipped == now.progress.skipped == len(bad)
    assert_identical(
        resumable_state(load_raw(later_out / "checkpoints" / "last.pt")),
        resumable_state(load_raw(now_out / "checkpoints" / "last.pt")),
    )

    def train_rows(out: Path) -> list[dict]:
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        timed = ("tokens_per_sec", "seconds")  # the clock's, not training's
        return [{k: v for k, v in r.items() if not k.endswith(timed)} for r in rows]

    assert train_rows(later_out) == train_rows(now_out)
    # The last update's lr is saved as a float, as a run that read it at once saves it.
    lr = load_raw(later_out / "checkpoints" / "last.pt")["train_state"]["optimizer"]
    assert lr["param_groups"][0]["lr"] == learning_rate(9, later.cfg.train)
