"""The `attn-mt` command line: thin Typer commands that parse, call the library and print.

This is the only module that knows about the terminal. A `UserError` raised anywhere below is
printed here as one line on stderr with exit code 2; tracebacks are for bugs only.
"""

from __future__ import annotations

import ast
import contextlib
import enum
import importlib.util
import io
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
from typing import TYPE_CHECKING, Annotated, BinaryIO, Optional, TextIO

import typer

from attn_mt.errors import UserError

if TYPE_CHECKING:  # imported inside the commands: `attn-mt --help` must not load torch
    from attn_mt.decode.translator import Translation, Translator

app = typer.Typer(
    help="attn-mt: train Transformer translation models from one YAML file, then translate.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)
data_app = typer.Typer(
    help="Named corpora: fetch them, or show what is available.", no_args_is_help=True
)
app.add_typer(data_app, name="data")


def _ctranslate2_quantizations() -> list[str]:
    """The weight types the installed CTranslate2 converter accepts (empty if not installed).

    Read from the converter's own `ACCEPTED_MODEL_TYPES` without importing it: that module
    imports torch, and `attn-mt export --help` must stay fast.
    """
    spec = importlib.util.find_spec("ctranslate2")
    if spec is None or spec.origin is None:
        return []
    source = Path(spec.origin).parent / "specs" / "model_spec.py"
    for node in ast.parse(source.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and "ACCEPTED_MODEL_TYPES" in {
            getattr(target, "id", None) for target in node.targets
        }:
            return list(ast.literal_eval(node.value))
    return []


Quantization = enum.Enum(
    "Quantization", {q: q for q in ["none", *_ctranslate2_quantizations()]}, type=str
)


class AttentionKind(str, enum.Enum):
    """Which attention `attn-mt attention` draws."""

    cross = "cross"
    encoder = "encoder"
    decoder = "decoder"


class Split(str, enum.Enum):
    """A split of the run's corpus that `evaluate` can score."""

    valid = "valid"
    test = "test"


class NbestFormat(str, enum.Enum):
    """How `translate --nbest` writes its entries."""

    tsv = "tsv"  # score<TAB>text lines, a blank line after each input line
    marian = "marian"  # `id ||| text ||| score` lines (Marian, Moses, fairseq), id from 0


class Precision(str, enum.Enum):
    """The number format of `translate` and `evaluate`."""

    fp32 = "fp32"
    bf16 = "bf16"  # autocast; on CPUs with native bf16 (AMX, AVX-512 BF16) and recent GPUs
    fp16 = "fp16"  # autocast, CUDA only
    auto = "auto"  # bf16 where the device runs it natively, else fp16 (CUDA) or fp32


class Int8(str, enum.Enum):
    """`--quantize`: int8 linear layers, CPU only (`attn_mt.quantize`)."""

    int8 = "int8"


DeviceOption = Annotated[
    str,
    typer.Option(
        "--device",
        metavar="auto|cpu|cuda|cuda:N",
        help="Where to run (auto = CUDA when present).",
    ),
]
ModelOption = Annotated[
    Path,
    typer.Option(
        "--model",
        metavar="PATH",
        help="A run folder (uses checkpoints/best.pt) or a .pt checkpoint.",
    ),
]
ModelsOption = Annotated[
    list[Path],
    typer.Option(
        "--model",
        metavar="PATH",
        help="A run folder (uses checkpoints/best.pt) or a .pt checkpoint; give it more than "
        "once to decode with the ensemble (models of one vocabulary, log-probabilities averaged).",
    ),
]
PrecisionOption = Annotated[
    Precision,
    typer.Option(
        "--precision",
        help="fp32; bf16 or fp16 autocast; auto = bf16 where the device runs it natively.",
    ),
]
QuantizeOption = Annotated[
    Optional[Int8],  # noqa: UP045
    typer.Option(
        "--quantize", help="int8: dynamically quantized linear layers (CPU only, fp32 otherwise)."
    ),
]
# The search options `translate`, `evaluate` and `export` share (see `_load_translator`).
BeamOption = Annotated[
    Optional[int],  # noqa: UP045 (typer needs Optional here)
    typer.Option(
        "--beam",
        metavar="N",
        help="Beam size (default: the checkpoint's decode.beam; 1 = greedy).",
    ),
]
LengthPenaltyOption = Annotated[
    Optional[float],  # noqa: UP045
    typer.Option(
        "--length-penalty", metavar="ALPHA", help="GNMT alpha (default: the checkpoint's)."
    ),
]
DecodeSetOption = Annotated[
    Optional[list[str]],  # noqa: UP045
    typer.Option(
        "--set",
        metavar="decode.KEY=VALUE",
        help="Override a decode setting of the checkpoint, e.g. --set decode.max_len_a=2 "
        "(repeatable; any decode.* key, checked as in a config file).",
    ),
]


def _version(value: bool) -> None:
    if value:
        from attn_mt import __version__

        print(f"attn-mt {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """attn-mt: train Transformer translation models from one YAML file, then translate."""


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever `sys.stderr` is now: a live progress display wraps it to print log
    lines above itself."""

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, _value: TextIO) -> None:
        pass


def _setup_logging() -> None:
    """INFO lines to stderr (rank 0 only under torchrun); warnings as one line each."""
    logger = logging.getLogger("attn_mt")
    if not logger.handlers:
        handler = _StderrHandler()
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
    run_dir: Annotated[
        Optional[Path],  # noqa: UP045 (typer needs Optional here)
        typer.Argument(
            metavar="RUN_DIR",
            help="With --resume instead of --config: the run folder to continue.",
            show_default=False,
        ),
    ] = None,
    config: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option("--config", metavar="FILE", help="The YAML config file."),
    ] = None,
    set_: Annotated[
        Optional[list[str]],  # noqa: UP045 (typer needs Optional here)
        typer.Option(
            "--set",
            metavar="KEY=VALUE",
            help="Override a config key, e.g. --set train.lr=5e-4 (repeatable).",
        ),
    ] = None,
    resume: Annotated[
        bool,
        typer.Option(
            "--resume",
            help="Continue a run: the one in the config's train.out_dir, or RUN_DIR "
            "(`attn-mt train --resume RUN_DIR` reads RUN_DIR/config.yaml).",
        ),
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
    from attn_mt.cli import progress
    from attn_mt.config import load_config
    from attn_mt.train.loop import train as run_training

    if init_from is not None and resume:
        raise UserError("--init-from starts a new run and --resume continues one; give only one")
    if run_dir is not None and not resume:
        raise UserError(
            f"train: {run_dir} given without --resume; continue that run with "
            f"`attn-mt train --resume {run_dir}`, or start one with --config FILE"
        )
    if run_dir is not None and config is not None:
        raise UserError("train: give --config FILE [--resume] or --resume RUN_DIR, not both")
    if run_dir is None and config is None:
        raise UserError("train: give --config FILE (or --resume RUN_DIR to continue a run)")
    if run_dir is not None:
        if not (run_dir / "config.yaml").is_file():
            raise UserError(
                f"--resume {run_dir}: not a run folder (no config.yaml); give the train.out_dir "
                "of an earlier run"
            )
        # The folder is the run, wherever it was started from: its out_dir is RUN_DIR itself.
        config, set_ = run_dir / "config.yaml", [f"train.out_dir={run_dir}", *(set_ or [])]
    overrides = [*(set_ or []), *([f"train.init_from={init_from}"] if init_from else [])]
    cfg = load_config(config, overrides)
    with progress.training(enabled=os.environ.get("RANK", "0") == "0") as display:
        result = run_training(cfg, resume=resume, device=device, monitor=display)
    if result.stop_signal is not None:  # the shell convention: 128 + the signal number
        raise typer.Exit(128 + signal.Signals[result.stop_signal].value)


@app.command()
def prepare(
    config: Annotated[Path, typer.Option("--config", help="The YAML config file.")],
    workers: Annotated[
        int, typer.Option("--workers", help="Encoding processes (0 = every core).", min=0)
    ] = 0,
) -> None:
    """Encode the training corpora once into token shards (train does it too when needed)."""
    from attn_mt.config import load_config
    from attn_mt.data.prepare import prepare_shards, prepared_corpus_lines

    cfg = load_config(config)
    prepare_shards(cfg, workers=workers, repair=True)
    for line in prepared_corpus_lines(cfg):
        print(line)


@app.command()
def translate(
    model: ModelsOption,
    input_: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option("--input", metavar="FILE", help="Translate FILE instead of stdin."),
    ] = None,
    output: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option(
            "--output",
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
    device: DeviceOption = "auto",
    precision: PrecisionOption = Precision.fp32,
    quantize: QuantizeOption = None,
) -> None:
    """Translate stdin to stdout (or --input to --output), one line per input line, in order."""
    from attn_mt.cli import progress
    from attn_mt.decode.search import Sampling

    translator = _load_translator(
        model, device, beam, length_penalty, set_, precision.value, quantize and quantize.value
    )
    sampling = Sampling(temperature, top_k, top_p, seed) if sample else None
    beam_size = translator.config.decode.beam
    if beam is None:
        beam_size = max(beam_size, nbest)
    if sampling is not None:
        beam_size = beam  # sampling searches no beam; the translator refuses one
    elif nbest > beam_size or beam_size < 1 or nbest < 1:
        raise UserError(f"--nbest {nbest} --beam {beam_size}: need 1 <= nbest <= beam")
    try:
        with (
            _input_file(input_) as (stream, total),
            _output_file(output) as out,
            progress.sentences(total, "translate") as advance,
        ):
            first_line = 1
            for chunk in _line_chunks(stream, str(input_) if input_ else "stdin"):
                found = translator.translate_nbest(
                    chunk,
                    beam_size,
                    nbest,
                    first_line=first_line,
                    on_batch=advance,
                    sampling=sampling,
                )
                for number, entries in enumerate(found, start=first_line):
                    out.write(_format_entries(number - 1, entries, nbest, nbest_format))
                out.flush()
                first_line += len(chunk)
    except BrokenPipeError:
        # The reader went away (e.g. `| head`): end quietly, without a flush error at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _load_translator(
    models: list[Path],
    device: str,
    beam: int | None = None,
    length_penalty: float | None = None,
    sets: list[str] | None = None,
    precision: str = "fp32",
    quantize: str | None = None,
) -> Translator:
    """Load `models` (one, or an ensemble) with the search options applied to the decode
    config, which checks them as it checks a config file (`--beam 0` fails as
    `decode.beam: 0 is invalid`), in the number format asked for."""
    import attn_mt
    from attn_mt.config import apply_override, config_from_dict
    from attn_mt.precision import DTYPES, resolve_device, resolve_precision

    where = resolve_device(device)
    if precision == "fp16" and where.type != "cuda":
        raise UserError("--precision fp16 needs a CUDA GPU; use bf16 or fp32 on the CPU")
    dtype = DTYPES[resolve_precision(precision, where)]
    if quantize and dtype is not None:
        raise UserError(f"--quantize {quantize} and --precision {precision} exclude each other")

    overrides = list(sets or [])
    for item in overrides:
        if not item.strip().startswith("decode."):
            raise UserError(
                f"--set {item}: only decode.* keys can be set here, "
                "e.g. --set decode.length_penalty=0.6"
            )
    if beam is not None:
        overrides.append(f"decode.beam={beam}")
    if length_penalty is not None:
        overrides.append(f"decode.length_penalty={length_penalty}")
    translator = attn_mt.load(models[0] if len(models) == 1 else models, where, dtype, quantize)
    raw = translator.config.to_dict()
    for item in overrides:
        apply_override(raw, item)
    translator.config = config_from_dict(raw)
    return translator


def _format_entries(index: int, entries: list[Translation], nbest: int, style: NbestFormat) -> str:
    """The output lines of input line `index` (from 0): its best text, or its n-best block."""
    if nbest == 1:
        return entries[0].text + "\n"
    if style is NbestFormat.marian:
        return "".join(f"{index} ||| {e.text} ||| {e.score:.4f}\n" for e in entries)
    return "".join(f"{e.score:.4f}\t{e.text}\n" for e in entries) + "\n"


@contextlib.contextmanager
def _input_file(path: Path | None) -> Iterator[tuple[BinaryIO, int | None]]:
    """stdin or FILE as a binary stream, with its number of lines (None for stdin)."""
    if path is None:
        if sys.stdin is None:  # the shell closed it (<&-)
            raise UserError("stdin: cannot read text (it is closed)")
        yield sys.stdin.buffer, None
        return
    try:
        handle = path.open("rb")
        total = sum(1 for _ in handle)
        handle.seek(0)
    except OSError as err:
        raise UserError(f"--input {path}: cannot read ({err.strerror})") from None
    with handle:
        yield handle, total


@contextlib.contextmanager
def _output_file(path: Path | None) -> Iterator[TextIO]:
    """stdout, or `path` written atomically: it appears only once every line is written."""
    from attn_mt.fileio import atomic_write, check_output_file, os_reason

    if path is None:
        yield sys.stdout
        return
    check_output_file(path, "--output")
    try:
        with atomic_write(path) as raw:
            handle = io.TextIOWrapper(raw, encoding="utf-8", newline="")
            yield handle
            handle.flush()
            handle.detach()  # atomic_write closes the file itself
    except OSError as err:
        raise UserError(f"--output {path}: cannot write ({os_reason(err)})") from None


def _line_chunks(stream: BinaryIO, name: str, max_lines: int = 1000) -> Iterator[list[str]]:
    """Lines of `stream` in chunks of what has arrived (so a pipeline flows), at most
    `max_lines`.

    A reader thread decodes UTF-8 (invalid bytes replaced, with one warning per line) into a
    bounded queue, so memory stays bounded on endless input.
    """
    lines: queue.Queue[str | UserError | None] = queue.Queue(maxsize=4 * max_lines)

    def reader() -> None:
        try:
            for number, raw in enumerate(stream, start=1):
                if number == 1 and raw.startswith(b"\x1f\x8b"):
                    raise UserError(
                        f"{name}: gzip-compressed data; decompress it (zcat FILE | ...)"
                    )
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError:
                    text = raw.decode("utf-8", errors="replace")
                    warnings.warn(
                        f"line {number}: invalid UTF-8, replaced with U+FFFD", stacklevel=1
                    )
                lines.put(text.rstrip("\r\n"))
        except (OSError, ValueError) as err:  # write-only, a folder, not a file
            lines.put(
                UserError(f"{name}: cannot read text ({getattr(err, 'strerror', None) or err})")
            )
        except UserError as err:
            lines.put(err)
        lines.put(None)

    threading.Thread(target=reader, daemon=True).start()
    while True:
        first = lines.get()
        if first is None:
            return
        if isinstance(first, UserError):
            raise first
        chunk = [first]
        while len(chunk) < max_lines:
            try:
                line = lines.get_nowait()
            except queue.Empty:
                break
            if line is None or isinstance(line, UserError):
                yield chunk
                if line is None:
                    return
                raise line
            chunk.append(line)
        yield chunk


@app.command()
def evaluate(
    model: ModelsOption,
    split: Annotated[
        Optional[Split],  # noqa: UP045
        typer.Option("--split", help="A split of the run's corpus (default test)."),
    ] = None,
    src: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option(
            "--src", "--input", metavar="FILE", help="Source file to translate (with --ref)."
        ),
    ] = None,
    ref: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option("--ref", metavar="FILE", help="Reference translations of --src."),
    ] = None,
    out: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option(
            "--out",
            "--output",
            metavar="FILE",
            help="Write hypotheses here (default: beside the checkpoint, named after the split "
            "and beam, e.g. best.test.beam5.hyp.txt).",
        ),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON object instead of text.")
    ] = False,
    beam: BeamOption = None,
    length_penalty: LengthPenaltyOption = None,
    set_: DecodeSetOption = None,
    device: DeviceOption = "auto",
    precision: PrecisionOption = Precision.fp32,
    quantize: QuantizeOption = None,
) -> None:
    """Translate a split (or --src/--ref files) and print sacreBLEU BLEU and chrF."""
    from attn_mt.checkpoint import resolve_checkpoint
    from attn_mt.cli import progress
    from attn_mt.data.corpora import split_files
    from attn_mt.data.text import read_parallel
    from attn_mt.evaluate import score
    from attn_mt.fileio import check_output_file, write_output

    if (src is None) != (ref is None):
        raise UserError("evaluate: give both --src and --ref, or neither (then --split is used)")
    if src is not None and split is not None:
        raise UserError("evaluate: give either --split or --src/--ref, not both")
    checkpoint = resolve_checkpoint(model[0])  # the hypotheses are written beside the first
    translator = _load_translator(
        [checkpoint, *model[1:]],
        device,
        beam,
        length_penalty,
        set_,
        precision.value,
        quantize and quantize.value,
    )
    if src is None:
        split = split or Split.test
        files = split_files(translator.config.data, split.value)
        if files is None:
            raise UserError(
                f"--split {split.value}: the run's config has no data.{split.value} files; "
                "use --src and --ref"
            )
        src, ref = files
    beam_size = translator.config.decode.beam
    name = split.value if split else Path(src).name
    out = out or checkpoint.with_name(f"{checkpoint.stem}.{name}.beam{beam_size}.hyp.txt")
    check_output_file(out)
    sources, references = read_parallel(src, ref)
    with progress.sentences(len(sources), "evaluate") as advance:
        hypotheses = translator.translate(sources, on_batch=advance)
    result = score(hypotheses, references)
    write_output(out, "".join(h + "\n" for h in hypotheses))
    if as_json:
        print(json.dumps({**result.to_dict(), "hypotheses": str(out), "beam": beam_size}))
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
    from attn_mt.fileio import check_output_file

    check_output_file(out)
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
        AttentionKind, typer.Option("--kind", help="Which attention: cross, encoder or decoder.")
    ] = AttentionKind.cross,
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
    from attn_mt.fileio import check_output_file

    check_output_file(out)
    if pe:
        viz.plot_positional_encoding_file(out, model=model, positions=positions, d_model=d_model)
    else:
        if model is None or text is None:
            raise UserError(
                "attention: give --model and --text (or --pe for the positional encoding)"
            )
        viz.plot_attention_file(
            model, text, out, kind=kind.value, layer=layer, head=head, device=device
        )
    print(f"wrote {out}", file=sys.stderr)


@app.command()
def export(
    model: ModelOption,
    out: Annotated[
        Path,
        typer.Option("--out", metavar="DIR", help="The CTranslate2 model folder to create."),
    ],
    quantization: Annotated[
        Quantization,
        typer.Option(
            "--quantization",
            help="Weight type: none (as trained) or any type the installed CTranslate2 accepts.",
        ),
    ] = Quantization.none,
    force: Annotated[
        bool, typer.Option("--force", help="Replace an existing --out folder.")
    ] = False,
    beam: BeamOption = None,
    length_penalty: LengthPenaltyOption = None,
    set_: DecodeSetOption = None,
) -> None:
    """Export a checkpoint to a CTranslate2 model folder (needs `pip install attn-mt[ct2]`).

    The folder's decode.json holds the search settings (the checkpoint's decode config with
    the options given here), for `translate_batch(..., **decode)`.
    """
    from attn_mt.decode.export import export_ctranslate2

    translator = _load_translator([model], "cpu", beam, length_penalty, set_)
    export_ctranslate2(
        model, out, quantization=quantization.value, force=force, decode=translator.config.decode
    )
    print(f"exported to {out}", file=sys.stderr)


@data_app.command("fetch")
def data_fetch(name: Annotated[str, typer.Argument(help="Corpus name: multi30k.")]) -> None:
    """Make a named corpus available locally ($ATTN_MT_DATA, the cache, or a download)."""
    from attn_mt.data.corpora import fetch_corpus

    for path in fetch_corpus(name):
        print(path)


@data_app.command("info")
def data_info(
    config: Annotated[
        Path | None,
        typer.Option("--config", help="Also show this config's training corpora and shares."),
    ] = None,  # noqa: UP045
) -> None:
    """Show where named corpora are looked for and which files are present."""
    from attn_mt.data.corpora import corpus_info

    for line in corpus_info():
        print(line)
    if config is not None:
        from attn_mt.config import load_config
        from attn_mt.data.prepare import prepared_corpus_lines

        for line in prepared_corpus_lines(load_config(config)):
            print(line)


def main() -> None:
    """Console-script entry point: run the app, turning user errors into one stderr line."""
    # Large CPU tensors on transparent huge pages: without it every fresh activation or logits
    # buffer is page-faulted in 4 KiB at a time, which made a bf16->fp32 copy of the (N, V)
    # logits 6x slower than the copy itself. torch reads it at its first large allocation.
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
    _setup_logging()
    try:
        app()
    except UserError as err:
        print(f"attn-mt: error: {err}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("attn-mt: interrupted", file=sys.stderr)
        sys.exit(130)
