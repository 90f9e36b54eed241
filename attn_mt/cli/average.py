"""`attn-mt average`: the parameters of several checkpoints of one run averaged into one
checkpoint; the paths checked before torch is imported."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from attn_mt.cli.app import app
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
    from attn_mt.fileio import written_in_place
    from attn_mt.paths import check_output_file, resolve_checkpoint

    read = [("CHECKPOINT", resolve_checkpoint(path)) for path in checkpoints]
    check_output_file(out, inputs=read)
    if out.is_file() and not written_in_place(out) and not force:  # a stream: nothing lost
        raise UserError(f"--out {out}: file exists; add --force to replace it")
    from attn_mt.checkpoint import average_checkpoints, save_checkpoint  # torch

    save_checkpoint(average_checkpoints(checkpoints), out)
    print(f"averaged {len(checkpoints)} checkpoints into {out}", file=sys.stderr)
