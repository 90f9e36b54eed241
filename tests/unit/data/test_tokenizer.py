"""SentencePiece wrapper: lossless round trip, special ids, the training cache, joint vocab."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import sentencepiece as spm
from helpers.toy import toy_pairs

from attn_mt.config.schema import TokenizerConfig
from attn_mt.data.tokenizer import BATCH_DECODE, Tokenizer, build_tokenizers, train_tokenizer
from attn_mt.errors import ConfigError
from attn_mt.model.vocab import BOS_ID, EOS_ID, PAD_ID, SPECIAL_PIECES, UNK_ID

SENTENCES = [
    "Ein kleines Mädchen läuft über die Straße.",
    "A little girl runs across the street.",
    "Une fille court à côté d'un café, près de l'hôtel.",
    "Malá dívka běží přes ulici.",
    "Ένα κορίτσι τρέχει στον δρόμο.",
    "東京の女の子が走る。",
    "Two dogs 🐕🐕 play in the snow (at 5 p.m.)!",
]


@pytest.fixture(scope="module")
def unicode_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    """A byte-fallback tokenizer trained on the toy task plus the sentences above."""
    src, tgt = toy_pairs(300, seed=4)
    cfg = TokenizerConfig(vocab_size=400, byte_fallback=True)
    return train_tokenizer(cfg, src + tgt + SENTENCES, tmp_path_factory.mktemp("spm"))


def test_round_trip_is_lossless(unicode_tokenizer: Tokenizer):
    unseen = ["Ein Ärger 🙂 über Œuvres — naïve façade; 42 €.", "ქართული ენა"]
    texts = SENTENCES + unseen
    ids = unicode_tokenizer.encode(texts)
    assert unicode_tokenizer.decode(ids) == texts
    assert all(UNK_ID not in seq for seq in ids)  # byte fallback: nothing becomes <unk>


def test_special_ids_match_the_pieces(unicode_tokenizer: Tokenizer):
    sp = unicode_tokenizer.sp
    assert (sp.pad_id(), sp.unk_id(), sp.bos_id(), sp.eos_id()) == (PAD_ID, UNK_ID, BOS_ID, EOS_ID)
    assert (PAD_ID, UNK_ID, BOS_ID, EOS_ID) == (0, 1, 2, 3)
    assert unicode_tokenizer.pieces([PAD_ID, UNK_ID, BOS_ID, EOS_ID]) == list(
        SPECIAL_PIECES.values()
    )
    assert unicode_tokenizer.all_pieces()[:4] == ["<pad>", "<unk>", "<s>", "</s>"]
    ids = unicode_tokenizer.encode(SENTENCES)
    assert not {PAD_ID, BOS_ID, EOS_ID} & {i for seq in ids for i in seq}  # the batcher adds them
    with_specials = [[BOS_ID, *seq, EOS_ID, PAD_ID, PAD_ID] for seq in ids]
    assert unicode_tokenizer.decode(with_specials) == SENTENCES


@pytest.mark.parametrize("count", [1, 2, BATCH_DECODE - 1, BATCH_DECODE, 3 * BATCH_DECODE])
def test_decode_one_by_one_and_in_a_batch_agree(unicode_tokenizer: Tokenizer, count: int):
    """Below BATCH_DECODE sentences decode one by one (no thread), from it on in SentencePiece's
    batch call: either way the same texts, special ids dropped, empty outputs empty."""
    rng = random.Random(count)
    ids = unicode_tokenizer.encode(SENTENCES)
    seqs = [[BOS_ID, *rng.choice(ids)[: rng.randrange(12)], EOS_ID] for _ in range(count)]
    expected = unicode_tokenizer.sp.decode([seq[1:-1] for seq in seqs])
    assert unicode_tokenizer.decode(seqs) == expected
    assert unicode_tokenizer.decode([seq[1:-1] + [PAD_ID] for seq in seqs]) == expected


def test_tokenizer_rebuilds_from_bytes(unicode_tokenizer: Tokenizer):
    copy = Tokenizer(unicode_tokenizer.model_bytes)
    assert copy.vocab_size == unicode_tokenizer.vocab_size == 400
    assert copy.encode(SENTENCES) == unicode_tokenizer.encode(SENTENCES)


def test_cache_is_reused_without_retraining(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    src, tgt = toy_pairs(200, seed=5)
    cfg = TokenizerConfig(vocab_size=50, byte_fallback=False, model_type="bpe")
    first = train_tokenizer(cfg, src + tgt, tmp_path)
    assert len(list(tmp_path.glob("*.model"))) == 1

    def no_training(*args, **kwargs):
        raise AssertionError("SentencePiece should not train again")

    monkeypatch.setattr(spm.SentencePieceTrainer, "train", no_training)
    second = train_tokenizer(cfg, src + tgt, tmp_path)
    assert second.model_bytes == first.model_bytes
    with pytest.raises(AssertionError, match="should not train again"):
        train_tokenizer(TokenizerConfig(vocab_size=51, byte_fallback=False), src + tgt, tmp_path)
    with pytest.raises(AssertionError, match="should not train again"):
        train_tokenizer(cfg, src + tgt[:-1], tmp_path)  # other text: another cache entry


def test_joint_and_separate_vocabularies(tmp_path: Path):
    src, tgt = toy_pairs(300, seed=6)
    joint_cfg = TokenizerConfig(vocab_size=60, byte_fallback=False, model_type="bpe")
    joint_src, joint_tgt = build_tokenizers(joint_cfg, src, tgt, tmp_path)
    assert joint_src is joint_tgt
    assert all(UNK_ID not in seq for seq in joint_src.encode(src + tgt))

    separate_cfg = TokenizerConfig(vocab_size=40, byte_fallback=False, joint=False)
    src_tok, tgt_tok = build_tokenizers(separate_cfg, src, tgt, tmp_path)
    assert src_tok.model_bytes != tgt_tok.model_bytes
    assert all(UNK_ID not in seq for seq in src_tok.encode(src))
    assert all(UNK_ID not in seq for seq in tgt_tok.encode(tgt))
    assert any(UNK_ID in seq for seq in src_tok.encode(tgt))  # target letters unseen by source
    assert src_tok.decode(src_tok.encode(src)) == src
    assert tgt_tok.decode(tgt_tok.encode(tgt)) == tgt


def test_too_small_vocab_with_byte_fallback_is_a_config_error(tmp_path: Path):
    src, tgt = toy_pairs(100, seed=7)
    with pytest.raises(ConfigError) as info:
        train_tokenizer(TokenizerConfig(vocab_size=60, byte_fallback=True), src + tgt, tmp_path)
    message = str(info.value)
    assert "vocab_size 60" in message
    assert "tokenizer.vocab_size" in message and "tokenizer.byte_fallback: false" in message
    assert "\n" not in message
    assert list(tmp_path.glob("*.model")) == []  # nothing cached for a failed training


TAGS = ["<2de>", "<2en>", "<bt>"]
TAGGED_TEXT = ["<2de> qb qc", "qb<2en>qc", "<bt><2de>", "<s> </s> <pad> <unk> <0x41> <2de"]


@pytest.mark.parametrize("model_type", ["unigram", "bpe"])
def test_a_tags_string_in_text_is_text_and_other_text_keeps_its_ids(tmp_path, model_type):
    """A tag is put before a source by id; the same string inside a sentence (or a special
    piece's) is segmented as text, and text without one gets SentencePiece's own ids."""
    src, tgt = toy_pairs(300, seed=8)
    cfg = TokenizerConfig(vocab_size=400, byte_fallback=True, model_type=model_type)
    tokenizer = train_tokenizer(cfg, src + tgt + TAGGED_TEXT, tmp_path, symbols=TAGS)
    tag_ids = {tokenizer.sp.piece_to_id(tag) for tag in TAGS}
    assert tokenizer.sp.unk_id() not in tag_ids and len(tag_ids) == 3
    encoded = tokenizer.encode(TAGGED_TEXT)
    for line, ids in zip(TAGGED_TEXT, encoded, strict=True):
        assert not set(ids) & (tag_ids | {PAD_ID, UNK_ID, BOS_ID, EOS_ID}), line
    assert tokenizer.decode(encoded) == TAGGED_TEXT  # the text comes back whole
    assert tokenizer.encode(src) == tokenizer.sp.encode(src)  # untagged text: ids unchanged
    assert tokenizer.sample(src, 0.1, seed=3) == tokenizer.sample(src, 0.1, seed=3)
    spm.set_random_generator_seed(3)
    plain_sample = tokenizer.sp.encode(
        src, out_type=int, enable_sampling=True, alpha=0.1, nbest_size=-1, num_threads=1
    )
    assert tokenizer.sample(src, 0.1, seed=3) == plain_sample
    assert not set().union(*tokenizer.sample(TAGGED_TEXT, 0.1, seed=3)) & tag_ids
    # What an export writes encodes so too, and is the model itself when it has no tags.
    exported = spm.SentencePieceProcessor(model_proto=tokenizer.text_model)
    assert exported.encode(TAGGED_TEXT) == encoded
    plain = train_tokenizer(cfg, src + tgt, tmp_path)
    assert plain.text_model == plain.model_bytes
