"""The Typer app, its root options, logging and `main`: the one place a `UserError` raised
anywhere below is printed, as one line on stderr with exit code 2; tracebacks are for bugs only.

Each command lives in the module named after it (`attn_mt.cli.translate`; `data fetch` and
`data info` in `attn_mt.cli.data`); importing `attn_mt.cli` registers them. They share only
this module, `options` and `progress`, and import torch inside their bodies: `attn-mt --help`
must stay fast.
"""

from __future__ import annotations

import difflib
import logging
import re
import signal
import sys
import warnings
from typing import Annotated, TextIO

import typer
from typer._click import exceptions as click  # Typer's own copy of Click's errors
from typer.core import TyperArgument

from attn_mt.cpuenv import set_cpu_environment
from attn_mt.errors import UserError, one_line
from attn_mt.world import is_main_process


def _argument_usage(self: TyperArgument) -> str:
    """`NAME`, `[NAME]`, `NAME...`: an argument in the usage line as Click writes it (Typer
    writes `{NAME}`)."""
    name = self.display_name_raw
    return (name if self.required else f"[{name}]") + ("..." if self.nargs != 1 else "")


# Typer shows an argument's Python type beside its name in the help (`<list[Path]>`, `<str>`):
# the metavar each argument declares says it for a user.
TyperArgument.display_type_rich = lambda self, ctx: None  # type: ignore[method-assign]
TyperArgument._usage_display_name = _argument_usage  # type: ignore[method-assign]

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
    # Huge pages and the bounds of the kernel caches (cpuenv.py): torch's CPU libraries read
    # them once, so they are set here, where a command starts, not when the package is imported.
    set_cpu_environment()
    _setup_logging()
    try:
        code = app(standalone_mode=False)  # Click's own errors come here, to be one line
    except click.NoArgsIsHelpError as err:  # `attn-mt`, `attn-mt data`: the help
        err.show()
        sys.exit(err.exit_code)
    except click.ClickException as err:
        print(f"attn-mt: error: {usage_error(err, sys.argv[1:])}", file=sys.stderr)
        sys.exit(2 if isinstance(err, click.UsageError) else err.exit_code)
    except typer.Abort:
        print("attn-mt: interrupted", file=sys.stderr)
        sys.exit(130)
    except UserError as err:
        print(f"attn-mt: error: {one_line(str(err))}", file=sys.stderr)
        sys.exit(2)
    except PermissionError as err:  # a path in a folder the user cannot enter, wherever met
        if err.filename is None:
            raise
        from attn_mt.paths import denied

        print(f"attn-mt: error: {one_line(denied(err))}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("attn-mt: interrupted", file=sys.stderr)
        sys.exit(130)
    if isinstance(code, int) and code:  # typer.Exit(N) returns its code here
        sys.exit(code)


def exit_on_signal(stop_signal: str | None) -> None:
    """A run stopped by a signal (SIGINT, SIGTERM) ends the command with the shell's status
    for it, 128 + the signal's number."""
    if stop_signal is not None:
        raise typer.Exit(128 + signal.Signals[stop_signal].value)


def usage_error(err: click.ClickException, argv: list[str]) -> str:
    """Click's error as our one line: the command, what is wrong, the closest option or choice,
    and where the help is (Click prints a usage box over several lines)."""
    ctx = getattr(err, "ctx", None)
    names: list[str] = []  # the command's words below the program's own (`data fetch`)
    while ctx is not None and ctx.parent is not None:
        names, ctx = [ctx.info_name or "", *names], ctx.parent
    ctx = getattr(err, "ctx", None)
    command = " ".join(names)
    where = f"{command}: " if command else ""
    see = f"see `attn-mt {command + ' ' if command else ''}--help`"
    if isinstance(err, click.NoSuchOption) and ctx is not None:
        known = [opt for p in ctx.command.get_params(ctx) for opt in p.opts + p.secondary_opts]
        close = difflib.get_close_matches(err.option_name, known, n=1, cutoff=0.5)
        hint = f"did you mean {close[0]}?" if close else see
        return f"{where}unknown option {err.option_name}; {hint}"
    message = " ".join(err.format_message().split()).replace("Value error, ", "")
    unknown = _NO_SUCH_COMMAND.match(message)
    if unknown and ctx is not None and hasattr(ctx.command, "list_commands"):
        known = ctx.command.list_commands(ctx)
        close = difflib.get_close_matches(unknown["name"], known, n=1, cutoff=0.6)
        hint = f"did you mean {close[0]}?" if close else f"the commands: {', '.join(known)}"
        return f"{where}unknown command {unknown['name']}; {hint}"
    choice = _NOT_ONE_OF.search(message)
    param = getattr(err, "param", None)
    if choice and param is not None and param.opts:  # a bad choice: the closest one
        given, choices = choice["given"], re.findall(r"'([^']*)'", choice["choices"])
        close = difflib.get_close_matches(given, choices, n=1, cutoff=0.5)
        hint = f"; did you mean {close[0]}?" if close else ""
        return f"{where}{param.opts[0]} {given}: must be one of {', '.join(choices)}{hint}"
    return f"{where}{message[:1].lower()}{message[1:].rstrip('.')} ({see})"


_NO_SUCH_COMMAND = re.compile(r"No such command '(?P<name>[^']*)'")
# Click's message for a value outside an option's choices.
_NOT_ONE_OF = re.compile(r"'(?P<given>[^']*)' is not one of (?P<choices>'.*')")
