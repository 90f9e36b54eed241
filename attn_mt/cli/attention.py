"""`attn-mt attention`: a picture of a model's attention for one sentence, or of the
positional encoding (`attn_mt.viz`); the paths checked before torch and matplotlib are
imported."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from attn_mt.cli.app import app
from attn_mt.cli.options import AttentionKind, DeviceOption, TgtLangOption, one_model
from attn_mt.errors import UserError


@app.command(
    epilog="Example: attn-mt attention -m runs/multi30k_de_en --text 'Ein Hund läuft.' -o attn.png"
)
def attention(
    out: Annotated[
        Path, typer.Option("--out", "-o", metavar="FILE", help="The PNG file to write.")
    ],
    models: Annotated[  # a list, so that a second --model is refused (`one_model`), not taken
        list[Path] | None,
        typer.Option("--model", "-m", metavar="PATH", help="A run folder or .pt checkpoint."),
    ] = None,
    text: Annotated[
        str | None,
        typer.Option("--text", metavar="TEXT", help="The sentence to translate and plot."),
    ] = None,
    kind: Annotated[
        AttentionKind,
        typer.Option(
            "--kind",
            metavar="cross|encoder|decoder",
            help="Which attention: cross, encoder or decoder.",
        ),
    ] = AttentionKind.cross,
    layer: Annotated[
        int | None, typer.Option("--layer", metavar="N", help="Plot only this layer (0-based).")
    ] = None,
    head: Annotated[
        int | None, typer.Option("--head", metavar="N", help="Plot only this head (0-based).")
    ] = None,
    pe: Annotated[
        bool, typer.Option("--pe", help="Plot the sinusoidal positional-encoding matrix instead.")
    ] = False,
    positions: Annotated[
        int, typer.Option("--positions", metavar="N", help="Positions shown by --pe.")
    ] = 100,
    d_model: Annotated[
        int | None, typer.Option("--d-model", metavar="N", help="Width for --pe without --model.")
    ] = None,
    tgt_lang: TgtLangOption = None,
    device: DeviceOption = "auto",
) -> None:
    """Draw attention heatmaps (layers x heads) for one sentence, or the positional encoding."""
    from attn_mt.paths import check_output_file, resolve_checkpoint

    model = one_model(models, "attention", "it draws one model's attention") if models else None
    read = [("--model", resolve_checkpoint(model) if model is not None else None)]
    check_output_file(out, inputs=read)
    if not pe and (model is None or text is None):
        raise UserError("attention: give --model and --text (or --pe for the positional encoding)")
    from attn_mt import viz  # torch and matplotlib

    if pe:
        viz.plot_positional_encoding_file(out, model=model, positions=positions, d_model=d_model)
    else:
        assert model is not None and text is not None  # checked above
        viz.plot_attention_file(
            model,
            text,
            out,
            kind=kind.value,
            layer=layer,
            head=head,
            device=device,
            tgt_lang=tgt_lang,
        )
    print(f"wrote {out}", file=sys.stderr)
