"""train.freeze: the parts it names get no gradient and no optimizer state, so their tensors end
a run exactly as they began (with tied embeddings, `embeddings` holds the output layer's weight:
one matrix), while the rest trains; and such a run resumes exactly (20 updates, then a resume
to 40, equal 40 straight, bit for bit), its frozen parts fixed for the whole run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.toy import assert_identical, load_raw, make_config, resumable_state, run

from attn_mt.config.schema import Config
from attn_mt.errors import UserError
from attn_mt.train.setup import setup

FROZEN = ("src_embed.", "tgt_embed.", "output.", "encoder")  # embeddings and encoder: by name


def freeze_config(toy_data: dict[str, Path], out: Path, **train: Any) -> Config:
    """The toy run (dropout on: a resume needs its RNG) with its embeddings and encoder frozen."""
    settings = {"freeze": ["embeddings", "encoder"], "max_steps": 40, "eval_every": 20}
    settings |= {"log_every": 10, "warmup": 10, "valid_max_sentences": 10}
    return make_config(toy_data, out, {"dropout": 0.1}, **{**settings, **train})


@pytest.fixture(scope="module")
def straight(
    toy_data: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, dict[str, torch.Tensor]]:
    """The 40 updates straight: the run folder and the weights it began with."""
    out = tmp_path_factory.mktemp("straight") / "run"
    trainer = setup(freeze_config(toy_data, out))
    began = {name: value.clone() for name, value in trainer.model.state_dict().items()}
    assert trainer.run().step == 40
    return out, began


def test_frozen_parts_keep_their_weights_and_get_no_state(straight) -> None:
    out, began = straight
    last = load_raw(out / "checkpoints" / "last.pt")
    frozen = [name for name in began if name.startswith(FROZEN)]
    trained = [name for name in began if not name.startswith(FROZEN)]
    assert "output.weight" in frozen and trained  # tied: the target table, frozen with it
    assert all(torch.equal(last["model"][name], began[name]) for name in frozen)
    assert all(not torch.equal(last["model"][name], began[name]) for name in trained)
    optimizer = last["train_state"]["optimizer"]
    assert sum(len(group["params"]) for group in optimizer["param_groups"]) == len(trained)
    assert len(optimizer["state"]) == len(trained)  # no moments for a frozen tensor
    count = sum(began[name].numel() for name in trained)
    assert (
        f"frozen (train.freeze): embeddings, encoder; {count:,} of the"
        in (out / "train.log").read_text()
    )


def test_a_run_with_frozen_parts_resumes_exactly(
    straight, toy_data: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "run"
    assert run(freeze_config(toy_data, out, max_steps=20)).step == 20
    assert run(freeze_config(toy_data, out), resume=True).step == 40
    resumed = resumable_state(load_raw(out / "checkpoints" / "last.pt"))
    assert_identical(resumed, resumable_state(load_raw(straight[0] / "checkpoints" / "last.pt")))
    with pytest.raises(UserError, match=r"train\.freeze differ"):
        setup(freeze_config(toy_data, out, freeze=["encoder"], max_steps=60), resume=True)
