"""The `attn-mt` command line: thin Typer commands that parse, call the library and print.

This is the only module that knows about the terminal. A `UserError` raised anywhere below is
printed here as one line on stderr with exit code 2; tracebacks are for bugs only.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import signal
import sys
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Optional

import typer

from attn_mt.errors import UserError

app = typer.Typer(
    help="attn-mt: train Transformer translation models from one YAML file, then translate.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
data_app = typer.Typer(
    help="Named corpora: fetch them, or show what is available.", no_args_is_help=True
)
app.add_typer(data_app, name="data")

DeviceOption = Annotated[
    str, typer.Option("--device", help="auto, cpu, cuda or cuda:N (auto = CUDA when present).")
]
ModelOption = Annotated[
    Path,
    typer.Option("--model", help="A run folder (uses checkpoints/best.pt) or a .pt checkpoint."),
]


def _setup_logging() -> None:
    """INFO lines to stderr (rank 0 only under torchrun); warnings as one line each."""
    logger = logging.getLogger("attn_mt")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
    rank = int(os.environ.get("RANK", "0"))
    logger.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    logger.propagate = False

    def show(message, category, filename, lineno, file=None, line=None):
        print(f"attn-mt: warning: {message}", file=sys.stderr)

    warnings.showwarning = show


@app.command()
def train(
    config: Annotated[Path, typer.Option("--config", help="The YAML config file.")],
    set_: Annotated[
        Optional[list[str]],  # noqa: UP045 (typer needs Optional here)
        typer.Option("--set", help="Override a config key, e.g. --set train.lr=5e-4 (repeatable)."),
    ] = None,
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue the run in train.out_dir.")
    ] = False,
    init_from: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option(
            "--init-from",
            help="Start a new run from a run folder (its best.pt) or .pt file: its weights and "
            "SentencePiece models (sets train.init_from).",
        ),
    ] = None,
    device: DeviceOption = "auto",
) -> None:
    """Train a model: SentencePiece, Transformer, validation BLEU, checkpoints, TensorBoard."""
    from attn_mt.config import load_config
    from attn_mt.train import train as run_training

    if init_from is not None and resume:
        raise UserError("--init-from starts a new run and --resume continues one; give only one")
    overrides = [*(set_ or []), *([f"train.init_from={init_from}"] if init_from else [])]
    cfg = load_config(config, overrides)
    result = run_training(cfg, resume=resume, device=device)
    if result.stop_signal is not None:  # the shell convention: 128 + the signal number
        raise typer.Exit(128 + signal.Signals[result.stop_signal].value)


@app.command()
def translate(
    model: ModelOption,
    beam: Annotated[
        int | None,
        typer.Option(
            "--beam", help="Beam size (default: the checkpoint's decode.beam; 1 = greedy)."
        ),
    ] = None,  # noqa: UP045
    nbest: Annotated[
        int,
        typer.Option(
            "--nbest",
            help="Print the N best as 'score<TAB>text' lines, a blank line after each input.",
        ),
    ] = 1,
    length_penalty: Annotated[
        float | None,
        typer.Option("--length-penalty", help="GNMT alpha (default: the checkpoint's)."),
    ] = None,  # noqa: UP045
    device: DeviceOption = "auto",
) -> None:
    """Translate stdin to stdout, one output line per input line, in order."""
    import attn_mt

    translator = attn_mt.load(model, device=device)
    beam_size = beam if beam is not None else max(translator.config.decode.beam, nbest)
    if nbest > beam_size or beam_size < 1 or nbest < 1:
        raise UserError(f"--nbest {nbest} --beam {beam_size}: need 1 <= nbest <= beam")
    out = sys.stdout
    try:
        first_line = 1
        for chunk in _stdin_chunks():
            if nbest == 1:
                texts = translator.translate(
                    chunk, beam=beam_size, length_penalty=length_penalty, first_line=first_line
                )
                out.write("".join(text + "\n" for text in texts))
            else:
                for entries in translator.translate_nbest(
                    chunk, beam_size, nbest, length_penalty, first_line=first_line
                ):
                    out.write("".join(f"{e.score:.4f}\t{e.text}\n" for e in entries) + "\n")
            out.flush()
            first_line += len(chunk)
    except BrokenPipeError:
        # The reader went away (e.g. `| head`): end quietly, without a flush error at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _stdin_chunks(max_lines: int = 1000) -> Iterator[list[str]]:
    """Lines of stdin in chunks of what has arrived (so a pipeline flows), at most `max_lines`.

    A reader thread decodes UTF-8 (invalid bytes replaced, with one warning per line) into a
    bounded queue, so memory stays bounded on endless input.
    """
    lines: queue.Queue[str | None] = queue.Queue(maxsize=4 * max_lines)

    def reader() -> None:
        for number, raw in enumerate(sys.stdin.buffer, start=1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                text = raw.decode("utf-8", errors="replace")
                warnings.warn(f"line {number}: invalid UTF-8, replaced with U+FFFD", stacklevel=1)
            lines.put(text.rstrip("\r\n"))
        lines.put(None)

    threading.Thread(target=reader, daemon=True).start()
    while True:
        first = lines.get()
        if first is None:
            return
        chunk = [first]
        while len(chunk) < max_lines:
            try:
                line = lines.get_nowait()
            except queue.Empty:
                break
            if line is None:
                yield chunk
                return
            chunk.append(line)
        yield chunk


@app.command()
def evaluate(
    model: ModelOption,
    split: Annotated[
        str | None,
        typer.Option("--split", help="valid or test split of the run's corpus (default test)."),
    ] = None,  # noqa: UP045
    src: Annotated[
        Path | None, typer.Option("--src", help="Source file to translate (with --ref).")
    ] = None,  # noqa: UP045
    ref: Annotated[
        Path | None, typer.Option("--ref", help="Reference translations of --src.")
    ] = None,  # noqa: UP045
    beam: Annotated[
        int | None,
        typer.Option("--beam", help="Beam size (default: the checkpoint's decode.beam)."),
    ] = None,  # noqa: UP045
    out: Annotated[
        Path | None,
        typer.Option("--out", help="Write hypotheses here (default: beside the checkpoint)."),
    ] = None,  # noqa: UP045
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON object instead of text.")
    ] = False,
    device: DeviceOption = "auto",
) -> None:
    """Translate a split (or --src/--ref files) and print sacreBLEU BLEU and chrF."""
    import attn_mt
    from attn_mt.checkpoint import resolve_checkpoint
    from attn_mt.data import read_parallel, split_files
    from attn_mt.evaluate import score

    if (src is None) != (ref is None):
        raise UserError("evaluate: give both --src and --ref, or neither (then --split is used)")
    if src is not None and split is not None:
        raise UserError("evaluate: give either --split or --src/--ref, not both")
    checkpoint = resolve_checkpoint(model)
    translator = attn_mt.load(checkpoint, device=device)
    if src is None:
        split = split or "test"
        if split not in ("valid", "test"):
            raise UserError(f"--split {split}: choose valid or test")
        files = split_files(translator.config.data, split)
        if files is None:
            raise UserError(
                f"--split {split}: the run's config has no data.{split} files; use --src and --ref"
            )
        src, ref = files
    sources, references = read_parallel(src, ref)
    hypotheses = translator.translate(sources, beam=beam)
    result = score(hypotheses, references)
    name = split or Path(src).name
    out = out or checkpoint.with_name(f"{checkpoint.stem}.{name}.hyp.txt")
    out.write_text("".join(h + "\n" for h in hypotheses), encoding="utf-8")
    if as_json:
        print(
            json.dumps(
                {
                    **result.to_dict(),
                    "hypotheses": str(out),
                    "beam": beam or translator.config.decode.beam,
                }
            )
        )
    else:
        print(result)
        print(f"hypotheses: {out}", file=sys.stderr)


@app.command()
def average(
    out: Annotated[Path, typer.Option("--out", help="The averaged checkpoint to write.")],
    checkpoints: Annotated[list[Path], typer.Argument(help="Checkpoints of one run to average.")],
) -> None:
    """Average the parameters of several checkpoints of one run into one checkpoint."""
    from attn_mt.checkpoint import average_checkpoints, save_checkpoint

    save_checkpoint(average_checkpoints(checkpoints), out)
    print(f"averaged {len(checkpoints)} checkpoints into {out}", file=sys.stderr)


@app.command()
def attention(
    out: Annotated[Path, typer.Option("--out", help="The PNG file to write.")],
    model: Annotated[
        Path | None, typer.Option("--model", help="A run folder or .pt checkpoint.")
    ] = None,  # noqa: UP045
    text: Annotated[
        str | None, typer.Option("--text", help="The sentence to translate and plot.")
    ] = None,  # noqa: UP045
    kind: Annotated[
        str, typer.Option("--kind", help="cross, encoder or decoder attention.")
    ] = "cross",
    layer: Annotated[
        int | None, typer.Option("--layer", help="Plot only this layer (0-based).")
    ] = None,  # noqa: UP045
    head: Annotated[
        int | None, typer.Option("--head", help="Plot only this head (0-based).")
    ] = None,  # noqa: UP045
    pe: Annotated[
        bool, typer.Option("--pe", help="Plot the sinusoidal positional-encoding matrix instead.")
    ] = False,
    positions: Annotated[int, typer.Option("--positions", help="Positions shown by --pe.")] = 100,
    d_model: Annotated[
        int | None, typer.Option("--d-model", help="Width for --pe without --model.")
    ] = None,  # noqa: UP045
    device: DeviceOption = "auto",
) -> None:
    """Draw attention heatmaps (layers x heads) for one sentence, or the positional encoding."""
    from attn_mt import viz

    if pe:
        viz.plot_positional_encoding_file(out, model=model, positions=positions, d_model=d_model)
    else:
        if model is None or text is None:
            raise UserError(
                "attention: give --model and --text (or --pe for the positional encoding)"
            )
        viz.plot_attention_file(model, text, out, kind=kind, layer=layer, head=head, device=device)
    print(f"wrote {out}", file=sys.stderr)


@app.command()
def export(
    model: ModelOption,
    out: Annotated[Path, typer.Option("--out", help="The CTranslate2 model folder to create.")],
    quantization: Annotated[
        str, typer.Option("--quantization", help="none, int8 or float16.")
    ] = "none",
    force: Annotated[
        bool, typer.Option("--force", help="Replace an existing --out folder.")
    ] = False,
) -> None:
    """Export a checkpoint to a CTranslate2 model folder (needs `pip install attn-mt[ct2]`)."""
    from attn_mt.export import export_ctranslate2

    export_ctranslate2(model, out, quantization=quantization, force=force)
    print(f"exported to {out}", file=sys.stderr)


@data_app.command("fetch")
def data_fetch(name: Annotated[str, typer.Argument(help="Corpus name: multi30k.")]) -> None:
    """Make a named corpus available locally ($ATTN_MT_DATA, the cache, or a download)."""
    from attn_mt.data import fetch_corpus

    for path in fetch_corpus(name):
        print(path)


@data_app.command("info")
def data_info() -> None:
    """Show where named corpora are looked for and which files are present."""
    from attn_mt.data import corpus_info

    for line in corpus_info():
        print(line)


def main() -> None:
    """Console-script entry point: run the app, turning user errors into one stderr line."""
    _setup_logging()
    try:
        app()
    except UserError as err:
        print(f"attn-mt: error: {err}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("attn-mt: interrupted", file=sys.stderr)
        sys.exit(130)
