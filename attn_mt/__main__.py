"""`python -m attn_mt` is the `attn-mt` command."""

from attn_mt.cli import main

main()
