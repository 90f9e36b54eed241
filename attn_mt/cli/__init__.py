"""The `attn-mt` command line: Typer commands that parse, call the library and print."""

# Importing a command module registers its commands on `app`, in the order `--help` lists them.
# isort: off
from attn_mt.cli import train  # noqa: F401
from attn_mt.cli import prepare  # noqa: F401
from attn_mt.cli import clean  # noqa: F401
from attn_mt.cli import translate  # noqa: F401
from attn_mt.cli import distill  # noqa: F401
from attn_mt.cli import evaluate  # noqa: F401
from attn_mt.cli import compare  # noqa: F401
from attn_mt.cli import score  # noqa: F401
from attn_mt.cli import info  # noqa: F401
from attn_mt.cli import average  # noqa: F401
from attn_mt.cli import attention  # noqa: F401
from attn_mt.cli import export  # noqa: F401
from attn_mt.cli import import_  # noqa: F401
from attn_mt.cli import shortlist  # noqa: F401
from attn_mt.cli import recase_table  # noqa: F401
from attn_mt.cli import serve  # noqa: F401
from attn_mt.cli import data  # noqa: F401 (the `data` group, listed after the commands)

# isort: on
from attn_mt.cli.app import app, main

__all__ = ["app", "main"]
