"""`attn-mt shortlist`: a lexical shortlist (`decode.shortlist`) from a config's training corpora
(`decode.shortlist.build_shortlist`), its output path checked before any work."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from attn_mt.cli.app import app
from attn_mt.cli.options import ConfigSetOption, ModelOption, one_model
from attn_mt.errors import UserError


@app.command(
    epilog="Example: attn-mt shortlist -c domain.yaml --model runs/opus-mt-de-en --out lex.txt"
    "  (then: attn-mt translate -m runs/opus-mt-de-en --set decode.shortlist=lex.txt)"
)
def shortlist(
    config: Annotated[
        Path | None,
        typer.Option("--config", "-c", metavar="FILE", help="The config whose training data."),
    ] = None,
    out: Annotated[
        Path | None, typer.Option("--out", "-o", metavar="FILE", help="The shortlist to write.")
    ] = None,
    model: ModelOption = [],  # noqa: B006 (typer reads the default; never mutated)
    set_: ConfigSetOption = None,
    candidates: Annotated[
        int,
        typer.Option("--candidates", metavar="K", help="Target pieces per source piece.", min=1),
    ] = 50,
    frequent: Annotated[
        int,
        typer.Option(
            "--frequent", metavar="N", help="The N most frequent target pieces, always.", min=0
        ),
    ] = 100,
    max_pairs: Annotated[
        int,
        typer.Option(
            "--max-pairs", metavar="N", help="Count at most about N pairs (0 = all).", min=0
        ),
    ] = 1_000_000,
) -> None:
    """Build a lexical shortlist: for each source piece the target pieces that co-occur with it
    most in the training pairs (Dice), and the most frequent target pieces. A search with
    decode.shortlist scores only those of a batch's sources: much faster with a large
    vocabulary, at a small cost in quality (docs/pretrained.md)."""
    if config is None or out is None:
        raise UserError("shortlist: give --config FILE and --out FILE")
    run = one_model(model, "shortlist", "its tokenizers make the pieces") if model else None
    from attn_mt.config.file import load_config
    from attn_mt.paths import check_output_file

    cfg = load_config(config, set_ or [], training=False)
    check_output_file(out, "--out", inputs=[("--config", config), ("--model", run)])
    from attn_mt.decode.shortlist import build_shortlist  # torch

    built = build_shortlist(cfg, out, run, candidates, frequent, max_pairs)
    print(
        f"wrote {out}: {built.listed:,} source pieces with up to {candidates} candidates each, "
        f"{frequent} frequent target pieces, from {built.pairs:,} training pairs; a batch of "
        f"64 training sentences scores {built.batch_rows:,.0f} of {built.vocab:,} target pieces"
    )
