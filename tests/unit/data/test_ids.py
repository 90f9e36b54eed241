"""The ids of a line, one rule (`attn_mt.data.ids`): a run's validation loss reads, line for
line, the ids its validation search reads (stripped, cut to decode.max_input_len or the model's
positions, tagged as `Translator.encode` makes them); forced decoding reads validation's
reference ids; and the training shards lead every source with the tag translation puts there."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers.multilingual import multilingual_files, multilingual_raw
from helpers.toy import toy_config_dict, write_lines

from attn_mt.config.file import config_from_dict
from attn_mt.config.schema import Config
from attn_mt.data.corpus import Corpus, training_data
from attn_mt.data.text import read_lines
from attn_mt.data.tokenizer import Tokenizer
from attn_mt.decode.forced import score_lines
from attn_mt.decode.translator import Translator
from attn_mt.distributed import World
from attn_mt.model.transformer import build_model
from attn_mt.train import measure

MAX_INPUT = 12  # decode.max_input_len here: the long line below is cut


def awkward(lines: list[str]) -> list[str]:
    """`lines` with spaces around the first, the second repeated past MAX_INPUT pieces, the
    third blank and Unicode spaces around the fourth: each read the same by loss and search."""
    lines = list(lines)
    lines[0] = f"  {lines[0]} \t"
    lines[1] = " ".join([lines[1]] * 10)
    lines[2] = " "
    lines[3] = f"\u3000{lines[3]}\u00a0"
    return lines


def translator_of(cfg: Config, src_tok: Tokenizer, tgt_tok: Tokenizer) -> Translator:
    """The Translator a run validates with (`train.validate.translator_of`): its config's model."""
    torch.manual_seed(0)
    return Translator(
        build_model(cfg, src_tok.vocab_size, tgt_tok.vocab_size), cfg, src_tok, tgt_tok
    )


def validated_ids(
    translator: Translator, corpus: Corpus, monkeypatch: pytest.MonkeyPatch
) -> tuple[dict[tuple[str | None, str], list[int]], dict[tuple[str | None, str], list[int]]]:
    """(loss, search): the source ids of each validation line, keyed by (target language, line),
    as a real validation reads them: teacher forcing's batches and the search's `encode`."""
    loss: dict[tuple[str | None, str], list[int]] = {}
    search: dict[tuple[str | None, str], list[int]] = {}
    collate, encode = measure.collate, Translator.encode

    def loss_batch(src_ids, tgt_ids, rows):
        part = next(c for c in [corpus, *corpus.pairs.values()] if c.valid_src_ids is src_ids)
        for row in rows:
            loss[(part.valid_tgt_lang, part.valid_src[row])] = src_ids[row]
        return collate(src_ids, tgt_ids, rows)

    def search_lines(self, lines, tgt_lang=None, *args, **kwargs):
        ids = encode(self, lines, tgt_lang, *args, **kwargs)
        search.update({(tgt_lang, line): seq for line, seq in zip(lines, ids, strict=True)})
        return ids

    monkeypatch.setattr(measure, "collate", loss_batch)
    monkeypatch.setattr(Translator, "encode", search_lines)
    validate = measure.validate_directions if corpus.pairs else measure.validate
    with pytest.warns(UserWarning, match="truncated to"):  # the long line, by the search
        assert validate(translator, corpus, translator.config.train, lambda *_: None, World())
    return loss, search


@pytest.mark.parametrize("positions", ["sinusoidal", "learned"])
def test_validation_loss_reads_the_ids_its_search_reads(
    toy_data, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, positions: str
) -> None:
    """Learned positions (24 of them) cut a source at 23 pieces, below decode.max_input_len."""
    raw = toy_config_dict(toy_data, tmp_path / "run")
    src = awkward(read_lines(toy_data["valid.src"]))[:20]
    tgt = read_lines(toy_data["valid.tgt"])[:20]
    tgt[0] = f" {tgt[0]}  "
    raw["data"]["valid"] = {
        "src": str(write_lines(tmp_path / "valid.src", src)),
        "tgt": str(write_lines(tmp_path / "valid.tgt", tgt)),
    }
    raw["data"]["prepared_dir"] = str(tmp_path / "prepared")
    if positions == "learned":
        raw["model"].update(positions="learned", max_positions=24)
    else:
        raw["decode"]["max_input_len"] = MAX_INPUT
    cfg = config_from_dict(raw)
    src_tok, tgt_tok, corpus = training_data(cfg, None, World())
    translator = translator_of(cfg, src_tok, tgt_tok)
    limit = MAX_INPUT if positions == "sinusoidal" else 23
    assert translator.max_input_len == limit
    encoded = translator.encode(corpus.valid_src, warn=False)
    assert corpus.valid_src_ids == encoded
    assert encoded[0] == src_tok.encode([src[0].strip()])[0][:limit] and encoded[2] == []
    assert len(src_tok.encode([src[1]])[0]) > limit and len(encoded[1]) == limit
    assert corpus.valid_tgt_ids[0] == tgt_tok.encode([tgt[0].strip()])[0]
    loss, search = validated_ids(translator, corpus, monkeypatch)
    lines = [(None, line) for line in corpus.valid_src]
    assert [loss[k] for k in lines] == [search[k] for k in lines] == corpus.valid_src_ids


def test_a_multilingual_run_reads_every_direction_as_translation_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each direction's validation ids are `Translator.encode`'s for its target language (the
    tag, then the cut line); its references are the ones forced decoding reads; and every
    training source in the shards is led by the tag translation puts before it."""
    files = multilingual_files(tmp_path)
    files["valid.de"] = write_lines(tmp_path / "valid.de", awkward(read_lines(files["valid.de"])))
    raw = multilingual_raw(files, tmp_path / "run")
    raw["data"]["prepared_dir"] = str(tmp_path / "prepared")
    raw["decode"]["max_input_len"] = MAX_INPUT
    cfg = config_from_dict(raw)
    src_tok, tgt_tok, corpus = training_data(cfg, None, World())
    translator = translator_of(cfg, src_tok, tgt_tok)
    assert list(corpus.pairs) == ["de-en", "de-fr"]
    for pair, direction in corpus.pairs.items():
        lang = pair.split("-")[1]
        tag = src_tok.sp.piece_to_id(f"<2{lang}>")
        encoded = translator.encode(direction.valid_src, lang, warn=False)
        assert direction.valid_src_ids == encoded and direction.valid_tgt_lang == lang
        assert encoded[0][0] == tag and encoded[2] == [] and len(encoded[1]) == MAX_INPUT
        with pytest.warns(UserWarning, match="truncated to"):  # the sources, as translate's
            forced = score_lines(
                translator, direction.valid_src, direction.valid_ref, tgt_lang=lang
            )
        assert [s.pieces[:-1] for s in forced] == [
            tgt_tok.pieces(ids) for ids in direction.valid_tgt_ids
        ]
    assert corpus.valid_src_ids == [i for d in corpus.pairs.values() for i in d.valid_src_ids]
    loss, search = validated_ids(translator, corpus, monkeypatch)
    lines = [(d.valid_tgt_lang, line) for d in corpus.pairs.values() for line in d.valid_src]
    assert [loss[k] for k in lines] == [search[k] for k in lines] == corpus.valid_src_ids
    # The training shards: the tag, then the text (cut here to MAX_INPUT as translation cuts
    # it; the shards keep every piece), as translation reads the same line.
    shards, train = corpus.shards, read_lines(files["train.de"])
    assert len(shards) == 2 * len(train)
    monkeypatch.undo()
    for index, lang in enumerate(("en", "fr")):
        rows = range(index * len(train), (index + 1) * len(train))
        shard_ids = [shards.src[row][:MAX_INPUT] for row in rows]
        assert shard_ids == translator.encode(train, lang, warn=False)
