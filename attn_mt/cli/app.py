"""The Typer app, its root options, logging and `main`: the one place a `UserError` raised
anywhere below is printed, as one line on stderr with exit code 2; tracebacks are for bugs only.

The commands live in `attn_mt.cli.train` (train, prepare, data) and `attn_mt.cli.decode`
(translate, evaluate, average, attention, export); importing `attn_mt.cli` registers them.
They import torch inside their bodies: `attn-mt --help` must stay fast.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from typing import Annotated, TextIO

import typer

from attn_mt.errors import UserError
from attn_mt.world import is_main_process

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
    logger.setLevel(logging.INFO if is_main_process() else logging.WARNING)
    logger.propagate = False

    def show(message, category, filename, lineno, file=None, line=None):
        print(f"attn-mt: warning: {message}", file=sys.stderr)

    warnings.showwarning = show


def main() -> None:
    """Console-script entry point: run the app, turning user errors into one stderr line."""
    # Large CPU tensors on transparent huge pages: without it every fresh activation or logits
    # buffer is page-faulted in 4 KiB at a time. torch reads it at its first large allocation,
    # so it is set here, where a command starts, not when the package is imported.
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
