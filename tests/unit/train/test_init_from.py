"""Fine-tuning: `train --init-from PATH` (train.init_from) starts a new run at step 0 with a fresh
optimizer, schedule, best score and data position from a checkpoint's weights (those it
translates with) and its SentencePiece models; changed model or tokenizer keys are refused
before anything is written; config.yaml records the checkpoint, also after a resume.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from helpers.clirun import assert_user_error, attn_mt, config_dict, write_yaml
from helpers.toy import assert_identical, load_raw, script_validation, toy_config_dict

from attn_mt.checkpoint import translation_weights
from attn_mt.config.file import config_from_dict
from attn_mt.config.schema import Config
from attn_mt.errors import CheckpointError, UserError
from attn_mt.train.setup import setup


def config(toy_data: dict[str, Path], out: Path, model=None, tokenizer=None, **train) -> Config:
    raw = toy_config_dict(toy_data, out, **train)
    raw["model"].update(model or {})
    raw["tokenizer"].update(tokenizer or {})
    return config_from_dict(raw)


@pytest.fixture(scope="module")
def base(toy_data: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished 4-update toy run with an EMA (so best.pt and last.pt translate with
    different weights from last.pt's raw ones): the run folder."""
    out = tmp_path_factory.mktemp("base") / "run"
    with pytest.MonkeyPatch.context() as patch:
        script_validation(patch, (30.0, 20.0))  # best.pt at step 2, last.pt at step 4
        result = setup(config(toy_data, out, max_steps=4, eval_every=2, ema_decay=0.5)).run()
    assert result.step == 4
    return out


@pytest.mark.parametrize("start", ["folder", "last.pt"])
def test_a_new_run_from_the_weights_with_fresh_state(
    start: str, base: Path, toy_data: dict[str, Path], tmp_path: Path, scripted_validation
) -> None:
    scripted_validation((1.0,))  # below the base run's best: the new run keeps its own
    path = base if start == "folder" else base / "checkpoints" / "last.pt"
    source = load_raw(base / "checkpoints" / ("best.pt" if start == "folder" else "last.pt"))
    out = tmp_path / "tuned"
    cfg = config(toy_data, out, {"dropout": 0.2}, init_from=str(path), lr=0.001, max_steps=3)
    trainer = setup(cfg)
    assert_identical(trainer.model.state_dict(), translation_weights(source))
    if start == "last.pt":  # the weights it translates with: the EMA, not the raw ones
        assert any(not torch.equal(source["ema"][k], source["model"][k]) for k in source["model"])
    assert trainer.progress.step == 0 and trainer.progress.best_score is None
    assert trainer.optimizer.state_dict()["state"] == {}
    assert trainer.source.state_dict()["epoch"] == 0 and trainer.source.state_dict()["index"] == 0
    assert trainer.src_tok.model_bytes == source["tokenizers"]["src"]
    result = trainer.run()
    assert (result.step, result.best_score) == (3, 1.0)  # its own best, from step 0
    last = load_raw(out / "checkpoints" / "last.pt")
    assert last["tokenizers"] == source["tokenizers"]  # the same SentencePiece bytes
    assert {int(s["step"]) for s in last["train_state"]["optimizer"]["state"].values()} == {3}
    recorded = yaml.safe_load((out / "config.yaml").read_text())["train"]["init_from"]
    expected = (path / "checkpoints" / "best.pt") if start == "folder" else path
    assert recorded == str(expected.resolve()) == last["config"]["train"]["init_from"]
    assert f"SentencePiece models from {expected.resolve()}" in (out / "train.log").read_text()


def test_resume_keeps_the_record_of_the_start(
    base: Path, toy_data: dict[str, Path], tmp_path: Path, scripted_validation
) -> None:
    scripted_validation()
    out = tmp_path / "tuned"
    setup(config(toy_data, out, init_from=str(base), max_steps=2)).run()
    resumed = setup(config(toy_data, out, max_steps=3), resume=True)  # no init_from given
    assert resumed.progress.step == 2
    resumed.run()
    recorded = yaml.safe_load((out / "config.yaml").read_text())["train"]["init_from"]
    assert recorded == str((base / "checkpoints" / "best.pt").resolve())


@pytest.mark.parametrize(
    ("model", "tokenizer", "named"),
    [
        ({"d_model": 32, "d_ff": 64, "dropout": 0.3}, {}, ["model.d_model", "model.d_ff"]),
        (
            {"attention_dropout": 0.1, "activation_dropout": 0.0},
            {"vocab_size": 50},
            ["tokenizer.vocab_size"],
        ),
    ],
    ids=["model", "tokenizer"],
)
def test_changed_model_or_tokenizer_keys_are_refused_before_anything_is_written(
    model: dict, tokenizer: dict, named: list, base: Path, toy_data, tmp_path: Path
) -> None:
    out = tmp_path / "tuned"
    with pytest.raises(UserError) as err:
        setup(config(toy_data, out, model, tokenizer, init_from=str(base)))
    message = str(err.value)
    assert all(f"{key} (" in message for key in named), message  # "key (new here, old there)"
    assert message.count(" here, ") == len(named), message  # dropout may change: not named
    assert "\n" not in message and str(base / "checkpoints" / "best.pt") in message
    assert not out.exists()


def test_a_missing_checkpoint_is_refused(toy_data: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="not found"):
        setup(config(toy_data, tmp_path / "tuned", init_from=str(tmp_path / "nothing.pt")))
    assert not (tmp_path / "tuned").exists()


def test_cli_init_from_and_its_refusal_with_resume(
    base: Path, corpus: dict[str, Path], tmp_path: Path
) -> None:
    raw = config_dict(corpus, tmp_path / "tuned", max_steps=1)  # 10 validation pairs, dropout
    config_file = write_yaml(tmp_path / "tuned.yaml", raw)
    refused = attn_mt(
        "train", "--config", config_file, "--init-from", base, "--resume", cwd=tmp_path
    )
    assert_user_error(refused, "--init-from", "--resume")
    assert not (tmp_path / "tuned").exists()
    done = attn_mt(
        "train", "--config", config_file, "--init-from", base, "--device", "cpu", cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr.decode()
    recorded = yaml.safe_load((tmp_path / "tuned" / "config.yaml").read_text())["train"]
    assert recorded["init_from"] == str((base / "checkpoints" / "best.pt").resolve())
