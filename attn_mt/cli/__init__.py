"""The `attn-mt` command line: Typer commands that parse, call the library and print."""

# Importing a command module registers its commands on `app`, in the order `--help` lists them.
from attn_mt.cli import train  # noqa: F401

# isort: split
from attn_mt.cli import clean, decode, distill, evaluate, inspect, model, serve  # noqa: F401
from attn_mt.cli.app import app, main

__all__ = ["app", "main"]
