"""Multilingual data: the config's directions and their mistakes, the target-language tags (one
piece each, before every source), the language-balanced SentencePiece sample, and temperature
sampling of the corpora (shares p ~ n^(1/T))."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers.multilingual import multilingual_files, multilingual_raw, toy_raw
from helpers.toy import write_lines

from attn_mt.config.data import TrainCorpus
from attn_mt.config.file import config_from_dict
from attn_mt.data.epochs import ShardBatches
from attn_mt.data.prepare import language_sample, prepare_shards
from attn_mt.data.shards import Shards, TokenView, temperature_weights
from attn_mt.errors import ConfigError, DataError


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return multilingual_files(tmp_path_factory.mktemp("multilingual"))


# ---------------------------------------------------------------------------------------------
# The config


def test_pairs_of_a_named_corpus_give_directions_tags_and_one_corpus_each():
    cfg = config_from_dict({"data": {"dataset": "multi30k", "pairs": ["de-en", "en-de", "fr-en"]}})
    assert cfg.data.directions() == [("de", "en"), ("en", "de"), ("fr", "en")]
    assert cfg.data.target_languages() == ["en", "de"]
    assert cfg.data.language_tags() and cfg.data.tags() == ["<2en>", "<2de>"]
    assert cfg.data.weights() == [1.0, 1.0, 1.0]
    assert cfg.data.languages() == ["de", "en", "fr"]
    assert cfg.data.in_words() == "de-en, en-de, fr-en (3 directions)"


def test_a_bilingual_config_has_no_language_tag(tmp_path):
    cfg = config_from_dict(toy_raw(tmp_path))
    assert cfg.data.directions() == [("xx", "yy")] and not cfg.data.language_tags()
    assert cfg.data.tags() == [] and cfg.data.weights() == [1.0]
    assert cfg.data.languages() == ["xx", "yy"] and cfg.data.in_words() == "xx -> yy"


def test_many_to_one_needs_no_tag(files, tmp_path):
    """A tag is needed only when the model has more than one target language."""
    raw = multilingual_raw(files, tmp_path, pairs=("de-en", "fr-en"))
    cfg = config_from_dict(raw)
    assert cfg.data.directions() == [("de", "en"), ("fr", "en")]
    assert not cfg.data.language_tags() and cfg.data.tags() == []
    assert cfg.data.languages() == ["de", "en", "fr"]
    assert cfg.data.in_words() == "de-en, fr-en (2 directions)"


MISTAKES = [
    ({"dataset": "multi30k", "pairs": ["de-xx"]}, "data.pairs[0]", "languages de, en, fr, cs"),
    ({"dataset": "multi30k", "pairs": ["de-de"]}, "data.pairs[0]", "two different languages"),
    ({"dataset": "multi30k", "pairs": ["de-en", "de-en"]}, "data.pairs", "twice"),
    ({"pairs": ["de-en"]}, "data.pairs[0]", "named corpus"),
    ({"dataset": "multi30k", "pairs": ["de-en"], "temperature": 0}, "data.temperature", "> 0"),
    ({"dataset": "multi30k", "temperature": -1}, "data.temperature", "> 0"),
    ({"dataset": "multi30k", "pairs": "de-en"}, "data.pairs", "expected list"),
]


@pytest.mark.parametrize(("data", "key", "fragment"), MISTAKES)
def test_a_pairs_mistake_is_one_line_naming_the_key(data, key, fragment):
    with pytest.raises(ConfigError) as err:
        config_from_dict({"data": data})
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"{key}:") and fragment in message


def test_file_entries_give_both_languages_everywhere_or_nowhere(files, tmp_path):
    raw = multilingual_raw(files, tmp_path)
    del raw["data"]["train"][0]["tgt_lang"]
    with pytest.raises(ConfigError, match=r"^data.train: an entry .* needs src_lang and tgt_lang"):
        config_from_dict(raw)
    raw = multilingual_raw(files, tmp_path)
    for entry in raw["data"]["valid"]:
        del entry["src_lang"], entry["tgt_lang"]
    with pytest.raises(ConfigError, match="on every entry, or on none"):
        config_from_dict(raw)
    raw = multilingual_raw(files, tmp_path)
    raw["data"]["valid"] = raw["data"]["valid"][0] | {}
    del raw["data"]["valid"]["src_lang"], raw["data"]["valid"]["tgt_lang"]
    with pytest.raises(ConfigError, match="^data.valid: a multilingual data.train needs"):
        config_from_dict(raw)
    raw = multilingual_raw(files, tmp_path)
    raw["tokenizer"]["joint"] = False
    with pytest.raises(ConfigError, match="^tokenizer.joint: .* one joint vocabulary"):
        config_from_dict(raw)


# ---------------------------------------------------------------------------------------------
# Tags and the joint vocabulary


def test_every_source_starts_with_its_tag_and_a_tags_string_in_text_is_text(files, tmp_path):
    """The tag goes before each source by id; "<2fr>" inside a training sentence is text, as
    in translation (`Tokenizer.encode`), never the tag that would steer the model."""
    files = dict(files)
    de = files["train.de"].read_text().splitlines()
    tagged = range(0, len(de), 97)
    for index in tagged:
        de[index] = f"{de[index]} <2fr> qb<2en>"
    files["train.de"] = write_lines(tmp_path / "train.de", de)
    raw = multilingual_raw(files, tmp_path / "run")
    raw["data"]["prepared_dir"] = str(tmp_path / "prepared")
    cfg = config_from_dict(raw)
    shards = prepare_shards(cfg, workers=1)
    src_tok, tgt_tok = shards.tokenizers()
    assert src_tok is tgt_tok  # one joint model
    tags = {lang: src_tok.sp.piece_to_id(f"<2{lang}>") for lang in ("en", "fr")}
    assert src_tok.sp.unk_id() not in tags.values() and len(set(tags.values())) == 2
    for lang, tag in tags.items():  # text, whatever the text around it
        for text in (f"<2{lang}>", f"qb<2{lang}>qc", f"qb <2{lang}> qc"):
            assert tag not in src_tok.encode([text])[0], text
    encoded = src_tok.encode(de)
    for corpus, lang in enumerate(("en", "fr")):
        for index in tagged:
            row = corpus * len(de) + index
            assert int(shards.corpus[row]) == corpus
            assert shards.src[row] == [tags[lang], *encoded[index]]  # the tag, then the text
            assert not set(encoded[index]) & set(tags.values())
            assert tags["en"] not in shards.tgt[row] and tags["fr"] not in shards.tgt[row]
    assert set(shards.corpus.tolist()) == {0, 1} and len(shards) == 6000


def test_tokenizer_sample_is_balanced_between_languages(tmp_path):
    big = write_lines(tmp_path / "big.de", [f"qb {i}" for i in range(5000)])
    big_en = write_lines(tmp_path / "big.en", [f"Ba {i}" for i in range(5000)])
    small = write_lines(tmp_path / "small.fr", [f"bo {i}" for i in range(300)])
    small_en = write_lines(tmp_path / "small.en", [f"Ba s{i}" for i in range(300)])
    corpora = [
        TrainCorpus(src=str(big), tgt=str(big_en), src_lang="de", tgt_lang="en"),
        TrainCorpus(src=str(small), tgt=str(small_en), src_lang="fr", tgt_lang="en"),
        TrainCorpus(src=str(big_en), tgt=str(big), src_lang="en", tgt_lang="de"),  # same files
    ]
    lines = language_sample(corpora, 1500)
    counts = {word: sum(line.split()[0] == word for line in lines) for word in ("qb", "Ba", "bo")}
    assert counts == {"qb": 500, "Ba": 500, "bo": 300}  # fr has only 300; en read from 2 files
    assert lines == language_sample(corpora, 1500)  # seeded
    assert len(set(lines)) == len(lines)  # without repeats: a file shared by corpora once


# ---------------------------------------------------------------------------------------------
# Temperature sampling


def fake_shards(counts: list[int]) -> Shards:
    """Shards of `counts` pairs per corpus, every pair 3 tokens a side (batching needs only
    the lengths and the corpus of each pair)."""
    total = sum(counts)
    view = TokenView(np.zeros(3 * total, dtype=np.int64), np.arange(0, 3 * total + 1, 3))
    corpus = np.repeat(np.arange(len(counts)), counts).astype(np.int16)
    lengths = np.full((total, 2), 3)
    return Shards(Path("/none"), {}, view, view, lengths, corpus)


@pytest.mark.parametrize("temperature", [1.0, 1.5, 2.0, 5.0, 100.0])
def test_temperature_shares_follow_n_to_the_one_over_t(temperature):
    counts = [20_000, 3_000, 400]
    shards = fake_shards(counts)
    weights = temperature_weights([1.0] * 3, counts, temperature)
    source = ShardBatches(shards, weights, batch_tokens=512, seed=1)
    drawn = np.zeros(3)
    seen_small = np.zeros(counts[2])
    for epoch in range(60):
        rows = source.epoch_rows(epoch)
        drawn += np.bincount(shards.corpus[rows], minlength=3)
        small = rows[shards.corpus[rows] == 2] - sum(counts[:2])
        seen_small += np.bincount(small, minlength=counts[2])
    expected = np.array(counts, dtype=float) ** (1 / temperature)
    expected /= expected.sum()
    shares = drawn / drawn.sum()
    assert np.allclose(shares, expected, rtol=0.01), (shares, expected)
    assert abs(drawn.sum() / 60 - sum(counts)) <= 0.01 * sum(counts)  # an epoch keeps its size
    if temperature == 1.0:
        assert weights == [1.0, 1.0, 1.0]  # by size: the mix is left as it is
    # Every pair of an up-sampled corpus is drawn about equally often over the epochs.
    assert seen_small.min() >= 0.5 * seen_small.mean()


def test_temperature_keeps_user_weights_as_sizes():
    """weight x pairs is a corpus's size, which the temperature then flattens."""
    flat = temperature_weights([2.0, 1.0], [100, 200], 1e9)  # T -> inf: equal shares
    sizes = np.array(flat) * [100, 200]
    assert sizes[0] == pytest.approx(sizes[1]) and sizes.sum() == pytest.approx(400)


@pytest.mark.parametrize("temperature", [1e-3, 1e-300])
def test_a_tiny_temperature_is_computed_in_log_space(temperature):
    """n^(1/T) overflows float64 for a small T: equal corpora keep equal shares, and a mix
    that leaves a corpus no pair per epoch is refused in one line naming the key."""
    assert temperature_weights([1.0, 2.0], [400, 200], temperature) == [1.0, 2.0]
    with pytest.raises(DataError, match=r"data.temperature: .* corpus 2 \(300 pairs\) no pair"):
        temperature_weights([1.0, 1.0], [20_000, 300], temperature)


def test_one_pair_of_a_named_corpus_is_a_bilingual_model_of_that_pair():
    """data.pairs: [fr-cs] validates and evaluates fr-cs, not data.src_lang/tgt_lang's pair."""
    from attn_mt.data.corpora import split_files, train_corpora

    cfg = config_from_dict({"data": {"dataset": "multi30k", "pairs": ["fr-cs"]}})
    assert not cfg.data.language_tags() and cfg.data.target_languages() == ["cs"]
    assert [p.name for p in split_files(cfg.data, "valid")] == ["val.fr.gz", "val.cs.gz"]
    assert [p.name for p in split_files(cfg.data, "test")] == [
        "test_2016_flickr.fr.gz",
        "test_2016_flickr.cs.gz",
    ]
    assert cfg.data.in_words() == "fr -> cs"
    [corpus] = train_corpora(cfg.data)
    assert (Path(corpus.src).name, Path(corpus.tgt).name) == ("train.fr.gz", "train.cs.gz")
