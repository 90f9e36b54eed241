"""Export a checkpoint to a Hugging Face `transformers` folder, checked against attn-mt.

Every exportable model has an exact stock equivalent, loaded with no remote code:
    post-norm  -> MarianMTModel: post-norm layers, no final layer norms, separate source and
                  target embeddings where ours are (`share_encoder_decoder_embeddings`)
    pre-norm   -> PegasusForConditionalGeneration: pre-norm layers and a final layer norm on
                  each stack; one embedding shared by encoder, decoder and output
Both scale embeddings by sqrt(D), count positions from 0, and have biased Q, K, V and output
projections, torch's LayerNorm (eps 1e-5) and an all-zero `final_logits_bias`.

Their sinusoidal table holds sin(i w_j) in column j and cos(i w_j) in column D/2 + j, where
ours interleaves them (columns 2j, 2j+1). That is a fixed permutation `perm` of the model
dimension: h = x[perm]. Applied to every weight that reads or writes the residual stream
(embedding columns, layer-norm gains and biases, the input columns of Q, K, V and the first
feed-forward layer, the output rows of the attention output and second feed-forward layer),
it maps our model onto theirs exactly: layer norms and dot products are invariant under a
permutation, and the output logits E[:, perm] x[perm] = E x are unchanged.

`export_hf` writes the folder into a staging folder, loads it back with `from_pretrained`,
checks it against the checkpoint (`hf_parity.check_parity`) and moves it into place only if
they agree.
"""

from __future__ import annotations

import json
import logging
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attn_mt.checkpoint import resolve_checkpoint
from attn_mt.config.schema import Config
from attn_mt.data.tokenizer import Tokenizer
from attn_mt.decode.load import load
from attn_mt.decode.translator import Translator
from attn_mt.errors import UserError
from attn_mt.export.common import (
    SINUSOIDAL_ROWS,
    check_exportable,
    check_license,
    check_out_dir,
    longest_output,
    staged_folder,
)
from attn_mt.export.hf_card import model_card
from attn_mt.export.hf_parity import PARITY_SOURCES, Parity, check_parity
from attn_mt.model.attention import MultiHeadAttention
from attn_mt.model.layers import FeedForward
from attn_mt.model.transformer import Transformer, feed_forward_dropout
from attn_mt.model.vocab import BOS_ID, EOS_ID, PAD_ID

log = logging.getLogger("attn_mt")

INSTALL_HINT = "pip install 'attn-mt[hf]'"
# The config values the stock classes can express; anything else is refused by name.
SUPPORTED = {
    "attention": ("dot",),
    "norm": ("pre", "post"),
    "activation": ("relu", "gelu", "swish"),
    "positions": ("sinusoidal",),
}


def transformers_module():
    """The `transformers` package, or one line saying how to install it."""
    try:
        import transformers
    except ImportError:
        raise UserError(
            f"export --format hf needs the transformers package: {INSTALL_HINT}"
        ) from None
    # Its progress bars and its advice to install sacremoses (Marian's tokenizer uses it only
    # for text we never give it) would bury the export's one line of agreement on stderr.
    transformers.utils.logging.disable_progress_bar()
    warnings.filterwarnings("ignore", message="Recommended: pip install sacremoses")
    return transformers


def check_hf_exportable(config: Config) -> None:
    """Refuse, naming what blocks it, a model no stock transformers class holds exactly."""
    check_exportable(config, SUPPORTED, "transformers")
    if config.model.norm == "pre" and not (config.tokenizer.joint and config.model.tie_embeddings):
        raise UserError(
            "model.norm 'pre' with separate source, target or output embeddings "
            "(tokenizer.joint or model.tie_embeddings false) cannot be exported to transformers: "
            "its pre-norm class (Pegasus) shares one embedding; only post-norm models may have "
            "separate ones"
        )


def export_hf(
    model: str | Path,
    out: str | Path,
    force: bool = False,
    decode: dict[str, Any] | None = None,
    license: str = "unknown",
) -> Parity:
    """Write checkpoint `model` as a transformers folder `out`, checked against attn-mt.

    The checkpoint's decode settings, with `decode` over them, become generation_config.json;
    `license` (an SPDX identifier) goes into the model card. Returns the parity found; a
    folder that disagrees is refused and nothing is written. Each stage is a line on the log
    (stderr, from the command line): the import and the check take a while.
    """
    log.info("export: importing transformers ...")
    transformers_module()
    check_license(license)
    out = Path(out)
    checkpoint = resolve_checkpoint(model)
    check_out_dir(out, checkpoint, force)
    translator = load(checkpoint, device="cpu", prepack=False, decode=decode)  # weights read
    check_hf_exportable(translator.config)
    with staged_folder(out) as staging:
        hf_model = to_transformers(translator)
        log.info("export: writing %s weights and tokenizer files ...", type(hf_model).__name__)
        hf_model.save_pretrained(staging)
        write_tokenizer(translator, staging)
        log.info("export: checking the folder against attn-mt on %d sources ...", PARITY_SOURCES)
        parity = check_parity(transformers_module(), translator, staging)
        if not parity.ok:
            raise UserError(
                f"export --format hf: the transformers model disagrees with attn-mt ({parity}); "
                "nothing written"
            )
        card = model_card(translator, checkpoint, hf_model, out, parity, license)
        (staging / "README.md").write_text(card)
    return parity


# ---------------------------------------------------------------------------------------------
# The model


def to_transformers(translator: Translator):
    """The stock transformers model equal to the translator's, with its generation config."""
    tf = transformers_module()
    model, cfg = translator.model, translator.config
    m, shared = cfg.model, cfg.tokenizer.joint and cfg.model.tie_embeddings
    output_limit = longest_output(cfg.decode, model.max_positions)
    options = dict(
        d_model=m.d_model,
        encoder_layers=m.encoder_layers,
        decoder_layers=m.decoder_layers,
        encoder_attention_heads=m.heads,
        decoder_attention_heads=m.heads,
        encoder_ffn_dim=m.d_ff,
        decoder_ffn_dim=m.d_ff,
        activation_function=m.activation,
        dropout=m.dropout,  # as trained, for fine-tuning; inference runs without
        attention_dropout=m.attention_dropout,
        activation_dropout=feed_forward_dropout(m),
        scale_embedding=True,
        max_position_embeddings=max(SINUSOIDAL_ROWS, cfg.decode.max_input_len, output_limit) + 1,
        vocab_size=translator.src_tokenizer.vocab_size,
        pad_token_id=PAD_ID,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        decoder_start_token_id=BOS_ID,  # our decoder input: <bos> y
        forced_eos_token_id=EOS_ID,
        tie_word_embeddings=m.tie_embeddings,
        # the run's own settings (decode.*, languages), which `attn-mt import` restores
        attn_mt_config=cfg.to_dict(),
    )
    if m.norm == "post":
        hf_config = tf.MarianConfig(
            **options,
            decoder_vocab_size=translator.tgt_tokenizer.vocab_size,
            share_encoder_decoder_embeddings=shared,
        )
        hf_model = tf.MarianMTModel(hf_config)
    else:
        hf_model = tf.PegasusForConditionalGeneration(tf.PegasusConfig(**options))
    weights = hf_weights(model)
    missing, unexpected = hf_model.load_state_dict(weights, strict=False)
    left = [k for k in missing if "embed_positions" not in k and k != "final_logits_bias"]
    if left or unexpected:  # a bug in this map, not a user mistake
        raise RuntimeError(f"weights not mapped: missing {left}, unexpected {unexpected}")
    hf_model.generation_config = tf.GenerationConfig(
        num_beams=cfg.decode.beam,
        # transformers refuses a length penalty for greedy search (num_beams 1) when saving
        length_penalty=cfg.decode.length_penalty if cfg.decode.beam > 1 else 1.0,
        early_stopping=False,
        max_length=output_limit + 1,  # + the decoder's start token
        suppress_tokens=[PAD_ID, BOS_ID],  # as attn-mt's search: never generated
        pad_token_id=PAD_ID,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        decoder_start_token_id=BOS_ID,
        forced_eos_token_id=EOS_ID,
    )
    return hf_model.eval()


def model_permutation(d_model: int) -> torch.Tensor:
    """perm with h = x[perm]: our interleaved sin/cos columns in transformers' sin-half,
    cos-half order (columns 0, 2, 4, ..., then 1, 3, 5, ...)."""
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


@torch.no_grad()
def hf_weights(model: Transformer) -> dict[str, torch.Tensor]:
    """Our weights under Marian/Pegasus names, the model dimension permuted (module docstring)."""
    perm = model_permutation(model.d_model)
    weights: dict[str, torch.Tensor] = {}

    def reads(name: str, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        """A layer that reads the residual stream (D columns): its input columns permuted."""
        weights[f"{name}.weight"] = weight[:, perm]
        if bias is not None:
            weights[f"{name}.bias"] = bias

    def writes(name: str, module: nn.Linear | nn.LayerNorm) -> None:
        """A layer that writes the residual stream (or normalises it): its outputs permuted."""
        weights[f"{name}.weight"] = module.weight[perm]
        weights[f"{name}.bias"] = module.bias[perm]

    def attention(name: str, attn: MultiHeadAttention) -> None:
        w_q, w_k, w_v = attn.in_proj.weight.chunk(3)  # each (D, D)
        b_q, b_k, b_v = attn.in_proj.bias.chunk(3)
        for part, weight, bias in (("q", w_q, b_q), ("k", w_k, b_k), ("v", w_v, b_v)):
            reads(f"{name}.{part}_proj", weight, bias)
        writes(f"{name}.out_proj", attn.out_proj)

    def feed_forward(name: str, ff: FeedForward) -> None:
        reads(f"{name}.fc1", ff.w_1.weight, ff.w_1.bias)
        writes(f"{name}.fc2", ff.w_2)

    src_embedding, tgt_embedding = model.src_embed.embedding, model.tgt_embed.embedding
    reads("model.encoder.embed_tokens", src_embedding.weight)
    reads("model.decoder.embed_tokens", tgt_embedding.weight)
    if src_embedding is tgt_embedding:
        reads("model.shared", src_embedding.weight)
    reads("lm_head", model.output.weight)
    if model.output.bias is not None:  # an imported Marian model's output bias
        weights["final_logits_bias"] = model.output.bias.view(1, -1)
    for i, enc in enumerate(model.encoder_layers):
        prefix = f"model.encoder.layers.{i}"
        attention(f"{prefix}.self_attn", enc.self_attn)
        writes(f"{prefix}.self_attn_layer_norm", enc.res_attn.norm)
        feed_forward(prefix, enc.ff)
        writes(f"{prefix}.final_layer_norm", enc.res_ff.norm)
    for i, dec in enumerate(model.decoder_layers):
        prefix = f"model.decoder.layers.{i}"
        attention(f"{prefix}.self_attn", dec.self_attn)
        writes(f"{prefix}.self_attn_layer_norm", dec.res_self.norm)
        attention(f"{prefix}.encoder_attn", dec.cross_attn)
        writes(f"{prefix}.encoder_attn_layer_norm", dec.res_cross.norm)
        feed_forward(prefix, dec.ff)
        writes(f"{prefix}.final_layer_norm", dec.res_ff.norm)
    if model.pre_norm:  # the stacks end with a LayerNorm
        assert isinstance(model.encoder_norm, nn.LayerNorm)
        assert isinstance(model.decoder_norm, nn.LayerNorm)
        writes("model.encoder.layer_norm", model.encoder_norm)
        writes("model.decoder.layer_norm", model.decoder_norm)
    return {name: tensor.detach().float().contiguous() for name, tensor in weights.items()}


# ---------------------------------------------------------------------------------------------
# The tokenizer and the model card


def write_tokenizer(translator: Translator, folder: Path) -> None:
    """MarianTokenizer files: the SentencePiece models as attn-mt encodes with them (a tag's
    string in text is text: `Tokenizer.text_model`) and the piece -> id maps, so its ids are
    ours; the source gets </s>, special-token strings in text stay text."""
    tf = transformers_module()
    separate = not translator.config.tokenizer.joint
    files = {"source_spm": folder / "source.spm", "target_spm": folder / "target.spm"}
    files["source_spm"].write_bytes(translator.src_tokenizer.text_model)
    files["target_spm"].write_bytes(translator.tgt_tokenizer.text_model)
    _write_vocab(translator.src_tokenizer, folder / "vocab.json", language_codes(translator))
    if separate:
        _write_vocab(translator.tgt_tokenizer, folder / "target_vocab.json")
    tokenizer = tf.MarianTokenizer(
        source_spm=str(files["source_spm"]),
        target_spm=str(files["target_spm"]),
        vocab=str(folder / "vocab.json"),
        target_vocab_file=str(folder / "target_vocab.json") if separate else None,
        separate_vocabs=separate,
        source_lang=translator.config.data.src_lang,
        target_lang=translator.config.data.tgt_lang,
        model_max_length=translator.max_input_len + 1,  # + </s>
        split_special_tokens=True,
    )
    tokenizer.save_pretrained(folder)


def language_codes(translator: Translator) -> dict[str, int]:
    """Marian's names for a multilingual model's target-language tags: `>>de<<` at the start
    of a text is the piece `<2de>` (MarianTokenizer splits such a code off before
    SentencePiece, so `>>de<< text` gives exactly the ids attn-mt trains on); none for one
    target language."""
    data = translator.config.data
    if not data.language_tags():
        return {}
    return {f">>{lang}<<": translator.language_prefix(lang)[0] for lang in data.target_languages()}


def _write_vocab(tokenizer: Tokenizer, path: Path, aliases: dict[str, int] | None = None) -> None:
    pieces = {piece: i for i, piece in enumerate(tokenizer.all_pieces())} | (aliases or {})
    path.write_text(json.dumps(pieces, ensure_ascii=False, indent=0) + "\n", encoding="utf-8")
