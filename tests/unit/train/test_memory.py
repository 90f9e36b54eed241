"""GPU memory, checked without a GPU: the start-up probe takes the worst-shaped batch and
changes no training bit, running out of memory is one line naming train.batch_tokens, the
step line shows the peak on a GPU, and the loss's bf16 gradient is made in chunks."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from helpers.toy import run

import attn_mt.model.loss as loss_module
from attn_mt.data.batching import collate
from attn_mt.errors import UserError
from attn_mt.model.loss import label_smoothed_loss
from attn_mt.train.clock import RunClock
from attn_mt.train.loglines import TrainWindow, window_line
from attn_mt.train.loop import Trainer
from attn_mt.train.memory import probe, worst_batch
from attn_mt.train.setup import setup


def test_the_probe_takes_the_batch_with_the_most_padded_target_positions(toy_config) -> None:
    trainer = setup(toy_config(batch_tokens=300, max_steps=1))
    source = trainer.source
    shards = source.shards
    sizes = []
    for rows in source.batches:
        batch = collate(shards.src, shards.tgt, rows)
        sizes.append((batch.tgt_out.numel(), batch.src.numel()))
    worst = worst_batch(source)
    assert len(set(sizes)) > 1  # the choice matters
    assert (worst.tgt_out.numel(), worst.src.numel()) == max(sizes)


def test_the_probe_changes_no_weight_gradient_or_random_stream(toy_config) -> None:
    trainer = setup(toy_config(max_steps=1))
    model = trainer.model
    model.train()  # dropout draws, were there any
    weights = [p.detach().clone() for p in model.parameters()]
    rng = torch.get_rng_state()
    probe(model, worst_batch(trainer.source), trainer.dtype, 0.1)
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(a, b) for a, b in zip(weights, model.parameters(), strict=True))


def test_out_of_memory_is_one_line_naming_batch_tokens(
    toy_config, monkeypatch: pytest.MonkeyPatch
) -> None:
    def update(self: Trainer):
        raise torch.OutOfMemoryError(
            "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
            "79.19 GiB of which 1.02 GiB is free.\nIncluding non-PyTorch memory ..."
        )

    monkeypatch.setattr(Trainer, "update", update)
    with pytest.raises(UserError) as err:
        run(toy_config(batch_tokens=1024, accumulate=2))
    message = str(err.value)
    assert "\n" not in message
    assert "out of GPU memory (CUDA out of memory)" in message
    assert "train.batch_tokens (now 1024)" in message and "train.accumulate (now 2)" in message


def test_the_step_line_shows_the_peak_memory_on_a_gpu(
    toy_config, monkeypatch: pytest.MonkeyPatch
) -> None:
    t, source = toy_config().train, SimpleNamespace(epoch=0, epochs_run=0.5)
    run = RunClock(start=0.0, first_step=0, now=lambda: 1.0)
    window = TrainWindow()
    window.add(10.0, 9.0, 5, 1.0)
    line, metrics = window_line(1, window, 1e-3, t, run, source, torch.device("cpu"))
    assert "mem" not in line and "peak_mem_gib" not in metrics
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device: 3 * 2**30)
    line, metrics = window_line(1, window, 1e-3, t, run, source, torch.device("cuda", 0))
    assert line.endswith("mem 3.0 GiB") and metrics["peak_mem_gib"] == 3.0


def test_bf16_gradient_made_in_chunks_equals_the_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    logits = torch.randn(4, 7, 50).bfloat16().requires_grad_()
    target = torch.randint(0, 50, (4, 7))
    target[0, 3:] = 0  # padding
    (whole,) = torch.autograd.grad(label_smoothed_loss(logits, target, 0.1)[0], logits)
    monkeypatch.setattr(loss_module, "GRAD_CHUNK", 3 * 50)  # 3 rows at a time
    (chunked,) = torch.autograd.grad(label_smoothed_loss(logits, target, 0.1)[0], logits)
    assert chunked.dtype == torch.bfloat16
    assert torch.equal(chunked, whole)
    expected = torch.autograd.grad(label_smoothed_loss(logits.float(), target, 0.1)[0], logits)[0]
    assert torch.equal(whole, expected.bfloat16())
