"""The decoding command, `translate`: input and output around `attn_mt.load`.

It (and `evaluate` in `cli/evaluate.py`, `export` in `cli/model.py`) passes its search options
to the library as `decode=` overrides; every check (device, precision, quantization, beam and
n-best, ensembles) is the library's, so a notebook user meets the same rules and messages. The
paths given are checked before torch is imported (seconds): a mistyped path is reported at once.
"""

from __future__ import annotations

import os
import sys
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

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
from attn_mt.fileio import os_reason

if TYPE_CHECKING:
    from attn_mt.cli.job import LineFields
    from attn_mt.decode.request import Request
    from attn_mt.decode.translator import Translator


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
            "--split-sentences",
            help="Translate each sentence of a line on its own (a line with terms or a prefix "
            "whole), joined with the line's spacing: still one output line per input line.",
        ),
    ] = False,
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
    from attn_mt.cli import io, split
    from attn_mt.cli.job import Job, LineFields, run_job
    from attn_mt.fileio import resolve_checkpoint, written_in_place
    from attn_mt.world import world_from_env

    checkpoints = [resolve_checkpoint(path) for path in model]
    job = Job(input_, output, split.parse_shard(shard), resume, world_from_env())
    io.check_input(input_)
    if job.world.distributed and input_ is None:
        raise UserError(
            "translate under torchrun reads --input FILE (every process reads it; stdin "
            "reaches one of them)"
        )
    read: list[tuple[str, Path | None]] = [("--model", path) for path in checkpoints]
    read += [("--input", input_) if input_ else ("stdin", io.stdin_path()), ("--avoid", avoid)]
    io.check_output(output, read)
    if resume and (output is None or written_in_place(output)):
        raise UserError(
            "--resume continues an --output FILE (a regular file); a stream cannot be continued"
        )
    if not sample and (top_k, top_p, temperature) != (0, 1.0, 1.0):
        raise UserError("--top-k, --top-p and --temperature shape sampling; add --sample")
    decode = decode_settings(set_, beam, length_penalty)
    import attn_mt  # torch: only once the arguments are known to be good
    from attn_mt import distributed
    from attn_mt.decode.request import Request
    from attn_mt.precision import resolve_device

    with distributed.process_group(resolve_device(device), split.WAIT) as (_, place):
        translator = load_translator(model, str(place), precision, quantize, prepack, decode)
        translator.language_prefix(tgt_lang)  # a missing or unknown language: before any input
        if split_sentences:
            from attn_mt.documents.paragraphs import ParagraphTranslator

            translator = ParagraphTranslator.splitting(translator)
        request = Request(
            beam=beam,  # None: the decode.beam, widened to --nbest
            nbest=nbest,
            sampling=attn_mt.Sampling(temperature, top_k, top_p, seed) if sample else None,
            avoid=io.avoid_list(avoid),
            alignment=alignment,
            tgt_lang=tgt_lang,
        )
        fields = LineFields(nbest, nbest_format, prefix, constraints)
        if output is not None and not written_in_place(output):
            job.settings = record_settings(translator, request, fields, checkpoints)
            job.settings |= {"precision": precision.value, "quantize": quantize}
            job.settings |= {"split_sentences": split_sentences}
        try:
            run_job(translator, request, fields, job)
        except KeyboardInterrupt:
            raise typer.Exit(130) from None
        except OSError as err:  # the reader went away (`| head`: end quietly), or a full disk
            gone = isinstance(err, BrokenPipeError)
            if output is not None and not gone:
                raise  # --output's errors are its own
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no flush error
            if not gone:
                raise UserError(f"stdout: cannot write ({os_reason(err)})") from None


def record_settings(
    translator: Translator, request: Request, fields: LineFields, checkpoints: list[Path]
) -> dict[str, Any]:
    """What a partial translation's record keeps of how it was made, for `--resume` to
    compare: the checkpoints' sha256, every decode.* setting but the batch size (which does
    not change a translation), the resolved request and how lines are read and written."""
    from attn_mt.cli.partial import file_digest

    resolved = translator.resolve(request)
    decode = {k: v for k, v in asdict(translator.config.decode).items() if k != "batch_tokens"}
    wanted = ("beam", "nbest", "length_penalty", "sampling", "avoid", "alignment", "tgt_lang")
    return {
        "models": [file_digest(path) for path in checkpoints],
        "decode": decode,
        "request": {name: _plain(getattr(resolved, name)) for name in wanted},
        "lines": {
            "nbest_format": fields.nbest_format.value,
            "prefix": fields.prefix,
            "constraints": fields.constraints,
        },
        "device": translator.device.type,
    }


def _plain(value: Any) -> Any:
    """A request's value as JSON keeps it (a Sampling as its fields, a tuple as a list)."""
    if is_dataclass(value) and not isinstance(value, type):
        return asdict(value)
    return list(value) if isinstance(value, tuple) else value


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
