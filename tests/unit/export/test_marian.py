"""`attn-mt import` against transformers itself: MarianMT folders built here with transformers'
own classes (`bench/marian.py`: the OPUS-MT, tc-big and multilingual layouts, tiny), imported,
must translate as `MarianMTModel.generate` does, token for token, greedy and beam; every flag
attn-mt cannot represent, and every damaged folder, is one line and writes nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import attn_mt
from attn_mt.errors import UserError
from attn_mt.export.marian import import_marian
from bench.marian import build_folder
from bench.marian_data import read_lines

pytest.importorskip("transformers")  # the [hf] extra: installed by `make test` (dev extras)
pytestmark = pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses")


def generate_pieces(folder: Path, lines: list[str], beam: int) -> list[list[str]]:
    """What `MarianMTModel.generate` makes of each line with the folder's own generation
    config, as piece strings (labels as attn-mt's tags)."""
    from transformers import MarianMTModel, MarianTokenizer

    tokenizer = MarianTokenizer.from_pretrained(folder)
    model = MarianMTModel.from_pretrained(folder).eval()
    vocab_file = folder / "target_vocab.json"
    vocab = json.loads((vocab_file if vocab_file.exists() else folder / "vocab.json").read_text())
    piece = {i: p for p, i in vocab.items()}
    outputs = []
    for line in lines:
        with torch.no_grad():
            ids = model.generate(**tokenizer([line], return_tensors="pt"), num_beams=beam)[0]
        special = (tokenizer.pad_token_id, tokenizer.eos_token_id)
        outputs.append([piece[i] for i in ids.tolist()[1:] if i not in special])
    return outputs


def attn_mt_pieces(run: Path, lines: list[str], beam: int, **options) -> list[list[str]]:
    """attn-mt's best output of each line, as piece strings."""
    translator = attn_mt.load(run, device="cpu", prepack=False)
    found = translator.translate_nbest(lines, beam=beam, **options)
    return [translator.tgt_tokenizer.pieces(best.tokens) for best, *_ in found]


def with_max_length(folder: Path, max_length: int) -> Path:
    """The folder with generation_config.json's max_length set (untrained models run to it)."""
    path = folder / "generation_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "max_length": max_length}))
    return folder


@pytest.fixture(scope="module")
def opus(tmp_path_factory) -> Path:
    """A tiny folder of opus-mt-de-en's layout, untrained, whose </s> bias ends its outputs at
    varied lengths (some empty, some at the limit): beams of several lengths compete."""
    folder = build_folder(tmp_path_factory.mktemp("opus") / "opus-mt-de-en", small=True, eos_bias=4)
    return with_max_length(folder, 24)


@pytest.fixture(scope="module")
def imported(opus: Path, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("runs") / "opus"
    import_marian(opus, run)
    return run


@pytest.mark.parametrize("beam", [1, 4, 5])
def test_an_imported_model_translates_as_generate(opus: Path, imported: Path, beam: int):
    lines = read_lines("de", "test_2016_flickr", 8)
    assert attn_mt_pieces(imported, lines, beam) == generate_pieces(opus, lines, beam)


def test_the_generation_config_becomes_the_runs_decode_settings(imported: Path):
    config = attn_mt.load(imported, device="cpu").config
    assert config.decode.beam == 4  # num_beams
    assert (config.decode.length_penalty_kind, config.decode.end_at_limit) == ("plain", "free")
    assert (config.decode.max_len_a, config.decode.max_len_b) == (0.0, 23)  # max_length 24
    assert (config.data.src_lang, config.data.tgt_lang) == ("de", "en")
    assert config.model.activation == "swish" and config.model.output_bias


def test_separate_vocabularies_translate_as_generate(tmp_path: Path):
    folder = with_max_length(build_folder(tmp_path / "tc", "tc-big", small=True), 16)
    import_marian(folder, tmp_path / "run")
    config = attn_mt.load(tmp_path / "run", device="cpu").config
    assert not config.tokenizer.joint and config.model.activation == "relu"
    lines = read_lines("cs", "test_2016_flickr", 4)
    for beam in (1, 4):
        assert attn_mt_pieces(tmp_path / "run", lines, beam) == generate_pieces(folder, lines, beam)


def test_a_multilingual_models_labels_are_its_target_languages(tmp_path: Path):
    folder = with_max_length(build_folder(tmp_path / "mul", "multilingual", small=True), 16)
    import_marian(folder, tmp_path / "run")
    translator = attn_mt.load(tmp_path / "run", device="cpu")
    assert sorted(translator.target_languages) == ["ces", "deu", "fra"]
    lines = read_lines("en", "test_2016_flickr", 3)
    ours = attn_mt_pieces(tmp_path / "run", lines, 4, tgt_lang="fra")
    assert ours == generate_pieces(folder, [f">>fra<< {line}" for line in lines], 4)
    with pytest.raises(UserError, match="needs the language to translate into"):
        translator.translate(lines[:1])


def test_an_export_imported_back_is_the_same_model(imported: Path, tmp_path: Path):
    from attn_mt.export.hf import to_transformers, write_tokenizer  # export_hf, unchecked

    translator = attn_mt.load(imported, device="cpu", prepack=False)
    to_transformers(translator).save_pretrained(tmp_path / "hf")
    write_tokenizer(translator, tmp_path / "hf")
    import_marian(tmp_path / "hf", tmp_path / "back")
    before = torch.load(imported / "checkpoints" / "best.pt", weights_only=True)
    after = torch.load(tmp_path / "back" / "checkpoints" / "best.pt", weights_only=True)
    assert before["model"].keys() == after["model"].keys()
    assert all(torch.equal(before["model"][k], after["model"][k]) for k in before["model"])
    assert before["config"]["decode"] == after["config"]["decode"]


REFUSED = [
    ("model_type", "bart", "model_type 'bart'"),
    ("activation_function", "gelu_new", "activation_function 'gelu_new'"),
    ("normalize_before", True, "normalize_before true"),
    ("scale_embedding", False, "scale_embedding false"),
    ("static_position_embeddings", False, "static_position_embeddings false"),
    ("tie_word_embeddings", False, "tie_word_embeddings false"),
    ("encoder_layerdrop", 0.1, "encoder_layerdrop 0.1"),
    ("decoder_attention_heads", 2, "decoder_attention_heads 2"),
]


@pytest.mark.parametrize(("key", "value", "said"), REFUSED, ids=[r[0] for r in REFUSED])
def test_what_attn_mt_cannot_hold_is_refused_by_name(opus, tmp_path, key, value, said):
    folder = copy_folder(opus, tmp_path / "edited")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, key: value}))
    with pytest.raises(UserError, match=said):
        import_marian(folder, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def copy_folder(folder: Path, to: Path) -> Path:
    to.mkdir()
    for path in folder.iterdir():
        (to / path.name).write_bytes(path.read_bytes())
    return to


def test_damaged_folders_are_one_line_and_write_nothing(opus: Path, tmp_path: Path):
    run = tmp_path / "run"
    with pytest.raises(UserError, match="not a folder"):
        import_marian(tmp_path / "missing", run)
    folder = copy_folder(opus, tmp_path / "truncated")
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(UserError, match="truncated or damaged"):
        import_marian(folder, run)
    folder = copy_folder(opus, tmp_path / "small-vocab")
    vocab = json.loads((folder / "vocab.json").read_text())
    fewer = {p: i for p, i in vocab.items() if i < len(vocab) - 2} | {"<pad>": len(vocab) - 2}
    (folder / "vocab.json").write_text(json.dumps(fewer))
    with pytest.raises(UserError, match="does not match the weights"):
        import_marian(folder, run)
    folder = copy_folder(opus, tmp_path / "no-spm")
    (folder / "source.spm").unlink()
    with pytest.raises(UserError, match="no source.spm"):
        import_marian(folder, run)
    assert not run.exists()


def test_pytorch_model_bin_imports_as_safetensors(tmp_path: Path, imported: Path, opus: Path):
    from safetensors.torch import load_file

    folder = copy_folder(opus, tmp_path / "bin")
    state = load_file(folder / "model.safetensors")
    (folder / "model.safetensors").unlink()
    torch.save({k: v.half() for k, v in state.items()}, folder / "pytorch_model.bin")  # float16
    import_marian(folder, tmp_path / "run")
    ours = torch.load(tmp_path / "run" / "checkpoints" / "best.pt", weights_only=True)["model"]
    reference = torch.load(imported / "checkpoints" / "best.pt", weights_only=True)["model"]
    assert all(torch.allclose(ours[k], reference[k], atol=1e-2) for k in reference)
