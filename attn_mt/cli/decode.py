"""The decoding command, `translate`: input and output around `attn_mt.load`.

It (and `evaluate` in `cli/evaluate.py`, `export` in `cli/model.py`) passes its search options
to the library as `decode=` overrides; every check (device, precision, quantization, beam and
n-best, ensembles) is the library's, so a notebook user meets the same rules and messages. The
paths given are checked before torch is imported (seconds): a mistyped path is reported at once.
"""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from itertools import count, takewhile
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, TextIO

import typer

from attn_mt.cli.app import app
from attn_mt.cli.options import (
    BeamOption,
    DecodeSetOption,
    DeviceOption,
    LengthPenaltyOption,
    ModelsOption,
    NbestFormat,
    Precision,
    PrecisionOption,
    Prepack,
    PrepackOption,
    QuantizeOption,
    TgtLangOption,
    decode_settings,
)
from attn_mt.errors import UserError

if TYPE_CHECKING:
    from attn_mt.decode.translator import Translation, Translator


@app.command(epilog="Example: attn-mt translate -m runs/multi30k -i news.de -o news.en -b 5")
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
    alignment: Annotated[
        bool,
        typer.Option(
            "--alignment",
            help="Add ' ||| ' and Pharaoh source-target word pairs (0-0 1-2 ...) to each output.",
        ),
    ] = False,
    tgt_lang: TgtLangOption = None,
    device: DeviceOption = "auto",
    precision: PrecisionOption = Precision.fp32,
    quantize: QuantizeOption = None,
    prepack: PrepackOption = Prepack.auto,
) -> None:
    """Translate stdin to stdout (or --input to --output), one line per input line, in order."""
    from attn_mt.cli import io
    from attn_mt.fileio import os_reason, resolve_checkpoint

    for path in model:
        resolve_checkpoint(path)
    io.check_input(input_)
    io.check_output(output, input_)
    if not sample and (top_k, top_p, temperature) != (0, 1.0, 1.0):
        raise UserError("--top-k, --top-p and --temperature shape sampling; add --sample")
    decode = decode_settings(set_, beam, length_penalty)
    import attn_mt  # torch: only once the arguments are known to be good
    from attn_mt.cli import progress
    from attn_mt.decode.request import Request

    translator = load_translator(model, device, precision, quantize, prepack, decode)
    translator.language_prefix(tgt_lang)  # a missing or unknown language: before any input
    request = Request(
        beam=beam,  # None: the decode.beam, widened to --nbest
        nbest=nbest,
        sampling=attn_mt.Sampling(temperature, top_k, top_p, seed) if sample else None,
        avoid=io.avoid_list(avoid),
        alignment=alignment,
        tgt_lang=tgt_lang,
    )
    lines = _LineWriter(nbest, nbest_format)
    try:
        with (
            io.input_file(input_) as (stream, total),
            io.output_file(output) as out,
            progress.sentences(total, "translate") as advance,
        ):
            for chunk in io.line_chunks(stream, str(input_) if input_ else "stdin"):
                first_line = lines.written + 1
                sources, prefixes, terms = io.line_fields(chunk, prefix, constraints, first_line)
                done: dict[int, list[Translation]] = {}  # the chunk's finished lines, by row
                try:
                    found = translator.translate_nbest(
                        sources,
                        replace(
                            request,
                            first_line=first_line,
                            on_batch=advance,
                            on_line=done.__setitem__,
                            constraints=terms,
                            prefixes=prefixes,
                        ),
                    )
                except KeyboardInterrupt:  # Ctrl-C: the lines finished in order are written
                    lines.write(out, [done[row] for row in takewhile(done.__contains__, count())])
                    raise
                lines.write(out, found)
    except KeyboardInterrupt:
        raise _interrupted(output, lines.written) from None
    except OSError as err:  # the reader went away (`| head`: end quietly), or a full disk
        gone = isinstance(err, BrokenPipeError)
        if output is not None and not gone:
            raise  # --output's errors are its own
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no flush error at exit
        if not gone:
            raise UserError(f"stdout: cannot write ({os_reason(err)})") from None


class _LineWriter:
    """Writes finished input lines' translations in input order and counts them."""

    def __init__(self, nbest: int, nbest_format: NbestFormat):
        self.nbest, self.nbest_format = nbest, nbest_format
        self.written = 0  # input lines whose output is written

    def write(self, out: TextIO, found: list[list[Translation]]) -> None:
        from attn_mt.cli import io

        for index, entries in enumerate(found, start=self.written):
            out.write(io.format_entries(index, entries, self.nbest, self.nbest_format))
        out.flush()
        self.written += len(found)


def _interrupted(output: Path | None, written: int) -> typer.Exit:
    """Ctrl-C during translate: say what was written (stdout keeps the finished lines; an
    --output file is whole or not at all), then exit 130."""
    if output is None:
        print(f"attn-mt: interrupted; the first {written} line(s) are written", file=sys.stderr)
    else:
        print(
            f"attn-mt: interrupted; --output {output} not written ({written} line(s) were "
            "done; to keep finished lines, translate to stdout: > FILE)",
            file=sys.stderr,
        )
    return typer.Exit(130)


def load_translator(
    model: list[Path],
    device: str,
    precision: Precision,
    quantize: str | None,
    prepack: Prepack,
    decode: dict,
) -> Translator:
    """`attn_mt.load` with the options `translate`, `evaluate` and `serve` share (imports torch)."""
    import attn_mt

    return attn_mt.load(
        model,
        device=device,
        precision=precision.value,
        quantize=quantize,
        prepack=prepack.value_for_load,
        decode=decode,
    )
