"""`attn-mt import`: a transformers MarianMT folder (OPUS-MT's and the Tatoeba models' layouts)
read into an ordinary attn-mt run folder (`config.yaml`, `checkpoints/best.pt`) that translates
as `MarianMTModel.generate` does, token for token.

What is read: `config.json` (the shape; every flag attn-mt cannot represent is refused by name
before anything is written), `generation_config.json` (else config.json's own generation keys:
they become the run's `decode.*`), `vocab.json` (+ `target_vocab.json` for separate
vocabularies), `source.spm` and `target.spm` (`marian_vocab`), the weights (`marian_weights`),
`tokenizer_config.json` for the languages.

How MarianMT's `generate` becomes attn-mt's search settings: `num_beams` -> decode.beam;
`length_penalty` (1.0 by default) with the plain penalty len ** alpha (decode.length_penalty_kind
plain); `max_length` counts the decoder's start token and bounds every output alike
(decode.max_len_a 0, max_len_b max_length - 1); `forced_eos_token_id` -> decode.end_at_limit
free; `bad_words_ids` of `<pad>` alone (attn-mt never outputs it); `renormalize_logits` -> no
probability on `<pad>` (the output bias). MarianTokenizer's Moses punctuation normaliser is never
applied when it encodes (transformers 5), so attn-mt applies none either.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attn_mt.config.file import config_from_dict, save_config
from attn_mt.config.schema import Config
from attn_mt.errors import UserError, named
from attn_mt.export.common import check_out_dir, staged_folder
from attn_mt.export.marian_vocab import (
    VocabularyMap,
    labels,
    missing_pieces,
    read_vocab,
    rebuild_model,
    vocabulary_map,
)
from attn_mt.export.marian_weights import Weights, embedding_name

log = logging.getLogger("attn_mt")

ACTIVATIONS = {"swish": "swish", "silu": "swish", "relu": "relu", "gelu": "gelu"}
# config.json's model_type -> attn-mt's model.norm (Pegasus: attn-mt's pre-norm exports)
ARCHITECTURES = {"marian": "post", "pegasus": "pre"}
# config.json keys whose every value but the one given here is a model attn-mt cannot hold.
FIXED = {
    "scale_embedding": True,  # attn-mt scales embeddings by sqrt(D)
    "normalize_before": False,  # pre-norm layers (Marian's converter refuses them too)
    "normalize_embedding": False,  # a layer norm on the embeddings
    "add_final_layer_norm": False,
    "static_position_embeddings": True,  # learned positions
    "tie_word_embeddings": True,  # an output layer of its own
    "encoder_layerdrop": 0.0,
    "decoder_layerdrop": 0.0,
    "add_bias_logits": False,
}
# The model keys the weights themselves fix (the rest may come from an attn-mt export's config).
SHAPE_KEYS = ("d_model", "heads", "encoder_layers", "decoder_layers", "d_ff", "norm", "activation")
FOLDER_LANGUAGES = re.compile(r"opus-mt-(?:tc-big-|tc-)?([a-z]{2,3})-([a-z]{2,3})$")


@dataclass
class MarianFolder:
    """What a MarianMT folder holds, read and checked."""

    path: Path
    config: dict[str, Any]
    generation: dict[str, Any]
    vocabs: tuple[dict[str, int], dict[str, int]]  # source, target (the same for one vocab)
    spm: tuple[bytes, bytes]
    tokenizer: dict[str, Any] = field(default_factory=dict)

    @property
    def shared(self) -> bool:
        """One vocabulary (and embedding) for both sides."""
        return self.vocabs[0] is self.vocabs[1]


def read_folder(path: Path) -> MarianFolder:
    """The folder's files, each missing or unreadable one named in one line."""
    if not path.is_dir():
        raise UserError(f"{named(path)}: not a folder; give a MarianMT folder (config.json, ...)")
    config = _json(path / "config.json", required=True)
    if config.get("model_type") not in ARCHITECTURES:
        raise UserError(
            f"{named(path / 'config.json')}: model_type {config.get('model_type')!r}: attn-mt "
            "imports MarianMT models (model_type 'marian', or 'pegasus' as attn-mt exports "
            "its pre-norm models)"
        )
    generation = _json(path / "generation_config.json") or config  # else the legacy keys
    vocab = read_vocab(_file(path, "vocab.json"))
    target = path / "target_vocab.json"
    separate = config.get("share_encoder_decoder_embeddings") is False
    vocabs = (vocab, read_vocab(target) if separate else vocab)
    spm = (_file(path, "source.spm").read_bytes(), _file(path, "target.spm").read_bytes())
    tokenizer = _json(path / "tokenizer_config.json")
    return MarianFolder(path, config, generation, vocabs, spm, tokenizer)


def _file(folder: Path, name: str) -> Path:
    if not (folder / name).is_file():
        raise UserError(f"{named(folder)}: no {name}; not a MarianMT folder")
    return folder / name


def _json(path: Path, required: bool = False) -> dict[str, Any]:
    if not path.is_file():
        if required:
            raise UserError(f"{named(path.parent)}: no {path.name}; not a MarianMT folder")
        return {}
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise UserError(f"{named(path)}: unreadable ({err})") from None
    if not isinstance(found, dict):
        raise UserError(f"{named(path)}: not a JSON object")
    return found


def check_model(config: dict[str, Any]) -> None:
    """Refuse, naming the field, what attn-mt's Transformer cannot hold exactly."""
    where = "config.json"
    for key, wanted in FIXED.items():
        if key in config and config[key] is not None and config[key] != wanted:
            raise UserError(
                f"{where}: {key} {json.dumps(config[key])}: attn-mt holds only "
                f"{json.dumps(wanted)} (a model it cannot represent)"
            )
    activation = config.get("activation_function", "gelu")
    if activation not in ACTIVATIONS:
        raise UserError(
            f"{where}: activation_function {activation!r}: attn-mt knows "
            f"{', '.join(sorted(ACTIVATIONS))}"
        )
    for encoder, decoder in (
        ("encoder_attention_heads", "decoder_attention_heads"),
        ("encoder_ffn_dim", "decoder_ffn_dim"),
    ):
        if config.get(encoder) != config.get(decoder):
            raise UserError(
                f"{where}: {encoder} {config.get(encoder)} and {decoder} {config.get(decoder)} "
                "differ; attn-mt's encoder and decoder have one size"
            )
    if config.get("d_model", 0) % max(config.get("encoder_attention_heads", 1), 1):
        raise UserError(f"{where}: d_model is no multiple of encoder_attention_heads")


def decode_settings(generation: dict[str, Any], max_positions: int) -> dict[str, Any]:
    """The run's decode.* from the folder's generation settings (module docstring)."""
    pad = generation.get("pad_token_id")
    for bad in generation.get("bad_words_ids") or []:
        if bad != [pad]:
            raise UserError(
                f"generation_config.json: bad_words_ids {json.dumps(bad)}: attn-mt bans no "
                "pieces but <pad> (translate --avoid bans words)"
            )
    max_length = generation.get("max_length") or 20  # transformers' default
    if generation.get("max_new_tokens"):
        max_length = generation["max_new_tokens"] + 1
    for key, default in (("early_stopping", False), ("do_sample", False)):
        if generation.get(key, default) not in (default, None):
            log.warning(
                "import: generation_config.json's %s %s is not attn-mt's search (it searches "
                "as transformers' default, %s)",
                key,
                json.dumps(generation[key]),
                json.dumps(default),
            )
    return {
        "beam": int(generation.get("num_beams") or 1),
        "length_penalty": float(generation.get("length_penalty", 1.0)),
        "length_penalty_kind": "plain",
        "end_at_limit": "free" if generation.get("forced_eos_token_id") is not None else "scored",
        "max_len_a": 0.0,
        "max_len_b": max(int(max_length) - 1, 1),
        "max_input_len": max(max_positions - 1, 1),  # the source gets </s>
    }


def languages(folder: MarianFolder, src_lang: str | None, tgt_lang: str | None) -> dict[str, Any]:
    """The run's data.* languages: given, else tokenizer_config.json's, else the folder's
    name (opus-mt-de-en); a multilingual model's targets are its `>>xx<<` labels."""
    named_by = FOLDER_LANGUAGES.search(folder.path.resolve().name)
    src = src_lang or folder.tokenizer.get("source_lang") or (named_by and named_by.group(1))
    tgt = tgt_lang or folder.tokenizer.get("target_lang") or (named_by and named_by.group(2))
    targets = labels(folder.vocabs[0])
    if not src or not (tgt or targets):
        raise UserError(
            f"{named(folder.path)}: its languages are not recorded; give --src-lang and --tgt-lang"
        )
    if len(targets) > 1:
        return {"src_lang": src, "tgt_lang": targets[0], "pairs": [f"{src}-{t}" for t in targets]}
    return {"src_lang": src, "tgt_lang": tgt}


def import_config(
    folder: MarianFolder, sizes: tuple[int, int], bias: bool, out: Path, data: dict[str, Any]
) -> Config:
    """The resolved config of the imported run (`sizes`: its source and target vocabularies,
    `bias`: whether it keeps an output bias). A folder attn-mt exported carries its run's
    config (`attn_mt_config` in config.json): its decode settings, languages and training
    keys come back with it, so the model translates exactly as before."""
    c = folder.config
    positions = int(c.get("max_position_embeddings") or 512)
    raw: dict[str, Any] = {
        "data": data,
        "tokenizer": {"model_type": _model_type(folder.spm[0]), "joint": folder.shared},
        "model": {
            "d_model": c["d_model"],
            "heads": c["encoder_attention_heads"],
            "encoder_layers": c["encoder_layers"],
            "decoder_layers": c["decoder_layers"],
            "d_ff": c["encoder_ffn_dim"],
            "dropout": float(c.get("dropout", 0.1)),
            "activation_dropout": float(c.get("activation_dropout", 0.0)),
            "attention_dropout": float(c.get("attention_dropout", 0.0)),
            "norm": ARCHITECTURES[c["model_type"]],
            "activation": ACTIVATIONS[c.get("activation_function", "gelu")],
            "positions": "sinusoidal",
            "tie_embeddings": True,
        },
        "decode": decode_settings(folder.generation, positions),
    }
    exported = c.get("attn_mt_config")
    if isinstance(exported, dict):  # one of attn-mt's own exports: its run's settings
        shape = {k: raw["model"][k] for k in SHAPE_KEYS}  # as the weights have it
        raw = {**exported, "model": {**exported.get("model", {}), **shape}}
        raw["train"] = {**exported.get("train", {}), "init_from": None}
    raw["tokenizer"] = {**raw["tokenizer"], "vocab_size": sizes[1]}
    raw["model"]["output_bias"] = bias
    raw["train"] = {**raw.get("train", {}), "out_dir": str(out.absolute())}
    return config_from_dict(raw, files=False)


def import_marian(
    path: str | Path,
    out: str | Path,
    force: bool = False,
    src_lang: str | None = None,
    tgt_lang: str | None = None,
) -> Config:
    """Read the MarianMT folder `path` into the run folder `out` (module docstring); every
    check before anything is written, and `out` appears whole or not at all."""
    from attn_mt.checkpoint import make_checkpoint, save_checkpoint
    from attn_mt.data.tokenizer import Tokenizer
    from attn_mt.export.marian_weights import fill, opened, output_bias, weights_file
    from attn_mt.model.transformer import build_model

    path, out = Path(path), Path(out)
    folder = read_folder(path)
    check_model(folder.config)
    check_out_dir(out, path / "config.json", force)
    c = folder.config
    pad, eos = c.get("pad_token_id"), int(c.get("eos_token_id", 0))
    if not isinstance(pad, int):
        raise UserError(f"{named(path / 'config.json')}: no pad_token_id; not a MarianMT config")
    start = int(c.get("decoder_start_token_id", pad))
    maps = tuple(vocabulary_map(v, pad, eos, start) for v in folder.vocabs)
    extra = missing_pieces(folder.spm[0], folder.vocabs[0])  # source pieces Marian reads as <unk>
    sides = [
        rebuild_model(spm, vocab, mapping, extra if folder.shared or i == 0 else [])
        for i, (spm, vocab, mapping) in enumerate(zip(folder.spm, folder.vocabs, maps, strict=True))
    ]
    tokenizers = (Tokenizer(sides[0]), Tokenizer(sides[1]))
    sizes = (tokenizers[0].vocab_size, tokenizers[1].vocab_size)
    data = languages(folder, src_lang, tgt_lang)
    with opened(weights_file(path)) as (names, read):
        _check_weights(folder, names, read, maps)
        renormalize = bool(folder.generation.get("renormalize_logits"))
        marian_bias = (
            read("final_logits_bias").reshape(-1) if "final_logits_bias" in names else None
        )
        bias = output_bias(marian_bias, maps[1], sizes[1], renormalize)
        config = import_config(folder, sizes, bool(bias.any()), out, data)
        model = build_model(config, *sizes)
        try:
            fill(model, read, names, (maps[0], maps[1]), bias)
        except KeyError as err:
            raise UserError(
                f"{named(folder.path)}: its weights lack {err.args[0]}, which config.json's "
                "shape needs; the weights do not match config.json"
            ) from None
    state = make_checkpoint(model.eval(), config, 0, 0, tokenizers, {})
    state["imported"] = {"from": str(path.resolve()), "kind": c["model_type"]}
    with staged_folder(out) as staging:
        (staging / "checkpoints").mkdir()
        save_checkpoint(state, staging / "checkpoints" / "best.pt")
        save_config(config, staging / "config.yaml")
    return config


def _model_type(spm: bytes) -> str:
    """unigram or bpe, as the SentencePiece model says."""
    from sentencepiece import sentencepiece_model_pb2 as pb

    proto = pb.ModelProto.FromString(spm)  # type: ignore[attr-defined]
    return "bpe" if proto.trainer_spec.model_type == proto.trainer_spec.BPE else "unigram"


def _check_weights(
    folder: MarianFolder, names: set[str], read: Weights, maps: tuple[VocabularyMap, ...]
) -> None:
    """The weights hold embeddings of the vocabularies' sizes."""
    files = ("vocab.json", "vocab.json" if folder.shared else "target_vocab.json")
    for side, mapping, vocab_file in zip(("encoder", "decoder"), maps, files, strict=True):
        name = embedding_name(names, side)
        if name not in names:
            raise UserError(f"{named(folder.path)}: its weights hold no {name}; not MarianMT's")
        rows = read(name).shape[0]
        if rows != mapping.size:
            raise UserError(
                f"{named(folder.path / vocab_file)}: {mapping.size} pieces, but the model's "
                f"{side} embedding has {rows} rows; the vocabulary does not match the weights"
            )
