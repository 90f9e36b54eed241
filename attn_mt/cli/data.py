"""`attn-mt data fetch` and `data info`: the named corpora made available, and where they are
looked for (or a config's training corpora and shares)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from attn_mt.cli.app import data_app
from attn_mt.cli.options import ConfigSetOption
from attn_mt.errors import UserError


@data_app.command("fetch", epilog="Example: attn-mt data fetch multi30k")
def data_fetch(
    name: Annotated[str, typer.Argument(metavar="NAME", help="Corpus name: multi30k.")],
) -> None:
    """Make a named corpus available locally ($ATTN_MT_DATA, the cache, or a download)."""
    from attn_mt.data.corpora import fetch_corpus

    for path in fetch_corpus(name):
        print(path)


@data_app.command("info", epilog="Example: attn-mt data info -c configs/multi30k_de_en.yaml")
def data_info(
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            "-c",
            metavar="FILE",
            help="Show this config's training corpora and shares instead (and the named "
            "corpus files only if it uses one).",
        ),
    ] = None,
    set_: ConfigSetOption = None,
) -> None:
    """Show where named corpora are looked for and which files are present."""
    from attn_mt.config.file import load_config
    from attn_mt.data.corpora import corpus_info

    if set_ and config is None:
        raise UserError("data info: --set needs --config FILE")
    cfg = load_config(config, set_ or [], training=False) if config is not None else None
    if cfg is None or cfg.data.dataset is not None:  # the named corpora only where used
        for line in corpus_info():
            print(line)
    if cfg is not None:
        from attn_mt.data.prepare import prepared_corpus_lines

        for line in prepared_corpus_lines(cfg):
            print(line)
