"""EMA of the weights (train.ema_decay): the average follows its formula; it changes no training
bit (decay 0 is no EMA at all, and with an EMA the raw weights, optimizer, RNG and data position
are those of a run without one); straight == resumed with the EMA on; validation, best.pt and
translation use the average while last.pt keeps the raw weights for resume.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers.toy import (
    assert_identical,
    load_raw,
    make_config,
    resumable_state,
    run,
    script_validation,
)

import attn_mt
from attn_mt.checkpoint import average_checkpoints
from attn_mt.config.file import config_from_dict
from attn_mt.config.schema import Config
from attn_mt.errors import ConfigError
from attn_mt.train.setup import setup
from attn_mt.train.state import WeightEMA
from attn_mt.train.validate import translator_of

DECAY = 0.9  # strong enough to move visibly in 6 updates


def ema_config(toy_data: dict[str, Path], out: Path, **train) -> Config:
    """6 updates with dropout (so an exact resume needs the RNG), validation at 3 and 6."""
    settings = {"max_steps": 6, "eval_every": 3, "log_every": 2, "warmup": 4, **train}
    return make_config(toy_data, out, {"dropout": 0.1}, **settings)


def test_the_average_follows_its_formula() -> None:
    """After k updates avg = d^k w_0 + sum_i (1 - d) d^(k-i) w_i, tied weights kept tied."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)).double()
    model[1].weight = model[0].weight  # tied, as the embeddings and the output layer
    decay, history = 0.7, [[p.detach().clone() for p in model.parameters()]]
    ema = WeightEMA(model, decay)
    assert ema.model[1].weight is ema.model[0].weight and len(history[0]) == 3
    for _ in range(5):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p))
        ema.update()
        history.append([p.detach().clone() for p in model.parameters()])
    k = len(history) - 1
    for i, average in enumerate(ema.model.parameters()):
        expected = decay**k * history[0][i] + sum(
            (1 - decay) * decay ** (k - j) * history[j][i] for j in range(1, k + 1)
        )
        torch.testing.assert_close(average, expected, rtol=1e-12, atol=1e-12)
        assert not torch.allclose(average, history[-1][i])
    assert not any(p.requires_grad for p in ema.model.parameters())


@pytest.mark.parametrize("decay", [-0.1, 1.0, 1.5])
def test_decay_outside_0_1_is_refused(toy_data: dict[str, Path], tmp_path: Path, decay) -> None:
    cfg = ema_config(toy_data, tmp_path / "run").to_dict()
    cfg["train"]["ema_decay"] = decay
    with pytest.raises(ConfigError, match=r"train\.ema_decay"):
        config_from_dict(cfg)


@pytest.fixture(scope="module")
def runs(toy_data: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """`ema_config` runs (validations scored BLEU 1 then 2, so best.pt is step 6) with
    ema_decay 0 and DECAY: their checkpoint folders."""
    folders = {}
    for name, decay in (("zero", 0.0), ("ema", DECAY)):
        out = tmp_path_factory.mktemp(f"ema-{name}") / "run"
        with pytest.MonkeyPatch.context() as patch:
            script_validation(patch, (1.0, 2.0))
            result = run(ema_config(toy_data, out, ema_decay=decay))
        assert (result.step, result.stopped_by) == (6, "max_steps")
        folders[name] = out / "checkpoints"
    return folders


def test_decay_0_is_no_ema_bit_for_bit(runs: dict[str, Path]) -> None:
    """No `ema` key, and best.pt (the validated weights) is last.pt's raw weights."""
    last, best = load_raw(runs["zero"] / "last.pt"), load_raw(runs["zero"] / "best.pt")
    assert "ema" not in last and "ema" not in best and best["step"] == 6
    assert_identical(best["model"], last["model"])


def test_the_ema_changes_no_training_bit(runs: dict[str, Path]) -> None:
    """Raw weights, optimizer, RNG and data position are those of the run with decay 0."""
    with_ema = resumable_state(load_raw(runs["ema"] / "last.pt"))
    without = resumable_state(load_raw(runs["zero"] / "last.pt"))
    assert with_ema["ema"] is not None and without["ema"] is None
    assert_identical({**with_ema, "ema": None}, without)
    assert any(not torch.equal(with_ema["ema"][k], with_ema["model"][k]) for k in with_ema["model"])


def test_best_pt_and_translation_use_the_average(runs: dict[str, Path]) -> None:
    folder = runs["ema"]
    last, best = load_raw(folder / "last.pt"), load_raw(folder / "best.pt")
    assert "ema" not in best and best["step"] == last["step"] == 6
    assert_identical(best["model"], last["ema"])
    for path, weights in ((folder / "last.pt", last["ema"]), (folder / "best.pt", best["model"])):
        loaded = attn_mt.load(path, device="cpu", prepack=False).model.state_dict()
        assert_identical(loaded, weights, str(path))
    averaged = average_checkpoints([folder / "last.pt", folder / "last.pt"])
    assert "ema" not in averaged and "train_state" not in averaged
    assert_identical(averaged["model"], last["ema"])
    assert "weight EMA, decay 0.9" in (folder.parent / "train.log").read_text()


def test_straight_equals_resumed_with_the_ema(
    toy_data: dict[str, Path], tmp_path: Path, runs: dict[str, Path], scripted_validation
) -> None:
    scripted_validation()
    out = tmp_path / "run"
    first = run(ema_config(toy_data, out, max_steps=3, ema_decay=DECAY))
    assert first.step == 3
    run(ema_config(toy_data, out, ema_decay=DECAY), resume=True)
    assert_identical(
        resumable_state(load_raw(out / "checkpoints" / "last.pt")),
        resumable_state(load_raw(runs["ema"] / "last.pt")),
    )


def test_resuming_a_run_without_ema_starts_the_average_at_its_weights(
    toy_data: dict[str, Path], tmp_path: Path, scripted_validation
) -> None:
    """...and validation translates with the average (the loss half reads `eval_model` too)."""
    scripted_validation()
    out = tmp_path / "run"
    run(ema_config(toy_data, out, max_steps=1))
    before = load_raw(out / "checkpoints" / "last.pt")["model"]
    trainer = setup(ema_config(toy_data, out, ema_decay=DECAY), resume=True)
    assert_identical(trainer.ema.state_dict(), before)
    assert trainer.state.eval_model is trainer.ema.model is translator_of(trainer.state).model
    assert trainer.ema.model is not trainer.model
