"""`attn-mt prepare`: a config's training corpora encoded once into token shards
(`data.prepare.prepare_shards`), the corpora's lines printed."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from attn_mt.cli.app import app
from attn_mt.cli.options import ConfigSetOption
from attn_mt.errors import UserError


@app.command(epilog="Example: attn-mt prepare -c configs/multi30k_de_en.yaml --workers 4")
def prepare(
    config: Annotated[
        Path | None, typer.Option("--config", "-c", metavar="FILE", help="The YAML config file.")
    ] = None,
    set_: ConfigSetOption = None,
    workers: Annotated[
        int,
        typer.Option("--workers", metavar="N", help="Encoding processes (0 = every core).", min=0),
    ] = 0,
) -> None:
    """Encode the training corpora once into token shards (train does it too when needed)."""
    from attn_mt.config.file import load_config

    if config is None:
        raise UserError("prepare: give --config FILE, the config whose training data to prepare")
    cfg = load_config(config, set_ or [], training=False)  # it does not train: no budget needed
    from attn_mt.data.prepare import prepare_shards, prepared_corpus_lines

    prepare_shards(cfg, workers=workers, repair=True)
    for line in prepared_corpus_lines(cfg):
        print(line)
