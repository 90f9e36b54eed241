"""`attn-mt translate`: its options, given to the library's `FileTranslation`
(`jobs/translate.py`), which checks the paths before torch is imported (a mistyped path is
reported at once), then loads the model and runs the job. The search options go to
`attn_mt.load` as `decode=` overrides: every check (device, precision, quantization, beam and
n-best, ensembles) is the library's, so a notebook user meets the same rules and messages.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from attn_mt.cli.app import app
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
    TgtLangOption,
    decode_settings,
)
from attn_mt.errors import UserError
from attn_mt.jobs.nbest import NbestFormat


@app.command(epilog="Example: attn-mt translate -m runs/multi30k_de_en -i news.de -o news.en -b 5")
def translate(
    model: ModelsOption,
    input_: Annotated[
        Path | None,
        typer.Option("--input", "-i", metavar="FILE", help="Translate FILE instead of stdin."),
    ] = None,
    output: Annotated[
        Path | None,
        typer.Option(
            "--output",
            "-o",
            metavar="FILE",
            help="Write FILE instead of stdout (whole or not at all: no half file on error).",
        ),
    ] = None,
    beam: BeamOption = None,
    nbest: Annotated[
        int,
        typer.Option(
            "--nbest",
            metavar="N",
            help="Print the N best of each line (format: --nbest-format).",
        ),
    ] = 1,
    nbest_format: Annotated[
        NbestFormat,
        typer.Option(
            "--nbest-format",
            metavar="tsv|marian",
            help="tsv: 'score<TAB>text' lines, a blank line after each input line; "
            "marian: 'id ||| text ||| score' lines, id counted from 0.",
        ),
    ] = NbestFormat.tsv,
    length_penalty: LengthPenaltyOption = None,
    set_: DecodeSetOption = None,
    sample: Annotated[
        bool,
        typer.Option(
            "--sample",
            help="Sample instead of searching (back-translation): --nbest samples per line, "
            "reproducible for a --seed, whatever the batch.",
        ),
    ] = False,
    top_k: Annotated[
        int, typer.Option("--top-k", metavar="K", help="With --sample: the K likeliest (0 = all).")
    ] = 0,
    top_p: Annotated[
        float,
        typer.Option(
            "--top-p", metavar="P", help="With --sample: the nucleus of mass P (1 = all)."
        ),
    ] = 1.0,
    temperature: Annotated[
        float, typer.Option("--temperature", metavar="T", help="With --sample: divide logits by T.")
    ] = 1.0,
    seed: Annotated[int, typer.Option("--seed", metavar="S", help="With --sample: the seed.")] = 1,
    constraints: Annotated[
        bool,
        typer.Option(
            "--constraints",
            help="Lines are 'source<TAB>term<TAB>term...': every term appears in the output.",
        ),
    ] = False,
    prefix: Annotated[
        bool,
        typer.Option(
            "--prefix",
            help="Lines are 'source<TAB>prefix' (with --constraints, terms follow the prefix): "
            "the output starts with the prefix.",
        ),
    ] = False,
    avoid: Annotated[
        Path | None,
        typer.Option(
            "--avoid", metavar="FILE", help="Words or phrases (one a line) no output may hold."
        ),
    ] = None,
    glossary: Annotated[
        Path | None,
        typer.Option(
            "--glossary",
            metavar="FILE",
            help="Lines 'source term<TAB>target term': a line holding a source term (whole "
            "words, any case) gets its target term as a constraint.",
        ),
    ] = None,
    alignment: Annotated[
        bool,
        typer.Option(
            "--alignment",
            help="Add ' ||| ' and Pharaoh source-target word pairs (0-0 1-2 ...) to each output.",
        ),
    ] = False,
    split_sentences: Annotated[
        bool,
        typer.Option(
            "--split-sentences/--no-split-sentences",
            help="Translate each sentence of a line on its own (a line with terms or a prefix "
            "whole), joined with the line's spacing, as the server does: still one output "
            "line per input line. --no-split-sentences: each line whole.",
        ),
    ] = True,
    tgt_lang: TgtLangOption = None,
    shard: Annotated[
        str | None,
        typer.Option(
            "--shard",
            metavar="I/N",
            help="Translate only the I-th of N contiguous parts of the input (1 <= I <= N): "
            "the N outputs concatenated are the whole output.",
        ),
    ] = None,
    resume: Annotated[
        bool,
        typer.Option(
            "--resume",
            help="Continue the interrupted translation into --output FILE (its lines done are "
            "kept in FILE.partial) with the same model, settings and input.",
        ),
    ] = False,
    device: DeviceOption = "auto",
    precision: PrecisionOption = Precision.fp32,
    quantize: QuantizeOption = None,
    prepack: PrepackOption = Prepack.auto,
) -> None:
    """Translate stdin to stdout (or --input to --output), one line per input line, in order.

    Under torchrun, the processes share the input's lines and one output is written in order.
    """
    from attn_mt.cli import progress
    from attn_mt.jobs.translate import FileTranslation, Interrupted

    translation = FileTranslation(
        model,
        input_,
        output,
        beam=beam,
        nbest=nbest,
        nbest_format=nbest_format,
        prefix=prefix,
        constraints=constraints,
        avoid=avoid,
        glossary=glossary,
        alignment=alignment,
        split_sentences=split_sentences,
        tgt_lang=tgt_lang,
        shard=shard,
        resume=resume,
        device=device,
        precision=precision.value,
        quantize=quantize,
        prepack=prepack.value_for_load,
        progress=lambda total: progress.lines(total, "translate"),
    )
    job = translation.check()  # the paths: before torch
    if not sample and (top_k, top_p, temperature) != (0, 1.0, 1.0):
        raise UserError("--top-k, --top-p and --temperature shape sampling; add --sample")
    translation.decode = decode_settings(set_, beam, length_penalty)
    if sample:
        import attn_mt  # torch: only once the arguments are known to be good

        translation.sampling = attn_mt.Sampling(temperature, top_k, top_p, seed)
    try:
        translation.run(job)
    except Interrupted:  # the job has said what it leaves
        raise typer.Exit(130) from None
