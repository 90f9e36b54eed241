"""`attn-mt import`: a transformers MarianMT folder (an OPUS-MT or Tatoeba model) as an attn-mt
run folder (`attn_mt.export.marian`); the paths checked before torch is imported."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from attn_mt.cli.app import app


@app.command(
    "import",
    epilog="Example: attn-mt import opus-mt-de-en --out runs/opus-mt-de-en  "
    "(the folder from `hf download Helsinki-NLP/opus-mt-de-en --local-dir opus-mt-de-en`)",
)
def import_(
    path: Annotated[
        Path,
        typer.Argument(
            metavar="PATH",
            help="A MarianMT folder: config.json, model.safetensors or pytorch_model.bin, "
            "source.spm, target.spm, vocab.json (and generation_config.json).",
            show_default=False,
        ),
    ],
    out: Annotated[
        Path, typer.Option("--out", "-o", metavar="RUN", help="The run folder to create.")
    ],
    force: Annotated[
        bool, typer.Option("--force", help="Replace an existing --out folder.")
    ] = False,
    src_lang: Annotated[
        str | None,
        typer.Option(
            "--src-lang", metavar="LANG", help="The source language, where the folder does not say."
        ),
    ] = None,
    tgt_lang: Annotated[
        str | None,
        typer.Option(
            "--tgt-lang", metavar="LANG", help="The target language, where the folder does not say."
        ),
    ] = None,
) -> None:
    """Import a pretrained MarianMT model as a run folder: translate, evaluate, serve, export,
    distil or fine-tune it (`train --init-from RUN`) as any attn-mt run.

    Its generation_config.json becomes the run's decode settings, so `translate` gives what
    transformers' `generate` gives; what attn-mt cannot represent is refused by name, and
    nothing is written then.
    """
    from attn_mt.paths import check_output_dir

    check_output_dir(out, inputs=[("PATH", path)])
    from attn_mt.export.marian import import_marian  # torch

    config = import_marian(path, out, force=force, src_lang=src_lang, tgt_lang=tgt_lang)
    m = config.model
    print(
        f"imported {path} into {out}: {config.data.in_words()}, d_model {m.d_model}, "
        f"{m.encoder_layers}+{m.decoder_layers} layers, {config.tokenizer.vocab_size:,} pieces; "
        f"decode: beam {config.decode.beam}, length penalty {config.decode.length_penalty:g}",
        file=sys.stderr,
    )
