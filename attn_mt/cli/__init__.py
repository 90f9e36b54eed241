"""The `attn-mt` command line: Typer commands that parse, call the library and print."""

from attn_mt.cli.app import app, main

__all__ = ["app", "main"]
