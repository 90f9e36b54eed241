"""`attn-mt distill`: its options, given to the library's distillation (`distill/run.py`:
every check first, the teacher's resumable translation of each training corpus, the student's
corpus assembled, the student trained), with the progress of each part shown.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from attn_mt.cli.app import app, exit_on_signal
from attn_mt.cli.options import ConfigSetOption, DeviceOption
from attn_mt.errors import UserError


@app.command(
    epilog="Example: attn-mt distill --teacher runs/multi30k_de_en "
    "--config configs/multi30k_de_en_student.yaml"
)
def distill(
    teacher: Annotated[
        list[Path] | None,
        typer.Option(
            "--teacher",
            "-t",
            metavar="PATH",
            help="The teacher: a run folder (its best.pt) or a .pt file; give it more than once "
            "for an ensemble.",
        ),
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option("--config", "-c", metavar="FILE", help="The student's YAML config."),
    ] = None,
    beam: Annotated[
        int | None,
        typer.Option(
            "--beam", "-b", metavar="N", help="The teacher's beam (default: its decode.beam)."
        ),
    ] = None,
    set_: ConfigSetOption = None,
    keep_original: Annotated[
        float,
        typer.Option(
            "--keep-original",
            metavar="F",
            help="Add back this share of the original pairs (0 to 1).",
        ),
    ] = 0.0,
    drop_worst: Annotated[
        float,
        typer.Option(
            "--drop-worst",
            metavar="F",
            help="Leave out this share of the pairs, those the teacher scored worst (per token).",
        ),
    ] = 0.0,
    nbest_chrf: Annotated[
        int,
        typer.Option(
            "--nbest-chrf",
            metavar="N",
            help="Take the teacher's translation closest to the reference by chrF among its "
            "N best (0 = off: its best).",
        ),
    ] = 0,
    device: DeviceOption = "auto",
) -> None:
    """Translate the student config's training sources with the teacher, then train the student
    on the teacher's translations (sequence-level knowledge distillation).

    Stopped at any moment, the same command continues the translation (or the training)."""
    from attn_mt.cli import progress
    from attn_mt.distill.run import start_distillation

    if not teacher or config is None:
        raise UserError("distill: give --teacher PATH (once or more) and --config STUDENT.yaml")
    run = start_distillation(
        teacher,
        config,
        set_ or [],
        beam=beam,
        keep_original=keep_original,
        drop_worst=drop_worst,
        nbest_chrf=nbest_chrf,
        device=device,
    )
    try:
        run.translate(progress=lambda total: progress.lines(total, "translate"))
    except KeyboardInterrupt:
        print("attn-mt: distill: interrupted; the same command continues", file=sys.stderr)
        raise typer.Exit(130) from None
    with progress.training() as display:
        result = run.train(monitor=display)
    exit_on_signal(result.stop_signal)
