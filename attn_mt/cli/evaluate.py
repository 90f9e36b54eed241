"""The scoring commands: `evaluate` (translate, then score against references) and `compare`
(systems against a baseline: scores, confidence intervals, paired tests; docs/evaluation.md).

Thin wrappers over `attn_mt.evaluate` and `attn_mt.compare`; the paths and metrics given are
checked before torch is imported.
"""

from __future__ import annotations

import enum
import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from attn_mt.cli.app import app
from attn_mt.cli.decode import load_translator
from attn_mt.cli.options import (
    BeamOption,
    DecodeSetOption,
    DeviceOption,
    LengthPenaltyOption,
    ModelsOption,
    Precision,
    PrecisionOption,
    Prepack,
    PrepackOption,
    QuantizeOption,
    Split,
    TgtLangOption,
    decode_settings,
)
from attn_mt.scores import parse_metrics


class Paired(str, enum.Enum):
    """sacreBLEU's paired tests: bootstrap resampling or approximate randomization."""

    bs = "bs"
    ar = "ar"


MetricsOption = Annotated[
    str,
    typer.Option(
        "--metrics",
        metavar="LIST",
        help="Comma-separated: bleu, chrf, chrf++, ter, comet (sacreBLEU's, each with its "
        "signature; comet with --comet-model).",
    ),
]
CometModelOption = Annotated[
    Path | None,
    typer.Option(
        "--comet-model",
        metavar="PATH",
        help="A COMET model on this machine (its folder or .ckpt; nothing is downloaded), for "
        "--metrics comet; needs pip install 'attn-mt[comet]'.",
    ),
]


@app.command(epilog="Example: attn-mt evaluate -m runs/multi30k_de_en --split test -b 5")
def evaluate(
    model: ModelsOption,
    split: Annotated[
        Split | None,
        typer.Option(
            "--split", metavar="valid|test", help="A split of the run's corpus (default test)."
        ),
    ] = None,
    src: Annotated[
        Path | None,
        typer.Option(
            "--src", "--input", "-i", metavar="FILE", help="Source file to translate (with --ref)."
        ),
    ] = None,
    ref: Annotated[
        Path | None,
        typer.Option("--ref", metavar="FILE", help="Reference translations of --src."),
    ] = None,
    pair: Annotated[
        str | None,
        typer.Option(
            "--pair",
            metavar="SRC-TGT",
            help="A direction of a multilingual run's corpus, e.g. de-en (with --split).",
        ),
    ] = None,
    tgt_lang: TgtLangOption = None,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            "--output",
            "-o",
            metavar="FILE",
            help="Write hypotheses here (default: beside the checkpoint, named after the split "
            "and beam, e.g. best.test.beam5.hyp.txt).",
        ),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON object instead of text.")
    ] = False,
    metrics: MetricsOption = "bleu,chrf",
    comet_model: CometModelOption = None,
    beam: BeamOption = None,
    length_penalty: LengthPenaltyOption = None,
    set_: DecodeSetOption = None,
    device: DeviceOption = "auto",
    precision: PrecisionOption = Precision.fp32,
    quantize: QuantizeOption = None,
    prepack: PrepackOption = Prepack.auto,
) -> None:
    """Translate a split (or --src/--ref files) and print its scores (sacreBLEU BLEU and chrF,
    or --metrics) with their signatures."""
    from attn_mt.evaluate import check_evaluation_files, evaluate_split
    from attn_mt.fileio import check_output_file, resolve_checkpoint
    from attn_mt.scores import check_metrics

    for path in model:
        resolve_checkpoint(path)
    check_evaluation_files(split and split.value, src, ref, pair, tgt_lang)  # before the models
    names = parse_metrics(metrics)
    check_metrics(names, comet_model)
    if out is not None:
        inputs = [("--model", resolve_checkpoint(path)) for path in model]
        check_output_file(out, inputs=[*inputs, ("--src", src), ("--ref", ref)])
    decode = decode_settings(set_, beam, length_penalty)
    from attn_mt.cli import progress

    # torch: only once the arguments are known to be good
    translator = load_translator(model, device, precision, quantize, prepack, decode)
    result = evaluate_split(
        translator,
        split and split.value,
        src,
        ref,
        out,
        progress=lambda total: progress.sentences(total, "evaluate"),
        pair=pair,
        tgt_lang=tgt_lang,
        metrics=names,
        comet_model=comet_model,
    )
    if as_json:
        print(json.dumps(result.to_dict()))
    else:
        print(result.scores)
        if result.off_target is not None:
            print(f"off-target {result.off_target:.1f}% (outputs not in the language asked for)")
        print(f"hypotheses: {result.hypotheses}", file=sys.stderr)


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
    print(json.dumps(result.to_dict()) if as_json else result.table())
