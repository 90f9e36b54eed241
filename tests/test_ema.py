"""EMA of the weights (train.ema_decay): the average follows its formula; it changes no training
bit (decay 0 is no EMA at all, and with an EMA the raw weights, optimizer, RNG and data position
are those of a run without one); straight == resumed with the EMA on; validation, best.pt and
translation use the average while last.pt keeps the raw weights for resume.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import assert_identical, load_raw, resumable_state
from test_train import resume_config, run

import attn_mt
from attn_mt.checkpoint import average_checkpoints
from attn_mt.config import config_from_dict
from attn_mt.ema import WeightEMA
from attn_mt.errors import ConfigError
from attn_mt.train import Trainer

DECAY = 0.9  # strong enough to move visibly in the 6 updates of the resume run


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
    cfg = resume_config(toy_data, tmp_path / "run", "fp32").to_dict()
    cfg["train"]["ema_decay"] = decay
    with pytest.raises(ConfigError, match=r"train\.ema_decay"):
        config_from_dict(cfg)


@pytest.fixture(scope="module")
def runs(toy_data: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The 6-update resume run (dropout, accumulation, an epoch boundary, validation at 3 and
    6) without EMA, with ema_decay 0 written out, and with ema_decay DECAY: last.pt folders."""
    folders = {}
    for name, extra in (("none", {}), ("zero", {"ema_decay": 0.0}), ("ema", {"ema_decay": DECAY})):
        out = tmp_path_factory.mktemp(f"ema-{name}") / "run"
        result = run(resume_config(toy_data, out, "fp32", **extra))
        assert (result.step, result.stopped_by) == (6, "max_steps")
        folders[name] = out / "checkpoints"
    return folders


def test_decay_0_is_no_ema_bit_for_bit(runs: dict[str, Path]) -> None:
    for name in ("last.pt", "best.pt"):
        none, zero = load_raw(runs["none"] / name), load_raw(runs["zero"] / name)
        assert "ema" not in zero
        assert_identical(zero["model"], none["model"], name)
    none, zero = load_raw(runs["none"] / "last.pt"), load_raw(runs["zero"] / "last.pt")
    assert_identical(resumable_state(zero), resumable_state(none))


def test_the_ema_changes_no_training_bit(runs: dict[str, Path]) -> None:
    """Raw weights, optimizer, RNG and data position are those of the run without EMA."""
    with_ema = resumable_state(load_raw(runs["ema"] / "last.pt"))
    without = resumable_state(load_raw(runs["none"] / "last.pt"))
    assert with_ema["ema"] is not None and without["ema"] is None
    assert_identical({**with_ema, "ema": None}, without)
    assert any(not torch.equal(with_ema["ema"][k], with_ema["model"][k]) for k in with_ema["model"])


def test_best_pt_and_translation_use_the_average(runs: dict[str, Path]) -> None:
    folder = runs["ema"]
    last, best = load_raw(folder / "last.pt"), load_raw(folder / "best.pt")
    assert "ema" not in best
    if best["step"] == last["step"]:
        assert_identical(best["model"], last["ema"])
    for path, weights in ((folder / "last.pt", last["ema"]), (folder / "best.pt", best["model"])):
        loaded = attn_mt.load(path, device="cpu").model.state_dict()
        assert_identical(loaded, weights, str(path))
    averaged = average_checkpoints([folder / "last.pt", folder / "last.pt"])
    assert "ema" not in averaged and "train_state" not in averaged
    assert_identical(averaged["model"], last["ema"])
    assert "weight EMA, decay 0.9" in (folder.parent / "train.log").read_text()


def test_straight_equals_resumed_with_the_ema(
    toy_data: dict[str, Path], tmp_path: Path, runs: dict[str, Path]
) -> None:
    out = tmp_path / "run"
    first = run(resume_config(toy_data, out, "fp32", max_steps=3, ema_decay=DECAY))
    assert first.step == 3
    run(resume_config(toy_data, out, "fp32", ema_decay=DECAY), resume=True)
    assert_identical(
        resumable_state(load_raw(out / "checkpoints" / "last.pt")),
        resumable_state(load_raw(runs["ema"] / "last.pt")),
    )


def test_resuming_a_run_without_ema_starts_the_average_at_its_weights(
    toy_data: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "run"
    run(resume_config(toy_data, out, "fp32", max_steps=3))
    before = load_raw(out / "checkpoints" / "last.pt")["model"]
    trainer = Trainer(resume_config(toy_data, out, "fp32", ema_decay=DECAY), resume=True)
    assert_identical(trainer.ema.state_dict(), before)
