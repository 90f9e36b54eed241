"""Skipped updates under fp16's loss scaling, run on the CPU through `torch.amp.GradScaler("cpu")`
with an injected infinite gradient: a skipped update moves no step, learning rate or EMA, the
scale shrinks, it resumes with the run, and a scale below MIN_LOSS_SCALE ends the run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers.toy import load_raw, run

import attn_mt.model.loss as loss_module
import attn_mt.train.setup as training_setup
from attn_mt.model.loss import projected_loss
from attn_mt.train.loop import Trainer
from attn_mt.train.schedule import learning_rate
from attn_mt.train.setup import setup
from attn_mt.train.skips import SkipRule, TrainingDiverged, Update


class _InfiniteGradient(torch.autograd.Function):
    """The identity, whose gradient is infinite: an fp16 gradient that overflowed."""

    @staticmethod
    def forward(ctx, loss: torch.Tensor) -> torch.Tensor:
        return loss.clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad * float("inf")


def overflow_on(monkeypatch: pytest.MonkeyPatch, bad: set[int] | None, init_scale: float) -> None:
    """A CPU GradScaler starting at `init_scale`; the gradients of training updates `bad`
    (1-based attempts; None: all) are infinite while the loss stays finite."""
    monkeypatch.setattr(
        training_setup,  # the training state is built there
        "make_scaler",
        lambda precision, device: torch.amp.GradScaler("cpu", init_scale=init_scale),
    )
    calls = []

    def loss(hidden, weight, target, epsilon, tokens=None, fused=None):
        value, nll = projected_loss(hidden, weight, target, epsilon, tokens, fused)
        if torch.is_grad_enabled():
            calls.append(1)
            if bad is None or len(calls) in bad:
                value = _InfiniteGradient.apply(value)
        return value, nll

    monkeypatch.setattr(loss_module, "projected_loss", loss)


def record_attempts(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """Per update attempt, as it starts: its learning rate, the weights and the EMA."""
    original = Trainer.update
    attempts = []

    def update(self: Trainer):
        attempts.append(snapshot(self))
        return original(self)

    monkeypatch.setattr(Trainer, "update", update)
    return attempts


def snapshot(trainer: Trainer) -> dict:
    return {
        "lr": trainer.optimizer.param_groups[0]["lr"],
        "weights": [p.detach().clone() for p in trainer.model.parameters()],
        "ema": [p.clone() for p in trainer.ema.model.parameters()],
    }


def changed(before: dict, after: dict, key: str) -> bool:
    return not all(torch.equal(a, b) for a, b in zip(before[key], after[key], strict=True))


def test_overflowed_updates_move_no_step_schedule_or_ema_and_the_scale_resumes(
    toy_config, monkeypatch: pytest.MonkeyPatch, scripted_validation
) -> None:
    scripted_validation()
    overflow_on(monkeypatch, {2, 3}, init_scale=16.0)
    attempts = record_attempts(monkeypatch)
    cfg = toy_config(max_steps=4, warmup=10, ema_decay=0.5, log_every=1, max_nonfinite=1)
    trainer = setup(cfg)
    result = trainer.run()
    assert (result.step, result.stopped_by) == (4, "max_steps")
    # The two overflowed attempts repeat step 2 with its learning rate (warm-up stands still).
    steps_tried = [1, 2, 2, 2, 3, 4]
    assert [a["lr"] for a in attempts] == [learning_rate(s, cfg.train) for s in steps_tried]
    after = [*attempts[1:], snapshot(trainer)]
    applied = [True, False, False, True, True, True]
    assert [changed(a, b, "weights") for a, b in zip(attempts, after, strict=True)] == applied
    assert [changed(a, b, "ema") for a, b in zip(attempts, after, strict=True)] == applied
    out = Path(cfg.train.out_dir)
    logged = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in logged if m["split"] == "train"] == [1, 2, 3, 4]
    assert all(m["grad_norm"] < float("inf") for m in logged if m["split"] == "train")
    assert (
        "fp16 gradients overflowed; update skipped, loss scale 8" in (out / "train.log").read_text()
    )
    state = load_raw(out / "checkpoints" / "last.pt")["train_state"]
    assert state["progress"]["skipped"] == 2
    assert state["scaler"]["scale"] == 4.0  # halved twice
    adam = {int(s["step"]) for s in state["optimizer"]["state"].values()}
    assert adam == {4}
    # The scale comes back with the run.
    resumed = setup(toy_config(max_steps=5, warmup=10, ema_decay=0.5), resume=True)
    assert resumed.scaler.get_scale() == 4.0 and resumed.progress.skipped == 2


def test_a_loss_scale_below_the_minimum_ends_the_run_in_one_line(
    toy_config, monkeypatch: pytest.MonkeyPatch, scripted_validation
) -> None:
    scripted_validation()
    overflow_on(monkeypatch, None, init_scale=3e-4)  # 1.5e-4, then 7.5e-5 < MIN_LOSS_SCALE
    cfg = toy_config(max_steps=20, max_nonfinite=1)  # overflows do not count as NaN losses
    with pytest.raises(TrainingDiverged) as err:
        run(cfg)
    message = str(err.value)
    assert "\n" not in message
    assert "overflowed for 2 updates in a row" in message and "7.5e-05" in message
    assert "at step 1;" in message and "bf16" in message and "no checkpoint" in message


def test_the_error_waits_for_a_checkpoint_still_being_written(tmp_path: Path):
    """A save just before the divergence may still be landing in the background: the rule
    waits for it (`settle`, the checkpoint writer's wait) before it says whether last.pt is
    kept, so the line names the checkpoint that is there once the run has ended."""
    last = tmp_path / "last.pt"
    rule = SkipRule(2, None, last, settle=lambda: last.write_bytes(b"written"))
    nan = float("nan")
    bad = Update(loss=nan, nll=nan, tokens=10, grad_norm=nan, finite=False)
    assert not rule.accept(bad, 2) and not last.exists()  # one skip: nothing waited for
    with pytest.raises(TrainingDiverged, match=f"the last good checkpoint is kept: {last}"):
        rule.accept(bad, 2)
