"""`attn-mt score`: forced decoding, as marian-scorer and fairseq's --score-reference: log P(ref
| src) of every pair, written as `translate` writes its lines (`jobs/io.py`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from attn_mt.cli.app import app
from attn_mt.cli.options import (
    DeviceOption,
    ModelOption,
    Precision,
    PrecisionOption,
    TgtLangOption,
    one_model,
)
from attn_mt.errors import UserError


@app.command(epilog="Example: attn-mt score -m runs/multi30k_de_en --src test.de --ref test.en")
def score(
    models: ModelOption,
    src: Annotated[Path, typer.Option("--src", metavar="FILE", help="The source sentences.")],
    ref: Annotated[
        Path, typer.Option("--ref", metavar="FILE", help="Their translations to score.")
    ],
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", metavar="FILE", help="Write FILE instead of stdout."),
    ] = None,
    normalize: Annotated[
        bool,
        typer.Option("--normalize", help="Print the mean per token instead of the sum."),
    ] = False,
    as_json: Annotated[
        bool,
        typer.Option("--json", help='One JSON object a line: {"score", "pieces", "tokens"}.'),
    ] = False,
    batch_tokens: Annotated[
        int, typer.Option("--batch-tokens", metavar="N", min=1, help="Tokens per batch.")
    ] = 4096,
    tgt_lang: TgtLangOption = None,
    device: DeviceOption = "auto",
    precision: PrecisionOption = Precision.fp32,
) -> None:
    """Forced decoding: log P(ref | src) of every pair, one line per pair in input order:
    the total, a tab, then each reference piece's and </s>'s log-probability. The files are
    text or gzip, or streams (/dev/stdin, a FIFO, `<(...)`)."""
    from attn_mt.jobs import io
    from attn_mt.paths import resolve_checkpoint

    model = one_model(models, "score", "score reads one model")
    read = [("--model", resolve_checkpoint(model)), ("--src", src), ("--ref", ref)]
    io.check_output(output, read)
    sources, references = _read_lines(src, "--src"), _read_lines(ref, "--ref")
    if len(sources) != len(references):
        raise UserError(
            f"--src {src} has {len(sources)} lines but --ref {ref} has {len(references)}"
        )
    import attn_mt  # torch: only once the arguments are known to be good
    from attn_mt.decode.forced import score_lines

    translator = attn_mt.load(model, device=device, precision=precision.value, prepack=False)
    scores = score_lines(translator, sources, references, batch_tokens, tgt_lang)
    with io.output_file(output) as out:
        for pair in scores:
            total = pair.normalized if normalize else pair.total
            if as_json:
                record = {"score": total, "pieces": pair.pieces, "tokens": pair.tokens}
                out.write(json.dumps(record, ensure_ascii=False) + "\n")
            else:
                out.write(f"{total:.6f}\t{' '.join(f'{t:.4f}' for t in pair.tokens)}\n")


def _read_lines(path: Path, option: str) -> list[str]:
    """The lines of a score input as `evaluate` reads its files (`data.text.read_lines`),
    its errors named by the option."""
    from attn_mt.data.text import read_lines

    try:
        return read_lines(path)
    except UserError as err:
        raise UserError(f"{option} {err}") from None
