"""Subword regularization (tokenizer.sampling_alpha): a sampled segmentation of each training
pair per batch, the same sentence in other pieces; alpha 0 is today's batches bit for bit; the
samples are a function of the batch's place, so a resumed run samples what the straight run
did; BPE-dropout through the same key; the prepared shards do not depend on it."""

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
    toy_config_dict,
)

from attn_mt.config.file import config_from_dict
from attn_mt.config.schema import Config
from attn_mt.data.corpus import training_data
from attn_mt.data.epochs import ShardBatches
from attn_mt.data.prepare import plan, prepare_shards
from attn_mt.distributed import World
from attn_mt.errors import ConfigError
from attn_mt.model.vocab import BOS_ID, EOS_ID, PAD_ID
from attn_mt.train.setup import check_run_folder


def sampling_config(toy_data: dict[str, Path], tmp_path: Path, alpha: float, **tokenizer) -> Config:
    raw = toy_config_dict(toy_data, tmp_path / "run")
    raw["data"]["prepared_dir"] = str(tmp_path / "prepared")
    raw["tokenizer"].update(sampling_alpha=alpha, **tokenizer)
    return config_from_dict(raw)


def batches(cfg: Config, count: int, state: dict | None = None) -> list:
    source = ShardBatches.from_config(cfg, prepare_shards(cfg, workers=1), World())
    if state:
        source.load_state_dict(state)
    return [source.next() for _ in range(count)]


def sentences(batch, tokenizer) -> tuple[list[str], list[str]]:
    """The batch's (source, target) text, read back from its ids."""
    return tokenizer.decode(batch.src.tolist()), tokenizer.decode(batch.tgt_out.tolist())


def same_tensors(a, b) -> bool:
    return all(torch.equal(getattr(a, n), getattr(b, n)) for n in ("src", "tgt_in", "tgt_out"))


@pytest.mark.parametrize("model_type", ["unigram", "bpe"])
def test_sampled_batches_hold_the_same_sentences_in_other_pieces(toy_data, tmp_path, model_type):
    """BPE-dropout for bpe, unigram sampling for unigram: same rows, same text, other ids."""
    vocab = {"vocab_size": 200} if model_type == "unigram" else {}
    best_cfg = sampling_config(toy_data, tmp_path, 0.0, model_type=model_type, **vocab)
    cfg = sampling_config(toy_data, tmp_path, 0.1, model_type=model_type, **vocab)
    assert plan(cfg).folder == plan(best_cfg).folder  # sampling needs no shards of its own
    best, sampled = batches(best_cfg, 6), batches(cfg, 6)
    tokenizer = prepare_shards(cfg, workers=1).tokenizers()[0]
    changed = 0
    for b, s in zip(best, sampled, strict=True):
        assert b.ids == s.ids
        assert sentences(b, tokenizer) == sentences(s, tokenizer)
        changed += not same_tensors(b, s)
        # Still well formed: <bos> first, one <eos> per row ending the target, padding after.
        assert (s.tgt_in[:, 0] == BOS_ID).all()
        assert ((s.tgt_out == EOS_ID).sum(1) == 1).all() and ((s.src == EOS_ID).sum(1) == 1).all()
        ends = (s.tgt_out == EOS_ID).int().argmax(1)
        assert all(
            (row[end + 1 :] == PAD_ID).all() for row, end in zip(s.tgt_out, ends, strict=True)
        )
        assert torch.equal(
            s.tgt_in[:, 1:], torch.where(s.tgt_out == EOS_ID, PAD_ID, s.tgt_out)[:, :-1]
        )
    assert changed >= len(best) - 1  # (a batch of long sentences may keep its best pieces)
    # More pieces on average: the sampled segmentations are not the best ones.
    assert sum(int((s.tgt_out != PAD_ID).sum()) for s in sampled) > sum(
        b.num_tgt_tokens for b in best
    )


def test_alpha_zero_is_todays_batches(toy_data, tmp_path):
    cfg = sampling_config(toy_data, tmp_path, 0.0)
    shards = prepare_shards(cfg, workers=1)
    source = ShardBatches.from_config(cfg, shards, World())
    assert source.resampler is None
    plain = ShardBatches(shards, [1.0], cfg.train.batch_tokens, cfg.train.seed)
    for _ in range(len(plain.batches) + 3):  # into the second epoch
        a, b = source.next(), plain.next()
        assert a.ids == b.ids and same_tensors(a, b)


def test_a_large_alpha_gives_back_the_best_segmentation(toy_data, tmp_path):
    """Unigram sampling from P^alpha with alpha large is the best path: the decode + sampled
    encode round trip reproduces the stored ids exactly (tags and all)."""
    best = batches(
        sampling_config(toy_data, tmp_path, 0.0, model_type="unigram", vocab_size=200), 4
    )
    cfg = sampling_config(toy_data, tmp_path, 1000.0, model_type="unigram", vocab_size=200)
    for b, s in zip(best, batches(cfg, 4), strict=True):
        assert b.ids == s.ids and same_tensors(b, s)


def test_samples_depend_on_the_batch_place_only(toy_data, tmp_path):
    """Continuing from a saved position gives the straight run's sampled batches, whatever
    else used SentencePiece's generator in between; another epoch samples anew."""
    cfg = sampling_config(toy_data, tmp_path, 0.2)
    straight = batches(cfg, 5)
    tokenizer = prepare_shards(cfg, workers=1).tokenizers()[0]
    tokenizer.sample(["a b c d e f g"] * 50, 0.2, seed=12345)  # moves the generator
    resumed = batches(cfg, 3, {"epoch": 0, "index": 2, "world_size": 1})
    for a, b in zip(straight[2:], resumed, strict=True):
        assert a.ids == b.ids and same_tensors(a, b)
    source = ShardBatches.from_config(cfg, prepare_shards(cfg, workers=1), World())
    per_epoch = len(source.batches)
    first_again = batches(cfg, 1, {"epoch": 1, "index": 0, "world_size": 1})[0]
    epoch0 = {tuple(b.ids): b for b in straight}
    next_epoch = batches(cfg, per_epoch + 1)[per_epoch]
    assert next_epoch.ids == first_again.ids and same_tensors(next_epoch, first_again)
    if tuple(first_again.ids) in epoch0:  # the same rows in another epoch: other pieces
        assert not same_tensors(first_again, epoch0[tuple(first_again.ids)])


@pytest.mark.parametrize("max_len", [64, 12])
def test_a_sample_never_widens_its_batch_much(toy_data, tmp_path, max_len):
    """A sampled sentence longer than the batch's longest best one + 10% (at least 2 pieces), or
    than data.max_len, keeps its best segmentation: the batch keeps its token budget."""
    raw = sampling_config(toy_data, tmp_path, 0.01, model_type="unigram", vocab_size=200).to_dict()
    raw["data"]["max_len"] = max_len
    cfg = config_from_dict(raw)
    best = batches(
        sampling_config(toy_data, tmp_path, 0.0, model_type="unigram", vocab_size=200), 8
    )
    for b, s in zip(best, batches(cfg, 8), strict=True):
        for name in ("src", "tgt_out"):
            width = getattr(b, name).size(1) - 1  # pieces of the longest best sentence
            assert getattr(s, name).size(1) - 1 <= min(width + max(2, width // 10), max_len)


@pytest.mark.parametrize(
    ("tokenizer", "message"),
    [
        ({"sampling_alpha": -0.1}, "tokenizer.sampling_alpha: -0.1 is invalid"),
        ({"sampling_alpha": 1.0, "model_type": "bpe"}, "below 1 for model_type bpe"),
    ],
)
def test_bad_alphas_are_refused(toy_data, tmp_path, tokenizer, message):
    raw = toy_config_dict(toy_data, tmp_path)
    raw["tokenizer"].update(tokenizer)
    with pytest.raises(ConfigError, match=message):
        config_from_dict(raw)


def test_training_with_sampling_resumes_exactly_and_may_change_alpha(toy_data, tmp_path):
    """Straight == stopped and resumed with sampling on; a run may be resumed with another
    alpha (it changes no piece), but not with another vocabulary."""
    settings = {"max_steps": 6, "eval_every": 1000, "warmup": 4}

    def config(out: Path, alpha: float, **train) -> Config:
        raw = make_config(toy_data, out, {"dropout": 0.1}, **{**settings, **train}).to_dict()
        raw["tokenizer"]["sampling_alpha"] = alpha
        raw["data"]["prepared_dir"] = str(tmp_path / "prepared")
        return config_from_dict(raw)

    straight = tmp_path / "straight"
    run(config(straight, 0.2))
    out = tmp_path / "resumed"
    assert run(config(out, 0.2, max_steps=3)).step == 3
    run(config(out, 0.2), resume=True)
    assert_identical(
        resumable_state(load_raw(out / "checkpoints" / "last.pt")),
        resumable_state(load_raw(straight / "checkpoints" / "last.pt")),
    )
    plain = tmp_path / "plain"
    run(config(plain, 0.0))
    a = load_raw(plain / "checkpoints" / "last.pt")["model"]
    b = load_raw(straight / "checkpoints" / "last.pt")["model"]
    assert any(not torch.equal(a[k], b[k]) for k in a)  # the sampled pieces were trained on
    assert check_run_folder(out, config(out, 0.5, max_steps=9), resume=True) is not None
    raw = config(out, 0.2, max_steps=9).to_dict()
    raw["tokenizer"]["vocab_size"] = 61
    with pytest.raises(Exception, match="tokenizer.vocab_size"):
        check_run_folder(out, config_from_dict(raw), resume=True)


def test_validation_and_translation_keep_the_best_segmentation(toy_data, tmp_path):
    """The validation ids a run uses are the tokenizer's plain encoding, alpha or not."""
    cfg = sampling_config(toy_data, tmp_path, 0.2)
    src_tok, tgt_tok, corpus = training_data(cfg, None, World())
    assert corpus.valid_src_ids == src_tok.encode(corpus.valid_src)
    assert corpus.valid_tgt_ids == tgt_tok.encode(corpus.valid_ref)
