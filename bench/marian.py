"""MarianMT folders laid out as the Hub's Helsinki-NLP/opus-mt-* folders, built with
transformers' own `MarianConfig`, `MarianMTModel` and `MarianTokenizer`, SentencePiece models
trained on Multi30k and seeded random weights (optionally trained a few hundred steps, so that
they end sentences): what `attn-mt import` is checked against, since no model can be downloaded
here (tests/unit/export/test_marian.py, scripts/bench_marian.py).

Three shapes (`SHAPES`), each with a tiny variant (`small_shape`) that keeps every flag:
    opus-mt       opus-mt-de-en: d 512, 6+6 layers, 8 heads, FFN 2048, swish, one vocab.json
                  shared by source.spm and target.spm (58,101 entries), tied embeddings
    tc-big        Tatoeba "tc-big" (cs-en): d 1024, 6+6, 16 heads, FFN 4096, relu, separate
                  vocabularies (vocab.json, target_vocab.json), the decoder's embedding tied to
                  the output
    multilingual  opus-mt's shape, en -> fra/deu/ces: the shared vocab.json holds >>fra<<,
                  >>deu<<, >>ces<<; a source line starts with its target's label

What makes a folder Marian's (as transformers' convert_marian_to_pytorch.py wrote them):
vocab.json is `</s>` 0, `<unk>` 1, the pieces by frequency in the segmented training text,
`<pad>` last (its ids are not SentencePiece's); the `<pad>` row of every embedding is zero (the
decoder starts from it); final_logits_bias is Marian's output bias; generation_config.json
holds bad_words_ids [[pad]], num_beams, max_length 512, forced_eos_token_id and
renormalize_logits.
"""

from __future__ import annotations

import json
import math
import random
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import sentencepiece as spm
import torch

from bench.marian_data import corpus, marian_vocab, piece_counts, strip_label, train_spm

warnings.filterwarnings("ignore", message="Recommended: pip install sacremoses")


@dataclass(frozen=True)
class Shape:
    """One Marian model shape and its data."""

    name: str
    d_model: int
    layers: int
    heads: int
    ffn: int
    activation: str
    vocab_size: int  # entries of vocab.json (and target_vocab.json), <pad> included
    spm_size: int  # pieces per SentencePiece model (a soft limit on small data)
    separate: bool  # separate source and target vocabularies
    max_positions: int
    src: str  # Multi30k suffix of the source
    tgt: tuple[str, ...]  # target languages: Multi30k suffixes, or ISO 639-3 codes with labels
    labels: bool = False  # multilingual: ">>xxx<<" target-language labels
    num_beams: int = 4
    spm_lines: int = 29000  # training lines for SentencePiece and vocab counts
    src_lang: str = ""
    tgt_lang: str = ""


SHAPES = {
    "opus-mt": Shape(
        "opus-mt-de-en",
        512,
        6,
        8,
        2048,
        "swish",
        58101,
        8000,
        False,
        512,
        "de",
        ("en",),
        src_lang="de",
        tgt_lang="en",
    ),
    "tc-big": Shape(
        "opus-mt-tc-big-cs-en",
        1024,
        6,
        16,
        4096,
        "relu",
        32001,
        8000,
        True,
        1024,
        "cs",
        ("en",),
        src_lang="ces",
        tgt_lang="eng",
    ),
    "multilingual": Shape(
        "opus-mt-en-mul3",
        512,
        6,
        8,
        2048,
        "swish",
        58101,
        8000,
        False,
        512,
        "en",
        ("fra", "deu", "ces"),
        labels=True,
        src_lang="eng",
        tgt_lang="fra+deu+ces",
    ),
}


def small_shape(shape: Shape, vocab_size: int = 1000) -> Shape:
    """The tiny variant of `shape`: every flag kept; d 32, 2+2 layers, 4 heads, FFN 128, a
    ~1000-entry vocabulary (600-piece SentencePiece models: the vocabulary then leaves out the
    rarest pieces, which MarianTokenizer maps to <unk>, as a real model does for pieces that
    never occurred in its segmented training data)."""
    return replace(
        shape,
        name=shape.name + "-small",
        d_model=32,
        layers=2,
        heads=4,
        ffn=128,
        vocab_size=vocab_size,
        spm_size=600,
        spm_lines=3000,
        max_positions=512,
    )


# ---------------------------------------------------------------------------------------------
# The model


def marian_config(shape: Shape, vocab_size: int):
    """The MarianConfig of a shape, with the values the Hub's configs hold."""
    from transformers import MarianConfig

    pad = vocab_size - 1
    return MarianConfig(
        vocab_size=vocab_size,
        decoder_vocab_size=vocab_size,
        d_model=shape.d_model,
        encoder_layers=shape.layers,
        decoder_layers=shape.layers,
        encoder_attention_heads=shape.heads,
        decoder_attention_heads=shape.heads,
        encoder_ffn_dim=shape.ffn,
        decoder_ffn_dim=shape.ffn,
        activation_function=shape.activation,
        max_position_embeddings=shape.max_positions,
        scale_embedding=True,
        pad_token_id=pad,
        eos_token_id=0,
        bos_token_id=0,
        forced_eos_token_id=0,
        decoder_start_token_id=pad,
        share_encoder_decoder_embeddings=not shape.separate,
        tie_word_embeddings=True,
        dropout=0.1,
        attention_dropout=0.0,
        activation_dropout=0.0,
        architectures=["MarianMTModel"],
    )


def generation_config(shape: Shape, vocab_size: int, renormalize: bool = True):
    """generation_config.json as the Hub's opus-mt folders hold it."""
    from transformers import GenerationConfig

    pad = vocab_size - 1
    options = dict(
        bad_words_ids=[[pad]],
        bos_token_id=0,
        decoder_start_token_id=pad,
        eos_token_id=0,
        forced_eos_token_id=0,
        max_length=512,
        num_beams=shape.num_beams,
        pad_token_id=pad,
    )
    if renormalize:
        options["renormalize_logits"] = True
    return GenerationConfig(**options)


@torch.no_grad()
def randomize(model, seed: int, bias_std: float, eos_bias: float = 0.0) -> None:
    """Seeded random weights in which every tensor matters: projections at a Xavier scale,
    non-zero biases, layer norms away from (1, 0), embeddings at std d^-1/2 (unit scale once
    multiplied by sqrt(d)) with the <pad> row zero, and final_logits_bias ~ N(0, bias_std) with
    `eos_bias` at </s> (an untrained model then ends its outputs at varied lengths) and
    0 at <pad>. The sinusoidal tables are left alone (not saved)."""
    gen = torch.Generator().manual_seed(seed)
    pad = model.config.pad_token_id
    d = model.config.d_model
    done = set()
    for name, module in model.named_modules():
        for pname, p in list(module.named_parameters(recurse=False)):
            if id(p) in done or "embed_positions" in name:
                continue
            done.add(id(p))
            if isinstance(module, torch.nn.Embedding):
                p.copy_(torch.randn(p.shape, generator=gen) * d**-0.5)
                p[pad].zero_()
            elif isinstance(module, torch.nn.LayerNorm):
                if pname == "weight":
                    p.copy_(1 + 0.1 * torch.randn(p.shape, generator=gen))
                else:
                    p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            elif isinstance(module, torch.nn.Linear):
                if pname == "weight":
                    std = math.sqrt(2.0 / (p.shape[0] + p.shape[1]))
                    p.copy_(torch.randn(p.shape, generator=gen) * std)
                else:
                    p.copy_(0.02 * torch.randn(p.shape, generator=gen))
    bias = bias_std * torch.randn(model.final_logits_bias.shape, generator=gen)
    bias[:, pad] = 0.0
    bias[:, model.config.eos_token_id] = eos_bias
    model.final_logits_bias.copy_(bias)
    # Tied weights: lm_head is model.shared / decoder.embed_tokens; the randomised parameter is
    # that one object (checked by the caller through `tie_weights`).


def train_briefly(
    model: Any, tokenizer: Any, pairs: tuple[list[str], list[str]], steps: int, seed: int
) -> None:
    """A few hundred teacher-forced steps (Adam, no dropout) so that a small model ends its
    outputs with </s> at plausible lengths: searches then stop for their own reasons, not at
    max_length. The <pad> row and pad bias stay zero (Marian's zero start vector)."""
    src, tgt = pairs
    pad = model.config.pad_token_id
    rng = random.Random(seed)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3, betas=(0.9, 0.98))
    model.eval()  # no dropout (the layers' dropout is off in eval mode; gradients still flow)
    torch.manual_seed(seed)
    embeddings = {
        id(e): e for e in (model.model.encoder.embed_tokens, model.model.decoder.embed_tokens)
    }
    for _ in range(steps):
        idx = [rng.randrange(len(src)) for _ in range(64)]
        enc = tokenizer(
            [src[i] for i in idx],
            text_target=[tgt[i] for i in idx],
            padding=True,
            truncation=True,
            max_length=64,
            return_tensors="pt",
        )
        labels = enc["labels"].masked_fill(enc["labels"] == pad, -100)
        out = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"], labels=labels)
        opt.zero_grad()
        out.loss.backward()
        opt.step()
        with torch.no_grad():  # keep Marian's zero <pad> (decoder start) vector
            for embedding in embeddings.values():
                embedding.weight[pad].zero_()


# ---------------------------------------------------------------------------------------------
# The folder


HUB_LEGACY_KEYS = {
    # keys the Hub's opus-mt config.json files hold beside the architecture (transformers 4.x
    # era); transformers 5 keeps unknown keys as attributes and ignores them.
    "_num_labels": 3,
    "add_bias_logits": False,
    "add_final_layer_norm": False,
    "classif_dropout": 0.0,
    "classifier_dropout": 0.0,
    "gradient_checkpointing": False,
    "id2label": {"0": "LABEL_0", "1": "LABEL_1", "2": "LABEL_2"},
    "label2id": {"LABEL_0": 0, "LABEL_1": 1, "LABEL_2": 2},
    "normalize_before": False,
    "normalize_embedding": False,
    "static_position_embeddings": True,
}


def build_folder(
    out: str | Path,
    shape: str | Shape = "opus-mt",
    small: bool = False,
    seed: int = 0,
    bias_std: float = 0.5,
    eos_bias: float = 0.0,
    train_steps: int = 0,
    renormalize: bool = True,
) -> Path:
    """Write a MarianMT folder for `shape` (a SHAPES key or a Shape) into `out`; returns it.

    small: its tiny variant (`small_shape`).  bias_std: final_logits_bias ~ N(0, bias_std);
    eos_bias: its value at </s>.  train_steps: teacher-forced steps after the random init.
    renormalize: renormalize_logits true in generation_config.json. config.json holds the
    4.x-era keys the Hub's files hold (HUB_LEGACY_KEYS and the generation keys).
    """
    from transformers import MarianMTModel

    spec = (
        small_shape(SHAPES[shape] if isinstance(shape, str) else shape)
        if small
        else (SHAPES[shape] if isinstance(shape, str) else shape)
    )
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer, pairs = write_tokenizer(spec, out, seed)
    torch.manual_seed(seed)
    model = MarianMTModel(marian_config(spec, spec.vocab_size)).eval()
    randomize(model, seed, bias_std, eos_bias)
    if train_steps:
        train_briefly(model, tokenizer, pairs, train_steps, seed)
    model.generation_config = generation_config(spec, spec.vocab_size, renormalize)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    special = out / "special_tokens_map.json"  # transformers 5 no longer writes it; the Hub has it
    if not special.exists():
        special.write_text(
            json.dumps({"eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"})
        )
    path = out / "config.json"
    cfg = {**json.loads(path.read_text()), **HUB_LEGACY_KEYS}
    pad = spec.vocab_size - 1
    cfg.update(bad_words_ids=[[pad]], max_length=512, num_beams=spec.num_beams)
    path.write_text(json.dumps(dict(sorted(cfg.items())), indent=2) + "\n")
    return out


def write_tokenizer(spec: Shape, out: Path, seed: int) -> tuple[Any, tuple[list[str], list[str]]]:
    """source.spm, target.spm and the vocabularies of a shape in `out`; the MarianTokenizer
    over them and the training pairs they were made from."""
    from transformers import MarianTokenizer

    src_lines, tgt_lines = corpus(spec, spec.spm_lines)
    src_model = train_spm([strip_label(line)[1] for line in src_lines], spec.spm_size, seed)
    tgt_model = train_spm(tgt_lines, spec.spm_size, seed + 1)
    (out / "source.spm").write_bytes(src_model)
    (out / "target.spm").write_bytes(tgt_model)
    src_sp = spm.SentencePieceProcessor(model_proto=src_model)
    tgt_sp = spm.SentencePieceProcessor(model_proto=tgt_model)
    src_counts, tgt_counts = piece_counts(src_sp, src_lines), piece_counts(tgt_sp, tgt_lines)
    size = spec.vocab_size
    vocabs = (
        [marian_vocab(src_counts, [src_sp], size), marian_vocab(tgt_counts, [tgt_sp], size)]
        if spec.separate
        else [marian_vocab(src_counts + tgt_counts, [src_sp, tgt_sp], size)]
    )
    names = ["vocab.json", "target_vocab.json"][: len(vocabs)]
    for name, vocab in zip(names, vocabs, strict=True):
        (out / name).write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    tokenizer = MarianTokenizer(
        source_spm=str(out / "source.spm"),
        target_spm=str(out / "target.spm"),
        vocab=str(out / "vocab.json"),
        target_vocab_file=str(out / "target_vocab.json") if spec.separate else None,
        separate_vocabs=spec.separate,
        source_lang=spec.src_lang,
        target_lang=spec.tgt_lang,
        model_max_length=512,
    )
    return tokenizer, (src_lines, tgt_lines)
