"""`attn-mt evaluate`: translate a split (or files), then score it against the references:
a thin wrapper over `attn_mt.evaluate`; the paths and metrics given are checked before torch is
imported.
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from attn_mt.cli.app import app
from attn_mt.cli.options import (
    BeamOption,
    CometModelOption,
    DecodeSetOption,
    DeviceOption,
    LengthPenaltyOption,
    MetricsOption,
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
    variants: Annotated[
        str | None,
        typer.Option(
            "--variants",
            metavar="LIST",
            help="Also score the test set as people type it: plain,upper,title,nopunct,typos,"
            "spans (a row each; --out is then a folder of each variant's files).",
        ),
    ] = None,
    metrics: MetricsOption = "bleu,chrf",
    comet_model: CometModelOption = None,
    split_sentences: Annotated[
        bool,
        typer.Option(
            "--split-sentences/--no-split-sentences",
            help="Translate each sentence of a source line on its own, as `translate` does "
            "(a test set of a sentence a line translates alike either way).",
        ),
    ] = True,
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
    from attn_mt.evaluate import check_evaluation_files
    from attn_mt.evaluate_variants import parse_variants
    from attn_mt.paths import check_output_dir, check_output_file, resolve_checkpoint
    from attn_mt.scores import check_metrics

    for path in model:
        resolve_checkpoint(path)
    check_evaluation_files(split and split.value, src, ref, pair, tgt_lang)  # before the models
    names = parse_metrics(metrics)
    check_metrics(names, comet_model)
    chosen = parse_variants(variants) if variants is not None else None
    if out is not None:  # a folder of files with --variants, else one file
        inputs = [("--model", resolve_checkpoint(path)) for path in model]
        check_output = check_output_file if chosen is None else check_output_dir
        check_output(out, inputs=[*inputs, ("--src", src), ("--ref", ref)])
    decode = decode_settings(set_, beam, length_penalty)
    import attn_mt  # torch: only once the arguments are known to be good
    from attn_mt.cli import progress

    translator = attn_mt.load(
        model,
        device=device,
        precision=precision.value,
        quantize=quantize,
        prepack=prepack.value_for_load,
        decode=decode,
    )
    from attn_mt.evaluate import TestChoice

    choice = TestChoice(split and split.value, src, ref, pair, tgt_lang, names, comet_model,
                        split_sentences)  # fmt: skip
    shown = functools.partial(progress.sentences, label="evaluate")
    if chosen is not None:
        from attn_mt.evaluate_variants import evaluate_variants

        table = evaluate_variants(translator, chosen, choice, out, shown)
        print(json.dumps(table.to_dict()) if as_json else table.table(names))
        print(f"variants' files: {table.folder}", file=sys.stderr)
        return
    from attn_mt.evaluate import evaluate_split

    result = evaluate_split(translator, choice, out, shown)
    if as_json:
        print(json.dumps(result.to_dict()))
    else:
        print(result.scores)
        if result.off_target is not None:
            print(f"off-target {result.off_target:.1f}% (outputs not in the language asked for)")
        print(f"hypotheses: {result.hypotheses}", file=sys.stderr)
