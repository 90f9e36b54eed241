"""`attn-mt compare`: systems against a baseline, per metric the score, its confidence interval
and the paired test's p-value (docs/evaluation.md): a thin wrapper over `attn_mt.compare`.
"""

from __future__ import annotations

import enum
import json
from pathlib import Path
from typing import Annotated

import typer

from attn_mt.cli.app import app
from attn_mt.cli.options import BeamOption, CometModelOption, DeviceOption, MetricsOption
from attn_mt.errors import UserError
from attn_mt.fileio import drop_stdout, os_reason
from attn_mt.paths import check_stdout
from attn_mt.scores import parse_metrics


class Paired(str, enum.Enum):
    """sacreBLEU's paired tests: bootstrap resampling or approximate randomization."""

    bs = "bs"
    ar = "ar"


@app.command(
    epilog="Example: attn-mt compare --ref test.en base.hyp runs/multi30k_de_en --src test.de "
    "--metrics bleu,chrf,chrf++"
)
def compare(
    systems: Annotated[
        list[Path],
        typer.Argument(
            metavar="SYSTEM",
            help="Hypothesis files, run folders or .pt files (which translate --src); the "
            "first is the baseline.",
            show_default=False,
        ),
    ],
    ref: Annotated[Path, typer.Option("--ref", metavar="FILE", help="The reference translations.")],
    src: Annotated[
        Path | None,
        typer.Option("--src", metavar="FILE", help="The sources (for a model, or COMET)."),
    ] = None,
    metrics: MetricsOption = "bleu,chrf",
    paired: Annotated[
        Paired,
        typer.Option(
            "--paired",
            metavar="bs|ar",
            help="sacreBLEU's paired test: bootstrap resampling (1,000 resamples) or "
            "approximate randomization (10,000 trials).",
        ),
    ] = Paired.bs,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON object instead of the table.")
    ] = False,
    beam: BeamOption = None,
    comet_model: CometModelOption = None,
    device: DeviceOption = "auto",
) -> None:
    """Compare systems with the first, the baseline: per metric the score, its 95% confidence
    interval and the p-value of the difference, by sacreBLEU's paired tests."""
    from attn_mt.cli import progress
    from attn_mt.compare import compare_files

    check_stdout("run it with stdout open (e.g. > FILE)")
    result = compare_files(
        systems,
        ref,
        src,
        parse_metrics(metrics),
        paired.value,
        beam=beam,
        device=device,
        progress=lambda total: progress.sentences(total, "translate"),
        comet_model=comet_model,
    )
    try:
        print(json.dumps(result.to_dict()) if as_json else result.table(), flush=True)
    except BrokenPipeError:  # the reader went away (`| head -1`): end quietly, as translate does
        drop_stdout()
    except OSError as err:  # a full disk, /dev/full
        drop_stdout()
        raise UserError(f"stdout: cannot write ({os_reason(err)})") from None
