"""`attn-mt export --format hf`: the transformers folder translates as the checkpoint does.

Random models of each exportable kind (pre-norm -> Pegasus, post-norm -> Marian with separate
vocabularies), every weight perturbed from its init, pass the export's own parity check
(greedy and beam `generate()` token for token, log-probabilities) and load back with the
tokenizer giving our ids on random text; the trained toy model's folder is loaded in a fresh
offline process, as a user would, and translates text as `translate --beam 1`; refusals
leave nothing behind.
"""

from __future__ import annotations

import json
import logging
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers.clirun import child_env
from helpers.models import random_checkpoint
from helpers.toy import toy_pairs
from typer.testing import CliRunner

import attn_mt
from attn_mt.cli import app
from attn_mt.errors import UserError
from attn_mt.export.common import longest_output
from attn_mt.export.hf import export_hf, model_permutation
from attn_mt.export.hf_parity import LOGPROB_TOLERANCE
from attn_mt.model.positions import sinusoidal_table
from attn_mt.model.vocab import EOS_ID

transformers = pytest.importorskip("transformers")

VARIANTS = {
    "pre-norm (Pegasus)": (dict(dropout=0.2), "PegasusForConditionalGeneration"),
    "post-norm gelu, separate vocabularies, untied (Marian)": (
        dict(
            norm="post",
            activation="gelu",
            joint=False,
            tie_embeddings=False,
            dropout=0.2,
            activation_dropout=0,
        ),
        "MarianMTModel",
    ),
}


@pytest.fixture
def quick_parity(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """The export's parity check on 4 sources instead of 12 (an untrained model's outputs run
    to the length limit, which makes every source slow)."""
    from attn_mt.export import hf_parity

    monkeypatch.setattr(hf_parity, "PARITY_SOURCES", 4)
    return monkeypatch


def load_folder(folder: Path):
    return (
        transformers.AutoModelForSeq2SeqLM.from_pretrained(folder, local_files_only=True),
        transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True),
    )


def random_text(seed: int, count: int = 40) -> list[str]:
    """Lines of random characters: ASCII, Latin accents, Cyrillic, CJK, emoji, odd spaces."""
    rng = random.Random(seed)
    alphabet = "abcxyz ABC qbqcqd.,!?'-0123456789 äöüßéñ Жизнь 東京語 🙂👍 \t  ▁<>/s"
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30))) for _ in range(count)]


@pytest.mark.parametrize("variant", VARIANTS.values(), ids=VARIANTS.keys())
def test_random_model_generates_as_attn_mt(variant, tmp_path: Path, toy_data, quick_parity):
    settings, cls = variant
    checkpoint = random_checkpoint(tmp_path, toy_data, **settings)
    parity = export_hf(checkpoint, tmp_path / "hf", decode={"beam": 3, "length_penalty": 0.6})
    assert parity.ok and parity.max_logprob_diff <= LOGPROB_TOLERANCE
    generation = json.loads((tmp_path / "hf" / "generation_config.json").read_text())
    assert (generation["num_beams"], generation["length_penalty"]) == (3, 0.6)
    names = {p.name for p in (tmp_path / "hf").iterdir()}
    assert {"config.json", "model.safetensors", "generation_config.json", "README.md"} <= names
    assert {"source.spm", "target.spm", "vocab.json", "tokenizer_config.json"} <= names
    modes = {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "hf").iterdir()}
    assert modes["model.safetensors"] == modes["config.json"]  # no file kept private
    card = (tmp_path / "hf" / "README.md").read_text()
    assert str(parity) in card  # the card carries the agreement the export measured
    assert "SplitFiles(" not in card and "train.src / train.tgt" in card
    model, tokenizer = load_folder(tmp_path / "hf")
    assert type(model).__name__ == cls
    dropouts = settings.get("activation_dropout", 0.2), 0.2  # as trained, for fine-tuning
    assert (model.config.activation_dropout, model.config.dropout) == dropouts
    translator = attn_mt.load(checkpoint, device="cpu")
    lines = random_text(1)
    ids = tokenizer(lines)["input_ids"]
    assert ids == [seq + [EOS_ID] for seq in translator.src_tokenizer.encode(lines)]
    targets = tokenizer(text_target=lines)["input_ids"]
    assert targets == [seq + [EOS_ID] for seq in translator.tgt_tokenizer.encode(lines)]


def test_permutation_maps_our_positions_onto_transformers_table():
    """Our interleaved table, columns permuted, is the sin-half/cos-half one of Marian and
    Pegasus, so one permutation of the model dimension makes the two models equal."""
    d_model, rows = 16, 50
    config = transformers.MarianConfig(d_model=d_model, max_position_embeddings=rows)
    theirs = transformers.MarianMTModel(config).model.encoder.embed_positions.create_weight()
    ours = sinusoidal_table(rows, d_model)[:, model_permutation(d_model)]
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6)
    assert sorted(model_permutation(d_model).tolist()) == list(range(d_model))


def test_trained_model_round_trip_offline(trained_run: Path, tmp_path: Path, toy_data, caplog):
    """A fresh process, offline, runs the model card's example as written and gets what
    `translate --beam 1` gives; the export says what it is doing as it goes."""
    folder = tmp_path / "hf"
    with caplog.at_level(logging.INFO, logger="attn_mt"):
        result = CliRunner().invoke(
            app, ["export", "--format", "hf", "--model", str(trained_run), "--out", str(folder),
                  "--beam", "1", "--length-penalty", "0.6"]
        )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert [r.getMessage() for r in caplog.records if r.getMessage().startswith("export: ")] == [
        "export: importing transformers ...",
        "export: writing PegasusForConditionalGeneration weights and tokenizer files ...",
        "export: checking the folder against attn-mt on 12 sources ...",
    ]
    assert "greedy 12/12" in result.output and "tokenizer ids identical" in result.output
    # greedy with a length penalty: the penalty has no effect and transformers would refuse it
    assert json.loads((folder / "generation_config.json").read_text())["num_beams"] == 1
    lines = toy_pairs(5, seed=11)[0]
    card = (folder / "README.md").read_text()
    code = card.split("```python\n")[1].split("```")[0]
    code = code.replace('["your sentence here"]', repr(lines))
    env = child_env(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=tmp_path,  # the card names the folder, not this machine's path to it
    )
    assert done.returncode == 0, done.stderr
    # transformers has one max_length for every sentence (generation_config.json), attn-mt a
    # limit per sentence (the card says so): compared under the one limit the export wrote,
    # so a toy output that reaches attn-mt's shorter per-sentence limit cannot tell them apart.
    translator = attn_mt.load(trained_run, device="cpu")
    limit = longest_output(translator.config.decode, translator.model.max_positions)
    assert json.loads((folder / "generation_config.json").read_text())["max_length"] == limit + 1
    same_limit = {"max_len_a": 0.0, "max_len_b": limit}
    expected = attn_mt.load(trained_run, device="cpu", decode=same_limit).translate(lines, beam=1)
    assert eval(done.stdout.strip().splitlines()[-1]) == expected
    assert "validation BLEU" in card


# ---------------------------------------------------------------------------------------------
# Refusals


REFUSED = {
    "additive attention": (dict(attention="additive"), r"model\.attention: 'additive'"),
    "learned positions": (dict(positions="learned"), r"model\.positions: 'learned'"),
    "pre-norm, separate vocabularies": (dict(joint=False), r"model\.norm 'pre' with separate"),
    "pre-norm, untied output": (dict(tie_embeddings=False), r"model\.norm 'pre' with separate"),
}


@pytest.mark.parametrize("variant", REFUSED.values(), ids=REFUSED.keys())
def test_unsupported_model_is_refused(variant, tmp_path: Path, toy_data):
    settings, message = variant
    checkpoint = random_checkpoint(tmp_path, toy_data, **settings)
    with pytest.raises(UserError, match=message) as refused:
        export_hf(checkpoint, tmp_path / "out" / "hf")
    assert "\n" not in str(refused.value)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_disagreeing_model_is_refused_and_nothing_written(tmp_path, toy_data, quick_parity):
    """One weight off in the map: the parity check refuses and no folder is left behind."""
    from attn_mt.export import hf as module

    checkpoint = random_checkpoint(tmp_path / "run", toy_data)
    mapped = module.hf_weights

    def damaged(model):
        weights = mapped(model)
        # One element: a shift of every element would pass, the next layer norm removes it.
        weights["model.decoder.layers.0.fc2.bias"][0] += 0.5
        return weights

    quick_parity.setattr(module, "hf_weights", damaged)
    with pytest.raises(UserError, match="disagrees with attn-mt .*nothing written"):
        export_hf(checkpoint, tmp_path / "new" / "folders" / "hf")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # nor the parents it made


def test_damaged_checkpoint_and_bad_options(tmp_path: Path, monkeypatch):
    damaged = tmp_path / "damaged.pt"
    damaged.write_bytes(b"not a checkpoint")
    runner = CliRunner()
    result = runner.invoke(
        app, ["export", "--format", "hf", "--model", str(damaged), "--out", str(tmp_path / "a")]
    )
    assert isinstance(result.exception, UserError) and "\n" not in str(result.exception)
    result = runner.invoke(
        app, ["export", "--model", str(damaged), "--out", "x", "--format", "onnx"]
    )
    assert result.exit_code == 2 and "'ct2', 'hf'" in result.output
    result = runner.invoke(
        app, ["export", "--format", "hf", "--model", str(damaged), "--out",
              str(tmp_path / "b"), "--quantization", "int8"]
    )  # fmt: skip
    assert "--quantization int8: applies to --format ct2 only" in str(result.exception)
    monkeypatch.setitem(sys.modules, "transformers", None)  # as if not installed
    with pytest.raises(UserError, match=r"pip install 'attn-mt\[hf\]'"):
        export_hf(damaged, tmp_path / "c")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["damaged.pt"]
