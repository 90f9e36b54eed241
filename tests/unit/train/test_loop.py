"""How the loop feeds the device: batches prepared one update ahead are the batches it would
have made (and a checkpoint taken meanwhile resumes at the right one), target tokens are
counted on the host, an update reads the device back once, and its step (`UpdateStep`, public
for benchmarks) updates on its own as in the trainer."""

from __future__ import annotations

import copy

import pytest
import torch
from helpers.toy import assert_identical

from attn_mt.data.batching import Batch
from attn_mt.data.epochs import ShardBatches
from attn_mt.model.loss import SmoothedObjective
from attn_mt.model.vocab import PAD_ID
from attn_mt.train.loop import UpdateStep
from attn_mt.train.setup import make_optimizer, setup


def marked(batch: Batch) -> Batch:
    """A stand-in for the copy to the GPU, visible on the batch."""
    batch.ids = [-1, *batch.ids]
    return batch


def test_prepared_batches_are_the_ones_next_would_make(toy_config) -> None:
    trainer = setup(toy_config(batch_tokens=20000, max_steps=1))

    def source() -> ShardBatches:
        return ShardBatches.from_config(trainer.cfg, trainer.corpus.shards, trainer.world)

    plain, ahead = source(), source()
    taken = []
    for _ in range(5):  # across an epoch boundary, 2 batches at a time
        position = ahead.state_dict()
        ahead.prepare(2, marked)
        assert ahead.state_dict() == position  # preparing does not move the position
        taken += [ahead.next(), ahead.next()]
    expected = [plain.next() for _ in range(10)]
    assert [b.ids for b in taken] == [[-1, *b.ids] for b in expected]
    assert all(torch.equal(a.tgt_out, b.tgt_out) for a, b in zip(taken, expected, strict=True))
    assert (ahead.epoch, ahead.index) == (plain.epoch, plain.index) and plain.epoch >= 1
    # A position saved while batches wait is where the next batch comes from.
    ahead.prepare(2, marked)
    resumed = source()
    resumed.load_state_dict(ahead.state_dict())
    assert resumed.next().ids == plain.next().ids == ahead.next().ids[1:]


def test_target_tokens_are_counted_when_the_batch_is_made(toy_config) -> None:
    source = setup(toy_config(max_steps=1)).source
    for _ in range(3):
        batch = source.next()
        assert batch.num_tgt_tokens == int((batch.tgt_out != PAD_ID).sum())


def test_an_update_reads_the_device_back_once(toy_config, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a GPU each read of a tensor's value waits for all queued work: an update reads
    nothing back, and its figures are read once (`tolist`) when the loop reads it."""
    trainer = setup(toy_config(max_steps=2, accumulate=2))
    reads: list[str] = []
    for name in ("item", "tolist", "__bool__", "__float__", "__int__"):
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _name=name, _original=original):
            reads.append(_name)
            return _original(self, *args)

        monkeypatch.setattr(torch.Tensor, name, counted)
    trainer.source.prepare(2, lambda batch: batch)
    for _ in range(2):
        reads.clear()
        pending = trainer.update()
        assert reads == []
        update, _ = pending.read()
        assert update.finite and reads == ["tolist"]


def test_the_update_step_on_its_own_updates_as_the_trainer_does(toy_config) -> None:
    """A benchmark builds `UpdateStep` from its own model, optimizer and batches: the weights
    and the figures come out bit for bit as the trainer's update over the same batches."""
    trainer = setup(toy_config(max_steps=1, accumulate=2))
    t = trainer.cfg.train
    model = copy.deepcopy(trainer.model)
    objective = SmoothedObjective(model, t.label_smoothing)
    step = UpdateStep(objective, make_optimizer(model, t), clip_norm=t.clip_norm)
    taken, take = [], trainer.source.next

    def noted() -> Batch:
        taken.append(take())
        return taken[-1]

    trainer.source.next = noted  # type: ignore[method-assign]
    before = copy.deepcopy(model.state_dict())
    ours, _ = trainer.update().read()
    figures, finite = step.apply(*step.backward(taken))
    assert len(taken) == 2 and bool(finite)
    assert figures.tolist() == [ours.loss, ours.nll, ours.tokens, ours.grad_norm]
    assert_identical(model.state_dict(), trainer.model.state_dict())
    assert any(not torch.equal(before[k], w) for k, w in model.state_dict().items())
