"""The training loop: the loss and schedule formulas, teacher forcing, learning the toy task,
exact resume, the run folder's logs, atomic checkpoints, and every way a run can stop.

Runs are tiny (a few updates of a 1-layer model on the toy task) so the file stays fast; the
one long run is the session fixture `trained_run`, shared with other test files.
"""

from __future__ import annotations

import errno
import io
import json
import math
import os
import signal
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
import yaml
from conftest import toy_config_dict

import attn_mt
import attn_mt.train as train_module
from attn_mt.checkpoint import FORMAT, load_checkpoint, model_from, save_checkpoint
from attn_mt.config import Config, TrainConfig, config_from_dict
from attn_mt.data import collate, read_parallel, split_files
from attn_mt.errors import CheckpointError, UserError
from attn_mt.evaluate import score
from attn_mt.tokenizer import BOS_ID, EOS_ID, PAD_ID
from attn_mt.train import Trainer, TrainingDiverged, label_smoothed_loss, learning_rate

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


def make_config(toy_data: dict[str, Path], out: Path, model: dict | None = None, **train) -> Config:
    """The toy config writing to `out`, with model and train keys overridden."""
    raw = toy_config_dict(toy_data, out, **train)
    raw["model"].update(model or {})
    return config_from_dict(raw)


def resume_config(toy_data: dict[str, Path], out: Path, precision: str, **train) -> Config:
    return make_config(
        toy_data, out, RESUME_MODEL, **{**RESUME_TRAIN, "precision": precision, **train}
    )


def run(cfg: Config, resume: bool = False) -> train_module.TrainResult:
    return Trainer(cfg, resume=resume, device="cpu").run()


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
        "rng_cpu": ts["rng_cpu"],
        "epoch": ts["epoch"],
        "batch_index": ts["batch_index"],
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


def metrics_lines(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def straight_run(toy_data: dict[str, Path], tmp_path_factory: pytest.TempPathFactory):
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


@pytest.fixture
def scripted_validation(monkeypatch: pytest.MonkeyPatch):
    """Replace validation with a scripted BLEU sequence: fast, and it drives early stopping."""

    def install(bleus: tuple[float, ...] = ()) -> None:
        sequence = iter(bleus)

        def validate(self: Trainer) -> dict[str, float]:
            return {"loss": 1.0, "ppl": math.e, "bleu": next(sequence, 0.0), "chrf": 0.0}

        monkeypatch.setattr(Trainer, "validate", validate)

    return install


def signal_after_update(monkeypatch: pytest.MonkeyPatch, update: int, signum: int) -> None:
    """Send `signum` to this process right after update number `update` (a real signal)."""
    original = Trainer._update
    calls = []

    def update_then_signal(self: Trainer):
        result = original(self)
        calls.append(1)
        if len(calls) == update:
            os.kill(os.getpid(), signum)
        return result

    monkeypatch.setattr(Trainer, "_update", update_then_signal)


# ---------------------------------------------------------------------------------------------
# The formulas


def test_label_smoothed_loss_matches_the_formula_and_ignores_pads() -> None:
    torch.manual_seed(0)
    vocab, epsilon = 7, 0.1
    logits = torch.randn(2, 4, vocab)
    target = torch.tensor([[4, 5, 6, EOS_ID], [5, EOS_ID, PAD_ID, PAD_ID]])
    loss, nll = label_smoothed_loss(logits, target, epsilon)

    want_loss = want_nll = 0.0
    for b in range(2):
        for t in range(4):
            y = int(target[b, t])
            if y == PAD_ID:
                continue
            log_p = [
                float(logits[b, t, v]) - math.log(sum(math.exp(float(x)) for x in logits[b, t]))
                for v in range(vocab)
            ]
            want_nll += -log_p[y]
            want_loss += (1 - epsilon) * -log_p[y] + epsilon * -sum(log_p) / vocab
    assert float(loss) == pytest.approx(want_loss, rel=1e-5)
    assert float(nll) == pytest.approx(want_nll, rel=1e-5)

    flat_logits, flat_target = logits.view(-1, vocab), target.view(-1)
    torch_loss = F.cross_entropy(
        flat_logits, flat_target, label_smoothing=epsilon, ignore_index=PAD_ID, reduction="sum"
    )
    torch_nll = F.cross_entropy(flat_logits, flat_target, ignore_index=PAD_ID, reduction="sum")
    assert torch.allclose(loss, torch_loss, rtol=1e-5)
    assert torch.allclose(nll, torch_nll, rtol=1e-5)
    no_smoothing, nll_again = label_smoothed_loss(logits, target, 0.0)
    assert torch.allclose(no_smoothing, torch_nll, rtol=1e-5) and torch.equal(nll, nll_again)

    scrambled = logits.clone()
    scrambled[target == PAD_ID] = 1e4 * torch.randn(int((target == PAD_ID).sum()), vocab)
    assert torch.equal(label_smoothed_loss(scrambled, target, epsilon)[0], loss)
    all_pad = torch.full_like(target, PAD_ID)
    assert [float(x) for x in label_smoothed_loss(logits, all_pad, epsilon)] == [0.0, 0.0]


def test_label_smoothed_loss_gradient_is_the_true_gradient() -> None:
    """The hand-written backward equals autograd's gradient of the formula (float64)."""
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 9, dtype=torch.float64, requires_grad=True)
    target = torch.tensor([[4, 5, 8, EOS_ID, PAD_ID], [7, EOS_ID, PAD_ID, PAD_ID, PAD_ID]])
    assert torch.autograd.gradcheck(lambda x: label_smoothed_loss(x, target, 0.1)[0], (logits,))

    def formula(x: torch.Tensor) -> torch.Tensor:
        log_p = x.log_softmax(-1)
        per_token = -0.9 * log_p.gather(-1, target.unsqueeze(-1)).squeeze(-1) - 0.1 * log_p.mean(-1)
        return per_token.masked_fill(target == PAD_ID, 0.0).sum()

    (want,) = torch.autograd.grad(formula(logits), logits)
    (got,) = torch.autograd.grad(label_smoothed_loss(logits, target, 0.1)[0], logits)
    assert torch.allclose(got, want, atol=1e-12)
    assert torch.all(got[target == PAD_ID] == 0)


def test_label_smoothed_loss_is_float32_for_bf16_logits() -> None:
    logits = torch.randn(2, 3, 11).bfloat16()
    target = torch.tensor([[4, 5, EOS_ID], [6, EOS_ID, PAD_ID]])
    loss, nll = label_smoothed_loss(logits, target, 0.1)
    assert loss.dtype == nll.dtype == torch.float32
    assert torch.allclose(loss, label_smoothed_loss(logits.float(), target, 0.1)[0])


def test_collate_is_teacher_forcing() -> None:
    src_ids = [[10, 11, 12], [13]]
    tgt_ids = [[20, 21], [22, 23, 24, 25]]
    batch = collate(src_ids, tgt_ids, [0, 1])
    P = PAD_ID
    assert batch.src.tolist() == [[10, 11, 12, EOS_ID], [13, EOS_ID, P, P]]
    assert batch.tgt_in.tolist() == [[BOS_ID, 20, 21, P, P], [BOS_ID, 22, 23, 24, 25]]
    assert batch.tgt_out.tolist() == [[20, 21, EOS_ID, P, P], [22, 23, 24, 25, EOS_ID]]
    # The decoder input at position t is the target at t - 1: the model predicts the next token.
    real = batch.tgt_in[:, 1:] != PAD_ID
    assert torch.equal(batch.tgt_in[:, 1:][real], batch.tgt_out[:, :-1][real])
    assert batch.num_tgt_tokens == 3 + 5
    assert batch.ids == [0, 1]


def schedule(**train) -> Config:
    return Config(train=TrainConfig(**train))


def test_inverse_sqrt_peaks_at_warmup_then_decays_as_inverse_sqrt() -> None:
    cfg = schedule(schedule="inverse_sqrt", lr=1e-3, warmup=10)
    rates = {step: learning_rate(step, cfg) for step in range(1, 201)}
    assert max(rates, key=rates.get) == 10
    assert rates[10] == 1e-3
    for step in range(1, 11):
        assert rates[step] == pytest.approx(1e-3 * step / 10)
    for step in range(11, 201):
        assert rates[step] == pytest.approx(1e-3 * math.sqrt(10 / step))


def test_cosine_warms_up_and_reaches_min_lr_at_max_steps() -> None:
    cfg = schedule(schedule="cosine", lr=1e-3, min_lr=1e-5, warmup=10, max_steps=100)
    rates = [learning_rate(step, cfg) for step in range(1, 121)]
    assert rates[9] == pytest.approx(1e-3)
    assert rates[:10] == pytest.approx([1e-3 * s / 10 for s in range(1, 11)])
    assert all(a >= b for a, b in zip(rates[9:], rates[10:], strict=False))
    assert rates[54] == pytest.approx((1e-3 + 1e-5) / 2)  # half-way through the decay
    assert rates[99] == pytest.approx(1e-5)
    assert rates[100:] == pytest.approx([1e-5] * 20)  # stays at the floor after max_steps


def test_constant_schedule_after_warmup() -> None:
    cfg = schedule(schedule="constant", lr=5e-4, warmup=4)
    assert [learning_rate(s, cfg) for s in range(1, 9)] == pytest.approx(
        [1.25e-4, 2.5e-4, 3.75e-4, 5e-4, 5e-4, 5e-4, 5e-4, 5e-4]
    )
    assert learning_rate(1, schedule(schedule="constant", lr=5e-4, warmup=0)) == 5e-4


@pytest.mark.parametrize("name", ["inverse_sqrt", "constant", "cosine"])
def test_only_cosine_depends_on_max_steps(name: str) -> None:
    short = schedule(schedule=name, lr=1e-3, warmup=5, max_steps=20)
    long = schedule(schedule=name, lr=1e-3, warmup=5, max_steps=40)
    same = all(learning_rate(s, short) == learning_rate(s, long) for s in range(1, 60))
    assert same == (name != "cosine")


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


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_half_then_resume_equals_straight_run(
    precision: str, toy_data: dict[str, Path], tmp_path: Path, straight_run
) -> None:
    out = tmp_path / "run"
    first = run(resume_config(toy_data, out, precision, max_steps=3))
    assert (first.step, first.stopped_by) == (3, "max_steps")
    assert (out / "checkpoints" / "best.pt").is_file()
    second = run(resume_config(toy_data, out, precision), resume=True)  # max_steps 3 -> 6
    assert (second.step, second.stopped_by) == (6, "max_steps")
    resumed = resumable_state(load_raw(out / "checkpoints" / "last.pt"))
    assert resumed["epoch"] == 1  # the run crossed an epoch boundary
    assert_identical(resumed, straight_run(precision))
    lines = [(m["step"], m["split"]) for m in metrics_lines(out)]
    assert lines == [(2, "train"), (3, "valid"), (4, "train"), (6, "train"), (6, "valid")]


def test_validation_does_not_change_training(
    toy_data: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, straight_run
) -> None:
    """Validating after every update (with dropout on) leaves the training bits unchanged,
    even a validation that draws random numbers (as sampling or dropout would)."""
    original = Trainer.validate

    def validate_drawing_random_numbers(self: Trainer) -> dict[str, float]:
        torch.rand(1000)
        return original(self)

    monkeypatch.setattr(Trainer, "validate", validate_drawing_random_numbers)
    out = tmp_path / "run"
    run(resume_config(toy_data, out, "fp32", eval_every=1))
    assert [m["step"] for m in metrics_lines(out) if m["split"] == "valid"] == [1, 2, 3, 4, 5, 6]
    assert_identical(
        resumable_state(load_raw(out / "checkpoints" / "last.pt")), straight_run("fp32")
    )


def test_resume_depends_on_the_restored_rng(
    toy_data: dict[str, Path], tmp_path: Path, straight_run
) -> None:
    """Control: with another RNG state in last.pt the resumed run differs (dropout draws)."""
    out = tmp_path / "run"
    run(resume_config(toy_data, out, "fp32", max_steps=3))
    last = out / "checkpoints" / "last.pt"
    state = load_raw(last)
    state["train_state"]["rng_cpu"] = torch.Generator().manual_seed(12345).get_state()
    save_checkpoint(state, last)
    run(resume_config(toy_data, out, "fp32"), resume=True)
    resumed = load_raw(last)["model"]
    reference = straight_run("fp32")["model"]
    assert any(not torch.equal(resumed[k], reference[k]) for k in reference)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_writes_last_and_resume_finishes_the_same(
    signum: int,
    toy_data: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    straight_run,
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
        resumable_state(load_raw(out / "checkpoints" / "last.pt")), straight_run("fp32")
    )


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
        Trainer(cfg, device="cpu")
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
        Trainer(cfg, resume=True, device="cpu")
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
            Trainer(cfg, resume=resume, device="cpu")
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
        Trainer(changed, resume=True, device="cpu")
    message = str(err.value)
    assert "model.d_model" in message and "model.d_ff" in message
    assert "model.heads" not in message


# ---------------------------------------------------------------------------------------------
# Non-finite losses


def nan_on_updates(monkeypatch: pytest.MonkeyPatch, bad: set[int] | None, from_: int = 0):
    """Make the training loss NaN on the given update numbers (1-based), or on all >= from_."""
    calls = []

    def loss(logits, target, epsilon):
        result = label_smoothed_loss(logits, target, epsilon)
        if not torch.is_grad_enabled():  # validation
            return result
        calls.append(1)
        n = len(calls)
        if (bad is not None and n in bad) or (bad is None and n >= from_):
            return tuple(x * float("nan") for x in result)
        return result

    monkeypatch.setattr(train_module, "label_smoothed_loss", loss)


def record_updates(monkeypatch: pytest.MonkeyPatch) -> list[tuple[bool, bool]]:
    """Per update attempt: (finite, parameters and optimizer state unchanged)."""
    original = Trainer._update
    records = []

    def update(self: Trainer):
        params = [p.detach().clone() for p in self.model.parameters()]
        adam_steps = [float(s["step"]) for s in self.optimizer.state.values()]
        result = original(self)
        unchanged = all(
            torch.equal(a, b) for a, b in zip(params, self.model.parameters(), strict=True)
        )
        unchanged &= adam_steps == [float(s["step"]) for s in self.optimizer.state.values()]
        records.append((result[-1], unchanged))
        return result

    monkeypatch.setattr(Trainer, "_update", update)
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
    trainer = Trainer(cfg, device="cpu")
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


@pytest.mark.parametrize(
    ("reason", "train", "bleus", "steps"),
    [
        ("max_steps", {"max_steps": 3}, (), 3),
        ("max_epochs", {"max_steps": 0, "max_epochs": 1, "batch_tokens": 6000}, (), 9),
        ("early stopping", {"max_steps": 50, "eval_every": 1, "patience": 2}, (10, 20, 15, 15), 4),
        ("max_minutes", {"max_steps": 0, "max_minutes": 1e-6}, (), None),
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
    if reason == "early stopping":
        assert best["step"] == 2 and last["train_state"]["bad_evals"] == 2


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
# Atomic checkpoint writes


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
        run(cfg)
    monkeypatch.undo()
    assert list((Path(cfg.train.out_dir) / "checkpoints").iterdir()) == []
