"""Export a checkpoint to CTranslate2, a C++ inference engine for Transformer translation.

`AttnMTConverter` is a `ctranslate2.converters.Converter`: its `_load` fills a
`TransformerSpec` from our modules, and CTranslate2's own `convert` validates, quantizes and
writes it. `export_ctranslate2` wraps it for `attn-mt export`: it checks the arguments, writes
into a staging folder beside `--out` the weights, the SentencePiece models (`source.model`,
`target.model`), the search settings as `translate_batch` keywords (`decode.json`) and a
README.txt, and moves it into place only when its greedy outputs agree with ours (`ct2_parity`);
the checks and the staging are those of every export (`common.py`).

The mapping, module by module (D model width):
    Embedder               embeddings (x sqrt(D): `scale_embeddings`) + position_encodings
    MultiHeadAttention     self: in_proj -> linear[0] (fused W_q; W_k; W_v), out_proj -> linear[1]
                           cross: in_proj[:D] -> linear[0] (W_q), in_proj[D:] -> linear[1]
                           (fused W_k; W_v), out_proj -> linear[2]
    Residual.norm          the sub-layer's layer_norm (before it in pre-norm, after in post-norm)
    encoder/decoder_norm   the stack's final layer_norm (pre-norm only)
    output                 decoder.projection
Our sources end with <eos> and have no <bos> (`add_source_eos`); the decoder starts from <bos>.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from attn_mt.config.schema import Config, DecodeConfig
from attn_mt.data.tokenizer import Tokenizer
from attn_mt.decode.load import load
from attn_mt.errors import UserError
from attn_mt.export.common import (
    SINUSOIDAL_ROWS,
    check_exportable,
    check_license,
    check_out_dir,
    license_note,
    longest_output,
    staged_folder,
)
from attn_mt.export.ct2_parity import check_agreement
from attn_mt.export.hf_parity import PARITY_SOURCES
from attn_mt.model.attention import MultiHeadAttention
from attn_mt.model.layers import Embedder, FeedForward
from attn_mt.model.transformer import Transformer
from attn_mt.model.vocab import BOS_ID, EOS_ID, PAD_ID, SPECIAL_PIECES, UNK_ID
from attn_mt.paths import resolve_checkpoint

try:
    import ctranslate2
    from ctranslate2.converters import Converter
    from ctranslate2.specs import common_spec, transformer_spec
    from ctranslate2.specs.model_spec import ACCEPTED_MODEL_TYPES
except ImportError:  # an optional extra: `export_ctranslate2` says how to install it
    ctranslate2 = None
    Converter = object
    ACCEPTED_MODEL_TYPES = ()

# "none" keeps the trained weights' type; the others are whatever this CTranslate2 accepts.
QUANTIZATIONS = ("none", *ACCEPTED_MODEL_TYPES)
# The config values CTranslate2's Transformer can express; anything else is refused by name.
SUPPORTED = {
    "attention": ("dot",),
    "norm": ("pre", "post"),
    "activation": ("relu", "gelu", "swish"),
    "positions": ("sinusoidal", "learned"),
}
PAD_PIECE = "<blank>"  # CTranslate2's converters name the padding piece so
# `translate_batch` options that make CTranslate2 search as ours: never generate <bos> or
# <pad>, and allow an empty output (<eos> first). The engine takes them per call, not per model.
DECODE_OPTIONS = {
    "suppress_sequences": [[SPECIAL_PIECES["bos"]], [PAD_PIECE]],
    "min_decoding_length": 0,
}
INSTALL_HINT = "pip install 'attn-mt[ct2]'"
log = logging.getLogger(__name__)


class AttnMTConverter(Converter):
    """Converts an attn-mt checkpoint (a run folder or a .pt file) to CTranslate2; `decode`
    holds decode.* settings over the checkpoint's, as `attn_mt.load` takes them."""

    def __init__(self, path: str | Path, decode: dict[str, Any] | None = None):
        self.path = resolve_checkpoint(path)
        translator = load(self.path, device="cpu", prepack=False, decode=decode)  # weights read
        self.translator, self.model, self.config = translator, translator.model, translator.config
        self.src_tokenizer, self.tgt_tokenizer = translator.src_tokenizer, translator.tgt_tokenizer
        check_exportable(self.config, SUPPORTED, "CTranslate2")

    @torch.no_grad()
    def _load(self) -> transformer_spec.TransformerSpec:
        """The TransformerSpec of our model, weights, vocabularies and special tokens filled."""
        model, m = self.model.eval(), self.config.model
        activation = {
            "relu": common_spec.Activation.RELU,
            "gelu": common_spec.Activation.GELU,
            "swish": common_spec.Activation.SWISH,
        }
        spec = transformer_spec.TransformerSpec.from_config(
            (m.encoder_layers, m.decoder_layers),
            m.heads,
            pre_norm=model.pre_norm,
            activation=activation[m.activation],
        )
        # A learned table goes whole; the sinusoidal one as far as an input can reach.
        rows = model.max_positions or max(SINUSOIDAL_ROWS, self.config.decode.max_input_len + 1)
        _set_embeddings(spec.encoder.embeddings[0], spec.encoder, model.src_embed, rows)
        _set_embeddings(spec.decoder.embeddings, spec.decoder, model.tgt_embed, rows)
        for layer_spec, enc in zip(spec.encoder.layer, model.encoder_layers, strict=True):
            _set_attention(layer_spec.self_attention, enc.self_attn, enc.res_attn.norm)
            _set_feed_forward(layer_spec.ffn, enc.ff, enc.res_ff.norm)
        for layer_spec, dec in zip(spec.decoder.layer, model.decoder_layers, strict=True):
            _set_attention(layer_spec.self_attention, dec.self_attn, dec.res_self.norm)
            _set_attention(layer_spec.attention, dec.cross_attn, dec.res_cross.norm)
            _set_feed_forward(layer_spec.ffn, dec.ff, dec.res_ff.norm)
        if model.pre_norm:  # the stacks end with a LayerNorm
            assert isinstance(model.encoder_norm, nn.LayerNorm)
            assert isinstance(model.decoder_norm, nn.LayerNorm)
            _set_layer_norm(spec.encoder.layer_norm, model.encoder_norm)
            _set_layer_norm(spec.decoder.layer_norm, model.decoder_norm)
        _set_linear(spec.decoder.projection, model.output.weight, model.output.bias)

        spec.register_source_vocabulary(_vocabulary(self.src_tokenizer))
        spec.register_target_vocabulary(_vocabulary(self.tgt_tokenizer))
        pieces = self.tgt_tokenizer.pieces([UNK_ID, BOS_ID, EOS_ID])
        spec.config.unk_token, spec.config.bos_token, spec.config.eos_token = pieces
        spec.config.decoder_start_token = spec.config.bos_token  # our decoder input: <bos> y
        spec.config.add_source_bos, spec.config.add_source_eos = False, True  # source: x <eos>
        spec.config.layer_norm_epsilon = _layer_norm_epsilon(model)
        return spec


def decode_options(decode: DecodeConfig, max_output_len: int | None) -> dict:
    """`translate_batch` keywords that search as attn-mt does with `decode`.

    CTranslate2 takes one output limit per call, so it gets the longest of ours (for a
    source of `decode.max_input_len` tokens and <eos>), less the <eos> that CTranslate2 does not
    count; beam search ranks with its own length penalty.
    """
    return {
        "beam_size": decode.beam,
        "length_penalty": decode.length_penalty,
        "max_decoding_length": max(longest_output(decode, max_output_len) - 1, 1),
        **DECODE_OPTIONS,
    }


def export_ctranslate2(
    model: str | Path,
    out: str | Path,
    quantization: str = "none",
    force: bool = False,
    decode: dict[str, Any] | None = None,
    license: str = "unknown",
) -> Path:
    """Write checkpoint `model` as a CTranslate2 model folder `out`; returns `out`.

    The checkpoint's decode settings, with the decode.* settings in `decode` over them (as
    `attn_mt.load` takes them), become the folder's decode.json; `license` (an SPDX
    identifier) goes into its README.txt.
    """
    if ctranslate2 is None:
        raise UserError(f"export needs the ctranslate2 package: {INSTALL_HINT}")
    if quantization not in QUANTIZATIONS:
        raise UserError(
            f"--quantization {quantization}: unknown; use one of {', '.join(QUANTIZATIONS)}"
        )
    check_license(license)
    out = Path(out)
    checkpoint = resolve_checkpoint(model)
    check_out_dir(out, checkpoint, force)
    converter = AttnMTConverter(checkpoint, decode)
    with staged_folder(out) as staging:
        weights = None if quantization == "none" else quantization
        converter.convert(str(staging), quantization=weights, force=True)
        # As attn-mt encodes: a tag's string in a sentence is text (`Tokenizer.text_model`).
        (staging / "source.model").write_bytes(converter.src_tokenizer.text_model)
        (staging / "target.model").write_bytes(converter.tgt_tokenizer.text_model)
        options = decode_options(converter.config.decode, converter.model.max_positions)
        (staging / "decode.json").write_text(json.dumps(options, indent=2) + "\n")
        log.info("export: checking the folder against attn-mt on %d sources ...", PARITY_SOURCES)
        agreement = check_agreement(ctranslate2, converter.translator, staging, DECODE_OPTIONS)
        if not agreement.ok:
            raise UserError(
                f"export --format ct2: the CTranslate2 model disagrees with attn-mt ({agreement}); "
                "nothing written"
            )
        log.info("export: %s", agreement)
        readme = _readme(converter, out, quantization, options, license)
        (staging / "README.txt").write_text(
            f"{readme}\nChecked at export on random sources: {agreement}.\n"
        )
    return out


# ---------------------------------------------------------------------------------------------
# Filling the spec


def _numpy(tensor: torch.Tensor) -> np.ndarray:
    """A float32 copy of a parameter, as CTranslate2's spec takes it."""
    return tensor.detach().float().cpu().numpy().copy()


def _set_linear(spec, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
    """y = x W^T + b: torch and CTranslate2 both store W as (out, in)."""
    spec.weight = _numpy(weight)
    if bias is not None:
        spec.bias = _numpy(bias)


def _set_layer_norm(spec, norm: nn.LayerNorm) -> None:
    spec.gamma, spec.beta = _numpy(norm.weight), _numpy(norm.bias)


def _set_attention(spec, attn: MultiHeadAttention, norm: nn.LayerNorm) -> None:
    """Self-attention keeps in_proj whole (CTranslate2 fuses Q, K, V the same way, rows
    W_q; W_k; W_v); cross-attention splits it into W_q and the fused W_k; W_v."""
    weight, bias = attn.in_proj.weight, attn.in_proj.bias  # (3D, D), (3D,)
    d_model = attn.out_proj.in_features
    if len(spec.linear) == 2:  # self-attention
        _set_linear(spec.linear[0], weight, bias)
    else:
        _set_linear(spec.linear[0], weight[:d_model], bias[:d_model])
        _set_linear(spec.linear[1], weight[d_model:], bias[d_model:])
    _set_linear(spec.linear[-1], attn.out_proj.weight, attn.out_proj.bias)
    _set_layer_norm(spec.layer_norm, norm)


def _set_feed_forward(spec, ff: FeedForward, norm: nn.LayerNorm) -> None:
    _set_linear(spec.linear_0, ff.w_1.weight, ff.w_1.bias)
    _set_linear(spec.linear_1, ff.w_2.weight, ff.w_2.bias)
    _set_layer_norm(spec.layer_norm, norm)


def _set_embeddings(embeddings_spec, stack_spec, embedder: Embedder, rows: int) -> None:
    """Token embeddings (scaled by sqrt(D) in the engine, as ours) and the first `rows` rows
    of our own position table (CTranslate2's built-in sinusoidal one orders sin and cos
    differently)."""
    embeddings_spec.weight = _numpy(embedder.embedding.weight)
    stack_spec.scale_embeddings = True
    stack_spec.position_encodings.encodings = _numpy(embedder.positions.encodings(rows))


def _vocabulary(tokenizer: Tokenizer) -> list[str]:
    """The pieces in id order; <pad> is named <blank>, as CTranslate2's own converters do."""
    pieces = tokenizer.all_pieces()
    pieces[PAD_ID] = PAD_PIECE
    return pieces


def _layer_norm_epsilon(model: Transformer) -> float:
    """The epsilon of our layer norms (all share torch's default)."""
    return next(m.eps for m in model.modules() if isinstance(m, nn.LayerNorm))


def _languages_note(cfg: Config) -> str:
    """The README's paragraph on a multilingual model's target-language tag (else nothing)."""
    if not cfg.data.language_tags():
        return ""
    languages = ", ".join(cfg.data.target_languages())
    return f"""
This model translates into {languages}: put the target language's tag before each
source's pieces, e.g. for German
    source_tokens = [["<2de>"] + source.encode(line, out_type=str) for line in lines]
(the tag is a piece of the source vocabulary, as attn-mt trains on it; not a target prefix).
The tag goes in only so: source.model reads "<2de>" inside a sentence as text, as attn-mt does."""


def _readme(
    converter: AttnMTConverter, out: Path, quantization: str, options: dict, license: str
) -> str:
    """How to translate with the exported folder. It leaves the machine: the checkpoint and
    the folder are named by their file names, never by the training machine's paths."""
    cfg = converter.config
    tags = _languages_note(cfg)
    return f"""\
CTranslate2 model exported by attn-mt from {converter.path.name}
({cfg.data.in_words()}, quantization {quantization}).
Files: model.bin and the vocabularies (CTranslate2), source.model and target.model
(SentencePiece), decode.json (attn-mt's search settings as translate_batch keywords:
beam_size {options["beam_size"]}, never <s> or <blank>, </s> may come first).
Install: pip install ctranslate2 sentencepiece

    import json, ctranslate2, sentencepiece as spm

    model = "{out.name}"
    translator = ctranslate2.Translator(model, device="cpu")
    source = spm.SentencePieceProcessor(model_file=f"{{model}}/source.model")
    target = spm.SentencePieceProcessor(model_file=f"{{model}}/target.model")
    decode = json.load(open(f"{{model}}/decode.json"))
    lines = ["your sentence here"]
    results = translator.translate_batch(source.encode(lines, out_type=str), **decode)
    print([target.decode(r.hypotheses[0]) for r in results])

The source gets its </s> from the model's config: do not add <s> or </s> yourself.{tags}
With beam_size 1 this is greedy search, as `attn-mt translate --beam 1`
(`attn-mt export --beam 1` writes that). Differences: attn-mt caps each output at
{cfg.decode.max_len_a} x source tokens + {cfg.decode.max_len_b}, CTranslate2 at one \
max_decoding_length per call ({options["max_decoding_length"]} here); beam search ranks by
score / length^length_penalty in CTranslate2 and by GNMT's score / ((5 + length) / 6)^alpha in
attn-mt, so beam outputs may differ slightly.

License: {license_note(license)}
"""
