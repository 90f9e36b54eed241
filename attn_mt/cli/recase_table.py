"""`attn-mt recase-table`: the casing table of a config's training sources put into a run (or
checkpoint) trained or imported without one (`attn_mt.train.casing.add_casing_table`), so that
`decode.recase` can read capitals and Title Case; the paths checked before torch is imported."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from attn_mt.cli.app import app
from attn_mt.cli.options import ConfigSetOption, model_option


@app.command(
    "recase-table",
    epilog="Example: attn-mt recase-table -c configs/multi30k_de_en.yaml -m runs/opus-mt-de-en",
)
def recase_table(
    config: Annotated[
        Path,
        typer.Option(
            "--config",
            "-c",
            metavar="FILE",
            help="The config whose training (or fine-tuning) sources the table is built from.",
        ),
    ],
    model: Annotated[
        Path, model_option("; a run folder's every checkpoint and its casing.json are written.")
    ],
    set_: ConfigSetOption = None,
) -> None:
    """Build the casing table (each word's usual form in the training sources) into a run or
    checkpoint that has none, for decode.recase."""
    from attn_mt.config.file import load_config
    from attn_mt.paths import resolve_checkpoint

    cfg = load_config(config, set_ or [], training=False)
    resolve_checkpoint(model)  # a run folder without best.pt, or no checkpoint: one line
    from attn_mt.train.casing import add_casing_table  # torch

    added = add_casing_table(cfg, model)
    words = ", ".join(f"{lang} {count:,} words" for lang, count in added.words.items())
    print(f"casing table ({words}) written to {', '.join(map(str, added.files))}", file=sys.stderr)
