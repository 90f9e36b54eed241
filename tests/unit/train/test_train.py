"""The training loop: the loss and schedule formulas, teacher forcing, learning the toy task,
exact resume, the run folder's logs, atomic checkpoints, and every way a run can stop.

Runs are tiny (a few updates of a 1-layer model on the toy task) so the file stays fast; the
one long run is the session fixture `trained_run`, shared with other test files.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shlex
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from helpers.toy import assert_identical, load_raw, make_config, resumable_state, run

import attn_mt
import attn_mt.model.loss as loss_module
import attn_mt.train.setup as training_setup
import attn_mt.train.state as state_module
import attn_mt.train.stopping as stopping_module
import attn_mt.train.validate as validate_module
from attn_mt import distributed
from attn_mt.checkpoint import FORMAT, load_checkpoint, model_from, save_checkpoint
from attn_mt.config.file import config_from_dict
from attn_mt.config.schema import Config
from attn_mt.data.corpora import split_files
from attn_mt.data.text import read_parallel
from attn_mt.errors import UserError
from attn_mt.model.loss import projected_loss
from attn_mt.scores import score
from attn_mt.train.loop import Trainer
from attn_mt.train.runlog import Validation
from attn_mt.train.setup import setup, starting_point
from attn_mt.train.skips import TrainingDiverged
from attn_mt.train.validate import Validator

REAL_TORCH_SAVE = torch.save

# A run where exact resume is hard: dropout (so the RNG matters), accumulation over batches
# that cross an epoch boundary (9 batches per epoch at 6000 tokens), validation in between.
RESUME_MODEL = {"dropout": 0.1, "attention_dropout": 0.1}
RESUME_TRAIN = {
    "max_steps": 6,
    "accumulate": 2,
    "batch_tokens": 6000,
    "eval_every": 3,
    "log_every": 2,
    "warmup": 4,
}


def resume_config(toy_data: dict[str, Path], out: Path, precision: str, **train) -> Config:
    """The RESUME run in `precision`: fp32, bf16, or bf16-stream (bf16 with train.bf16_stream)."""
    stream = precision == "bf16-stream"
    train = {"precision": "bf16" if stream else precision, "bf16_stream": stream, **train}
    return make_config(toy_data, out, RESUME_MODEL, **{**RESUME_TRAIN, **train})


def metrics_lines(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def straight_states(toy_data: dict[str, Path], tmp_path_factory: pytest.TempPathFactory):
    """resumable_state of the uninterrupted RESUME run, per precision (computed once)."""
    cache: dict[str, dict[str, Any]] = {}

    def get(precision: str) -> dict[str, Any]:
        if precision not in cache:
            out = tmp_path_factory.mktemp(f"straight-{precision}") / "run"
            result = run(resume_config(toy_data, out, precision))
            assert (result.step, result.stopped_by) == (6, "max_steps")
            cache[precision] = resumable_state(load_raw(out / "checkpoints" / "last.pt"))
        return cache[precision]

    return get


def signal_after_update(monkeypatch: pytest.MonkeyPatch, update: int, signum: int) -> None:
    """Send `signum` to this process right after update number `update` (a real signal)."""
    original = Trainer.update
    calls = []

    def update_then_signal(self: Trainer):
        result = original(self)
        calls.append(1)
        if len(calls) == update:
            os.kill(os.getpid(), signum)
        return result

    monkeypatch.setattr(Trainer, "update", update_then_signal)


# ---------------------------------------------------------------------------------------------
# Learning the toy task, and what the run folder holds


def test_trained_model_translates_held_out_sentences(trained_run: Path) -> None:
    valid = [m for m in metrics_lines(trained_run) if m["split"] == "valid"]
    assert valid[-1]["bleu"] > 80 and valid[-1]["chrf"] > 80
    translator = attn_mt.load(trained_run, device="cpu")
    sources, references = read_parallel(*split_files(translator.config.data, "test"))
    scores = score(translator.translate(sources), references)
    assert scores.bleu > 80, f"test BLEU {scores.bleu:.1f}"


def test_tensorboard_and_metrics_hold_the_same_figures(trained_run: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(trained_run / "tb"), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    lines = metrics_lines(trained_run)
    train_keys = {"loss", "ppl", "lr", "grad_norm", "tokens_per_sec"}
    valid_keys = {"loss", "ppl", "bleu", "chrf"}
    for split, keys in (("train", train_keys), ("valid", valid_keys)):
        rows = [m for m in lines if m["split"] == split]
        assert rows and all(keys <= m.keys() for m in rows)
        assert [m["step"] for m in rows] == sorted({m["step"] for m in rows})
        for key in keys:
            tag = f"{split}/{key}"
            assert tag in events.Tags()["scalars"]
            curve = {e.step: e.value for e in events.Scalars(tag)}
            assert curve == pytest.approx({m["step"]: m[key] for m in rows}, rel=1e-5), tag
    assert [m["step"] for m in lines if m["split"] == "valid"] == [200, 400]

    assert "valid/samples/text_summary" in events.Tags()["tensors"]
    sample = events.Tensors("valid/samples/text_summary")[-1].tensor_proto.string_val[0].decode()
    assert all(part in sample for part in ("src: ", "hyp: ", "ref: "))


def test_config_yaml_is_the_resolved_config(trained_run: Path) -> None:
    written = yaml.safe_load((trained_run / "config.yaml").read_text())
    assert config_from_dict(written).to_dict() == written  # every default filled in
    assert written.keys() == Config().to_dict().keys()
    assert written["train"].keys() == Config().to_dict()["train"].keys()
    assert written == load_checkpoint(trained_run / "checkpoints" / "best.pt")["config"]
    assert Path(written["train"]["out_dir"]) == trained_run


def test_train_log_has_parameters_device_precision_and_data(trained_run: Path) -> None:
    text = (trained_run / "train.log").read_text()
    model, _ = model_from(load_checkpoint(trained_run / "checkpoints" / "best.pt"))
    params = sum(p.numel() for p in model.parameters())  # parameters() yields tied ones once
    assert f"{params:,} parameters" in text
    assert "device cpu" in text or "device cuda" in text
    assert "precision fp32" in text
    assert "3000 training pairs kept" in text and "100 validation pairs" in text
    assert "valid step 400" in text and "BLEU" in text


def test_finished_run_has_best_last_and_kept_checkpoints(trained_run: Path) -> None:
    names = sorted(p.name for p in (trained_run / "checkpoints").glob("*.pt"))
    assert names == ["best.pt", "last.pt", "step_200.pt", "step_400.pt"]
    last = load_raw(trained_run / "checkpoints" / "last.pt")
    assert last["step"] == 400 and last["format"] == FORMAT and "train_state" in last
    best = load_raw(trained_run / "checkpoints" / "best.pt")
    assert "train_state" not in best  # only last.pt carries the resume state


# ---------------------------------------------------------------------------------------------
# Exact resume


@pytest.mark.parametrize("precision", ["fp32", "bf16", "bf16-stream"])
def test_half_then_resume_equals_straight_run(
    precision: str, toy_data: dict[str, Path], tmp_path: Path, straight_states
) -> None:
    out = tmp_path / "run"
    first = run(resume_config(toy_data, out, precision, max_steps=3))
    assert (first.step, first.stopped_by) == (3, "max_steps")
    assert (out / "checkpoints" / "best.pt").is_file()
    second = run(resume_config(toy_data, out, precision), resume=True)  # max_steps 3 -> 6
    assert (second.step, second.stopped_by) == (6, "max_steps")
    resumed = resumable_state(load_raw(out / "checkpoints" / "last.pt"))
    assert resumed["data"]["epoch"] == 1  # the run crossed an epoch boundary
    assert_identical(resumed, straight_states(precision))
    stream = precision == "bf16-stream"
    assert ("precision bf16, bf16 residual stream" in (out / "train.log").read_text()) == stream
    if stream:  # the trainer's model runs it: its weights part from plain bf16's
        with pytest.raises(AssertionError, match="differs"):
            assert_identical(resumed["model"], straight_states("bf16")["model"])
    lines = [(m["step"], m["split"]) for m in metrics_lines(out)]
    # the first run's last update is logged after its loop, though 3 is no multiple of log_every
    assert lines == [
        (2, "train"), (3, "valid"), (3, "train"), (4, "train"), (6, "train"), (6, "valid"),
    ]  # fmt: skip


def test_validation_does_not_change_training(
    toy_data: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, straight_states
) -> None:
    """Validating after every update (with dropout on) leaves the training bits unchanged,
    even a validation that draws random numbers (as sampling or dropout would)."""
    original = Validator.validate

    def validate_drawing_random_numbers(self: Validator) -> Validation:
        torch.rand(1000)
        return original(self)

    monkeypatch.setattr(Validator, "validate", validate_drawing_random_numbers)
    out = tmp_path / "run"
    run(resume_config(toy_data, out, "fp32", eval_every=1))
    assert [m["step"] for m in metrics_lines(out) if m["split"] == "valid"] == [1, 2, 3, 4, 5, 6]
    assert_identical(
        resumable_state(load_raw(out / "checkpoints" / "last.pt")), straight_states("fp32")
    )


def test_loss_checks_between_validations_give_a_validations_loss_and_change_nothing(
    toy_data: dict[str, Path], tmp_path: Path, straight_states
) -> None:
    """train.valid_loss_every: between validations (eval_every 3), the validation loss alone,
    as a validation at that step has it, on TensorBoard's valid/ curves beside them; no
    checkpoint selected or saved for it, and the training bits unchanged."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out, every = tmp_path / "run", tmp_path / "every"
    # Not logged at 2 and 4: their updates are read before the next is queued all the same.
    began = time.monotonic()
    run(resume_config(toy_data, out, "fp32", valid_loss_every=2, log_every=5, keep_checkpoints=5))
    wall = time.monotonic() - began
    lines = [m for m in metrics_lines(out) if m["split"] != "train"]
    assert [(m["step"], m["split"]) for m in lines] == [
        (2, "valid_loss"), (3, "valid"), (4, "valid_loss"), (6, "valid"),
    ]  # fmt: skip
    assert_identical(
        resumable_state(load_raw(out / "checkpoints" / "last.pt")), straight_states("fp32")
    )
    kept = sorted(p.name for p in (out / "checkpoints").glob("step_*.pt"))
    assert kept == ["step_3.pt", "step_6.pt"]
    run(resume_config(toy_data, every, "fp32", eval_every=1))  # a validation at every step
    validations = {m["step"]: m for m in metrics_lines(every) if m["split"] == "valid"}
    for m in lines:
        validation = validations[m["step"]]
        assert (m["loss"], m["ppl"]) == (validation["loss"], validation["ppl"])
    loss_only = [m.keys() for m in lines if m["split"] == "valid_loss"]
    assert loss_only == [{"step", "split", "loss", "ppl"}] * 2
    log = (out / "train.log").read_text()
    assert (
        f"valid step 4: loss {lines[2]['loss']:.3f}  ppl {lines[2]['ppl']:.2f}  (loss only)" in log
    )
    # The closing line's timesheet: the process's time, each part once, in shares that add up.
    sheet = re.search(r"time in this process ([\d.]+) s: (.*)", log)
    assert sheet, log[-2000:]
    parts = re.findall(r"([a-z -]+) ([\d.]+) s \(([\d.]+)%\)", sheet[2])
    names = ["start-up", "updates", "checkpoints", "loss only", "validation"]
    assert [name.strip(", ") for name, _, _ in parts] == names
    shares = [float(share) for _, _, share in parts]
    assert sum(shares) == pytest.approx(100, abs=0.3) and min(shares) > 0
    seconds = sum(float(part) for _, part, _ in parts)  # each rounded to 0.1 s
    assert seconds == pytest.approx(float(sheet[1]), abs=0.05 * len(parts))
    assert wall - 0.5 < float(sheet[1]) <= wall + 0.05  # the Trainer's life, less its return
    events = EventAccumulator(str(out / "tb"), size_guidance={"scalars": 0})
    events.Reload()
    assert [e.step for e in events.Scalars("valid/loss")] == [2, 3, 4, 6]
    assert [e.step for e in events.Scalars("valid/bleu")] == [3, 6]


def test_resume_depends_on_the_restored_rng(
    toy_data: dict[str, Path], tmp_path: Path, straight_states
) -> None:
    """Control: with another RNG state in last.pt the resumed run differs (dropout draws)."""
    out = tmp_path / "run"
    run(resume_config(toy_data, out, "fp32", max_steps=3))
    last = out / "checkpoints" / "last.pt"
    state = load_raw(last)
    state["train_state"]["rng"] = [(torch.Generator().manual_seed(12345).get_state(), None)]
    save_checkpoint(state, last)
    run(resume_config(toy_data, out, "fp32"), resume=True)
    resumed = load_raw(last)["model"]
    reference = straight_states("fp32")["model"]
    assert any(not torch.equal(resumed[k], reference[k]) for k in reference)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_writes_last_and_resume_finishes_the_same(
    signum: int,
    toy_data: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    straight_states,
) -> None:
    out = tmp_path / "run"
    before = signal.getsignal(signum)
    with monkeypatch.context() as patch:
        signal_after_update(patch, 2, signum)
        stopped = run(resume_config(toy_data, out, "fp32"))
    assert (stopped.step, stopped.stopped_by) == (2, "signal")
    assert signal.getsignal(signum) is before  # the trainer put the old handler back
    last = load_raw(out / "checkpoints" / "last.pt")
    assert last["step"] == 2 and "train_state" in last
    finished = run(resume_config(toy_data, out, "fp32"), resume=True)
    assert (finished.step, finished.stopped_by) == (6, "max_steps")
    assert_identical(
        resumable_state(load_raw(out / "checkpoints" / "last.pt")), straight_states("fp32")
    )


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_second_signal_stops_at_once_abandoning_the_save(
    signum: int,
    toy_data: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The first signal says at once that it stops and saves; a second, landing while last.pt
    is being written, stops there: the write's temp file goes, last.pt stays the one saved at
    step 3 (whole), and the handlers are put back."""
    caplog.set_level(logging.INFO, logger="attn_mt")
    out = tmp_path / "run"
    before = signal.getsignal(signum)
    first = []

    def save_then_signal(obj: Any, handle: Any, *args: Any, **kwargs: Any) -> None:
        REAL_TORCH_SAVE(obj, handle, *args, **kwargs)  # written, not yet renamed into place
        if first:  # on the writer's thread: the handler runs on the main thread meanwhile
            os.kill(os.getpid(), signum)
            deadline = time.monotonic() + 30
            while not any("again: stopping at once" in r.getMessage() for r in caplog.records):
                assert time.monotonic() < deadline, "the second signal was not handled"
                time.sleep(0.01)

    with monkeypatch.context() as patch:
        patch.setattr(stopping_module, "REPEAT_SECONDS", 0.0)  # no time passes here between them
        signal_after_update(patch, 4, signum)  # after step 3's validation and save
        patch.setattr(torch, "save", save_then_signal)
        patch.setattr(Validator, "finish", lambda self, *a: first.append(1) or finish(self, *a))
        with pytest.raises(KeyboardInterrupt if signum == signal.SIGINT else SystemExit) as err:
            run(resume_config(toy_data, out, "fp32"))
    if signum == signal.SIGTERM:
        assert err.value.code == 143
    again = "Ctrl-C" if signum == signal.SIGINT else signum.name
    said = [r.getMessage() for r in caplog.records]
    assert f"{signum.name}: stopping: saving last.pt ... ({again} again to stop at once)" in said
    assert f"{again} again: stopping at once; last.pt stays the last one completed" in said
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["best.pt", "last.pt"]
    assert load_checkpoint(out / "checkpoints" / "last.pt")["step"] == 3
    assert signal.getsignal(signum) is before


finish = Validator.finish


def test_a_signal_delivered_twice_at_once_still_saves(
    toy_data: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C under torchrun reaches a worker twice within milliseconds (from the terminal,
    then torchrun's copy): that is one stop, which saves last.pt, not a stop at once."""
    out = tmp_path / "run"
    original = Trainer.update
    calls = []

    def update_then_two_signals(self: Trainer):
        result = original(self)
        calls.append(1)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)
        return result

    monkeypatch.setattr(Trainer, "update", update_then_two_signals)
    stopped = run(resume_config(toy_data, out, "fp32"))
    assert (stopped.step, stopped.stopped_by) == (2, "signal")
    assert load_raw(out / "checkpoints" / "last.pt")["step"] == 2


def printed_command(log_text: str, phrase: str) -> list[str]:
    """The `attn-mt ...` command that train.log's line with `phrase` tells the user to run."""
    line = next(line for line in log_text.splitlines() if phrase in line)
    return shlex.split(line.split("`")[1])


def test_the_run_is_named_and_its_printed_command_continues_it(
    toy_data: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    straight_states,
) -> None:
    """The start names the run folder; a stop prints the one command that continues the run
    (whatever config started it), and that command, run as printed, ends where a straight run
    does; a finished run prints how to train it further."""
    from typer.testing import CliRunner

    from attn_mt.cli import app

    caplog.set_level(logging.INFO, logger="attn_mt")  # as the command line logs
    out = tmp_path / "run"
    with monkeypatch.context() as patch:
        signal_after_update(patch, 2, signal.SIGTERM)
        run(resume_config(toy_data, out, "fp32"))
    assert f"run folder: {out} (a new run)" in caplog.text  # said before the data's work
    log_text = (out / "train.log").read_text()
    command = printed_command(log_text, "continue it with")
    assert command == ["attn-mt", "train", "--resume", str(out)]
    monkeypatch.chdir(tmp_path / "..")  # the command does not depend on where it is typed
    result = CliRunner().invoke(app, [*command[1:], "--device", "cpu"])
    assert result.exit_code == 0, result.output
    assert_identical(
        resumable_state(load_raw(out / "checkpoints" / "last.pt")), straight_states("fp32")
    )
    assert f"run folder: {out} (resumed)" in caplog.text
    log_text = (out / "train.log").read_text()
    further = printed_command(log_text, "train it further with")
    assert further == ["attn-mt", "train", "--resume", str(out), "--set", "train.max_steps=N"]


# ---------------------------------------------------------------------------------------------
# The run folder: refusing to overwrite, resume errors


def test_refuses_to_overwrite_a_run(toy_config, scripted_validation) -> None:
    scripted_validation()
    cfg = toy_config(max_steps=2)
    run(cfg)
    out = Path(cfg.train.out_dir)
    last = out / "checkpoints" / "last.pt"
    before = last.read_bytes()
    with pytest.raises(UserError) as err:
        setup(cfg)
    message = str(err.value)
    assert str(out) in message and "--resume" in message and "train.out_dir" in message
    assert last.read_bytes() == before


def test_empty_existing_out_dir_is_fine(toy_config, scripted_validation) -> None:
    scripted_validation()
    cfg = toy_config(max_steps=1)
    Path(cfg.train.out_dir).mkdir(parents=True)
    assert run(cfg).step == 1


def test_resume_with_nothing_to_resume(toy_config) -> None:
    cfg = toy_config()
    with pytest.raises(UserError, match="nothing to resume") as err:
        setup(cfg, resume=True)
    assert "without --resume" in str(err.value)
    assert not Path(cfg.train.out_dir).exists()  # a failed start leaves nothing behind


def test_run_that_died_before_its_first_checkpoint(toy_config) -> None:
    """A folder with a config but no last.pt can be neither resumed nor overwritten: say so."""
    cfg = toy_config()
    out = Path(cfg.train.out_dir)
    (out / "checkpoints").mkdir(parents=True)
    (out / "config.yaml").write_text("{}\n")
    for resume in (False, True):
        with pytest.raises(UserError) as err:
            setup(cfg, resume=resume)
        message = str(err.value)
        assert "before its first checkpoint" in message and "train.out_dir" in message
        assert "continue it with" not in message and "start without --resume" not in message


def test_resume_with_a_changed_model_names_the_keys(
    toy_data: dict[str, Path], tmp_path: Path, scripted_validation
) -> None:
    scripted_validation()
    out = tmp_path / "run"
    run(make_config(toy_data, out, max_steps=1))
    changed = make_config(toy_data, out, {"d_model": 32, "d_ff": 64}, max_steps=2)
    with pytest.raises(UserError) as err:
        setup(changed, resume=True)
    message = str(err.value)
    assert "model.d_model" in message and "model.d_ff" in message
    assert "model.heads" not in message


# ---------------------------------------------------------------------------------------------
# Non-finite losses


def nan_on_updates(monkeypatch: pytest.MonkeyPatch, bad: set[int] | None, from_: int = 0):
    """Make the training loss NaN on the given update numbers (1-based), or on all >= from_."""
    calls = []

    def loss(hidden, weight, target, epsilon, tokens=None, fused=None):
        result = projected_loss(hidden, weight, target, epsilon, tokens, fused)
        if not torch.is_grad_enabled():  # validation
            return result
        calls.append(1)
        n = len(calls)
        if (bad is not None and n in bad) or (bad is None and n >= from_):
            return tuple(x * float("nan") for x in result)
        return result

    monkeypatch.setattr(loss_module, "projected_loss", loss)


def record_updates(monkeypatch: pytest.MonkeyPatch) -> list[tuple[bool, bool]]:
    """Per update attempt: (finite, parameters and optimizer state unchanged)."""
    original = Trainer.update
    records = []

    def update(self: Trainer):
        params = [p.detach().clone() for p in self.model.parameters()]
        adam_steps = [float(s["step"]) for s in self.optimizer.state.values()]
        result = original(self)
        unchanged = all(
            torch.equal(a, b) for a, b in zip(params, self.model.parameters(), strict=True)
        )
        unchanged &= adam_steps == [float(s["step"]) for s in self.optimizer.state.values()]
        records.append((result.finite, unchanged))
        return result

    monkeypatch.setattr(Trainer, "update", update)
    return records


def test_nan_loss_skips_the_update(
    toy_config, monkeypatch: pytest.MonkeyPatch, scripted_validation
) -> None:
    scripted_validation()
    nan_on_updates(monkeypatch, {2})
    records = record_updates(monkeypatch)
    cfg = toy_config(max_steps=4)
    result = run(cfg)
    assert result.step == 4 and result.stopped_by == "max_steps"
    assert records == [(True, False), (False, True), (True, False), (True, False), (True, False)]
    log_text = (Path(cfg.train.out_dir) / "train.log").read_text()
    assert "step 2: non-finite loss or gradient; update skipped (1 in a row)" in log_text
    adam = load_raw(Path(cfg.train.out_dir) / "checkpoints" / "last.pt")["train_state"]
    assert {int(s["step"]) for s in adam["optimizer"]["state"].values()} == {4}


def test_repeated_nan_loss_stops_with_a_clear_error(
    toy_config, monkeypatch: pytest.MonkeyPatch, scripted_validation
) -> None:
    scripted_validation()
    nan_on_updates(monkeypatch, None, from_=5)
    cfg = toy_config(max_steps=20, eval_every=2, max_nonfinite=3)
    trainer = setup(cfg)
    with pytest.raises(TrainingDiverged) as err:
        trainer.run()
    assert isinstance(err.value, UserError)
    message = str(err.value)
    assert "NaN/inf for 3 updates in a row" in message and "train.lr" in message
    last = Path(cfg.train.out_dir) / "checkpoints" / "last.pt"
    assert str(last) in message
    state = load_raw(last)
    assert state["step"] == 4  # the last good update; nothing written after the NaNs
    assert all(torch.isfinite(t).all() for t in state["model"].values())
    assert_identical(state["model"], trainer.model.state_dict())  # skipped updates changed nothing


def test_nan_before_any_checkpoint_says_none_was_written(
    toy_config, monkeypatch: pytest.MonkeyPatch, scripted_validation
) -> None:
    scripted_validation()
    nan_on_updates(monkeypatch, None, from_=1)
    cfg = toy_config(max_steps=20, max_nonfinite=2)
    with pytest.raises(TrainingDiverged, match="no checkpoint"):
        run(cfg)


# ---------------------------------------------------------------------------------------------
# Stopping rules; every stop leaves a loadable last.pt (and best.pt unless interrupted)


LOSS_ALONE = {"valid_loss_every": 1}  # where the end is not known before its update is read


@pytest.mark.parametrize(
    ("reason", "train", "bleus", "steps"),
    [
        ("max_steps", {"max_steps": 3}, (), 3),
        (
            "max_epochs",
            {"max_steps": 0, "max_epochs": 1, "batch_tokens": 6000, **LOSS_ALONE},
            (),
            9,
        ),
        ("early stopping", {"max_steps": 50, "eval_every": 1, "patience": 2}, (10, 20, 15, 15), 4),
        ("max_minutes", {"max_steps": 0, "max_minutes": 1e-6, **LOSS_ALONE}, (), None),
        ("signal", {"max_steps": 50}, (), 2),
    ],
    ids=["max_steps", "max_epochs", "early_stopping", "max_minutes", "signal"],
)
def test_every_stop_writes_a_loadable_last_checkpoint(
    reason: str,
    train: dict,
    bleus: tuple,
    steps: int | None,
    toy_config,
    monkeypatch: pytest.MonkeyPatch,
    scripted_validation,
) -> None:
    scripted_validation(bleus)
    if reason == "signal":
        signal_after_update(monkeypatch, 2, signal.SIGTERM)
    cfg = toy_config(**train)
    result = run(cfg)
    assert result.stopped_by == reason
    if steps is not None:
        assert result.step == steps
    folder = Path(cfg.train.out_dir) / "checkpoints"
    last = load_raw(folder / "last.pt")
    assert last["step"] == result.step and "train_state" in last
    if reason == "signal":
        assert not (folder / "best.pt").exists()  # interrupted before any validation
        return
    best = load_raw(folder / "best.pt")
    assert best["format"] == FORMAT and best["metrics"]["bleu"] == max(bleus, default=0.0)
    lines = metrics_lines(Path(cfg.train.out_dir))
    checks = [(m["step"], m["split"]) for m in lines if m["split"] != "train"]
    # The last step is validated, its loss included: no check of the loss alone before that.
    assert checks[-1] == (result.step, "valid") and (result.step, "valid_loss") not in checks
    if "valid_loss_every" in train:
        assert [(step, "valid_loss") for step in range(1, result.step)] == checks[:-1]
    if reason == "early stopping":
        assert best["step"] == 2 and last["train_state"]["progress"]["bad_evals"] == 2


def test_keep_checkpoints_keeps_the_last_n_across_resume(toy_config, scripted_validation) -> None:
    scripted_validation()
    cfg = toy_config(max_steps=5, eval_every=1, keep_checkpoints=2)
    run(cfg)
    folder = Path(cfg.train.out_dir) / "checkpoints"
    assert sorted(p.name for p in folder.iterdir()) == [
        "best.pt",
        "last.pt",
        "step_4.pt",
        "step_5.pt",
    ]
    assert load_raw(folder / "step_5.pt")["step"] == 5
    run(toy_config(max_steps=7, eval_every=1, keep_checkpoints=2), resume=True)
    assert sorted(p.name for p in folder.iterdir()) == [
        "best.pt",
        "last.pt",
        "step_6.pt",
        "step_7.pt",
    ]


# ---------------------------------------------------------------------------------------------
# The best checkpoint follows train.select_metric; a Trainer holds nothing until it runs


@pytest.mark.parametrize(
    ("metric", "best_step", "best_score"),
    [("bleu", 2, 30.0), ("chrf", 3, 50.0), ("loss", 1, 1.0)],
)
def test_best_checkpoint_follows_select_metric(
    metric: str, best_step: int, best_score: float, toy_config, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Validations at steps 1, 2, 3 score (bleu, chrf, loss): each metric picks its own best,
    higher BLEU/chrF or lower loss; early stopping counts by the same metric."""
    figures = iter([(10.0, 20.0, 1.0), (30.0, 40.0, 2.0), (20.0, 50.0, 3.0)])

    def validate(self: Validator) -> Validation:
        bleu, chrf, loss = next(figures)
        return Validation({"loss": loss, "ppl": math.e, "bleu": bleu, "chrf": chrf}, [])

    monkeypatch.setattr(Validator, "validate", validate)
    cfg = toy_config(max_steps=3, eval_every=1, select_metric=metric, patience=2)
    result = run(cfg)
    assert (result.best_score, result.select_metric) == (best_score, metric)
    checkpoints = Path(cfg.train.out_dir) / "checkpoints"
    assert load_raw(checkpoints / "best.pt")["step"] == best_step
    stopped_early = metric == "loss"  # two validations without a lower loss
    assert result.stopped_by == ("early stopping" if stopped_early else "max_steps")
    log_text = (Path(cfg.train.out_dir) / "train.log").read_text()
    assert f"best valid {metric} {best_score:.2f}" in log_text


def test_a_trainer_built_but_not_run_holds_nothing(toy_config) -> None:
    """No log handler, signal handler or open writer outlives a Trainer that never ran."""
    logger = logging.getLogger("attn_mt")
    handlers, sigterm = list(logger.handlers), signal.getsignal(signal.SIGTERM)
    cfg = toy_config(max_steps=1)
    setup(cfg)
    assert logger.handlers == handlers and signal.getsignal(signal.SIGTERM) is sigterm
    out = Path(cfg.train.out_dir)
    assert sorted(p.name for p in out.iterdir()) == ["casing.json", "checkpoints", "config.yaml"]


def test_a_signal_during_validation_abandons_it_and_writes_last_once(
    toy_config, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torchrun kills its workers 30 s after passing on a SIGTERM: the run must not first
    finish a long validation, nor write last.pt twice."""

    def validate(translator, corpus, t, on_progress, world, allowance=None):
        os.kill(os.getpid(), signal.SIGTERM)
        on_progress("loss", 1, 2)
        raise AssertionError("validation went on after the signal")

    monkeypatch.setattr(validate_module, "validate", validate)
    written = []
    real_save = state_module.save_checkpoint
    monkeypatch.setattr(
        state_module,
        "save_checkpoint",
        lambda state, path, *rest: (written.append(Path(path).name), real_save(state, path, *rest)),
    )
    cfg = toy_config(max_steps=10, eval_every=2)
    result = run(cfg)
    assert (result.stopped_by, result.step) == ("signal", 2)
    assert written == ["last.pt"]
    out = Path(cfg.train.out_dir)
    assert "SIGTERM: validation at step 2 abandoned" in (out / "train.log").read_text()
    assert load_raw(out / "checkpoints" / "last.pt")["step"] == 2


def test_other_ranks_read_the_checkpoint_rank_0_checked(
    toy_config, scripted_validation, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 0 sends a path, not the pickled checkpoint; the other ranks read the file (or,
    when one cannot see it, get it from rank 0)."""
    scripted_validation()
    cfg = toy_config(max_steps=1)
    run(cfg)
    last = Path(cfg.train.out_dir) / "checkpoints" / "last.pt"
    sent = []

    def from_main(compute, world):  # rank 0's side: what the broadcast would carry
        sent.append(compute())
        return sent[-1]

    monkeypatch.setattr(distributed, "from_main", from_main)
    assert starting_point(cfg, True, distributed.World())[1]["step"] == 1
    assert sent == [str(last)]
    # Rank 1 of 2, which sees the file.
    rank1, saved = distributed.World(rank=1, size=2), load_raw(last)
    monkeypatch.setattr(distributed, "gather", lambda value, world: [True, value])
    monkeypatch.setattr(distributed, "from_main", lambda compute, world: str(last))
    assert_identical(starting_point(cfg, True, rank1)[1]["model"], saved["model"])
    # Without a shared disk rank 0 sends the contents.
    last.rename(last.with_suffix(".away"))
    sent = [str(last), saved]
    monkeypatch.setattr(distributed, "from_main", lambda compute, world: sent.pop(0))
    assert starting_point(cfg, True, rank1)[1] is saved and not sent


def test_the_library_train_refuses_a_folder_holding_a_run_while_it_holds_the_lock(
    toy_data, tmp_path: Path
) -> None:
    """`train()` takes the folder's lock first and then checks it: its own lock must not
    pass for another run's (the CLI's early check skips a folder another process holds)."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.yaml").write_text("data: {}\n")
    cfg = make_config(toy_data, out, max_steps=1)
    with pytest.raises(UserError, match="holds a config.yaml and nothing else of a run"):
        training_setup.train(cfg, device="cpu")
    with pytest.raises(UserError, match="nothing to resume"):
        training_setup.train(make_config(toy_data, tmp_path / "new", max_steps=1), resume=True)
    assert (out / "config.yaml").read_text() == "data: {}\n"
