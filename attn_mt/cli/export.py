"""`attn-mt export`: a checkpoint as a CTranslate2 or Hugging Face transformers model folder
(`attn_mt.export`); the paths checked before torch is imported."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from attn_mt.cli.app import app
from attn_mt.cli.options import (
    BeamOption,
    DecodeSetOption,
    ExportFormat,
    LengthPenaltyOption,
    ModelOption,
    decode_settings,
    one_model,
)
from attn_mt.errors import UserError


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
    from attn_mt.paths import check_output_dir, resolve_checkpoint

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
