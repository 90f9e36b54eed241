"""Translation jobs: a file (or stdin) translated as `attn-mt translate` does it, in order, in
parts (`--shard`, torchrun's ranks) and resumable; the n-best formats written and read."""
