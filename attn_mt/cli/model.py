"""The commands that turn a model into a file: `average` (checkpoints into one), `attention`
(a picture of its attention or positional encoding) and `export` (CTranslate2 or transformers).
Paths are checked before torch is imported.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from attn_mt.cli.app import app
from attn_mt.cli.options import (
    AttentionKind,
    BeamOption,
    DecodeSetOption,
    DeviceOption,
    ExportFormat,
    LengthPenaltyOption,
    ModelOption,
    TgtLangOption,
    decode_settings,
    one_model,
)
from attn_mt.errors import UserError


@app.command(epilog="Example: attn-mt average -o avg.pt runs/multi30k_de_en/checkpoints/step_*.pt")
def average(
    out: Annotated[
        Path, typer.Option("--out", "-o", metavar="FILE", help="The averaged checkpoint to write.")
    ],
    checkpoints: Annotated[
        list[Path],
        typer.Argument(metavar="CHECKPOINT", help="Checkpoints of one run to average."),
    ],
    force: Annotated[bool, typer.Option("--force", help="Replace an existing --out file.")] = False,
) -> None:
    """Average the parameters of several checkpoints of one run into one checkpoint."""
    from attn_mt.fileio import check_output_file, resolve_checkpoint, written_in_place

    read = [("CHECKPOINT", resolve_checkpoint(path)) for path in checkpoints]
    check_output_file(out, inputs=read)
    if out.is_file() and not written_in_place(out) and not force:  # a stream: nothing lost
        raise UserError(f"--out {out}: file exists; add --force to replace it")
    from attn_mt.checkpoint import average_checkpoints, save_checkpoint  # torch

    save_checkpoint(average_checkpoints(checkpoints), out)
    print(f"averaged {len(checkpoints)} checkpoints into {out}", file=sys.stderr)


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
    from attn_mt.fileio import check_output_file, resolve_checkpoint

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


@app.command(
    epilog="Example: attn-mt export -m runs/multi30k_de_en -o model-ct2 --quantization int8"
)
def export(
    models: ModelOption,
    out: Annotated[
        Path,
        typer.Option("--out", "-o", metavar="DIR", help="The model folder to create."),
    ],
    format_: Annotated[
        ExportFormat,
        LengthPenaltyOption,
        typer.Option(
            "--format",
            metavar="ct2|hf",
            help="ct2: a CTranslate2 folder (needs `pip install attn-mt[ct2]`); hf: a Hugging "
            "Face transformers folder (needs `pip install attn-mt[hf]`).",
        ),
    ] = ExportFormat.ct2,
    quantization: Annotated[
        str,
        typer.Option(
            "--quantization",
            metavar="none|int8|float16|...",
            help="Weight type (ct2 only): none (as trained) or any type the installed "
            "CTranslate2 accepts (an unknown one is refused with the list).",
        ),
    ] = "none",
    force: Annotated[
        bool, typer.Option("--force", help="Replace an existing --out folder.")
    ] = False,
    license_: Annotated[
        str,
        typer.Option(
            "--license",
            metavar="SPDX",
            help="The model's license (an SPDX identifier: MIT, Apache-2.0, cc-by-4.0), "
            "written into the folder's README and the model card's front matter.",
        ),
    ] = "unknown",
    beam: BeamOption = None,
    length_penalty: LengthPenaltyOption = None,
    set_: DecodeSetOption = None,
) -> None:
    """Export a checkpoint to a CTranslate2 or Hugging Face transformers model folder.

    ct2: the folder's decode.json holds the search settings (the checkpoint's decode config
    with the options given here), for `translate_batch(..., **decode)`. hf: they go to
    generation_config.json; the export checks the transformers model against attn-mt on a fixed
    sample and prints the agreement, or refuses and writes nothing.
    """
    from attn_mt.fileio import check_output_dir, resolve_checkpoint

    model = one_model(models, "export", "an export holds one model")
    check_output_dir(out, inputs=[("--model", resolve_checkpoint(model))])
    if format_ is ExportFormat.hf and quantization != "none":
        raise UserError(f"--quantization {quantization}: applies to --format ct2 only")
    decode = decode_settings(set_, beam, length_penalty)
    if format_ is ExportFormat.hf:
        from attn_mt.export.hf import export_hf  # torch

        parity = export_hf(model, out, force=force, decode=decode, license=license_)
        print(f"parity with attn-mt: {parity}", file=sys.stderr)
    else:
        from attn_mt.export.ct2 import export_ctranslate2  # torch

        export_ctranslate2(
            model, out, quantization=quantization, force=force, decode=decode, license=license_
        )
    print(f"exported to {out}", file=sys.stderr)
